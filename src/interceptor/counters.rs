//! Per-route traffic counters. The proxies bump them on every request or
//! connection without locks; readers compute ACA's windows from them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use super::cold_start_times::{ColdStartTimes, Snapshot};

/// ACA's window: the rate is the requests of the past 15 s divided by 15.
pub const WINDOW: Duration = Duration::from_secs(15);
const WINDOW_SECONDS: u64 = WINDOW.as_secs();

/// Slots in each ring of 1 s buckets: more than the window, so a slot is
/// never rewritten while it is still being read.
const SLOTS: usize = 32;

/// The counters of one route.
pub struct RouteCounters {
    epoch: Instant,
    started_total: AtomicU64,
    in_flight: AtomicU64,
    held: AtomicU64,
    /// The highest in-flight count since the last sample, so that bursts
    /// shorter than a second still show in the concurrency samples.
    peak: AtomicU64,
    /// Requests started, per second: `second << 32 | count`.
    started: [AtomicU64; SLOTS],
    /// Concurrency sampled once per second: `second << 32 | level`.
    concurrency: [AtomicU64; SLOTS],
    /// Counts cold starts: bumped when a first request starts waiting for
    /// an upstream at zero, so the scaler can poll (and push) at once
    /// instead of at its next tick.
    cold_starts: watch::Sender<u64>,
    /// Answers the interceptor gave itself: 502, 503, 504.
    refusals: [AtomicU64; 3],
    /// Requests (connections) refused because every address of the
    /// upstream is in `interceptor.denied_networks`.
    upstream_denied: AtomicU64,
    /// How long released requests waited for the upstream.
    cold_start_times: ColdStartTimes,
}

/// The statuses the interceptor answers itself with, in `refusals` order.
pub const REFUSAL_CODES: [u16; 3] = [502, 503, 504];

/// What a route carried recently, as the scaler reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Requests (connections) started in the past 15 s, per second.
    pub rate: f64,
    /// Requests (connections) in flight, averaged over the past 15 s.
    pub concurrency: f64,
    /// In flight right now, held ones included.
    pub in_flight: u64,
    /// Waiting right now for the upstream to accept a connection.
    pub held: u64,
    /// Started since this interceptor started.
    pub started_total: u64,
}

impl Load {
    pub fn add(&mut self, other: &Load) {
        self.rate += other.rate;
        self.concurrency += other.concurrency;
        self.in_flight = self.in_flight.saturating_add(other.in_flight);
        self.held = self.held.saturating_add(other.held);
        self.started_total = self.started_total.saturating_add(other.started_total);
    }
}

impl RouteCounters {
    /// Counts an answer the interceptor gave itself instead of the app's.
    pub fn refused(&self, status: u16) {
        if let Some(slot) = REFUSAL_CODES.iter().position(|code| *code == status) {
            self.refusals[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (status, count) of the interceptor's own answers.
    pub fn refusals(&self) -> [(u16, u64); 3] {
        std::array::from_fn(|slot| {
            (
                REFUSAL_CODES[slot],
                self.refusals[slot].load(Ordering::Relaxed),
            )
        })
    }

    /// Counts a request (connection) whose upstream's addresses are all
    /// denied.
    pub fn upstream_denied(&self) {
        self.upstream_denied.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upstream_denied_total(&self) -> u64 {
        self.upstream_denied.load(Ordering::Relaxed)
    }

    /// Records a held request (connection) the upstream took after
    /// `waited`.
    pub fn cold_start_waited(&self, waited: Duration) {
        self.cold_start_times.record(waited);
    }

    pub fn cold_start_times(&self) -> Snapshot {
        self.cold_start_times.snapshot()
    }

    pub fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            started_total: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            started: std::array::from_fn(|_| AtomicU64::new(0)),
            concurrency: std::array::from_fn(|_| AtomicU64::new(0)),
            cold_starts: watch::Sender::new(0),
            refusals: Default::default(),
            upstream_denied: AtomicU64::new(0),
            cold_start_times: ColdStartTimes::default(),
        }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_secs()
    }

    /// Counts a request (connection) that starts now; it stays in flight
    /// until the guard is dropped.
    pub fn start(self: &std::sync::Arc<Self>, now: Instant) -> InFlight {
        let second = self.second(now);
        self.started_total.fetch_add(1, Ordering::Relaxed);
        bump(&self.started[slot(second)], second, |count| {
            count.saturating_add(1)
        });
        let level = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        // A read first: at a steady load the peak is rarely passed, and a
        // `fetch_max` takes the cache line for writing even when it
        // changes nothing.
        if level > self.peak.load(Ordering::Acquire) {
            self.peak.fetch_max(level, Ordering::AcqRel);
        }
        InFlight {
            counters: self.clone(),
        }
    }

    /// Marks a request as waiting for its upstream, unless `limit` already
    /// wait. The first one of a cold start wakes whoever watches this route.
    pub fn try_hold(self: &std::sync::Arc<Self>, limit: u64) -> Option<Held> {
        let before = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < limit).then_some(held + 1)
            })
            .ok()?;
        if before == 0 {
            self.cold_starts.send_modify(|count| *count += 1);
        }
        Some(Held {
            counters: self.clone(),
        })
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// How many cold starts began on this route; ticks at each.
    pub fn cold_starts(&self) -> watch::Receiver<u64> {
        self.cold_starts.subscribe()
    }

    /// Records this second's concurrency sample: the highest level seen
    /// since the previous sample. The interceptor calls it once a second.
    pub fn sample(&self, now: Instant) {
        let second = self.second(now);
        let level = self.in_flight.load(Ordering::Acquire);
        let peak = self.peak.swap(level, Ordering::AcqRel).max(level);
        let sample = peak.min(LOW);
        bump(&self.concurrency[slot(second)], second, |old| {
            old.max(sample)
        });
    }

    /// The route's load over the window that ends now.
    pub fn load(&self, now: Instant) -> Load {
        let elapsed = now.saturating_duration_since(self.epoch);
        let second = elapsed.as_secs();
        let first = second.saturating_sub(WINDOW_SECONDS - 1);
        // The window is (now - 15 s, now]: this second so far, the 14
        // before it, and the share of the 15th before it still inside,
        // taking its requests as spread evenly over it.
        let recent: u64 = (first..=second)
            .filter_map(|s| value_at(&self.started[slot(s)], s))
            .sum();
        let leaving = second
            .checked_sub(WINDOW_SECONDS)
            .and_then(|s| value_at(&self.started[slot(s)], s))
            .unwrap_or(0);
        let inside = 1.0 - f64::from(elapsed.subsec_nanos()) / 1e9;
        let started = recent as f64 + leaving as f64 * inside;
        let in_flight = self.in_flight.load(Ordering::Acquire);
        let samples: Vec<u64> = (first..=second)
            .filter_map(|s| value_at(&self.concurrency[slot(s)], s))
            .collect();
        // Before the first sample (a route that just started) the current
        // level is the best estimate there is.
        let concurrency = if samples.is_empty() {
            in_flight as f64
        } else {
            samples.iter().sum::<u64>() as f64 / samples.len() as f64
        };
        Load {
            rate: started / WINDOW_SECONDS as f64,
            concurrency,
            in_flight,
            held: self.held(),
            started_total: self.started_total.load(Ordering::Relaxed),
        }
    }
}

fn slot(second: u64) -> usize {
    (second % SLOTS as u64) as usize
}

/// A bucket's tag: its second plus one, so that an untouched bucket (0)
/// never looks like second 0.
fn tag(second: u64) -> u64 {
    (second + 1) & u64::from(u32::MAX)
}

const LOW: u64 = u32::MAX as u64;

/// Updates the bucket for `second`, starting it afresh when it still holds
/// an older second.
fn bump(bucket: &AtomicU64, second: u64, update: impl Fn(u64) -> u64) {
    let tag = tag(second);
    let _ = bucket.fetch_update(Ordering::AcqRel, Ordering::Acquire, |packed| {
        let value = if packed >> 32 == tag { packed & LOW } else { 0 };
        Some(tag << 32 | update(value).min(LOW))
    });
}

/// The bucket's value if it belongs to `second`.
fn value_at(bucket: &AtomicU64, second: u64) -> Option<u64> {
    let packed = bucket.load(Ordering::Acquire);
    (packed >> 32 == tag(second)).then_some(packed & LOW)
}

/// A request (connection) in flight; dropping it ends it.
pub struct InFlight {
    counters: std::sync::Arc<RouteCounters>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request waiting for its upstream; dropping it ends the wait.
pub struct Held {
    counters: std::sync::Arc<RouteCounters>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counters.held.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn at(epoch: Instant, millis: u64) -> Instant {
        epoch + Duration::from_millis(millis)
    }

    #[test]
    fn rate_is_the_requests_of_the_past_15_seconds_over_15() {
        let epoch = Instant::now();
        let counters = Arc::new(RouteCounters::new(epoch));
        // 30 requests in second 0, 15 in second 10.
        for _ in 0..30 {
            drop(counters.start(at(epoch, 100)));
        }
        for _ in 0..15 {
            drop(counters.start(at(epoch, 10_500)));
        }
        assert_eq!(counters.load(at(epoch, 11_000)).rate, 3.0);
        // Second 0 slides out of the window between 15 s and 16 s (its
        // requests taken as spread over it); second 10 between 25 and 26 s.
        assert_eq!(counters.load(at(epoch, 15_000)).rate, 3.0);
        assert_eq!(counters.load(at(epoch, 15_500)).rate, 2.0);
        assert_eq!(counters.load(at(epoch, 16_000)).rate, 1.0);
        assert_eq!(counters.load(at(epoch, 25_500)).rate, 0.5);
        assert_eq!(counters.load(at(epoch, 26_000)).rate, 0.0);
        // A slot reused a ring later does not bring old counts back.
        assert_eq!(counters.load(at(epoch, 32_500)).rate, 0.0);
        drop(counters.start(at(epoch, 32_100)));
        assert_eq!(counters.load(at(epoch, 32_500)).rate, 1.0 / 15.0);
        assert_eq!(counters.load(at(epoch, 32_500)).started_total, 46);
    }

    #[test]
    fn in_flight_lasts_until_the_guard_drops() {
        let epoch = Instant::now();
        let counters = Arc::new(RouteCounters::new(epoch));
        let first = counters.start(epoch);
        let second = counters.start(epoch);
        assert_eq!(counters.load(epoch).in_flight, 2);
        drop(first);
        assert_eq!(counters.load(epoch).in_flight, 1);
        drop(second);
        assert_eq!(counters.load(epoch).in_flight, 0);
    }

    #[test]
    fn concurrency_averages_per_second_peaks_over_the_window() {
        let epoch = Instant::now();
        let counters = Arc::new(RouteCounters::new(epoch));
        // Before any sample, the level now is the estimate.
        let open = counters.start(epoch);
        assert_eq!(counters.load(epoch).concurrency, 1.0);
        // Seconds 0..5: one request open throughout.
        for second in 0..5 {
            counters.sample(at(epoch, second * 1000 + 999));
        }
        // Second 5: a burst of 4 more that ends before the sample.
        let burst: Vec<_> = (0..4).map(|_| counters.start(at(epoch, 5_100))).collect();
        drop(burst);
        counters.sample(at(epoch, 5_999));
        // 5 samples of 1 and one of 5: the burst is not lost between samples.
        let load = counters.load(at(epoch, 5_999));
        assert_eq!(load.concurrency, 10.0 / 6.0);
        drop(open);
        for second in 6..22 {
            counters.sample(at(epoch, second * 1000 + 999));
        }
        // The request ended after second 5's sample: second 6 still saw it.
        assert_eq!(counters.load(at(epoch, 20_999)).concurrency, 1.0 / 15.0);
        assert_eq!(counters.load(at(epoch, 21_999)).concurrency, 0.0);
    }

    #[test]
    fn holds_are_capped_and_the_first_of_a_cold_start_wakes_watchers() {
        let counters = Arc::new(RouteCounters::new(Instant::now()));
        let mut cold_starts = counters.cold_starts();
        let first = counters.try_hold(2).expect("room for two");
        assert!(cold_starts.has_changed().unwrap(), "a cold start began");
        cold_starts.mark_unchanged();
        let second = counters.try_hold(2).expect("room for two");
        assert!(!cold_starts.has_changed().unwrap(), "same cold start");
        assert!(counters.try_hold(2).is_none(), "the cap holds");
        assert_eq!(counters.held(), 2);
        drop((first, second));
        assert_eq!(counters.held(), 0);
        let _again = counters.try_hold(2).unwrap();
        assert!(cold_starts.has_changed().unwrap(), "a new cold start");
    }
}
