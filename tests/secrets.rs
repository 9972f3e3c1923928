//! No secret reaches a log line, `/status`, `/metrics`, `check-config` or
//! an error message: every trigger is driven with known secret values
//! (from metadata, as KEDA resolves `…FromEnv`, and from auth profiles),
//! against sources that refuse them, and every output is searched.

mod support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use hoist::proto::external_scaler_client::ExternalScalerClient;
use hoist::proto::{GetMetricsRequest, ScaledObjectRef};
use rdkafka::mocking::MockCluster;
use support::{RedisServer, free_port, http_get, object, wait_until};

const CANARIES: [&str; 6] = [
    "canary-redis-metadata-4471",
    "canary-redis-profile-9132",
    "canary-kafka-password-5520",
    "Y2FuYXJ5LXNlcnZpY2VidXMta2V5",
    "canary-sentinel-8802",
    "canary-tls-key-7713",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_logs_status_metrics_or_errors() {
    let redis = RedisServer::start_with(&["--requirepass", "the-real-password"]);
    let kafka = MockCluster::new(1).unwrap();
    let bootstrap = kafka.bootstrap_servers();
    // A Service Bus namespace that refuses every key.
    let refusing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let servicebus = refusing.local_addr().unwrap();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async {
            (
                axum::http::StatusCode::UNAUTHORIZED,
                "<Error><Code>401</Code><Detail>claim is empty or token is invalid.</Detail></Error>",
            )
        });
        axum::serve(refusing, app).await
    });

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hoist.toml");
    std::fs::write(
        &config,
        format!(
            r#"
# No cluster here: profiles are lent to trusted callers only.
[grpc]
trust_callers = true
[auth.redis]
namespaces = ["default"]
password = "{}"
[auth.kafka]
namespaces = ["default"]
sasl = "plaintext"
username = "scaler"
password = "{}"
[auth.tls]
namespaces = ["default"]
tls = "enable"
cert = "-----BEGIN CERTIFICATE-----"
key = "{}"
"#,
            CANARIES[1], CANARIES[2], CANARIES[5]
        ),
    )
    .unwrap();

    let (grpc, admin) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hoist"))
        .args([
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--log-format",
            "json",
        ])
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drain the logs as they come: a full pipe would stall the server.
    let mut stderr = child.stderr.take().unwrap();
    let log_reader = std::thread::spawn(move || {
        let mut logs = String::new();
        let _ = stderr.read_to_string(&mut logs);
        logs
    });
    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until(Duration::from_secs(10), "hoist to listen", || {
        std::net::TcpStream::connect(admin_addr).is_ok()
    });
    let mut client = ExternalScalerClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();

    let sb = format!(
        "Endpoint=sb://{servicebus}/;SharedAccessKeyName=reader;SharedAccessKey={};UseDevelopmentEmulator=true",
        CANARIES[3]
    );
    let triggers: Vec<ScaledObjectRef> = vec![
        object(
            "redis-metadata",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "a"),
                ("passwordFromEnv", CANARIES[0]),
                ("timeout", "1000"),
            ],
        ),
        object(
            "redis-profile",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "b"),
                ("authRef", "redis"),
                ("timeout", "1000"),
            ],
        ),
        object(
            "redis-tls",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "c"),
                ("authRef", "tls"),
                ("timeout", "1000"),
            ],
        ),
        object(
            "sentinel",
            &[
                ("scaler", "redis-sentinel"),
                ("addresses", &redis.address()),
                ("sentinelMaster", "mymaster"),
                ("sentinelPasswordFromEnv", CANARIES[4]),
                ("listName", "d"),
                ("timeout", "1000"),
            ],
        ),
        object(
            "kafka",
            &[
                ("scaler", "kafka"),
                ("bootstrapServers", &bootstrap),
                ("consumerGroup", "g"),
                ("topic", "t"),
                ("authRef", "kafka"),
                ("timeout", "1000"),
            ],
        ),
        object(
            "servicebus",
            &[
                ("scaler", "azure-servicebus"),
                ("queueName", "q"),
                ("connectionFromEnv", &sb),
                ("timeout", "2000"),
            ],
        ),
    ];
    let mut answers = String::new();
    for trigger in &triggers {
        for _ in 0..2 {
            let outcome = client
                .get_metrics(GetMetricsRequest {
                    scaled_object_ref: Some(trigger.clone()),
                    metric_name: String::new(),
                })
                .await;
            answers.push_str(&format!("{outcome:?}\n"));
            answers.push_str(&format!("{:?}\n", client.is_active(trigger.clone()).await));
            answers.push_str(&format!(
                "{:?}\n",
                client.get_metric_spec(trigger.clone()).await
            ));
        }
    }
    assert!(
        answers.contains("Unavailable"),
        "the sources refused: {answers}"
    );
    let (_, status) = http_get(admin_addr, "/status").await;
    let (_, metrics) = http_get(admin_addr, "/metrics").await;
    assert!(status.contains("redis-profile"), "{status}");

    let check = Command::new(env!("CARGO_BIN_EXE_hoist"))
        .args(["check-config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let checked = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(checked.contains("***"), "{checked}");

    let stopped = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    child.wait().unwrap();
    let logs = log_reader.join().unwrap();
    assert!(logs.contains("tracking trigger"), "the logs were captured");

    for (what, text) in [
        ("gRPC answers", &answers),
        ("/status", &status),
        ("/metrics", &metrics),
        ("check-config", &checked),
        ("logs", &logs),
    ] {
        for canary in CANARIES {
            assert!(!text.contains(canary), "{canary} leaked into {what}");
        }
    }
}
