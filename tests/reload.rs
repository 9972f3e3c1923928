//! Reloading the config of a running `hoist` binary: a ConfigMap-style
//! file swap, SIGHUP after an edit in place, and refused configs, with
//! real upstreams and clients on loopback.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hoist::interceptor::report::RoutesReport;
use hoist::reload::ConfigStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::web::AppPort;
use support::{eventually, free_port, http_get, wait_until};

/// How long a test waits for what should happen within a few seconds
/// (the file is read every 2 s).
const PATIENCE: Duration = Duration::from_secs(15);

/// A config directory as a Kubernetes ConfigMap volume lays it out:
/// `config.toml -> ..data/config.toml`, `..data -> ..<timestamp>`; an
/// update writes a new timestamped directory and renames a new `..data`
/// symlink over the old one.
struct ConfigMap {
    dir: tempfile::TempDir,
    updates: u32,
}

impl ConfigMap {
    fn new(content: &str) -> Self {
        let mut map = Self {
            dir: tempfile::tempdir().unwrap(),
            updates: 0,
        };
        map.update(content);
        std::os::unix::fs::symlink("..data/config.toml", map.path()).unwrap();
        map
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    fn update(&mut self, content: &str) {
        let version = format!("..2026_01_01_{}", self.updates);
        self.updates += 1;
        let root = self.dir.path();
        std::fs::create_dir(root.join(&version)).unwrap();
        std::fs::write(root.join(&version).join("config.toml"), content).unwrap();
        std::os::unix::fs::symlink(&version, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    }
}

/// The `hoist` binary, killed when the test ends.
struct Hoist {
    child: Child,
    admin: SocketAddr,
    log: PathBuf,
    _logs: tempfile::TempDir,
}

impl Hoist {
    /// `hoist serve` (with gRPC) or `hoist interceptor`, on `config`.
    fn start(command: &str, config: &Path) -> Self {
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("hoist.log");
        let mut hoist = Command::new(env!("CARGO_BIN_EXE_hoist"));
        hoist
            .env("HOIST_STATE_FILE", "")
            .env("HOIST_KUBERNETES__ENABLED", "false")
            .env_remove("RUST_LOG")
            .args([command, "--config", config.to_str().unwrap()])
            .args(["--admin-listen", &admin.to_string()]);
        if command == "serve" {
            hoist.args(["--grpc-listen", &format!("127.0.0.1:{}", free_port())]);
        }
        let child = hoist
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(10), "hoist to listen", || {
            std::net::TcpStream::connect(admin).is_ok()
        });
        Self {
            child,
            admin,
            log,
            _logs: logs,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    async fn routes(&self) -> RoutesReport {
        let (status, body) = http_get(self.admin, "/interceptor/routes").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    async fn held(&self, route: &str) -> u64 {
        self.routes()
            .await
            .routes
            .get(route)
            .map_or(0, |route| route.load.held)
    }

    /// `/status`'s `config` section (`hoist serve`), or `/status/config`.
    async fn config(&self) -> ConfigStatus {
        let (status, body) = http_get(self.admin, "/status").await;
        let config = if status == 200 {
            let status: serde_json::Value = serde_json::from_str(&body).unwrap();
            status["config"].clone()
        } else {
            let (status, body) = http_get(self.admin, "/status/config").await;
            assert_eq!(status, 200, "{body}");
            serde_json::from_str(&body).unwrap()
        };
        serde_json::from_value(config).unwrap()
    }

    async fn metric(&self, series: &str) -> Option<f64> {
        let (_, metrics) = http_get(self.admin, "/metrics").await;
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse().ok())
    }

    fn hang_up(&self) {
        let sent = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }
}

impl Drop for Hoist {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config: the HTTP proxy on `proxy`, HTTP routes (name, host,
/// upstream), TCP routes (name, listen, upstream), and `more` TOML.
fn config(
    proxy: SocketAddr,
    http: &[(&str, &str, SocketAddr)],
    tcp: &[(&str, SocketAddr, SocketAddr)],
    more: &str,
) -> String {
    let mut text = format!("{more}\n[interceptor]\nhttp_listen = \"{proxy}\"\n");
    for (name, host, upstream) in http {
        text += &format!(
            "[[interceptor.http_routes]]\nname = \"{name}\"\nhost = \"{host}\"\nupstream = \"{upstream}\"\n"
        );
    }
    for (name, listen, upstream) in tcp {
        text += &format!(
            "[[interceptor.tcp_routes]]\nname = \"{name}\"\nlisten = \"{listen}\"\nupstream = \"{upstream}\"\n"
        );
    }
    text
}

fn free_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}

async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.ok()?;
        head.push(byte[0]);
    }
    String::from_utf8(head).ok()
}

/// Accepts on `listener`; each connection gets `serve`.
fn serve_each<F, Fut>(listener: TcpListener, serve: F)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
}

/// An HTTP app answering every request with `hello from <name>`.
fn http_app(listener: TcpListener, name: &'static str) -> SocketAddr {
    let addr = listener.local_addr().unwrap();
    serve_each(listener, move |mut stream| async move {
        if read_head(&mut stream).await.is_none() {
            return;
        }
        let body = format!("hello from {name}");
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
    });
    addr
}

async fn started_http_app(name: &'static str) -> SocketAddr {
    http_app(TcpListener::bind("127.0.0.1:0").await.unwrap(), name)
}

/// Echoes every read back with `echo:` in front, after an optional
/// HTTP Upgrade (101) when `upgrade` is set.
async fn echo_app(upgrade: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    serve_each(listener, move |mut stream| async move {
        if upgrade {
            if read_head(&mut stream).await.is_none() {
                return;
            }
            let switching = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
            if stream.write_all(switching.as_bytes()).await.is_err() {
                return;
            }
        }
        let mut buffer = [0u8; 256];
        while let Ok(n @ 1..) = stream.read(&mut buffer).await {
            let reply = [b"echo:", &buffer[..n]].concat();
            if stream.write_all(&reply).await.is_err() {
                return;
            }
        }
    });
    addr
}

/// One HTTP/1.1 request through the proxy: status and body.
async fn get(proxy: SocketAddr, host: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, response)
}

/// Sends `text` on an echoing connection and reads the echo.
async fn echoes(stream: &mut TcpStream, text: &str) -> bool {
    if stream.write_all(text.as_bytes()).await.is_err() {
        return false;
    }
    let mut reply = vec![0u8; text.len() + 5];
    let read = tokio::time::timeout(PATIENCE, stream.read_exact(&mut reply)).await;
    matches!(read, Ok(Ok(_))) && reply == format!("echo:{text}").as_bytes()
}

/// A WebSocket-style upgraded connection through the proxy.
async fn upgraded(proxy: SocketAddr, host: &str) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!(
        "GET /socket HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

#[tokio::test]
async fn a_configmap_update_adds_routes_while_held_requests_and_upgrades_carry_on() {
    let proxy = free_addr();
    let app_a_port = AppPort::reserve(); // not up yet: its requests are held
    let app_a = app_a_port.addr;
    let sockets = echo_app(true).await;
    let routes = [("a", "a.test", app_a), ("b", "b.test", sockets)];
    let mut map = ConfigMap::new(&config(proxy, &routes, &[], ""));
    let hoist = Hoist::start("serve", &map.path());

    let held = tokio::spawn(async move { get(proxy, "a.test").await });
    eventually(PATIENCE, "the request to A to be held", || async {
        hoist.held("a").await == 1
    })
    .await;
    let mut socket = upgraded(proxy, "b.test").await;
    assert!(echoes(&mut socket, "before").await);

    let app_c = started_http_app("c").await;
    let (db, db_listen) = (echo_app(false).await, free_addr());
    let more_routes = [routes[0], routes[1], ("c", "c.test", app_c)];
    map.update(&config(proxy, &more_routes, &[("db", db_listen, db)], ""));
    eventually(PATIENCE, "route C to serve", || async {
        get(proxy, "c.test").await.1.ends_with("hello from c")
    })
    .await;
    eventually(PATIENCE, "the TCP route to serve", || async {
        match TcpStream::connect(db_listen).await {
            Ok(mut stream) => echoes(&mut stream, "ping").await,
            Err(_) => false,
        }
    })
    .await;

    // A's app comes up: the request held since before the reload goes
    // through; the upgraded connection still echoes.
    http_app(app_a_port.listen(), "a");
    let (status, response) = held.await.unwrap();
    assert_eq!(status, 200, "{response}");
    assert!(response.ends_with("hello from a"), "{response}");
    assert!(echoes(&mut socket, "after").await);

    let status = hoist.config().await;
    assert_eq!((status.applied, status.refused), (1, 0), "{status:?}");
    let last = status.last_reload.unwrap();
    assert_eq!(
        (last.result.as_str(), last.cause.as_str()),
        ("applied", "file")
    );
    assert_eq!(status.file.as_deref(), map.path().to_str());
    assert!(
        status.restart_needed.is_empty(),
        "{:?}",
        status.restart_needed
    );
    // The reload says what it added, as it says what it removes.
    let logs = hoist.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("route added") && l.contains("route=c")),
        "{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("TCP route listener opened") && l.contains(&db_listen.to_string())),
        "{logs}"
    );
}

#[tokio::test]
async fn sighup_after_an_edit_in_place_removes_and_adds_routes_in_the_interceptor() {
    let proxy = free_addr();
    let gone_port = AppPort::reserve(); // never comes up
    let (gone, app_b) = (gone_port.addr, started_http_app("b").await);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("interceptor.toml");
    let first = [("gone", "gone.test", gone), ("b", "b.test", app_b)];
    std::fs::write(&file, config(proxy, &first, &[], "")).unwrap();
    let hoist = Hoist::start("interceptor", &file);

    let held = tokio::spawn(async move { get(proxy, "gone.test").await });
    eventually(PATIENCE, "the request to be held", || async {
        hoist.held("gone").await == 1
    })
    .await;

    let app_c = started_http_app("c").await;
    let then = [("b", "b.test", app_b), ("c", "c.test", app_c)];
    // A new listen address takes a restart: named, and not applied.
    std::fs::write(&file, config(free_addr(), &then, &[], "")).unwrap();
    hoist.hang_up();
    eventually(PATIENCE, "a reload on SIGHUP", || async {
        let status = hoist.config().await;
        status
            .last_reload
            .is_some_and(|last| last.cause == "signal" && last.result == "applied")
    })
    .await;

    let (status, response) = held.await.unwrap();
    assert_eq!(status, 503, "a removed route's held request: {response}");
    assert!(get(proxy, "c.test").await.1.ends_with("hello from c"));
    assert!(get(proxy, "b.test").await.1.ends_with("hello from b"));
    let status = hoist.config().await;
    assert_eq!(status.restart_needed, ["interceptor.http_listen"]);
    assert_eq!(
        hoist.metric("hoist_config_last_reload_success").await,
        Some(1.0)
    );
    assert!(
        hoist.logs().contains("interceptor.http_listen"),
        "the warning names the key: {}",
        hoist.logs()
    );
}

#[tokio::test]
async fn a_bad_config_is_refused_whole_and_the_old_routes_serve_on() {
    let proxy = free_addr();
    let (app_w, app_x) = (started_http_app("w").await, started_http_app("x").await);
    let old = [("w", "w.test", app_w)];
    let mut map = ConfigMap::new(&config(proxy, &old, &[], ""));
    let hoist = Hoist::start("serve", &map.path());
    assert!(get(proxy, "w.test").await.1.ends_with("hello from w"));
    assert_eq!(
        hoist
            .metric("hoist_config_reloads_total{result=\"refused\"}")
            .await,
        Some(0.0)
    );
    let new = [("w", "w.test", app_w), ("x", "x.test", app_x)];

    // A bad duration, next to a credential.
    let secret = "[auth.orders]\nnamespaces = [\"orders\"]\npassword = \"hunter2-secret\"\n";
    let bad = config(proxy, &new, &[], secret).replace(
        "[interceptor]\n",
        "[interceptor]\ncold_start_timeout = \"soon\"\n",
    );
    map.update(&bad);
    let refused = |count: u64| {
        let hoist = &hoist;
        async move { hoist.config().await.refused == count }
    };
    eventually(PATIENCE, "the reload to be refused", || refused(1)).await;
    let status = hoist.config().await;
    let error = status.last_reload.unwrap().error.unwrap();
    assert!(error.contains("interceptor.cold_start_timeout"), "{error}");
    assert_eq!(
        hoist
            .metric("hoist_config_reloads_total{result=\"refused\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        hoist.metric("hoist_config_last_reload_success").await,
        Some(0.0)
    );
    assert!(get(proxy, "w.test").await.1.ends_with("hello from w"));
    assert_ne!(get(proxy, "x.test").await.0, 200, "nothing of it applies");

    // A TOML error on the credential's line: the file's lines are not
    // quoted anywhere.
    map.update(&config(
        proxy,
        &new,
        &[],
        &secret.replace("secret\"", "secret"),
    ));
    eventually(PATIENCE, "the reload to be refused", || refused(2)).await;
    let (_, status_page) = http_get(hoist.admin, "/status").await;
    assert!(status_page.contains("TOML parse error"), "{status_page}");
    assert!(!status_page.contains("hunter2"), "{status_page}");
    assert!(!hoist.logs().contains("hunter2"), "{}", hoist.logs());

    // A new TCP route on a port another process holds.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap();
    map.update(&config(proxy, &new, &[("db", port, app_x)], ""));
    eventually(PATIENCE, "the reload to be refused", || refused(3)).await;
    let error = hoist.config().await.last_reload.unwrap().error.unwrap();
    assert!(error.contains(&port.to_string()), "{error}");
    assert!(get(proxy, "w.test").await.1.ends_with("hello from w"));
    assert_ne!(get(proxy, "x.test").await.0, 200, "nothing of it applies");

    // Fixed: it all applies.
    drop(taken);
    map.update(&config(proxy, &new, &[], ""));
    eventually(PATIENCE, "route X to serve", || async {
        get(proxy, "x.test").await.1.ends_with("hello from x")
    })
    .await;
    let status = hoist.config().await;
    assert_eq!((status.applied, status.refused), (1, 3));
    assert_eq!(
        hoist.metric("hoist_config_last_reload_success").await,
        Some(1.0)
    );
}
