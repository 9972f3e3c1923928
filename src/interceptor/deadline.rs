//! Deadlines on a client connection while no request is open: a client
//! that sends nothing, or opens HTTP/2 and never finishes its preface or
//! SETTINGS, or keeps a connection idle, or trickles bytes without ever
//! completing a request, is cut off instead of holding a descriptor
//! forever. hyper has no such deadline of its own for these cases.
//!
//! And a deadline on its writes (`send_timeout`): a client that reads
//! nothing of an answer would otherwise keep the app's connection and
//! its requests' places in the counts (the `concurrency` a route reports,
//! so a scale-up) for as long as it likes. Like nginx's `send_timeout`,
//! it bounds each wait for the client to take bytes, not the whole answer:
//! a slow reader that keeps reading is served.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::lazy_timer::LazyTimer;

/// What the connection's requests tell its reader.
pub struct Activity {
    opened: Instant,
    open_requests: AtomicUsize,
    /// When the last request ended, in ms since `opened` (0: none yet).
    idle_since_ms: AtomicU64,
    /// An upgraded connection is a tunnel: no deadline applies.
    upgraded: AtomicBool,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            open_requests: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            upgraded: AtomicBool::new(false),
        })
    }

    /// Marks a request open until the guard (kept by its response body)
    /// is dropped.
    pub fn request(self: &Arc<Self>) -> RequestGuard {
        self.open_requests.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            activity: self.clone(),
            ended: false,
        }
    }

    fn idle_since(&self) -> Instant {
        self.opened + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire))
    }
}

pub struct RequestGuard {
    activity: Arc<Activity>,
    /// Ended by `end_at`: nothing left for the drop.
    ended: bool,
}

impl RequestGuard {
    /// The connection became a tunnel (101 Switching Protocols).
    pub fn upgraded(&self) {
        self.activity.upgraded.store(true, Ordering::Release);
    }

    /// Ends the request at `at`, a time the caller has just read (the
    /// direct path reads the clock twice per request, not once per use).
    pub fn end_at(mut self, at: Instant) {
        self.end(at);
        self.ended = true;
    }

    fn end(&self, at: Instant) {
        let since = at
            .saturating_duration_since(self.activity.opened)
            .as_millis();
        self.activity
            .idle_since_ms
            .fetch_max(u64::try_from(since).unwrap_or(u64::MAX), Ordering::AcqRel);
        self.activity.open_requests.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if !self.ended {
            self.end(Instant::now());
        }
    }
}

/// The client's stream, failing its reads with `TimedOut` when no byte
/// came within `first_byte`, or no request was open for `idle`.
pub struct Deadlines<T> {
    io: T,
    activity: Arc<Activity>,
    first_byte: Duration,
    idle: Duration,
    got_bytes: bool,
    timer: LazyTimer,
    send: Option<SendDeadline>,
}

/// The write side's deadline: armed when a write waits, disarmed by a
/// write that moves bytes.
struct SendDeadline {
    timeout: Duration,
    /// Connections it closed, for the metric.
    fired: Arc<AtomicU64>,
    /// Set while a write waits: when that wait began counts.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
}

impl<T> Deadlines<T> {
    pub fn new(io: T, activity: Arc<Activity>, first_byte: Duration, idle: Duration) -> Self {
        let first = activity.opened + first_byte.min(idle);
        Self {
            io,
            activity,
            first_byte,
            idle,
            got_bytes: false,
            timer: LazyTimer::new(first),
            send: None,
        }
    }

    /// Fails a write that waited `timeout` for the client to read, counting
    /// it in `fired`.
    pub fn with_send_timeout(mut self, timeout: Duration, fired: Arc<AtomicU64>) -> Self {
        self.send = Some(SendDeadline {
            timeout,
            fired,
            timer: None,
            waiting: false,
        });
        self
    }

    /// After a write (or flush) returned `result`: a write that moved a
    /// byte disarms the deadline, one that waits arms it (from the start of
    /// the wait) and fails once it passed. A flush never disarms it: it is
    /// `Ready` on a socket whatever the client took, so a flush between two
    /// stalled writes would restart the wait.
    fn send_deadline<R>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<R>>,
        progressed: bool,
    ) -> Poll<io::Result<R>> {
        let Some(send) = &mut self.send else {
            return result;
        };
        if result.is_ready() {
            if progressed {
                send.waiting = false;
            }
            return result;
        }
        let now = Instant::now();
        if !send.waiting {
            send.waiting = true;
            let at = now + send.timeout;
            match &mut send.timer {
                Some(timer) => timer.as_mut().reset(at),
                None => send.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        let Some(timer) = &mut send.timer else {
            return result;
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        send.waiting = false;
        send.fired.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client read nothing for the interceptor's send_timeout",
        )))
    }

    /// The connection itself (to see whether the client left).
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Arms the timer for the deadline now in force; `Ready` when it has
    /// passed. Called whenever a read would wait, so the timer is always
    /// registered while the connection is quiet. Reads no clock unless the
    /// timer fired: this runs once per request on a keep-alive connection.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let activity = &self.activity;
        if activity.upgraded.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        if activity.open_requests.load(Ordering::Acquire) > 0 {
            // Nothing to enforce: look again one idle period from now
            // (an HTTP/2 connection may not read again on its own).
            if self.timer.poll_expired(cx).is_ready() {
                self.timer.set(Instant::now() + self.idle);
                let _ = self.timer.poll_expired(cx);
            }
            return Poll::Pending;
        }
        let idle = activity.idle_since() + self.idle;
        let deadline = if self.got_bytes {
            idle
        } else {
            idle.min(activity.opened + self.first_byte)
        };
        self.timer.set(deadline);
        self.timer.poll_expired(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Deadlines<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        if let Poll::Ready(result) = Pin::new(&mut self.io).poll_read(cx, buf) {
            if buf.filled().len() > before {
                self.got_bytes = true;
            }
            return Poll::Ready(result);
        }
        match self.poll_deadline(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no request within the interceptor's first_byte_timeout or idle_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Deadlines<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        let progressed = matches!(written, Poll::Ready(Ok(n)) if n > 0);
        self.send_deadline(cx, written, progressed)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        let progressed = matches!(written, Poll::Ready(Ok(n)) if n > 0);
        self.send_deadline(cx, written, progressed)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        self.send_deadline(cx, flushed, false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn sending(
        capacity: usize,
    ) -> (
        Deadlines<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<AtomicU64>,
    ) {
        let (ours, theirs) = tokio::io::duplex(capacity);
        // Only written to: the read side's deadlines never run.
        let activity = Activity::new();
        let fired = Arc::new(AtomicU64::new(0));
        let stream = Deadlines::new(
            ours,
            activity,
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
        .with_send_timeout(Duration::from_secs(60), fired.clone());
        (stream, theirs, fired)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_nothing_for_send_timeout_is_let_go() {
        let (mut stream, _client, fired) = sending(1024);
        let started = Instant::now();
        let error = stream
            .write_all(&[0; 64 * 1024])
            .await
            .expect_err("the client never reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert_eq!(fired.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_served() {
        let (mut stream, mut client, fired) = sending(1024);
        let reader = tokio::spawn(async move {
            let mut taken = 0;
            let mut chunk = [0; 512];
            while taken < 16 * 1024 {
                // Less than send_timeout between reads, 30 reads in all:
                // far longer than send_timeout altogether.
                tokio::time::sleep(Duration::from_secs(50)).await;
                taken += client.read(&mut chunk).await.unwrap();
            }
        });
        stream.write_all(&[0; 16 * 1024]).await.unwrap();
        reader.await.unwrap();
        assert_eq!(fired.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_between_stalled_writes_does_not_restart_the_wait() {
        let (mut stream, _client, fired) = sending(1024);
        stream.write_all(&[0; 1024]).await.unwrap();
        let started = Instant::now();
        let mut stalled = Box::pin(stream.write_all(&[0; 1024]));
        assert!(
            tokio::time::timeout(Duration::from_secs(40), &mut stalled)
                .await
                .is_err()
        );
        drop(stalled);
        stream.flush().await.unwrap();
        let error = stream
            .write_all(&[0; 1024])
            .await
            .expect_err("still stalled");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(60),
            "from the first wait"
        );
        assert_eq!(fired.load(Ordering::Relaxed), 1);
    }
}
