//! Accepting connections, the same way for every listener hoist runs, and
//! the file descriptors they take.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
static ACCEPT_FAILURES: Summary = Summary::new(Duration::from_secs(10));

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

/// A cap on open connections, for one listener (its `max_connections`)
/// within the process-wide budget of proxied connections.
#[derive(Debug)]
pub struct ConnectionLimit {
    pub listener: String,
    /// `interceptor.max_connections`, which a config reload may change.
    max: AtomicUsize,
    open: AtomicUsize,
    refused: AtomicU64,
    shared: Arc<AtomicUsize>,
    shared_max: usize,
}

impl ConnectionLimit {
    pub fn new(listener: String, max: usize, shared: Arc<AtomicUsize>, shared_max: usize) -> Self {
        Self {
            listener,
            max: AtomicUsize::new(max),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            shared,
            shared_max,
        }
    }

    /// A place for one more connection, or `None` (counted) when the
    /// listener or the process is full.
    pub fn admit(self: &Arc<Self>) -> Option<Permit> {
        let taken = |count: &AtomicUsize, max: usize| {
            count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                    (open < max).then_some(open + 1)
                })
                .is_ok()
        };
        if !taken(&self.open, self.max.load(Ordering::Relaxed)) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if !taken(&self.shared, self.shared_max) {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Permit(self.clone()))
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A new cap for connections accepted from now on; open ones stay.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Connections closed at accept because the listener or the process
    /// was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// One open connection's place; dropping it frees the place.
pub struct Permit(Arc<ConnectionLimit>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.shared.fetch_sub(1, Ordering::AcqRel);
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

    #[test]
    fn limits_count_refusals_and_free_places() {
        let shared = Arc::new(AtomicUsize::new(0));
        let a = Arc::new(ConnectionLimit::new("a".into(), 2, shared.clone(), 3));
        let b = Arc::new(ConnectionLimit::new("b".into(), 5, shared.clone(), 3));
        let first = a.admit().unwrap();
        let _second = a.admit().unwrap();
        assert!(a.admit().is_none(), "the listener's own cap");
        let _third = b.admit().unwrap();
        assert!(b.admit().is_none(), "the process-wide budget");
        assert_eq!((a.refused(), b.refused()), (1, 1));
        assert_eq!(b.open(), 1, "a refusal takes no place");
        drop(first);
        assert!(b.admit().is_some());
    }
}
