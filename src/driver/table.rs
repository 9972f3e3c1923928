//! The table of tracked triggers: found by key on every RPC, and by
//! ScaledObject when the watch says one changed.
//!
//! KEDA writes a ScaledObject's status on every poll while it is active
//! (`status.lastActiveTime`), so with thousands of ScaledObjects the watch
//! brings hundreds of changes a second; each must cost the triggers of its
//! object, never a walk over every tracked trigger.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::Tracked;

/// Keyed by a trigger's identity (see `TriggerKey::identity`). The order
/// index holds the same buffers: its identities sort by namespace, then
/// name, so one ScaledObject's triggers are one range. It costs a pointer
/// pair and its share of a tree node per trigger.
#[derive(Default)]
pub(super) struct Triggers {
    /// Looked up on every RPC: a fast hasher (seeded per process, so keys
    /// from ScaledObjects cannot be chosen to collide) instead of SipHash.
    by_identity: HashMap<Arc<[u8]>, Arc<Tracked>, foldhash::quality::RandomState>,
    ordered: BTreeSet<Arc<[u8]>>,
    /// The slot (see `TriggerKey::slot`) of each trigger with a `FromEnv`
    /// key, and the identity holding it. Any caller may send any value
    /// for those keys, so without this one ScaledObject could be tracked
    /// once per value sent. Triggers without one hold the slot that is
    /// their identity, found in `by_identity`.
    slots: HashMap<Box<[u8]>, Arc<[u8]>, foldhash::quality::RandomState>,
    /// Tracked triggers per namespace, for
    /// `limits.max_tracked_triggers_per_namespace`.
    per_namespace: HashMap<String, usize, foldhash::quality::RandomState>,
}

impl Triggers {
    pub(super) fn get(&self, identity: &[u8]) -> Option<&Arc<Tracked>> {
        self.by_identity.get(identity)
    }

    pub(super) fn len(&self) -> usize {
        self.by_identity.len()
    }

    pub(super) fn in_namespace(&self, namespace: &str) -> usize {
        self.per_namespace.get(namespace).copied().unwrap_or(0)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Tracked>> {
        self.by_identity.values()
    }

    /// The tracked trigger that is `key`'s trigger with other values of
    /// its `FromEnv` keys, if any. A key without such keys has no other
    /// values: its slot is its identity.
    pub(super) fn holder_of_slot(&self, key: &super::TriggerKey) -> Option<&Arc<Tracked>> {
        let slot = key.slot()?;
        self.slots
            .get(&slot[..])
            .and_then(|identity| self.by_identity.get(identity))
            .filter(|tracked| tracked.key.identity() != key.identity())
    }

    pub(super) fn insert(&mut self, identity: Arc<[u8]>, tracked: Arc<Tracked>) {
        if let Some(slot) = tracked.key.slot() {
            self.slots.insert(slot.into(), identity.clone());
        }
        *self
            .per_namespace
            .entry(tracked.key.namespace.clone())
            .or_default() += 1;
        self.ordered.insert(identity.clone());
        self.by_identity.insert(identity, tracked);
    }

    pub(super) fn remove(&mut self, identity: &[u8]) -> Option<Arc<Tracked>> {
        self.ordered.remove(identity);
        let tracked = self.by_identity.remove(identity)?;
        if let Some(slot) = tracked.key.slot()
            && self
                .slots
                .get(&slot[..])
                .is_some_and(|held| &held[..] == identity)
        {
            self.slots.remove(&slot[..]);
        }
        let namespace = &tracked.key.namespace;
        if let Some(count) = self.per_namespace.get_mut(namespace) {
            *count -= 1;
            if *count == 0 {
                self.per_namespace.remove(namespace);
            }
        }
        Some(tracked)
    }

    /// The triggers of ScaledObject `namespace/name`.
    pub(super) fn of_object(&self, namespace: &str, name: &str) -> Vec<Arc<Tracked>> {
        let prefix = super::TriggerKey::object_prefix(namespace, name);
        self.ordered
            .range::<[u8], _>((
                std::ops::Bound::Included(&prefix[..]),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|identity| identity.starts_with(&prefix))
            .filter_map(|identity| self.by_identity.get(identity).cloned())
            .collect()
    }
}
