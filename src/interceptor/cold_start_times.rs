//! How long requests (connections) waited for an upstream at zero before
//! it took them: one histogram per route, bumped without locks by the
//! request that was released, read at scrape time as
//! `hoist_interceptor_cold_start_seconds`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: from a pod already starting
/// (a tenth of a second) to `cold_start_timeout`'s range (1 s to 1 h).
pub const BOUNDS: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

/// The waits of one route, per bucket (the last one past every bound).
#[derive(Default)]
pub struct ColdStartTimes {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_micros: AtomicU64,
}

/// A histogram as Prometheus encodes it: the sum of the waits in
/// seconds, their count, and (upper bound, count in that bucket alone)
/// with `f64::MAX` standing for `+Inf`.
pub struct Snapshot {
    pub sum_seconds: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

impl ColdStartTimes {
    /// Records one request that waited `waited` and was then let through.
    pub fn record(&self, waited: Duration) {
        let seconds = waited.as_secs_f64();
        let bucket = BOUNDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BOUNDS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let buckets: Vec<(f64, u64)> = BOUNDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(&self.buckets)
            .map(|(bound, count)| (bound, count.load(Ordering::Relaxed)))
            .collect();
        Snapshot {
            sum_seconds: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count: buckets.iter().map(|(_, count)| count).sum(),
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wait_lands_in_the_first_bucket_that_holds_it() {
        let times = ColdStartTimes::default();
        times.record(Duration::from_millis(80));
        times.record(Duration::from_millis(100)); // on the bound: still ≤ 0.1
        times.record(Duration::from_millis(3_100));
        times.record(Duration::from_secs(3_600)); // past every bound
        let snapshot = times.snapshot();
        assert_eq!(snapshot.count, 4);
        assert!((snapshot.sum_seconds - 3_603.28).abs() < 1e-6);
        let count_at = |bound: f64| {
            snapshot
                .buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .map(|(_, count)| *count)
        };
        assert_eq!(count_at(0.1), Some(2));
        assert_eq!(count_at(5.0), Some(1));
        assert_eq!(count_at(f64::MAX), Some(1));
        assert_eq!(snapshot.buckets.len(), BOUNDS.len() + 1);
    }
}
