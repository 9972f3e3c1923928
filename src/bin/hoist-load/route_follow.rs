//! `route-follow`: how soon a route that a ScaledObject declares serves
//! traffic: from KEDA's first GetMetricSpec for the trigger (which declares
//! the route) to the app's first answer through each interceptor. In
//! process the scaler's own interceptor takes the route at once; split,
//! every `hoist interceptor` learns it from the scaler's long-polled table
//! (the goal: within a second on every replica).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Args;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::grpc::{channels, scaled_object};
use crate::results::{emit, summary};

#[derive(Args)]
pub(super) struct RouteFollowArgs {
    /// The scaler's gRPC address (GetMetricSpec declares the route).
    #[arg(long)]
    grpc: String,
    /// The HTTP proxy of each interceptor that must serve the route.
    #[arg(long = "proxy", value_name = "ADDR", required = true)]
    proxies: Vec<SocketAddr>,
    /// Routes to declare, one sample each (`rf<i>.bench`).
    #[arg(long, default_value_t = 10)]
    samples: usize,
    /// `in-process` or `split`, for the results.
    #[arg(long, default_value = "in-process")]
    label: String,
}

/// How often each interceptor is asked whether it serves the route yet.
const ASK_EVERY: Duration = Duration::from_millis(2);
/// A route not served by then is a failed run.
const GIVE_UP: Duration = Duration::from_secs(20);

/// The app behind every declared route: `upstream`'s server.
async fn app() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(crate::upstream::serve(listener, "ok\n".into()));
    Ok(addr)
}

/// The status code the proxy answers for `host`.
async fn status_for(proxy: SocketAddr, host: &str) -> anyhow::Result<u16> {
    // A route whose upstream is down holds the request instead (a route
    // left by an earlier run, restored from a state file).
    tokio::time::timeout(Duration::from_secs(5), ask(proxy, host))
        .await
        .map_err(|_| anyhow!("{proxy} did not answer for {host} within 5 s: is a route held?"))?
}

async fn ask(proxy: SocketAddr, host: &str) -> anyhow::Result<u16> {
    let mut socket = TcpStream::connect(proxy).await?;
    socket.set_nodelay(true)?;
    socket
        .write_all(
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await?;
    let head = String::from_utf8_lossy(&response);
    head.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            anyhow!(
                "not an HTTP answer: `{}`",
                head.lines().next().unwrap_or("")
            )
        })
}

/// Milliseconds from `declared` until `proxy` answers 200 for `host`.
async fn served_after(proxy: SocketAddr, host: String, declared: Instant) -> anyhow::Result<f64> {
    loop {
        let status = status_for(proxy, &host).await?;
        match status {
            200 => return Ok(declared.elapsed().as_secs_f64() * 1e3),
            404 if declared.elapsed() < GIVE_UP => tokio::time::sleep(ASK_EVERY).await,
            404 => bail!("{proxy} does not serve {host} {GIVE_UP:?} after its declaration"),
            other => bail!("{proxy} answered {other} for {host}"),
        }
    }
}

pub(super) async fn route_follow(args: RouteFollowArgs) -> anyhow::Result<()> {
    let channel = channels(&args.grpc, 1).await?.remove(0);
    let mut client = ExternalScalerClient::new(channel);
    let upstream = app().await?.to_string();
    // A second apart, so that no sample finds a long poll just answered.
    let mut everywhere = Vec::new();
    let mut each = Vec::new();
    for i in 0..args.samples {
        let host = format!("rf{i}.bench");
        for proxy in &args.proxies {
            if status_for(*proxy, &host).await? != 404 {
                bail!("{proxy} serves {host} before it is declared");
            }
        }
        let object = scaled_object(
            format!("route-follow-{}-{i}", args.label),
            &[("scaler", "http"), ("host", &host), ("upstream", &upstream)],
        );
        let declared = Instant::now();
        client.get_metric_spec(object).await?;
        let times = futures::future::try_join_all(
            args.proxies
                .iter()
                .map(|proxy| served_after(*proxy, host.clone(), declared)),
        )
        .await?;
        let slowest = times.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "{} {host}: served by all {} interceptor(s) {slowest:.1} ms after GetMetricSpec",
            args.label,
            times.len()
        );
        everywhere.push(slowest);
        each.extend(times);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    emit(json!({
        "bench": "route-follow",
        "setup": args.label,
        "interceptors": args.proxies.len(),
        "samples": args.samples,
        "every_interceptor_ms": summary(&mut everywhere),
        "each_interceptor_ms": summary(&mut each),
    }));
    Ok(())
}
