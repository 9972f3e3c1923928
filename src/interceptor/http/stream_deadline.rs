//! `send_timeout` for HTTP/2 streams, which the socket's write deadline
//! (`deadline::Deadlines`) cannot see.
//!
//! An HTTP/2 server sends a stream only as much as the client's
//! flow-control window allows (RFC 9113 §5.2; 64 KiB unless the client
//! says more). A client that reads nothing gives no window back, so hyper
//! stops *before* the socket: the bytes already sent sit in the kernel's
//! buffers, no write waits, and the socket deadline never arms. The stream
//! stays open, and with it its request's place in the route's in-flight
//! count, for as long as the client keeps the connection.
//!
//! What shows it instead: hyper takes a response body's next frame only
//! once the window has room for it. So a frame handed to hyper and not
//! followed by another pull within `send_timeout` means the client took
//! nothing for that long. Frames are handed over in slices of at most
//! `SLICE` bytes, so a slow reader that keeps reading pulls often enough
//! (as with nginx, each wait counts, not the whole answer). The
//! connection is then closed, every stream on it with it (nginx's
//! `send_timeout` closes the connection too).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The most handed to hyper at once: HTTP/2's default frame size.
const SLICE: usize = 16 * 1024;

/// The watch over one client connection's HTTP/2 streams.
pub(super) struct StreamDeadlines {
    timeout: Duration,
    epoch: Instant,
    /// One stamp per response body still alive.
    streams: Mutex<Vec<Weak<Stamp>>>,
    /// A first stream began: the watch has something to look at.
    began: Notify,
}

/// When a body last handed hyper a frame that was not yet followed by
/// another pull, in ms since `epoch` plus one (0: nothing waiting).
#[derive(Default)]
struct Stamp(AtomicU64);

impl StreamDeadlines {
    pub(super) fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            timeout,
            epoch: Instant::now(),
            streams: Mutex::new(Vec::new()),
            began: Notify::new(),
        })
    }

    /// `body`, its pulls watched.
    pub(super) fn watch<B>(self: &Arc<Self>, body: B) -> Watched<B> {
        let stamp = Arc::new(Stamp::default());
        self.lock().push(Arc::downgrade(&stamp));
        self.began.notify_one();
        Watched {
            body,
            rest: Bytes::new(),
            stamp,
            epoch: self.epoch,
        }
    }

    /// Resolves once a stream's frame waited `timeout` for the client.
    pub(super) async fn stalled(&self) {
        let mut timer = Box::pin(tokio::time::sleep(self.timeout));
        loop {
            let oldest = {
                let mut streams = self.lock();
                streams.retain(|stamp| stamp.strong_count() > 0);
                if streams.is_empty() {
                    None
                } else {
                    Some(
                        streams
                            .iter()
                            .filter_map(Weak::upgrade)
                            .map(|stamp| stamp.0.load(Ordering::Acquire))
                            .filter(|since| *since != 0)
                            .min(),
                    )
                }
            };
            let wake = match oldest {
                None => {
                    self.began.notified().await;
                    continue;
                }
                // Nothing waits now; a wait that begins meanwhile is seen
                // at the next look, with its own start.
                Some(None) => Instant::now() + self.timeout,
                Some(Some(since)) => {
                    let due = self.epoch + Duration::from_millis(since - 1) + self.timeout;
                    if due <= Instant::now() {
                        return;
                    }
                    due
                }
            };
            timer.as_mut().reset(wake);
            timer.as_mut().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Stamp>>> {
        // The list holds no invariant a panic could break halfway.
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A response body whose frames go to hyper in slices, each stamped until
/// hyper pulls again.
pub(super) struct Watched<B> {
    body: B,
    /// What is left of a data frame larger than a slice.
    rest: Bytes,
    stamp: Arc<Stamp>,
    epoch: Instant,
}

impl<B> Watched<B> {
    fn handed(&self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, B::Error>>>
    where
        B: Body,
    {
        let since = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.stamp.0.store(since + 1, Ordering::Release);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.stamp.0.store(0, Ordering::Release);
        if !self.rest.is_empty() {
            let take = self.rest.len().min(SLICE);
            let slice = self.rest.split_to(take);
            return self.handed(slice);
        }
        let frame = match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        match frame.into_data() {
            Ok(mut data) => {
                if data.len() > SLICE {
                    self.rest = data.split_off(SLICE);
                }
                self.handed(data)
            }
            // Trailers end the body: nothing more is pulled.
            Err(frame) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.body.size_hint();
        let rest = self.rest.remaining() as u64;
        hint.set_lower(hint.lower().saturating_add(rest));
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn large() -> Full<Bytes> {
        Full::new(Bytes::from(vec![7u8; 40 * 1024]))
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_nobody_pulls_for_the_timeout_stalls_the_connection() {
        let deadlines = StreamDeadlines::new(Duration::from_secs(60));
        let mut body = deadlines.watch(large());
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), SLICE, "handed over in slices");
        let started = Instant::now();
        deadlines.stalled().await;
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_pulling_or_no_stream_at_all_never_stalls() {
        let deadlines = StreamDeadlines::new(Duration::from_secs(60));
        let watch = deadlines.clone();
        let mut stalled = tokio::spawn(async move { watch.stalled().await });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!stalled.is_finished(), "no stream: nothing to wait for");
        let mut body = deadlines.watch(large());
        let mut taken = 0;
        while let Some(frame) = body.frame().await {
            // Less than the timeout between pulls, longer altogether.
            tokio::time::sleep(Duration::from_secs(50)).await;
            taken += frame.unwrap().into_data().unwrap().len();
        }
        assert_eq!(taken, 40 * 1024, "every byte, in order of slices");
        drop(body);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(
            tokio::time::timeout(Duration::ZERO, &mut stalled)
                .await
                .is_err(),
            "served whole, never stalled"
        );
    }
}
