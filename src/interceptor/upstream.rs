//! A route's upstream, and holding requests through its cold start.
//!
//! Each upstream has a gate: open while the upstream accepts connections,
//! closed from the first failed connection until a probe connects again.
//! A request (connection) that finds the gate closed is held: counted,
//! capped, bounded by its own deadline, and released the moment the gate
//! opens. One probe per upstream retries while anyone is held, so a cold
//! start costs one connection attempt every 25 ms (at most ten
//! unanswered at once), however many wait.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::counters::RouteCounters;
use super::dial::{Denial, DialError, Dialer};
use crate::logging::Summary;

/// How often the probe retries a closed upstream: a held request leaves
/// within tens of milliseconds of the upstream listening.
pub const RETRY_EVERY: Duration = Duration::from_millis(25);

/// One connection attempt may take this long: an upstream that drops
/// connection attempts (a gone pod's IP) is held for like one that refuses.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// An attempt at an upstream nothing reached for TRUST_FOR (the first
/// request after an idle spell, or to a new route) gets only this long
/// before the request is held, which wakes the scaler. A Service with no
/// ready endpoints does not always refuse at once: kube-proxy's REJECT
/// answers with an ICMP error the kernel sends at most once a second per
/// client, and some networks send none, so the attempt would otherwise
/// sit out ATTEMPT_TIMEOUT before the cold start even began. An app that
/// is up but slower than this to accept is held for a moment and released
/// by the probe's first attempt.
const UNPROVEN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(200);

/// While one of the probe's attempts is unanswered, the next starts this
/// much later (RETRY_EVERY after a refusal): where attempts are dropped
/// rather than refused, each waits out its ATTEMPT_TIMEOUT, and one
/// leaving every 100 ms finds the app within that of its path opening,
/// not on the next whole second. At most ATTEMPT_TIMEOUT / STAGGER
/// (ten) are unanswered at once.
const STAGGER: Duration = Duration::from_millis(100);

/// An open gate is trusted this long after the upstream last answered;
/// after that the next request checks with one connection attempt, so a
/// request does not queue behind a pooled connection attempt to an app
/// that has gone to zero.
const TRUST_FOR: Duration = Duration::from_secs(10);

/// The probe resolves the upstream's name at most this often: a cold
/// start must not flood DNS while the app is starting.
const RESOLVE_EVERY: Duration = Duration::from_millis(500);

/// Why a request (connection) was not forwarded. The messages are sent to
/// clients, so they name the route only; the details go to the log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error(
        "route `{route}`: the app did not accept a connection within {timeout:?} (cold start timeout)"
    )]
    ColdStartTimeout { route: String, timeout: Duration },
    #[error(
        "route `{route}`: {limit} requests are already waiting for the app to start (interceptor.max_held_per_route)"
    )]
    TooManyHeld { route: String, limit: usize },
    #[error("route `{route}`: the interceptor is shutting down; retry")]
    ShuttingDown { route: String },
    #[error("route `{route}` now sends its traffic elsewhere; retry")]
    Moved { route: String },
    #[error("route `{route}` was removed from the interceptor")]
    Removed { route: String },
    #[error(
        "route `{route}`: the app's address is not one the interceptor may connect to (interceptor.denied_networks)"
    )]
    Denied { route: String },
}

/// Why an upstream stopped taking requests: what its held ones are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    ShuttingDown,
    /// The route now has another upstream.
    Moved,
    Removed,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Refused and timed-out holds are logged once per this interval, with
/// counts: a burst of thousands must not write thousands of lines.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

pub struct Upstream {
    pub route: String,
    /// `host:port`.
    pub address: String,
    /// Milliseconds; a config reload may change it for requests to come.
    cold_start_timeout_ms: AtomicU64,
    max_held: AtomicU64,
    pub counters: Arc<RouteCounters>,
    /// The gate: whether the upstream accepts connections, as last seen.
    accepting: watch::Sender<bool>,
    /// When the upstream last answered, in ms since `epoch` (0: never).
    last_reached_ms: AtomicU64,
    epoch: Instant,
    probing: AtomicBool,
    last_error: Mutex<String>,
    /// Fires at shutdown or when the route goes: every held request is
    /// answered at once, with `closed_for`'s reason.
    closing: CancellationToken,
    closed_for: Mutex<Closing>,
    refused: Summary,
    timed_out: Summary,
    denied: Summary,
    dialer: Dialer,
}

/// Why one connection attempt connected nowhere.
enum Attempt {
    Failed(String),
    Denied(Denial),
}

impl Upstream {
    pub fn new(
        route: String,
        address: String,
        cold_start_timeout: Duration,
        max_held: usize,
        counters: Arc<RouteCounters>,
    ) -> Self {
        let (refused, timed_out, denied) = {
            let (r1, r2, r3) = (route.clone(), route.clone(), route.clone());
            (
                Summary::new(SUMMARY_EVERY, move |refused| {
                    info!(route = %r1, refused, "more requests refused: too many held");
                }),
                Summary::new(SUMMARY_EVERY, move |timed_out| {
                    info!(route = %r2, timed_out, "more held requests reached the cold start timeout");
                }),
                Summary::new(SUMMARY_EVERY, move |count| {
                    warn!(route = %r3, setting = "interceptor.denied_networks", count, "more upstream connections denied");
                }),
            )
        };
        Self {
            route,
            address,
            cold_start_timeout_ms: AtomicU64::new(millis(cold_start_timeout)),
            max_held: AtomicU64::new(max_held as u64),
            counters,
            // Until a connection fails, assume the upstream is up.
            accepting: watch::Sender::new(true),
            last_reached_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            probing: AtomicBool::new(false),
            last_error: Mutex::new(String::new()),
            closing: CancellationToken::new(),
            closed_for: Mutex::new(Closing::ShuttingDown),
            refused,
            timed_out,
            denied,
            dialer: Dialer::default(),
        }
    }

    /// Dials with `dialer` (its host table, and for a declared route the
    /// fence of `interceptor.denied_networks`).
    pub fn with_dialer(mut self, dialer: Dialer) -> Self {
        self.dialer = dialer;
        self
    }

    /// Whether its addresses are checked against `denied_networks`.
    pub fn fenced(&self) -> bool {
        self.dialer.fenced()
    }

    /// Logs (once per interval, with a count) and counts a request or
    /// connection refused because the upstream's addresses are denied.
    fn deny(&self, denial: &Denial) -> UpstreamError {
        self.counters.upstream_denied();
        if let Some(count) = self.denied.note() {
            warn!(
                route = %self.route,
                upstream = %self.address,
                address = %denial.address,
                setting = "interceptor.denied_networks",
                count,
                "not connecting to the route's upstream: {}", denial.why
            );
        }
        UpstreamError::Denied {
            route: self.route.clone(),
        }
    }

    /// Releases every held request (and any held later), telling them why.
    pub fn close(&self, why: Closing) {
        if let Ok(mut reason) = self.closed_for.lock()
            && !self.closing.is_cancelled()
        {
            *reason = why;
        }
        self.closing.cancel();
    }

    fn closed_error(&self) -> UpstreamError {
        let route = self.route.clone();
        match self.closed_for.lock().map(|why| *why) {
            Ok(Closing::Moved) => UpstreamError::Moved { route },
            Ok(Closing::Removed) => UpstreamError::Removed { route },
            _ => UpstreamError::ShuttingDown { route },
        }
    }

    pub fn cold_start_timeout(&self) -> Duration {
        Duration::from_millis(self.cold_start_timeout_ms.load(Ordering::Relaxed))
    }

    pub fn max_held(&self) -> usize {
        usize::try_from(self.max_held.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    /// New limits for requests that arrive from now on; held ones keep
    /// the deadline they started with.
    pub fn set_limits(&self, cold_start_timeout: Duration, max_held: usize) {
        self.cold_start_timeout_ms
            .store(millis(cold_start_timeout), Ordering::Relaxed);
        self.max_held.store(max_held as u64, Ordering::Relaxed);
    }

    /// The deadline of a request (connection) that starts at `now`.
    pub fn deadline(&self, now: Instant) -> Instant {
        now.checked_add(self.cold_start_timeout())
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
    }

    /// Returns at once while the upstream is known to accept connections.
    /// When that knowledge is old (nothing reached it for a while, e.g.
    /// before a scale to zero), one connection attempt checks it first.
    /// Otherwise holds the caller until it accepts, or fails at `deadline`
    /// or past the cap. Dropping the future (a client that left) ends the
    /// hold.
    /// `now` is when the request started (read once per request).
    pub async fn admit(
        self: &Arc<Self>,
        now: Instant,
        deadline: Instant,
    ) -> Result<(), UpstreamError> {
        if *self.accepting.borrow() {
            if self.recently_reached(now) {
                return Ok(());
            }
            match self.attempt(deadline).await {
                Ok(_) => {
                    self.reached();
                    return Ok(());
                }
                Err(Attempt::Failed(error)) => self.close_gate(error),
                Err(Attempt::Denied(denial)) => return Err(self.deny(&denial)),
            }
        }
        self.wait_open(deadline).await
    }

    /// Connects to the upstream, holding through a cold start until
    /// `deadline`.
    pub async fn connect(self: &Arc<Self>, deadline: Instant) -> Result<TcpStream, UpstreamError> {
        loop {
            self.wait_open(deadline).await?;
            match self.attempt(deadline).await {
                Ok(stream) => {
                    self.reached();
                    return Ok(stream);
                }
                Err(Attempt::Failed(error)) => self.close_gate(error),
                Err(Attempt::Denied(denial)) => return Err(self.deny(&denial)),
            }
        }
    }

    /// Notes that the upstream just answered (a connection, a response).
    pub fn reached(&self) {
        self.reached_at(Instant::now());
    }

    /// `reached` at a time the caller has just read. Stored only when it
    /// moves the mark forward: at full load most requests end within a
    /// millisecond already stamped, and leave the shared line alone.
    pub fn reached_at(&self, at: Instant) {
        let millis = self.millis(at).max(1);
        if self.last_reached_ms.load(Ordering::Acquire) < millis {
            self.last_reached_ms.store(millis, Ordering::Release);
        }
    }

    /// Whether `admit` would return at once, without waiting (the gate
    /// open, the upstream reached within `TRUST_FOR` of `now`).
    pub fn admits_at_once(&self, now: Instant) -> bool {
        *self.accepting.borrow() && self.recently_reached(now)
    }

    fn recently_reached(&self, now: Instant) -> bool {
        let last = self.last_reached_ms.load(Ordering::Acquire);
        last != 0 && self.millis(now).saturating_sub(last) < TRUST_FOR.as_millis() as u64
    }

    /// `at` in ms since `epoch`, the unit of `last_reached_ms`.
    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch)
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// Returns at once while the gate is open; otherwise holds the caller
    /// (counted, capped) until it opens or `deadline` passes.
    async fn wait_open(self: &Arc<Self>, deadline: Instant) -> Result<(), UpstreamError> {
        let mut accepting = self.accepting.subscribe();
        if *accepting.borrow_and_update() {
            return Ok(());
        }
        if self.closing.is_cancelled() {
            return Err(self.closed_error());
        }
        let max_held = self.max_held();
        let Some(_held) = self.counters.try_hold(max_held as u64) else {
            if let Some(refused) = self.refused.note() {
                info!(route = %self.route, limit = max_held, refused, "too many requests held; refusing");
            }
            return Err(UpstreamError::TooManyHeld {
                route: self.route.clone(),
                limit: max_held,
            });
        };
        let held_since = Instant::now();
        self.ensure_probe();
        let opened = tokio::select! {
            opened = tokio::time::timeout_at(deadline, accepting.wait_for(|up| *up)) => opened,
            _ = self.closing.cancelled() => return Err(self.closed_error()),
        };
        match opened {
            Ok(Ok(_)) => {
                self.counters.cold_start_waited(held_since.elapsed());
                Ok(())
            }
            _ => {
                if let Some(timed_out) = self.timed_out.note() {
                    let last_error = self.last_error();
                    info!(route = %self.route, upstream = %self.address, %last_error, timed_out, "held requests reached the cold start timeout");
                }
                Err(UpstreamError::ColdStartTimeout {
                    route: self.route.clone(),
                    timeout: self.cold_start_timeout(),
                })
            }
        }
    }

    /// One connection attempt, bounded: an upstream that drops attempts
    /// counts as closed after ATTEMPT_TIMEOUT, not after the deadline.
    /// The name is resolved again each time: the addresses checked are
    /// the ones connected to.
    async fn attempt(&self, deadline: Instant) -> Result<TcpStream, Attempt> {
        let bound = if self.recently_reached(Instant::now()) {
            ATTEMPT_TIMEOUT
        } else {
            UNPROVEN_ATTEMPT_TIMEOUT
        };
        let until = deadline.min(Instant::now() + bound);
        let dial = async {
            let addresses = self
                .dialer
                .resolve(&self.address)
                .await
                .map_err(|error| Attempt::Failed(error.to_string()))?;
            self.dialer
                .connect(&addresses)
                .await
                .map_err(|error| match error {
                    DialError::Failed(error) => Attempt::Failed(error),
                    DialError::Denied(denial) => Attempt::Denied(denial),
                })
        };
        match tokio::time::timeout_at(until, dial).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(Attempt::Failed("connection attempt timed out".to_string())),
        }
    }

    fn last_error(&self) -> String {
        self.last_error
            .lock()
            .map(|error| error.clone())
            .unwrap_or_default()
    }

    fn close_gate(&self, error: String) {
        self.last_reached_ms.store(0, Ordering::Release);
        if let Ok(mut last) = self.last_error.lock() {
            last.clone_from(&error);
        }
        if self.accepting.send_replace(false) {
            debug!(route = %self.route, upstream = %self.address, %error, "upstream not accepting connections; holding requests");
        }
    }

    fn ensure_probe(self: &Arc<Self>) {
        if !self.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().probe());
        }
    }

    /// Retries the upstream while anyone is held; opens the gate on the
    /// first connection it makes. Attempts overlap, STAGGER apart, each
    /// bounded by ATTEMPT_TIMEOUT.
    async fn probe(self: Arc<Self>) {
        let mut resolved: Option<(Instant, Vec<SocketAddr>)> = None;
        let mut attempts = FuturesUnordered::new();
        let mut next_attempt = Instant::now();
        // With the Service's pods followed, a pod turning ready is seen
        // here at once and tried then, not on the next attempt's turn.
        let mut pods_changed = self.dialer.pod_changes(&self.address);
        loop {
            if self.counters.held() == 0 {
                self.probing.store(false, Ordering::Release);
                // Someone may have started waiting since the check.
                if self.counters.held() == 0 || self.probing.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
            tokio::select! {
                Some(outcome) = attempts.next(), if !attempts.is_empty() => match outcome {
                    Ok(Ok(_)) => {
                        debug!(route = %self.route, upstream = %self.address, "upstream accepts connections; releasing held requests");
                        self.open_gate();
                        return;
                    }
                    // Nothing to wait for: the held requests are let go,
                    // and each is refused (logged, counted) as it connects.
                    Ok(Err(DialError::Denied(_))) => {
                        self.probing.store(false, Ordering::Release);
                        self.accepting.send_replace(true);
                        return;
                    }
                    Ok(Err(DialError::Failed(error))) => {
                        self.close_gate(error);
                        if attempts.is_empty() {
                            next_attempt = next_attempt.min(Instant::now() + RETRY_EVERY);
                        }
                    }
                    Err(_) => self.close_gate("connection attempt timed out".to_string()),
                },
                changed = changed_or_never(&mut pods_changed) => {
                    if changed {
                        resolved = None;
                        next_attempt = Instant::now();
                    } else {
                        pods_changed = None;
                    }
                }
                () = tokio::time::sleep_until(next_attempt) => {
                    next_attempt = Instant::now() + STAGGER;
                    let fresh = resolved
                        .as_ref()
                        .is_some_and(|(at, _)| at.elapsed() < RESOLVE_EVERY);
                    if !fresh {
                        match tokio::time::timeout(ATTEMPT_TIMEOUT, self.dialer.resolve(&self.address))
                            .await
                        {
                            Ok(Ok(addresses)) => resolved = Some((Instant::now(), addresses)),
                            Ok(Err(error)) => self.close_gate(format!("cannot resolve: {error}")),
                            Err(_) => self.close_gate("name lookup timed out".to_string()),
                        }
                    }
                    if let Some((_, addresses)) = &resolved
                        && !addresses.is_empty()
                    {
                        let upstream = self.clone();
                        let addresses = addresses.clone();
                        attempts.push(async move {
                            tokio::time::timeout(ATTEMPT_TIMEOUT, upstream.dialer.connect(&addresses)).await
                        });
                    }
                }
            }
        }
    }

    fn open_gate(&self) {
        self.reached();
        // Stop probing first: a failure right after this must be able to
        // start the next probe.
        self.probing.store(false, Ordering::Release);
        self.accepting.send_replace(true);
    }
}

/// Whether `changes` changed (false: its sender is gone); never returns
/// without one.
async fn changed_or_never(changes: &mut Option<watch::Receiver<u64>>) -> bool {
    match changes {
        Some(changes) => changes.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::super::dial::refuse_self_connection;
    use super::*;

    #[tokio::test]
    async fn a_connection_to_itself_counts_as_refused() {
        // What the kernel does by chance when it picks the destination
        // port as the source, done on purpose.
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let itself = socket.local_addr().unwrap();
        socket.connect(&itself).unwrap();
        socket.set_nonblocking(true).unwrap();
        let stream = TcpStream::from_std(socket.into()).unwrap();
        assert_eq!(stream.peer_addr().unwrap(), stream.local_addr().unwrap());

        let error = refuse_self_connection(stream).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = [listener.local_addr().unwrap()];
        let reached = Dialer::default().connect(&app).await;
        assert!(reached.is_ok(), "a listening app is reached: {reached:?}");
    }
}
