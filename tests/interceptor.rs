//! The interceptor end to end: real upstream servers and real clients on
//! loopback (HTTP/1.1, h2c, Upgrade, raw TCP), hoist serving in-process or
//! as separate interceptor servers read by a scaler.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hoist::config::{HttpRouteSettings, Settings, TcpRouteSettings};
use hoist::interceptor::report::RoutesReport;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use support::web::{
    AppPort, Upstream, echo, full, h2c_client, http_route, http1_client, read_head, send, send_h2,
};
use support::{Hoist, eventually, object};

/// How long a test waits for what should happen within milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

fn with_routes(http: Vec<HttpRouteSettings>, tcp: Vec<TcpRouteSettings>) -> Settings {
    let mut settings = Settings::default();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = http;
    settings.interceptor.tcp_routes = tcp;
    settings
}

async fn routes(admin: SocketAddr) -> RoutesReport {
    let (status, body) = support::http_get(admin, "/interceptor/routes").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn http1_requests_get_their_host_normalised_and_gain_forwarded_headers() {
    let upstream = Upstream::start(echo).await;
    let mut settings = with_routes(vec![http_route("web", "web.test", upstream.addr)], vec![]);
    // The test client stands for a proxy in front (tests/edge.rs: others).
    settings.interceptor.trusted_proxies = vec!["127.0.0.1".into()];
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.expect("an HTTP proxy");
    let client = http1_client();

    let (status, body) = send(&client, proxy, "WEB.test:8080", "/orders?page=2").await;
    assert_eq!(status, StatusCode::OK);
    // The host hoist routed by, lower case (tests/hardening.rs: the rest).
    assert!(body.contains("host=web.test:8080"), "{body}");
    assert!(body.contains("xff=127.0.0.1"), "{body}");
    assert!(body.contains("xfp=http"), "{body}");
    assert!(body.contains("path=/orders?page=2"), "{body}");
    // The request line an HTTP/1.1 app gets carries the origin form.
    assert!(body.contains("target=/orders?page=2 "), "{body}");
    assert!(body.contains("version=HTTP/1.1"), "{body}");

    // Hop-by-hop headers named in Connection stay behind.
    let request = Request::builder()
        .uri(format!("http://{proxy}/"))
        .header("host", "web.test")
        .header("connection", "x-private")
        .header("x-private", "secret-hop")
        .header("x-forwarded-for", "10.0.0.1")
        .body(full(""))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("private=-"), "{body}");
    assert!(body.contains("xff=10.0.0.1, 127.0.0.1"), "{body}");

    let (status, body) = send(&client, proxy, "other.test", "/x").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no route for host `other.test`"), "{body}");
    assert_eq!(upstream.requests(), 2, "the unknown host never reached it");

    let report = routes(hoist.admin).await;
    assert_eq!(report.routes["web"].load.started_total, 2);
    assert_eq!(report.routes["web"].load.in_flight, 0);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn h2c_in_and_out() {
    let upstream = Upstream::start(echo).await;
    let mut h2_route = http_route("grpc-app", "grpc.test", upstream.addr);
    h2_route.upstream_http2 = true;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream.addr), h2_route],
        vec![],
    ))
    .await;
    let proxy = hoist.http_proxy.unwrap();

    // An h2c client (HTTP/2 with prior knowledge) to an HTTP/1.1 upstream.
    let (status, body) = send_h2(proxy, "web.test", "/a").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("version=HTTP/1.1"), "{body}");
    assert!(body.contains("host=web.test"), "{body}");

    // Either client to an h2c upstream.
    for http2 in [false, true] {
        let (status, body) = if http2 {
            send_h2(proxy, "grpc.test", "/b").await
        } else {
            send(&http1_client(), proxy, "grpc.test", "/b").await
        };
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("version=HTTP/2.0"), "{body}");
        assert!(body.contains("host=grpc.test"), "{body}");
    }
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn bodies_stream_and_count_in_flight_until_they_end() {
    // The upstream sends "first", then waits for the test before "second".
    let (release_tx, release_rx) = mpsc::channel::<()>(1);
    let release_rx = Arc::new(tokio::sync::Mutex::new(release_rx));
    let upstream = Upstream::start(move |request: Request<Incoming>| {
        let release = release_rx.clone();
        async move {
            // Read the whole request body: it arrives streamed too.
            let uploaded = request.into_body().collect().await.unwrap().to_bytes();
            let frames = futures::stream::once(async move {
                Ok::<_, Infallible>(Frame::data(Bytes::from(format!(
                    "first:{}|",
                    uploaded.len()
                ))))
            })
            .chain(futures::stream::once(async move {
                release.lock().await.recv().await;
                Ok(Frame::data(Bytes::from_static(b"second")))
            }));
            Response::new(BodyExt::boxed(StreamBody::new(frames)))
        }
    })
    .await;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream.addr)],
        vec![],
    ))
    .await;
    let proxy = hoist.http_proxy.unwrap();

    let upload = vec![7u8; 1 << 20];
    let request = Request::builder()
        .uri(format!("http://{proxy}/upload"))
        .header("host", "web.test")
        .body(full(upload))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], format!("first:{}|", 1 << 20).as_bytes());
    // The response is still open: the request is in flight.
    assert_eq!(routes(hoist.admin).await.routes["web"].load.in_flight, 1);

    release_tx.send(()).await.unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"second");
    eventually(PATIENCE, "the request to end", || async {
        routes(hoist.admin).await.routes["web"].load.in_flight == 0
    })
    .await;
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn upgrades_pass_through_both_ways() {
    // An upstream that accepts `Upgrade: websocket` and then echoes bytes.
    let upstream = Upstream::start(|mut request: Request<Incoming>| async move {
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let mut io = TokioIo::new(upgrade.await.unwrap());
            let mut buffer = [0u8; 64];
            loop {
                let n = io.read(&mut buffer).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                let mut reply = b"echo:".to_vec();
                reply.extend_from_slice(&buffer[..n]);
                io.write_all(&reply).await.unwrap();
            }
        });
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(Empty::new().boxed())
            .unwrap()
    })
    .await;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("ws", "ws.test", upstream.addr)],
        vec![],
    ))
    .await;
    let mut stream = TcpStream::connect(hoist.http_proxy.unwrap()).await.unwrap();
    stream
        .write_all(
            b"GET /socket HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    assert_eq!(
        routes(hoist.admin).await.routes["ws"].load.in_flight,
        1,
        "an upgraded connection stays in flight"
    );
    stream.write_all(b"ping").await.unwrap();
    let mut reply = [0u8; 9];
    stream.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"echo:ping");
    drop(stream);
    eventually(PATIENCE, "the tunnel to close", || async {
        routes(hoist.admin).await.routes["ws"].load.in_flight == 0
    })
    .await;
    hoist.stop().await.unwrap();
}

fn tcp_route(name: &str, upstream: SocketAddr) -> TcpRouteSettings {
    TcpRouteSettings {
        name: name.into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        upstream: upstream.to_string(),
        cold_start_timeout: None,
        concurrent_connections: None,
    }
}

#[tokio::test]
async fn tcp_bytes_flow_both_ways_and_half_close_passes_through() {
    // The upstream reads until the client finishes sending, then answers
    // on the still-open other direction.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut received = Vec::new();
                socket.read_to_end(&mut received).await.unwrap();
                let reply = format!("got {} bytes", received.len());
                socket.write_all(reply.as_bytes()).await.unwrap();
            });
        }
    });
    let hoist = Hoist::start_with(with_routes(vec![], vec![tcp_route("db", upstream)])).await;
    let proxy = hoist.tcp_proxies["db"];

    let mut client = TcpStream::connect(proxy).await.unwrap();
    client.write_all(&[1u8; 100_000]).await.unwrap();
    eventually(PATIENCE, "the connection to be counted", || async {
        routes(hoist.admin).await.routes["db"].load.in_flight == 1
    })
    .await;
    client.shutdown().await.unwrap();
    let mut reply = String::new();
    client.read_to_string(&mut reply).await.unwrap();
    assert_eq!(reply, "got 100000 bytes");
    eventually(PATIENCE, "the connection to end", || async {
        routes(hoist.admin).await.routes["db"].load.in_flight == 0
    })
    .await;
    let report = routes(hoist.admin).await;
    assert_eq!(report.routes["db"].load.started_total, 1);
    assert!(report.routes["db"].load.rate > 0.0);
    hoist.stop().await.unwrap();
}

async fn next_activity(stream: &mut tonic::Streaming<hoist::proto::IsActiveResponse>) -> bool {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a push within 10 s")
        .expect("the stream is healthy")
        .expect("the stream is open")
        .result
}

#[tokio::test]
async fn a_cold_start_holds_the_request_pushes_activation_and_forwards_it_once() {
    let app = AppPort::reserve();
    let upstream_addr = app.addr;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream_addr)],
        vec![],
    ))
    .await;
    let proxy = hoist.http_proxy.unwrap();
    let scaled = object("web-app", &[("scaler", "http"), ("route", "web")]);
    let mut client = ExternalScalerClient::connect(format!("http://{}", hoist.grpc))
        .await
        .unwrap();
    let mut activity = client
        .stream_is_active(scaled.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(!hoist.active(&scaled).await.unwrap(), "idle before traffic");

    let request =
        tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/hello").await });
    // The request waits; KEDA hears at once (not at the 15 s poll).
    assert!(next_activity(&mut activity).await);
    assert_eq!(routes(hoist.admin).await.routes["web"].load.held, 1);
    assert!(!request.is_finished());

    // The app comes up on its port: the held request goes through, once.
    let listener = app.listen();
    let upstream = Upstream::serve(listener, echo);
    let (status, body) = request.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("path=/hello"), "{body}");
    assert_eq!(upstream.requests(), 1);
    assert_eq!(routes(hoist.admin).await.routes["web"].load.held, 0);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn held_requests_time_out_with_504_and_past_the_cap_get_503() {
    let app = AppPort::reserve(); // never comes up
    let nobody = app.addr;
    let mut route = http_route("web", "web.test", nobody);
    route.cold_start_timeout = Some(Duration::from_millis(400));
    let mut settings = with_routes(vec![route], vec![tcp_route("db", nobody)]);
    settings.interceptor.max_held_per_route = 1;
    settings.interceptor.tcp_routes[0].cold_start_timeout = Some(Duration::from_millis(200));
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();

    let first = tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/").await });
    eventually(PATIENCE, "the first request to be held", || async {
        routes(hoist.admin).await.routes["web"].load.held == 1
    })
    .await;
    let (status, body) = send(&http1_client(), proxy, "web.test", "/").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("1 requests are already waiting"), "{body}");
    let (status, body) = first.await.unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(body.contains("cold start timeout"), "{body}");
    assert!(body.contains("route `web`"), "{body}");

    // A TCP connection is held too; at its timeout it closes (raw TCP has
    // no way to say why).
    let mut client = TcpStream::connect(hoist.tcp_proxies["db"]).await.unwrap();
    eventually(PATIENCE, "the connection to be held", || async {
        routes(hoist.admin).await.routes["db"].load.held == 1
    })
    .await;
    let mut buffer = Vec::new();
    let read = client.read_to_end(&mut buffer).await;
    assert!(read.is_err() || buffer.is_empty(), "closed without data");
    assert_eq!(routes(hoist.admin).await.routes["db"].load.held, 0);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn trigger_metadata_is_checked_against_the_routes() {
    let app = AppPort::reserve();
    let upstream = app.addr;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream)],
        vec![tcp_route("db", upstream)],
    ))
    .await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("scaler", "http"), ("route", "nope")],
            "its http routes: web",
        ),
        (&[("scaler", "tcp"), ("route", "web")], "its tcp routes: db"),
        (&[("scaler", "http")], "`route`"),
        (
            &[
                ("scaler", "http"),
                ("route", "web"),
                ("concurrentRequests", "0"),
            ],
            "`concurrentRequests`",
        ),
        (
            &[("scaler", "http"), ("route", "web"), ("metric", "latency")],
            "`metric`",
        ),
        (
            &[
                ("scaler", "tcp"),
                ("route", "db"),
                ("metric", "requestRate"),
            ],
            "`connectionRate`",
        ),
        (
            &[("scaler", "http"), ("route", "web"), ("host", "web.test")],
            "not both",
        ),
    ];
    for (metadata, expected) in cases {
        let status = hoist.spec_refused(&object("app", metadata)).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{metadata:?}");
        assert!(
            status.message().contains(expected),
            "{metadata:?}: {}",
            status.message()
        );
    }
    // By host, the route serving it is measured; the default target is 10.
    let spec = hoist
        .spec(&object("app", &[("scaler", "http"), ("host", "WEB.test")]))
        .await;
    assert_eq!(spec.metric_name, "http-web-test");
    assert_eq!(spec.target_size_float, 10.0);
    hoist.stop().await.unwrap();

    // Without an interceptor, the error says how to get one.
    let bare = Hoist::start().await;
    let status = bare
        .spec_refused(&object("app", &[("scaler", "http"), ("route", "web")]))
        .await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("interceptor.endpoints"),
        "{}",
        status.message()
    );
    bare.stop().await.unwrap();
}

/// A listener that accepts connections and never answers.
async fn hung_replica() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    addr
}

#[tokio::test]
async fn a_scaler_sums_three_interceptors_and_is_not_stalled_by_a_hung_one() {
    let upstream = Upstream::start(echo).await;
    let mut interceptors = Vec::new();
    for _ in 0..3 {
        let settings = with_routes(vec![http_route("web", "web.test", upstream.addr)], vec![]);
        interceptors.push(Hoist::start_interceptor(settings).await);
    }
    let mut scaler_settings = Settings::default();
    scaler_settings.interceptor.endpoints = interceptors
        .iter()
        .map(|interceptor| interceptor.admin.to_string())
        .chain([hung_replica().await.to_string()])
        .collect();
    scaler_settings.interceptor.read_timeout = Duration::from_millis(300);
    let scaler = Hoist::start_with(scaler_settings).await;
    assert!(
        scaler.http_proxy.is_none(),
        "the scaler proxies nothing itself"
    );

    let client = http1_client();
    for (interceptor, requests) in interceptors.iter().zip([3, 2, 1]) {
        for _ in 0..requests {
            let (status, _) = send(&client, interceptor.http_proxy.unwrap(), "web.test", "/").await;
            assert_eq!(status, StatusCode::OK);
        }
    }
    // 6 requests in the window: 6 / 15 per second, summed over replicas.
    let rate = object(
        "web-app",
        &[
            ("scaler", "http"),
            ("route", "web"),
            ("pollingInterval", "1"),
        ],
    );
    let (_, value) = scaler.metric(&rate).await.unwrap();
    assert!((value - 0.4).abs() < 1e-9, "{value}");

    // A replica that stops answering leaves the others' sum.
    let stopped = interceptors.pop().unwrap();
    stopped.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, value) = scaler.metric(&rate).await.unwrap();
    assert!((value - 5.0 / 15.0).abs() < 1e-9, "{value}");

    // A route no replica knows is an error, not a zero.
    let unknown = object("other", &[("scaler", "http"), ("route", "nope")]);
    let status = scaler.metric(&unknown).await.unwrap_err();
    assert!(
        status.message().contains("no interceptor knows"),
        "{}",
        status.message()
    );
    scaler.stop().await.unwrap();
}

#[tokio::test]
async fn a_cold_start_at_a_remote_interceptor_is_pushed_at_once() {
    let app = AppPort::reserve();
    let upstream_addr = app.addr;
    let interceptor = Hoist::start_interceptor(with_routes(
        vec![http_route("web", "web.test", upstream_addr)],
        vec![],
    ))
    .await;
    let mut scaler_settings = Settings::default();
    scaler_settings.interceptor.endpoints = vec![interceptor.admin.to_string()];
    let scaler = Hoist::start_with(scaler_settings).await;
    let scaled = object("web-app", &[("scaler", "http"), ("route", "web")]);
    let mut client = scaler.client().await;
    let mut activity = client
        .stream_is_active(scaled.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(!scaler.active(&scaled).await.unwrap());

    let proxy = interceptor.http_proxy.unwrap();
    let request = tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/").await });
    assert!(
        next_activity(&mut activity).await,
        "pushed long before the 15 s poll"
    );

    let upstream = Upstream::serve(app.listen(), echo);
    let (status, _) = request.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(upstream.requests(), 1);
    let report: BTreeMap<_, _> = routes(interceptor.admin).await.routes;
    assert_eq!(report["web"].load.started_total, 1);
    scaler.stop().await.unwrap();
    interceptor.stop().await.unwrap();
}

#[tokio::test]
async fn in_engine_mode_a_cold_start_is_decided_and_pushed_at_once() {
    let app = AppPort::reserve();
    let upstream_addr = app.addr;
    let mut settings = with_routes(vec![http_route("web", "web.test", upstream_addr)], vec![]);
    settings.engine.assume_applied = true;
    let hoist = Hoist::start_with(settings).await;
    let scaled = object(
        "web-app",
        &[
            ("scaler", "http"),
            ("route", "web"),
            ("scalingMode", "engine"),
        ],
    );
    let mut client = hoist.client().await;
    let mut activity = client
        .stream_is_active(scaled.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(
        !hoist.active(&scaled).await.unwrap(),
        "at zero without traffic"
    );

    let proxy = hoist.http_proxy.unwrap();
    let request = tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/").await });
    assert!(
        next_activity(&mut activity).await,
        "the engine woke the app"
    );
    let (value, _) = hoist.metric(&scaled).await.unwrap();
    assert!(
        value >= 10,
        "one replica's worth (replicas × target): {value}"
    );

    let upstream = Upstream::serve(app.listen(), echo);
    assert_eq!(request.await.unwrap().0, StatusCode::OK);
    assert_eq!(upstream.requests(), 1);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn an_h2c_upstream_holds_each_request_on_its_own_and_caps_them() {
    let app = AppPort::reserve();
    let upstream_addr = app.addr;
    let mut route = http_route("grpc-app", "grpc.test", upstream_addr);
    route.upstream_http2 = true;
    let mut settings = with_routes(vec![route], vec![]);
    settings.interceptor.max_held_per_route = 2;
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();

    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::spawn(async move {
            send_h2(proxy, "grpc.test", "/held").await
        }));
    }
    eventually(PATIENCE, "two requests to be held", || async {
        routes(hoist.admin).await.routes["grpc-app"].load.held == 2
    })
    .await;
    // Past the cap, at once.
    let (status, body) = send_h2(proxy, "grpc.test", "/third").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    let upstream = Upstream::serve(app.listen(), echo);
    for request in held {
        let (status, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("version=HTTP/2.0"), "{body}");
    }
    assert_eq!(upstream.requests(), 2, "each held request sent once");
    hoist.stop().await.unwrap();
}

/// A listener whose accept queue is full: further connection attempts
/// get no answer at all, like a gone pod's IP.
async fn unanswering_upstream() -> (SocketAddr, Vec<TcpStream>, tokio::net::TcpListener) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
        {
            fillers.push(stream);
        }
    }
    (addr, fillers, listener)
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_held_for_too() {
    let (addr, _fillers, _listener) = unanswering_upstream().await;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", addr)],
        vec![],
    ))
    .await;
    let scaled = object("web-app", &[("scaler", "http"), ("route", "web")]);
    let mut client = hoist.client().await;
    let mut activity = client.stream_is_active(scaled).await.unwrap().into_inner();
    let proxy = hoist.http_proxy.unwrap();
    let request = tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/").await });
    // After one bounded attempt the request is held and KEDA hears of it.
    eventually(PATIENCE, "the request to be held", || async {
        routes(hoist.admin).await.routes["web"].load.held == 1
    })
    .await;
    assert!(next_activity(&mut activity).await);
    request.abort();
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn an_app_that_accepts_and_never_answers_gets_a_504_at_the_response_timeout() {
    // The app's handler never returns: the request is the app's, and it
    // is too slow (not a cold start).
    let silent = Upstream::start(|_request: Request<Incoming>| async move {
        futures::future::pending::<()>().await;
        Response::new(full(""))
    })
    .await;
    let mut http1 = http_route("web", "web.test", silent.addr);
    http1.response_timeout = Some(Duration::from_millis(300));
    let mut h2c = http_route("grpc-app", "grpc.test", silent.addr);
    h2c.upstream_http2 = true;
    h2c.response_timeout = Some(Duration::from_millis(300));
    let hoist = Hoist::start_with(with_routes(vec![http1, h2c], vec![])).await;
    let proxy = hoist.http_proxy.unwrap();

    for (http2, host, route) in [(false, "web.test", "web"), (true, "grpc.test", "grpc-app")] {
        let answer = async {
            if http2 {
                send_h2(proxy, host, "/slow").await
            } else {
                send(&http1_client(), proxy, host, "/slow").await
            }
        };
        let (status, body) = tokio::time::timeout(PATIENCE, answer)
            .await
            .expect("an answer well before the test's patience runs out");
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{route}: {body}");
        assert!(body.contains(&format!("route `{route}`")), "{body}");
        assert!(body.contains("did not answer within 300ms"), "{body}");
        assert!(body.contains("response_timeout"), "{body}");
        let report = routes(hoist.admin).await;
        let load = &report.routes[route].load;
        assert_eq!(load.in_flight, 0, "{route}: the request is over");
        assert_eq!(load.held, 0, "{route}: never held for a cold start");
    }
    assert_eq!(silent.requests(), 2, "each request reached the app once");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn http1_trailers_pass_through() {
    let upstream = Upstream::start(|_request: Request<Incoming>| async move {
        let frames = futures::stream::iter([
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"payload"))),
            Ok(Frame::trailers({
                let mut trailers = http::HeaderMap::new();
                trailers.insert("x-checksum", "abc".parse().unwrap());
                trailers
            })),
        ]);
        Response::builder()
            .header("trailer", "x-checksum")
            .body(BodyExt::boxed(StreamBody::new(frames)))
            .unwrap()
    })
    .await;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream.addr)],
        vec![],
    ))
    .await;
    let request = Request::builder()
        .uri(format!("http://{}/", hoist.http_proxy.unwrap()))
        .header("host", "web.test")
        .header("te", "trailers")
        .body(full(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers arrive");
    assert_eq!(trailers["x-checksum"], "abc");
    assert_eq!(&collected.to_bytes()[..], b"payload");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn clients_that_leave_while_held_release_their_place() {
    let app = AppPort::reserve();
    let upstream_addr = app.addr;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream_addr)],
        vec![tcp_route("db", upstream_addr)],
    ))
    .await;
    let proxy = hoist.http_proxy.unwrap();
    let request = tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/").await });
    let tcp_client = TcpStream::connect(hoist.tcp_proxies["db"]).await.unwrap();
    eventually(PATIENCE, "both to be held", || async {
        let report = routes(hoist.admin).await;
        report.routes["web"].load.held == 1 && report.routes["db"].load.held == 1
    })
    .await;
    request.abort();
    drop(tcp_client);
    eventually(PATIENCE, "both places to be released", || async {
        let report = routes(hoist.admin).await;
        let (web, db) = (&report.routes["web"].load, &report.routes["db"].load);
        web.held + web.in_flight + db.held + db.in_flight == 0
    })
    .await;

    // When the app comes up, nobody who left is connected to it.
    let listener = app.listen();
    let accepted = tokio::time::timeout(Duration::from_millis(500), listener.accept()).await;
    assert!(accepted.is_err(), "a connection for a client that left");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn routes_split_by_path_prefix_and_merge_http2_cookies_for_http1() {
    let api = Upstream::start(echo).await;
    let site = Upstream::start(echo).await;
    let mut api_route = http_route("api", "shop.test", api.addr);
    api_route.path_prefix = Some("/api".into());
    let mut settings = with_routes(
        vec![api_route, http_route("site", "shop.test", site.addr)],
        vec![],
    );
    // The test client stands for a proxy in front (tests/edge.rs: others).
    settings.interceptor.trusted_proxies = vec!["127.0.0.1".into()];
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let client = http1_client();
    for (path, upstream) in [
        ("/api/orders", &api),
        ("/api", &api),
        ("/apiary", &site),
        ("/", &site),
    ] {
        let before = upstream.requests();
        let (status, _) = send(&client, proxy, "shop.test", path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(upstream.requests(), before + 1, "{path}");
    }

    let request = Request::builder()
        .uri("http://shop.test/")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("x-forwarded-proto", "https")
        .body(full(""))
        .unwrap();
    let response = h2c_client(proxy).request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.ends_with("cookies=a=1; b=2"),
        "one Cookie field: {body}"
    );
    assert!(
        body.contains("xfp=https"),
        "a proxy in front knows better: {body}"
    );

    // A host two routes serve cannot be measured by host: say which.
    let status = hoist
        .spec_refused(&object("app", &[("scaler", "http"), ("host", "shop.test")]))
        .await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("several routes (api, site)"),
        "{}",
        status.message()
    );
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn concurrency_counts_requests_in_flight() {
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let upstream = Upstream::start(move |_request: Request<Incoming>| {
        let mut release = release_rx.clone();
        async move {
            let _ = release.wait_for(|go| *go).await;
            Response::new(full("done"))
        }
    })
    .await;
    let hoist = Hoist::start_with(with_routes(
        vec![http_route("web", "web.test", upstream.addr)],
        vec![],
    ))
    .await;
    let proxy = hoist.http_proxy.unwrap();
    let open: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/").await }))
        .collect();
    let scaled = object(
        "web-app",
        &[
            ("scaler", "http"),
            ("route", "web"),
            ("metric", "concurrency"),
            ("pollingInterval", "1"),
        ],
    );
    // The metric is a 15 s average of per-second samples: on a loaded
    // machine a sample of 0 can be taken before the requests arrive, and
    // the average reaches 3 only when that sample leaves the window.
    eventually(
        PATIENCE + Duration::from_secs(15),
        "three requests in flight, in the metric",
        || async { hoist.metric(&scaled).await.unwrap().1 == 3.0 },
    )
    .await;
    release_tx.send(true).unwrap();
    for request in open {
        assert_eq!(request.await.unwrap().0, StatusCode::OK);
    }
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_replica_reached_at_two_addresses_is_counted_once() {
    let upstream = Upstream::start(echo).await;
    let mut settings = with_routes(vec![http_route("web", "web.test", upstream.addr)], vec![]);
    settings.admin.listen = "0.0.0.0:0".parse().unwrap();
    // Off loopback the reports want a caller's credential; this test is
    // about counting (tests/admin_auth.rs is about callers).
    settings.admin.auth.require = hoist::config::Require::Never;
    let interceptor = Hoist::start_interceptor(settings).await;
    let port = interceptor.admin.port();
    for _ in 0..3 {
        send(
            &http1_client(),
            interceptor.http_proxy.unwrap(),
            "web.test",
            "/",
        )
        .await;
    }
    let mut scaler_settings = Settings::default();
    // Two loopback addresses, one process (as a dual-stack Service's A and
    // AAAA records would be).
    scaler_settings.interceptor.endpoints =
        vec![format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")];
    let scaler = Hoist::start_with(scaler_settings).await;
    let (_, value) = scaler
        .metric(&object("web-app", &[("scaler", "http"), ("route", "web")]))
        .await
        .unwrap();
    assert!((value - 3.0 / 15.0).abs() < 1e-9, "{value}");
    scaler.stop().await.unwrap();
    interceptor.stop().await.unwrap();
}
