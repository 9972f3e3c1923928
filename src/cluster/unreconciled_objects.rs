//! Says so when KEDA has not set up a ScaledObject that calls hoist
//! (kedacore/keda#5787; see [`super::keda_status`]): one warning
//! and one Event per ScaledObject each time it enters that state, and the
//! gauge `hoist_keda_unreconciled_scaledobjects` while it is in it.
//!
//! hoist does not make KEDA retry itself: every update KEDA 2.20 reconciles
//! a ScaledObject on (a spec edit, a pause annotation changed, `Ready`
//! turning True) is a write to a team's ScaledObject, which would need
//! `patch` on every ScaledObject in the cluster. The Event names the one
//! command that makes KEDA retry at once, and KEDA retries by itself within
//! its backoff.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{info, warn};

use super::changes::{Changed, ObjectKey};
use super::{Cluster, ObjectEvent, Unreconciled, unreconciled};

/// The ScaledObjects in that state now.
#[derive(Default)]
pub struct UnreconciledObjects {
    by_object: BTreeMap<ObjectKey, Unreconciled>,
}

impl UnreconciledObjects {
    /// Takes in the changed objects of the ScaledObjects calling the
    /// hoist on `grpc_port`, announces those that entered the state, and
    /// returns how many are in it (the gauge's value).
    pub fn update(
        &mut self,
        cluster: &Arc<Cluster>,
        changed: &Changed,
        grpc_port: Option<u16>,
    ) -> usize {
        let mut now = match changed {
            Changed::All => BTreeMap::new(),
            Changed::Some(keys) => {
                let mut kept = self.by_object.clone();
                kept.retain(|key, _| !keys.contains(key));
                kept
            }
        };
        let objects = match changed {
            Changed::All => cluster.all_scaled_objects(),
            Changed::Some(keys) => keys
                .iter()
                .filter_map(|(namespace, name)| cluster.raw_scaled_object(namespace, name))
                .collect(),
        };
        for object in objects {
            if let Some(found) = unreconciled(&object, grpc_port) {
                now.insert((found.namespace.clone(), found.name.clone()), found);
            }
        }
        for (key, found) in &now {
            if self.by_object.get(key).map(|seen| &seen.uid) != Some(&found.uid) {
                announce(cluster, found);
            }
        }
        // Left the state: set up by KEDA, unless it was deleted.
        for (namespace, name) in self.by_object.keys().filter(|key| !now.contains_key(*key)) {
            if cluster.raw_scaled_object(namespace, name).is_some() {
                info!(%namespace, scaled_object = %name, "KEDA has set up the ScaledObject it had not");
            }
        }
        self.by_object = now;
        self.by_object.len()
    }
}

/// The Event's note: what KEDA said, what happens next, what to do now.
fn advice(found: &Unreconciled) -> String {
    format!(
        "KEDA could not set up this ScaledObject and made no HPA (Ready=False, ScaledObjectCheckFailed: {}). \
         hoist is serving its triggers now. KEDA retries on its own backoff, which after a long outage of its \
         scaler waits about as long as the outage, up to 17 minutes (kedacore/keda#5787). To make KEDA retry \
         now: kubectl annotate scaledobject {} -n {} autoscaling.keda.sh/paused=false --overwrite",
        found.message, found.name, found.namespace
    )
}

fn announce(cluster: &Arc<Cluster>, found: &Unreconciled) {
    warn!(
        namespace = %found.namespace,
        scaled_object = %found.name,
        keda = %found.message,
        "KEDA has not set up this ScaledObject (no HPA); it retries on its own backoff, or annotate it to retry now (see its Events)"
    );
    cluster.post_event_on(
        found.reference(),
        ObjectEvent {
            warning: true,
            reason: "KedaSetupPending",
            action: "Waiting",
            note: advice(found),
        },
    );
}
