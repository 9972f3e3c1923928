//! A tracked trigger: its parsed config, the reading of its source, its
//! engine (engine mode), and when it was last asked or streamed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Answer, HPA_SYNC_MILLIS, PollError, Reading, Scaling, TrackError, TriggerKey};
use crate::cluster::AuthenticationRef;
use crate::engine::Decision;
use crate::trigger::TriggerConfig;

/// A trigger hoist is tracking, and the reading of its source.
pub struct Tracked {
    pub key: TriggerKey,
    pub config: TriggerConfig,
    /// The engine deciding for this trigger's ScaledObject (engine mode).
    pub scaling: Option<Arc<Scaling>>,
    pub(super) id: u64,
    pub(super) readings: watch::Receiver<Reading>,
    pub(super) interval_ms: Arc<AtomicU64>,
    pub(super) last_seen_ms: AtomicU64,
    pub(super) open_streams: AtomicUsize,
    /// When a `StreamIsActive` stream of it last opened or closed (ms
    /// since `epoch`; 0: never): KEDA pushes to it (`external-push`).
    pub(super) last_streamed_ms: AtomicU64,
    pub(super) epoch: Instant,
    /// The TriggerAuthentication its credentials came from, and the
    /// version they were read at (a rotation shows as a new version).
    /// Boxed: most triggers have none, and every tracked trigger holds
    /// this field.
    pub(super) credentials: Option<Box<(AuthenticationRef, String)>>,
}

impl Tracked {
    /// The latest reading, without waiting.
    pub fn latest(&self) -> Reading {
        self.readings.borrow().clone()
    }

    /// The latest reading; while the first measurement is still running,
    /// waits for it up to the trigger's timeout, but never longer than
    /// a second: KEDA's metrics adapter gives the HPA's call
    /// 3 s in all and retries once, so an answer must leave that budget
    /// (the measurement goes on in the background for the retry).
    pub async fn current(&self) -> Reading {
        // The usual case, answered without setting up a wait: a reading
        // is there and its poller is running.
        {
            let latest = self.readings.borrow();
            if !matches!(*latest, Reading::Pending) && self.readings.has_changed().is_ok() {
                return latest.clone();
            }
        }
        let mut readings = self.readings.clone();
        let first = readings.wait_for(|reading| *reading != Reading::Pending);
        let outcome = tokio::time::timeout(self.first_wait(), first)
            .await
            .map(|waited| waited.map(|reading| reading.clone()));
        let polled = readings.has_changed().is_ok();
        match outcome {
            Ok(Ok(reading)) if polled => reading,
            // The poller is gone (shutting down): nothing here is current.
            Ok(_) => Reading::Failed {
                error: PollError::Stopped,
                at: Instant::now(),
                consecutive_failures: 0,
                last_value: self.latest().last_value(),
            },
            Err(_) => self.latest(),
        }
    }

    /// The engine's latest answer (engine mode); while there is none yet,
    /// waits for the first up to the trigger's timeout.
    pub async fn answer(&self) -> Option<Answer> {
        let scaling = self.scaling.as_ref()?;
        let mut answers = scaling.answers();
        let first = answers.wait_for(Option::is_some);
        match tokio::time::timeout(self.config.timeout, first).await {
            Ok(Ok(answer)) => answer.clone(),
            _ => scaling.answer(),
        }
    }

    /// The engine's latest decision (engine mode), waiting as [`Tracked::answer`].
    pub async fn decision(&self) -> Option<Decision> {
        match self.answer().await? {
            Answer::Decided(decision) => Some(decision),
            Answer::CountUnknown(_) => None,
        }
    }

    /// The polling interval in force: the trigger's `pollingInterval`, else
    /// its ScaledObject's, else the default.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// How long a call waits for a new trigger's first measurement: a
    /// second at most (KEDA's metrics adapter gives the HPA's call 3 s and
    /// retries once), or the trigger's timeout when shorter.
    pub fn first_wait(&self) -> Duration {
        const FIRST_READING_WAIT: Duration = Duration::from_secs(1);
        self.config.timeout.min(FIRST_READING_WAIT)
    }

    /// A receiver that wakes on every new reading.
    pub fn watch(&self) -> watch::Receiver<Reading> {
        self.readings.clone()
    }

    /// Marks the trigger as wanted, postponing its eviction.
    pub fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_seen_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Holds the trigger against eviction while a `StreamIsActive` stream
    /// is open; dropping the guard releases it.
    pub fn stream_guard(self: &Arc<Self>) -> StreamGuard {
        self.open_streams.fetch_add(1, Ordering::Relaxed);
        self.note_stream();
        StreamGuard(self.clone())
    }

    fn note_stream(&self) {
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.last_streamed_ms.store(now, Ordering::Relaxed);
    }

    /// KEDA pushes to it: a stream is open, or was within
    /// [`PUSHED_LATELY`] (a ScaledObject moved to `external` stops
    /// counting then; a deleted one when it is evicted).
    pub(super) fn pushed_lately(&self) -> bool {
        if self.open_streams.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let last = self.last_streamed_ms.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64;
        last != 0 && now.saturating_sub(last) < PUSHED_LATELY.as_millis() as u64
    }

    /// The refusal of `key`, this trigger with other `FromEnv` values,
    /// while this one is still asked: streamed, or asked within two of
    /// its polls and an HPA sync (KEDA asks at every poll, the HPA every
    /// 15 s while the target runs). A forged value therefore never takes
    /// the place of the one KEDA keeps asking, and an engine never swaps
    /// between them; a real change (the scale target's environment
    /// edited) takes over once KEDA asks only the new value.
    pub(super) fn held_against(&self, key: &TriggerKey, now: Instant) -> Option<TrackError> {
        let quiet = self.interval() * 2 + Duration::from_millis(HPA_SYNC_MILLIS);
        let asked_ago = self.idle_for(now);
        let streamed = self.open_streams.load(Ordering::Relaxed) > 0;
        (streamed || asked_ago < quiet).then(|| TrackError::TriggerHeld {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            asked_ago,
            quiet,
        })
    }

    pub(super) fn idle_for(&self, now: Instant) -> Duration {
        let last_seen =
            self.epoch + Duration::from_millis(self.last_seen_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last_seen)
    }

    /// Whether an activity value (see [`crate::scalers::Measurement`])
    /// is above the trigger's activation threshold.
    pub fn is_active(&self, activity: f64) -> bool {
        activity > self.config.trigger.activation_target
    }
}

/// How long a trigger counts as pushed to after its last stream
/// (`hoist_push_triggers`).
const PUSHED_LATELY: Duration = Duration::from_secs(6 * 3600);

pub struct StreamGuard(Arc<Tracked>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.note_stream();
        self.0.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}
