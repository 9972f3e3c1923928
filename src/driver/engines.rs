//! The engines of engine-mode ScaledObjects, one per ScaledObject: its
//! first engine-mode trigger starts it (with the state an earlier run
//! saved for it, when there is one), its last one leaving stops it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::info;

use super::scaling::{self, CountPolicy, Counting, MetadataRules, Scaling};
use super::{Inner, TriggerKey};
use crate::cluster::ObjectKey;
use crate::engine::{self, Rules};
use crate::persist;

#[derive(Default)]
pub(super) struct Engines {
    by_object: BTreeMap<ObjectKey, Arc<Scaling>>,
    /// Engine state restored from `state_file`, waiting for its
    /// ScaledObject to be seen again.
    restored: BTreeMap<String, engine::State>,
}

/// What a trigger brings to its ScaledObject's engine, made before the
/// driver's lock is taken.
pub(super) struct EnginePlan {
    pub(super) rules: MetadataRules,
    pub(super) counting: Counting,
    /// `engine.assume_applied` of the settings the trigger was checked
    /// against.
    pub(super) assume_applied: bool,
}

impl Engines {
    pub(super) fn get(&self, object: &ObjectKey) -> Option<&Arc<Scaling>> {
        self.by_object.get(object)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Scaling>> {
        self.by_object.values()
    }

    /// The engine of `key`'s ScaledObject with `plan`'s rules (the newest
    /// metadata wins: the ScaledObject was edited and its other triggers
    /// follow on their next call); a new one is made, not started: the
    /// caller starts it outside the lock. True when it is new.
    pub(super) fn join(
        &mut self,
        key: &TriggerKey,
        plan: EnginePlan,
        inner: &Inner,
    ) -> (Arc<Scaling>, bool) {
        let object = (key.namespace.clone(), key.name.clone());
        if let Some(scaling) = self.by_object.get(&object) {
            let current = scaling.rules();
            if current != plan.rules {
                info!(
                    namespace = %key.namespace,
                    scaled_object = %key.name,
                    changed = %first_difference(&current.rules, &plan.rules.rules),
                    "engine rules changed"
                );
                scaling.set_rules(plan.rules);
            }
            return (scaling.clone(), false);
        }
        let restored = self
            .restored
            .remove(&persist::key(&key.namespace, &key.name));
        // A record saved while the count was unknown holds no count: its
        // `currentReplicas` of 0 must never stand in for the real one.
        let count_restored = restored.as_ref().is_some_and(|state| state.count_known);
        match &restored {
            Some(_) if count_restored => {
                info!(namespace = %key.namespace, scaled_object = %key.name, "engine state restored");
            }
            Some(_) => {
                info!(namespace = %key.namespace, scaled_object = %key.name, "engine state restored without a count: it was saved while the count was unknown");
            }
            None => {}
        }
        let scaling = Scaling::new(scaling::Start {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            rules: plan.rules,
            policy: CountPolicy {
                assume_applied: plan.assume_applied,
                restored: count_restored,
            },
            state: restored.unwrap_or_default(),
            counting: plan.counting,
            clock: inner.clock,
            changed: inner.changed.clone(),
            cancel: inner.cancel.child_token(),
            metrics: inner.metrics.clone(),
            targets: inner.targets.clone(),
        });
        self.by_object.insert(object, scaling.clone());
        (scaling, true)
    }

    /// Trigger `id` leaves `scaling`; the engine stops when none is left.
    pub(super) fn leave(&mut self, scaling: &Arc<Scaling>, id: u64) {
        if !scaling.leave(id) {
            return;
        }
        scaling.stop();
        let object = (scaling.namespace.clone(), scaling.name.clone());
        if self
            .by_object
            .get(&object)
            .is_some_and(|current| Arc::ptr_eq(current, scaling))
        {
            self.by_object.remove(&object);
        }
    }

    pub(super) fn restore(&mut self, saved: BTreeMap<String, engine::State>) {
        self.restored = saved;
    }

    /// Every engine's state, and restored state not yet claimed.
    pub(super) fn snapshot(&self) -> BTreeMap<String, engine::State> {
        let mut states = self.restored.clone();
        for scaling in self.by_object.values() {
            states.insert(
                persist::key(&scaling.namespace, &scaling.name),
                scaling.state(),
            );
        }
        states
    }
}

/// The metadata key of the first rule that differs, for the log.
fn first_difference(a: &Rules, b: &Rules) -> String {
    let (a, b) = (serde_json::to_value(a), serde_json::to_value(b));
    if let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) {
        for (key, value) in &a {
            if b.get(key) != Some(value) {
                return key.clone();
            }
        }
    }
    "scalingMode".to_string()
}
