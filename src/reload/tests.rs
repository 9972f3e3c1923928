use std::net::SocketAddr;
use std::time::Duration;

use super::*;
use crate::interceptor::Interceptor;
use crate::metrics::Metrics;
use crate::routing::{Owner, Protocol, RouteSpec};

fn from_toml(text: &str) -> Settings {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(&file, text).unwrap();
    Settings::load(Some(&file), Vec::new(), &Overrides::default()).unwrap()
}

#[test]
fn restart_only_keys_are_named_one_by_one_and_keep_their_running_value() {
    let running = from_toml(
        r#"
[grpc]
listen = "127.0.0.1:7000"
[log]
level = "info"
[interceptor]
http_listen = "127.0.0.1:7080"
cold_start_timeout = "60s"
"#,
    );
    let loaded = from_toml(
        r#"
state_file = ""
[grpc]
listen = "127.0.0.1:7100"
[log]
level = "debug"
[limits]
max_tracked_triggers = 7
[interceptor]
http_listen = "127.0.0.1:7180"
cold_start_timeout = "5s"
allowed_upstreams = ["*.example.com:*"]
[interceptor.tls]
ca_file = "/etc/hoist/channel/ca.crt"
[auth.orders]
namespaces = ["orders"]
password = "a-secret"
"#,
    );
    let keys = restart_needed(&running, &loaded).unwrap();
    assert_eq!(
        keys,
        [
            "grpc.listen",
            "log.level",
            "state_file",
            "interceptor.http_listen",
            "interceptor.tls"
        ]
    );

    let kept = keep_restart_only(&running, loaded.clone()).unwrap();
    assert_eq!(kept.grpc, running.grpc);
    assert_eq!(kept.log, running.log);
    assert_eq!(kept.state_file, running.state_file);
    assert_eq!(
        kept.interceptor.http_listen,
        running.interceptor.http_listen
    );
    assert_eq!(
        kept.interceptor.tls, None,
        "the channel's clients keep theirs"
    );
    // Everything else is the new config's.
    assert_eq!(kept.limits, loaded.limits);
    assert_eq!(kept.auth, loaded.auth);
    assert_eq!(kept.interceptor.cold_start_timeout, Duration::from_secs(5));
    assert_eq!(
        kept.interceptor.allowed_upstreams,
        loaded.interceptor.allowed_upstreams
    );
    assert!(restart_needed(&running, &kept).unwrap().is_empty());
}

#[test]
fn every_setting_survives_keeping_the_restart_only_ones() {
    // Every section, optional values set, so the round trip through JSON
    // covers each kind of value.
    let settings = from_toml(
        r#"
state_file = "/tmp/state.json"
shutdown_grace = "3s"
[shutdown]
drain_delay = "2s"
grace = "4s"
[grpc]
listen = "127.0.0.1:7000"
keepalive_interval = "7s"
[admin]
listen = "127.0.0.1:7001"
[log]
format = "json"
level = "hoist=debug,info"
[polling]
default_interval = "15s"
[limits]
allowed_sources = ["*.svc:*"]
[auth.orders]
namespaces = ["orders"]
password = "literal"
username = { env = "HOME" }
ca = { file = "/etc/ca.pem" }
[kubernetes]
enabled = false
kubeconfig = "/root/.kube/config"
[engine]
assume_applied = true
[interceptor]
http_listen = "127.0.0.1:7080"
endpoints = ["interceptor:9091"]
scaler = "hoist:9091"
allowed_hosts = { "*" = ["*.example.com"] }
allowed_listen_ports = { shop = ["9000-9010"] }
[[interceptor.http_routes]]
name = "web"
host = "web.example.com"
path_prefix = "/api"
upstream = "web:80"
upstream_http2 = true
cold_start_timeout = "9s"
response_timeout = "8s"
[[interceptor.tcp_routes]]
name = "db"
listen = "127.0.0.1:7432"
upstream = "db:5432"
"#,
    );
    assert_eq!(
        keep_restart_only(&settings, settings.clone()).unwrap(),
        settings
    );
    assert_eq!(
        keep_restart_only(&Settings::default(), settings.clone())
            .unwrap()
            .interceptor
            .http_routes,
        settings.interceptor.http_routes
    );
}

#[test]
fn a_refusal_shows_no_line_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(&file, "[auth.orders]\npassword = \"hunter2-secret\n").unwrap();
    let error = ConfigSource::new(Some(file), Vec::new(), Overrides::default())
        .load()
        .unwrap_err();
    let text = ReloadError::from(error).to_string();
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("line 2"), "{text}");
    assert!(text.contains("hoist.toml"), "{text}");
}

/// A scaler with its interceptor in one process, as `hoist serve` runs
/// them, and a declared route claimed by a ScaledObject.
struct Scaler {
    _dir: tempfile::TempDir,
    file: PathBuf,
    control: RouteControl,
    driver: Driver,
    reloader: Reloader,
    declared: RouteSpec,
}

impl Scaler {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        let first = "[interceptor]\nhttp_listen = \"127.0.0.1:0\"\nenabled = true\n[interceptor.allowed_hosts]\n\"*\" = [\"*.example\"]\n";
        std::fs::write(&file, first).unwrap();
        let source = ConfigSource::new(Some(file.clone()), Vec::new(), Overrides::default());
        let settings = source.load().unwrap();
        let interceptor = Interceptor::bind(&settings.interceptor, Duration::from_secs(1))
            .await
            .unwrap();
        let control = interceptor.control();
        let traffic = Some(Traffic::Local(control.routes()));
        let driver = Driver::new(
            crate::driver::DriverSettings::from_config(&settings, traffic.clone()),
            AuthProfiles::from_settings(&settings),
            Arc::new(Metrics::new()),
            CancellationToken::new(),
        );
        let registry = driver.routes().unwrap();
        control.serve_declared(&registry);
        let declared = RouteSpec {
            name: "http/default/shop".into(),
            protocol: Protocol::Http,
            owner: Some(Owner {
                namespace: "default".into(),
                name: "shop".into(),
            }),
            hosts: vec!["shop.example".into()],
            path_prefix: None,
            listen: None,
            upstream: "shop.default.svc.cluster.local:80".into(),
            upstream_http2: false,
            cold_start_timeout: None,
            response_timeout: None,
        };
        registry.claim(b"shop-trigger", &declared).unwrap();
        let targets = Targets {
            interceptor: Some(control.clone()),
            driver: Some(driver.clone()),
            traffic,
        };
        let reloader = Reloader::new(source, settings, targets);
        Self {
            _dir: dir,
            file,
            control,
            driver,
            reloader,
            declared,
        }
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.file, text).unwrap();
    }

    fn serves(&self, route: &str) -> bool {
        self.control.routes().current().get(route).is_some()
    }

    fn declared_routes(&self) -> Vec<RouteSpec> {
        self.driver.routes().unwrap().snapshot().0
    }
}

/// A config with `rules` in `[interceptor]`, an HTTP route `name` for
/// `host`, and a TCP route `db` listening on `port`.
fn config(rules: &str, name: &str, host: &str, port: SocketAddr) -> String {
    format!(
        r#"
[interceptor]
{rules}
allowed_hosts = {{ "*" = ["*.example"] }}
[[interceptor.http_routes]]
name = "{name}"
host = "{host}"
upstream = "127.0.0.1:1"
[[interceptor.tcp_routes]]
name = "db"
listen = "{port}"
upstream = "127.0.0.1:1"
"#
    )
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test]
async fn a_config_route_taking_a_declared_claim_wins_and_the_declared_route_is_released() {
    let scaler = Scaler::start().await;
    let port = free_port();
    scaler.write(&config("", "takeover", "shop.example", port));
    scaler
        .reloader
        .reload(Cause::Signal)
        .expect("the operator's route is applied, not refused");
    assert!(scaler.serves("takeover") && scaler.serves("db"));
    assert!(!scaler.serves(&scaler.declared.name));
    assert!(scaler.declared_routes().is_empty());
    let refused = scaler
        .driver
        .routes()
        .unwrap()
        .claim(b"shop-trigger", &scaler.declared)
        .unwrap_err();
    assert!(
        refused.to_string().contains("route `takeover`"),
        "{refused}"
    );
    let status = scaler.reloader.status();
    assert_eq!((status.applied, status.refused), (1, 0));
}

#[tokio::test]
async fn a_port_in_use_is_refused_before_the_registry_changes_and_then_all_applies_together() {
    let scaler = Scaler::start().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap();
    // New rules that forbid the declared route, a new HTTP route, and a
    // TCP route on a port another process holds.
    scaler.write(&config(
        "allowed_upstreams = [\"*.example.com:*\"]",
        "extra",
        "extra.example",
        port,
    ));
    let error = scaler.reloader.reload(Cause::File).unwrap_err();
    assert!(matches!(error, ReloadError::Interceptor(_)), "{error}");
    assert!(error.to_string().contains(&port.to_string()), "{error}");
    // Nothing moved: the registry kept its rules and the declared route,
    // the interceptor its routes.
    assert_eq!(
        scaler.declared_routes(),
        std::slice::from_ref(&scaler.declared)
    );
    assert!(scaler.serves(&scaler.declared.name));
    assert!(!scaler.serves("extra") && !scaler.serves("db"));

    // Once the port is free, the same config applies whole.
    drop(taken);
    scaler.reloader.reload(Cause::File).unwrap();
    assert!(scaler.serves("extra") && scaler.serves("db"));
    assert!(
        scaler.declared_routes().is_empty(),
        "the new rules forbid the declared route"
    );
    assert!(!scaler.serves(&scaler.declared.name));
    let status = scaler.reloader.status();
    assert_eq!((status.applied, status.refused), (1, 1));
    assert_eq!(status.last_reload.unwrap().error, None);
}

#[tokio::test]
async fn a_changed_file_is_seen_once_and_a_reload_notes_what_it_read() {
    let scaler = Scaler::start().await;
    assert!(
        !scaler.reloader.source.changed().await,
        "nothing changed yet"
    );
    scaler.write("[limits]\nmax_tracked_triggers = 5\n");
    assert!(scaler.reloader.source.changed().await);
    scaler.reloader.reload(Cause::File).unwrap();
    assert!(!scaler.reloader.source.changed().await);
}

/// A file rewritten on the poll's own cadence, each write landing inside
/// the settle pause, is taken at the next poll: what the last pause ended
/// on stood for a whole poll interval.
#[tokio::test(start_paused = true)]
async fn a_file_rewritten_every_poll_is_taken_once_it_stood_a_poll() {
    let scaler = Scaler::start().await;
    let version = |n: u32| format!("[limits]\nmax_tracked_triggers = {n}\n");
    scaler.write(&version(1));
    let source = &scaler.reloader.source;
    let writes = async {
        // 100 ms into each poll's settle pause, another version.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for n in 2.. {
            scaler.write(&version(n));
            tokio::time::sleep(POLL_EVERY).await;
        }
    };
    let polls = async {
        let mut taken_at = None;
        for poll in 0..3 {
            if source.changed().await {
                taken_at = Some(poll);
                break;
            }
            // The rest of the poll interval.
            tokio::time::sleep(POLL_EVERY - SETTLE).await;
        }
        taken_at
    };
    let taken_at = tokio::select! {
        taken_at = polls => taken_at,
        () = writes => unreachable!(),
    };
    assert_eq!(taken_at, Some(1), "taken at the second poll");
}

#[tokio::test]
async fn raising_the_metadata_limit_past_the_start_value_is_named_for_a_restart() {
    let scaler = Scaler::start().await;
    let started = Settings::default().limits.max_metadata_bytes;
    let base = "[interceptor]\nhttp_listen = \"127.0.0.1:0\"\nenabled = true\n";

    scaler.write(&format!(
        "{base}[limits]\nmax_metadata_bytes = {}\n",
        started / 2
    ));
    scaler.reloader.reload(Cause::File).unwrap();
    assert!(
        scaler.reloader.status().restart_needed.is_empty(),
        "lowering it applies at once"
    );

    // Above the start value, even after a reload that lowered it.
    scaler.write(&format!(
        "{base}[limits]\nmax_metadata_bytes = {}\nmax_tracked_metadata_bytes = {}\n",
        started * 2,
        started * 1024
    ));
    scaler.reloader.reload(Cause::File).unwrap();
    assert_eq!(
        scaler.reloader.status().restart_needed,
        ["limits.max_metadata_bytes"]
    );
    assert_eq!(
        scaler.reloader.status().applied,
        2,
        "the rest applies, the per-trigger check included"
    );
    let running = scaler.reloader.lock().running.limits.max_metadata_bytes;
    assert_eq!(running, started * 2);
}
