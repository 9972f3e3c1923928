//! Idle connections to a route's upstream, for both HTTP/1.1 paths,
//! between messages, taken by one request at a time. An entry is kept as
//! the path that used it last left it: a plain socket (the direct path),
//! or one with hyper's client still on it (hyper's path: its next request
//! needs no new handshake). Either path takes either kind: the direct path
//! takes the socket back out of hyper's client, hyper's path puts its
//! client on a socket.
//!
//! Between messages an app sends nothing, so a connection that has become
//! readable while it waited was closed by the app (or misbehaves): it is
//! dropped, never used. Looking costs no system call while the socket has
//! had no event (tokio keeps its readiness).

use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::http1_connection::Http1Connection;

/// How often idle connections are looked at (closed by the app, or idle
/// past the timeout: dropped, so nothing lingers half-closed once traffic
/// stops).
const SWEEP_EVERY: Duration = if cfg!(test) {
    Duration::from_millis(20)
} else {
    Duration::from_secs(5)
};

pub struct IdlePool {
    /// Oldest first; requests take the newest (the one most likely alive).
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
}

struct Idle {
    connection: IdleConnection,
    since: Instant,
}

pub enum IdleConnection {
    Socket(TcpStream),
    /// Boxed: far larger than a socket, and kept boxed while in use.
    Http1(Box<Http1Connection>),
}

impl IdleConnection {
    /// Still open, and nothing arrived on it while it waited.
    fn quiet(&mut self) -> bool {
        match self {
            IdleConnection::Socket(stream) => quiet(stream),
            IdleConnection::Http1(connection) => {
                connection.reusable(&mut Context::from_waker(Waker::noop()))
            }
        }
    }
}

impl IdlePool {
    /// A pool, and its sweeper task (which ends with the pool).
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Arc<Self> {
        let pool = Arc::new(Self {
            idle: Mutex::new(Vec::new()),
            max_idle: max_idle.max(1),
            idle_timeout,
        });
        tokio::spawn(sweep_while_alive(Arc::downgrade(&pool)));
        pool
    }

    /// The newest idle connection still open, at `now` (a time the caller
    /// has just read).
    pub fn checkout(&self, now: Instant) -> Option<IdleConnection> {
        loop {
            let mut idle = self.lock().pop()?;
            if now.saturating_duration_since(idle.since) < self.idle_timeout
                && idle.connection.quiet()
            {
                return Some(idle.connection);
            }
        }
    }

    /// The newest idle connection still open, as a plain socket.
    pub fn checkout_socket(&self, now: Instant) -> Option<TcpStream> {
        loop {
            match self.checkout(now)? {
                IdleConnection::Socket(stream) => return Some(stream),
                IdleConnection::Http1(connection) => {
                    if let Some(stream) = connection.into_socket() {
                        return Some(stream);
                    }
                }
            }
        }
    }

    /// Keeps a connection that ended a message cleanly, idle from `now`.
    pub fn checkin(&self, connection: IdleConnection, now: Instant) {
        let evicted = {
            let mut idle = self.lock();
            let evicted = (idle.len() >= self.max_idle).then(|| idle.remove(0));
            idle.push(Idle {
                connection,
                since: now,
            });
            evicted
        };
        // Closed here, not under the lock.
        drop(evicted);
    }

    fn sweep(&self) {
        let now = Instant::now();
        let gone: Vec<Idle> = {
            let mut idle = self.lock();
            let mut gone = Vec::new();
            for mut entry in std::mem::take(&mut *idle) {
                if now.duration_since(entry.since) < self.idle_timeout && entry.connection.quiet() {
                    idle.push(entry);
                } else {
                    gone.push(entry);
                }
            }
            gone
        };
        drop(gone);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list holds no invariant a panic could break halfway.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

async fn sweep_while_alive(pool: Weak<IdlePool>) {
    let mut ticks = tokio::time::interval(SWEEP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        pool.sweep();
    }
}

/// Nothing arrived on an idle connection: no FIN, no stray bytes.
fn quiet(stream: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match stream.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            let mut byte = [0u8; 1];
            matches!(stream.try_read(&mut byte), Err(error) if error.kind() == io::ErrorKind::WouldBlock)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn a_connection_the_app_closed_or_wrote_on_is_not_taken() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = IdlePool::new(8, Duration::from_secs(60));
        let (open, _open_end) = pair(&listener).await;
        let (closed, closed_end) = pair(&listener).await;
        let (chatty, mut chatty_end) = pair(&listener).await;
        pool.checkin(IdleConnection::Socket(open), Instant::now());
        pool.checkin(IdleConnection::Socket(closed), Instant::now());
        pool.checkin(IdleConnection::Socket(chatty), Instant::now());
        drop(closed_end);
        chatty_end.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.checkout(Instant::now()).is_some(), "the open one");
        assert!(pool.checkout(Instant::now()).is_none());
    }

    #[tokio::test]
    async fn idle_connections_expire_and_the_cap_holds() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = IdlePool::new(2, Duration::from_millis(100));
        let mut ends = Vec::new();
        for _ in 0..3 {
            let (client, server) = pair(&listener).await;
            ends.push(server);
            pool.checkin(IdleConnection::Socket(client), Instant::now());
        }
        assert_eq!(pool.idle_count(), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(pool.idle_count(), 0, "swept");
    }
}
