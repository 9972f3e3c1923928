//! What the driver does as the cluster's ScaledObjects change, following
//! the watch's changes (work per batch of changes, none on a timer):
//!
//! - declared routes are what the ScaledObjects declare, oldest first (see
//!   [`DeclaredRoutes`]), whoever calls;
//! - ScaledObjects KEDA has not set up are announced (see
//!   [`UnreconciledObjects`]);
//! - a tracked trigger whose ScaledObject is gone, or no longer has its
//!   metadata, stops (a replayed call cannot keep it alive), and the
//!   others that take their ScaledObject's `pollingInterval` follow its
//!   edits (one walk over the tracked triggers per batch of changes).

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tracing::{info, warn};

use super::Driver;
use crate::callers::{matching_trigger, triggers_of};
use crate::cluster::{Changed, Cluster, UnreconciledObjects, next_batch};
use crate::metadata::{AuthParams, Params};
use crate::routing::{DeclaredRoutes, Owner, RouteSpec};

/// Follows the watch until `driver` stops.
pub(super) async fn follow(driver: Driver, cluster: Arc<Cluster>) {
    // Subscribed before the first read: no change falls between the two.
    let mut changes = cluster.changes();
    while !cluster.has_listed() {
        tokio::select! {
            _ = driver.shutting_down() => return,
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
        if let Some(registry) = driver.routes() {
            let context = driver.trigger_context();
            let routes_of =
                |object: &DynamicObject, owner| routes_declared_by(object, owner, &context);
            if routes.update(&cluster, &changed, routes_of) {
                let candidates = routes.candidates();
                if decided.as_ref() != Some(&candidates) {
                    registry.set_declared(candidates.clone());
                    decided = Some(candidates);
                }
            }
        }
        driver.follow_objects(&cluster, &changed);
        let pending = unreconciled.update(&cluster, &changed, driver.grpc_port());
        driver.set_unreconciled(pending);
        changed = tokio::select! {
            _ = driver.shutting_down() => return,
            batch = next_batch(&mut changes) => match batch {
                Some(batch) => batch,
                None => return,
            },
        };
    }
}

/// Re-evaluates an engine at once when its scale target changes outside.
pub(super) async fn follow_targets(driver: Driver, cluster: Arc<Cluster>) {
    let mut changes = cluster.target_changes();
    loop {
        let change = tokio::select! {
            _ = driver.shutting_down() => return,
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
        let metadata: HashMap<String, String> = metadata
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
    /// What triggers are parsed with (hoist's own parts they may read).
    fn trigger_context(&self) -> crate::scalers::Context {
        self.inner.settings.load().context.clone()
    }

    /// `hoist_keda_unreconciled_scaledobjects`.
    fn set_unreconciled(&self, count: usize) {
        self.inner
            .metrics
            .keda_unreconciled
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// One walk over the triggers of changed ScaledObjects: a trigger the
    /// cluster no longer backs (its ScaledObject gone, or none of its
    /// triggers carrying the tracked metadata) stops, and KEDA's next call
    /// (if any) is checked afresh; the others follow an edited
    /// `pollingInterval`, and engines an edited target or settings.
    pub(super) fn follow_objects(&self, cluster: &Cluster, changed: &Changed) {
        let engines: Vec<Arc<super::Scaling>> = match changed {
            Changed::All => self.scalings(),
            Changed::Some(keys) => {
                let state = self.read_state();
                keys.iter()
                    .filter_map(|key| state.engines.get(key).cloned())
                    .collect()
            }
        };
        for engine in engines {
            engine.object_changed();
        }
        let affected: Vec<Arc<super::Tracked>> = {
            let state = self.read_state();
            let triggers = &state.triggers;
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
