//! `tracing` output, as text for people or JSON for log pipelines.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber; a second call is a no-op. `RUST_LOG`
/// overrides the configured level when set.
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match settings.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Keeps a repeated event (a refused request, a failed accept) to one log
/// line per interval, however fast it happens: an attack or a burst must
/// not grow the log with it.
#[derive(Debug)]
pub struct Summary {
    interval: std::time::Duration,
    /// When the last line was written, and how many events since.
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl Summary {
    pub const fn new(interval: std::time::Duration) -> Self {
        Self {
            interval,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// Counts one event; `Some(count)` when a line is due: at the first
    /// event, then at the first of each later interval, with how many
    /// happened since the last line (this one included).
    pub fn note(&self) -> Option<u64> {
        self.note_at(std::time::Instant::now())
    }

    fn note_at(&self, now: std::time::Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, count) = &mut *state;
        *count += 1;
        if last.is_some_and(|at| now.duration_since(at) < self.interval) {
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(count))
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;
    use std::time::Duration;

    #[test]
    fn one_line_per_interval_with_a_count() {
        let summary = Summary::new(Duration::from_secs(10));
        let start = std::time::Instant::now();
        assert_eq!(summary.note_at(start), Some(1));
        for _ in 0..500 {
            assert_eq!(summary.note_at(start + Duration::from_secs(9)), None);
        }
        let later = start + Duration::from_secs(10);
        assert_eq!(summary.note_at(later), Some(501));
        assert_eq!(summary.note_at(later), None);
    }
}
