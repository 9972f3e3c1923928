//! The direct path: plain HTTP/1.1 requests proxied on hoist's own reading
//! of the bytes, below hyper.
//!
//! Why: hyper's HTTP/1 server and client executed about twice nginx's
//! whole path per proxied request (docs/BENCHMARKS.md, finding 3): each
//! message parsed into `http` types and a header map, a body channel per
//! message, buffers moved between layers. Here a request head is parsed in
//! place (httparse), written upstream as one buffer with its body, and the
//! response head and body go back the same way; buffers live as long as
//! the connection.
//!
//! What stays safe: `request_head` takes only requests whose framing is
//! not in doubt; at the first other request the connection is hyper's, from
//! that request's first byte (`Replay`), and hyper answers it as before,
//! smuggling checks, error answers, upgrades and h2c included. So is every
//! connection of a trusted proxy (its forwarded headers are appended to,
//! which hyper's path does). Responses are checked by `response_head`.

use std::io;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use super::answer::Answer;
use super::idle_pool::IdleConnection;
use super::plan::{Head, Plan, plan};
use super::request_head::{self, Reading};
use super::response_head::{self, Framing, Rechunker, ResponseHead, ResponseReading};
use super::route::HttpRoute;
use super::{ClientConnection, HEADER_READ_TIMEOUT, Handover};
use crate::interceptor::lazy_timer::LazyTimer;

/// What a connection's input buffer starts with.
const INPUT_CAPACITY: usize = 4096;
/// What is read from an app at a time.
const READ_SIZE: usize = 8192;
/// A response head longer than this is refused (502).
const MAX_RESPONSE_HEAD: usize = 128 * 1024;

/// How the direct path left a client connection.
pub(super) enum Served {
    /// Closed (by the client, a deadline, an answer, or hoist's shutdown).
    Closed,
    /// For hyper, from the first byte of a request the direct path does
    /// not take (`already_read` starts with it).
    HandOver {
        client: Box<ClientConnection>,
        already_read: BytesMut,
        why: Handover,
    },
}

/// Serves a client connection until it closes, or until hoist shuts down
/// between its requests, or says which request hyper must take it from.
pub(super) async fn serve(mut client: ClientConnection) -> Served {
    let mut input = BytesMut::with_capacity(INPUT_CAPACITY);
    let mut exchange = Exchange::default();
    let stopping = client.stopping.clone();
    let mut stop = stopping.waiter();
    loop {
        // Once hoist shuts down, no new request is taken (as hyper's
        // graceful shutdown does).
        if stopping.is_set() {
            return Served::Closed;
        }
        let mut head_deadline = None;
        let taken = loop {
            if !input.is_empty() {
                let why = match prepare(&input, &client, &mut exchange.upstream_out) {
                    Step::Partial if input.len() < client.max_header_bytes => None,
                    Step::Partial => Some(Handover::LongHead),
                    Step::Fallback(why) => Some(why),
                    Step::Taken(taken) => break taken,
                };
                if let Some(why) = why {
                    return Served::HandOver {
                        client: Box::new(client),
                        already_read: input,
                        why,
                    };
                }
            }
            input.reserve(INPUT_CAPACITY);
            let read = if input.is_empty() {
                // Between requests: the connection's idle deadlines apply.
                tokio::select! {
                    biased;
                    read = client.stream.read_buf(&mut input) => read,
                    () = stop.stopped() => return Served::Closed,
                }
            } else {
                // A head in pieces gets what hyper gives one (slow-loris).
                let deadline =
                    *head_deadline.get_or_insert_with(|| Instant::now() + HEADER_READ_TIMEOUT);
                tokio::select! {
                    biased;
                    read = tokio::time::timeout_at(deadline, client.stream.read_buf(&mut input)) => match read {
                        Ok(read) => read,
                        Err(_) => return Served::Closed,
                    },
                    () = stop.stopped() => return Served::Closed,
                }
            };
            match read {
                Ok(0) | Err(_) => return Served::Closed,
                Ok(_) => {}
            }
        };
        let (length, keep_open) = match taken {
            Taken::Request(request) => {
                let keep_open = exchange.run(&mut client, &request, &mut input).await;
                (request.length, keep_open)
            }
            Taken::Answer(answer) => {
                // As for a request: a shutting-down hoist says it closes.
                let close = answer.close || client.stopping.is_set();
                let keep_open = exchange
                    .answer(&mut client, &answer.answer, close, answer.head)
                    .await;
                (answer.length, keep_open)
            }
        };
        input.advance(length);
        if input.is_empty() && input.capacity() > KEEP_AT_MOST {
            input = BytesMut::with_capacity(INPUT_CAPACITY);
        }
        exchange.shrink();
        if !keep_open {
            let _ = client.stream.shutdown().await;
            return Served::Closed;
        }
    }
}

/// A request the direct path took: its upstream head (and body) is
/// written, nothing else done yet.
struct Request {
    route: Arc<HttpRoute>,
    /// Head and body, in the input.
    length: usize,
    close: bool,
    head: bool,
    /// Sent again on a fresh connection when a reused one failed before
    /// any answer (RFC 9110 §9.2.2).
    idempotent: bool,
}

/// A request hoist answers itself (no route, a path it refuses).
struct OwnAnswer {
    answer: Answer,
    /// Head and body, in the input.
    length: usize,
    close: bool,
    head: bool,
}

enum Step {
    Partial,
    Fallback(Handover),
    Taken(Taken),
}

/// A request the direct path serves: proxied, or answered by hoist.
enum Taken {
    Request(Request),
    Answer(OwnAnswer),
}

/// Reads the head at the start of `input` and, for a request the direct
/// path takes, writes the upstream's head and body into `out`.
fn prepare(input: &[u8], client: &ClientConnection, out: &mut Vec<u8>) -> Step {
    let mut slots = request_head::header_slots();
    let (head, fields) = match request_head::read(input, &mut slots) {
        (Reading::Partial, _) => return Step::Partial,
        (Reading::Fallback, _) => return Step::Fallback(Handover::Shape),
        (Reading::Direct(head), fields) => (head, fields),
    };
    // A head read whole in one go (a buffer grown while it was partial,
    // or bytes read ahead behind the last request) is held to the same
    // limit: hyper answers it 431.
    if head.length > client.max_header_bytes {
        return Step::Fallback(Handover::LongHead);
    }
    // A body still on its way is hyper's to stream.
    let Some(length) = usize::try_from(head.content_length)
        .ok()
        .and_then(|body| head.length.checked_add(body))
        .filter(|length| *length <= input.len())
    else {
        return Step::Fallback(Handover::BodyInPieces);
    };
    let routes = client.routes.current();
    let plan = plan(
        Head::of_direct(&head),
        client.peer.allow_encoded_slashes,
        &routes.http,
    );
    let routed = match plan {
        Plan::Routed(routed) => routed,
        Plan::Answer(answer) => {
            return Step::Taken(Taken::Answer(OwnAnswer {
                answer,
                length,
                close: head.close,
                head: head.method == "HEAD",
            }));
        }
    };
    let (route, path) = (routed.route, routed.path);
    if route.upstream_http2 {
        return Step::Fallback(Handover::UpstreamH2c);
    }
    out.clear();
    request_head::write_upstream_head(out, &head, &path, fields, &client.peer.forwarding);
    out.extend_from_slice(&input[head.length..length]);
    Step::Taken(Taken::Request(Request {
        route,
        length,
        close: head.close,
        head: head.method == "HEAD",
        idempotent: matches!(
            head.method,
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        ),
    }))
}

/// Buffers and the response timer of a connection, kept from request to
/// request.
#[derive(Default)]
struct Exchange {
    /// The request as the app gets it.
    upstream_out: Vec<u8>,
    /// What the app sent.
    upstream_in: BytesMut,
    /// What the client gets.
    client_out: Vec<u8>,
    /// One per connection, moved forward per request (lazily: see
    /// `LazyTimer`).
    response_timer: Option<LazyTimer>,
}

/// A buffer grown past this by one large message is given back after it:
/// an idle keep-alive connection keeps a few KiB, not its largest message.
const KEEP_AT_MOST: usize = 64 * 1024;

/// Why a response stopped halfway: the client's connection is closed (an
/// HTTP/1.1 message cannot be cut short otherwise).
struct Broken;

impl Exchange {
    fn shrink(&mut self) {
        if self.upstream_out.capacity() > KEEP_AT_MOST {
            self.upstream_out = Vec::new();
        }
        if self.client_out.capacity() > KEEP_AT_MOST {
            self.client_out = Vec::new();
        }
        if self.upstream_in.capacity() > KEEP_AT_MOST && self.upstream_in.is_empty() {
            self.upstream_in = BytesMut::new();
        }
    }

    /// Proxies one request; false when the client's connection closes
    /// after it.
    async fn run(
        &mut self,
        client: &mut ClientConnection,
        request: &Request,
        input: &mut BytesMut,
    ) -> bool {
        let route = &request.route;
        // The clock is read twice per request on the usual path (in perf's
        // samples clock reads were the route's largest user-space cost):
        // here, for the request's count, deadline, admission, pooled
        // connection and response timer; and when it ends. A hold or a new
        // connection reads it again.
        let now = Instant::now();
        let _in_flight = route.counters.start(now);
        let open = client.activity.request();
        // A shutting-down hoist answers this one, and says so.
        let close = request.close || client.stopping.is_set();
        let deadline = route.upstream.deadline(now);
        let max = client.max_header_bytes;
        let sent_at = if route.upstream.admits_at_once(now) {
            now
        } else {
            // Held here through a cold start, then sent and answered; a
            // client that leaves meanwhile ends it (its place in the
            // counts too).
            let admitted = tokio::select! {
                biased;
                admitted = route.upstream.admit(now, deadline) => admitted,
                () = client_left(client.stream.get_ref(), input, max) => return false,
            };
            if let Err(error) = admitted {
                let answer = Answer::refusal(&error);
                route.counters.refused(answer.status.as_u16());
                return self.answer(client, &answer, close, request.head).await;
            }
            // The hold may have been long: the response timer starts now.
            Instant::now()
        };
        let sent = tokio::select! {
            biased;
            sent = self.send(route, request, close, deadline, sent_at) => sent,
            () = client_left(client.stream.get_ref(), input, max) => return false,
        };
        let (upstream, head) = match sent {
            Ok(answered) => answered,
            Err(answer) => {
                route.counters.refused(answer.status.as_u16());
                return self.answer(client, &answer, close, request.head).await;
            }
        };
        let keep_client = !head.close_client;
        let relayed = self.relay(client, upstream, &head, route, input).await;
        let done = Instant::now();
        open.end_at(done);
        match relayed {
            Ok(reusable) => {
                route.upstream.reached_at(done);
                if let Some(upstream) = reusable {
                    route.idle.checkin(IdleConnection::Socket(upstream), done);
                }
                keep_client
            }
            Err(Broken) => {
                // The app answered a head, but a body that broke (maybe the
                // app failing) earns no trust later than the request.
                route.upstream.reached_at(sent_at);
                false
            }
        }
    }

    /// Sends the request and reads the response head, on an idle
    /// connection or a new one; the response timer runs from `now`, or
    /// from when a new connection opened.
    async fn send(
        &mut self,
        route: &HttpRoute,
        request: &Request,
        close: bool,
        deadline: Instant,
        now: Instant,
    ) -> Result<(TcpStream, ResponseHead), Answer> {
        let mut may_reuse = true;
        'attempt: loop {
            let idle = may_reuse.then(|| route.idle.checkout_socket(now)).flatten();
            let reused = idle.is_some();
            let (mut upstream, sent_at) = match idle {
                Some(stream) => (stream, now),
                None => {
                    // A new connection may have waited (a cold start).
                    let stream = route
                        .upstream
                        .connect(deadline)
                        .await
                        .map_err(|error| Answer::refusal(&error))?;
                    (stream, Instant::now())
                }
            };
            let timeout = route.response_timeout();
            let timer = arm(&mut self.response_timer, sent_at + timeout);
            let written = tokio::select! {
                biased;
                written = upstream.write_all(&self.upstream_out) => written,
                () = timer.expired() => return Err(Answer::too_slow(&route.name, timeout)),
            };
            if let Err(error) = written {
                // Never answered: an idle connection the app had just
                // closed. A fresh one gets it.
                if reused {
                    may_reuse = false;
                    continue 'attempt;
                }
                return Err(Answer::upstream_failure(&route.name, &error));
            }
            self.upstream_in.clear();
            // Anything from the app (even a 1xx) means it took the request.
            let mut heard = false;
            loop {
                if !self.upstream_in.is_empty() {
                    self.client_out.clear();
                    let reading = response_head::read(
                        &self.upstream_in,
                        request.head,
                        close,
                        &mut self.client_out,
                    );
                    // Complete or not, a head is held to the cap: a read
                    // into a grown buffer can bring a whole long one.
                    let too_long = match &reading {
                        ResponseReading::Final(head) => head.length > MAX_RESPONSE_HEAD,
                        ResponseReading::Interim(length) => *length > MAX_RESPONSE_HEAD,
                        ResponseReading::Partial => self.upstream_in.len() > MAX_RESPONSE_HEAD,
                        ResponseReading::Bad(_) => false,
                    };
                    if too_long {
                        return Err(Answer::upstream_failure(
                            &route.name,
                            &"the app's response head is too long",
                        ));
                    }
                    match reading {
                        ResponseReading::Final(head) => return Ok((upstream, head)),
                        ResponseReading::Interim(length) => {
                            self.upstream_in.advance(length);
                            continue;
                        }
                        ResponseReading::Bad(reason) => {
                            return Err(Answer::upstream_failure(&route.name, &reason));
                        }
                        ResponseReading::Partial => {}
                    }
                }
                self.upstream_in.reserve(READ_SIZE);
                let read = tokio::select! {
                    biased;
                    read = upstream.read_buf(&mut self.upstream_in) => read,
                    () = timer.expired() => return Err(Answer::too_slow(&route.name, timeout)),
                };
                match read {
                    Ok(0) | Err(_) if reused && !heard && request.idempotent => {
                        may_reuse = false;
                        continue 'attempt;
                    }
                    Ok(0) => {
                        return Err(Answer::upstream_failure(
                            &route.name,
                            &"the app closed the connection before answering",
                        ));
                    }
                    Err(error) => return Err(Answer::upstream_failure(&route.name, &error)),
                    Ok(_) => heard = true,
                }
            }
        }
    }

    /// Writes the response head (in `client_out`) and the body to the
    /// client; gives the app's connection back when its message ended
    /// cleanly and it may take another.
    async fn relay(
        &mut self,
        client: &mut ClientConnection,
        mut upstream: TcpStream,
        head: &ResponseHead,
        route: &HttpRoute,
        input: &mut BytesMut,
    ) -> Result<Option<TcpStream>, Broken> {
        self.upstream_in.advance(head.length);
        let name = &route.name;
        let ended = match head.framing {
            Framing::Empty => {
                write(&mut client.stream, &self.client_out).await?;
                true
            }
            Framing::Length(length) => {
                let mut left = length;
                loop {
                    let take = self.take(left);
                    left -= take as u64;
                    write(&mut client.stream, &self.client_out).await?;
                    if left == 0 {
                        break true;
                    }
                    self.client_out.clear();
                    if self.read_body(&mut upstream, client, input, name).await? == 0 {
                        return Err(broken(name, "the app closed the connection mid-body"));
                    }
                }
            }
            Framing::Chunked => {
                let mut chunks = Rechunker::default();
                loop {
                    let Ok(used) = chunks.feed(&self.upstream_in, &mut self.client_out) else {
                        // What came well framed before goes out first.
                        let _ = write(&mut client.stream, &self.client_out).await;
                        return Err(broken(name, "the app's chunked body is malformed"));
                    };
                    self.upstream_in.advance(used);
                    if !self.client_out.is_empty() {
                        write(&mut client.stream, &self.client_out).await?;
                        self.client_out.clear();
                    }
                    if chunks.done() {
                        break true;
                    }
                    if self.read_body(&mut upstream, client, input, name).await? == 0 {
                        return Err(broken(name, "the app closed the connection mid-body"));
                    }
                }
            }
            Framing::UntilClose => loop {
                self.take(u64::MAX);
                write(&mut client.stream, &self.client_out).await?;
                self.client_out.clear();
                if self.read_body(&mut upstream, client, input, name).await? == 0 {
                    break false;
                }
            },
        };
        Ok((ended && head.reusable && self.upstream_in.is_empty()).then_some(upstream))
    }

    /// Moves up to `left` body bytes from the app's input to the client's
    /// output.
    fn take(&mut self, left: u64) -> usize {
        let take = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(self.upstream_in.len());
        self.client_out.extend_from_slice(&self.upstream_in[..take]);
        self.upstream_in.advance(take);
        take
    }

    /// More of a body: the bytes read (0: the app closed). An app whose
    /// connection fails, or a client that leaves, breaks the message.
    async fn read_body(
        &mut self,
        upstream: &mut TcpStream,
        client: &ClientConnection,
        input: &mut BytesMut,
        route: &str,
    ) -> Result<usize, Broken> {
        self.upstream_in.reserve(READ_SIZE);
        tokio::select! {
            biased;
            read = upstream.read_buf(&mut self.upstream_in) => {
                read.map_err(|_| broken(route, "the app's connection failed mid-body"))
            }
            () = client_left(client.stream.get_ref(), input, client.max_header_bytes) => {
                Err(broken(route, "the client left mid-body"))
            }
        }
    }

    /// Answers the client from the interceptor itself.
    async fn answer(
        &mut self,
        client: &mut ClientConnection,
        answer: &Answer,
        close: bool,
        head: bool,
    ) -> bool {
        self.client_out.clear();
        answer.write_http1(&mut self.client_out, close, head);
        write(&mut client.stream, &self.client_out).await.is_ok() && !close
    }
}

/// The response timer, due `at`.
fn arm(timer: &mut Option<LazyTimer>, at: Instant) -> &mut LazyTimer {
    match timer {
        Some(timer) => {
            timer.set(at);
            timer
        }
        None => timer.insert(LazyTimer::new(at)),
    }
}

async fn write<W: tokio::io::AsyncWrite + Unpin>(
    stream: &mut W,
    bytes: &[u8],
) -> Result<(), Broken> {
    stream.write_all(bytes).await.map_err(|_| Broken)
}

fn broken(route: &str, why: &str) -> Broken {
    debug!(
        route,
        why, "response cut short; closing the client's connection"
    );
    Broken
}

/// Resolves when the client closed its connection (or it failed); bytes
/// it sends meanwhile (a pipelined request) are kept in `input`.
async fn client_left(stream: &TcpStream, input: &mut BytesMut, max: usize) {
    loop {
        // The reader's one waker slot, not a waiter in the socket's list
        // (a lock to join and one to leave, every request): nothing else
        // reads the client's socket meanwhile.
        let readable = std::future::poll_fn(|cx| stream.poll_read_ready(cx));
        if input.len() >= max || readable.await.is_err() {
            // Nothing more is taken; the request goes on.
            return std::future::pending().await;
        }
        input.reserve(INPUT_CAPACITY);
        match stream.try_read_buf(input) {
            Ok(0) => return,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}
