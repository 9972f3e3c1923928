//! The split setup over mTLS: a real `hoist interceptor` whose admin port
//! wants client certificates, read by a real scaler with
//! `interceptor.tls`, on loopback, with certificates made in the test. The
//! interceptor's certificate names its Service, not the address the scaler
//! dials, as with pod IPs behind a headless Service.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use hoist::config::Settings;
use hoist::config::{ClientTlsSettings, TlsSettings};
use hoist::proto::ScaledObjectRef;
use support::certs::{Authority, write};
use support::{Hoist, eventually, object};

const SERVICE: &str = "hoist-interceptor.hoist.svc";

/// The CAs of one cluster: one signs the interceptors' serving
/// certificates, one the scalers' client certificates.
struct Cluster {
    servers: Authority,
    clients: Authority,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Self {
        Self {
            servers: Authority::new("interceptor serving CA"),
            clients: Authority::new("channel client CA"),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// An interceptor with one HTTP route to a real upstream, its admin
    /// port serving `SERVICE`'s certificate and requiring a client
    /// certificate from `clients`.
    async fn interceptor(&self, upstream: SocketAddr) -> Hoist {
        let (cert, key) = self.servers.issue(SERVICE);
        let mut settings = Settings::default();
        // Tests without a cluster: callers are trusted (grpc.trust_callers),
        // and any host may be routed.
        settings.grpc.trust_callers = true;
        settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
        settings.admin.tls = Some(TlsSettings {
            cert_file: write(self.path(), "interceptor.crt", &cert),
            key_file: write(self.path(), "interceptor.key", &key),
            client_ca_file: Some(write(self.path(), "clients-ca.crt", &self.clients.pem)),
            reload_every: Duration::from_secs(10),
        });
        settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
        settings.interceptor.http_routes =
            vec![support::web::http_route("web", "web.test", upstream)];
        Hoist::start_interceptor(settings).await
    }

    /// `[interceptor.tls]` trusting `servers`, with a client certificate
    /// from `clients`, checking for `SERVICE`.
    fn channel(&self, name: &str) -> ClientTlsSettings {
        let (cert, key) = self.clients.issue("hoist-scaler");
        ClientTlsSettings {
            ca_file: write(self.path(), "servers-ca.crt", &self.servers.pem),
            cert_file: Some(write(self.path(), &format!("{name}.crt"), &cert)),
            key_file: Some(write(self.path(), &format!("{name}.key"), &key)),
            server_name: Some(SERVICE.into()),
            reload_every: Duration::from_secs(10),
        }
    }
}

/// A scaler reading `interceptor` (dialled at 127.0.0.1) with `tls`.
async fn scaler(interceptor: &Hoist, tls: ClientTlsSettings) -> Hoist {
    let mut settings = Settings::default();
    // Tests without a cluster: callers are trusted (grpc.trust_callers),
    // and any host may be routed.
    settings.grpc.trust_callers = true;
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    settings.interceptor.endpoints = vec![interceptor.admin.to_string()];
    settings.interceptor.read_timeout = Duration::from_secs(2);
    settings.interceptor.tls = Some(tls);
    Hoist::start_with(settings).await
}

/// A real HTTP app that answers every request.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(|| async { "hello" });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn send_through(interceptor: &Hoist, requests: usize) {
    let client = reqwest::Client::new();
    for _ in 0..requests {
        let answer = client
            .get(format!("http://{}/", interceptor.http_proxy.unwrap()))
            .header("host", "web.test")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
}

fn rate() -> ScaledObjectRef {
    object(
        "web-app",
        &[
            ("scaler", "http"),
            ("route", "web"),
            ("pollingInterval", "1"),
        ],
    )
}

/// The scaler's reading must fail: the message, for the test to check.
async fn refused(scaler: &Hoist) -> String {
    let status = scaler
        .metric(&rate())
        .await
        .expect_err("no reading without a working channel");
    status.message().to_string()
}

#[tokio::test]
async fn a_scaler_reads_an_mtls_interceptor_dialled_by_ip_under_its_service_name() {
    let cluster = Cluster::new();
    let interceptor = cluster.interceptor(upstream().await).await;
    let scaler = scaler(&interceptor, cluster.channel("scaler")).await;

    send_through(&interceptor, 3).await;
    // 3 requests in the 15 s window.
    let (_, value) = scaler.metric(&rate()).await.unwrap();
    assert!((value - 3.0 / 15.0).abs() < 1e-9, "{value}");

    // The admin port itself refuses a reader without a client certificate:
    // its reports answer 401 (the handshake succeeds, so that probes and
    // Prometheus reach /healthz, /readyz and /metrics).
    let anonymous = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(cluster.servers.pem.as_bytes()).unwrap()])
        .resolve(SERVICE, interceptor.admin)
        .build()
        .unwrap()
        .get(format!(
            "https://{SERVICE}:{}/interceptor/routes",
            interceptor.admin.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    scaler.stop().await.unwrap();
}

#[tokio::test]
async fn a_scaler_without_the_right_certificates_gets_no_reading_and_says_why() {
    let cluster = Cluster::new();
    let interceptor = cluster.interceptor(upstream().await).await;
    send_through(&interceptor, 1).await;

    let mut anonymous = cluster.channel("anonymous");
    anonymous.cert_file = None;
    anonymous.key_file = None;
    let scaler_without_cert = scaler(&interceptor, anonymous).await;
    let message = refused(&scaler_without_cert).await;
    assert!(
        message.contains(&interceptor.admin.to_string()) && message.contains("401 Unauthorized"),
        "{message}"
    );

    let mut impostor = cluster.channel("impostor");
    let (cert, key) = Authority::new("impostor CA").issue("hoist-scaler");
    impostor.cert_file = Some(write(cluster.path(), "impostor.crt", &cert));
    impostor.key_file = Some(write(cluster.path(), "impostor.key", &key));
    let scaler_with_impostor = scaler(&interceptor, impostor).await;
    let message = refused(&scaler_with_impostor).await;
    assert!(message.contains("UnknownCA"), "{message}");
    assert!(!message.contains(key.lines().nth(1).unwrap()), "{message}");

    let mut distrusting = cluster.channel("distrusting");
    distrusting.ca_file = write(
        cluster.path(),
        "other-ca.crt",
        &Authority::new("another CA").pem,
    );
    let scaler_trusting_another_ca = scaler(&interceptor, distrusting).await;
    let message = refused(&scaler_trusting_another_ca).await;
    assert!(message.contains("invalid peer certificate"), "{message}");
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn without_server_name_the_dialled_address_must_be_in_the_certificate() {
    let cluster = Cluster::new();
    let interceptor = cluster.interceptor(upstream().await).await;
    send_through(&interceptor, 1).await;
    let mut by_address = cluster.channel("scaler");
    by_address.server_name = None;
    let scaler = scaler(&interceptor, by_address).await;
    let message = refused(&scaler).await;
    assert!(message.contains("not valid for name"), "{message}");
    assert!(message.contains("127.0.0.1"), "{message}");
}

#[tokio::test]
async fn a_rotated_client_certificate_is_presented_on_new_handshakes() {
    let cluster = Cluster::new();
    let interceptor = cluster.interceptor(upstream().await).await;
    send_through(&interceptor, 1).await;
    // The scaler starts with a certificate the interceptor does not take.
    let mut channel = cluster.channel("rotating");
    let (cert, key) = Authority::new("retired CA").issue("hoist-scaler");
    let (cert_file, key_file) = (
        channel.cert_file.clone().unwrap(),
        channel.key_file.clone().unwrap(),
    );
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    channel.reload_every = Duration::from_millis(100);
    let scaler = scaler(&interceptor, channel).await;
    let message = refused(&scaler).await;
    assert!(message.contains("UnknownCA"), "{message}");

    // cert-manager writes one from the client CA.
    let (cert, key) = cluster.clients.issue("hoist-scaler");
    std::fs::write(&key_file, key).unwrap();
    std::fs::write(&cert_file, cert).unwrap();
    eventually(
        Duration::from_secs(10),
        "the new certificate to be presented",
        || async { scaler.metric(&rate()).await.is_ok() },
    )
    .await;
    let (_, value) = scaler.metric(&rate()).await.unwrap();
    assert!((value - 1.0 / 15.0).abs() < 1e-9, "{value}");
}

/// The other direction: interceptors follow the scaler's route table on
/// its admin port, which serves TLS and wants client certificates.
#[tokio::test]
async fn an_interceptor_follows_the_scalers_route_table_over_mtls() {
    const SCALER: &str = "hoist.hoist.svc";
    let cluster = Cluster::new();
    let scaler_admin: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let follower = |tls: Option<ClientTlsSettings>| {
        let mut settings = Settings::default();
        // Tests without a cluster: callers are trusted (grpc.trust_callers),
        // and any host may be routed.
        settings.grpc.trust_callers = true;
        settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
        settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
        // A follower checks the table against its own rules.
        settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
        settings.interceptor.scaler = Some(scaler_admin.to_string());
        settings.interceptor.tls = tls;
        // Loopback is denied by default (tests/edge.rs tests the fence).
        settings.interceptor.denied_networks = vec![];
        Hoist::start_interceptor(settings)
    };
    let mut trusted = cluster.channel("interceptor");
    trusted.server_name = Some(SCALER.into());
    let interceptor = follower(Some(trusted.clone())).await;
    // Trusts the scaler but has no client certificate.
    let anonymous = follower(Some(ClientTlsSettings {
        cert_file: None,
        key_file: None,
        ..trusted
    }))
    .await;

    let (cert, key) = cluster.servers.issue(SCALER);
    let mut settings = Settings::default();
    // Tests without a cluster: callers are trusted (grpc.trust_callers),
    // and any host may be routed.
    settings.grpc.trust_callers = true;
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    settings.admin.listen = scaler_admin;
    settings.admin.tls = Some(TlsSettings {
        cert_file: write(cluster.path(), "scaler.crt", &cert),
        key_file: write(cluster.path(), "scaler.key", &key),
        client_ca_file: Some(write(
            cluster.path(),
            "clients-ca.crt",
            &cluster.clients.pem,
        )),
        reload_every: Duration::from_secs(10),
    });
    settings.interceptor.endpoints = vec![interceptor.admin.to_string()];
    settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    let scaler = Hoist::start_with(settings).await;
    let app = upstream().await;
    scaler
        .spec(&object(
            "shop",
            &[
                ("scaler", "http"),
                ("host", "shop.test"),
                ("upstream", &app.to_string()),
            ],
        ))
        .await;

    let table = |hoist: &Hoist| {
        let admin = hoist.admin;
        async move {
            let (_, body) = support::http_get(admin, "/interceptor/table").await;
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        }
    };
    eventually(Duration::from_secs(10), "the route over mTLS", || async {
        table(&interceptor).await["following"]["routes"] == 1
    })
    .await;
    assert_eq!(
        table(&interceptor).await["routes"][0]["name"],
        "http/default/shop"
    );
    eventually(
        Duration::from_secs(10),
        "the refusal to be reported",
        || async {
            table(&anonymous).await["following"]["error"]
                .as_str()
                .is_some_and(|error| error.contains("401 Unauthorized"))
        },
    )
    .await;
    assert_eq!(table(&anonymous).await["routes"], serde_json::json!([]));
}
