//! `hoist-load`: the load generator and helpers behind `scripts/bench.sh`.
//!
//! Every measuring subcommand prints one JSON object on standard output
//! (the results file `scripts/bench.sh` collects) and a human summary on
//! standard error. `hoist-load report` turns the collected lines into the
//! tables of docs/BENCHMARKS.md.
//!
//! - `bare-server`: a tonic server answering the ExternalScaler contract
//!   with constants: the stack's own limit, to compare hoist with.
//! - `rpc`: GetMetrics / IsActive throughput and latency from N concurrent
//!   clients over distinct ScaledObjects.
//! - `scale`: registers N ScaledObjects (M Redis lists) and reads the
//!   server's RSS and CPU, idle and under KEDA's call pattern.
//! - `redis-load`, `kafka-load`: what the sources see (Redis'
//!   `INFO commandstats`; the requests librdkafka's mock cluster received).
//! - `upstream`: a small HTTP/1.1 server for the interceptor benchmarks.
//! - `cold-start`: request held at zero → push to StreamIsActive →
//!   response once the upstream listens.
//! - `free-ports`, `report`: helpers for the script.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use futures::Stream;
use hdrhistogram::Histogram;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use hoist::proto::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use hoist::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// hoist-load: load generator and measuring helpers for scripts/bench.sh.
#[derive(Parser)]
#[command(name = "hoist-load")]
struct Cli {
    /// Tokio worker threads (default: the CPUs this process may run on).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A bare tonic server answering the ExternalScaler contract with
    /// constants (`hoist::proto`): the stack's limit.
    BareServer(BareServerArgs),
    /// GetMetrics or IsActive load from concurrent clients.
    Rpc(RpcArgs),
    /// Registers many ScaledObjects and reads the server's RSS and CPU.
    Scale(ScaleArgs),
    /// Counts what Redis runs for many ScaledObjects on one list.
    RedisLoad(RedisLoadArgs),
    /// Counts the Kafka requests hoist makes per poll of a wide topic,
    /// against librdkafka's mock cluster started in this process.
    KafkaLoad(KafkaLoadArgs),
    /// A small HTTP/1.1 server (keep-alive, a fixed body).
    Upstream(UpstreamArgs),
    /// A minimal reverse proxy on the interceptor's stack (hyper server,
    /// hyper-util's pooled client), forwarding as is: the stack's limit.
    BareProxy(BareProxyArgs),
    /// Cold-start latency through hoist's interceptor.
    ColdStart(ColdStartArgs),
    /// Prints N free loopback ports.
    FreePorts { count: usize },
    /// Renders collected results as Markdown into a document.
    Report(ReportArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(threads) = cli.threads {
        builder.worker_threads(threads.max(1));
    }
    let runtime = builder.build()?;
    match cli.command {
        Command::BareServer(args) => runtime.block_on(bare_server(args)),
        Command::Rpc(args) => runtime.block_on(rpc(args)),
        Command::Scale(args) => runtime.block_on(scale(args)),
        Command::RedisLoad(args) => runtime.block_on(redis_load(args)),
        Command::KafkaLoad(args) => kafka_load(&runtime, args),
        Command::Upstream(args) => runtime.block_on(upstream(args)),
        Command::BareProxy(args) => runtime.block_on(bare_proxy(args)),
        Command::ColdStart(args) => runtime.block_on(cold_start(args)),
        Command::FreePorts { count } => {
            let listeners = (0..count)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
                .collect::<Result<Vec<_>, _>>()?;
            let ports: Vec<String> = listeners
                .iter()
                .map(|l| l.local_addr().map(|a| a.port().to_string()))
                .collect::<Result<_, _>>()?;
            println!("{}", ports.join(" "));
            Ok(())
        }
        Command::Report(args) => report(args),
    }
}

// ---------------------------------------------------------------------------
// Process statistics

/// Linux reports CPU time in /proc in USER_HZ, 100 on every mainstream
/// architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime of a process, in ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields start after its `)`.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// VmRSS in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Threads of a process.
fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|rest| rest.trim().parse().ok())
}

/// Open file descriptors of a process.
fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// CPU used by `pid` between two readings, as a percentage of one core.
struct CpuWindow {
    pid: u32,
    ticks: u64,
    at: Instant,
}

impl CpuWindow {
    fn start(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            ticks: cpu_ticks(pid)?,
            at: Instant::now(),
        })
    }

    /// (percent of one core, CPU seconds used)
    fn finish(&self) -> Option<(f64, f64)> {
        let ticks = cpu_ticks(self.pid)?.saturating_sub(self.ticks);
        let seconds = ticks as f64 / TICKS_PER_SECOND;
        let elapsed = self.at.elapsed().as_secs_f64();
        Some((100.0 * seconds / elapsed, seconds))
    }
}

fn emit(result: Value) {
    println!("{result}");
}

// ---------------------------------------------------------------------------
// The bare server

#[derive(Args)]
struct BareServerArgs {
    #[arg(long, default_value = "127.0.0.1:9190")]
    listen: SocketAddr,
    /// The metric name answered, so responses are as large as hoist's.
    #[arg(long, default_value = "redis-bench")]
    metric_name: String,
    /// Accept connections as `hoist serve` does (a `TcpListenerStream`
    /// passed to `serve_with_incoming`, where tonic sets no TCP_NODELAY)
    /// instead of tonic's `serve` (TCP_NODELAY on).
    #[arg(long)]
    incoming: bool,
    /// With `--incoming`: accept through tonic's `TcpIncoming` with
    /// TCP_NODELAY set instead (the fix proposed for `hoist serve`).
    #[arg(long, requires = "incoming")]
    nodelay: bool,
}

struct Bare {
    metric_name: String,
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Bare {
    async fn is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        Ok(Response::new(IsActiveResponse { result: false }))
    }

    type StreamIsActiveStream = ActivityStream;

    async fn stream_is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        Ok(Response::new(Box::pin(futures::stream::pending())))
    }

    async fn get_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: self.metric_name.clone(),
                target_size: 5,
                target_size_float: 5.0,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        _request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: self.metric_name.clone(),
                metric_value: 0,
                metric_value_float: 0.0,
            }],
        }))
    }
}

async fn bare_server(args: BareServerArgs) -> anyhow::Result<()> {
    eprintln!("bare ExternalScaler server on {}", args.listen);
    let router = tonic::transport::Server::builder().add_service(ExternalScalerServer::new(Bare {
        metric_name: args.metric_name,
    }));
    if args.incoming && args.nodelay {
        let listener = TcpListener::bind(args.listen).await?;
        router
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await?;
    } else if args.incoming {
        let listener = TcpListener::bind(args.listen).await?;
        router
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await?;
    } else {
        // tonic's own defaults (`serve`: TCP_NODELAY on), nothing else.
        router.serve(args.listen).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// gRPC clients

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Method {
    GetMetrics,
    IsActive,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::GetMetrics => "GetMetrics",
            Method::IsActive => "IsActive",
        }
    }
}

async fn channels(target: &str, count: usize) -> anyhow::Result<Vec<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        channels.push(
            endpoint
                .connect()
                .await
                .with_context(|| format!("cannot connect to {target}"))?,
        );
    }
    Ok(channels)
}

fn scaled_object(name: String, metadata: &[(&str, &str)]) -> ScaledObjectRef {
    let mut scaler_metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // KEDA passes its own keys through; hoist ignores them.
    scaler_metadata.insert("scalerAddress".into(), "hoist.keda.svc:9090".into());
    ScaledObjectRef {
        name,
        namespace: "bench".into(),
        scaler_metadata,
    }
}

/// One call; Ok(()) or the gRPC status.
async fn call(
    client: &mut ExternalScalerClient<Channel>,
    method: Method,
    object: &ScaledObjectRef,
    metric_name: &str,
) -> Result<(), Status> {
    match method {
        Method::GetMetrics => client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(object.clone()),
                metric_name: metric_name.to_string(),
            })
            .await
            .map(|_| ()),
        Method::IsActive => client.is_active(object.clone()).await.map(|_| ()),
    }
}

/// Asks about every object once (the first read, which starts tracking
/// it), `parallel` at a time. Returns (errors, first error, time taken).
async fn register(
    channels: &[Channel],
    objects: Arc<Vec<ScaledObjectRef>>,
    metric_name: Option<Arc<Vec<String>>>,
    parallel: usize,
) -> (u64, Option<String>, Duration) {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..parallel.max(1) {
        let mut client = ExternalScalerClient::new(channels[worker % channels.len()].clone());
        let objects = objects.clone();
        let next = next.clone();
        let metric_name = metric_name.clone();
        tasks.push(tokio::spawn(async move {
            let mut errors = 0u64;
            let mut first = None;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(object) = objects.get(index) else {
                    break;
                };
                let name = metric_name
                    .as_ref()
                    .map(|names| names[index].as_str())
                    .unwrap_or("");
                if let Err(status) = call(&mut client, Method::GetMetrics, object, name).await {
                    errors += 1;
                    first.get_or_insert_with(|| {
                        format!("{:?}: {}", status.code(), status.message())
                    });
                }
            }
            (errors, first)
        }));
    }
    let mut errors = 0;
    let mut first = None;
    for task in tasks {
        if let Ok((e, f)) = task.await {
            errors += e;
            if first.is_none() {
                first = f;
            }
        }
    }
    (errors, first, started.elapsed())
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

#[derive(Args)]
struct RpcArgs {
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

async fn rpc(args: RpcArgs) -> anyhow::Result<()> {
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

// ---------------------------------------------------------------------------
// Memory and CPU at scale

#[derive(Args)]
struct ScaleArgs {
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

async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
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

// ---------------------------------------------------------------------------
// Source load

#[derive(Args)]
struct RedisLoadArgs {
    #[arg(long)]
    target: String,
    #[arg(long)]
    redis: String,
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    #[arg(long, default_value = "shared")]
    list: String,
    /// pollingInterval, seconds.
    #[arg(long, default_value_t = 1)]
    interval: u64,
    /// Polling intervals to count over.
    #[arg(long, default_value_t = 10)]
    intervals: u64,
}

async fn command_calls(
    connection: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect())
}

async fn redis_load(args: RedisLoadArgs) -> anyhow::Result<()> {
    let client = redis::Client::open(format!("redis://{}/", args.redis))?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("DEL")
        .arg(&args.list)
        .query_async(&mut connection)
        .await?;
    let _: () = redis::cmd("RPUSH")
        .arg(&args.list)
        .arg("a")
        .arg("b")
        .arg("c")
        .query_async(&mut connection)
        .await?;
    let interval = args.interval.to_string();
    let objects: Arc<Vec<ScaledObjectRef>> = Arc::new(
        (0..args.objects)
            .map(|index| {
                scaled_object(
                    format!("shared-{index:05}"),
                    &[
                        ("scaler", "redis"),
                        ("address", &args.redis),
                        ("listName", &args.list),
                        ("pollingInterval", &interval),
                    ],
                )
            })
            .collect(),
    );
    let channels = channels(&args.target, 4).await?;
    let (errors, first_error, _) = register(&channels, objects.clone(), None, 64).await;
    if errors > 0 {
        bail!(
            "{errors} first reads failed: {}",
            first_error.unwrap_or_default()
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = command_calls(&mut connection).await?;
    let started = Instant::now();
    // KEDA asks about every object once per interval meanwhile: all of
    // it must come from the cache.
    let mut asked = 0u64;
    for round in 0..args.intervals {
        let (errors, first_error, _) = register(&channels, objects.clone(), None, 64).await;
        if errors > 0 {
            bail!("{errors} reads failed: {}", first_error.unwrap_or_default());
        }
        asked += objects.len() as u64;
        tokio::time::sleep_until(started + Duration::from_secs(args.interval * (round + 1))).await;
    }
    let window = started.elapsed();
    let after = command_calls(&mut connection).await?;
    let delta = |name: &str| after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0);
    // Our own INFO is one of the `info` calls.
    let result = json!({
        "bench": "redis-load",
        "objects": args.objects,
        "interval_s": args.interval,
        "intervals": args.intervals,
        "window_s": window.as_secs_f64(),
        "get_metrics_calls": asked,
        "llen": delta("llen"),
        "evalsha": delta("evalsha"),
        "eval": delta("eval"),
        "type": delta("type"),
        "all_commands": after.values().sum::<u64>() - before.values().sum::<u64>() - 1,
    });
    eprintln!(
        "{} objects on one list, {} GetMetrics over {} intervals: {} LLEN",
        args.objects,
        asked,
        args.intervals,
        delta("llen")
    );
    emit(result);
    Ok(())
}

#[derive(Args)]
struct KafkaLoadArgs {
    #[arg(long)]
    target: String,
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    #[arg(long, default_value_t = 1000)]
    partitions: i32,
    #[arg(long, default_value_t = 3)]
    brokers: i32,
    #[arg(long, default_value_t = 1)]
    interval: u64,
    #[arg(long, default_value_t = 10)]
    intervals: u64,
}

fn api_name(key: i16) -> String {
    match key {
        0 => "Produce",
        1 => "Fetch",
        2 => "ListOffsets",
        3 => "Metadata",
        8 => "OffsetCommit",
        9 => "OffsetFetch",
        10 => "FindCoordinator",
        11 => "JoinGroup",
        12 => "Heartbeat",
        18 => "ApiVersions",
        19 => "CreateTopics",
        32 => "DescribeConfigs",
        36 => "SaslAuthenticate",
        71 => "GetTelemetrySubscriptions",
        _ => return format!("api-{key}"),
    }
    .to_string()
}

/// The requests the mock cluster received since tracking started:
/// (API key, timestamp in µs).
fn mock_requests(cluster: *mut rdkafka::bindings::rd_kafka_mock_cluster_t) -> Vec<(i16, i64)> {
    use rdkafka::bindings as rd;
    let mut count = 0usize;
    // SAFETY: the cluster outlives this call; the array and its requests
    // are ours to free, once, after reading them.
    unsafe {
        let requests = rd::rd_kafka_mock_get_requests(cluster, &mut count);
        if requests.is_null() {
            return Vec::new();
        }
        let list = (0..count)
            .map(|i| {
                let request = *requests.add(i);
                (
                    rd::rd_kafka_mock_request_api_key(request),
                    rd::rd_kafka_mock_request_timestamp(request),
                )
            })
            .collect();
        rd::rd_kafka_mock_request_destroy_array(requests, count);
        list
    }
}

fn kafka_load(runtime: &tokio::runtime::Runtime, args: KafkaLoadArgs) -> anyhow::Result<()> {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};

    // A producer with test.mock.num.brokers owns a mock cluster; its raw
    // handle gives the request log rdkafka's MockCluster does not expose.
    let producer: BaseProducer = ClientConfig::new()
        .set("test.mock.num.brokers", args.brokers.to_string())
        .set("log_level", "3")
        .create()?;
    let mock = producer
        .client()
        .mock_cluster()
        .ok_or_else(|| anyhow!("no mock cluster"))?;
    let bootstrap = mock.bootstrap_servers();
    let topic = "wide";
    mock.create_topic(topic, args.partitions, 1)?;
    // SAFETY: the producer (and so the cluster) lives until the end.
    let cluster =
        unsafe { rdkafka::bindings::rd_kafka_handle_mock_cluster(producer.client().native_ptr()) };
    if cluster.is_null() {
        bail!("no mock cluster handle");
    }
    // Two messages per partition; the group committed 1: lag 1 each.
    for partition in 0..args.partitions {
        for _ in 0..2 {
            producer
                .send(
                    BaseRecord::<(), _>::to(topic)
                        .partition(partition)
                        .payload("m"),
                )
                .map_err(|(e, _)| e)?;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    let group = "wide-group";
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()?;
    let mut list = TopicPartitionList::new();
    for partition in 0..args.partitions {
        list.add_partition_offset(topic, partition, Offset::Offset(1))?;
    }
    consumer.commit(&list, CommitMode::Sync)?;
    drop(consumer);

    let interval = args.interval.to_string();
    let objects: Arc<Vec<ScaledObjectRef>> = Arc::new(
        (0..args.objects)
            .map(|index| {
                scaled_object(
                    format!("kafka-{index:05}"),
                    &[
                        ("scaler", "kafka"),
                        ("bootstrapServers", &bootstrap),
                        ("consumerGroup", group),
                        ("topic", topic),
                        ("pollingInterval", &interval),
                        ("timeout", "10000"),
                        ("allowIdleConsumers", "true"),
                    ],
                )
            })
            .collect(),
    );
    let value = runtime.block_on(async {
        let channels = channels(&args.target, 4).await?;
        let (errors, first_error, took) = register(&channels, objects.clone(), None, 64).await;
        if errors > 0 {
            bail!(
                "{errors} first reads failed: {}",
                first_error.unwrap_or_default()
            );
        }
        eprintln!(
            "{} Kafka objects registered in {:.2} s",
            objects.len(),
            took.as_secs_f64()
        );
        let mut client = ExternalScalerClient::new(channels[0].clone());
        let response = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(objects[0].clone()),
                metric_name: String::new(),
            })
            .await?
            .into_inner();
        anyhow::Ok(response.metric_values.first().map(|v| v.metric_value_float))
    })?;

    // SAFETY: see above.
    unsafe {
        rdkafka::bindings::rd_kafka_mock_start_request_tracking(cluster);
        rdkafka::bindings::rd_kafka_mock_clear_requests(cluster);
    }
    let window = Duration::from_secs(args.interval * args.intervals);
    let asked = runtime.block_on(async {
        let channels = channels(&args.target, 4).await?;
        let started = Instant::now();
        let mut asked = 0u64;
        for round in 0..args.intervals {
            register(&channels, objects.clone(), None, 64).await;
            asked += objects.len() as u64;
            tokio::time::sleep_until(started + Duration::from_secs(args.interval * (round + 1)))
                .await;
        }
        anyhow::Ok(asked)
    })?;
    let requests = mock_requests(cluster);
    // SAFETY: see above.
    unsafe { rdkafka::bindings::rd_kafka_mock_stop_request_tracking(cluster) };

    let mut by_api: BTreeMap<String, u64> = BTreeMap::new();
    for (key, _) in &requests {
        *by_api.entry(api_name(*key)).or_default() += 1;
    }
    // Polls show as bursts of requests; a gap of 200 ms separates them.
    let mut stamps: Vec<i64> = requests.iter().map(|(_, at)| *at).collect();
    stamps.sort_unstable();
    let bursts = if stamps.is_empty() {
        0
    } else {
        1 + stamps.windows(2).filter(|w| w[1] - w[0] > 200_000).count()
    };
    let result = json!({
        "bench": "kafka-load",
        "objects": args.objects,
        "partitions": args.partitions,
        "brokers": args.brokers,
        "interval_s": args.interval,
        "intervals": args.intervals,
        "window_s": window.as_secs_f64(),
        "get_metrics_calls": asked,
        "lag": value,
        "requests": requests.len(),
        "bursts": bursts,
        "by_api": by_api,
    });
    eprintln!(
        "{} objects, {} partitions on {} brokers, {} intervals: {} requests in {} bursts: {:?}",
        args.objects,
        args.partitions,
        args.brokers,
        args.intervals,
        requests.len(),
        bursts,
        by_api
    );
    emit(result);
    drop(mock);
    drop(producer);
    Ok(())
}

// ---------------------------------------------------------------------------
// HTTP upstream and cold starts

#[derive(Args)]
struct UpstreamArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// The response body.
    #[arg(long, default_value = "hello from upstream\n")]
    body: String,
}

async fn upstream(args: UpstreamArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    eprintln!("upstream on {}", args.listen);
    let body = Bytes::from(args.body);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_request| {
                let body = body.clone();
                async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(body))) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[derive(Args)]
struct BareProxyArgs {
    #[arg(long)]
    listen: SocketAddr,
    #[arg(long)]
    upstream: SocketAddr,
}

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

async fn bare_proxy(args: BareProxyArgs) -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;

    let listener = TcpListener::bind(args.listen).await?;
    eprintln!("bare proxy on {} to {}", args.listen, args.upstream);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // The interceptor's client settings.
    let client: Client<HttpConnector, hyper::body::Incoming> =
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
    let authority = http::uri::Authority::try_from(args.upstream.to_string())?;
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let authority = authority.clone();
        let service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let client = client.clone();
                let authority = authority.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    let mut uri = http::uri::Parts::default();
                    uri.scheme = Some(http::uri::Scheme::HTTP);
                    uri.authority = Some(authority);
                    uri.path_and_query = parts.uri.path_and_query().cloned();
                    parts.uri = http::Uri::from_parts(uri).expect("a valid URI");
                    let response = match client
                        .request(hyper::Request::from_parts(parts, body))
                        .await
                    {
                        Ok(response) => response.map(|body| body.boxed()),
                        Err(_) => {
                            let mut response = hyper::Response::new(
                                Full::new(Bytes::from_static(b"bad gateway\n"))
                                    .map_err(|never| match never {})
                                    .boxed(),
                            );
                            *response.status_mut() = http::StatusCode::BAD_GATEWAY;
                            response
                        }
                    };
                    Ok::<hyper::Response<ProxyBody>, Infallible>(response)
                }
            });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

#[derive(Args)]
struct ColdStartArgs {
    /// The scaler's gRPC address (StreamIsActive).
    #[arg(long)]
    grpc: String,
    /// The interceptor's HTTP proxy.
    #[arg(long)]
    proxy: SocketAddr,
    /// Routes to start cold, `name=upstream-host:port`; the route's host is
    /// `<name>.bench`. Each is used once (one sample).
    #[arg(long = "route", value_name = "NAME=ADDR", required = true)]
    routes: Vec<String>,
    /// `in-process` or `split`, for the results.
    #[arg(long, default_value = "in-process")]
    label: String,
}

/// A pseudo-random number below `bound` (no randomness crate needed).
fn jitter(bound: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
        % bound.max(1)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn one_cold_start(
    channel: Channel,
    proxy: SocketAddr,
    name: &str,
    upstream: SocketAddr,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut client = ExternalScalerClient::new(channel);
    let object = scaled_object(
        format!("cold-{name}"),
        &[("scaler", "http"), ("route", name)],
    );
    let active = client.is_active(object.clone()).await?.into_inner().result;
    if active {
        bail!("route {name} is already active");
    }
    let mut stream = client.stream_is_active(object).await?.into_inner();
    // KEDA opened its stream long before traffic comes back: let the
    // poller's first reading age past its wake-up gap (250 ms), as a
    // real cold start finds it.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let sent = Instant::now();
    let host = format!("{name}.bench");
    let request = tokio::spawn(async move {
        let mut socket = TcpStream::connect(proxy).await?;
        socket.set_nodelay(true)?;
        socket
            .write_all(
                format!("GET /cold HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = Vec::new();
        socket.read_to_end(&mut response).await?;
        let done = Instant::now();
        let head = String::from_utf8_lossy(&response)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        anyhow::Ok((done, head))
    });
    let pushed = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .map_err(|_| anyhow!("no push within 20 s for route {name}"))??
        .ok_or_else(|| anyhow!("the activity stream ended"))?;
    let pushed_at = Instant::now();
    if !pushed.result {
        bail!("pushed `false`");
    }
    // The app starts: its port opens and it answers. A real start takes
    // far longer than the interceptor's 25 ms retry period, so the port
    // opens at an arbitrary point of that period: 100 ms plus 0-25 ms.
    tokio::time::sleep(Duration::from_micros(100_000 + jitter(25_000))).await;
    let listener = TcpListener::bind(upstream).await?;
    let listening = Instant::now();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nup\n")
                    .await;
                // Keep the connection for the proxy's pool until it closes.
                let _ = socket.read(&mut buffer).await;
            });
        }
    });
    let (done, head) = tokio::time::timeout(Duration::from_secs(20), request)
        .await
        .map_err(|_| anyhow!("no response within 20 s"))???;
    server.abort();
    if !head.contains(" 200 ") {
        bail!("route {name}: `{head}`");
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok((ms(pushed_at - sent), ms(done - listening), ms(done - sent)))
}

async fn cold_start(args: ColdStartArgs) -> anyhow::Result<()> {
    let channel = channels(&args.grpc, 1).await?.remove(0);
    let mut push = Vec::new();
    let mut after_listen = Vec::new();
    let mut total = Vec::new();
    for route in &args.routes {
        let (name, upstream) = route
            .split_once('=')
            .ok_or_else(|| anyhow!("`{route}` is not NAME=ADDR"))?;
        let upstream: SocketAddr = upstream.parse()?;
        let (p, a, t) = one_cold_start(channel.clone(), args.proxy, name, upstream).await?;
        eprintln!(
            "{} {name}: push after {p:.1} ms; response {a:.1} ms after the upstream listened ({t:.1} ms in all)",
            args.label
        );
        push.push(p);
        after_listen.push(a);
        total.push(t);
    }
    let summary = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        json!({
            "median": quantile(values, 0.5),
            "max": values.last().copied().unwrap_or(f64::NAN),
            "min": values.first().copied().unwrap_or(f64::NAN),
            "samples": values,
        })
    };
    emit(json!({
        "bench": "cold-start",
        "setup": args.label,
        "samples": args.routes.len(),
        "push_ms": summary(&mut push),
        "response_after_listen_ms": summary(&mut after_listen),
        "total_ms": summary(&mut total),
    }));
    Ok(())
}

// ---------------------------------------------------------------------------
// The report

#[derive(Args)]
struct ReportArgs {
    /// JSON lines written by the measuring subcommands and scripts/bench.sh.
    #[arg(long)]
    results: PathBuf,
    /// Criterion's output directory (CRITERION_HOME).
    #[arg(long)]
    criterion: Option<PathBuf>,
    /// A Markdown file describing the machine and the run.
    #[arg(long)]
    machine: Option<PathBuf>,
    /// The document to update between `<!-- bench:begin -->` and
    /// `<!-- bench:end -->`; without it the tables go to standard output.
    #[arg(long)]
    doc: Option<PathBuf>,
}

const BEGIN: &str =
    "<!-- bench:begin (generated by scripts/bench.sh; edits here are overwritten) -->";
const END: &str = "<!-- bench:end -->";

fn report(args: ReportArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("cannot read {}", args.results.display()))?;
    let results: Vec<Value> = text
        .lines()
        .filter(|line| line.trim_start().starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let mut out = String::new();
    if let Some(machine) = &args.machine {
        out.push_str(&std::fs::read_to_string(machine)?);
        out.push('\n');
    }
    render_rpc(&mut out, &results);
    render_scale(&mut out, &results);
    render_sources(&mut out, &results);
    render_interceptor(&mut out, &results);
    render_cold_start(&mut out, &results);
    if let Some(dir) = &args.criterion {
        render_criterion(&mut out, dir)?;
    }
    match &args.doc {
        None => print!("{out}"),
        Some(doc) => {
            let current = std::fs::read_to_string(doc).unwrap_or_default();
            let updated = match (current.find("<!-- bench:begin"), current.find(END)) {
                (Some(begin), Some(end)) if begin < end => {
                    format!("{}{BEGIN}\n\n{out}\n{}", &current[..begin], &current[end..])
                }
                _ => format!("{current}\n{BEGIN}\n\n{out}\n{END}\n"),
            };
            std::fs::write(doc, updated)?;
            eprintln!("updated {}", doc.display());
        }
    }
    Ok(())
}

fn num(value: &Value, key: &str) -> Option<f64> {
    value.get(key).and_then(Value::as_f64)
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn thousands(n: f64) -> String {
    if !n.is_finite() {
        return "–".into();
    }
    let digits = format!("{:.0}", n.abs());
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if n < 0.0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

fn micros(us: Option<f64>) -> String {
    match us {
        None => "–".into(),
        Some(us) if us >= 10_000.0 => format!("{:.1} ms", us / 1000.0),
        Some(us) if us >= 100.0 => format!("{us:.0} µs"),
        Some(us) => format!("{us:.1} µs"),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}×"))
}

fn pct(p: Option<f64>) -> String {
    p.map_or("–".into(), |p| format!("{p:.0} %"))
}

fn pct1(p: Option<f64>) -> String {
    p.map_or("–".into(), |p| format!("{p:.1} %"))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

/// The run with the median throughput among repeated runs of one point,
/// and the range of their throughputs.
fn median_run(mut runs: Vec<&Value>) -> Option<(&Value, f64, f64)> {
    runs.sort_by(|a, b| {
        num(a, "rps")
            .unwrap_or(0.0)
            .total_cmp(&num(b, "rps").unwrap_or(0.0))
    });
    let low = runs.first().and_then(|r| num(r, "rps"))?;
    let high = runs.last().and_then(|r| num(r, "rps"))?;
    Some((runs[(runs.len() - 1) / 2], low, high))
}

fn spread(run: Option<(&Value, f64, f64)>) -> String {
    match run {
        Some((_, low, high)) if high > low => format!(" ({}–{})", thousands(low), thousands(high)),
        _ => String::new(),
    }
}

fn render_rpc(out: &mut String, results: &[Value]) {
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "rpc")
        .collect();
    if rows.is_empty() {
        return;
    }
    let objects = rows
        .iter()
        .filter_map(|r| num(r, "objects"))
        .fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "### 1. RPC path: hoist vs a bare tonic server\n\n{} distinct ScaledObjects registered (redis triggers on one list: one poller), asked round-robin, every answer from cache. Clients share one HTTP/2 connection as KEDA's operator does (one connection per scaler address), except in the rows marked otherwise. Throughput: requests/s, median run (range of the runs in brackets); latency p50 / p99 / p99.9 as the client saw it, in that run. Server CPU per request: the server's utime+stime over the run ÷ requests. Goal: hoist ≥ 0.90× the bare server's throughput, p99 ≤ 1.2×.\n",
        thousands(objects)
    );
    out.push_str("| method | clients | hoist req/s | bare req/s | throughput ratio | hoist p50 / p99 / p99.9 | bare p50 / p99 / p99.9 | p99 ratio | server CPU per request: hoist / bare | goal met |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let mut keys: Vec<(String, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                text(r, "method").to_string(),
                num(r, "concurrency").unwrap_or(0.0) as u64,
                num(r, "connections").unwrap_or(0.0) as u64,
            )
        })
        .collect();
    keys.sort();
    keys.dedup();
    let mut cpu_notes = Vec::new();
    for (method, concurrency, connections) in keys {
        let find = |target: &str| {
            median_run(
                rows.iter()
                    .copied()
                    .filter(|r| {
                        text(r, "target") == target
                            && text(r, "method") == method
                            && num(r, "concurrency") == Some(concurrency as f64)
                            && num(r, "connections") == Some(connections as f64)
                    })
                    .collect(),
            )
        };
        let (hoist_run, bare_run) = (find("hoist"), find("bare"));
        let (hoist, bare) = (hoist_run.map(|r| r.0), bare_run.map(|r| r.0));
        let get = |r: Option<&Value>, k: &str| r.and_then(|r| num(r, k));
        let lat = |r: Option<&Value>| {
            format!(
                "{} / {} / {}",
                micros(get(r, "p50_us")),
                micros(get(r, "p99_us")),
                micros(get(r, "p999_us"))
            )
        };
        let throughput = ratio(get(hoist, "rps"), get(bare, "rps"));
        let p99 = ratio(get(hoist, "p99_us"), get(bare, "p99_us"));
        let ok = throughput.is_some_and(|t| t >= 0.9) && p99.is_some_and(|p| p <= 1.2);
        let errors = get(hoist, "errors").unwrap_or(0.0) + get(bare, "errors").unwrap_or(0.0);
        let clients = if connections > 1 {
            format!("{concurrency} ({connections} connections)")
        } else {
            concurrency.to_string()
        };
        let _ = writeln!(
            out,
            "| {method} | {clients} | {}{} | {}{} | {} | {} | {} | {} | {} / {} | {}{} |",
            thousands(get(hoist, "rps").unwrap_or(f64::NAN)),
            spread(hoist_run),
            thousands(get(bare, "rps").unwrap_or(f64::NAN)),
            spread(bare_run),
            fmt_ratio(throughput),
            lat(hoist),
            lat(bare),
            fmt_ratio(p99),
            micros(get(hoist, "server_cpu_us_per_request")),
            micros(get(bare, "server_cpu_us_per_request")),
            verdict(ok),
            if errors > 0.0 {
                format!(" ({errors} errors)")
            } else {
                String::new()
            },
        );
        for (name, run) in [("hoist", hoist), ("bare", bare)] {
            if let Some(run) = run
                && let (Some(server), Some(client)) =
                    (num(run, "server_cpu_pct"), num(run, "client_cpu_pct"))
            {
                cpu_notes.push(format!(
                    "{method} {clients} {name}: {server:.0} / {client:.0}"
                ));
            }
        }
    }
    let _ = writeln!(
        out,
        "\nCPU during those runs, server / load generator, % of one core: {}.\n",
        cpu_notes.join("; ")
    );
}

fn render_scale(out: &mut String, results: &[Value]) {
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "scale")
        .collect();
    let skipped: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "scale-skipped")
        .collect();
    if rows.is_empty() && skipped.is_empty() {
        return;
    }
    let interval = rows
        .first()
        .and_then(|r| num(r, "interval_s"))
        .unwrap_or(10.0);
    let _ = writeln!(
        out,
        "### 2. Scale: memory and CPU of `hoist serve`\n\nA fresh `hoist serve` per row; redis triggers with `pollingInterval: {interval:.0}` spread over the Redis servers. RSS is VmRSS after every object was read once and every poller ran; CPU is utime+stime over one polling interval ({interval:.0} s, every poller polls once), first with no calls, then with KEDA's call pattern (one IsActive per object per interval and one GetMetrics per object per 15 s). Goal: under 100 MiB at 10,000.\n"
    );
    out.push_str("| ScaledObjects | pollers (= Redis lists) | RSS at start | RSS | per object | CPU, pollers only | CPU per poll | CPU with KEDA's calls | CPU per call | open fds | registration | under 100 MiB |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in &rows {
        let rss = num(r, "rss_mib").unwrap_or(f64::NAN);
        let errors = num(r, "register_errors").unwrap_or(0.0);
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} MiB | {:.1} MiB | {:.1} KiB | {} | {} | {} ({} calls/s) | {} | {} | {:.1} s{} | {} |",
            thousands(num(r, "objects").unwrap_or(f64::NAN)),
            thousands(num(r, "pollers").unwrap_or(f64::NAN)),
            num(r, "rss_start_mib").unwrap_or(f64::NAN),
            rss,
            num(r, "rss_per_object_kib").unwrap_or(f64::NAN),
            pct1(num(r, "cpu_idle_pct")),
            micros(num(r, "cpu_per_poll_us")),
            pct1(num(r, "cpu_keda_pct")),
            thousands(num(r, "keda_calls").unwrap_or(0.0) / interval),
            micros(num(r, "cpu_per_call_us")),
            thousands(num(r, "fds").unwrap_or(f64::NAN)),
            num(r, "register_s").unwrap_or(f64::NAN),
            if errors > 0.0 {
                format!(" ({} errors: {})", errors, text(r, "first_error"))
            } else {
                String::new()
            },
            if num(r, "objects") == Some(10_000.0) {
                verdict(rss < 100.0)
            } else {
                ""
            },
        );
    }
    for r in skipped {
        let _ = writeln!(
            out,
            "| {} | {} | not run: {} | | | | | | | | | |",
            thousands(num(r, "objects").unwrap_or(f64::NAN)),
            thousands(num(r, "lists").unwrap_or(f64::NAN)),
            text(r, "reason")
        );
    }
    out.push('\n');
}

fn render_sources(out: &mut String, results: &[Value]) {
    let redis: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "redis-load")
        .collect();
    let kafka: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "kafka-load")
        .collect();
    if redis.is_empty() && kafka.is_empty() {
        return;
    }
    out.push_str("### 3. Source load\n\n");
    for r in redis {
        let _ = writeln!(
            out,
            "Redis: {} ScaledObjects on one list, `pollingInterval: {}`, asked {} times (GetMetrics for every object every interval) over {} intervals: Redis ran **{} LLEN** ({} EVALSHA of hoist's length script, {} commands in all, counted by `INFO commandstats`): {:.1} per interval.\n",
            thousands(num(r, "objects").unwrap_or(f64::NAN)),
            num(r, "interval_s").unwrap_or(f64::NAN),
            thousands(num(r, "get_metrics_calls").unwrap_or(f64::NAN)),
            num(r, "intervals").unwrap_or(f64::NAN),
            num(r, "llen").unwrap_or(f64::NAN),
            num(r, "evalsha").unwrap_or(f64::NAN),
            num(r, "all_commands").unwrap_or(f64::NAN),
            num(r, "llen").unwrap_or(f64::NAN) / num(r, "intervals").unwrap_or(f64::NAN),
        );
    }
    for r in kafka {
        let intervals = num(r, "intervals").unwrap_or(f64::NAN);
        let apis = r
            .get("by_api")
            .and_then(Value::as_object)
            .map(|apis| {
                apis.iter()
                    .map(|(name, count)| {
                        let count = count.as_f64().unwrap_or(0.0);
                        format!("| {name} | {count:.0} | {:.2} |", count / intervals)
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "Kafka: {} ScaledObjects on one {}-partition topic led by {} brokers (librdkafka's mock cluster, in the load generator), `pollingInterval: {}`, asked {} times over {} intervals; lag read {}. Requests the brokers received (the mock cluster's own request log, `rd_kafka_mock_get_requests`), in {} bursts:\n\n| request | in {} intervals | per interval |\n| --- | --- | --- |\n{apis}\n",
            thousands(num(r, "objects").unwrap_or(f64::NAN)),
            thousands(num(r, "partitions").unwrap_or(f64::NAN)),
            num(r, "brokers").unwrap_or(f64::NAN),
            num(r, "interval_s").unwrap_or(f64::NAN),
            thousands(num(r, "get_metrics_calls").unwrap_or(f64::NAN)),
            intervals,
            num(r, "lag").map_or("–".into(), |l| format!("{l:.0}")),
            num(r, "bursts").unwrap_or(f64::NAN),
            intervals,
        );
    }
}

fn render_interceptor(out: &mut String, results: &[Value]) {
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "interceptor")
        .collect();
    if rows.is_empty() {
        return;
    }
    out.push_str("### 4. Interceptor overhead (wrk, HTTP/1.1 keep-alive)\n\nThe same upstream (`hoist-load upstream`) reached directly, through hoist's interceptor (`hoist serve` with an HTTP and a TCP route, in-process), through a bare proxy on hoist's stack (`hoist-load bare-proxy`: hyper's server and hyper-util's pooled client, forwarding as is) and through nginx (`proxy_pass` to an `upstream` with `keepalive 128`, HTTP/1.1 and an empty `Connection` header to the upstream, access log off; `stream` `proxy_pass` for TCP). `wrk -t1 -cN --latency`; the median run of the repeats (range in brackets). Proxy CPU per request: the proxy's utime+stime ÷ requests. Goal: hoist's throughput ≥ nginx's, p99 ≤ nginx's.\n\n");
    out.push_str("| protocol | connections | via | req/s | p50 | p99 | proxy CPU per request | proxy CPU | hoist vs nginx: throughput / p99 | goal met |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let mut keys: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                text(r, "protocol").to_string(),
                num(r, "connections").unwrap_or(0.0) as u64,
            )
        })
        .collect();
    keys.sort();
    keys.dedup();
    for (protocol, connections) in keys {
        let of = |via: &str| {
            median_run(
                rows.iter()
                    .copied()
                    .filter(|r| {
                        text(r, "protocol") == protocol
                            && num(r, "connections") == Some(connections as f64)
                            && text(r, "via") == via
                    })
                    .collect(),
            )
        };
        let nginx = of("nginx").map(|r| r.0);
        for via in ["direct", "hoist", "bare-hyper", "nginx"] {
            let Some(run) = of(via) else { continue };
            let r = run.0;
            let (vs, goal) = match (via, nginx) {
                ("hoist", Some(n)) => {
                    let t = ratio(num(r, "rps"), num(n, "rps"));
                    let p = ratio(num(r, "p99_us"), num(n, "p99_us"));
                    (
                        format!("{} / {}", fmt_ratio(t), fmt_ratio(p)),
                        verdict(t.is_some_and(|t| t >= 1.0) && p.is_some_and(|p| p <= 1.0))
                            .to_string(),
                    )
                }
                _ => (String::new(), String::new()),
            };
            let label = match (via, protocol.as_str()) {
                ("bare-hyper", _) => "bare hyper proxy",
                ("nginx", "tcp") => "nginx (stream)",
                (via, _) => via,
            };
            let errors = num(r, "errors").unwrap_or(0.0);
            let _ = writeln!(
                out,
                "| {protocol} | {connections} | {label}{} | {}{} | {} | {} | {} | {} | {vs} | {goal} |",
                if errors > 0.0 {
                    format!(" ({errors:.0} errors)")
                } else {
                    String::new()
                },
                thousands(num(r, "rps").unwrap_or(f64::NAN)),
                spread(Some(run)),
                micros(num(r, "p50_us")),
                micros(num(r, "p99_us")),
                if via == "direct" {
                    "–".into()
                } else {
                    micros(num(r, "proxy_cpu_us_per_request"))
                },
                if via == "direct" {
                    "–".into()
                } else {
                    pct(num(r, "proxy_cpu_pct"))
                },
            );
        }
    }
    out.push('\n');
}

fn render_cold_start(out: &mut String, results: &[Value]) {
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| text(r, "bench") == "cold-start")
        .collect();
    if rows.is_empty() {
        return;
    }
    out.push_str("### 5. Cold start\n\nA request arrives for a route whose upstream is down (scaled to zero), 1 s after KEDA opened its StreamIsActive stream. Push: from sending the request to `true` arriving on that stream. The upstream then starts listening 100-125 ms later (an arbitrary point of hoist's 25 ms retry period); response: from its port opening to the held request's response reaching the client. One route per sample, each cold once.\n\n| setup | samples | push: median / max | response after the upstream listens: median / max | request to response, in all: median |\n| --- | --- | --- | --- | --- |\n");
    for r in rows {
        let part = |key: &str, q: &str| {
            r.get(key)
                .and_then(|v| v.get(q))
                .and_then(Value::as_f64)
                .map_or("–".into(), |ms| format!("{ms:.1} ms"))
        };
        let setup = match text(r, "setup") {
            "split" => "split (`hoist interceptor` + `interceptor.endpoints`)",
            "in-process" => "in-process (`hoist serve` with routes)",
            other => other,
        };
        let _ = writeln!(
            out,
            "| {setup} | {} | {} / {} | {} / {} | {} |",
            num(r, "samples").unwrap_or(0.0),
            part("push_ms", "median"),
            part("push_ms", "max"),
            part("response_after_listen_ms", "median"),
            part("response_after_listen_ms", "max"),
            part("total_ms", "median"),
        );
    }
    out.push('\n');
}

fn render_criterion(out: &mut String, dir: &Path) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "new") {
                    let benchmark = std::fs::read_to_string(path.join("benchmark.json"));
                    let estimates = std::fs::read_to_string(path.join("estimates.json"));
                    if let (Ok(benchmark), Ok(estimates)) = (benchmark, estimates) {
                        let benchmark: Value = serde_json::from_str(&benchmark)?;
                        let estimates: Value = serde_json::from_str(&estimates)?;
                        let id = text(&benchmark, "full_id").to_string();
                        let median = estimates
                            .get("median")
                            .and_then(|m| m.get("point_estimate"))
                            .and_then(Value::as_f64);
                        if let Some(median) = median {
                            rows.push((id, median));
                        }
                    }
                } else {
                    stack.push(path);
                }
            }
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    out.push_str(
        "### 6. Engine and parsers (criterion, median)\n\n| benchmark | time |\n| --- | --- |\n",
    );
    for (id, ns) in rows {
        let time = if ns >= 1e6 {
            format!("{:.1} ms", ns / 1e6)
        } else if ns >= 1e3 {
            format!("{:.2} µs", ns / 1e3)
        } else {
            format!("{ns:.0} ns")
        };
        let _ = writeln!(out, "| {id} | {time} |");
    }
    out.push('\n');
    Ok(())
}
