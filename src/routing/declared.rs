//! Which routes the cluster's ScaledObjects declare, and how old each
//! ScaledObject is: the registry gives a host two teams declare to the
//! older one (see [`super::Registry::set_declared`]), whoever calls.
//! Followed by the watch's batches of changes: each costs the changed
//! objects, never every ScaledObject.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;

use super::{Owner, RouteSpec};
use crate::cluster::{Changed, Cluster, ObjectKey};

/// The routes each ScaledObject declares, and its age.
#[derive(Default)]
pub struct DeclaredRoutes {
    by_object: BTreeMap<ObjectKey, ObjectRoutes>,
}

#[derive(PartialEq)]
struct ObjectRoutes {
    created: Option<Time>,
    routes: Vec<RouteSpec>,
}

impl DeclaredRoutes {
    /// Takes in the changed objects' routes, as `routes_of` reads an
    /// object's triggers; returns whether any differ.
    pub fn update(
        &mut self,
        cluster: &Cluster,
        changed: &Changed,
        routes_of: impl Fn(&DynamicObject, Owner) -> Vec<RouteSpec>,
    ) -> bool {
        let declared = |object: &DynamicObject| declared(object, &routes_of);
        match changed {
            Changed::All => {
                self.by_object.clear();
                for object in cluster.all_scaled_objects() {
                    if let Some((key, routes)) = declared(&object) {
                        self.by_object.insert(key, routes);
                    }
                }
                true
            }
            Changed::Some(keys) => {
                let mut differ = false;
                for (namespace, name) in keys {
                    let key = (namespace.clone(), name.clone());
                    let now = cluster
                        .raw_scaled_object(namespace, name)
                        .and_then(|object| declared(&object))
                        .map(|(_, routes)| routes);
                    let before = match now {
                        Some(routes) => self.by_object.insert(key.clone(), routes),
                        None => self.by_object.remove(&key),
                    };
                    differ |= before.as_ref() != self.by_object.get(&key);
                }
                differ
            }
        }
    }

    /// Every declared route, oldest ScaledObject first; ties (and objects
    /// without a creation time, last) by namespace and name.
    pub fn candidates(&self) -> Vec<RouteSpec> {
        let mut objects: Vec<(&ObjectKey, &ObjectRoutes)> = self.by_object.iter().collect();
        objects.sort_by(|(a_key, a), (b_key, b)| {
            (a.created.is_none(), &a.created, a_key).cmp(&(b.created.is_none(), &b.created, b_key))
        });
        objects
            .into_iter()
            .flat_map(|(_, object)| object.routes.iter().cloned())
            .collect()
    }
}

/// The object's key and routes, when it declares any.
fn declared(
    object: &DynamicObject,
    routes_of: impl Fn(&DynamicObject, Owner) -> Vec<RouteSpec>,
) -> Option<(ObjectKey, ObjectRoutes)> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let owner = Owner {
        namespace: namespace.clone(),
        name: name.clone(),
    };
    let routes = routes_of(object, owner);
    if routes.is_empty() {
        return None;
    }
    let created = object.metadata.creation_timestamp.clone();
    Some(((namespace, name), ObjectRoutes { created, routes }))
}
