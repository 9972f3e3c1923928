//! The interceptor's edge, end to end on loopback: where a declared
//! route's upstream may connect (`interceptor.denied_networks`, checked
//! at every new connection), and what a client can make of a request
//! (normalised paths, forwarded headers, HTTP/2 `Host`).

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hoist::config::{HostOverrides, HttpRouteSettings, Settings};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::web::{Body, Upstream, echo, full, h2c_client, http1_client, send};
use support::{Hoist, object};

const PATIENCE: Duration = Duration::from_secs(10);

/// The name every declared upstream below resolves through hoist's host
/// table: `app:PORT` in metadata is completed to it.
const APP: &str = "app.default.svc.cluster.local";

/// A host table whose answer for [`APP`] a test changes at will, as a
/// DNS server it controls would.
#[derive(Clone, Default)]
struct Dns(Arc<Mutex<Vec<IpAddr>>>);

impl Dns {
    fn answer(&self, addresses: &[&str]) {
        *self.0.lock().unwrap() = addresses.iter().map(|a| a.parse().unwrap()).collect();
    }

    fn overrides(&self) -> HostOverrides {
        let answers = self.0.clone();
        HostOverrides::new(move |host| (host == APP).then(|| answers.lock().unwrap().clone()))
    }
}

/// hoist serve with an in-process interceptor, its names resolved by
/// `dns`, and the default rules otherwise.
fn serving(dns: &Dns) -> Settings {
    let mut settings = Settings::default();
    settings.interceptor.enabled = true;
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.host_overrides = dns.overrides();
    // No cluster here: callers are trusted, and any host may be routed.
    settings.grpc.trust_callers = true;
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    settings
}

fn declare_http(name: &str, host: &str, port: u16) -> hoist::proto::ScaledObjectRef {
    let upstream = format!("app:{port}");
    object(
        name,
        &[("scaler", "http"), ("host", host), ("upstream", &upstream)],
    )
}

fn says(
    text: &'static str,
) -> impl Fn(Request<Incoming>) -> std::future::Ready<Response<Body>> + Clone {
    move |_request| std::future::ready(Response::new(full(text)))
}

/// Two apps on one port: a "private" one on 127.0.0.1 (what a fence
/// must keep requests from) and a "public" one on 127.0.0.2.
async fn apps_on_one_port() -> (TcpListener, TcpListener, u16) {
    for _ in 0..20 {
        let public = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = public.local_addr().unwrap().port();
        if let Ok(private) = TcpListener::bind(("127.0.0.1", port)).await {
            return (private, public, port);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

async fn denied_total(hoist: &Hoist, route: &str) -> u64 {
    let (status, body) = hoist.get("/metrics").await;
    assert_eq!(status, 200, "{body}");
    let prefix = format!("hoist_interceptor_upstream_denied_total{{route=\"{route}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| value.trim().parse().unwrap())
}

#[tokio::test]
async fn declared_upstreams_resolving_to_loopback_metadata_or_mapped_loopback_get_502() {
    let app = Upstream::start(says("private")).await;
    let port = app.addr.port();
    let dns = Dns::default();
    let hoist = Hoist::start_with(serving(&dns)).await;
    let proxy = hoist.http_proxy.unwrap();
    hoist.spec(&declare_http("shop", "shop.test", port)).await;

    for answer in ["127.0.0.1", "169.254.169.254", "::ffff:127.0.0.1", "::1"] {
        dns.answer(&[answer]);
        let (status, body) = send(&http1_client(), proxy, "shop.test", "/").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}: {body}");
        assert!(body.contains("interceptor.denied_networks"), "{body}");
    }
    assert_eq!(app.requests(), 0, "the app on loopback was never reached");
    assert_eq!(denied_total(&hoist, "http/default/shop").await, 4);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn hoists_own_address_is_denied_once_connected() {
    // `self` alone: 127.0.0.1 is not listed, but connecting to it from
    // it is connecting to hoist's own network namespace.
    let app = Upstream::start(says("own")).await;
    let dns = Dns::default();
    dns.answer(&["127.0.0.1"]);
    let mut settings = serving(&dns);
    settings.interceptor.denied_networks = vec!["self".into()];
    let hoist = Hoist::start_with(settings).await;
    hoist
        .spec(&declare_http("shop", "shop.test", app.addr.port()))
        .await;
    let (status, body) = send(&http1_client(), hoist.http_proxy.unwrap(), "shop.test", "/").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(app.requests(), 0);
    assert_eq!(denied_total(&hoist, "http/default/shop").await, 1);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_name_with_a_denied_and_an_allowed_address_reaches_the_allowed_one() {
    let (private, public, port) = apps_on_one_port().await;
    let private = Upstream::serve(private, says("private"));
    let public = Upstream::serve(public, says("public"));
    let dns = Dns::default();
    // The denied address first: a plain dialler would take it.
    dns.answer(&["127.0.0.1", "127.0.0.2"]);
    let mut settings = serving(&dns);
    settings.interceptor.denied_networks = vec!["127.0.0.1/32".into()];
    let hoist = Hoist::start_with(settings).await;
    hoist.spec(&declare_http("shop", "shop.test", port)).await;

    let (status, body) = send(&http1_client(), hoist.http_proxy.unwrap(), "shop.test", "/").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "public"));
    assert_eq!((private.requests(), public.requests()), (0, 1));
    assert_eq!(denied_total(&hoist, "http/default/shop").await, 0);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_config_route_to_loopback_is_the_operators_own_and_still_served() {
    let app = Upstream::start(echo).await;
    let mut settings = Settings::default();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = vec![route("web", "web.test", None, app.addr)];
    assert!(
        settings
            .interceptor
            .denied_networks
            .contains(&"127.0.0.0/8".into())
    );
    let hoist = Hoist::start_with(settings).await;
    let (status, body) = send(&http1_client(), hoist.http_proxy.unwrap(), "web.test", "/").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_name_rebound_to_loopback_is_refused_on_that_connection() {
    let (private, public, port) = apps_on_one_port().await;
    let dns = Dns::default();
    dns.answer(&["127.0.0.2"]);
    let mut settings = serving(&dns);
    settings.interceptor.denied_networks = vec!["127.0.0.1/32".into()];

    // HTTP: the app closes each connection, so each request dials anew.
    let closing = |text: &'static str| {
        move |_request: Request<Incoming>| async move {
            let mut response = Response::new(full(text));
            response
                .headers_mut()
                .insert("connection", "close".parse().unwrap());
            response
        }
    };
    let private = Upstream::serve(private, closing("private"));
    let public = Upstream::serve(public, closing("public"));
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    hoist.spec(&declare_http("shop", "shop.test", port)).await;
    let (status, body) = send(&http1_client(), proxy, "shop.test", "/").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "public"));
    dns.answer(&["127.0.0.1"]);
    let (status, body) = send(&http1_client(), proxy, "shop.test", "/").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!((private.requests(), public.requests()), (0, 1));
    assert_eq!(denied_total(&hoist, "http/default/shop").await, 1);

    // TCP: every client connection is a new upstream connection.
    dns.answer(&["127.0.0.2"]);
    let (tcp_private, tcp_public, tcp_port) = apps_on_one_port().await;
    let private_accepts = tcp_app(tcp_private, "private");
    tcp_app(tcp_public, "public");
    let listen_port = support::free_port();
    let upstream = format!("app:{tcp_port}");
    let listen = listen_port.to_string();
    hoist
        .spec(&object(
            "db",
            &[
                ("scaler", "tcp"),
                ("listenPort", &listen),
                ("upstream", &upstream),
            ],
        ))
        .await;
    let listener: SocketAddr = format!("127.0.0.1:{listen_port}").parse().unwrap();
    assert_eq!(tcp_greeting(listener).await, "public");
    dns.answer(&["127.0.0.1"]);
    assert_eq!(tcp_greeting(listener).await, "", "closed without a byte");
    assert_eq!(denied_total(&hoist, "tcp/default/db").await, 1);
    assert_eq!(*private_accepts.lock().unwrap(), 0);
    hoist.stop().await.unwrap();
}

/// A TCP app that greets each connection with `text`; counts them.
fn tcp_app(listener: TcpListener, text: &'static str) -> Arc<Mutex<usize>> {
    let accepted = Arc::new(Mutex::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            *counted.lock().unwrap() += 1;
            let _ = stream.write_all(text.as_bytes()).await;
        }
    });
    accepted
}

/// What the app behind `listener` says first ("" when it closes).
async fn tcp_greeting(listener: SocketAddr) -> String {
    let mut stream = TcpStream::connect(listener).await.unwrap();
    let mut reply = Vec::new();
    let mut buffer = [0u8; 64];
    loop {
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
            .await
            .expect("an answer or a close")
            .unwrap_or(0);
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&buffer[..read]);
        if reply.len() >= 6 {
            break;
        }
    }
    String::from_utf8_lossy(&reply).into_owned()
}

fn route(name: &str, host: &str, prefix: Option<&str>, upstream: SocketAddr) -> HttpRouteSettings {
    HttpRouteSettings {
        name: name.into(),
        host: host.into(),
        path_prefix: prefix.map(String::from),
        upstream: upstream.to_string(),
        upstream_http2: false,
        cold_start_timeout: None,
        response_timeout: None,
        concurrent_requests: None,
    }
}

/// `/api` to one app, everything else of `shop.test` to another.
async fn api_and_site(edit: impl FnOnce(&mut Settings)) -> (Hoist, Upstream, Upstream) {
    let api = Upstream::start(echo).await;
    let site = Upstream::start(echo).await;
    let mut settings = Settings::default();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = vec![
        route("api", "shop.test", Some("/api"), api.addr),
        route("site", "shop.test", None, site.addr),
    ];
    edit(&mut settings);
    (Hoist::start_with(settings).await, api, site)
}

/// Sends `target` as written (no client library normalises it) and
/// returns the status and body.
async fn raw_get(proxy: SocketAddr, target: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nhost: shop.test\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .unwrap()
        .unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[tokio::test]
async fn dot_segments_cannot_leave_a_path_prefix_and_apps_get_the_normalised_path() {
    let (hoist, api, site) = api_and_site(|_| {}).await;
    let proxy = hoist.http_proxy.unwrap();
    for target in [
        "/api/../admin",
        "/api/%2e%2e/admin",
        "/api/%2E%2E/admin",
        "/api/.%2e/admin",
    ] {
        let (status, body) = raw_get(proxy, target).await;
        assert_eq!(status, 200, "{target}: {body}");
        assert!(body.contains("path=/admin "), "{target}: {body}");
    }
    assert_eq!(api.requests(), 0, "the /api app never saw them");
    assert_eq!(site.requests(), 4);

    let (status, body) = raw_get(proxy, "/api/./orders/%2e%2e/cart?page=../2").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("path=/api/cart?page=../2 "),
        "query kept: {body}"
    );
    // An escaped letter is the letter: this is /api's too.
    let (_, body) = raw_get(proxy, "/%61pi/orders").await;
    assert!(body.contains("path=/api/orders "), "{body}");
    assert_eq!(api.requests(), 2);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn encoded_slashes_and_backslashes_get_400_unless_allowed() {
    let (hoist, api, site) = api_and_site(|_| {}).await;
    let proxy = hoist.http_proxy.unwrap();
    for target in [
        "/api%2F..%2Fadmin",
        "/api/%2fetc",
        "/api%5C..%5Cadmin",
        "/api/%5cx",
        "/api\\..\\admin",
        // A servlet container drops `;x` and resolves the `..` after.
        "/api/..;x=1/admin",
    ] {
        let (status, body) = raw_get(proxy, target).await;
        assert_eq!(status, 400, "{target}: {body}");
    }
    let (_, body) = raw_get(proxy, "/api%2Forders").await;
    assert!(body.contains("interceptor.allow_encoded_slashes"), "{body}");
    assert_eq!(api.requests() + site.requests(), 0);
    hoist.stop().await.unwrap();

    // Allowed, an encoded slash stays encoded and separates nothing.
    let (hoist, api, _site) = api_and_site(|s| s.interceptor.allow_encoded_slashes = true).await;
    let (status, body) = raw_get(hoist.http_proxy.unwrap(), "/api/a%2Fb").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("path=/api/a%2Fb "), "{body}");
    assert_eq!(api.requests(), 1);
    hoist.stop().await.unwrap();
}

/// Says which forwarding headers the app received (all fields of each).
async fn forwarding(request: Request<Incoming>) -> Response<Body> {
    let names = [
        "x-forwarded-for",
        "forwarded",
        "x-real-ip",
        "x-forwarded-proto",
        "x-forwarded-host",
    ];
    let lines: Vec<String> = names
        .iter()
        .map(|name| {
            let values: Vec<&str> = request
                .headers()
                .get_all(*name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            format!("{name}={}", values.join(" | "))
        })
        .collect();
    Response::new(full(lines.join("\n")))
}

async fn spoofed(trusted: &[&str]) -> String {
    let app = Upstream::start(forwarding).await;
    let mut settings = Settings::default();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = vec![route("web", "web.test", None, app.addr)];
    settings.interceptor.trusted_proxies = trusted.iter().map(|t| t.to_string()).collect();
    let hoist = Hoist::start_with(settings).await;
    let request = Request::builder()
        .uri(format!("http://{}/", hoist.http_proxy.unwrap()))
        .header("host", "web.test")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-for", "7.7.7.7")
        .header("forwarded", "for=6.6.6.6;proto=https")
        .header("x-real-ip", "6.6.6.6")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "evil.test")
        .body(full(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    hoist.stop().await.unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
async fn forwarded_headers_from_an_untrusted_peer_are_replaced() {
    let seen = spoofed(&[]).await;
    let expected = [
        "x-forwarded-for=127.0.0.1",
        "forwarded=for=127.0.0.1;proto=http",
        "x-real-ip=127.0.0.1",
        "x-forwarded-proto=http",
        "x-forwarded-host=web.test",
    ];
    assert_eq!(seen, expected.join("\n"));
    // A trusted list the peer is not in changes nothing.
    assert_eq!(spoofed(&["10.0.0.0/8"]).await, expected.join("\n"));
}

#[tokio::test]
async fn forwarded_headers_from_a_trusted_proxy_are_kept_and_appended_to() {
    let seen = spoofed(&["127.0.0.0/8"]).await;
    let expected = [
        "x-forwarded-for=6.6.6.6, 7.7.7.7, 127.0.0.1",
        "forwarded=for=6.6.6.6;proto=https, for=127.0.0.1;proto=http",
        "x-real-ip=6.6.6.6",
        "x-forwarded-proto=https",
        "x-forwarded-host=evil.test",
    ];
    assert_eq!(seen, expected.join("\n"));
}

#[tokio::test]
async fn http2_host_must_match_the_authority() {
    let app = Upstream::start(echo).await;
    let mut settings = Settings::default();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = vec![
        route("web", "web.test", None, app.addr),
        route("other", "other.test", None, app.addr),
    ];
    let hoist = Hoist::start_with(settings).await;
    let client = h2c_client(hoist.http_proxy.unwrap());
    let ask = |host: Option<&'static str>| {
        let client = client.clone();
        async move {
            let mut request = Request::builder().uri("http://web.test/");
            if let Some(host) = host {
                request = request.header("host", host);
            }
            let response = client
                .request(request.body(full("")).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, body) = ask(Some("other.test")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains(":authority"), "{body}");
    for host in [None, Some("web.test"), Some("WEB.test")] {
        let (status, body) = ask(host).await;
        assert_eq!(status, StatusCode::OK, "{host:?}: {body}");
        assert!(body.contains("version=HTTP/1.1"), "{body}");
    }
    assert_eq!(app.requests(), 3);
    hoist.stop().await.unwrap();
}
