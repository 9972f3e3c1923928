//! What the driver tracks, behind its one lock: the triggers, the pollers
//! they share, the engines they feed, and the metadata bytes they hold.
//! Whatever changes one changes the others in the same critical section,
//! so no caller ever sees a trigger without its poller or engine.

use super::engines::Engines;
use super::pollers::Pollers;
use super::table::Triggers;
use super::{Inner, TriggerKey};

#[derive(Default)]
pub(super) struct State {
    pub(super) triggers: Triggers,
    pub(super) pollers: Pollers,
    pub(super) engines: Engines,
    /// Metadata bytes of every tracked trigger (see [`TriggerKey::size`]).
    pub(super) tracked_metadata: usize,
}

impl State {
    /// Stops tracking `key`: releases its route, leaves its poller and its
    /// engine (each stopped when nobody is left).
    pub(super) fn forget(&mut self, key: &TriggerKey, inner: &Inner) {
        let Some(tracked) = self.triggers.remove(key.identity()) else {
            return;
        };
        inner.forgotten.send_modify(|count| *count += 1);
        if let (Some(spec), Some(routes)) = (&tracked.config.trigger.route, &inner.routes) {
            routes.release(key.identity(), &spec.name);
        }
        self.tracked_metadata = self.tracked_metadata.saturating_sub(tracked.key.size());
        self.pollers
            .leave(&tracked.config.trigger.query, tracked.id, &inner.metrics);
        if let Some(scaling) = &tracked.scaling {
            self.engines.leave(scaling, tracked.id);
        }
        inner
            .metrics
            .tracked_triggers
            .set(self.triggers.len() as i64);
    }
}
