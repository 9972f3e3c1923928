//! Real parts for the integration tests: `redis-server` processes on free
//! loopback ports (standalone, cluster, sentinel) and a real hoist server
//! on 127.0.0.1:0 with a real tonic client.

#![allow(dead_code)] // each test binary uses a different part of this

pub mod web;

pub mod certs;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hoist::config::Settings;
use hoist::proto::ScaledObjectRef;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use hoist::reload::ConfigSource;
use hoist::server::{Server, ServerError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A loopback port free now, for a server a test starts later on it.
/// Picked below the kernel's ephemeral range, where `bind(:0)` (every
/// other server and client of the suite, running at once) never lands: a
/// port from that range, released here and bound later, was at times taken
/// in between (`AddrInUse`). Two picks collide only by chance, 1 in about
/// 20,000.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    for _ in 0..1000 {
        // Randomly keyed, and a new key each time: a random number.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = low + (random % u64::from(high - low)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "`{binary}` is not installed: run the tests with scripts/test.sh, which installs it"
    );
}

/// Polls `check` every 50 ms until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The async twin of [`wait_until`]: awaits `check` every 25 ms until it
/// returns true or `limit` of real time passes.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A `redis-server` process that lives as long as this value.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> Self {
        require("redis-server");
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temp dir"),
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--dir", &self.dir.path().display().to_string()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let url = self.url();
        let password = self.password();
        wait_until(
            Duration::from_secs(10),
            "redis-server to answer PING",
            || ping(&url, password.as_deref()),
        );
    }

    fn password(&self) -> Option<String> {
        let at = self.args.iter().position(|a| a == "--requirepass")?;
        self.args.get(at + 1).cloned()
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A plain client connection for setting up data.
    pub fn connection(&self) -> redis::Connection {
        let client = match self.password() {
            Some(password) => {
                redis::Client::open(format!("redis://:{password}@127.0.0.1:{}/", self.port))
            }
            None => redis::Client::open(self.url()),
        }
        .expect("a redis URL");
        client.get_connection().expect("a redis connection")
    }

    pub fn command(&self, args: &[&str]) -> redis::Value {
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query(&mut self.connection())
            .expect("a redis command")
    }

    /// How many times Redis ran `command` (from `INFO commandstats`).
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map(|calls| calls.parse().expect("a call count"))
            .unwrap_or(0)
    }

    /// Makes `list` hold `length` jobs (and nothing else).
    pub fn fill(&self, list: &str, length: usize) {
        self.command(&["DEL", list]);
        if length > 0 {
            let values: Vec<String> = (0..length).map(|i| i.to_string()).collect();
            let mut push = vec!["RPUSH", list];
            push.extend(values.iter().map(String::as_str));
            self.command(&push);
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port (with an empty data set).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ping(url: &str, password: Option<&str>) -> bool {
    let url = match password {
        Some(password) => url.replacen("redis://", &format!("redis://:{password}@"), 1),
        None => url.to_string(),
    };
    redis::Client::open(url)
        .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection))
        .is_ok()
}

/// A three-master Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        require("redis-cli");
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(node.address());
        }
        let status = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        for node in &nodes {
            wait_until(Duration::from_secs(20), "the cluster to be ok", || {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
            });
        }
        Self { nodes }
    }

    pub fn addresses(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs a command on the node that owns `key`.
    pub fn on_owner(&self, key: &str, args: &[&str]) {
        let client = redis::cluster::ClusterClient::new(
            self.nodes.iter().map(RedisServer::url).collect::<Vec<_>>(),
        )
        .expect("a cluster client");
        let mut connection = client.get_connection().expect("a cluster connection");
        let mut command = redis::cmd(args[0]);
        command.arg(key);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query::<redis::Value>(&mut connection)
            .expect("a cluster command");
    }
}

/// A master and one sentinel watching it as `mymaster`.
pub struct RedisSentinel {
    pub master: RedisServer,
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl RedisSentinel {
    pub fn start() -> Self {
        let master = RedisServer::start();
        let dir = tempfile::tempdir().expect("a temp dir");
        let port = free_port();
        let config: PathBuf = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\nsentinel down-after-milliseconds mymaster 5000\n",
                dir.path().display(),
                master.port
            ),
        )
        .expect("sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel starts");
        let url = format!("redis://127.0.0.1:{port}/");
        wait_until(
            Duration::from_secs(10),
            "the sentinel to know its master",
            || {
                redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                    .and_then(|mut c| {
                        redis::cmd("SENTINEL")
                            .arg("get-master-addr-by-name")
                            .arg("mymaster")
                            .query::<Vec<String>>(&mut c)
                    })
                    .is_ok_and(|addr| addr.len() == 2)
            },
        );
        Self {
            master,
            port,
            dir,
            child,
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A hoist server on loopback ports chosen by the kernel.
pub struct Hoist {
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// The in-process interceptor's HTTP proxy, when it has HTTP routes.
    pub http_proxy: Option<SocketAddr>,
    /// The in-process interceptor's TCP listeners, by route.
    pub tcp_proxies: std::collections::BTreeMap<String, SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
    _state_dir: Option<tempfile::TempDir>,
}

/// Keeps a test's hoist to itself: its own state file unless the test
/// chose one (the default path would be shared by every test), and no
/// Kubernetes access unless the test gives a kubeconfig (never a
/// developer's own cluster).
pub fn isolate(settings: &mut Settings) -> Option<tempfile::TempDir> {
    use hoist::config::KubernetesAccess;
    if settings.kubernetes.kubeconfig.is_none()
        && settings.kubernetes.enabled == KubernetesAccess::Auto
    {
        settings.kubernetes.enabled = KubernetesAccess::Off;
    }
    if settings.state_file == Settings::default().state_file {
        let dir = tempfile::tempdir().unwrap();
        settings.state_file = Some(dir.path().join("state.json"));
        return Some(dir);
    }
    None
}

/// Settings whose engines compute from their own last decision
/// (`engine.assume_applied`): for tests of the rules, not of counting.
pub fn assuming_applied() -> Settings {
    let mut settings = Settings::default();
    settings.engine.assume_applied = true;
    settings
}

impl Hoist {
    pub async fn start() -> Self {
        Self::start_with(Settings::default()).await
    }

    pub async fn start_with(settings: Settings) -> Self {
        Self::start_serving(settings, None).await
    }

    /// Like `start_with`, reloading from `source` (on SIGHUP, or when its
    /// file changes) as `hoist serve --config FILE` does.
    pub async fn start_reloading(settings: Settings, source: ConfigSource) -> Self {
        Self::start_serving(settings, Some(source)).await
    }

    /// `hoist serve --config FILE`: its settings read from `file`, which
    /// it reloads when the file changes.
    pub async fn start_from_file(file: &Path) -> Self {
        let settings = Settings::load(Some(file), Vec::new(), &Default::default())
            .expect("the test's config loads");
        let source = ConfigSource::new(
            Some(file.to_path_buf()),
            Vec::new(),
            hoist::config::Overrides::default(),
        );
        Self::start_reloading(settings, source).await
    }

    async fn start_serving(mut settings: Settings, reload: Option<ConfigSource>) -> Self {
        // Loopback on a free port, unless the test chose an address (a
        // hoist restarted where KEDA knows it).
        if settings.grpc.listen == Settings::default().grpc.listen {
            settings.grpc.listen = "127.0.0.1:0".parse().unwrap();
        }
        if settings.admin.listen == Settings::default().admin.listen {
            settings.admin.listen = "127.0.0.1:0".parse().unwrap();
        }
        let state_dir = isolate(&mut settings);
        let mut server = Server::bind(settings).await.expect("hoist binds");
        if let Some(source) = reload {
            server = server.reload_from(source);
        }
        let mut hoist = Self::run(server);
        hoist._state_dir = state_dir;
        hoist
    }

    /// `hoist interceptor` alone: proxies and admin, no gRPC (`grpc` is
    /// the admin address, unused).
    pub async fn start_interceptor(mut settings: Settings) -> Self {
        // Loopback on a free port, unless the test chose an address.
        if settings.admin.listen == Settings::default().admin.listen {
            settings.admin.listen = "127.0.0.1:0".parse().unwrap();
        }
        Self::run(
            Server::bind_interceptor(settings)
                .await
                .expect("the interceptor binds"),
        )
    }

    fn run(server: Server) -> Self {
        let admin = server.admin_addr();
        let grpc = server.grpc_addr().unwrap_or(admin);
        let http_proxy = server.http_proxy_addr();
        let tcp_proxies = server.tcp_proxy_addrs();
        let (shutdown, signal) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = signal.await;
        }));
        Self {
            grpc,
            admin,
            http_proxy,
            tcp_proxies,
            shutdown: Some(shutdown),
            task: Some(task),
            _state_dir: None,
        }
    }

    pub async fn client(&self) -> ExternalScalerClient<Channel> {
        ExternalScalerClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("a gRPC connection to hoist")
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .expect("a gRPC channel to hoist")
    }

    /// Signals shutdown and waits for `run` to return.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task
            .take()
            .unwrap()
            .await
            .expect("the server task does not panic")
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).await
    }

    /// `route`'s requests in flight, as `/interceptor/routes` reports them.
    pub async fn in_flight(&self, route: &str) -> u64 {
        let (status, body) = self.get("/interceptor/routes").await;
        assert_eq!(status, 200, "{body}");
        let report: hoist::interceptor::report::RoutesReport = serde_json::from_str(&body).unwrap();
        report.routes[route].load.in_flight
    }

    /// HTTP client connections `send_timeout` closed (`/metrics`).
    pub async fn send_timeouts(&self) -> u64 {
        let (_, metrics) = self.get("/metrics").await;
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("hoist_interceptor_http_send_timeouts_total "))
            .map_or(0, |value| value.trim().parse().unwrap())
    }

    /// `GetMetrics` for `object`: the int and the float value.
    pub async fn metric(&self, object: &ScaledObjectRef) -> Result<(i64, f64), tonic::Status> {
        let response = self
            .client()
            .await
            .get_metrics(hoist::proto::GetMetricsRequest {
                scaled_object_ref: Some(object.clone()),
                metric_name: String::new(),
            })
            .await?
            .into_inner();
        assert_eq!(response.metric_values.len(), 1, "one value per trigger");
        let value = &response.metric_values[0];
        Ok((value.metric_value, value.metric_value_float))
    }

    /// `GetMetricSpec` for `object`: its one spec.
    pub async fn spec(&self, object: &ScaledObjectRef) -> hoist::proto::MetricSpec {
        let mut response = self
            .client()
            .await
            .get_metric_spec(object.clone())
            .await
            .expect("a metric spec")
            .into_inner();
        assert_eq!(response.metric_specs.len(), 1, "one spec per trigger");
        response.metric_specs.remove(0)
    }

    /// `GetMetricSpec` for `object`, which must be refused: the status.
    pub async fn spec_refused(&self, object: &ScaledObjectRef) -> tonic::Status {
        self.client()
            .await
            .get_metric_spec(object.clone())
            .await
            .expect_err("the trigger is refused")
    }

    /// `IsActive` for `object`.
    pub async fn active(&self, object: &ScaledObjectRef) -> Result<bool, tonic::Status> {
        Ok(self
            .client()
            .await
            .is_active(object.clone())
            .await?
            .into_inner()
            .result)
    }
}

impl Drop for Hoist {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// A minimal HTTP/1.0 GET: status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get_with(addr, path, "").await
}

/// [`http_get`] with more header lines (each ending in CRLF).
pub async fn http_get_with(addr: SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("admin port answers");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: hoist\r\n{headers}\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("an HTTP status line");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A ScaledObjectRef as KEDA sends it (with `scalerAddress`, which hoist
/// ignores).
pub fn object(name: &str, metadata: &[(&str, &str)]) -> ScaledObjectRef {
    let mut scaler_metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    scaler_metadata.insert("scalerAddress".into(), "hoist.keda:9090".into());
    ScaledObjectRef {
        name: name.to_string(),
        namespace: "default".to_string(),
        scaler_metadata,
    }
}
