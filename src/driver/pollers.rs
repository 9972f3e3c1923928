//! The running pollers by the question they ask: a trigger joins the one
//! asking its question (started on first use, a dead one replaced) and
//! leaves it (stopped with its last subscriber). `hoist_pollers` follows.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn};

use super::poller::{Poller, Scheduler, Wakeups};
use super::{Reading, Schedule};
use crate::metrics::Metrics;
use crate::scalers::Query;

#[derive(Default)]
pub(super) struct Pollers {
    by_query: HashMap<Arc<str>, Poller>,
}

/// What a trigger gets from the poller it joined.
pub(super) struct Joined {
    pub(super) readings: watch::Receiver<Reading>,
    /// The poller's question, the same as the trigger's: triggers sharing
    /// a source share one copy of it (its connection settings, its key).
    pub(super) query: Query,
    /// A new poller's wake-ups, to listen to outside the driver's lock.
    pub(super) wakeups: Option<Wakeups>,
}

impl Pollers {
    pub(super) fn len(&self) -> usize {
        self.by_query.len()
    }

    /// Subscribes trigger `id` to the poller asking `query`, starting one
    /// when none runs.
    pub(super) fn join(
        &mut self,
        scaler: &'static str,
        query: &Query,
        (id, schedule): (u64, Schedule),
        scheduler: &Scheduler,
        metrics: &Metrics,
    ) -> Joined {
        if self.by_query.get(&query.key).is_some_and(Poller::is_dead) {
            warn!(source = %query.description, "replacing a poller that stopped unexpectedly");
            if let Some(dead) = self.by_query.remove(&query.key) {
                dead.stop(metrics);
                metrics.pollers.dec();
            }
        }
        let mut wakeups = None;
        let poller = self.by_query.entry(query.key.clone()).or_insert_with(|| {
            info!(source = %query.description, "starting poller");
            metrics.pollers.inc();
            let (poller, listener) = Poller::spawn(scaler, query, schedule, scheduler);
            wakeups = listener;
            poller
        });
        poller.subscribe(id, schedule);
        Joined {
            readings: poller.readings.clone(),
            query: poller.query().clone(),
            wakeups,
        }
    }

    /// Unsubscribes trigger `id`; the poller stops when nobody is left.
    pub(super) fn leave(&mut self, query: &Query, id: u64, metrics: &Metrics) {
        let empty = self
            .by_query
            .get_mut(&query.key)
            .is_some_and(|poller| poller.unsubscribe(id));
        if empty && let Some(poller) = self.by_query.remove(&query.key) {
            info!(source = %query.description, "stopping poller");
            poller.stop(metrics);
            metrics.pollers.dec();
        }
    }

    /// Trigger `id` wants `schedule` now.
    pub(super) fn reschedule(&mut self, query: &Query, id: u64, schedule: Schedule) {
        if let Some(poller) = self.by_query.get_mut(&query.key) {
            poller.subscribe(id, schedule);
        }
    }
}
