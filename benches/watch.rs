//! Engine mode with thousands of ScaledObjects in the watch: `hoist serve`
//! (this build's binary) counting from the Kubernetes API served in this
//! process (`tests/support/kube_api.rs`: no API server can run here), one
//! engine-mode trigger per ScaledObject on one shared Service Bus queue
//! (served here too, Azure's recorded body). Measures hoist's CPU at rest,
//! per outside change of a target (a Deployment's `spec.replicas`) and per
//! status write of a ScaledObject (KEDA writes one on every poll of an
//! active object), and its RSS. Prints; fails nothing.
//!
//! `cargo bench --bench watch` (`BENCH_OBJECTS=10000` by default; run it
//! with 1000 too to see that the cost of a change does not follow N).

#[path = "../tests/support/kube_api.rs"]
mod kube_api;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use hoist::proto::ScaledObjectRef;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use kube_api::{FakeApi, with_triggers};
use serde_json::json;
use tokio::time::Instant;

const NAMESPACE: &str = "bench";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// utime + stime of `pid`, in clock ticks (USER_HZ, 100).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kib / 1024.0
}

/// One queue, answered with Azure's recorded body.
async fn service_bus() -> SocketAddr {
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/servicebus/queue-runtime-properties.active1-dlq1-sched1.api2017-04.dotnet.xml"
    ))
    .unwrap();
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move {
            (
                [(
                    "content-type",
                    "application/atom+xml; type=entry; charset=utf-8",
                )],
                body,
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn trigger(index: usize, connection: &str) -> ScaledObjectRef {
    let metadata: HashMap<String, String> = [
        ("scalerAddress", "hoist.keda:9090"),
        ("scaler", "azure-servicebus"),
        ("queueName", "jobs"),
        ("connectionFromEnv", connection),
        ("scalingMode", "engine"),
        ("pollingInterval", "300"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    ScaledObjectRef {
        name: format!("so-{index}"),
        namespace: NAMESPACE.into(),
        scaler_metadata: metadata,
    }
}

/// Percent of one core `pid` used over `window`.
async fn cpu_percent(pid: u32, window: Duration) -> f64 {
    let before = cpu_ticks(pid);
    tokio::time::sleep(window).await;
    (cpu_ticks(pid) - before) as f64 / window.as_secs_f64()
}

async fn run(objects: usize) {
    let api = FakeApi::start().await;
    let bus = service_bus().await;
    let connection = format!(
        "Endpoint=sb://{bus}/;SharedAccessKeyName=reader;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"
    );
    let triggers: Vec<ScaledObjectRef> = (0..objects).map(|i| trigger(i, &connection)).collect();
    let specs: Vec<serde_json::Value> = triggers
        .iter()
        .enumerate()
        .map(|(index, trigger)| {
            let spec =
                json!({"scaleTargetRef": {"name": format!("app-{index}")}, "maxReplicaCount": 10});
            with_triggers(spec, &[trigger])
        })
        .collect();
    for (index, (trigger, spec)) in triggers.iter().zip(&specs).enumerate() {
        api.put_scaled_object(NAMESPACE, &trigger.name, spec.clone());
        api.set_scale("deployments", NAMESPACE, &format!("app-{index}"), 1, 1);
    }

    let (grpc, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hoist.toml");
    std::fs::write(
        &config,
        format!(
            "state_file = \"\"\n[grpc]\nlisten = \"127.0.0.1:{grpc}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [kubernetes]\nkubeconfig = \"{}\"\n[limits]\nmax_tracked_triggers = {}\n[log]\nlevel = \"warn\"\n",
            api.kubeconfig().display(),
            objects + 100
        ),
    )
    .unwrap();
    let mut hoist = std::process::Command::new(env!("CARGO_BIN_EXE_hoist"))
        .args(["serve", "--config"])
        .arg(&config)
        .stderr(std::fs::File::create(dir.path().join("hoist.log")).unwrap())
        .spawn()
        .unwrap();
    let pid = hoist.id();
    let start_rss = {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", grpc))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "hoist did not listen");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        rss_mib(pid)
    };

    // KEDA asks for every trigger's metric spec.
    let started = Instant::now();
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut calls = tokio::task::JoinSet::new();
    for trigger in triggers.iter().cloned() {
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let mut client = ExternalScalerClient::new(channel.clone());
        calls.spawn(async move {
            let outcome = client.get_metric_spec(trigger).await;
            drop(permit);
            outcome.err().map(|status| status.message().to_string())
        });
    }
    let mut refused = 0;
    let mut first_refusal = None;
    while let Some(outcome) = calls.join_next().await {
        if let Some(message) = outcome.unwrap() {
            refused += 1;
            first_refusal.get_or_insert(message);
        }
    }
    if let Some(message) = &first_refusal {
        println!("first refusal: {message}");
    }
    let registered = started.elapsed();
    // Engines evaluate once at start, then every 300 s: let the start pass.
    tokio::time::sleep(Duration::from_secs(15)).await;

    let idle = cpu_percent(pid, Duration::from_secs(30)).await;
    let rss = rss_mib(pid);

    // Outside changes: 500 Deployments scaled by hand, 20 ms apart.
    let changes = 500;
    let before = cpu_ticks(pid);
    let window = Instant::now();
    for index in 0..changes {
        let target = (index * 7919) % objects;
        api.set_scale("deployments", NAMESPACE, &format!("app-{target}"), 2, 2);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let elapsed = window.elapsed().as_secs_f64();
    let ticks = (cpu_ticks(pid) - before) as f64 - idle * elapsed;
    let per_change_us = ticks.max(0.0) * 10_000.0 / changes as f64;
    let reads = api.scale_reads();

    // KEDA writes an active ScaledObject's status on every poll
    // (`lastActiveTime`): to hoist's watch that is the object modified
    // with its spec unchanged. 1,000 such writes, 10 ms apart.
    let writes = 1000;
    let before = cpu_ticks(pid);
    let window = Instant::now();
    for index in 0..writes {
        let object = (index * 7919) % objects;
        api.put_scaled_object(NAMESPACE, &triggers[object].name, specs[object].clone());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let elapsed = window.elapsed().as_secs_f64();
    let ticks = (cpu_ticks(pid) - before) as f64 - idle * elapsed;
    let per_write_us = ticks.max(0.0) * 10_000.0 / writes as f64;

    println!(
        "{objects} ScaledObjects in the watch (engine mode, one shared source): registered in {:.1} s ({refused} refused); \
         RSS {start_rss:.1} MiB at start, {rss:.1} MiB with them; CPU at rest {idle:.2} % of a core; \
         per outside change of a target {per_change_us:.0} µs of CPU ({changes} changes); {reads} /scale reads in all; \
         per status write of a ScaledObject {per_write_us:.0} µs of CPU ({writes} writes)",
        registered.as_secs_f64()
    );
    println!(
        "{{\"bench\":\"watch\",\"objects\":{objects},\"refused\":{refused},\"rss_start_mib\":{start_rss:.1},\"rss_mib\":{rss:.1},\"cpu_idle_pct\":{idle:.3},\"cpu_per_change_us\":{per_change_us:.1},\"scale_reads\":{reads},\"cpu_per_status_write_us\":{per_write_us:.1}}}"
    );
    let _ = hoist.kill();
    let _ = hoist.wait();
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs nothing.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let objects = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(run(objects));
}
