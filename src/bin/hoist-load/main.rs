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
//! - `kafka-groups`: a real broker's topic and consumer groups for
//!   scripts/bench-keda.sh (caught up, or one message behind).
//! - `upstream`: a small HTTP/1.1 server for the interceptor benchmarks.
//! - `pace`: HTTP/1.1 requests at a fixed rate, and the proxy's CPU per
//!   request at that rate (the same work per second for every proxy).
//! - `cold-start`: request held at zero → push to StreamIsActive →
//!   response once the upstream listens.
//! - `route-follow`: a route a ScaledObject declares → served by every
//!   interceptor (in process, or split replicas following the scaler).
//! - `flood`: waves of connections through the interceptor, and the
//!   proxy's RSS at each peak and after (is memory given back?).
//! - `worker`: pops jobs from a Redis list and counts each done once (the
//!   node's scenarios scale it).
//! - `free-ports`, `report`: helpers for the script.

mod bare_proxy;
mod bare_server;
mod cold_start;
mod flood;
mod free_ports;
mod grpc;
mod kafka_groups;
mod kafka_load;
mod pace;
mod process;
mod redis_load;
mod report;
mod results;
mod route_follow;
mod rpc;
mod scale;
mod upstream;
mod worker;

use clap::{Parser, Subcommand};

use bare_proxy::{BareProxyArgs, bare_proxy};
use bare_server::{BareServerArgs, bare_server};
use cold_start::{ColdStartArgs, cold_start};
use flood::{FloodArgs, flood};
use free_ports::{FreePortsArgs, free_ports};
use kafka_groups::{KafkaGroupsArgs, kafka_groups};
use kafka_load::{KafkaLoadArgs, kafka_load};
use pace::{PaceArgs, pace};
use redis_load::{RedisLoadArgs, redis_load};
use report::{ReportArgs, report};
use route_follow::{RouteFollowArgs, route_follow};
use rpc::{RpcArgs, rpc};
use scale::{ScaleArgs, scale};
use upstream::{UpstreamArgs, upstream};
use worker::{WorkerArgs, worker};

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
    /// A real broker's topic and consumer groups for scripts/bench-keda.sh.
    KafkaGroups(KafkaGroupsArgs),
    /// A small HTTP/1.1 server (keep-alive, a fixed body).
    Upstream(UpstreamArgs),
    /// A minimal reverse proxy on the interceptor's stack (hyper server,
    /// hyper-util's pooled client), forwarding as is: the stack's limit.
    BareProxy(BareProxyArgs),
    /// HTTP/1.1 requests at a fixed rate (an open loop), and the proxy's
    /// CPU per request at that rate.
    Pace(PaceArgs),
    /// Cold-start latency through hoist's interceptor.
    ColdStart(ColdStartArgs),
    /// How soon a declared route serves on every interceptor.
    RouteFollow(RouteFollowArgs),
    /// Waves of connections through the interceptor: is memory given back?
    Flood(FloodArgs),
    /// Pops jobs from a Redis list one at a time and counts each finished
    /// job once in `LIST:done` (SIGTERM ends it after the job in hand).
    Worker(WorkerArgs),
    /// Prints N free loopback ports.
    FreePorts(FreePortsArgs),
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
        Command::KafkaGroups(args) => kafka_groups(args),
        Command::Upstream(args) => runtime.block_on(upstream(args)),
        Command::BareProxy(args) => runtime.block_on(bare_proxy(args)),
        Command::Pace(args) => runtime.block_on(pace(args)),
        Command::ColdStart(args) => runtime.block_on(cold_start(args)),
        Command::RouteFollow(args) => runtime.block_on(route_follow(args)),
        Command::Flood(args) => runtime.block_on(flood(args)),
        Command::Worker(args) => runtime.block_on(worker(args)),
        Command::FreePorts(args) => free_ports(args),
        Command::Report(args) => report(args),
    }
}
