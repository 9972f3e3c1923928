//! `rpc`: GetMetrics / IsActive throughput and latency from N concurrent
//! clients over distinct ScaledObjects, against hoist or the bare server.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use hdrhistogram::Histogram;
use hoist::proto::ScaledObjectRef;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use serde_json::json;
use tokio::time::Instant;

use crate::grpc::{Method, call, channels, register, scaled_object};
use crate::process::CpuWindow;
use crate::results::emit;

fn new_histogram() -> Histogram<u64> {
    // 1 ns to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

#[derive(Args)]
pub(super) struct RpcArgs {
    /// host:port of the gRPC server.
    #[arg(long)]
    target: String,
    #[arg(long, value_enum, default_value = "get-metrics")]
    method: Method,
    /// Requests in flight at once (one client loop each).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// HTTP/2 connections the clients share (default: one per client).
    #[arg(long)]
    connections: Option<usize>,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Distinct ScaledObjects asked about, round-robin.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// The Redis their trigger points at.
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis: String,
    /// The one list every object's trigger counts (one poller).
    #[arg(long, default_value = "bench")]
    list: String,
    /// The server's process, for its CPU use.
    #[arg(long)]
    server_pid: Option<u32>,
    /// What the server is, for the results (`hoist`, `bare`).
    #[arg(long, default_value = "hoist")]
    label: String,
}

pub(super) async fn rpc(args: RpcArgs) -> anyhow::Result<()> {
    let connections = args.connections.unwrap_or(args.concurrency).max(1);
    let channels = channels(&args.target, connections).await?;
    let objects: Arc<Vec<ScaledObjectRef>> = Arc::new(
        (0..args.objects.max(1))
            .map(|index| {
                scaled_object(
                    format!("so-{index:05}"),
                    &[
                        ("scaler", "redis"),
                        ("address", &args.redis),
                        ("listName", &args.list),
                        ("listLength", "5"),
                    ],
                )
            })
            .collect(),
    );
    let metric_name = format!("redis-{}", args.list);
    // First reads: every object is tracked and cached before measuring.
    let (errors, first_error, took) = register(&channels, objects.clone(), None, 64).await;
    if errors > 0 {
        bail!(
            "{errors} of {} first reads failed: {}",
            objects.len(),
            first_error.unwrap_or_default()
        );
    }
    eprintln!(
        "{}: {} objects read once in {:.2} s",
        args.label,
        objects.len(),
        took.as_secs_f64()
    );

    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let server_pid = args.server_pid;
    let sampler = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from).await;
        let server = server_pid.and_then(CpuWindow::start);
        let client = CpuWindow::start(std::process::id());
        tokio::time::sleep_until(end).await;
        (
            server.and_then(|w| w.finish()),
            client.and_then(|w| w.finish()),
        )
    });
    let mut workers = Vec::new();
    for worker in 0..args.concurrency.max(1) {
        let mut client = ExternalScalerClient::new(channels[worker % channels.len()].clone());
        let objects = objects.clone();
        let method = args.method;
        let stride = args.concurrency.max(1);
        let metric_name = metric_name.clone();
        workers.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut errors = 0u64;
            let mut first_error = None;
            let mut index = worker;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let object = &objects[index % objects.len()];
                index += stride;
                let outcome = call(&mut client, method, object, &metric_name).await;
                if sent >= measure_from {
                    match outcome {
                        Ok(()) => histogram.saturating_record(sent.elapsed().as_nanos() as u64),
                        Err(status) => {
                            errors += 1;
                            first_error.get_or_insert_with(|| status.message().to_string());
                        }
                    }
                }
            }
            (histogram, errors, first_error)
        }));
    }
    let mut histogram = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    for worker in workers {
        let (h, e, f) = worker.await?;
        histogram.add(&h)?;
        errors += e;
        first_error = first_error.or(f);
    }
    let (server_cpu, client_cpu) = sampler.await?;
    let seconds = args.duration.as_secs_f64();
    let requests = histogram.len();
    let rps = requests as f64 / seconds;
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    let result = json!({
        "bench": "rpc",
        "target": args.label,
        "method": args.method.name(),
        "concurrency": args.concurrency,
        "connections": connections,
        "objects": objects.len(),
        "seconds": seconds,
        "requests": requests,
        "errors": errors,
        "first_error": first_error,
        "rps": rps,
        "p50_us": us(0.5),
        "p99_us": us(0.99),
        "p999_us": us(0.999),
        "max_us": histogram.max() as f64 / 1000.0,
        "server_cpu_pct": server_cpu.map(|(pct, _)| pct),
        "server_cpu_us_per_request": server_cpu.map(|(_, s)| s * 1e6 / requests.max(1) as f64),
        "client_cpu_pct": client_cpu.map(|(pct, _)| pct),
    });
    eprintln!(
        "{} {} c={}: {:.0} req/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, server CPU {:.0} %, errors {}",
        args.label,
        args.method.name(),
        args.concurrency,
        rps,
        us(0.5),
        us(0.99),
        us(0.999),
        server_cpu.map_or(f64::NAN, |(pct, _)| pct),
        errors
    );
    emit(result);
    Ok(())
}
