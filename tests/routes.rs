//! Routes that come with the app: a ScaledObject's `http`/`tcp` trigger
//! declares its route (`upstream`, `host`, `listenPort`), hoist checks it
//! against its rules and other routes, serves it at once, keeps it across
//! restarts, and hands it to interceptors in their own Deployment. Real
//! upstreams, clients and hoist servers on loopback.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use hoist::config::Settings;
use hoist::interceptor::report::RoutesReport;
use http::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;

use support::web::{AppPort, Upstream, echo, http1_client, send};
use support::{Hoist, eventually, free_port, object};

/// How long a test waits for what should happen within a second.
const PATIENCE: Duration = Duration::from_secs(10);

/// hoist serve with an in-process interceptor and no config routes; the
/// tests' upstreams are on loopback, which the rules must allow.
fn in_process() -> Settings {
    let mut settings = Settings::default();
    // Tests without a cluster: callers are trusted (grpc.trust_callers),
    // and any host may be routed.
    settings.grpc.trust_callers = true;
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    settings.interceptor.enabled = true;
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    // Loopback is denied by default (tests/edge.rs tests the fence).
    settings.interceptor.denied_networks = vec![];
    settings
}

fn http_trigger(host: &str, upstream: SocketAddr) -> Vec<(&'static str, String)> {
    vec![
        ("scaler", "http".into()),
        ("host", host.into()),
        ("upstream", upstream.to_string()),
    ]
}

fn declare(name: &str, metadata: &[(&str, String)]) -> hoist::proto::ScaledObjectRef {
    let pairs: Vec<(&str, &str)> = metadata.iter().map(|(k, v)| (*k, v.as_str())).collect();
    object(name, &pairs)
}

async fn table(admin: SocketAddr) -> Value {
    let (status, body) = support::http_get(admin, "/interceptor/table").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The `routes` section of the scaler's `/status`.
async fn status_routes(hoist: &Hoist) -> Value {
    let (status, body) = hoist.get("/status").await;
    assert_eq!(status, 200, "{body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    status["routes"].clone()
}

async fn loads(admin: SocketAddr) -> RoutesReport {
    let (status, body) = support::http_get(admin, "/interceptor/routes").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// An upstream that echoes TCP bytes back, prefixed.
async fn tcp_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 64];
                while let Ok(n) = stream.read(&mut buffer).await {
                    if n == 0 {
                        return;
                    }
                    let mut reply = b"tcp:".to_vec();
                    reply.extend_from_slice(&buffer[..n]);
                    if stream.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn tcp_round_trip(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(b"ping").await.ok()?;
    let mut reply = [0u8; 8];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut reply))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&reply).into_owned())
}

#[tokio::test]
async fn a_declared_route_serves_at_once_and_holds_through_a_cold_start() {
    let hoist = Hoist::start_with(in_process()).await;
    let proxy = hoist.http_proxy.expect("the HTTP proxy listens");
    let app = AppPort::reserve();
    let upstream_addr = app.addr;
    // Before any ScaledObject declares it, the host is unknown.
    let (status, _) = send(&http1_client(), proxy, "shop.test", "/").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let scaled = declare(
        "shop",
        &[
            http_trigger("shop.test, www.shop.test", upstream_addr),
            vec![("pathPrefix", "/api".into())],
        ]
        .concat(),
    );
    let spec = hoist.spec(&scaled).await;
    assert_eq!(spec.target_size, 10, "the default concurrentRequests");
    let routes = table(hoist.admin).await;
    let route = &routes["routes"][0];
    assert_eq!(route["name"], "http/default/shop");
    assert_eq!(route["owner"]["namespace"], "default");
    assert_eq!(
        route["hosts"],
        serde_json::json!(["shop.test", "www.shop.test"])
    );

    // The app is at zero: the request is held, KEDA is told, and the
    // request goes through once the app listens.
    let request =
        tokio::spawn(
            async move { send(&http1_client(), proxy, "www.shop.test", "/api/cart").await },
        );
    eventually(PATIENCE, "the request to be held", || async {
        loads(hoist.admin).await.routes["http/default/shop"]
            .load
            .held
            == 1
    })
    .await;
    assert!(
        hoist.active(&scaled).await.unwrap(),
        "a held request activates"
    );
    let listener = app.listen();
    let upstream = Upstream::serve(listener, echo);
    let (status, body) = request.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("host=www.shop.test") && body.contains("path=/api/cart"),
        "{body}"
    );
    // Outside the path prefix, the route does not take the request.
    let (status, _) = send(&http1_client(), proxy, "shop.test", "/other").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(upstream.requests(), 1);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_declared_tcp_route_listens_on_its_port() {
    let hoist = Hoist::start_with(in_process()).await;
    let upstream = tcp_echo().await;
    let port = free_port();
    let scaled = declare(
        "db",
        &[
            ("scaler", "tcp".into()),
            ("listenPort", port.to_string()),
            ("upstream", upstream.to_string()),
        ],
    );
    hoist.spec(&scaled).await;
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(tcp_round_trip(listen).await.as_deref(), Some("tcp:ping"));
    eventually(PATIENCE, "the connection to be counted", || async {
        loads(hoist.admin).await.routes["tcp/default/db"]
            .load
            .started_total
            == 1
    })
    .await;
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_claim_is_first_come_and_an_edit_moves_it_in_one_step() {
    let hoist = Hoist::start_with(in_process()).await;
    let proxy = hoist.http_proxy.unwrap();
    let first = Upstream::start(echo).await;
    let second =
        Upstream::start(|_| async { http::Response::new(support::web::full("second")) }).await;
    let owner = declare("web", &http_trigger("web.test", first.addr));
    hoist.spec(&owner).await;

    // Another ScaledObject cannot take the host, nor the TCP port.
    let thief = declare("thief", &http_trigger("WEB.test", second.addr));
    let refused = hoist.spec_refused(&thief).await;
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("host `web.test` is already routed by ScaledObject default/web"),
        "{}",
        refused.message()
    );
    // Nor a path under it: a host is one owner's.
    let carver = declare(
        "carver",
        &[
            http_trigger("web.test", second.addr),
            vec![("pathPrefix", "/admin".into())],
        ]
        .concat(),
    );
    let refused = hoist.spec_refused(&carver).await;
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("ScaledObject default/web"),
        "{}",
        refused.message()
    );
    let port = free_port();
    let tcp = |name: &str| {
        declare(
            name,
            &[
                ("scaler", "tcp".into()),
                ("listenPort", port.to_string()),
                ("upstream", first.addr.to_string()),
            ],
        )
    };
    hoist.spec(&tcp("tcp-owner")).await;
    let refused = hoist.spec_refused(&tcp("tcp-thief")).await;
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains(&format!(
            "TCP port {port} is already routed by ScaledObject default/tcp-owner"
        )),
        "{}",
        refused.message()
    );
    // Nor hoist's own ports.
    let admin = declare(
        "admin-thief",
        &[
            ("scaler", "tcp".into()),
            ("listenPort", hoist.admin.port().to_string()),
            ("upstream", first.addr.to_string()),
        ],
    );
    let refused = hoist.spec_refused(&admin).await;
    assert!(
        refused.message().contains("hoist itself (admin.listen)"),
        "{}",
        refused.message()
    );

    // The owner's metadata is edited (new upstream): the route moves.
    let edited = declare("web", &http_trigger("web.test", second.addr));
    hoist.spec(&edited).await;
    let (status, body) = send(&http1_client(), proxy, "web.test", "/").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "second"));
    let routes = table(hoist.admin).await;
    let web: Vec<&Value> = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|route| route["name"] == "http/default/web")
        .collect();
    assert_eq!(web.len(), 1);
    assert_eq!(web[0]["upstream"], second.addr.to_string());
    // The old metadata asked again (the edit undone) takes it back.
    hoist.spec(&owner).await;
    let (_, body) = send(&http1_client(), proxy, "web.test", "/").await;
    assert!(body.starts_with("host=web.test"), "{body}");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn upstreams_hosts_and_ports_are_limited_by_the_rules() {
    let mut settings = Settings::default();
    // Tests without a cluster: callers are trusted (grpc.trust_callers),
    // and any host may be routed.
    settings.grpc.trust_callers = true;
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    settings.interceptor.enabled = true;
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.allowed_hosts = [(
        "*".to_string(),
        vec!["*.{namespace}.example.com".to_string()],
    )]
    .into();
    let hoist = Hoist::start_with(settings).await;
    let refused = |metadata: Vec<(&'static str, String)>| {
        let hoist = &hoist;
        async move { hoist.spec_refused(&declare("app", &metadata)).await }
    };
    // By default a route reaches its own namespace's Services only.
    let denied = refused(vec![
        ("scaler", "http".into()),
        ("host", "app.default.example.com".into()),
        ("upstream", "db.payments:5432".into()),
    ])
    .await;
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied.message().contains("`upstream`"),
        "{}",
        denied.message()
    );
    assert!(
        denied
            .message()
            .contains("db.payments.svc.cluster.local:5432"),
        "{}",
        denied.message()
    );
    assert!(
        denied.message().contains("interceptor.allowed_upstreams"),
        "{}",
        denied.message()
    );
    let denied = refused(vec![
        ("scaler", "http".into()),
        ("host", "10.0.0.1".into()),
        ("upstream", "127.0.0.1:80".into()),
    ])
    .await;
    assert_eq!(denied.code(), Code::PermissionDenied);
    // A host outside the namespace's patterns.
    let denied = refused(vec![
        ("scaler", "http".into()),
        ("host", "app.payments.example.com".into()),
        ("upstream", "web:80".into()),
    ])
    .await;
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied.message().contains("`host`")
            && denied.message().contains("interceptor.allowed_hosts"),
        "{}",
        denied.message()
    );
    // A privileged port.
    let denied = refused(vec![
        ("scaler", "tcp".into()),
        ("listenPort", "22".into()),
        ("upstream", "ssh:22".into()),
    ])
    .await;
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied
            .message()
            .contains("interceptor.allowed_listen_ports"),
        "{}",
        denied.message()
    );

    // Within the rules: a bare `service:port` is the namespace's Service.
    hoist
        .spec(&declare(
            "app",
            &[
                ("scaler", "http".into()),
                ("host", "app.default.example.com".into()),
                ("upstream", "web:8080".into()),
            ],
        ))
        .await;
    let routes = table(hoist.admin).await;
    assert_eq!(
        routes["routes"][0]["upstream"],
        "web.default.svc.cluster.local:8080"
    );
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn bad_route_keys_are_refused_naming_the_key() {
    let hoist = Hoist::start_with(in_process()).await;
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("scaler", "http"), ("upstream", "web:80")], "host"),
        (
            vec![("scaler", "http"), ("host", "a.test"), ("upstream", "web")],
            "upstream",
        ),
        (
            vec![
                ("scaler", "http"),
                ("host", "a.test:80"),
                ("upstream", "web:80"),
            ],
            "host",
        ),
        (
            vec![
                ("scaler", "http"),
                ("host", "a.test"),
                ("upstream", "web:80"),
                ("pathPrefix", "api"),
            ],
            "pathPrefix",
        ),
        (
            vec![
                ("scaler", "http"),
                ("host", "a.test"),
                ("upstream", "web:80"),
                ("coldStartTimeout", "forever"),
            ],
            "coldStartTimeout",
        ),
        (
            vec![
                ("scaler", "http"),
                ("host", "a.test"),
                ("upstream", "web:80"),
                ("route", "web"),
            ],
            "route",
        ),
        (
            vec![
                ("scaler", "http"),
                ("host", "a.test"),
                ("upstream", "web:80"),
                ("listenPort", "9000"),
            ],
            "listenPort",
        ),
        (
            vec![("scaler", "tcp"), ("upstream", "db:5432")],
            "listenPort",
        ),
        (
            vec![
                ("scaler", "tcp"),
                ("listenPort", "0"),
                ("upstream", "db:5432"),
            ],
            "listenPort",
        ),
        (
            vec![("scaler", "http"), ("route", "web"), ("pathPrefix", "/api")],
            "pathPrefix",
        ),
    ];
    for (metadata, key) in cases {
        let status = hoist.spec_refused(&object("bad", &metadata)).await;
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{metadata:?}: {status:?}"
        );
        assert!(
            status.message().contains(&format!("`{key}`")),
            "{metadata:?}: {}",
            status.message()
        );
    }
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_serves_saved_routes_at_once_and_keeps_their_claims() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = in_process();
    settings.state_file = Some(dir.path().join("state.json"));
    let upstream = Upstream::start(echo).await;
    let first = Hoist::start_with(settings.clone()).await;
    first
        .spec(&declare("shop", &http_trigger("shop.test", upstream.addr)))
        .await;
    let routes = status_routes(&first).await;
    assert_eq!(
        routes["settling"], true,
        "nothing was saved before: {routes}"
    );
    assert_eq!(
        routes["declared"][0]["name"], "http/default/shop",
        "{routes}"
    );
    assert_eq!(routes["declared"][0]["owner"], "default/shop", "{routes}");
    assert_eq!(routes["declared"][0]["triggers"], 1, "{routes}");
    first.stop().await.unwrap();

    let second = Hoist::start_with(settings).await;
    // Saved and not declared again yet. The first run saved it while it
    // settled (within idle_after of its start): this run settles too.
    let routes = status_routes(&second).await;
    assert_eq!(routes["settling"], true, "{routes}");
    assert_eq!(routes["declared"][0]["triggers"], 0, "{routes}");
    assert!(
        routes["declared"][0]["undeclaredForSeconds"].is_number(),
        "{routes}"
    );
    // No trigger has been asked about yet: the saved route serves.
    let (status, body) = send(
        &http1_client(),
        second.http_proxy.unwrap(),
        "shop.test",
        "/",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The first claim keeps winning after the restart.
    let refused = second
        .spec_refused(&declare("thief", &http_trigger("shop.test", upstream.addr)))
        .await;
    assert!(
        refused.message().contains("ScaledObject default/shop"),
        "{}",
        refused.message()
    );
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_route_goes_with_its_scaled_object_and_held_requests_get_503() {
    let mut settings = in_process();
    settings.polling.idle_after = Duration::from_secs(1);
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();
    let app = AppPort::reserve(); // never comes up
    let scaled = declare("gone", &http_trigger("gone.test", app.addr));
    hoist.spec(&scaled).await;
    let request = tokio::spawn(async move { send(&http1_client(), proxy, "gone.test", "/").await });
    // KEDA stops asking: the trigger is dropped, and its route with it.
    let (status, body) = tokio::time::timeout(PATIENCE, request)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("was removed"), "{body}");
    let (status, _) = send(&http1_client(), proxy, "gone.test", "/").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    hoist.stop().await.unwrap();
}

/// Two interceptors in their own Deployment follow the scaler's table.
#[tokio::test]
async fn split_interceptors_learn_a_new_route_and_keep_it_while_the_scaler_is_away_or_settling() {
    let scaler_admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut interceptors = Vec::new();
    for _ in 0..2 {
        let mut settings = Settings::default();
        // Tests without a cluster: callers are trusted (grpc.trust_callers),
        // and any host may be routed.
        settings.grpc.trust_callers = true;
        settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
        settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
        // A follower checks the table against its own rules.
        settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
        settings.interceptor.scaler = Some(scaler_admin.to_string());
        settings.interceptor.denied_networks = vec![];
        interceptors.push(Hoist::start_interceptor(settings).await);
    }
    let mut scaler = Settings::default();
    // Tests without a cluster: callers are trusted (grpc.trust_callers),
    // and any host may be routed.
    scaler.grpc.trust_callers = true;
    scaler.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    scaler.admin.listen = scaler_admin;
    scaler.interceptor.endpoints = interceptors.iter().map(|i| i.admin.to_string()).collect();
    scaler.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    let scaler_settings = scaler.clone();
    let scaler = Hoist::start_with(scaler).await;
    let upstream = Upstream::start(echo).await;

    scaler
        .spec(&declare("shop", &http_trigger("shop.test", upstream.addr)))
        .await;
    for interceptor in &interceptors {
        let proxy = interceptor.http_proxy.unwrap();
        eventually(
            PATIENCE,
            "the interceptor to serve the new route",
            || async { send(&http1_client(), proxy, "shop.test", "/").await.0 == StatusCode::OK },
        )
        .await;
        let table = table(interceptor.admin).await;
        assert_eq!(table["following"]["routes"], 1, "{table}");
    }
    // The scaler reads the traffic from both.
    eventually(
        PATIENCE,
        "the scaler to see both interceptors' requests",
        || async {
            let started: u64 =
                futures::future::join_all(interceptors.iter().map(|i| loads(i.admin)))
                    .await
                    .iter()
                    .map(|report| report.routes["http/default/shop"].load.started_total)
                    .sum();
            started >= 2
        },
    )
    .await;

    // The scaler goes away: the interceptors keep routing.
    scaler.stop().await.unwrap();
    for interceptor in &interceptors {
        eventually(
            PATIENCE,
            "the interceptor to notice the scaler is gone",
            || async { table(interceptor.admin).await["following"]["error"].is_string() },
        )
        .await;
        let (status, _) = send(
            &http1_client(),
            interceptor.http_proxy.unwrap(),
            "shop.test",
            "/",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }

    // It comes back without its routes (no state file): while it settles,
    // the interceptors keep the route it lacks, beside the ones it is told.
    let mut restarted = scaler_settings;
    // Long enough for what follows to happen while it settles, on a
    // loaded machine too.
    restarted.polling.idle_after = Duration::from_secs(15);
    let scaler = Hoist::start_with(restarted).await;
    for interceptor in &interceptors {
        eventually(
            PATIENCE,
            "the interceptor to follow the new run, carrying the route",
            || async {
                let following = &table(interceptor.admin).await["following"];
                following["error"].is_null() && following["carried"] == 1
            },
        )
        .await;
    }
    let cart = Upstream::start(echo).await;
    scaler
        .spec(&declare("cart", &http_trigger("cart.test", cart.addr)))
        .await;
    for interceptor in &interceptors {
        let proxy = interceptor.http_proxy.unwrap();
        eventually(PATIENCE, "the new run's route to serve", || async {
            send(&http1_client(), proxy, "cart.test", "/").await.0 == StatusCode::OK
        })
        .await;
        let (status, body) = send(&http1_client(), proxy, "shop.test", "/").await;
        assert_eq!(status, StatusCode::OK, "the carried route serves: {body}");
        let following = &table(interceptor.admin).await["following"];
        assert_eq!(following["settling"], true, "{following}");
    }

    // Settled (`idle_after` later) without shop declared again: it goes.
    for interceptor in &interceptors {
        let proxy = interceptor.http_proxy.unwrap();
        eventually(
            PATIENCE * 3,
            "the carried route to go when the scaler settles",
            || async {
                send(&http1_client(), proxy, "shop.test", "/").await.0 == StatusCode::NOT_FOUND
            },
        )
        .await;
        let following = &table(interceptor.admin).await["following"];
        assert_eq!(
            (&following["settling"], &following["carried"]),
            (&Value::Bool(false), &Value::from(0)),
            "{following}"
        );
    }
    scaler.stop().await.unwrap();
}
