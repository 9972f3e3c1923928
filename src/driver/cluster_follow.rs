//! What the driver does as the cluster's ScaledObjects change, following
//! the watch's changes (work per batch of changes, none on a timer):
//!
//! - declared routes are what the ScaledObjects declare, oldest first (see
//!   [`Registry::set_declared`]), whoever calls;
//! - a tracked trigger whose ScaledObject is gone, or no longer has its
//!   metadata, stops (a replayed call cannot keep it alive), and the
//!   others that take their ScaledObject's `pollingInterval` follow its
//!   edits (one walk over the tracked triggers per batch of changes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tracing::{info, warn};

use super::Driver;
use super::unreconciled::UnreconciledObjects;
use crate::callers::{matching_trigger, triggers_of};
use crate::cluster::{Cluster, ObjectChange};
use crate::metadata::{AuthParams, Params};
use crate::routing::{Owner, RouteSpec};

/// A ScaledObject by (namespace, name).
pub(super) type ObjectKey = (String, String);

/// Which ScaledObjects changed in one batch of watch events.
pub(super) enum Changed {
    Some(BTreeSet<ObjectKey>),
    /// The watch listed everything anew (or this follower fell behind).
    All,
}

/// Follows the watch until `driver` stops.
pub(super) async fn follow(driver: Driver, cluster: Arc<Cluster>) {
    // Subscribed before the first read: no change falls between the two.
    let mut changes = cluster.changes();
    let cancel = driver.inner.cancel.clone();
    while !cluster.has_listed() {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = cluster.wait_synced() => {}
        }
    }
    let mut routes = DeclaredRoutes::default();
    let mut unreconciled = UnreconciledObjects::default();
    let mut changed = Changed::All;
    // What the registry last decided from: most watch events (KEDA writes
    // status on every poll of an active ScaledObject) change no route, and
    // sorting every route, let alone deciding again (O(routes²)), would
    // make each of them cost every ScaledObject.
    let mut decided: Option<Vec<RouteSpec>> = None;
    loop {
        if let Some(registry) = driver.routes()
            && routes.update(&cluster, &changed, &driver)
        {
            let candidates = routes.candidates();
            if decided.as_ref() != Some(&candidates) {
                registry.set_declared(candidates.clone());
                decided = Some(candidates);
            }
        }
        driver.follow_objects(&cluster, &changed);
        unreconciled.update(&driver, &cluster, &changed);
        let first = tokio::select! {
            _ = cancel.cancelled() => return,
            change = changes.recv() => change,
        };
        changed = Changed::Some(BTreeSet::new());
        let mut next = Some(first);
        while let Some(change) = next.take() {
            match change {
                Ok(ObjectChange::Object { namespace, name }) => {
                    if let Changed::Some(keys) = &mut changed {
                        keys.insert((namespace, name));
                    }
                }
                Ok(ObjectChange::Relisted) | Err(RecvError::Lagged(_)) => changed = Changed::All,
                Err(RecvError::Closed) => return,
            }
            next = match changes.try_recv() {
                Ok(change) => Some(Ok(change)),
                Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Closed) => Some(Err(RecvError::Closed)),
            };
        }
    }
}

/// Re-evaluates an engine at once when its scale target changes outside.
pub(super) async fn follow_targets(driver: Driver, cluster: Arc<Cluster>) {
    let mut changes = cluster.target_changes();
    let cancel = driver.inner.cancel.clone();
    loop {
        let change = tokio::select! {
            _ = cancel.cancelled() => return,
            change = changes.recv() => change,
        };
        match change {
            Ok(change) => {
                for scaling in
                    driver.scalings_of_target(&change.namespace, change.kind, &change.name)
                {
                    scaling.target_changed();
                }
            }
            // Fell behind: any target may have changed.
            Err(RecvError::Lagged(_)) => {
                for scaling in driver.scalings() {
                    scaling.target_changed();
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// The routes each ScaledObject declares, and its age.
#[derive(Default)]
struct DeclaredRoutes {
    by_object: BTreeMap<ObjectKey, ObjectRoutes>,
}

#[derive(PartialEq)]
struct ObjectRoutes {
    created: Option<Time>,
    routes: Vec<RouteSpec>,
}

impl DeclaredRoutes {
    /// Takes in the changed objects' routes; returns whether any differ.
    fn update(&mut self, cluster: &Cluster, changed: &Changed, driver: &Driver) -> bool {
        let context = driver.inner.settings.load().context.clone();
        match changed {
            Changed::All => {
                self.by_object.clear();
                for object in cluster.all_scaled_objects() {
                    if let Some((key, routes)) = declared(&object, &context) {
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
                        .and_then(|object| declared(&object, &context))
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
    fn candidates(&self) -> Vec<RouteSpec> {
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
    context: &crate::scalers::Context,
) -> Option<(ObjectKey, ObjectRoutes)> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let owner = Owner {
        namespace: namespace.clone(),
        name: name.clone(),
    };
    let routes = routes_declared_by(object, owner, context);
    if routes.is_empty() {
        return None;
    }
    let created = object.metadata.creation_timestamp.clone();
    Some(((namespace, name), ObjectRoutes { created, routes }))
}

/// The routes an object's `http`/`tcp` external triggers declare, parsed
/// as the trigger itself would be. A trigger that does not parse declares
/// nothing (KEDA's calls for it get the parse error).
fn routes_declared_by(
    object: &DynamicObject,
    owner: Owner,
    context: &crate::scalers::Context,
) -> Vec<RouteSpec> {
    let Some(triggers) = object
        .data
        .pointer("/spec/triggers")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let context = crate::scalers::Context {
        owner: Some(owner),
        ..context.clone()
    };
    let no_auth = AuthParams::new();
    let mut routes = Vec::new();
    for trigger in triggers {
        let kind = trigger.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "external" && kind != "external-push" {
            continue;
        }
        let Some(metadata) = trigger.get("metadata").and_then(Value::as_object) else {
            continue;
        };
        let metadata: std::collections::HashMap<String, String> = metadata
            .iter()
            .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
            .collect();
        let Some(scaler) = metadata.get("scaler") else {
            continue;
        };
        let params = Params::new(&metadata, &no_auth);
        match crate::scalers::traffic::route_declared_by(scaler, &params, &context) {
            Ok(Some(route)) => routes.push(route),
            Ok(None) => {}
            Err(error) => {
                warn!(namespace = ?context.owner.as_ref().map(|o| &o.namespace), scaled_object = ?context.owner.as_ref().map(|o| &o.name), %error, "a trigger's route does not parse: it declares none")
            }
        }
    }
    routes
}

impl Driver {
    /// One walk over the triggers of changed ScaledObjects: a trigger the
    /// cluster no longer backs (its ScaledObject gone, or none of its
    /// triggers carrying the tracked metadata) stops, and KEDA's next call
    /// (if any) is checked afresh; the others follow an edited
    /// `pollingInterval`, and engines an edited target or settings.
    pub(super) fn follow_objects(&self, cluster: &Cluster, changed: &Changed) {
        let engines: Vec<Arc<super::Scaling>> = match changed {
            Changed::All => self.scalings(),
            Changed::Some(keys) => {
                let scalings = self.lock_scalings();
                keys.iter()
                    .filter_map(|key| scalings.get(key).cloned())
                    .collect()
            }
        };
        for engine in engines {
            engine.object_changed();
        }
        let affected: Vec<Arc<super::Tracked>> = {
            let triggers = self.read_triggers();
            match changed {
                Changed::All => triggers.values().cloned().collect(),
                Changed::Some(keys) => keys
                    .iter()
                    .flat_map(|(namespace, name)| triggers.of_object(namespace, name))
                    .collect(),
            }
        };
        let mut stale: Vec<super::TriggerKey> = Vec::new();
        for tracked in &affected {
            if backed(cluster, &tracked.key) {
                self.refresh_interval(tracked);
            } else {
                stale.push(tracked.key.clone());
            }
        }
        if stale.is_empty() {
            return;
        }
        for key in &stale {
            info!(namespace = %key.namespace, scaled_object = %key.name, "trigger stopped: its ScaledObject no longer has it");
        }
        self.revoke(&stale, "cluster");
    }
}

/// Whether a ScaledObject in the store has a trigger with `key`'s metadata.
fn backed(cluster: &Cluster, key: &super::TriggerKey) -> bool {
    let object = match cluster.raw_trigger_owner(&key.namespace, &key.name) {
        Ok(Some(object)) => object,
        Ok(None) => return false,
        // ScaledJobs unreadable for now: nothing shows it is gone.
        Err(_) => return true,
    };
    matching_trigger(triggers_of(&object), &key.metadata_map()).is_ok()
}
