//! `pace`: HTTP/1.1 keep-alive requests at a fixed rate (an open loop), so
//! that every proxy measured does the same work per second. wrk's closed
//! loop lets each proxy set its own rate, and a proxy that answers faster
//! than the client can ask then idles between requests: its CPU per
//! request counts its waits as much as its work.
//!
//! Each connection sends its requests on a schedule of its own, spread
//! evenly over the period. A request the previous answer held back is
//! timed from when it was due, not from when it could leave (no
//! coordinated omission). tokio's timer has a millisecond's grain, so
//! requests leave in millisecond batches, and a request only the timer
//! held is timed from when it left.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::BytesMut;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::process::CpuWindow;
use crate::results::emit;

#[derive(Args)]
pub(super) struct PaceArgs {
    /// The proxy (or app) to send to.
    #[arg(long)]
    target: SocketAddr,
    /// The Host header.
    #[arg(long, default_value = "web.bench")]
    host: String,
    /// Keep-alive connections, each with its share of the rate.
    #[arg(long, default_value_t = 64)]
    connections: u32,
    /// Requests per second, all connections together.
    #[arg(long)]
    rate: u32,
    /// How long to send.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Processes whose CPU time (user + system) is divided by the requests
    /// answered (repeat for a proxy with workers).
    #[arg(long = "pid")]
    pids: Vec<u32>,
    /// What the results line calls this run.
    #[arg(long, default_value = "")]
    label: String,
}

/// What one connection saw.
struct Tally {
    answered: u64,
    failed: u64,
    /// Due → answered, in µs.
    latency: Histogram<u64>,
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs to 60 s at three significant figures: fixed bounds are valid.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

pub(super) async fn pace(args: PaceArgs) -> anyhow::Result<()> {
    if args.rate == 0 || args.connections == 0 {
        bail!("--rate and --connections must be at least 1");
    }
    let request: Arc<[u8]> = format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", args.host)
        .into_bytes()
        .into();
    let mut streams = Vec::new();
    for _ in 0..args.connections {
        streams.push(open(args.target).await?);
    }
    // Every connection asks once per `period`, offset from the others.
    let period = Duration::from_secs_f64(f64::from(args.connections) / f64::from(args.rate));
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + Duration::from_secs(args.seconds);
    let cpu: Vec<CpuWindow> = args
        .pids
        .iter()
        .filter_map(|pid| CpuWindow::start(*pid))
        .collect();
    if cpu.len() != args.pids.len() {
        bail!("a --pid process is not running");
    }
    let mut connections = JoinSet::new();
    for (index, stream) in streams.into_iter().enumerate() {
        let offset = period.mul_f64(index as f64 / f64::from(args.connections));
        let request = request.clone();
        let schedule = Schedule {
            first: start + offset,
            period,
            end,
        };
        connections.spawn(keep_pace(args.target, stream, request, schedule));
    }
    let mut total = Tally {
        answered: 0,
        failed: 0,
        latency: new_histogram(),
    };
    while let Some(tally) = connections.join_next().await {
        let tally = tally?;
        total.answered += tally.answered;
        total.failed += tally.failed;
        total.latency.add(&tally.latency)?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    // A process that ended meanwhile leaves the CPU unknown, not smaller.
    let cpu_seconds: Option<f64> = cpu
        .iter()
        .map(|window| window.finish().map(|(_, seconds)| seconds))
        .sum();
    if cpu_seconds.is_none() {
        eprintln!("   a --pid process ended during the run: its CPU is not known");
    }
    let ms = |q: f64| total.latency.value_at_quantile(q) as f64 / 1000.0;
    let per_request_us = cpu_seconds
        .filter(|_| total.answered > 0 && !args.pids.is_empty())
        .map(|seconds| seconds * 1e6 / total.answered as f64);
    eprintln!(
        "   {} {}: {} answered ({:.0}/s, asked {}/s), {} failed, p50 {:.2} ms, p99 {:.2} ms{}",
        args.label,
        args.target,
        total.answered,
        total.answered as f64 / elapsed,
        args.rate,
        total.failed,
        ms(0.5),
        ms(0.99),
        per_request_us.map_or(String::new(), |us| format!(", {us:.1} µs CPU per request")),
    );
    emit(json!({
        "bench": "pace",
        "label": args.label,
        "target": args.target.to_string(),
        "connections": args.connections,
        "rate": args.rate,
        "seconds": args.seconds,
        "answered": total.answered,
        "failed": total.failed,
        "achieved_rate": total.answered as f64 / elapsed,
        "p50_ms": ms(0.5),
        "p99_ms": ms(0.99),
        "max_ms": total.latency.max() as f64 / 1000.0,
        "cpu_seconds": cpu_seconds,
        "cpu_us_per_request": per_request_us,
    }));
    Ok(())
}

/// One connection's times: `first`, `first + period`, … before `end`.
struct Schedule {
    first: Instant,
    period: Duration,
    end: Instant,
}

impl Schedule {
    /// Requests due from `due` on.
    fn left_from(&self, due: Instant) -> u64 {
        let left = self.end.saturating_duration_since(due).as_secs_f64();
        (left / self.period.as_secs_f64()).ceil() as u64
    }
}

async fn open(target: SocketAddr) -> anyhow::Result<TcpStream> {
    let stream = TcpStream::connect(target)
        .await
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends `request` on `schedule`, each once the previous answer is in. A
/// request that fails is counted and the connection replaced (one in an
/// unknown state cannot be reused); if no new one opens, the rest count
/// as failed.
async fn keep_pace(
    target: SocketAddr,
    mut stream: TcpStream,
    request: Arc<[u8]>,
    schedule: Schedule,
) -> Tally {
    let mut tally = Tally {
        answered: 0,
        failed: 0,
        latency: new_histogram(),
    };
    let mut input = BytesMut::with_capacity(4096);
    let mut due = schedule.first;
    // When the previous answer came in.
    let mut free_since = Instant::now();
    while due < schedule.end {
        tokio::time::sleep_until(due).await;
        // A request the previous answer held back is timed from when it
        // was due (that wait is the server's); one only the timer's
        // millisecond grain held is timed from now (that wait is ours).
        let started = if free_since > due {
            due
        } else {
            Instant::now()
        };
        let answered = match stream.write_all(&request).await {
            Ok(()) => read_answer(&mut stream, &mut input).await,
            Err(error) => Err(error.into()),
        };
        due += schedule.period;
        if answered.is_ok() {
            tally.answered += 1;
            let micros = started.elapsed().as_micros().max(1);
            tally
                .latency
                .saturating_record(u64::try_from(micros).unwrap_or(u64::MAX));
        } else {
            tally.failed += 1;
            match open(target).await {
                Ok(fresh) => stream = fresh,
                Err(_) => {
                    tally.failed += schedule.left_from(due);
                    break;
                }
            }
        }
        free_since = Instant::now();
    }
    tally
}

/// Reads one response with a Content-Length body.
async fn read_answer(stream: &mut TcpStream, input: &mut BytesMut) -> anyhow::Result<()> {
    input.clear();
    loop {
        if stream.read_buf(input).await? == 0 {
            bail!("the connection closed before the answer");
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(head) = response.parse(input)? else {
            continue;
        };
        if response.code != Some(200) {
            bail!("answered {:?}", response.code);
        }
        let length: usize = response
            .headers
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case("content-length"))
            .context("no content-length")
            .and_then(|header| Ok(std::str::from_utf8(header.value)?.trim().parse()?))?;
        while input.len() < head + length {
            if stream.read_buf(input).await? == 0 {
                bail!("the connection closed in the body");
            }
        }
        return Ok(());
    }
}
