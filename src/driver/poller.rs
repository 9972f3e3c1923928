//! Polling every distinct source query. One scheduler task keeps the next
//! poll of every poller in a timer queue; a poll runs in a short-lived task
//! of its own. A poller at rest is its state (a few hundred bytes), not a
//! task: a task per poller, with its timers and select arms, was about a
//! kilobyte, and with one source per ScaledObject 100,000 sources make that
//! 100 MB.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{debug, warn};

use super::reading::{PollError, Reading};
use crate::metrics::{Metrics, ScalerLabels, SourceLabels};
use crate::scalers::{ObserveError, Query};

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

/// The scheduler every poller of a driver shares (one pointer in each).
#[derive(Clone)]
pub struct Scheduler(Arc<SchedulerParts>);

struct SchedulerParts {
    commands: mpsc::UnboundedSender<Command>,
    /// The scheduler task, for tests that stop it as a panic would.
    #[cfg_attr(not(test), allow(dead_code))]
    task: tokio::task::AbortHandle,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
}

enum Command {
    /// Poll at this instant (replacing the one planned).
    At(Arc<Shared>, Instant),
    /// Poll at this instant, unless one is planned earlier.
    NoLaterThan(Arc<Shared>, Instant),
    /// A poll that started then has ended: plan the next, from the
    /// schedule and wake-ups as they are when the scheduler takes this
    /// (changes made while the poll ran wait for it, not race it).
    Ended(Arc<Shared>, Instant),
    /// Poll no more.
    Remove(Arc<Shared>),
}

impl Scheduler {
    /// Starts the scheduler task; it and every poll end with `cancel`.
    pub fn start(metrics: Arc<Metrics>, cancel: CancellationToken) -> Self {
        let (commands, received) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(received, cancel.clone())).abort_handle();
        Self(Arc::new(SchedulerParts {
            commands,
            task,
            metrics,
            cancel,
        }))
    }

    /// Whether the scheduler task still runs. It ends at shutdown, or if
    /// it panicked (a bug): then no source is polled any more.
    pub fn running(&self) -> bool {
        !self.0.commands.is_closed()
    }

    /// Resolves when the scheduler task has ended.
    pub async fn ended(&self) {
        self.0.commands.closed().await;
    }

    /// Stops the task as a panic in it would.
    #[cfg(test)]
    pub fn kill(&self) {
        self.0.task.abort();
    }

    fn send(&self, command: Command) {
        // Closed only once the scheduler ended (shutdown): nothing to do.
        let _ = self.0.commands.send(command);
    }
}

/// The scheduler task: polls fall due from the queue and start; commands
/// place, move and remove them.
async fn run(mut commands: mpsc::UnboundedReceiver<Command>, cancel: CancellationToken) {
    let mut queue: DelayQueue<Arc<Shared>> = DelayQueue::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            command = commands.recv() => match command {
                None => return,
                Some(Command::At(shared, at)) => place(&mut queue, &shared, at, false),
                Some(Command::NoLaterThan(shared, at)) => place(&mut queue, &shared, at, true),
                Some(Command::Ended(shared, started)) => ended(&mut queue, &shared, started),
                Some(Command::Remove(shared)) => {
                    if let Some(key) = shared.state().key.take() {
                        queue.try_remove(&key);
                    }
                }
            },
            // Ready(None) when the queue is empty: the branch sleeps until
            // the next command brings the loop round again.
            Some(due) = std::future::poll_fn(|cx| match queue.poll_expired(cx) {
                Poll::Ready(None) => Poll::Pending,
                other => other,
            }) => {
                let shared = due.into_inner();
                let started = Instant::now();
                {
                    let mut state = shared.state();
                    state.key = None;
                    if state.stopped {
                        continue;
                    }
                    state.in_flight = true;
                    state.started = Some(started);
                }
                tokio::spawn(poll_once(shared, started));
            }
        }
    }
}

/// After a poll: the next one an interval (or a retry delay) after it
/// started, or sooner for a wake-up that came meanwhile.
fn ended(queue: &mut DelayQueue<Arc<Shared>>, shared: &Arc<Shared>, started: Instant) {
    let next = {
        let mut state = shared.state();
        state.in_flight = false;
        if state.stopped {
            return;
        }
        let scheduled = shared.next_after(started, state.failures);
        if std::mem::take(&mut state.wake_pending) {
            woken_at(&mut state).min(scheduled)
        } else {
            scheduled
        }
    };
    place(queue, shared, next, false);
}

fn place(
    queue: &mut DelayQueue<Arc<Shared>>,
    shared: &Arc<Shared>,
    at: Instant,
    earlier_only: bool,
) {
    let mut state = shared.state();
    if state.stopped || state.in_flight {
        // A running poll plans the next itself when it ends.
        return;
    }
    match &state.key {
        Some(key) => {
            if !earlier_only || at < queue.deadline(key) {
                queue.reset_at(key, at);
            }
        }
        None => state.key = Some(queue.insert_at(shared.clone(), at)),
    }
}

/// A poller's state, shared by the registry's [`Poller`], the queue and a
/// running poll.
struct Shared {
    query: Query,
    scaler: &'static str,
    readings: watch::Sender<Reading>,
    schedule: Mutex<Schedule>,
    state: Mutex<State>,
    scheduler: Scheduler,
    /// Stops the wake-up listener of a source that has wake-ups.
    wakeups: Option<CancellationToken>,
}

#[derive(Default)]
struct State {
    /// Where the next poll waits in the queue (none while one runs).
    key: Option<delay_queue::Key>,
    in_flight: bool,
    /// When the last poll started: the next is due an interval after.
    started: Option<Instant>,
    failures: u32,
    /// Polls caused by wake-ups are spaced out among themselves only: a
    /// cold start right after a scheduled poll is measured at once.
    last_woken: Option<Instant>,
    /// A wake-up came while a poll ran: poll again when it ends.
    wake_pending: bool,
    stopped: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The labels of its series (built when needed: a poller keeps none).
    fn labels(&self) -> SourceLabels {
        SourceLabels {
            scaler: self.scaler,
            source: self.query.description.clone(),
        }
    }

    fn schedule(&self) -> Schedule {
        *self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the next scheduled poll is due, after one that started at
    /// `started`: an interval later, or sooner after failures.
    fn next_after(&self, started: Instant, failures: u32) -> Instant {
        let interval = self.schedule().interval;
        let wait = if failures == 0 {
            interval
        } else {
            retry_delay(failures).min(interval)
        };
        started.checked_add(wait).unwrap_or_else(far_future)
    }

    /// The source says its value just changed (a cold start began):
    /// measure now, not at the next tick, but not more often than
    /// `MIN_WAKE_GAP` however often it says so.
    fn wake(self: &Arc<Self>) {
        let at = {
            let mut state = self.state();
            if state.stopped {
                return;
            }
            if state.in_flight {
                state.wake_pending = true;
                return;
            }
            woken_at(&mut state)
        };
        self.scheduler.send(Command::NoLaterThan(self.clone(), at));
    }
}

/// When a wake-up's poll may run, noted as the last one.
fn woken_at(state: &mut State) -> Instant {
    let now = Instant::now();
    let at = state
        .last_woken
        .map_or(now, |last| (last + MIN_WAKE_GAP).max(now));
    state.last_woken = Some(at);
    at
}

/// One poll: observe the source within the timeout, publish the reading,
/// plan the next.
async fn poll_once(shared: Arc<Shared>, started: Instant) {
    let scheduler = shared.scheduler.clone();
    let timeout = shared.schedule().timeout;
    // A panic in a source is that poll's failure, not the scheduler's.
    let observe = AssertUnwindSafe(shared.query.source.observe()).catch_unwind();
    let outcome = tokio::select! {
        _ = scheduler.0.cancel.cancelled() => return,
        outcome = tokio::time::timeout(timeout, observe) => outcome,
    };
    scheduler
        .0
        .metrics
        .poll_duration
        .get_or_create(&ScalerLabels {
            scaler: shared.scaler,
        })
        .observe(started.elapsed().as_secs_f64());
    let result = match outcome {
        Ok(Ok(Ok(measurement))) => Ok(measurement),
        Ok(Ok(Err(error))) => Err(PollError::Observe(error)),
        Ok(Err(_panicked)) => Err(PollError::Observe(ObserveError::Query(
            "the measurement panicked (a bug in hoist: please report it)".into(),
        ))),
        Err(_) => Err(PollError::Timeout(timeout)),
    };
    let description = &shared.query.description;
    let (before, failures) = {
        let mut state = shared.state();
        let before = state.failures;
        state.failures = match result {
            Ok(_) => 0,
            Err(_) => before.saturating_add(1),
        };
        (before, state.failures)
    };
    match result {
        Ok(measurement) => {
            if before > 0 {
                warn!(source = %description, after_failures = before, "source recovered");
            }
            shared.readings.send_replace(Reading::Value {
                value: measurement.value,
                activity: measurement.activity,
                at: Instant::now(),
            });
        }
        Err(error) => {
            scheduler
                .0
                .metrics
                .poll_errors
                .get_or_create(&shared.labels())
                .inc();
            // One line when a source breaks, then quiet at debug.
            if failures == 1 {
                warn!(source = %description, %error, "poll failed");
            } else {
                debug!(source = %description, %error, failures, "poll failed again");
            }
            let last_value = shared.readings.borrow().last_value();
            shared.readings.send_replace(Reading::Failed {
                error,
                at: Instant::now(),
                consecutive_failures: failures,
                last_value,
            });
        }
    }
    // Still in flight until the scheduler takes this: wake-ups and new
    // schedules meanwhile are applied by it, in order.
    scheduler.send(Command::Ended(shared, started));
}

/// Far enough never to come (an interval too long to add), and near
/// enough for the timer queue, which panics past about two years (2³⁶ ms):
/// a panic there would stop every poller.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// The wake-ups of a new poller's source, not yet listened to.
pub struct Wakeups {
    receiver: watch::Receiver<u64>,
    stop: CancellationToken,
    shared: Arc<Shared>,
}

impl Wakeups {
    /// Wakes the poller on each of its source's wake-ups until it stops
    /// (at once, if it stopped meanwhile).
    pub fn listen(self) {
        let Self {
            mut receiver,
            stop,
            shared,
        } = self;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = receiver.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        shared.wake();
                    }
                }
            }
        });
    }
}

/// The registry's view of a running poller.
pub struct Poller {
    pub readings: watch::Receiver<Reading>,
    shared: Arc<Shared>,
    /// By subscriber id: usually one, so a list, not a map.
    subscribers: Vec<(u64, Schedule)>,
}

impl Poller {
    /// Starts polling `query` at once. A source with wake-ups (hoist's own
    /// traffic) also needs a listener task: [`Wakeups::listen`], called
    /// outside the driver's lock.
    pub fn spawn(
        scaler: &'static str,
        query: &Query,
        first: Schedule,
        scheduler: &Scheduler,
    ) -> (Self, Option<Wakeups>) {
        let (readings_tx, readings) = watch::channel(Reading::Pending);
        let wakeups = query.source.wakeups();
        let shared = Arc::new(Shared {
            query: query.clone(),
            scaler,
            readings: readings_tx,
            schedule: Mutex::new(first),
            state: Mutex::new(State::default()),
            scheduler: scheduler.clone(),
            wakeups: wakeups.as_ref().map(|_| scheduler.0.cancel.child_token()),
        });
        let listener = match (wakeups, shared.wakeups.clone()) {
            (Some(receiver), Some(stop)) => Some(Wakeups {
                receiver,
                stop,
                shared: shared.clone(),
            }),
            _ => None,
        };
        debug!(source = %query.description, "poller started");
        scheduler.send(Command::At(shared.clone(), Instant::now()));
        let poller = Self {
            readings,
            shared,
            subscribers: Vec::new(),
        };
        (poller, listener)
    }

    /// The question it asks, which its subscribers share.
    pub fn query(&self) -> &Query {
        &self.shared.query
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
    /// A new interval moves the next poll (earlier or later) from when the
    /// last one started.
    fn reschedule(&self) {
        let interval = self.subscribers.iter().map(|(_, s)| s.interval).min();
        let timeout = self.subscribers.iter().map(|(_, s)| s.timeout).max();
        let (Some(interval), Some(timeout)) = (interval, timeout) else {
            return;
        };
        let schedule = Schedule {
            interval,
            timeout: timeout.min(interval.max(Duration::from_millis(1))),
        };
        {
            let mut current = self
                .shared
                .schedule
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *current == schedule {
                return;
            }
            *current = schedule;
        }
        let next = {
            let state = self.shared.state();
            match state.started {
                // Not polled yet (its first poll is due now), or polling:
                // the poll plans the next with the new interval.
                Some(started) if !state.in_flight && !state.stopped => {
                    self.shared.next_after(started, state.failures)
                }
                _ => return,
            }
        };
        self.shared
            .scheduler
            .send(Command::At(self.shared.clone(), next));
    }

    /// Whether the scheduler has ended (only at shutdown, or if it
    /// panicked); a dead poller must be replaced, not joined.
    pub fn is_dead(&self) -> bool {
        !self.shared.scheduler.running()
    }

    pub fn stop(&self, metrics: &Metrics) {
        self.halt();
        metrics.poll_errors.remove(&self.shared.labels());
    }

    fn halt(&self) {
        {
            let mut state = self.shared.state();
            if state.stopped {
                return;
            }
            state.stopped = true;
        }
        if let Some(wakeups) = &self.shared.wakeups {
            wakeups.cancel();
        }
        self.shared
            .scheduler
            .send(Command::Remove(self.shared.clone()));
        debug!(source = %self.shared.query.description, "poller stopped");
    }
}

impl Drop for Poller {
    /// A poller nobody holds polls no more.
    fn drop(&mut self) {
        self.halt();
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

    use std::sync::atomic::{AtomicU32, Ordering};

    use crate::scalers::{Measurement, Source};

    /// A source whose polls are counted and wait for the test's release.
    struct Gated {
        polls: AtomicU32,
        release: tokio::sync::Semaphore,
        wakeups: watch::Sender<u64>,
    }

    impl Source for Gated {
        fn observe(&self) -> futures::future::BoxFuture<'_, Result<Measurement, ObserveError>> {
            Box::pin(async {
                self.polls.fetch_add(1, Ordering::SeqCst);
                self.release.acquire().await.unwrap().forget();
                Ok(Measurement::of(1.0))
            })
        }

        fn wakeups(&self) -> Option<watch::Receiver<u64>> {
            Some(self.wakeups.subscribe())
        }
    }

    #[tokio::test]
    async fn the_far_future_is_a_deadline_the_queue_takes() {
        let mut queue: DelayQueue<()> = DelayQueue::new();
        let key = queue.insert_at((), far_future());
        queue.reset_at(&key, far_future());
        assert!(queue.deadline(&key) > Instant::now() + Duration::from_secs(86_400 * 300));
    }

    /// A wake-up and a shorter interval that come while a poll runs are
    /// applied when it ends (they raced the poll's own planning once).
    #[tokio::test(start_paused = true)]
    async fn what_comes_during_a_poll_applies_when_it_ends() {
        let source = Arc::new(Gated {
            polls: AtomicU32::new(0),
            release: tokio::sync::Semaphore::new(0),
            wakeups: watch::Sender::new(0),
        });
        let query = Query {
            key: "gated".into(),
            description: "gated".into(),
            endpoints: Vec::new(),
            source: source.clone(),
        };
        let scheduler = Scheduler::start(Arc::new(Metrics::default()), CancellationToken::new());
        let hour = Schedule {
            interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(3600),
        };
        let (mut poller, wakeups) = Poller::spawn("test", &query, hour, &scheduler);
        if let Some(wakeups) = wakeups {
            wakeups.listen();
        }
        poller.subscribe(1, hour);
        let polls = || source.polls.load(Ordering::SeqCst);
        let settle = || tokio::time::sleep(Duration::from_millis(10));

        settle().await;
        assert_eq!(polls(), 1, "the first poll runs at once");
        // A wake-up while it runs: the next poll comes right after it.
        source.wakeups.send_modify(|n| *n += 1);
        settle().await;
        source.release.add_permits(1);
        settle().await;
        assert_eq!(polls(), 2, "the wake-up's poll follows the first");
        source.release.add_permits(1);
        settle().await;
        // A shorter interval while the next runs is the one it plans with.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(polls(), 3);
        poller.subscribe(
            1,
            Schedule {
                interval: Duration::from_secs(10),
                timeout: Duration::from_secs(10),
            },
        );
        source.release.add_permits(1);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(polls(), 4, "ten seconds after, not an hour");
        source.release.add_permits(10);
        poller.stop(&Metrics::default());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(polls(), 4, "a stopped poller polls no more");
    }

    #[test]
    fn retries_double_from_one_second() {
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(2), Duration::from_secs(2));
        assert_eq!(retry_delay(5), Duration::from_secs(16));
        assert!(retry_delay(40) >= Duration::from_secs(3600));
    }
}
