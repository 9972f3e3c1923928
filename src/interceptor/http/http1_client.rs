//! hyper's path to an HTTP/1.1 upstream: a request sent on one of the
//! route's idle connections (`IdlePool`, shared with the direct path) or
//! a new one, the connection driven by the request that uses it.
//!
//! hyper-util's pooled client wants an absolute URI per request, keys its
//! pool by scheme and authority, and runs every connection on a task of
//! its own that requests reach through channels. A route has one upstream,
//! so none of that is needed: here the request's task polls the connection
//! itself, from sending the request to the last byte of the response body
//! (docs/BENCHMARKS.md, finding 3), and once the message ended cleanly the
//! socket goes back to the idle pool, where either path takes it next.
//! Upgrades and h2c upstreams keep hyper-util's client, which they need.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::http1_connection::Http1Connection;
use super::idle_pool::{IdleConnection, IdlePool};
use crate::interceptor::upstream::{Upstream, UpstreamError};

/// Why a request did not get a response from the upstream.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("the app's connection failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the app did not answer within {}", humantime::format_duration(*.0))]
    ResponseTimeout(Duration),
}

/// Sends a route's plain requests that hyper read.
pub struct Http1Client {
    upstream: Arc<Upstream>,
    idle: Arc<IdlePool>,
    /// From sending a request (its body included) to its response's head;
    /// also how long an upload may go on after its response ended.
    response_timeout: Duration,
}

impl Http1Client {
    pub fn new(upstream: Arc<Upstream>, idle: Arc<IdlePool>, response_timeout: Duration) -> Self {
        Self {
            upstream,
            idle,
            response_timeout,
        }
    }

    /// Sends `request` on an idle connection, or on a new one (holding
    /// through a cold start until `deadline`), and returns the response
    /// whose body drives the connection and gives it back when done.
    pub async fn send(
        &self,
        mut request: Request<Incoming>,
        deadline: Instant,
    ) -> Result<Response<PooledBody>, SendError> {
        let head_request = request.method() == http::Method::HEAD;
        loop {
            let (mut connection, reused) = match self.idle.checkout(Instant::now()) {
                Some(IdleConnection::Http1(connection)) => (connection, true),
                Some(IdleConnection::Socket(stream)) => (self.handshake(stream).await?, true),
                None => {
                    let stream = self.upstream.connect(deadline).await?;
                    (self.handshake(stream).await?, false)
                }
            };
            let mut sending = pin!(connection.sender.try_send_request(request));
            let mut timer = pin!(tokio::time::sleep(self.response_timeout));
            let answer = poll_fn(|cx| {
                connection.drive(cx);
                // Once the connection has ended, hyper has answered the
                // request with the reason.
                if let Poll::Ready(answer) = sending.as_mut().poll(cx) {
                    return Poll::Ready(Some(answer));
                }
                timer.as_mut().poll(cx).map(|()| None)
            })
            .await;
            // On time out the connection is dropped: it is in the middle
            // of a message.
            let Some(answer) = answer else {
                return Err(SendError::ResponseTimeout(self.response_timeout));
            };
            match answer {
                Ok(response) => {
                    // A body the app owes but hoist does not read (to HEAD;
                    // a 204 or 304 with a length) could come late, and be
                    // read as the next request's answer: such a
                    // connection closes with this response.
                    let status = response.status().as_u16();
                    let framed = response
                        .headers()
                        .contains_key(http::header::CONTENT_LENGTH)
                        || response
                            .headers()
                            .contains_key(http::header::TRANSFER_ENCODING);
                    let late_body = head_request || (matches!(status, 204 | 304) && framed);
                    return Ok(response.map(|body| PooledBody {
                        body,
                        connection: (!late_body).then_some(connection),
                        idle: self.idle.clone(),
                        response_timeout: self.response_timeout,
                    }));
                }
                Err(mut error) => match error.take_message() {
                    // Never written: an idle connection the app had just
                    // closed. A fresh one gets it.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(error.into_error().into()),
                },
            }
        }
    }

    /// Sends an upgrade request (WebSocket...) on a connection of its own:
    /// a tunnel is never given back to the pool. hyper's client runs on a
    /// task until the upgrade is done.
    pub async fn send_upgrade(
        &self,
        request: Request<Incoming>,
        deadline: Instant,
    ) -> Result<Response<Incoming>, SendError> {
        let stream = self.upstream.connect(deadline).await?;
        let (mut sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            let _ = driver.with_upgrades().await;
        });
        tokio::time::timeout(self.response_timeout, sender.send_request(request))
            .await
            .map_err(|_| SendError::ResponseTimeout(self.response_timeout))?
            .map_err(SendError::from)
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.idle_count()
    }

    /// hyper's client on a connection (no I/O).
    async fn handshake(&self, stream: TcpStream) -> Result<Box<Http1Connection>, SendError> {
        Ok(Box::new(Http1Connection::handshake(stream).await?))
    }
}

/// Gives a connection whose message ended back to the idle pool; one
/// still uploading finishes on its own.
fn check_in(mut connection: Box<Http1Connection>, idle: &IdlePool, response_timeout: Duration) {
    // With the response read, one poll moves the connection to idle
    // and makes its sender ready.
    if connection.reusable(&mut Context::from_waker(Waker::noop())) {
        idle.checkin(IdleConnection::Http1(connection), Instant::now());
    } else if let Some(driver) = connection.driver.take() {
        finish_upload(driver, response_timeout);
    }
}

/// A connection whose response ended while the request's body was still
/// being sent (an app that answers before reading everything): it cannot
/// be reused, but the upload goes on, on its own task, for up to `limit`;
/// with the sender dropped, hyper closes the connection after it.
fn finish_upload(driver: Connection<TokioIo<TcpStream>, Incoming>, limit: Duration) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(limit, driver).await;
        });
    }
}

/// A response body that drives its connection while it is read, and gives
/// the connection back to the pool once the body is complete. A body
/// dropped before its end closes the connection (HTTP/1.1 cannot skip the
/// rest of a message).
pub struct PooledBody {
    body: Incoming,
    connection: Option<Box<Http1Connection>>,
    idle: Arc<IdlePool>,
    response_timeout: Duration,
}

impl PooledBody {
    fn check_in(&mut self) {
        if let Some(connection) = self.connection.take() {
            check_in(connection, &self.idle, self.response_timeout);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(connection) = this.connection.as_mut() {
            connection.drive(cx);
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        // The end of a body without a length (chunked, or trailers, after
        // which hyper's server polls no more) is only seen here.
        let ended = match &frame {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(frame))) => frame.is_trailers(),
            _ => false,
        };
        if ended {
            this.check_in();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body with a length is known complete without a last poll.
        if self.body.is_end_stream() {
            self.check_in();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptor::counters::RouteCounters;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// An upstream that answers every request on a connection with `body`,
    /// closing after `per_connection` responses; counts its connections.
    async fn upstream(body: &'static str, per_connection: usize) -> (String, Arc<AtomicUsize>) {
        upstream_framed(body, per_connection, false).await
    }

    /// The same, with the body chunked (no length) when `chunked`.
    async fn upstream_framed(
        body: &'static str,
        per_connection: usize,
        chunked: bool,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut answered = 0;
                    while answered < per_connection {
                        let mut chunk = [0u8; 1024];
                        let read = stream.read(&mut chunk).await.unwrap_or(0);
                        if read == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..read]);
                        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            buffer.drain(..end + 4);
                            let response = if chunked {
                                format!(
                                    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                                    body.len()
                                )
                            } else {
                                format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                )
                            };
                            stream.write_all(response.as_bytes()).await.unwrap();
                            answered += 1;
                        }
                    }
                });
            }
        });
        (address, accepted)
    }

    fn pool(address: String) -> Arc<Http1Client> {
        pool_with_timeout(address, Duration::from_secs(5))
    }

    fn pool_with_timeout(address: String, response_timeout: Duration) -> Arc<Http1Client> {
        pool_with(address, Duration::from_secs(90), response_timeout)
    }

    fn pool_with(
        address: String,
        idle_timeout: Duration,
        response_timeout: Duration,
    ) -> Arc<Http1Client> {
        let counters = Arc::new(RouteCounters::new(Instant::now()));
        let upstream = Arc::new(Upstream::new(
            "web".into(),
            address,
            Duration::from_secs(5),
            10,
            counters,
        ));
        Arc::new(Http1Client::new(
            upstream,
            IdlePool::new(4, idle_timeout),
            response_timeout,
        ))
    }

    /// A request with an empty `Incoming` body, as the server side hands
    /// them over: taken from a real hyper server on loopback.
    async fn requests(count: usize) -> tokio::sync::mpsc::Receiver<Request<Incoming>> {
        let (tx, rx) = tokio::sync::mpsc::channel(count);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(request).await;
                    Ok::<_, std::convert::Infallible>(Response::new(String::new()))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        tokio::spawn(async move {
            let stream = TcpStream::connect(address).await.unwrap();
            let (mut sender, driver) = http1::handshake::<_, String>(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(driver);
            for _ in 0..count {
                let request = Request::builder()
                    .uri("/")
                    .header("host", "web")
                    .body(String::new())
                    .unwrap();
                sender.send_request(request).await.unwrap();
            }
        });
        rx
    }

    /// Sends the next request through the pool and reads the whole body.
    async fn forward(
        pool: &Arc<Http1Client>,
        incoming: &mut tokio::sync::mpsc::Receiver<Request<Incoming>>,
    ) -> Bytes {
        let request = incoming.recv().await.unwrap();
        let response = pool
            .send(request, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn one_connection_serves_requests_in_turn() {
        let (address, accepted) = upstream("hello", usize::MAX).await;
        let pool = pool(address);
        let mut incoming = requests(20).await;
        for _ in 0..20 {
            let body = forward(&pool, &mut incoming).await;
            assert_eq!(body, "hello");
            assert_eq!(
                pool.idle_count(),
                1,
                "the connection is back once its body is read"
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn chunked_responses_give_their_connection_back_too() {
        // A chunked body has no length to count down: its end is the
        // last frame, after which the server side polls no more.
        let (address, accepted) = upstream_framed("chunk", usize::MAX, true).await;
        let pool = pool(address);
        let mut incoming = requests(3).await;
        for _ in 0..3 {
            assert_eq!(forward(&pool, &mut incoming).await, "chunk");
            assert_eq!(pool.idle_count(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_upload_goes_on_after_an_early_response() {
        // The app answers after half the body and reads the rest after.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = listener.local_addr().unwrap().to_string();
        let (received_tx, received) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 1024];
            let body_at = loop {
                let read = stream.read(&mut chunk).await.unwrap();
                buffer.extend_from_slice(&chunk[..read]);
                if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
            };
            while buffer.len() < body_at + 5 {
                let read = stream.read(&mut chunk).await.unwrap();
                buffer.extend_from_slice(&chunk[..read]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            while buffer.len() < body_at + 10 {
                let read = stream.read(&mut chunk).await.unwrap();
                if read == 0 {
                    break;
                }
                buffer.extend_from_slice(&chunk[..read]);
            }
            let _ = received_tx.send(buffer[body_at..].to_vec());
        });

        // hoist's side: a real hyper server forwarding through the pool.
        let pool = pool(app);
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = front.accept().await.unwrap();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let pool = pool.clone();
                async move {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    Ok::<_, std::convert::Infallible>(pool.send(request, deadline).await.unwrap())
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });

        let mut client = TcpStream::connect(front_addr).await.unwrap();
        client
            .write_all(b"POST / HTTP/1.1\r\nhost: web\r\ncontent-length: 10\r\n\r\n12345")
            .await
            .unwrap();
        let mut response = Vec::new();
        let mut chunk = [0u8; 1024];
        while !response.ends_with(b"ok") {
            let read = client.read(&mut chunk).await.unwrap();
            assert!(read > 0, "the response arrives before the upload ends");
            response.extend_from_slice(&chunk[..read]);
        }
        client.write_all(b"67890").await.unwrap();
        let received = tokio::time::timeout(Duration::from_secs(5), received)
            .await
            .expect("the app reads the whole body")
            .unwrap();
        assert_eq!(received, b"1234567890");
    }

    #[tokio::test]
    async fn a_connection_idle_past_its_response_timeout_serves_the_next_request() {
        // The connection's timer ran out while it sat in the pool: the
        // next request on it starts a fresh one.
        let (address, accepted) = upstream("again", usize::MAX).await;
        let pool = pool_with_timeout(address, Duration::from_millis(100));
        let mut incoming = requests(2).await;
        assert_eq!(forward(&pool, &mut incoming).await, "again");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(forward(&pool, &mut incoming).await, "again");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "the same connection");
    }

    #[tokio::test]
    async fn a_connection_the_app_closed_is_replaced() {
        // The app closes each connection after one response, as an app
        // with a short keep-alive would between two requests.
        let (address, accepted) = upstream("bye", 1).await;
        let pool = pool(address);
        let mut incoming = requests(5).await;
        for _ in 0..5 {
            let body = forward(&pool, &mut incoming).await;
            assert_eq!(body, "bye");
            // Let the app's close arrive before the next request.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn a_body_dropped_unread_takes_its_connection_with_it() {
        let (address, accepted) = upstream("unread", usize::MAX).await;
        let pool = pool(address);
        let mut incoming = requests(2).await;
        let request = incoming.recv().await.unwrap();
        let response = pool
            .send(request, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        // Unread, the body is not known to be complete: the connection
        // is in the middle of a message and cannot be reused.
        drop(response);
        let body = forward(&pool, &mut incoming).await;
        assert_eq!(body, "unread");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
