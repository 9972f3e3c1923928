//! The HTTP interceptor: a reverse proxy (HTTP/1.1 and h2c in, HTTP/1.1 or
//! h2c out) that routes by host and path prefix, counts every request, and
//! holds requests through an upstream's cold start.
//!
//! Plain HTTP/1.1 requests take the direct path (`direct`: hoist's own
//! reading of the bytes); a connection whose request is anything else is
//! served by hyper from that request on (`serve_with_hyper`).

mod answer;
mod direct;
mod fields;
#[doc(hidden)]
pub mod fuzz;
mod host;
mod http1_client;
mod http1_connection;
mod hyper_path;
mod idle_pool;
mod peer;
mod plan;
mod replay;
mod request_head;
mod response_head;
mod route;
mod stopping;
mod stream_deadline;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use direct::Served;
use hyper_path::{ServerBuilder, serve_with_hyper, server_builder};
use peer::Peer;
pub use route::{HttpRoute, HttpRouter};
use stopping::Stopping;

use super::Routes;
use super::deadline::{Activity, Deadlines};
use super::refusal::refuse;
use crate::listen::ConnectionLimit;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = BoxBody<Bytes, BoxError>;

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How client connections are kept in check, and what a client is
/// believed (see `InterceptorSettings`).
#[derive(Debug, Clone)]
pub struct ClientLimits {
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub send_timeout: Duration,
    pub max_header_bytes: usize,
    pub http2_max_concurrent_streams: u32,
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
    /// Peers whose forwarded headers are kept (`trusted_proxies`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub allow_encoded_slashes: bool,
}

impl From<&crate::config::InterceptorSettings> for ClientLimits {
    fn from(settings: &crate::config::InterceptorSettings) -> Self {
        Self {
            first_byte_timeout: settings.first_byte_timeout,
            idle_timeout: settings.idle_timeout,
            send_timeout: settings.send_timeout,
            max_header_bytes: settings.max_header_bytes,
            http2_max_concurrent_streams: settings.http2_max_concurrent_streams,
            http2_keepalive_interval: settings.http2_keepalive_interval,
            http2_keepalive_timeout: settings.http2_keepalive_timeout,
            // Entries were checked when the settings were loaded.
            trusted_proxies: settings
                .trusted_proxies
                .iter()
                .filter_map(|entry| crate::config::parse_network(entry).ok())
                .collect(),
            allow_encoded_slashes: settings.allow_encoded_slashes,
        }
    }
}

/// Serves the proxy until `shutdown`, then lets open requests finish for up
/// to `grace`.
pub async fn serve(
    listener: TcpListener,
    routes: Arc<Routes>,
    limits: Arc<ArcSwap<ClientLimits>>,
    connections: Arc<ConnectionLimit>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let mut current = limits.load_full();
    let mut builder = Arc::new(server_builder(&current));
    let graceful = GracefulShutdown::new();
    let stopping = Stopping::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => {
                stopping.set();
                break;
            }
            accepted = crate::listen::accept(&listener, "interceptor HTTP") => accepted,
        };
        // Past a cap the client is told 503 (counted and logged).
        let Ok(permit) = connections.admit(peer.ip()) else {
            refuse(stream);
            continue;
        };
        // A reload's limits apply to connections accepted after it.
        if !Arc::ptr_eq(&current, &limits.load()) {
            current = limits.load_full();
            builder = Arc::new(server_builder(&current));
        }
        let activity = Activity::new();
        let client = ClientConnection {
            stream: Deadlines::new(
                stream,
                activity.clone(),
                current.first_byte_timeout,
                current.idle_timeout,
            )
            .with_send_timeout(current.send_timeout, routes.send_timeouts()),
            activity,
            // Built once per connection, not once per request.
            peer: Arc::new(Peer::new(peer, &current)),
            address: peer,
            routes: routes.clone(),
            hyper: builder.clone(),
            max_header_bytes: current.max_header_bytes,
            send_timeout: current.send_timeout,
            watcher: graceful.watcher(),
            stopping: stopping.clone(),
        };
        tokio::spawn(async move {
            // A trusted proxy's forwarded headers are appended to: hyper's
            // path does that.
            let served = if client.peer.trusted {
                Served::HandOver {
                    client: Box::new(client),
                    already_read: bytes::BytesMut::new(),
                    why: Handover::TrustedProxy,
                }
            } else {
                direct::serve(client).await
            };
            if let Served::HandOver {
                client,
                already_read,
                why,
            } = served
            {
                client.routes.http_handovers.count(why);
                serve_with_hyper(*client, already_read).await;
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            ?grace,
            "interceptor requests still open after the grace period"
        );
    }
}

/// Why a client connection is served by hyper rather than the direct
/// path (from its first request, or from the first one the direct path
/// did not take).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// A peer in `trusted_proxies`: its forwarded headers are appended to.
    TrustedProxy,
    /// A request of another shape (body coding, upgrade, h2c, an
    /// `Expect`, HTTP/1.0, a target or `Host` of other characters...).
    Shape,
    /// A body not yet received whole with its head.
    BodyInPieces,
    /// The route's app speaks h2c.
    UpstreamH2c,
    /// A head not complete within `max_header_bytes` (hyper: 431).
    LongHead,
}

impl Handover {
    pub const ALL: [Handover; 5] = [
        Handover::TrustedProxy,
        Handover::Shape,
        Handover::BodyInPieces,
        Handover::UpstreamH2c,
        Handover::LongHead,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Handover::TrustedProxy => "trusted_proxy",
            Handover::Shape => "request_shape",
            Handover::BodyInPieces => "body_in_pieces",
            Handover::UpstreamH2c => "upstream_h2c",
            Handover::LongHead => "long_head",
        }
    }
}

/// Connections handed to hyper, by why (`/metrics`).
#[derive(Debug, Default)]
pub struct Handovers([std::sync::atomic::AtomicU64; Handover::ALL.len()]);

impl Handovers {
    fn count(&self, why: Handover) {
        self.0[why as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn total(&self, why: Handover) -> u64 {
        self.0[why as usize].load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A client connection, and what serving it takes.
struct ClientConnection {
    stream: Deadlines<TcpStream>,
    /// Its open requests, for its deadlines.
    activity: Arc<Activity>,
    peer: Arc<Peer>,
    address: SocketAddr,
    routes: Arc<Routes>,
    hyper: Arc<ServerBuilder>,
    max_header_bytes: usize,
    send_timeout: Duration,
    /// Keeps hoist's graceful shutdown waiting while the connection lasts.
    watcher: Watcher,
    /// Asked per request, and waited on between requests.
    stopping: Stopping,
}
