//! One background task per distinct source query.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::reading::{PollError, Reading};
use crate::metrics::{Metrics, ScalerLabels, SourceLabels};
use crate::scalers::Query;

/// When and how long to poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Duration,
    pub timeout: Duration,
}

/// The first retry after a failure waits this long, doubling per failure
/// up to the polling interval: quick recovery from a blip, and a broken
/// source is never asked more often than a healthy one in the long run.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Polls that a source's wake-ups cause are at least this far apart.
const MIN_WAKE_GAP: Duration = Duration::from_millis(250);

/// The schedule the registry sets and the poll loop follows: a value and a
/// wake-up (a `watch` channel did this at ~380 bytes per poller; with one
/// poller per source, 100,000 sources make that count).
struct ScheduleCell {
    current: Mutex<Schedule>,
    changed: Notify,
}

impl ScheduleCell {
    fn get(&self) -> Schedule {
        *self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The registry's view of a running poller.
pub struct Poller {
    pub readings: watch::Receiver<Reading>,
    schedule: Arc<ScheduleCell>,
    cancel: CancellationToken,
    /// By subscriber id: usually one, so a list, not a map.
    subscribers: Vec<(u64, Schedule)>,
    labels: SourceLabels,
    /// The question it asks, which its subscribers share.
    pub query: Query,
}

impl Poller {
    /// Starts polling `query` at once.
    pub fn spawn(
        scaler: &'static str,
        query: &Query,
        first: Schedule,
        cancel: CancellationToken,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (readings_tx, readings) = watch::channel(Reading::Pending);
        let schedule = Arc::new(ScheduleCell {
            current: Mutex::new(first),
            changed: Notify::new(),
        });
        let labels = SourceLabels {
            scaler,
            source: query.description.clone(),
        };
        let task = PollLoop {
            query: query.clone(),
            labels: labels.clone(),
            schedule: schedule.clone(),
            readings: readings_tx,
            cancel: cancel.clone(),
            metrics,
        };
        tokio::spawn(task.run());
        Self {
            readings,
            schedule,
            cancel,
            subscribers: Vec::new(),
            labels,
            query: query.clone(),
        }
    }

    pub fn subscribe(&mut self, subscriber: u64, wanted: Schedule) {
        match self
            .subscribers
            .iter_mut()
            .find(|(id, _)| *id == subscriber)
        {
            Some((_, schedule)) => *schedule = wanted,
            None => self.subscribers.push((subscriber, wanted)),
        }
        self.reschedule();
    }

    /// Returns true when nobody is left.
    pub fn unsubscribe(&mut self, subscriber: u64) -> bool {
        self.subscribers.retain(|(id, _)| *id != subscriber);
        if self.subscribers.is_empty() {
            return true;
        }
        self.reschedule();
        false
    }

    /// The shortest interval any subscriber asked for; the longest timeout
    /// (bounded by that interval), so no subscriber's patience is cut short.
    fn reschedule(&self) {
        let interval = self.subscribers.iter().map(|(_, s)| s.interval).min();
        let timeout = self.subscribers.iter().map(|(_, s)| s.timeout).max();
        if let (Some(interval), Some(timeout)) = (interval, timeout) {
            let schedule = Schedule {
                interval,
                timeout: timeout.min(interval.max(Duration::from_millis(1))),
            };
            let mut current = self
                .schedule
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *current != schedule {
                *current = schedule;
                drop(current);
                // A permit if the loop is not waiting: it reads the new
                // schedule at its next wait.
                self.schedule.changed.notify_one();
            }
        }
    }

    /// Whether the polling task has ended (it only does when stopped, or
    /// if it panicked); a dead poller must be replaced, not joined.
    pub fn is_dead(&self) -> bool {
        self.readings.has_changed().is_err()
    }

    pub fn stop(&self, metrics: &Metrics) {
        self.cancel.cancel();
        metrics.poll_errors.remove(&self.labels);
    }
}

impl Drop for Poller {
    /// A poller nobody holds polls no more.
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

struct PollLoop {
    query: Query,
    labels: SourceLabels,
    schedule: Arc<ScheduleCell>,
    readings: watch::Sender<Reading>,
    cancel: CancellationToken,
    metrics: Arc<Metrics>,
}

impl PollLoop {
    async fn run(self) {
        let description = self.query.description.clone();
        let mut wakeups = self.query.source.wakeups();
        // Polls caused by wake-ups are spaced out among themselves only: a
        // cold start right after a scheduled poll is measured at once.
        let mut last_woken: Option<Instant> = None;
        debug!(source = %description, "poller started");
        let mut failures: u32 = 0;
        loop {
            let timeout = self.schedule.get().timeout;
            let started = Instant::now();
            let outcome = tokio::select! {
                _ = self.cancel.cancelled() => break,
                outcome = tokio::time::timeout(timeout, self.query.source.observe()) => outcome,
            };
            self.metrics
                .poll_duration
                .get_or_create(&ScalerLabels {
                    scaler: self.labels.scaler,
                })
                .observe(started.elapsed().as_secs_f64());
            let result = match outcome {
                Ok(Ok(measurement)) => Ok(measurement),
                Ok(Err(error)) => Err(PollError::Observe(error)),
                Err(_) => Err(PollError::Timeout(timeout)),
            };
            match result {
                Ok(measurement) => {
                    if failures > 0 {
                        warn!(source = %description, after_failures = failures, "source recovered");
                    }
                    failures = 0;
                    self.readings.send_replace(Reading::Value {
                        value: measurement.value,
                        activity: measurement.activity,
                        at: Instant::now(),
                    });
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    self.metrics.poll_errors.get_or_create(&self.labels).inc();
                    // One line when a source breaks, then quiet at debug.
                    if failures == 1 {
                        warn!(source = %description, %error, "poll failed");
                    } else {
                        debug!(source = %description, %error, failures, "poll failed again");
                    }
                    let last_value = self.readings.borrow().last_value();
                    self.readings.send_replace(Reading::Failed {
                        error,
                        at: Instant::now(),
                        consecutive_failures: failures,
                        last_value,
                    });
                }
            }

            // Wait for the next poll; a new subscriber may shorten the
            // interval, which moves the next poll earlier (never to now).
            loop {
                let interval = self.schedule.get().interval;
                let wait = if failures == 0 {
                    interval
                } else {
                    retry_delay(failures).min(interval)
                };
                tokio::select! {
                    _ = self.cancel.cancelled() => {
                        debug!(source = %description, "poller stopped");
                        return;
                    }
                    _ = sleep_until_or_forever(started.checked_add(wait)) => break,
                    // The source says its value just changed (a cold start
                    // began): measure now, not at the next tick, but not
                    // more often than MIN_WAKE_GAP however often it says so.
                    () = woken(&mut wakeups) => {
                        let earliest = last_woken.map(|at| at + MIN_WAKE_GAP);
                        tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = sleep_until_or_forever(earliest.or(Some(Instant::now()))) => {}
                        }
                        last_woken = Some(Instant::now());
                        break;
                    }
                    () = self.schedule.changed.notified() => {}
                }
            }
        }
        debug!(source = %description, "poller stopped");
    }
}

async fn woken(wakeups: &mut Option<watch::Receiver<u64>>) {
    let Some(receiver) = wakeups else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn sleep_until_or_forever(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn retry_delay(failures: u32) -> Duration {
    FIRST_RETRY.saturating_mul(
        1_u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_one_second() {
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(2), Duration::from_secs(2));
        assert_eq!(retry_delay(5), Duration::from_secs(16));
        assert!(retry_delay(40) >= Duration::from_secs(3600));
    }
}
