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
}

impl Triggers {
    pub(super) fn get(&self, identity: &[u8]) -> Option<&Arc<Tracked>> {
        self.by_identity.get(identity)
    }

    pub(super) fn len(&self) -> usize {
        self.by_identity.len()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Tracked>> {
        self.by_identity.values()
    }

    pub(super) fn insert(&mut self, identity: Arc<[u8]>, tracked: Arc<Tracked>) {
        self.ordered.insert(identity.clone());
        self.by_identity.insert(identity, tracked);
    }

    pub(super) fn remove(&mut self, identity: &[u8]) -> Option<Arc<Tracked>> {
        self.ordered.remove(identity);
        self.by_identity.remove(identity)
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
