//! Accepting connections, the same way for every listener hoist runs, and
//! the file descriptors they take.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use crate::logging::Summary;

/// The pause after a failed accept (out of file descriptors and the
/// like) starts here and doubles while accepts keep failing.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// TCP keepalive on every accepted connection: a peer that vanished (lost
/// node, partition) is found within a minute even on an idle connection.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// Failed accepts of every listener: one line per interval, with a count.
static ACCEPT_FAILURES: LazyLock<Summary> = LazyLock::new(|| {
    Summary::new(Duration::from_secs(10), |failures| {
        warn!(failures, "more connections could not be accepted");
    })
});

/// The next connection, with Nagle's algorithm off (hoist's replies are
/// small and must not wait for the peer's delayed ACK, up to 40 ms) and
/// TCP keepalive on. Failed accepts are retried after a growing pause and
/// logged once per interval. Cancel-safe.
pub async fn accept(listener: &TcpListener, what: &str) -> (TcpStream, SocketAddr) {
    let mut pause = FIRST_PAUSE;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                keepalive(&stream);
                return (stream, peer);
            }
            Err(error) => {
                if let Some(failures) = ACCEPT_FAILURES.note() {
                    warn!(listener = what, %error, failures, "cannot accept connections");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

fn keepalive(stream: &TcpStream) {
    let settings = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&settings);
}

/// Descriptors kept for everything but the interceptor's client
/// connections: gRPC, admin, sources, upstreams' idle pools, logs.
const RESERVED_DESCRIPTORS: u64 = 128;

/// Raises the soft limit on open files to the hard limit and returns the
/// soft limit now in force (`u64::MAX` where there is none to read).
pub fn raise_descriptor_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(error) => {
            warn!(%error, "cannot read or raise the open files limit");
            u64::MAX
        }
    }
}

/// How many client connections the interceptor may hold open in all, so
/// that it stops accepting before the process runs out of descriptors:
/// each takes two (client and upstream), and some are kept for the rest.
pub fn proxied_connection_budget(descriptor_limit: u64) -> usize {
    let reserve = RESERVED_DESCRIPTORS.max(descriptor_limit / 8);
    let budget = descriptor_limit.saturating_sub(reserve) / 2;
    usize::try_from(budget).unwrap_or(usize::MAX).max(1)
}

/// A cap on open connections, for one listener (its `max_connections`),
/// per client address within it (`max_connections_per_client`), and within
/// the process-wide budget of proxied connections.
#[derive(Debug)]
pub struct ConnectionLimit {
    pub listener: String,
    /// `interceptor.max_connections`, which a config reload may change.
    max: AtomicUsize,
    /// `interceptor.max_connections_per_client`; 0: half of the smaller
    /// of `max` and the process budget.
    per_client: AtomicUsize,
    open: AtomicUsize,
    by_client: Mutex<HashMap<IpAddr, usize>>,
    refused: AtomicU64,
    shared: Arc<AtomicUsize>,
    shared_max: usize,
    refusals: Summary,
}

/// Which cap a connection met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener's `max_connections`.
    Listener,
    /// `max_connections_per_client`: one address holds its share.
    Client,
    /// The process's budget of descriptors for proxied connections.
    Process,
}

impl Refusal {
    fn reason(self) -> &'static str {
        match self {
            Refusal::Listener => "the listener's interceptor.max_connections is reached",
            Refusal::Client => "this client address holds interceptor.max_connections_per_client",
            Refusal::Process => "the process's descriptors for proxied connections are used up",
        }
    }
}

impl ConnectionLimit {
    pub fn new(
        listener: String,
        caps: ConnectionCaps,
        shared: Arc<AtomicUsize>,
        shared_max: usize,
    ) -> Self {
        let name = listener.clone();
        Self {
            listener,
            max: AtomicUsize::new(caps.max),
            per_client: AtomicUsize::new(caps.per_client.unwrap_or(0)),
            open: AtomicUsize::new(0),
            by_client: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
            shared,
            shared_max,
            refusals: Summary::new(Duration::from_secs(10), move |refused| {
                warn!(listener = %name, refused, "more client connections refused at accept");
            }),
        }
    }

    /// A place for one more connection from `client`, or which cap it met
    /// (counted, and logged at most once per 10 s with a count).
    pub fn admit(self: &Arc<Self>, client: IpAddr) -> Result<Permit, Refusal> {
        let admitted = self.try_admit(client);
        if let Err(refusal) = admitted {
            self.refused.fetch_add(1, Ordering::Relaxed);
            if let Some(refused) = self.refusals.note() {
                warn!(listener = %self.listener, %client, reason = refusal.reason(), refused, "client connection refused at accept");
            }
        }
        admitted
    }

    fn try_admit(self: &Arc<Self>, client: IpAddr) -> Result<Permit, Refusal> {
        let taken = |count: &AtomicUsize, max: usize| {
            count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                    (open < max).then_some(open + 1)
                })
                .is_ok()
        };
        let max = self.max.load(Ordering::Relaxed);
        if !taken(&self.open, max) {
            return Err(Refusal::Listener);
        }
        {
            let mut by_client = self.lock_clients();
            let held = by_client.entry(client).or_insert(0);
            if *held >= self.client_cap(max) {
                if *held == 0 {
                    by_client.remove(&client);
                }
                drop(by_client);
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal::Client);
            }
            *held += 1;
        }
        // From here the permit gives back what was taken.
        let mut permit = Permit {
            limit: self.clone(),
            client,
            shared: false,
        };
        if !taken(&self.shared, self.shared_max) {
            return Err(Refusal::Process);
        }
        permit.shared = true;
        Ok(permit)
    }

    /// How many connections one address may hold: the setting, or half of
    /// what the listener can hold, so that one address never takes it all.
    fn client_cap(&self, max: usize) -> usize {
        match self.per_client.load(Ordering::Relaxed) {
            0 => (max.min(self.shared_max) / 2).max(1),
            cap => cap,
        }
    }

    fn lock_clients(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.by_client.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// New caps for connections accepted from now on; open ones stay.
    pub fn set_caps(&self, caps: ConnectionCaps) {
        self.max.store(caps.max, Ordering::Relaxed);
        self.per_client
            .store(caps.per_client.unwrap_or(0), Ordering::Relaxed);
    }

    /// Connections closed at accept because a cap was met.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// `interceptor.max_connections` and `max_connections_per_client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    pub max: usize,
    /// `None`: half of what the listener can hold.
    pub per_client: Option<usize>,
}

/// One open connection's place; dropping it frees the place.
pub struct Permit {
    limit: Arc<ConnectionLimit>,
    client: IpAddr,
    /// Holds a place in the process budget too.
    shared: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let limit = &self.limit;
        limit.open.fetch_sub(1, Ordering::AcqRel);
        if self.shared {
            limit.shared.fetch_sub(1, Ordering::AcqRel);
        }
        let mut by_client = limit.lock_clients();
        if let Some(held) = by_client.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_leaves_room_for_the_rest() {
        assert_eq!(proxied_connection_budget(256), 64);
        assert_eq!(proxied_connection_budget(1_048_576), 458_752);
        assert_eq!(proxied_connection_budget(10), 1);
    }

    fn caps(max: usize, per_client: Option<usize>) -> ConnectionCaps {
        ConnectionCaps { max, per_client }
    }

    const ONE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const TWO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn limits_count_refusals_and_free_places() {
        let shared = Arc::new(AtomicUsize::new(0));
        let a = Arc::new(ConnectionLimit::new(
            "a".into(),
            caps(2, Some(5)),
            shared.clone(),
            3,
        ));
        let b = Arc::new(ConnectionLimit::new(
            "b".into(),
            caps(5, Some(5)),
            shared.clone(),
            3,
        ));
        let first = a.admit(ONE).unwrap();
        let _second = a.admit(ONE).unwrap();
        assert_eq!(a.admit(TWO).err(), Some(Refusal::Listener));
        let _third = b.admit(ONE).unwrap();
        assert_eq!(b.admit(TWO).err(), Some(Refusal::Process));
        assert_eq!((a.refused(), b.refused()), (1, 1));
        assert_eq!(b.open(), 1, "a refusal takes no place");
        drop(first);
        assert!(b.admit(TWO).is_ok());
    }

    #[test]
    fn one_address_never_takes_the_whole_listener() {
        let shared = Arc::new(AtomicUsize::new(0));
        // Unset: half of the listener's cap.
        let limit = Arc::new(ConnectionLimit::new(
            "http".into(),
            caps(10, None),
            shared,
            100,
        ));
        let ones: Vec<Permit> = (0..5).map(|_| limit.admit(ONE).unwrap()).collect();
        assert_eq!(limit.admit(ONE).err(), Some(Refusal::Client));
        let twos: Vec<Permit> = (0..5).map(|_| limit.admit(TWO).unwrap()).collect();
        assert_eq!(limit.admit(TWO).err(), Some(Refusal::Listener));
        drop(ones);
        assert_eq!(limit.open(), 5);
        assert!(
            limit.lock_clients().get(&ONE).is_none(),
            "no entry left behind"
        );
        // A reload's cap applies to the next connection.
        limit.set_caps(caps(10, Some(6)));
        let _six = limit.admit(TWO).unwrap();
        assert_eq!(limit.admit(TWO).err(), Some(Refusal::Client));
        drop(twos);
        assert_eq!(limit.refused(), 3);
    }
}
