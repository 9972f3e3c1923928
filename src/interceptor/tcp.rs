//! The TCP interceptor: one listener per route, bytes copied both ways,
//! connections counted and held through an upstream's cold start.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use arc_swap::ArcSwap;

use super::upstream::Upstream;
use crate::listen::ConnectionLimit;
use crate::logging::Summary;

/// Refused connections of every route: one line per interval, with a count.
static NOT_FORWARDED: LazyLock<Summary> = LazyLock::new(|| {
    Summary::new(Duration::from_secs(10), |count| {
        warn!(count, "more connections not forwarded");
    })
});

/// What a held client may send before its upstream is reached; past this
/// the client waits (TCP flow control) like any slow server's client.
const EARLY_DATA_LIMIT: usize = 64 * 1024;

/// Accepts connections on one address until `stop` (its route went) or
/// `shutdown`. Open connections carry on after `stop`; at `shutdown` they
/// get up to `grace` to finish. Each connection goes to the route the
/// address serves when it is accepted (`target`, swapped by a reload).
pub async fn serve(
    listener: TcpListener,
    target: Arc<ArcSwap<Upstream>>,
    limit: Arc<ConnectionLimit>,
    stop: CancellationToken,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let mut connections = JoinSet::new();
    let label = limit.listener.clone();
    loop {
        let (client, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = stop.cancelled() => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = crate::listen::accept(&listener, &label) => accepted,
        };
        // Past a cap the connection is closed at once (counted and
        // logged): a TCP route has no protocol to say why in.
        let Ok(permit) = limit.admit(peer.ip()) else {
            continue;
        };
        let upstream = target.load_full();
        connections.spawn(async move {
            let _permit = permit;
            let _in_flight = upstream.counters.start(Instant::now());
            if let Err(error) = forward(client, &upstream).await {
                debug!(route = %upstream.route, %peer, %error, "connection ended");
            }
        });
    }
    drop(listener);
    if !shutdown.is_cancelled() {
        // The route went: what is open carries on until it ends, or until
        // the interceptor shuts down.
        tokio::select! {
            _ = async { while connections.join_next().await.is_some() {} } => return,
            _ = shutdown.cancelled() => {}
        }
    }
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(listener = %label, ?grace, "connections still open after the grace period");
        connections.abort_all();
    }
}

async fn forward(mut client: TcpStream, upstream: &Arc<Upstream>) -> std::io::Result<()> {
    // While held, keep reading what the client sends (many protocols
    // speak first), so that a client who gives up is noticed and its
    // place released, instead of being connected to the app later.
    let mut early = Vec::new();
    let mut client_done_sending = false;
    let connected = {
        let connect = upstream.connect(upstream.deadline(Instant::now()));
        tokio::pin!(connect);
        loop {
            let mut buffer = [0u8; 4096];
            let listening = !client_done_sending && early.len() < EARLY_DATA_LIMIT;
            tokio::select! {
                connected = &mut connect => break connected,
                read = client.read(&mut buffer), if listening => match read {
                    Ok(0) if early.is_empty() => {
                        debug!(route = %upstream.route, "client left while its connection was held");
                        return Ok(());
                    }
                    Ok(0) => client_done_sending = true,
                    Ok(n) => early.extend_from_slice(&buffer[..n]),
                    Err(error) => return Err(error),
                },
            }
        }
    };
    // A client refused here just sees its connection close: raw TCP has
    // no way to say why. The reason goes to the log.
    let mut server = connected.map_err(|error| {
        if let Some(count) = NOT_FORWARDED.note() {
            warn!(route = %upstream.route, %error, count, "connections not forwarded");
        }
        std::io::Error::other(error)
    })?;
    server.write_all(&early).await?;
    if client_done_sending {
        server.shutdown().await?;
        tokio::io::copy(&mut server, &mut client).await?;
        client.shutdown().await?;
        return Ok(());
    }
    // Half-close passes through: when one side finishes sending, the other
    // side's write half is shut down and the reverse direction continues.
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}
