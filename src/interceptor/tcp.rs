//! The TCP interceptor: one listener per route, bytes copied both ways,
//! connections counted and held through an upstream's cold start.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::upstream::Upstream;

/// Accepts connections for one route until `shutdown`, then gives open
/// ones up to `grace` to finish.
pub async fn serve(
    listener: TcpListener,
    upstream: Arc<Upstream>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let mut connections = JoinSet::new();
    loop {
        let (client, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(route = %upstream.route, %error, "interceptor cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let upstream = upstream.clone();
        connections.spawn(async move {
            let _in_flight = upstream.counters.start(Instant::now());
            if let Err(error) = forward(client, &upstream).await {
                debug!(route = %upstream.route, %peer, %error, "connection ended");
            }
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(route = %upstream.route, ?grace, "connections still open after the grace period");
        connections.abort_all();
    }
}

async fn forward(mut client: TcpStream, upstream: &Upstream) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    // A client refused here just sees its connection close: raw TCP has
    // no way to say why. The reason goes to the log.
    let mut server = upstream.connect().await.map_err(|error| {
        warn!(route = %upstream.route, %error, "connection not forwarded");
        std::io::Error::other(error)
    })?;
    // Half-close passes through: when one side finishes sending, the other
    // side's write half is shut down and the reverse direction continues.
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}
