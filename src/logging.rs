//! `tracing` output, as text for people or JSON for log pipelines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// The Kubernetes client writes an ERROR line for every failed request
/// (about 70 a minute while the API server refuses connections); hoist
/// reports each failing watch or read itself, once per outage, so those
/// lines are off unless `RUST_LOG` asks for them.
const QUIET_KUBE_CLIENT: &str = "kube_client::client::builder=off";

/// Installs the global subscriber; a second call is a no-op. `RUST_LOG`
/// overrides the configured level when set.
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::try_new(&settings.level)
            .unwrap_or_else(|_| EnvFilter::new("info"))
            .add_directive(QUIET_KUBE_CLIENT.parse().expect("a valid directive"))
    });
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
/// not grow the log with it. The first event of a window is logged at once
/// by its caller, with its context; the events after it are counted, and
/// the count is written by `flush` when the window ends (not at the next
/// event, which may never come: a 3 s burst would otherwise log 1).
pub struct Summary {
    interval: Duration,
    window: Arc<Mutex<Window>>,
    flush: Arc<dyn Fn(u64) + Send + Sync>,
}

#[derive(Default)]
struct Window {
    /// When the window started (its first line was written).
    started: Option<Instant>,
    /// Events since that line.
    count: u64,
    /// A flush is waiting for the window's end.
    flushing: bool,
}

impl Summary {
    /// `flush` writes the line for the events a window's first line did
    /// not cover (called with their count).
    pub fn new(interval: Duration, flush: impl Fn(u64) + Send + Sync + 'static) -> Self {
        Self {
            interval,
            window: Arc::default(),
            flush: Arc::new(flush),
        }
    }

    /// Counts one event; `Some(count)` when the caller is to log it now: at
    /// the first event, and at the first after a quiet window, with how
    /// many happened since the last line (this one included).
    pub fn note(&self) -> Option<u64> {
        let now = Instant::now();
        let mut window = lock(&self.window);
        window.count += 1;
        match window.started {
            Some(started) if now.duration_since(started) < self.interval => {
                if !window.flushing
                    && let Ok(runtime) = tokio::runtime::Handle::try_current()
                {
                    window.flushing = true;
                    let (state, flush) = (self.window.clone(), self.flush.clone());
                    let end = started + self.interval;
                    runtime.spawn(async move {
                        tokio::time::sleep_until(end).await;
                        let mut window = lock(&state);
                        window.flushing = false;
                        let count = std::mem::take(&mut window.count);
                        if count > 0 {
                            // The next window starts with this line.
                            window.started = Some(Instant::now());
                            drop(window);
                            flush(count);
                        }
                    });
                }
                None
            }
            _ => {
                window.started = Some(now);
                // A window's flush has run by its end; one that did not was
                // lost with the runtime that was to run it (a runtime per
                // test): never let it block the next window's.
                window.flushing = false;
                Some(std::mem::take(&mut window.count))
            }
        }
    }
}

impl std::fmt::Debug for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Summary")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

fn lock(window: &Mutex<Window>) -> std::sync::MutexGuard<'_, Window> {
    window.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> (Arc<Mutex<Vec<u64>>>, impl Fn(u64) + Send + Sync + 'static) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        (lines, move |count| sink.lock().unwrap().push(count))
    }

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_and_the_end_of_a_burst_flushed() {
        let (flushed, flush) = recorded();
        let summary = Summary::new(Duration::from_secs(10), flush);
        assert_eq!(summary.note(), Some(1), "the first event: logged now");
        for _ in 0..500 {
            assert_eq!(summary.note(), None);
        }
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(
            flushed.lock().unwrap().is_empty(),
            "not before the window ends"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert_eq!(
            *flushed.lock().unwrap(),
            [500],
            "the burst's end, without a next event"
        );
        // The flush opened a window: the next event waits for its end.
        assert_eq!(summary.note(), None);
        tokio::time::sleep(Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
        assert_eq!(*flushed.lock().unwrap(), [500, 1]);
        // Quiet since: nothing more, and the next event is logged at once.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(flushed.lock().unwrap().len(), 2);
        assert_eq!(summary.note(), Some(1));
    }
}
