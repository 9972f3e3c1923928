//! The admin port's callers (issue 21, item 7): `/healthz`, `/readyz` and
//! `/metrics` are open; the reports (`/status`, `/routes/table`,
//! `/interceptor/*`) want a client certificate or a ServiceAccount token
//! that the Kubernetes API (the fake one, serving TokenReview) vouches for
//! and `admin.auth.allowed_callers` names. Real hoist servers, split
//! interceptors and HTTP clients on loopback.

#[path = "support/kube_api.rs"]
mod kube_api;
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use hoist::config::{Require, Settings, TlsSettings};
use kube_api::FakeApi;
use support::certs::{Authority, write};
use support::web::{Upstream, echo, http1_client, send};
use support::{Hoist, eventually, free_port, object};

const PATIENCE: Duration = Duration::from_secs(10);
const INTERCEPTOR_SA: &str = "system:serviceaccount:hoist:hoist-interceptor";
const SCALER_SA: &str = "system:serviceaccount:hoist:hoist";
const TENANT_SA: &str = "system:serviceaccount:team-a:app";

/// A scaler with an in-process interceptor (so `/routes/table` is served),
/// whose reports want an interceptor's token.
fn scaler(api: &FakeApi) -> Settings {
    let mut settings = Settings::default();
    settings.kubernetes.kubeconfig = Some(api.kubeconfig());
    settings.interceptor.enabled = true;
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    // The tests' apps are on loopback.
    settings.interceptor.denied_networks = Vec::new();
    // Loopback is all a test may listen on: ask for callers explicitly.
    settings.admin.auth.require = Require::Always;
    settings.admin.auth.allowed_callers = vec![INTERCEPTOR_SA.into()];
    settings
}

async fn get(admin: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(format!("http://{admin}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test]
async fn reports_need_an_allowed_service_accounts_token_and_probes_stay_open() {
    let api = FakeApi::start().await;
    api.add_token("interceptor-token", INTERCEPTOR_SA, &[]);
    api.add_token("tenant-token", TENANT_SA, &[]);
    let hoist = Hoist::start_with(scaler(&api)).await;

    for path in [
        "/status",
        "/routes/table",
        "/interceptor/routes",
        "/interceptor/services",
    ] {
        let (status, body) = get(hoist.admin, path, None).await;
        assert_eq!(status, 401, "{path} without credentials: {body}");
        assert!(body.contains("Authorization: Bearer"), "{body}");
        let (status, body) = get(hoist.admin, path, Some("not-a-token")).await;
        assert_eq!(status, 401, "{path} with a bad token: {body}");
        let (status, body) = get(hoist.admin, path, Some("tenant-token")).await;
        assert_eq!(status, 403, "{path} of another ServiceAccount: {body}");
        assert!(body.contains(TENANT_SA), "{body}");
        let (status, body) = get(hoist.admin, path, Some("interceptor-token")).await;
        assert_eq!(status, 200, "{path} with the interceptor's token: {body}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, body) = get(hoist.admin, path, None).await;
        assert_eq!(status, 200, "{path} is open: {body}");
    }

    // Answers are reused: a follower polling every second costs no review
    // per poll.
    let before = api.token_reviews();
    for _ in 0..5 {
        assert_eq!(
            get(hoist.admin, "/status", Some("interceptor-token"))
                .await
                .0,
            200
        );
    }
    assert_eq!(api.token_reviews(), before, "cached answers");

    // The API down: a token it has not vouched for yet is neither let in
    // nor called bad.
    api.add_token("fresh-token", INTERCEPTOR_SA, &[]);
    api.set_down(true);
    let (status, body) = get(hoist.admin, "/status", Some("fresh-token")).await;
    assert_eq!(status, 503, "{body}");
    assert!(!body.contains("fresh-token"), "{body}");
    let (status, _) = get(hoist.admin, "/healthz", None).await;
    assert_eq!(status, 200);
    api.set_down(false);
    let (status, body) = get(hoist.admin, "/status", Some("fresh-token")).await;
    assert_eq!(status, 200, "{body}");
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_namespace_pattern_and_audiences_are_honoured() {
    let api = FakeApi::start().await;
    api.add_token(
        "monitoring-token",
        "system:serviceaccount:monitoring:prom",
        &["hoist"],
    );
    api.add_token(
        "api-audience-token",
        "system:serviceaccount:monitoring:prom",
        &[],
    );
    api.add_token(
        "lookalike-token",
        "system:serviceaccount:monitoring-x:prom",
        &["hoist"],
    );
    let mut settings = scaler(&api);
    settings.admin.auth.allowed_callers = vec!["system:serviceaccount:monitoring:*".into()];
    settings.admin.auth.audiences = vec!["hoist".into()];
    let hoist = Hoist::start_with(settings).await;

    assert_eq!(
        get(hoist.admin, "/status", Some("monitoring-token"))
            .await
            .0,
        200
    );
    let (status, body) = get(hoist.admin, "/status", Some("api-audience-token")).await;
    assert_eq!(
        status, 401,
        "a token for the API server is not one for hoist: {body}"
    );
    assert_eq!(
        get(hoist.admin, "/status", Some("lookalike-token")).await.0,
        403
    );
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn an_exposed_port_without_a_way_to_authenticate_serves_no_reports() {
    let mut settings = Settings::default();
    settings.admin.auth.require = Require::Always;
    let hoist = Hoist::start_with(settings).await;
    let (status, body) = get(hoist.admin, "/status", Some("anything")).await;
    assert_eq!(status, 401);
    assert!(body.contains("admin.auth.allowed_callers"), "{body}");
    assert_eq!(get(hoist.admin, "/metrics", None).await.0, 200);
    hoist.stop().await.unwrap();
}

#[tokio::test]
async fn a_loopback_admin_port_is_open_by_default() {
    let hoist = Hoist::start().await;
    assert_eq!(get(hoist.admin, "/status", None).await.0, 200);
    hoist.stop().await.unwrap();
}

/// A split interceptor follows the scaler's table with the token in its
/// token file, read again at every request; the scaler reads the
/// interceptor's counts with its own token.
#[tokio::test]
async fn split_interceptors_and_the_scaler_present_their_tokens() {
    let api = FakeApi::start().await;
    api.add_token("interceptor-token", INTERCEPTOR_SA, &[]);
    api.add_token("scaler-token", SCALER_SA, &[]);
    api.add_token("tenant-token", TENANT_SA, &[]);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("interceptor-token");
    std::fs::write(&token_file, "tenant-token\n").unwrap();
    let scaler_admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();

    let mut settings = Settings::default();
    settings.kubernetes.kubeconfig = Some(api.kubeconfig());
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.scaler = Some(scaler_admin.to_string());
    // The follower checks the table against its own rules.
    settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    settings.interceptor.denied_networks = Vec::new();
    settings.admin.auth.token_file = token_file.clone();
    settings.admin.auth.require = Require::Always;
    settings.admin.auth.allowed_callers = vec![SCALER_SA.into()];
    let interceptor = Hoist::start_interceptor(settings).await;

    let mut settings = scaler(&api);
    settings.interceptor.enabled = false;
    settings.admin.listen = scaler_admin;
    settings.admin.auth.token_file = dir.path().join("scaler-token");
    std::fs::write(&settings.admin.auth.token_file, "scaler-token").unwrap();
    settings.interceptor.endpoints = vec![interceptor.admin.to_string()];
    let upstream = Upstream::start(echo).await;
    let shop = object(
        "shop",
        &[
            ("scaler", "http"),
            ("host", "shop.test"),
            ("upstream", &upstream.addr.to_string()),
        ],
    );
    // The scaler reads the cluster: the route is its ScaledObject's.
    api.put_scaled_object(
        "default",
        "shop",
        kube_api::with_triggers(
            serde_json::json!({"scaleTargetRef": {"name": "shop"}}),
            &[&shop],
        ),
    );
    let scaler = Hoist::start_with(settings).await;
    scaler.spec(&shop).await;

    // The interceptor's file holds a tenant's token: refused, and said so.
    let following = |admin: SocketAddr| async move {
        let (status, body) = get(admin, "/interceptor/table", Some("scaler-token")).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["following"].clone()
    };
    eventually(PATIENCE, "the follower to report the 403", || async {
        following(interceptor.admin).await["error"]
            .as_str()
            .is_some_and(|error| error.contains("403"))
    })
    .await;
    // kubelet writes the right token: the next request carries it.
    std::fs::write(&token_file, "interceptor-token").unwrap();
    let proxy = interceptor.http_proxy.unwrap();
    eventually(PATIENCE, "the interceptor to serve the route", || async {
        send(&http1_client(), proxy, "shop.test", "/").await.0 == http::StatusCode::OK
    })
    .await;
    assert_eq!(following(interceptor.admin).await["routes"], 1);

    // Its own reports want the scaler's token, which the scaler sends.
    assert_eq!(
        get(interceptor.admin, "/interceptor/routes", None).await.0,
        401
    );
    eventually(PATIENCE, "the scaler to read the interceptor", || async {
        scaler.metric(&shop).await.is_ok()
    })
    .await;
    scaler.stop().await.unwrap();
    interceptor.stop().await.unwrap();
}

fn tls(dir: &Path, server: &Authority, clients: &Authority) -> TlsSettings {
    let (cert, key) = server.issue("localhost");
    TlsSettings {
        cert_file: write(dir, "admin.crt", &cert),
        key_file: write(dir, "admin.key", &key),
        client_ca_file: Some(write(dir, "clients.crt", &clients.pem)),
        reload_every: Duration::from_secs(10),
    }
}

/// mTLS (a client CA) asks the reports' callers for a certificate, even on
/// loopback, and leaves the probes and metrics to clients without one.
#[tokio::test]
async fn a_client_certificate_reads_reports_and_probes_need_none() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, clients) = (Authority::new("admin CA"), Authority::new("client CA"));
    let mut settings = Settings::default();
    settings.admin.tls = Some(tls(dir.path(), &servers, &clients));
    let hoist = Hoist::start_with(settings).await;

    let client = |identity: Option<(String, String)>| {
        let mut builder = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(servers.pem.as_bytes()).unwrap()])
            .resolve("localhost", hoist.admin);
        if let Some((cert, key)) = identity {
            builder = builder
                .identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
        }
        builder.build().unwrap()
    };
    let url = |path: &str| format!("https://localhost:{}{path}", hoist.admin.port());
    let anonymous = client(None);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let status = anonymous.get(url(path)).send().await.unwrap().status();
        assert_eq!(status, 200, "{path}");
    }
    let answer = anonymous.get(url("/status")).send().await.unwrap();
    assert_eq!(answer.status(), 401);
    assert!(answer.text().await.unwrap().contains("client certificate"));

    let operator = client(Some(clients.issue("operator")));
    let status = operator.get(url("/status")).send().await.unwrap().status();
    assert_eq!(status, 200);

    let impostor = client(Some(Authority::new("impostor CA").issue("operator")));
    assert!(
        impostor.get(url("/status")).send().await.is_err(),
        "unknown CA: no handshake"
    );
    hoist.stop().await.unwrap();
}

/// Tokens cannot be checked without Kubernetes access: they are refused
/// (never believed), the reason is given, and KEDA's gRPC is served on.
#[tokio::test]
async fn without_kubernetes_access_tokens_are_refused_with_the_reason() {
    let mut settings = Settings::default();
    settings.kubernetes.enabled = hoist::config::KubernetesAccess::Off;
    settings.admin.auth.require = Require::Always;
    settings.admin.auth.allowed_callers = vec![INTERCEPTOR_SA.into()];
    let hoist = Hoist::start_with(settings).await;
    let (status, body) = get(hoist.admin, "/status", Some("interceptor-token")).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("kubernetes.enabled = false"), "{body}");
    assert_eq!(get(hoist.admin, "/readyz", None).await.0, 200);
    hoist.stop().await.unwrap();
}
