//! The interceptor's direct HTTP/1.1 path, byte by byte on loopback: raw
//! clients, and apps that answer with exactly the bytes a test gives them
//! (well-framed, chunked, interim, doubtful, closing). And what it hands to
//! hyper: every request framing shape that could be read two ways, on a
//! connection the direct path already served, without the app and the
//! client ever disagreeing on where a request ends.

mod support;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hoist::config::Settings;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::web::{Upstream, full, http_route, proxying};
use support::{Hoist, eventually};

const PATIENCE: Duration = Duration::from_secs(10);

fn proxying_to(upstream: SocketAddr) -> Settings {
    proxying(vec![http_route("web", "web.test", upstream)])
}

/// What a scripted app does with one request.
#[derive(Clone, Copy)]
enum Reply {
    /// Writes these bytes and reads the next request.
    Send(&'static str),
    /// Writes these bytes and closes the connection.
    SendAndClose(&'static str),
    /// Reads the request and closes the connection without a word.
    Close,
    /// Reads the request and says nothing, the connection kept open.
    Silent,
}

const OK: Reply = Reply::Send("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");

/// An app answering each request it reads with the next reply of its
/// script (then `OK`), counting connections and requests.
struct ScriptedApp {
    addr: SocketAddr,
    /// Connections that carried a request (hoist's check of a cold app
    /// opens one that carries none).
    connections: Arc<AtomicUsize>,
    /// Request heads, as the app read them.
    requests: Arc<Mutex<Vec<String>>>,
}

impl ScriptedApp {
    async fn start(script: &[Reply]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (counted, seen) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_script(
                    stream,
                    script.clone(),
                    seen.clone(),
                    counted.clone(),
                ));
            }
        });
        Self {
            addr,
            connections,
            requests,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve_script(
    mut stream: TcpStream,
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<String>>>,
    used: Arc<AtomicUsize>,
) {
    let mut reader = Reader::default();
    let mut first = true;
    while let Some(head) = reader.head(&mut stream).await {
        if std::mem::take(&mut first) {
            used.fetch_add(1, Ordering::SeqCst);
        }
        let length = field(&head, "content-length").map_or(0, |v| v.parse().unwrap());
        reader.exactly(&mut stream, length).await;
        seen.lock().unwrap().push(head);
        let reply = script.lock().unwrap().pop_front().unwrap_or(OK);
        match reply {
            Reply::Send(bytes) => stream.write_all(bytes.as_bytes()).await.unwrap(),
            Reply::SendAndClose(bytes) => {
                stream.write_all(bytes.as_bytes()).await.unwrap();
                return;
            }
            Reply::Close => return,
            Reply::Silent => {}
        }
    }
}

/// Reads HTTP/1.1 messages off a stream, keeping what came early.
#[derive(Default)]
struct Reader {
    buffer: Vec<u8>,
}

impl Reader {
    async fn fill(&mut self, stream: &mut TcpStream) -> bool {
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut chunk))
            .await
            .expect("bytes within the patience")
            .unwrap_or(0);
        self.buffer.extend_from_slice(&chunk[..read]);
        read > 0
    }

    /// A head, or `None` at the end of the stream.
    async fn head(&mut self, stream: &mut TcpStream) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head: Vec<u8> = self.buffer.drain(..end + 4).collect();
                return Some(String::from_utf8(head).unwrap());
            }
            if !self.fill(stream).await {
                return None;
            }
        }
    }

    async fn exactly(&mut self, stream: &mut TcpStream, length: usize) -> Vec<u8> {
        while self.buffer.len() < length {
            assert!(self.fill(stream).await, "the stream ended mid-body");
        }
        self.buffer.drain(..length).collect()
    }

    /// A chunked body as sent, framing included, up to its last chunk (the
    /// proxy sends no trailers).
    async fn chunked(&mut self, stream: &mut TcpStream) -> Vec<u8> {
        loop {
            if let Some(end) = self.buffer.windows(5).position(|w| w == b"0\r\n\r\n") {
                return self.buffer.drain(..end + 5).collect();
            }
            assert!(self.fill(stream).await, "the stream ended mid-body");
        }
    }

    async fn rest(&mut self, stream: &mut TcpStream) -> Vec<u8> {
        while self.fill(stream).await {}
        std::mem::take(&mut self.buffer)
    }

    /// A response: its head and its body (by its framing).
    async fn response(&mut self, stream: &mut TcpStream, to_head: bool) -> (String, String) {
        let head = self.head(stream).await.expect("a response");
        let body = if to_head {
            Vec::new()
        } else if field(&head, "transfer-encoding").is_some() {
            self.chunked(stream).await
        } else if let Some(length) = field(&head, "content-length") {
            self.exactly(stream, length.parse().unwrap()).await
        } else {
            self.rest(stream).await
        };
        (head, String::from_utf8(body).unwrap())
    }
}

/// A field's value in a head (any case).
fn field(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_string())
    })
}

fn status(head: &str) -> u16 {
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A scripted app behind hoist, and a client connected to hoist.
async fn through_hoist(script: &[Reply]) -> (ScriptedApp, Hoist, TcpStream, Reader) {
    let app = ScriptedApp::start(script).await;
    let hoist = Hoist::start_with(proxying_to(app.addr)).await;
    let client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    (app, hoist, client, Reader::default())
}

const GET: &str = "GET /a HTTP/1.1\r\nHost: web.test\r\n\r\n";

/// Connections handed to hyper, by reason, from `/metrics`.
async fn handed_to_hyper(hoist: &Hoist) -> Vec<(String, u64)> {
    let (status, metrics) = hoist.get("/metrics").await;
    assert_eq!(status, 200);
    metrics
        .lines()
        .filter_map(|line| {
            line.strip_prefix("hoist_interceptor_http_hyper_connections_total{reason=\"")
        })
        .filter_map(|rest| {
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_string(), value.trim().parse().ok()?))
        })
        .filter(|(_, count)| *count > 0)
        .collect()
}

#[tokio::test]
async fn plain_requests_share_one_app_connection_and_get_a_date() {
    let (app, hoist, mut client, mut reader) = through_hoist(&[]).await;
    for _ in 0..3 {
        client.write_all(GET.as_bytes()).await.unwrap();
        let (head, body) = reader.response(&mut client, false).await;
        assert_eq!((status(&head), body.as_str()), (200, "ok"), "{head}");
        assert!(field(&head, "date").is_some(), "{head}");
    }
    assert_eq!(app.requests().len(), 3);
    assert_eq!(app.connections(), 1, "one app connection, kept");
    let forwarded = &app.requests()[0];
    assert!(forwarded.starts_with("GET /a HTTP/1.1\r\n"), "{forwarded}");
    assert_eq!(
        field(forwarded, "x-forwarded-host").as_deref(),
        Some("web.test")
    );
    assert_eq!(handed_to_hyper(&hoist).await, [], "all direct");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let app = ScriptedApp::start(&[
        Reply::Send("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"),
        Reply::Send("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo"),
    ])
    .await;
    let hoist = Hoist::start_with(proxying_to(app.addr)).await;
    let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    client
        .write_all(format!("{GET}{GET}").as_bytes())
        .await
        .unwrap();
    let mut reader = Reader::default();
    assert_eq!(reader.response(&mut client, false).await.1, "one");
    assert_eq!(reader.response(&mut client, false).await.1, "two");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn chunked_responses_are_framed_again_without_extensions_or_trailers() {
    let (app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
         5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: secret\r\n\r\n",
    )])
    .await;
    client.write_all(GET.as_bytes()).await.unwrap();
    let (head, body) = reader.response(&mut client, false).await;
    assert_eq!(
        field(&head, "transfer-encoding").as_deref(),
        Some("chunked")
    );
    assert_eq!(body, "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    // The message ended cleanly: the app's connection serves the next.
    client.write_all(GET.as_bytes()).await.unwrap();
    assert_eq!(reader.response(&mut client, false).await.1, "ok");
    assert_eq!(app.connections(), 1);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn responses_to_head_have_no_body_and_keep_the_clients_connection() {
    let app =
        ScriptedApp::start(&[Reply::Send("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")]).await;
    let hoist = Hoist::start_with(proxying_to(app.addr)).await;
    let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    let mut reader = Reader::default();
    client
        .write_all(b"HEAD /a HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = reader.response(&mut client, true).await;
    assert_eq!(field(&head, "content-length").as_deref(), Some("5"));
    client.write_all(GET.as_bytes()).await.unwrap();
    assert_eq!(reader.response(&mut client, false).await.1, "ok");
    // The app's connection could still bring a body it owes HEAD.
    assert_eq!(app.connections(), 2);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn interim_responses_stay_behind() {
    let (_app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(
        "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n\
         HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal",
    )])
    .await;
    client.write_all(GET.as_bytes()).await.unwrap();
    let (head, body) = reader.response(&mut client, false).await;
    assert_eq!((status(&head), body.as_str()), (200, "final"), "{head}");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_response_without_a_length_ends_the_clients_connection_after_it() {
    let app =
        ScriptedApp::start(&[Reply::SendAndClose("HTTP/1.1 200 OK\r\n\r\nuntil the end")]).await;
    let hoist = Hoist::start_with(proxying_to(app.addr)).await;
    let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    let mut reader = Reader::default();
    client.write_all(GET.as_bytes()).await.unwrap();
    let (head, body) = reader.response(&mut client, false).await;
    assert_eq!(field(&head, "connection").as_deref(), Some("close"));
    assert_eq!(body, "until the end");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn an_apps_doubtful_framing_is_a_502_and_its_connection_is_not_used_again() {
    for doubtful in [
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nContent-Length: 0x2\r\n\r\nab",
        "HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 2\r\n\r\nab",
    ] {
        let (app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(doubtful)]).await;
        client.write_all(GET.as_bytes()).await.unwrap();
        let (head, body) = reader.response(&mut client, false).await;
        assert_eq!(status(&head), 502, "{doubtful}: {head}{body}");
        assert!(body.contains("the app's connection failed"), "{body}");
        client.write_all(GET.as_bytes()).await.unwrap();
        assert_eq!(reader.response(&mut client, false).await.1, "ok");
        assert_eq!(app.connections(), 2, "{doubtful}: a new connection");
        hoist.stop().await.unwrap();
    }
}

#[tokio::test]
async fn a_broken_chunked_body_closes_the_clients_connection() {
    let (_app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX",
    )])
    .await;
    client.write_all(GET.as_bytes()).await.unwrap();
    let head = reader.head(&mut client).await.expect("the head went out");
    assert_eq!(status(&head), 200);
    let rest = String::from_utf8(reader.rest(&mut client).await).unwrap();
    assert_eq!(
        rest, "5\r\nhello",
        "the good part, then the end of the connection"
    );
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_reused_connection_the_app_dropped_is_retried_for_idempotent_requests_only() {
    // The app answers once, then reads the next request and closes: the
    // race of an app's keep-alive timeout.
    let (app, hoist, mut client, mut reader) = through_hoist(&[OK, Reply::Close]).await;
    for _ in 0..2 {
        client.write_all(GET.as_bytes()).await.unwrap();
        assert_eq!(reader.response(&mut client, false).await.1, "ok");
    }
    assert_eq!(app.requests().len(), 3, "the second GET, sent again");
    assert_eq!(app.connections(), 2);
    hoist.stop().await.unwrap();

    let (app, hoist, mut client, mut reader) = through_hoist(&[OK, Reply::Close]).await;
    client.write_all(GET.as_bytes()).await.unwrap();
    assert_eq!(reader.response(&mut client, false).await.1, "ok");
    client
        .write_all(b"POST /order HTTP/1.1\r\nHost: web.test\r\nContent-Length: 1\r\n\r\n1")
        .await
        .unwrap();
    let (head, _) = reader.response(&mut client, false).await;
    assert_eq!(
        status(&head),
        502,
        "a POST the app may have acted on is not sent twice"
    );
    assert_eq!(app.requests().len(), 2);
    hoist.stop().await.unwrap();
}

/// Answers with what it got: method, path and body.
async fn recording(request: Request<Incoming>) -> Response<support::web::Body> {
    let line = format!("{} {}", request.method(), request.uri().path());
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let body = body.map_or_else(
        |_| "(body failed)".to_string(),
        |b| String::from_utf8_lossy(&b).into_owned(),
    );
    Response::new(full(format!("{line} [{body}]")))
}

#[tokio::test]
async fn a_body_still_on_its_way_is_streamed_by_hyper() {
    let app = Upstream::start(recording).await;
    let hoist = Hoist::start_with(proxying_to(app.addr)).await;
    let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    let mut reader = Reader::default();
    client.write_all(GET.as_bytes()).await.unwrap();
    assert_eq!(reader.response(&mut client, false).await.1, "GET /a []");
    client
        .write_all(b"POST /up HTTP/1.1\r\nHost: web.test\r\nContent-Length: 10\r\n\r\nhello")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.write_all(b"world").await.unwrap();
    assert_eq!(
        reader.response(&mut client, false).await.1,
        "POST /up [helloworld]"
    );
    // Still one connection, now hyper's, and still answering.
    client.write_all(GET.as_bytes()).await.unwrap();
    assert_eq!(reader.response(&mut client, false).await.1, "GET /a []");
    assert_eq!(
        handed_to_hyper(&hoist).await,
        [("body_in_pieces".to_string(), 1)]
    );
    hoist.stop().await.unwrap();
}

/// Request framings two readers could disagree on (RFC 9112 §6, §11.2),
/// each followed on the wire by a request it might hide or reveal, and
/// the statuses the client reads on that connection from then on: hyper
/// refuses the request (400) and closes, except that it reads both
/// lengths at once as chunked (the app answers) and then closes (RFC 9112
/// §6.3); an HTTP/1.0 request ends its connection; a second `Host` gets
/// hoist's 400, and an absolute target is routed by the host it names
/// (here none: 404), both on a connection that goes on.
const DOUBTFUL_REQUESTS: &[(&str, &[u16])] = &[
    // CL.TE and TE.CL: both lengths.
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX",
        &[200],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
        &[200],
    ),
    // Two lengths.
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: 1\r\nContent-Length: 5\r\n\r\nABCDE",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: 1, 5\r\n\r\nABCDE",
        &[400],
    ),
    // Codings and spellings some readers take for chunked.
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding:\tchunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        &[200],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n",
        &[400],
    ),
    // Lengths with signs or in hex.
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: +5\r\n\r\nABCDE",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: 0x5\r\n\r\nABCDE",
        &[400],
    ),
    // Chunk sizes that overflow or are not hex.
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000001\r\nA\r\n0\r\n\r\n",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\n\r\nz\r\nA\r\n0\r\n\r\n",
        &[400],
    ),
    // A folded line, and a line without its CR.
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: 5\r\n Transfer-Encoding: chunked\r\n\r\nABCDE",
        &[400],
    ),
    (
        "POST /v HTTP/1.1\r\nHost: web.test\r\nContent-Length: 5\rX: y\r\n\r\nABCDE",
        &[400],
    ),
    // Two hosts, and an absolute target naming another.
    (
        "GET /v HTTP/1.1\r\nHost: web.test\r\nHost: other.test\r\n\r\n",
        &[400, 200],
    ),
    (
        "GET http://other.test/v HTTP/1.1\r\nHost: web.test\r\n\r\n",
        &[404, 200],
    ),
    // HTTP/1.0 with keep-alive and a body.
    (
        "POST /v HTTP/1.0\r\nHost: web.test\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nABCDE",
        &[200],
    ),
];

const HIDDEN: &str = "GET /hidden HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn doubtful_request_framing_goes_to_hyper_and_never_desynchronises_the_app() {
    let app = Upstream::start(recording).await;
    let hoist = Hoist::start_with(proxying_to(app.addr)).await;
    let proxy = hoist.http_proxy.unwrap();
    for (doubtful, expected) in DOUBTFUL_REQUESTS {
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let mut reader = Reader::default();
        // First a plain request: the direct path has the connection.
        client.write_all(GET.as_bytes()).await.unwrap();
        assert_eq!(reader.response(&mut client, false).await.1, "GET /a []");
        let before = app.requests();
        client
            .write_all(format!("{doubtful}{HIDDEN}").as_bytes())
            .await
            .unwrap();
        // Every answer the client gets, until hoist closes.
        let mut answers = Vec::new();
        while let Some(head) = reader.head(&mut client).await {
            let length = field(&head, "content-length").expect("answers have a length");
            let body = reader.exactly(&mut client, length.parse().unwrap()).await;
            answers.push((status(&head), String::from_utf8(body).unwrap()));
        }
        let reached: Vec<&String> = answers
            .iter()
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| body)
            .collect();
        // The app got exactly the requests whose answers the client read:
        // none it did not see, none hidden in a body or split off one.
        assert_eq!(
            app.requests() - before,
            reached.len(),
            "{doubtful:?}: answers {answers:?}"
        );
        for body in &reached {
            assert!(
                !body.contains("SMUGGLED") || body.starts_with("POST /v [SMUGGLED"),
                "{doubtful:?}: {body}"
            );
        }
        let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
        assert_eq!(&statuses, expected, "{doubtful:?}: {answers:?}");
    }
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_client_that_leaves_before_or_during_the_answer_is_let_go() {
    // Before: the app never answers. During: it sends part of a body.
    for reply in [
        Reply::Silent,
        Reply::Send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart of it"),
    ] {
        let app = ScriptedApp::start(&[reply]).await;
        let hoist = Hoist::start_with(proxying_to(app.addr)).await;
        let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
        client.write_all(GET.as_bytes()).await.unwrap();
        eventually(PATIENCE, "the request to be in flight", || async {
            hoist.in_flight("web").await == 1 && app.requests().len() == 1
        })
        .await;
        drop(client);
        eventually(PATIENCE, "the request to be let go", || async {
            hoist.in_flight("web").await == 0
        })
        .await;
        hoist.stop().await.unwrap();
    }
}

#[tokio::test]
async fn hoists_own_answer_to_head_has_no_body() {
    let (_app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    )])
    .await;
    client
        .write_all(format!("HEAD /a HTTP/1.1\r\nHost: web.test\r\n\r\n{GET}").as_bytes())
        .await
        .unwrap();
    let (head, _) = reader.response(&mut client, true).await;
    assert_eq!(status(&head), 502, "{head}");
    // The next answer starts where the client expects it.
    let (head, body) = reader.response(&mut client, false).await;
    assert_eq!((status(&head), body.as_str()), (200, "ok"), "{head}");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn an_apps_connection_option_cannot_take_the_length_away() {
    let (_app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: Content-Length\r\n\r\nhello",
    )])
    .await;
    client
        .write_all(format!("{GET}{GET}").as_bytes())
        .await
        .unwrap();
    let (head, body) = reader.response(&mut client, false).await;
    assert_eq!(
        field(&head, "content-length").as_deref(),
        Some("5"),
        "{head}"
    );
    assert_eq!(body, "hello");
    assert_eq!(reader.response(&mut client, false).await.1, "ok");
    hoist.stop().await.unwrap();
}

/// A head of `length` bytes in all, padded by one field.
fn padded_get(length: usize) -> String {
    let start = "GET /a HTTP/1.1\r\nHost: web.test\r\nX-Pad: ";
    let end = "\r\n\r\n";
    format!(
        "{start}{}{end}",
        "a".repeat(length - start.len() - end.len())
    )
}

/// A request head past `max_header_bytes` gets hyper's 431 even when the
/// direct path reads it whole: here its last bytes come after the buffer
/// grew for its first ones, which used to bring the whole head in at once.
#[tokio::test]
async fn every_request_head_is_held_to_max_header_bytes() {
    let app = ScriptedApp::start(&[]).await;
    let mut settings = proxying_to(app.addr);
    settings.interceptor.max_header_bytes = 8192;
    let hoist = Hoist::start_with(settings).await;
    let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    let mut reader = Reader::default();
    client.write_all(GET.as_bytes()).await.unwrap();
    assert_eq!(reader.response(&mut client, false).await.1, "ok");
    let long = padded_get(9000);
    client.write_all(&long.as_bytes()[..8100]).await.unwrap();
    // Lets hoist read the first part, so the rest lands in one read.
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.write_all(&long.as_bytes()[8100..]).await.unwrap();
    let (head, _) = reader.response(&mut client, false).await;
    assert_eq!(status(&head), 431, "{head}");
    assert_eq!(
        app.requests().len(),
        1,
        "the long head never reached the app"
    );
    hoist.stop().await.unwrap();
}

/// A response head past the 128 KiB cap is a 502 whether it came in
/// pieces or whole.
#[tokio::test]
async fn every_response_head_is_held_to_its_cap() {
    let long: &'static str = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\nX-Pad: {}\r\nContent-Length: 2\r\n\r\nok",
            "a".repeat(140_000)
        )
        .into_boxed_str(),
    );
    let (_app, hoist, mut client, mut reader) = through_hoist(&[Reply::Send(long)]).await;
    client.write_all(GET.as_bytes()).await.unwrap();
    let (head, _) = reader.response(&mut client, false).await;
    assert_eq!(status(&head), 502, "{head}");
    hoist.stop().await.unwrap();
}

/// An app that answers HEAD, and 204 / 304 with a length, without a body,
/// then writes that body late: first thing on the next request of the
/// same connection, before that request's answer.
async fn late_body_app() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut reader = Reader::default();
                let mut owed = false;
                while let Some(head) = reader.head(&mut stream).await {
                    if std::mem::take(&mut owed) {
                        stream.write_all(b"stray").await.unwrap();
                    }
                    let answer: &[u8] = if head.starts_with("HEAD ") {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
                    } else if head.starts_with("GET /204 ") {
                        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"
                    } else if head.starts_with("GET /304 ") {
                        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    };
                    owed = !answer.ends_with(b"ok");
                    stream.write_all(answer).await.unwrap();
                }
            });
        }
    });
    addr
}

/// A body an app owes a HEAD, 204 or 304 and writes late would be read as
/// the answer to the next request on that app connection: such a
/// connection is not used again.
#[tokio::test]
async fn an_app_connection_that_may_owe_a_body_is_not_used_again() {
    let hoist = Hoist::start_with(proxying_to(late_body_app().await)).await;
    // `TE` hands the connection to hyper's path from its first request.
    for path in ["", "TE: trailers\r\n"] {
        let mut client = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
        let mut reader = Reader::default();
        for first in ["HEAD /a", "GET /204", "GET /304"] {
            let first = format!("{first} HTTP/1.1\r\nHost: web.test\r\n{path}\r\n");
            client.write_all(first.as_bytes()).await.unwrap();
            // None of them has a body, whatever length it names.
            let (head, _) = reader.response(&mut client, true).await;
            assert!(status(&head) < 400, "{first}: {head}");
            client.write_all(GET.as_bytes()).await.unwrap();
            let (head, body) = reader.response(&mut client, false).await;
            assert_eq!((status(&head), body.as_str()), (200, "ok"), "after {first}");
        }
    }
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn connect_is_answered_405_by_hoist() {
    let (app, hoist, mut client, mut reader) = through_hoist(&[]).await;
    client
        .write_all(b"CONNECT web.test:80 HTTP/1.1\r\nHost: web.test:80\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = reader.response(&mut client, false).await;
    assert_eq!(status(&head), 405, "{head}");
    assert!(field(&head, "allow").is_some(), "{head}");
    assert!(app.requests().is_empty(), "{:?}", app.requests());
    hoist.stop().await.unwrap();
}

/// No route, or a path hoist refuses: the direct path answers itself
/// (the plan both paths share), with or without a body as asked, and
/// serves the next request on the same connection.
#[tokio::test]
async fn hoists_own_404_and_400_are_given_by_the_direct_path() {
    let (app, hoist, mut client, mut reader) = through_hoist(&[]).await;
    for (request, expected, to_head) in [
        ("GET /a HTTP/1.1\r\nHost: other.test\r\n\r\n", 404, false),
        ("HEAD /a HTTP/1.1\r\nHost: other.test\r\n\r\n", 404, true),
        ("GET /a%2Fb HTTP/1.1\r\nHost: web.test\r\n\r\n", 400, false),
        (GET, 200, false),
    ] {
        client.write_all(request.as_bytes()).await.unwrap();
        let (head, body) = reader.response(&mut client, to_head).await;
        assert_eq!(status(&head), expected, "{request:?}: {head}");
        if expected == 404 && !to_head {
            assert!(body.contains("no route for host `other.test`"), "{body}");
        }
    }
    assert_eq!(app.requests().len(), 1, "only the routed one");
    assert_eq!(handed_to_hyper(&hoist).await, [], "all direct");
    hoist.stop().await.unwrap();
}

/// One pool per route for both paths: the app connection hyper's path
/// used serves the direct path's next request, and hyper's again after.
#[tokio::test]
async fn both_paths_share_the_routes_app_connections() {
    let (app, hoist, direct, direct_reader) = through_hoist(&[]).await;
    // `TE` sends this connection's requests to hyper's path.
    let hyper = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    let to_hyper = "GET /a HTTP/1.1\r\nHost: web.test\r\nTE: trailers\r\n\r\n";
    let mut clients = [
        (hyper, Reader::default(), to_hyper),
        (direct, direct_reader, GET),
    ];
    for turn in 0..4 {
        let (client, reader, request) = &mut clients[turn % 2];
        client.write_all(request.as_bytes()).await.unwrap();
        let (head, body) = reader.response(client, false).await;
        assert_eq!((status(&head), body.as_str()), (200, "ok"), "{head}");
    }
    assert_eq!(app.requests().len(), 4);
    assert_eq!(app.connections(), 1, "one app connection for both paths");
    hoist.stop().await.unwrap();
}
