//! `cold-start`: cold-start latency through hoist's interceptor: request
//! held at zero → push to StreamIsActive → response once the upstream
//! listens.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Args;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::grpc::{channels, scaled_object};
use crate::results::{emit, summary};

#[derive(Args)]
pub(super) struct ColdStartArgs {
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

pub(super) async fn cold_start(args: ColdStartArgs) -> anyhow::Result<()> {
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
