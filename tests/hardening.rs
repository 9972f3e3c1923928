//! What a hostile or broken network does to hoist: silent and trickling
//! connections, oversized headers and messages, too many connections,
//! ambiguous hosts, vanished gRPC peers, and shutdown with work held.
//! Real sockets on loopback; hoist in-process.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hoist::config::Settings;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use support::web::{AppPort, Upstream, full, http_route, proxying};
use support::{Hoist, RedisServer, eventually, object};

/// How long a test waits for what should happen within a second or so.
const PATIENCE: Duration = Duration::from_secs(10);

/// An HTTP/1.1 server that answers every request with the `Host` it got.
async fn host_echo(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
            let host = request
                .headers()
                .get("host")
                .and_then(|value| value.to_str().ok())
                .unwrap_or("-")
                .to_string();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                "host={host}"
            )))))
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(host_echo(listener));
    addr
}

/// One route, `web.test`, to `upstream`.
fn web_to(upstream: SocketAddr) -> Settings {
    proxying(vec![http_route("web", "web.test", upstream)])
}

/// Writes `request` and reads until the server closes: the whole answer.
async fn exchange(proxy: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("the proxy answers and closes")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether the server closes `stream` (EOF or reset) within PATIENCE,
/// reading whatever it sends first.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut sink))
        .await
        .is_ok()
}

async fn metric_line(hoist: &Hoist, prefix: &str) -> Option<String> {
    let (_, metrics) = hoist.get("/metrics").await;
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .map(str::to_string)
}

/// The value of the first series whose line starts with `prefix`.
async fn metric(hoist: &Hoist, prefix: &str) -> Option<f64> {
    let line = metric_line(hoist, prefix).await?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test]
async fn silent_trickling_and_idle_connections_are_closed() {
    let web = upstream().await;
    let mut settings = web_to(web);
    settings.interceptor.first_byte_timeout = Duration::from_millis(200);
    settings.interceptor.idle_timeout = Duration::from_millis(400);
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();

    let mut silent = TcpStream::connect(proxy).await.unwrap();
    assert!(closed_by_server(&mut silent).await, "sends nothing");

    let mut preface = TcpStream::connect(proxy).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    assert!(
        closed_by_server(&mut preface).await,
        "h2c preface, then no SETTINGS"
    );

    // One byte at a time, never finishing the request head.
    let mut trickle = TcpStream::connect(proxy).await.unwrap();
    let trickled = tokio::time::timeout(PATIENCE, async {
        for byte in b"GET / HTTP/1.1\r\nHost: web.test\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if trickle.write_all(&[*byte]).await.is_err() {
                return;
            }
            let mut probe = [0u8; 1];
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_millis(50), trickle.read(&mut probe)).await
            {
                return;
            }
        }
    })
    .await;
    assert!(trickled.is_ok(), "a trickling client is cut off");

    // A finished request leaves a keep-alive connection that idles out.
    let mut idle = TcpStream::connect(proxy).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    idle.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert!(closed_by_server(&mut idle).await, "idle keep-alive");
}

/// Sends a request for `web.test` to an app not yet listening, waits
/// until hoist holds it, starts the app `hold_for` later and returns the
/// answer.
async fn held_until_the_app_starts(hoist: &Hoist, app: AppPort, hold_for: Duration) -> String {
    let request = tokio::spawn(exchange(
        hoist.http_proxy.unwrap(),
        b"GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n",
    ));
    eventually(PATIENCE, "the request is held", || async {
        metric(hoist, "hoist_interceptor_held{").await == Some(1.0)
    })
    .await;
    tokio::time::sleep(hold_for).await;
    tokio::spawn(host_echo(app.listen()));
    request.await.unwrap()
}

#[tokio::test]
async fn a_request_held_past_the_idle_timeout_is_not_cut_off() {
    let app = AppPort::reserve();
    let mut settings = web_to(app.addr);
    settings.interceptor.first_byte_timeout = Duration::from_millis(200);
    settings.interceptor.idle_timeout = Duration::from_millis(300);
    let hoist = Hoist::start_with(settings).await;
    // Held for several idle timeouts before the app starts.
    let answer = held_until_the_app_starts(&hoist, app, Duration::from_millis(1200)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("host=web.test"), "{answer}");
}

#[tokio::test]
async fn a_request_to_an_upstream_that_answers_no_connection_attempt_is_held_then_served() {
    let app = AppPort::reserve();
    let _queue = app.listen_unanswered();
    let hoist = Hoist::start_with(web_to(app.addr)).await;
    let answer = held_until_the_app_starts(&hoist, app, Duration::from_millis(300)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("host=web.test"), "{answer}");
}

#[tokio::test]
async fn a_released_holds_wait_is_in_the_cold_start_histogram() {
    let app = AppPort::reserve();
    let hoist = Hoist::start_with(web_to(app.addr)).await;
    let proxy = hoist.http_proxy.unwrap();
    const SERIES: &str = "hoist_interceptor_cold_start_seconds";
    const ROUTE: &str = "route=\"web\",protocol=\"http\"}";
    const LABELS: &str = "{route=\"web\",protocol=\"http\"}";
    assert_eq!(
        metric(&hoist, &format!("{SERIES}_count{LABELS}")).await,
        Some(0.0),
        "no cold start yet"
    );
    let answer = held_until_the_app_starts(&hoist, app, Duration::from_millis(600)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    assert_eq!(
        metric(&hoist, &format!("{SERIES}_count{LABELS}")).await,
        Some(1.0)
    );
    let waited = metric(&hoist, &format!("{SERIES}_sum{LABELS}"))
        .await
        .unwrap();
    assert!((0.6..60.0).contains(&waited), "held about 0.6 s: {waited}");
    let (_, metrics) = hoist.get("/metrics").await;
    let series: Vec<_> = metrics.lines().filter(|l| l.starts_with(SERIES)).collect();
    assert_eq!(
        metric(&hoist, &format!("{SERIES}_bucket{{le=\"0.5\",{ROUTE}")).await,
        Some(0.0),
        "a wait of 0.6 s or more is above the 0.5 s bucket: {series:#?}"
    );
    assert_eq!(
        metric(&hoist, &format!("{SERIES}_bucket{{le=\"+Inf\",{ROUTE}")).await,
        Some(1.0)
    );

    // A request to an app already up is not a cold start.
    let again = exchange(
        proxy,
        b"GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    assert_eq!(
        metric(&hoist, &format!("{SERIES}_count{LABELS}")).await,
        Some(1.0)
    );
}

#[tokio::test]
async fn oversized_headers_get_431() {
    let web = upstream().await;
    let mut settings = web_to(web);
    settings.interceptor.max_header_bytes = 8192;
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let small = exchange(
        proxy,
        format!(
            "GET / HTTP/1.1\r\nHost: web.test\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(4000)
        )
        .as_bytes(),
    )
    .await;
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    let large = exchange(
        proxy,
        format!(
            "GET / HTTP/1.1\r\nHost: web.test\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(20_000)
        )
        .as_bytes(),
    )
    .await;
    assert!(large.starts_with("HTTP/1.1 431"), "{large}");
}

/// More than 100 header fields, however small, get 431 from hoist itself
/// (the HTTP library's count cap, documented): the route's app is down, so
/// a request hoist had parsed would be held for its cold start instead.
#[tokio::test]
async fn more_than_a_hundred_header_fields_get_431_from_hoist() {
    let down = AppPort::reserve();
    let mut settings = web_to(down.addr);
    settings.interceptor.cold_start_timeout = Duration::from_secs(60);
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let mut head = "GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n".to_string();
    for i in 0..99 {
        head.push_str(&format!("X-{i}: 1\r\n"));
    }
    head.push_str("\r\n");
    let answer = exchange(proxy, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

/// A connection from `ip` (any loopback address: Linux routes all of
/// 127.0.0.0/8 to `lo`).
async fn connect_from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((ip, 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads what the server sends until it closes.
async fn read_all(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("answered and closed");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn connections_past_a_cap_get_503_and_are_counted() {
    let web = upstream().await;
    let mut settings = web_to(web);
    settings.interceptor.max_connections = 4;
    settings.interceptor.max_connections_per_client = Some(2);
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let open_now = |count: usize| {
        let hoist = &hoist;
        async move {
            eventually(PATIENCE, &format!("{count} connections open"), || async {
                metric_line(hoist, "hoist_interceptor_connections{")
                    .await
                    .is_some_and(|line| line.ends_with(&format!(" {count}")))
            })
            .await
        }
    };
    // One address: its share (2), then 503 — others still get in.
    let _one = connect_from([127, 0, 0, 1], proxy).await;
    let _two = connect_from([127, 0, 0, 1], proxy).await;
    open_now(2).await;
    let mut third = connect_from([127, 0, 0, 1], proxy).await;
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let answer = read_all(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    let answer = exchange_from([127, 0, 0, 2], proxy).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "another address: {answer}"
    );

    // The listener full (4): 503 for anyone, before a request is sent.
    let _three = connect_from([127, 0, 0, 3], proxy).await;
    let _four = connect_from([127, 0, 0, 4], proxy).await;
    open_now(4).await;
    let mut fifth = connect_from([127, 0, 0, 5], proxy).await;
    let answer = read_all(&mut fifth).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(
        metric_line(&hoist, "hoist_interceptor_connections_refused_total{")
            .await
            .as_deref(),
        Some("hoist_interceptor_connections_refused_total{listener=\"http\"} 2")
    );
}

/// One request from `ip`, and the whole answer.
async fn exchange_from(ip: [u8; 4], proxy: SocketAddr) -> String {
    let mut stream = connect_from(ip, proxy).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    read_all(&mut stream).await
}

#[tokio::test]
async fn hosts_follow_rfc_9112() {
    let web = upstream().await;
    let other = upstream().await;
    let hoist = Hoist::start_with(proxying(vec![
        http_route("web", "web.test", web),
        http_route("other", "other.test", other),
    ]))
    .await;
    let proxy = hoist.http_proxy.unwrap();

    let twice = exchange(
        proxy,
        b"GET / HTTP/1.1\r\nHost: web.test\r\nHost: other.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(twice.starts_with("HTTP/1.1 400"), "{twice}");
    assert!(twice.contains("more than one Host header"), "{twice}");

    let none = exchange(proxy, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert!(none.starts_with("HTTP/1.1 400"), "{none}");

    // HTTP/1.0 needs no Host: no route for the empty host.
    let old = exchange(proxy, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(old.starts_with("HTTP/1.0 404"), "{old}");

    // An absolute-form target names the host; `Host` is replaced by it.
    let absolute = exchange(
        proxy,
        b"GET http://other.test/ HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(absolute.starts_with("HTTP/1.1 200"), "{absolute}");
    assert!(absolute.ends_with("host=other.test"), "{absolute}");
}

#[tokio::test]
async fn shutdown_answers_held_requests_at_once_and_admin_says_not_ready() {
    // An app that accepts and never answers keeps one request in flight.
    let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_addr = hung.local_addr().unwrap();
    let accepted = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((stream, _)) = hung.accept().await {
            kept.push(stream);
        }
    });
    let cold = AppPort::reserve(); // never comes up
    let cold_addr = cold.addr;
    let mut settings = proxying(vec![
        http_route("hung", "hung.test", hung_addr),
        http_route("cold", "cold.test", cold_addr),
    ]);
    settings.shutdown.grace = Some(Duration::from_secs(3));
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let admin = hoist.admin;
    let in_flight = tokio::spawn(exchange(
        proxy,
        b"GET / HTTP/1.1\r\nHost: hung.test\r\nConnection: close\r\n\r\n",
    ));
    let held = tokio::spawn(exchange(
        proxy,
        b"GET / HTTP/1.1\r\nHost: cold.test\r\nConnection: close\r\n\r\n",
    ));
    eventually(PATIENCE, "one request held, one in flight", || async {
        let held = metric(&hoist, "hoist_interceptor_held{route=\"cold\"").await == Some(1.0);
        let hung = metric(&hoist, "hoist_interceptor_in_flight{route=\"hung\"").await == Some(1.0);
        held && hung
    })
    .await;

    let stopping = tokio::spawn(hoist.stop());
    let answer = held.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(!stopping.is_finished(), "the hung request holds shutdown");
    let (status, body) = support::http_get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    stopping.await.unwrap().unwrap();
    let _ = in_flight.await;
    accepted.abort();
}

#[tokio::test]
async fn shutdown_closes_keep_alive_connections_waiting_between_requests() {
    let web = upstream().await;
    let mut settings = web_to(web);
    // Far longer than the test waits: the idle connection must be closed
    // by the shutdown itself, not by the grace period running out.
    settings.shutdown.grace = Some(Duration::from_secs(600));
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    // Two answered requests on one connection (the direct path's wait
    // for a stop is set up once and kept), then it waits for a third.
    let mut idle = TcpStream::connect(proxy).await.unwrap();
    for _ in 0..2 {
        idle.write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        while !answer.ends_with(b"host=web.test") {
            let mut chunk = [0u8; 1024];
            let read = tokio::time::timeout(PATIENCE, idle.read(&mut chunk))
                .await
                .expect("answered")
                .unwrap();
            assert!(read > 0, "open: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&chunk[..read]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    let stopping = tokio::spawn(hoist.stop());
    assert!(
        closed_by_server(&mut idle).await,
        "the connection waiting for its next request is closed"
    );
    tokio::time::timeout(PATIENCE, stopping)
        .await
        .expect("shutdown does not wait for the idle connection")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn drain_delay_keeps_serving_after_the_signal() {
    let web = upstream().await;
    let mut settings = web_to(web);
    settings.shutdown.drain_delay = Duration::from_secs(3);
    settings.shutdown.grace = Some(Duration::from_secs(1));
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let admin = hoist.admin;
    let stopping = tokio::spawn(hoist.stop());
    let answer = exchange(
        proxy,
        b"GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "new connections: {answer}"
    );
    assert_eq!(support::http_get(admin, "/readyz").await.0, 200);
    stopping.await.unwrap().unwrap();
}

/// The raw bytes of a gRPC call's one request message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

/// Shapes ScaledObjectRef's wire format can be bent into.
#[derive(Clone, PartialEq, prost::Message)]
struct RawName {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NumberName {
    #[prost(uint64, tag = "1")]
    name: u64,
}

/// Calls IsActive with `message` as its request body: the status code.
async fn is_active_raw(grpc: SocketAddr, message: Vec<u8>) -> tonic::Code {
    let stream = TcpStream::connect(grpc).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::post(format!(
        "http://{grpc}/externalscaler.ExternalScaler/IsActive"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(grpc_frame(&message)))
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let code = match parts.headers.get("grpc-status") {
        Some(code) => code.to_str().unwrap().parse::<i32>().unwrap(),
        None => {
            let trailers = body.collect().await.unwrap().trailers().cloned();
            trailers.unwrap()["grpc-status"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap()
        }
    };
    tonic::Code::from(code)
}

#[tokio::test]
async fn undecodable_and_oversized_requests_get_the_clients_codes() {
    let hoist = Hoist::start().await;
    let invalid_utf8 = RawName {
        name: vec![0xff, 0xfe, 0xfd],
    }
    .encode_to_vec();
    assert_eq!(
        is_active_raw(hoist.grpc, invalid_utf8).await,
        tonic::Code::InvalidArgument
    );
    let wrong_type = NumberName { name: 7 }.encode_to_vec();
    assert_eq!(
        is_active_raw(hoist.grpc, wrong_type).await,
        tonic::Code::InvalidArgument
    );
    let truncated = vec![0x0a, 0x40, b'a'];
    assert_eq!(
        is_active_raw(hoist.grpc, truncated).await,
        tonic::Code::InvalidArgument
    );
    // Past limits.max_metadata_bytes (64 KiB) with room to spare: refused
    // before decoding.
    let oversized = RawName {
        name: vec![b'a'; 1024 * 1024],
    }
    .encode_to_vec();
    assert_eq!(
        is_active_raw(hoist.grpc, oversized).await,
        tonic::Code::ResourceExhausted
    );
}

#[tokio::test]
async fn tracked_metadata_has_a_total_budget() {
    let redis = RedisServer::start();
    let mut settings = Settings::default();
    settings.limits.max_metadata_bytes = 1000;
    settings.limits.max_tracked_metadata_bytes = 1500;
    let hoist = Hoist::start_with(settings).await;
    let padded = |name: &str| {
        let mut object = object(
            name,
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "jobs"),
            ],
        );
        object
            .scaler_metadata
            .insert("note".into(), "x".repeat(800));
        object
    };
    hoist.spec(&padded("first")).await;
    let second = hoist.spec_refused(&padded("second")).await;
    assert_eq!(second.code(), tonic::Code::ResourceExhausted);
    assert!(
        second.message().contains("max_tracked_metadata_bytes"),
        "{}",
        second.message()
    );
    hoist.spec(&padded("first")).await;
}

/// A connection that can go silent, as a peer on a lost node does: its
/// reads never complete and its writes vanish.
struct Vanishing {
    stream: TcpStream,
    gone: Arc<AtomicBool>,
}

impl AsyncRead for Vanishing {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.gone.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Vanishing {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.gone.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_vanished_peers_stream_is_released_by_keepalive() {
    let redis = RedisServer::start();
    let mut settings = Settings::default();
    settings.grpc.keepalive_interval = Duration::from_millis(300);
    settings.grpc.keepalive_timeout = Duration::from_millis(300);
    let hoist = Hoist::start_with(settings).await;
    let gone = Arc::new(AtomicBool::new(false));
    let stream = Vanishing {
        stream: TcpStream::connect(hoist.grpc).await.unwrap(),
        gone: gone.clone(),
    };
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let worker = object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    let request = Request::post(format!(
        "http://{}/externalscaler.ExternalScaler/StreamIsActive",
        hoist.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(grpc_frame(&worker.encode_to_vec())))
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    eventually(PATIENCE, "the stream is open", || async {
        metric_line(&hoist, "hoist_open_streams ").await.as_deref() == Some("hoist_open_streams 1")
    })
    .await;
    gone.store(true, Ordering::SeqCst);
    eventually(PATIENCE, "the stream is released", || async {
        metric_line(&hoist, "hoist_open_streams ").await.as_deref() == Some("hoist_open_streams 0")
    })
    .await;
    drop(response);
}

#[tokio::test]
async fn a_decision_change_is_saved_without_waiting_for_the_periodic_save() {
    let redis = RedisServer::start();
    redis.command(&[
        "RPUSH", "jobs", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("hoist-state.json");
    let mut settings = Settings {
        state_file: Some(state_file.clone()),
        ..Default::default()
    };
    // No cluster here: the engine counts from its own decisions.
    settings.engine.assume_applied = true;
    let hoist = Hoist::start_with(settings).await;
    let worker = object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("scalingMode", "engine"),
            ("pollingInterval", "1"),
        ],
    );
    hoist.spec(&worker).await;
    // The periodic save comes every 10 s; a change is saved within ~250 ms.
    eventually(
        Duration::from_secs(5),
        "the activation is saved",
        || async {
            std::fs::read_to_string(&state_file)
                .is_ok_and(|saved| saved.contains("\"default/worker\""))
        },
    )
    .await;
    let first = std::fs::read_to_string(&state_file).unwrap();
    redis.command(&["DEL", "jobs"]);
    // Deactivation starts the cooldown: a new decision, saved again.
    eventually(Duration::from_secs(5), "the cooldown is saved", || async {
        std::fs::read_to_string(&state_file).is_ok_and(|saved| saved != first)
    })
    .await;
}

#[tokio::test]
async fn http2_clients_are_told_the_stream_cap() {
    let web = upstream().await;
    let mut settings = web_to(web);
    settings.interceptor.http2_max_concurrent_streams = 7;
    let hoist = Hoist::start_with(settings).await;
    let stream = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    let (_client, mut connection) = h2::client::handshake(stream).await.unwrap();
    // The server's SETTINGS arrive while the connection is driven.
    let advertised = tokio::time::timeout(
        PATIENCE,
        futures::future::poll_fn(|cx| {
            let _ = std::future::Future::poll(Pin::new(&mut connection), cx);
            match connection.max_concurrent_send_streams() {
                7 => Poll::Ready(()),
                _ => Poll::Pending,
            }
        }),
    )
    .await;
    assert!(
        advertised.is_ok(),
        "advertised: {}",
        connection.max_concurrent_send_streams()
    );
}

#[tokio::test]
async fn a_vanished_http2_client_is_found_by_pings_and_its_hold_released() {
    let app = AppPort::reserve(); // never comes up
    let mut settings = web_to(app.addr);
    settings.interceptor.http2_keepalive_interval = Duration::from_millis(300);
    settings.interceptor.http2_keepalive_timeout = Duration::from_millis(300);
    let hoist = Hoist::start_with(settings).await;
    let gone = Arc::new(AtomicBool::new(false));
    let stream = Vanishing {
        stream: TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap(),
        gone: gone.clone(),
    };
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::get("http://web.test/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let held = tokio::spawn(sender.send_request(request));
    eventually(PATIENCE, "the request is held", || async {
        metric(&hoist, "hoist_interceptor_held{").await == Some(1.0)
    })
    .await;
    gone.store(true, Ordering::SeqCst);
    eventually(PATIENCE, "the hold is released", || async {
        metric(&hoist, "hoist_interceptor_held{").await == Some(0.0)
    })
    .await;
    held.abort();
}

/// An HTTP/1.1 app answering with the `Host` and `X-Forwarded-Host` it got.
async fn hosts_echo() -> SocketAddr {
    let app = Upstream::start(|request: Request<Incoming>| async move {
        let header = |name: &str| {
            let values: Vec<_> = request
                .headers()
                .get_all(name)
                .iter()
                .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
                .collect();
            values.join("|")
        };
        Response::new(full(format!(
            "host={} xfh={}",
            header("host"),
            header("x-forwarded-host")
        )))
    })
    .await;
    app.addr
}

/// `Host: app.example:@evil.example` was routed to app.example's route by
/// what precedes the last `:`, and the app read host `evil.example` in
/// what it got. Every value that is not one host is a 400, on the direct
/// path and hyper's, over HTTP/1.1 and HTTP/2; the app gets the host
/// hoist routed by, normalised.
#[tokio::test]
async fn a_request_names_one_host_and_the_app_gets_it_normalised() {
    let hoist = Hoist::start_with(web_to(hosts_echo().await)).await;
    let proxy = hoist.http_proxy.unwrap();
    let refused = [
        "Host: web.test:@evil.example",
        "Host: web.test:80@evil.example",
        "Host: user@web.test",
        "Host: web.test:80x",
        "Host: web.test:80:80",
        "Host: web.test/evil",
        "Host: web.test%zz",
    ];
    for host in refused {
        // Alone (hyper's path)...
        let answer = exchange(
            proxy,
            format!("GET / HTTP/1.1\r\n{host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{host}: {answer}");
        // ...and after a request the direct path served.
        let answer = exchange(
            proxy,
            format!(
                "GET / HTTP/1.1\r\nHost: web.test\r\n\r\nGET / HTTP/1.1\r\n{host}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
        assert!(
            answer.contains("HTTP/1.1 400"),
            "{host} after a direct request: {answer}"
        );
    }
    for target in ["http://web.test:@evil.example/", "http://web.test:80x/"] {
        let answer = exchange(
            proxy,
            format!("GET {target} HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{target}: {answer}");
    }
    // What the app gets: the routed host, lower case, port as a number,
    // on both paths.
    for (request, expected) in [
        (
            "GET / HTTP/1.1\r\nHost: WEB.Test.:0080\r\nConnection: close\r\n\r\n",
            "host=web.test:80 xfh=web.test:80",
        ),
        (
            "GET / HTTP/1.1\r\nHost: web.test\r\nX-Forwarded-Host: evil.example\r\nConnection: close\r\n\r\n",
            "host=web.test xfh=web.test",
        ),
        (
            "GET http://Web.Test:8080/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
            "host=web.test:8080 xfh=web.test:8080",
        ),
        (
            "GET / HTTP/1.1\r\nHost: Web.Test\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
            "host=web.test xfh=web.test",
        ),
    ] {
        let answer = exchange(proxy, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{request}: {answer}");
        assert!(answer.ends_with(expected), "{request}: {answer}");
    }

    // HTTP/2: `:authority` is read the same way.
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(connection);
    let h2_status = |authority: &'static str| {
        let client = client.clone();
        async move {
            let mut client = client.ready().await.unwrap();
            let request = Request::builder()
                .uri(format!("http://{authority}/"))
                .body(())
                .unwrap();
            let (response, _) = client.send_request(request, true).unwrap();
            let response = response.await.unwrap();
            let status = response.status().as_u16();
            let mut body = response.into_body();
            let mut text = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                text.extend_from_slice(&chunk);
            }
            (status, String::from_utf8_lossy(&text).into_owned())
        }
    };
    let (status, body) = h2_status("web.test:@evil.example").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = h2_status("user@web.test").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = h2_status("WEB.test:8080").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "host=web.test:8080 xfh=web.test:8080")
    );
}

/// An HTTP/1.1 app answering with every field it got, a line each.
async fn fields_echo() -> SocketAddr {
    let app = Upstream::start(|request: Request<Incoming>| async move {
        let text: String = request
            .headers()
            .iter()
            .map(|(name, value)| format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())))
            .collect();
        Response::new(full(text))
    })
    .await;
    app.addr
}

/// CGI-style servers read `X_Forwarded_For` as `X-Forwarded-For` and
/// merge the client's value with hoist's: the `_` spellings of forwarding,
/// framing and hop-by-hop fields stay behind on both paths, even from a
/// trusted proxy; other names with `_` pass.
#[tokio::test]
async fn underscore_spellings_of_hoists_own_fields_never_reach_the_app() {
    let app = fields_echo().await;
    for trusted in [false, true] {
        let mut settings = web_to(app);
        if trusted {
            settings.interceptor.trusted_proxies = vec!["127.0.0.1".into()];
        }
        let hoist = Hoist::start_with(settings).await;
        let proxy = hoist.http_proxy.unwrap();
        // `TE` sends the second request to hyper's path.
        for (path, extra) in [("direct", ""), ("hyper", "TE: trailers\r\n")] {
            let request = format!(
                "GET / HTTP/1.1\r\nHost: web.test\r\n{extra}X_Forwarded_For: 6.6.6.6\r\n\
                 X_Real_IP: 6.6.6.6\r\nX_Forwarded_Proto: https\r\nX_Forwarded_Host: evil.example\r\n\
                 Content_Length: 5\r\nTransfer_Encoding: chunked\r\nKeep_Alive: 1\r\n\
                 X_Request_Id: 7\r\nConnection: close\r\n\r\n"
            );
            let answer = exchange(proxy, request.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
            let (_, body) = answer.split_once("\r\n\r\n").unwrap();
            let names: Vec<&str> = body
                .lines()
                .filter_map(|line| line.split_once(':').map(|(name, _)| name))
                .collect();
            for folded in [
                "x_forwarded_for",
                "x_real_ip",
                "x_forwarded_proto",
                "x_forwarded_host",
                "content_length",
                "transfer_encoding",
                "keep_alive",
            ] {
                assert!(
                    !names.contains(&folded),
                    "{path}, trusted {trusted}: {body}"
                );
            }
            assert!(names.contains(&"x_request_id"), "{path}: {body}");
            assert!(
                !body.contains("6.6.6.6"),
                "{path}, trusted {trusted}: {body}"
            );
        }
        hoist.stop().await.unwrap();
    }
}
