//! Engine-mode ScaledObjects: one engine per ScaledObject, evaluated on
//! every new reading of any of its triggers and when a cooldown ends.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::reading::Reading;
use crate::engine::{self, Decision, Millis, Observation, Rules};

/// Maps the driver's monotonic instants to the engine's wall-clock
/// milliseconds (so saved engine state stays meaningful across restarts).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
    epoch_wall: Millis,
}

impl Clock {
    pub fn new() -> Self {
        let epoch_wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as Millis);
        Self {
            epoch: Instant::now(),
            epoch_wall,
        }
    }

    pub fn wall(&self, at: Instant) -> Millis {
        self.epoch_wall + at.saturating_duration_since(self.epoch).as_millis() as Millis
    }

    pub fn now(&self) -> Millis {
        self.wall(Instant::now())
    }

    fn instant(&self, wall: Millis) -> Instant {
        self.epoch + std::time::Duration::from_millis(wall.saturating_sub(self.epoch_wall))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

struct Member {
    id: u64,
    trigger: String,
    target: f64,
    activation_target: f64,
    readings: watch::Receiver<Reading>,
    forwarder: tokio::task::AbortHandle,
}

/// The engine of one ScaledObject and the triggers feeding it.
pub struct Scaling {
    pub namespace: String,
    pub name: String,
    rules: Mutex<Rules>,
    state: Mutex<engine::State>,
    decisions: watch::Sender<Option<Decision>>,
    members: Mutex<Vec<Member>>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
    changed: Arc<Notify>,
}

impl Scaling {
    pub fn start(
        namespace: &str,
        name: &str,
        rules: Rules,
        state: engine::State,
        clock: Clock,
        cancel: CancellationToken,
        changed: Arc<Notify>,
    ) -> Arc<Self> {
        let scaling = Arc::new(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            rules: Mutex::new(rules),
            state: Mutex::new(state),
            decisions: watch::channel(None).0,
            members: Mutex::new(Vec::new()),
            wake: Arc::new(Notify::new()),
            cancel,
            changed,
        });
        tokio::spawn(scaling.clone().run(clock));
        scaling
    }

    pub fn rules(&self) -> Rules {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the rules; the state (windows, cooldown) carries over.
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.lock().unwrap_or_else(|e| e.into_inner()) = rules;
        self.wake.notify_one();
    }

    /// Whether a trigger reporting `metric` already feeds this engine.
    pub fn has_trigger(&self, metric: &str) -> bool {
        self.lock_members().iter().any(|m| m.trigger == metric)
    }

    pub fn join(
        &self,
        id: u64,
        trigger: &str,
        target: f64,
        activation_target: f64,
        readings: watch::Receiver<Reading>,
    ) {
        let wake = self.wake.clone();
        let mut changes = readings.clone();
        let forwarder = tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                wake.notify_one();
            }
        })
        .abort_handle();
        self.lock_members().push(Member {
            id,
            trigger: trigger.to_string(),
            target,
            activation_target,
            readings,
            forwarder,
        });
        self.wake.notify_one();
    }

    /// Removes a trigger; returns true when none is left.
    pub fn leave(&self, id: u64) -> bool {
        let mut members = self.lock_members();
        members.retain(|member| {
            if member.id == id {
                member.forwarder.abort();
            }
            member.id != id
        });
        members.is_empty()
    }

    pub fn stop(&self) {
        self.cancel.cancel();
        for member in self.lock_members().iter() {
            member.forwarder.abort();
        }
    }

    /// The latest decision, if any.
    pub fn decision(&self) -> Option<Decision> {
        self.decisions.borrow().clone()
    }

    pub fn decisions(&self) -> watch::Receiver<Option<Decision>> {
        self.decisions.subscribe()
    }

    /// A copy of the engine's state.
    pub fn state(&self) -> engine::State {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Evaluates once per polling interval on the newest readings, as the
    /// HPA does on its own period however many metrics it has: a reading
    /// arriving early waits for the interval to complete. Two exceptions:
    /// at zero replicas a new reading is evaluated at once (scale from zero
    /// without delay), and a cooldown's end is evaluated when it comes.
    async fn run(self: Arc<Self>, clock: Clock) {
        let mut last: Option<Millis> = None;
        let mut pending = false;
        let mut deadline: Option<Millis> = None;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = self.wake.notified() => pending = true,
                _ = async {
                    match deadline {
                        Some(wall) => tokio::time::sleep_until(clock.instant(wall)).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            let now = clock.now();
            let interval = self.rules().polling_interval.saturating_mul(1000);
            let decision = self.decision();
            let at_zero = decision.as_ref().is_none_or(|d| d.replicas == 0);
            let cooldown_over = decision
                .as_ref()
                .and_then(|d| d.cooldown_ends)
                .is_some_and(|end| now >= end);
            let interval_over = last.is_none_or(|at| now >= at.saturating_add(interval));
            if (pending && (interval_over || at_zero)) || cooldown_over {
                if let Some(decision) = self.evaluate(&clock) {
                    last = Some(now);
                    pending = false;
                    deadline = decision.cooldown_ends;
                }
            } else if pending {
                // Keep an earlier cooldown end: it must not wait a whole interval.
                let next_interval = last.map(|at| at.saturating_add(interval));
                let cooldown_end = decision.as_ref().and_then(|d| d.cooldown_ends);
                deadline = next_interval.into_iter().chain(cooldown_end).min();
            }
        }
    }

    /// Runs the engine on every trigger's latest reading.
    fn evaluate(&self, clock: &Clock) -> Option<Decision> {
        let readings: Vec<engine::Reading> = self
            .lock_members()
            .iter()
            .filter_map(|member| {
                let (value, activity, at) = match &*member.readings.borrow() {
                    Reading::Pending => return None,
                    Reading::Value {
                        value,
                        activity,
                        at,
                    } => (
                        Observation::Value(*value),
                        (activity != value).then_some(*activity),
                        *at,
                    ),
                    Reading::Failed { error, at, .. } => {
                        (Observation::Error(error.to_string()), None, *at)
                    }
                };
                Some(engine::Reading {
                    trigger: member.trigger.clone(),
                    target: member.target,
                    activation_target: member.activation_target,
                    value,
                    activity,
                    at: clock.wall(at),
                })
            })
            .collect();
        if readings.is_empty() {
            return None;
        }
        let decision = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            engine::decide(&mut state, &self.rules(), &readings, clock.now())
        };
        let previous = self.decision();
        if previous
            .as_ref()
            .is_none_or(|p| p.replicas != decision.replicas || p.active != decision.active)
        {
            info!(
                namespace = %self.namespace,
                scaled_object = %self.name,
                replicas = decision.replicas,
                active = decision.active,
                reason = ?decision.reason,
                message = %decision.message,
                "engine decision"
            );
        }
        if previous.as_ref().is_none_or(|p| {
            (p.replicas, p.active, p.cooldown_ends)
                != (decision.replicas, decision.active, decision.cooldown_ends)
        }) {
            self.changed.notify_one();
        }
        self.decisions.send_replace(Some(decision.clone()));
        Some(decision)
    }

    fn lock_members(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }
}
