//! The `hoist` binary as a user runs it.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::{RedisServer, free_port, http_get, wait_until};

fn hoist(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hoist"))
        .env("HOIST_STATE_FILE", "")
        .env("HOIST_KUBERNETES__ENABLED", "false")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("hoist runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_explains_every_command_and_flag() {
    let top = text(&hoist(&["--help"]).stdout);
    for command in ["serve", "check-config", "probe"] {
        assert!(top.contains(command), "{top}");
    }
    let serve = text(&hoist(&["serve", "--help"]).stdout);
    for flag in [
        "--config",
        "--grpc-listen",
        "--admin-listen",
        "--log-format",
        "--log-level",
    ] {
        assert!(serve.contains(flag), "{serve}");
    }
    assert!(
        serve.contains("0.0.0.0:9090") && serve.contains("0.0.0.0:9091"),
        "{serve}"
    );
    let probe = text(&hoist(&["probe", "--help"]).stdout);
    assert!(probe.contains("--metadata"), "{probe}");
}

#[test]
fn check_config_prints_the_effective_config_with_credentials_masked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(
        &file,
        "[grpc]\nlisten = \"127.0.0.1:7000\"\n[auth.orders]\nnamespaces = [\"orders\"]\npassword = \"very-secret-value\"\nusername = { env = \"HOME\" }\n",
    )
    .unwrap();
    let output = hoist(&[
        "check-config",
        "--config",
        file.to_str().unwrap(),
        "--admin-listen",
        "127.0.0.1:7001",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(printed.contains("127.0.0.1:7000"), "{printed}");
    assert!(
        printed.contains("127.0.0.1:7001"),
        "the flag wins: {printed}"
    );
    assert!(printed.contains("***"), "{printed}");
    assert!(
        printed.contains("HOME"),
        "env var names are shown: {printed}"
    );
    assert!(!printed.contains("very-secret-value"), "{printed}");

    std::fs::write(
        &file,
        "[auth.orders]\nnamespaces = [\"orders\"]\npassword = { env = \"HOIST_TEST_UNSET_VARIABLE\" }\n",
    )
    .unwrap();
    let output = hoist(&["check-config", "--config", file.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("HOIST_TEST_UNSET_VARIABLE"),
        "{}",
        text(&output.stderr)
    );

    std::fs::write(&file, "[grpc]\nlisen = \"127.0.0.1:7000\"\n").unwrap();
    let output = hoist(&["check-config", "--config", file.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("lisen"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn probe_measures_one_trigger_and_shows_what_keda_would_get() {
    let redis = RedisServer::start();
    redis.command(&[
        "RPUSH", "jobs", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k",
    ]);
    let address = format!("address={}", redis.address());
    let output = hoist(&[
        "probe",
        "-m",
        "scaler=redis",
        "-m",
        &address,
        "-m",
        "listName=jobs",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(printed.contains("value:           11"), "{printed}");
    assert!(printed.contains("IsActive:        true"), "{printed}");
    assert!(
        printed.contains("metricName=redis-jobs targetSize=5"),
        "{printed}"
    );
    assert!(printed.contains("3 replicas"), "{printed}");

    let output = hoist(&[
        "probe",
        "-m",
        "scaler=redis",
        "-m",
        &address,
        "-m",
        "listName=jobs",
        "-m",
        "listLength=x",
    ]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("`listLength`"),
        "{}",
        text(&output.stderr)
    );

    let closed = format!("address=127.0.0.1:{}", free_port());
    let output = hoist(&[
        "probe",
        "-m",
        "scaler=redis",
        "-m",
        &closed,
        "-m",
        "listName=jobs",
    ]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("cannot connect"),
        "{}",
        text(&output.stderr)
    );
}

#[tokio::test]
async fn serve_runs_until_sigterm_and_then_shuts_down_cleanly() {
    let (grpc, admin) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hoist"))
        .env("HOIST_STATE_FILE", "")
        .env("HOIST_KUBERNETES__ENABLED", "false")
        .args(["serve", "--log-format", "json"])
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until(Duration::from_secs(10), "hoist to listen", || {
        std::net::TcpStream::connect(admin_addr).is_ok()
    });
    assert_eq!(http_get(admin_addr, "/readyz").await.0, 200);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = std::time::Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "hoist did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success());
    let mut logs = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut logs).unwrap();
    assert!(logs.contains("\"message\":\"hoist is serving\""), "{logs}");
    assert!(logs.contains("\"message\":\"shutdown complete\""), "{logs}");
}

#[tokio::test]
async fn interceptor_runs_alone_and_probe_reads_it() {
    // Without routes there is nothing to run: a clear error, not a hang.
    let output = hoist(&["interceptor", "--admin-listen", "127.0.0.1:0"]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("[[interceptor.http_routes]]"),
        "{}",
        text(&output.stderr)
    );

    let upstream = format!("127.0.0.1:{}", free_port());
    let (_interceptor, admin_addr) = interceptor_process(&upstream, "", |command| {
        command.env("HOIST_KUBERNETES__ENABLED", "false");
    });
    assert_eq!(http_get(admin_addr, "/readyz").await.0, 200);
    let (status, body) = http_get(admin_addr, "/interceptor/routes").await;
    assert_eq!(status, 200);
    assert!(body.contains("\"web\""), "{body}");
    assert_eq!(
        http_get(admin_addr, "/status").await.0,
        404,
        "no scaler here"
    );

    let endpoint = format!("HOIST_INTERCEPTOR__ENDPOINTS={admin_addr}");
    let output = Command::new(env!("CARGO_BIN_EXE_hoist"))
        .env("HOIST_STATE_FILE", "")
        .env("HOIST_KUBERNETES__ENABLED", "false")
        .args(["probe", "-m", "scaler=http", "-m", "route=web"])
        .env(
            endpoint.split_once('=').unwrap().0,
            endpoint.split_once('=').unwrap().1,
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(printed.contains("value:           0"), "{printed}");
    assert!(
        printed.contains("metricName=http-web targetSize=10"),
        "{printed}"
    );
}

/// `interceptor.direct_to_pods` with `kubernetes.enabled = "auto"` and no
/// cluster to be found: the interceptor still starts and dials Services
/// by name, and its admin port says why it does not dial pods.
#[tokio::test]
async fn direct_to_pods_without_a_cluster_dials_services_and_says_why() {
    let home = tempfile::tempdir().unwrap();
    let upstream = "web.shop.svc.cluster.local:80";
    let extra = "direct_to_pods = true\n";
    let (_interceptor, admin_addr) = interceptor_process(upstream, extra, |command| {
        // No kubeconfig and no in-cluster account: `auto` finds none.
        command
            .env("KUBECONFIG", home.path().join("no-kubeconfig"))
            .env("HOME", home.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("HOIST_KUBERNETES__ENABLED")
            .env_remove("HOIST_KUBERNETES__KUBECONFIG");
    });
    let (status, body) = http_get(admin_addr, "/interceptor/services").await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["direct_to_pods"], false, "{body}");
    assert!(
        report["unavailable"]
            .as_str()
            .is_some_and(|why| why.contains("no Kubernetes configuration found")),
        "{body}"
    );
    assert_eq!(report["services"], serde_json::json!([]), "{body}");
}

/// `hoist interceptor` with one HTTP route, `web.test` to `upstream`,
/// `[interceptor]` settings `extra` (TOML lines) and its environment as
/// `environment` makes it, once it listens; its admin address.
fn interceptor_process(
    upstream: &str,
    extra: &str,
    environment: impl FnOnce(&mut Command),
) -> (Running, std::net::SocketAddr) {
    let (admin, proxy) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("interceptor.toml");
    std::fs::write(
        &config,
        format!(
            "[interceptor]\n{extra}http_listen = \"127.0.0.1:{proxy}\"\n[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.test\"\nupstream = \"{upstream}\"\n"
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_hoist"));
    command
        .env("HOIST_STATE_FILE", "")
        .env_remove("RUST_LOG")
        .args(["interceptor", "--config", config.to_str().unwrap()])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    environment(&mut command);
    let process = KillOnDrop(command.spawn().unwrap());
    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until(Duration::from_secs(10), "the interceptor to listen", || {
        std::net::TcpStream::connect(admin_addr).is_ok()
    });
    let running = Running {
        _process: process,
        _config: dir,
    };
    (running, admin_addr)
}

/// A process and its config directory, kept while it runs.
struct Running {
    _process: KillOnDrop,
    _config: tempfile::TempDir,
}

/// A child process that does not outlive a failing test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_descriptor_limit_stops_the_interceptor_before_grpc_and_admin() {
    let (grpc, admin, proxy) = (free_port(), free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(
        &file,
        format!(
            "[interceptor]\nhttp_listen = \"127.0.0.1:{proxy}\"\n[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.test\"\nupstream = \"127.0.0.1:{}\"\n",
            free_port()
        ),
    )
    .unwrap();
    let log = dir.path().join("hoist.log");
    // Soft 256, hard 512: hoist raises the soft limit to 512 and keeps
    // (512 - 128) / 2 = 192 client connections for the interceptor.
    let _hoist = KillOnDrop(
        Command::new("prlimit")
            .arg("--nofile=256:512")
            .arg(env!("CARGO_BIN_EXE_hoist"))
            .args(["serve", "--log-format", "json"])
            .args(["--config", file.to_str().unwrap()])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until(Duration::from_secs(10), "hoist to listen", || {
        std::net::TcpStream::connect(admin_addr).is_ok()
    });
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("\"open_files_limit\":512"), "{logs}");

    // More silent connections than the process has descriptors for.
    let silent: Vec<std::net::TcpStream> = (0..600)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", proxy)).ok())
        .collect();
    // Under load a few connects may fail on the client side; what counts
    // is that far more arrive than the interceptor may keep.
    let arrived = silent.len() as u64;
    assert!(arrived > 400, "only {arrived} connections arrived");
    let refused = || async {
        let (_, metrics) = http_get(admin_addr, "/metrics").await;
        metrics
            .lines()
            .find(|line| line.starts_with("hoist_interceptor_connections_refused_total{"))
            .and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let started = std::time::Instant::now();
    while refused().await < arrived - 192 {
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "refused: {}",
            refused().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The other listeners still answer.
    assert_eq!(http_get(admin_addr, "/healthz").await.0, 200);
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
        .unwrap()
        .connect()
        .await
        .expect("the gRPC port accepts");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("the gRPC port answers")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(!logs.contains("cannot accept"), "{logs}");
    drop(silent);
}
