//! `scale`: memory and CPU at scale. Registers N ScaledObjects (M Redis
//! lists) and reads the server's RSS and CPU, idle and under KEDA's call
//! pattern.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use hoist::proto::ScaledObjectRef;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::grpc::{Method, call, channels, register, scaled_object};
use crate::process::{CpuWindow, open_fds, rss_kib, threads};
use crate::results::emit;

#[derive(Args)]
pub(super) struct ScaleArgs {
    #[arg(long)]
    target: String,
    /// hoist's admin address, for `hoist_pollers`.
    #[arg(long)]
    admin: SocketAddr,
    #[arg(long)]
    server_pid: u32,
    #[arg(long)]
    objects: usize,
    /// Distinct Redis lists (= pollers); objects share them round-robin.
    #[arg(long)]
    lists: usize,
    /// Redis servers (comma-separated host:port); lists spread over them.
    #[arg(long)]
    redis: String,
    /// pollingInterval of every trigger, in seconds; also the length of
    /// each measuring window, so every poller polls once per window.
    #[arg(long, default_value_t = 10)]
    interval: u64,
    /// Requests in flight at most while registering and emulating KEDA.
    #[arg(long, default_value_t = 64)]
    parallel: usize,
}

async fn admin_metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = http_get(admin, "/metrics").await.ok()?;
    body.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("no HTTP status line from {addr}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// KEDA's call pattern for `objects`: one IsActive per object per
/// polling interval (the operator's loop) and one GetMetrics per object
/// every 15 s (the HPA's sync period), evenly spread, for `length`.
/// Returns (calls made, errors).
async fn keda_calls(
    channels: &[Channel],
    objects: Arc<Vec<ScaledObjectRef>>,
    metric_names: Arc<Vec<String>>,
    interval: Duration,
    length: Duration,
    parallel: usize,
) -> (u64, u64) {
    let per_second = objects.len() as f64 / interval.as_secs_f64() + objects.len() as f64 / 15.0;
    let gate = Arc::new(Semaphore::new(parallel.max(1)));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut sent = 0u64;
    let mut next_active = 0usize;
    let mut next_metrics = 0usize;
    let active_share = (1.0 / interval.as_secs_f64()) / (1.0 / interval.as_secs_f64() + 1.0 / 15.0);
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < length {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * per_second) as u64;
        while sent < due {
            let permit = gate.clone().acquire_owned().await.expect("open semaphore");
            let is_active = (next_active as f64) < (sent as f64 + 1.0) * active_share;
            let (method, index) = if is_active {
                next_active += 1;
                (Method::IsActive, next_active % objects.len())
            } else {
                next_metrics += 1;
                (Method::GetMetrics, next_metrics % objects.len())
            };
            let mut client =
                ExternalScalerClient::new(channels[sent as usize % channels.len()].clone());
            let objects = objects.clone();
            let metric_names = metric_names.clone();
            let errors = errors.clone();
            tasks.spawn(async move {
                let _permit = permit;
                if call(&mut client, method, &objects[index], &metric_names[index])
                    .await
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            });
            sent += 1;
            while tasks.try_join_next().is_some() {}
        }
    }
    while tasks.join_next().await.is_some() {}
    (sent, errors.load(Ordering::Relaxed))
}

pub(super) async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    let redis: Vec<&str> = args.redis.split(',').map(str::trim).collect();
    let lists = args.lists.clamp(1, args.objects.max(1));
    let interval = args.interval.max(1);
    let interval_text = interval.to_string();
    let pid = args.server_pid;
    let rss_start = rss_kib(pid).ok_or_else(|| anyhow!("no process {pid}"))?;
    let fds_start = open_fds(pid);
    let mut metric_names = Vec::with_capacity(args.objects);
    let objects: Arc<Vec<ScaledObjectRef>> = Arc::new(
        (0..args.objects)
            .map(|index| {
                let list = index % lists;
                let list_name = format!("list-{list:05}");
                metric_names.push(format!("redis-{list_name}"));
                scaled_object(
                    format!("so-{index:05}"),
                    &[
                        ("scaler", "redis"),
                        ("address", redis[list % redis.len()]),
                        ("listName", &list_name),
                        ("listLength", "5"),
                        ("pollingInterval", &interval_text),
                    ],
                )
            })
            .collect(),
    );
    let metric_names = Arc::new(metric_names);
    let channels = channels(&args.target, 4).await?;
    let (errors, first_error, took) = register(
        &channels,
        objects.clone(),
        Some(metric_names.clone()),
        args.parallel,
    )
    .await;
    eprintln!(
        "{} objects on {} lists registered in {:.1} s ({} errors{})",
        args.objects,
        lists,
        took.as_secs_f64(),
        errors,
        first_error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );
    // Wait until every poller runs (they start with the first read).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pollers = 0.0;
    while Instant::now() < deadline {
        pollers = admin_metric(args.admin, "hoist_pollers")
            .await
            .unwrap_or(0.0);
        if pollers as usize >= lists {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tracked = admin_metric(args.admin, "hoist_tracked_triggers")
        .await
        .unwrap_or(0.0);
    // Let the registration's burst of first polls pass into the steady state.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let window = Duration::from_secs(interval);
    let idle = CpuWindow::start(pid).ok_or_else(|| anyhow!("no process {pid}"))?;
    tokio::time::sleep(window).await;
    let (idle_pct, idle_seconds) = idle
        .finish()
        .ok_or_else(|| anyhow!("process {pid} ended"))?;
    let rss_idle = rss_kib(pid).unwrap_or(0);

    let busy = CpuWindow::start(pid).ok_or_else(|| anyhow!("no process {pid}"))?;
    let (calls, call_errors) = keda_calls(
        &channels,
        objects.clone(),
        metric_names.clone(),
        window,
        window,
        args.parallel,
    )
    .await;
    let (keda_pct, keda_seconds) = busy
        .finish()
        .ok_or_else(|| anyhow!("process {pid} ended"))?;
    let rss_end = rss_kib(pid).unwrap_or(0);
    let mib = |kib: u64| kib as f64 / 1024.0;
    let result = json!({
        "bench": "scale",
        "objects": args.objects,
        "lists": lists,
        "redis_servers": redis.len(),
        "pollers": pollers,
        "tracked": tracked,
        "interval_s": interval,
        "register_s": took.as_secs_f64(),
        "register_errors": errors,
        "first_error": first_error,
        "rss_start_mib": mib(rss_start),
        "rss_mib": mib(rss_idle),
        "rss_after_calls_mib": mib(rss_end),
        "rss_per_object_kib": (rss_idle.saturating_sub(rss_start)) as f64 / args.objects.max(1) as f64,
        "threads": threads(pid),
        "fds_start": fds_start,
        "fds": open_fds(pid),
        "cpu_idle_pct": idle_pct,
        "cpu_per_poll_us": idle_seconds * 1e6 / (pollers.max(1.0)),
        "cpu_keda_pct": keda_pct,
        "keda_calls": calls,
        "keda_call_errors": call_errors,
        "cpu_per_call_us": (keda_seconds - idle_seconds).max(0.0) * 1e6 / calls.max(1) as f64,
    });
    eprintln!(
        "{} objects / {} pollers: RSS {:.1} MiB (start {:.1}), CPU {:.1} % idle, {:.1} % with {} KEDA calls",
        args.objects,
        pollers,
        mib(rss_idle),
        mib(rss_start),
        idle_pct,
        keda_pct,
        calls
    );
    emit(result);
    Ok(())
}
