//! `flood`: waves of many client connections through the interceptor, all
//! open at once, then all closed; the proxy's RSS before, at each wave's
//! peak and after it settles. Shows whether memory a flood took is given
//! back (an allocator that keeps freed blocks holds the high point).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::process::rss_kib;
use crate::results::emit;

#[derive(Args)]
pub(super) struct FloodArgs {
    /// The interceptor's HTTP listener.
    #[arg(long)]
    target: SocketAddr,
    /// The Host header of the route.
    #[arg(long, default_value = "web.bench")]
    host: String,
    /// The proxy's process, whose RSS is read.
    #[arg(long)]
    pid: u32,
    /// Connections open at once in each wave.
    #[arg(long, default_value_t = 5000)]
    connections: usize,
    #[arg(long, default_value_t = 6)]
    waves: usize,
    /// Seconds to wait after a wave closes before reading the RSS.
    #[arg(long, default_value_t = 15)]
    settle: u64,
    /// What the results line calls this run (the allocator measured).
    #[arg(long, default_value = "")]
    label: String,
}

pub(super) async fn flood(args: FloodArgs) -> anyhow::Result<()> {
    let mib = |pid| {
        rss_kib(pid)
            .map(|kib| kib as f64 / 1024.0)
            .unwrap_or(f64::NAN)
    };
    let before = mib(args.pid);
    let mut peaks = Vec::new();
    let mut after = Vec::new();
    let mut failed = 0;
    for wave in 1..=args.waves {
        let (open, wave_failed) = open_wave(&args).await;
        failed += wave_failed;
        // Everything answered and still open: the high point.
        tokio::time::sleep(Duration::from_millis(500)).await;
        peaks.push(mib(args.pid));
        drop(open);
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        after.push(mib(args.pid));
        eprintln!(
            "   wave {wave}: {} connections ({wave_failed} failed), RSS {:.1} MiB at the peak, {:.1} MiB {} s after",
            args.connections,
            peaks[wave - 1],
            after[wave - 1],
            args.settle
        );
    }
    emit(json!({
        "bench": "flood",
        "label": args.label,
        "connections": args.connections,
        "waves": args.waves,
        "settle_s": args.settle,
        "failed": failed,
        "rss_before_mib": before,
        "rss_peak_mib": peaks,
        "rss_after_mib": after,
    }));
    Ok(())
}

/// Opens `connections` connections and sends one request on each; returns
/// them open (dropping the set closes them) and how many failed.
async fn open_wave(args: &FloodArgs) -> (JoinSet<()>, usize) {
    let mut open = JoinSet::new();
    let (ready, mut readies) = tokio::sync::mpsc::channel::<bool>(args.connections);
    for _ in 0..args.connections {
        let (target, host, ready) = (args.target, args.host.clone(), ready.clone());
        open.spawn(async move {
            let connection = request_and_hold(target, &host).await;
            let ok = connection.is_ok();
            let _ = ready.send(ok).await;
            // Held open until the wave is dropped.
            let _connection = connection;
            std::future::pending::<()>().await;
        });
    }
    drop(ready);
    let mut failed = 0;
    for _ in 0..args.connections {
        match readies.recv().await {
            Some(true) => {}
            _ => failed += 1,
        }
    }
    (open, failed)
}

/// One connection with one request answered, kept open.
async fn request_and_hold(
    target: SocketAddr,
    host: &str,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = TcpStream::connect(target).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/")
        .header("host", host)
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    anyhow::ensure!(
        response.status().is_success(),
        "answered {}",
        response.status()
    );
    response.into_body().collect().await?;
    Ok(sender)
}
