//! The HTTP interceptor: a reverse proxy (HTTP/1.1 and h2c in, HTTP/1.1 or
//! h2c out) that routes by host and path prefix, counts every request, and
//! holds requests through an upstream's cold start.
//!
//! Plain HTTP/1.1 requests take the direct path (`direct`: hoist's own
//! reading of the bytes); a connection whose request is anything else is
//! served by hyper from that request on (`serve_with_hyper`).

mod direct;
mod direct_pool;
mod folded_names;
#[doc(hidden)]
pub mod fuzz;
mod host;
mod replay;
mod request_head;
mod response_head;
mod stream_deadline;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use direct_pool::DirectPool;
use replay::Replay;
use stream_deadline::StreamDeadlines;

use super::Routes;
use super::counters::{InFlight, RouteCounters};
use super::deadline::{Activity, Deadlines};
use super::http1_pool::{Http1Pool, SendError};
use super::refusal::refuse;
use super::request_path;
use super::upstream::{Upstream, UpstreamError};
use crate::listen::ConnectionLimit;
use arc_swap::ArcSwap;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// One HTTP route: which requests it takes and where they go.
pub struct HttpRoute {
    pub name: String,
    /// Lower case, without a port.
    pub hosts: Vec<String>,
    pub path_prefix: Option<String>,
    pub counters: Arc<RouteCounters>,
    pub upstream_http2: bool,
    /// The route's (first) host as a URI authority, for hyper-util's
    /// client: it keys that client's pool (one per route, whatever `Host`
    /// spellings clients send) and is an h2c upstream's `:authority`.
    authority: Option<Authority>,
    pub(super) upstream: Arc<Upstream>,
    /// HTTP/1.1 upstreams: requests of the direct path.
    direct: Arc<DirectPool>,
    /// HTTP/1.1 upstreams: plain requests hyper read.
    pool: Arc<Http1Pool>,
    /// Upgrades, and every request to an h2c upstream.
    client: Client<ColdStartConnector, Incoming>,
    /// How long the app has to send a response's head (then 504).
    response_timeout: Duration,
}

/// Idle upstream connections kept per route, at most.
const MAX_IDLE_PER_ROUTE: usize = 1024;
/// How long an idle upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

impl HttpRoute {
    /// Counts an answer the interceptor gave itself (502, 503, 504).
    fn counted_refusal(&self, answer: Answer) -> Response<ProxyBody> {
        self.counters.refused(answer.status.as_u16());
        answer.response()
    }

    pub fn new(
        name: String,
        hosts: &[String],
        path_prefix: Option<String>,
        upstream: Arc<Upstream>,
        upstream_http2: bool,
        response_timeout: Duration,
    ) -> Self {
        let counters = upstream.counters.clone();
        let mut builder = Client::builder(TokioExecutor::new());
        // Without a timer the idle timeout is never enforced.
        builder
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(MAX_IDLE_PER_ROUTE);
        if upstream_http2 {
            builder.http2_only(true);
        }
        let client = builder.build(ColdStartConnector {
            upstream: upstream.clone(),
        });
        let hosts: Vec<String> = hosts
            .iter()
            .map(|h| crate::routing::spec::fold_host(h))
            .collect();
        Self {
            name,
            authority: hosts
                .first()
                .and_then(|host| Authority::try_from(host.as_str()).ok()),
            hosts,
            path_prefix,
            counters,
            upstream_http2,
            direct: DirectPool::new(MAX_IDLE_PER_ROUTE, IDLE_TIMEOUT),
            pool: Http1Pool::new(
                upstream.clone(),
                MAX_IDLE_PER_ROUTE,
                IDLE_TIMEOUT,
                response_timeout,
            ),
            upstream,
            client,
            response_timeout,
        }
    }

    pub fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// `host` as the client sent it: any case, no port, perhaps the
    /// trailing dot of a fully qualified name (one host with or without).
    fn matches(&self, host: &str, path: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        if !self.hosts.iter().any(|own| own.eq_ignore_ascii_case(host)) {
            return false;
        }
        match &self.path_prefix {
            None => true,
            Some(prefix) => {
                let prefix = prefix.trim_end_matches('/');
                path == prefix
                    || prefix.is_empty()
                    || path
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
        }
    }
}

/// The routes, most specific (longest path prefix) first.
#[derive(Default)]
pub struct HttpRouter {
    routes: Vec<Arc<HttpRoute>>,
}

impl HttpRouter {
    pub fn new(mut routes: Vec<Arc<HttpRoute>>) -> Self {
        routes.sort_by_key(|route| {
            std::cmp::Reverse(route.path_prefix.as_deref().map_or(0, str::len))
        });
        Self { routes }
    }

    fn find(&self, host: &str, path: &str) -> Option<&Arc<HttpRoute>> {
        self.routes.iter().find(|route| route.matches(host, path))
    }
}

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
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
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
            shutdown: shutdown.clone(),
        };
        tokio::spawn(async move {
            // A trusted proxy's forwarded headers are appended to: hyper's
            // path does that.
            if client.peer.trusted {
                client.routes.http_handovers.count(Handover::TrustedProxy);
                serve_with_hyper(client, BytesMut::new()).await;
            } else {
                direct::serve(client).await;
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
    /// No route, or a path hoist refuses: hyper gives the answer.
    Answer,
    /// The route's app speaks h2c.
    UpstreamH2c,
    /// A head not complete within `max_header_bytes` (hyper: 431).
    LongHead,
}

impl Handover {
    pub const ALL: [Handover; 6] = [
        Handover::TrustedProxy,
        Handover::Shape,
        Handover::BodyInPieces,
        Handover::Answer,
        Handover::UpstreamH2c,
        Handover::LongHead,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Handover::TrustedProxy => "trusted_proxy",
            Handover::Shape => "request_shape",
            Handover::BodyInPieces => "body_in_pieces",
            Handover::Answer => "no_route_or_refused",
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
    shutdown: CancellationToken,
}

type ServerBuilder = hyper_util::server::conn::auto::Builder<TokioExecutor>;

/// Serves a client connection with hyper; `already_read` is what the
/// direct path read of it (hyper reads it first).
async fn serve_with_hyper(client: ClientConnection, already_read: BytesMut) {
    let ClientConnection {
        stream,
        activity,
        peer,
        address,
        routes,
        hyper,
        send_timeout,
        watcher,
        ..
    } = client;
    let send_timeouts = routes.send_timeouts();
    // The socket's write deadline does not see an HTTP/2 stream the
    // client gives no window (see `stream_deadline`).
    let streams = StreamDeadlines::new(send_timeout);
    let watched = streams.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (routes, peer, watched) = (routes.clone(), peer.clone(), watched.clone());
        let open = activity.request();
        let http2 = request.version() == Version::HTTP_2;
        async move {
            let response = proxy(&routes, &peer, request).await;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                open.upgraded();
            }
            let response = response.map(|body| Keeping { body, _kept: open }.boxed());
            Ok::<_, Infallible>(if http2 {
                response.map(|body| watched.watch(body).boxed())
            } else {
                response
            })
        }
    });
    let connection = hyper
        .serve_connection_with_upgrades(TokioIo::new(Replay::new(already_read, stream)), service)
        .into_owned();
    let ended = tokio::select! {
        ended = watcher.watch(connection) => ended,
        () = streams.stalled() => {
            send_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            debug!(peer = %address, "an HTTP/2 client took nothing for send_timeout; closing");
            Ok(())
        }
    };
    if let Err(error) = ended {
        debug!(%error, peer = %address, "client connection ended with an error");
    }
}

fn server_builder(limits: &ClientLimits) -> ServerBuilder {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client gets this long to send a request's headers (slow-loris),
    // and this many bytes for them (hyper answers 431 past it).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(limits.max_header_bytes);
    // A peer that stops answering pings (gone node, half-open connection)
    // is dropped with its streams.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keepalive_interval)
        .keep_alive_timeout(limits.http2_keepalive_timeout)
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// The client end of a connection: how forwarded headers name it, and
/// what it is believed. Built once per connection, not per request.
struct Peer {
    /// The address, for `X-Forwarded-For` and `X-Real-IP`.
    ip: HeaderValue,
    /// This hop's `Forwarded` element (RFC 7239): `for=…;proto=http`.
    forwarded: HeaderValue,
    /// In `interceptor.trusted_proxies`: its forwarded headers are kept.
    trusted: bool,
    allow_encoded_slashes: bool,
}

impl Peer {
    fn new(peer: SocketAddr, limits: &ClientLimits) -> Self {
        let ip = peer.ip().to_canonical();
        let address = ip.to_string();
        // An IPv6 node is quoted and bracketed (RFC 7239 §6).
        let node = match ip {
            std::net::IpAddr::V4(_) => address.clone(),
            std::net::IpAddr::V6(_) => format!("\"[{address}]\""),
        };
        Self {
            ip: HeaderValue::from_str(&address).unwrap_or(HeaderValue::from_static("unknown")),
            forwarded: HeaderValue::from_str(&format!("for={node};proto=http"))
                .unwrap_or(HeaderValue::from_static("for=unknown;proto=http")),
            trusted: crate::config::network_contains(&limits.trusted_proxies, ip),
            allow_encoded_slashes: limits.allow_encoded_slashes,
        }
    }
}

async fn proxy(
    routes: &Routes,
    peer: &Peer,
    mut request: Request<Incoming>,
) -> Response<ProxyBody> {
    // hoist is no forward proxy: a tunnel to a host of the client's
    // choosing is not for an app to be asked (it got `CONNECT /`).
    if request.method() == http::Method::CONNECT {
        let mut response = Answer::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "hoist interceptor: CONNECT is not served\n".to_string(),
        )
        .response();
        response.headers_mut().insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE"),
        );
        return response;
    }
    let authority = match request_host(&request) {
        Ok(authority) => authority,
        Err(reason) => {
            return Answer::new(
                StatusCode::BAD_REQUEST,
                format!("hoist interceptor: {reason}\n"),
            )
            .response();
        }
    };
    // Routed by, and forwarded with, the normalised path.
    let path = match request_path::normalize(request.uri().path(), peer.allow_encoded_slashes) {
        Ok(path) => path,
        Err(reason) => {
            return Answer::new(
                StatusCode::BAD_REQUEST,
                format!("hoist interceptor: {reason}\n"),
            )
            .response();
        }
    };
    let host = authority.host;
    let normalised = (!host.is_empty())
        .then(|| HeaderValue::from_bytes(&authority.normalised()).ok())
        .flatten();
    let route = routes.current().http.find(host, &path).cloned();
    let Some(route) = route else {
        return Answer::new(
            StatusCode::NOT_FOUND,
            format!("hoist interceptor: no route for host `{host}` and path `{path}`\n"),
        )
        .response();
    };
    let rewritten = match path {
        std::borrow::Cow::Owned(path) => Some(path),
        std::borrow::Cow::Borrowed(_) => None,
    };
    let in_flight = route.counters.start(Instant::now());
    let client_version = request.version();
    let upgrade = upgrade_protocol(request.headers());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));

    let (mut parts, body) = request.into_parts();
    // The app gets the host hoist routed by, normalised: an HTTP/2
    // client may name it in `:authority` only, and an HTTP/1.1
    // absolute-form target replaces `Host` (RFC 9112 §3.2.2).
    if let Some(value) = &normalised {
        parts.headers.insert(header::HOST, value.clone());
    }
    let forwarded_host = normalised;
    let pooled = !route.upstream_http2 && client_upgrade.is_none();
    let mut uri = std::mem::take(&mut parts.uri).into_parts();
    if let Some(path) = rewritten {
        let query = uri.path_and_query.as_ref().and_then(|pq| pq.query());
        let target = match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        uri.path_and_query = PathAndQuery::try_from(target).ok();
    }
    if pooled {
        // Written as is on the connection: an HTTP/1.1 origin server gets
        // the origin form (`/path?query`), as from any client.
        uri.scheme = None;
        uri.authority = None;
    } else {
        // hyper-util's client wants the absolute form; it sends the origin
        // form (HTTP/1.1) or `:authority` (h2c).
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = route.authority.clone();
    }
    if uri.path_and_query.is_none() {
        uri.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    parts.uri = match Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(_) => {
            return Answer::new(
                StatusCode::BAD_REQUEST,
                "hoist interceptor: the request target cannot be forwarded\n".to_string(),
            )
            .response();
        }
    };
    remove_hop_by_hop(&mut parts.headers, upgrade.as_ref());
    if route.upstream_http2 {
        // HTTP/2 carries the host as `:authority` (the route's host).
        parts.version = Version::HTTP_2;
        parts.headers.remove(header::HOST);
    } else {
        parts.version = Version::HTTP_11;
        if client_version == Version::HTTP_2 {
            join_cookies(&mut parts.headers);
        }
    }
    forwarded_headers(&mut parts.headers, peer, forwarded_host);

    // Held here, each request on its own deadline and under the cap, while
    // the upstream is at zero; connecting waits the same way for the rest.
    let deadline = route.upstream.deadline();
    if let Err(error) = route.upstream.admit(deadline).await {
        return route.counted_refusal(Answer::refusal(&error));
    }
    let request = Request::from_parts(parts, body);
    if pooled {
        return match route.pool.send(request, deadline).await {
            Ok(mut response) => {
                route.upstream.reached();
                *response.version_mut() = client_version;
                remove_hop_by_hop(response.headers_mut(), None);
                response.map(|body| counted(body, in_flight))
            }
            Err(SendError::Upstream(error)) => route.counted_refusal(Answer::refusal(&error)),
            // The client's own request body failed (it left mid-upload).
            Err(SendError::Http(error)) if error.is_user() => {
                debug!(route = %route.name, %error, "the client's request failed");
                Answer::new(
                    StatusCode::BAD_REQUEST,
                    "hoist interceptor: the request's body could not be read\n".to_string(),
                )
                .response()
            }
            Err(SendError::Http(error)) => {
                route.counted_refusal(Answer::upstream_failure(&route.name, &cause_of(&error)))
            }
            Err(SendError::ResponseTimeout(timeout)) => {
                route.counted_refusal(Answer::too_slow(&route.name, timeout))
            }
        };
    }
    // Here the clock also runs while the connector holds a request through
    // a cold start that began after `admit`: rare, and bounded either way.
    let answer = tokio::time::timeout(route.response_timeout, route.client.request(request));
    let mut response = match answer.await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return route.counted_refusal(client_failure(&route.name, &error)),
        Err(_) => {
            return route.counted_refusal(Answer::too_slow(&route.name, route.response_timeout));
        }
    };
    route.upstream.reached();
    *response.version_mut() = client_version;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        let route_name = route.name.clone();
        tokio::spawn(async move {
            tunnel(client_upgrade, upstream_upgrade, &route_name).await;
            drop(in_flight);
        });
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, empty());
    }

    remove_hop_by_hop(response.headers_mut(), None);
    response.map(|body| counted(body, in_flight))
}

fn counted<B>(body: B, in_flight: InFlight) -> ProxyBody
where
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
{
    Keeping {
        body,
        _kept: in_flight,
    }
    .boxed()
}

/// Copies bytes both ways between an upgraded client and upstream
/// connection (WebSocket and other `Upgrade` protocols).
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    route: &str,
) {
    match tokio::try_join!(client, upstream) {
        Ok((client, upstream)) => {
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                debug!(route, %error, "upgraded connection ended with an error");
            }
        }
        Err(error) => debug!(route, %error, "upgrade failed"),
    }
}

fn client_failure(route: &str, error: &hyper_util::client::legacy::Error) -> Answer {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(upstream) = current.downcast_ref::<UpstreamError>() {
            return Answer::refusal(upstream);
        }
        source = current.source();
    }
    Answer::upstream_failure(route, &cause_of(error))
}

/// The innermost cause of an error (what a log line wants).
fn cause_of(error: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(std::error::Error::source(error), |e| e.source())
        .last()
        .map_or_else(|| error.to_string(), ToString::to_string)
}

/// An answer the interceptor gives itself: a line of text saying why.
struct Answer {
    status: StatusCode,
    text: String,
    /// Another replica (or this app, once up) can take it at once.
    retry_soon: bool,
}

impl Answer {
    fn new(status: StatusCode, text: String) -> Self {
        Self {
            status,
            text,
            retry_soon: false,
        }
    }

    fn refusal(error: &UpstreamError) -> Self {
        let status = match error {
            UpstreamError::ColdStartTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            UpstreamError::Denied { .. } => StatusCode::BAD_GATEWAY,
            UpstreamError::TooManyHeld { .. }
            | UpstreamError::ShuttingDown { .. }
            | UpstreamError::Moved { .. }
            | UpstreamError::Removed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self {
            retry_soon: matches!(
                error,
                UpstreamError::ShuttingDown { .. } | UpstreamError::Moved { .. }
            ),
            ..Self::new(status, format!("hoist interceptor: {error}\n"))
        }
    }

    /// The app's connection failed; `cause` is logged, not sent.
    fn upstream_failure(route: &str, cause: &dyn std::fmt::Display) -> Self {
        debug!(route, error = %cause, "upstream failed");
        Self::new(
            StatusCode::BAD_GATEWAY,
            format!("hoist interceptor: route `{route}`: the app's connection failed\n"),
        )
    }

    fn too_slow(route: &str, timeout: Duration) -> Self {
        debug!(route, ?timeout, "the app did not answer in time");
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "hoist interceptor: route `{route}`: the app did not answer within {} (response_timeout)\n",
                humantime::format_duration(timeout)
            ),
        )
    }

    fn response(self) -> Response<ProxyBody> {
        let mut response = Response::new(
            Full::new(Bytes::from(self.text))
                .map_err(|never| match never {})
                .boxed(),
        );
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT));
        if self.retry_soon {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }

    /// The same answer as an HTTP/1.1 message, for the direct path; to a
    /// `HEAD` request without its body (the client reads none).
    fn write_http1(&self, out: &mut Vec<u8>, close: bool, head: bool) {
        use std::io::Write;
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-type: {TEXT}\r\ncontent-length: {}\r\n",
            self.status.as_str(),
            self.status.canonical_reason().unwrap_or(""),
            self.text.len()
        );
        if self.retry_soon {
            out.extend_from_slice(b"retry-after: 1\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        response_head::write_date(out);
        out.extend_from_slice(b"\r\n");
        if !head {
            out.extend_from_slice(self.text.as_bytes());
        }
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

/// An HTTP/2 client may split `Cookie` into several fields; HTTP/1.1
/// servers expect one (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    let cookies: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    if cookies.len() > 1
        && let Ok(joined) = HeaderValue::from_str(&cookies.join("; "))
    {
        headers.insert(header::COOKIE, joined);
    }
}

/// The host a request is for (see `host`): an HTTP/1.1 absolute-form
/// target's authority, else the one `Host` header, else HTTP/2's
/// `:authority`. Several `Host` headers, or none in HTTP/1.1, is a bad
/// request (RFC 9112 §3.2), and so is any value that is not one host.
fn request_host<B>(request: &Request<B>) -> Result<host::Authority<'_>, String> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header".to_string());
    }
    let in_target = request
        .uri()
        .authority()
        .map(|authority| host::Authority::parse(authority.as_str().as_bytes()))
        .transpose()
        .map_err(|error| format!("the request target's authority: {error}"))?;
    let version = request.version();
    if version < Version::HTTP_2
        && let Some(authority) = in_target
    {
        return Ok(authority);
    }
    // A request whose `Host` names another authority than `:authority`
    // is malformed (RFC 9113 §8.3.1): which one a hop routes by, and which
    // one the app believes, would differ.
    if version == Version::HTTP_2
        && let (Some(host), Some(authority)) = (host, request.uri().authority())
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        return Err("the Host header differs from :authority".to_string());
    }
    match host {
        Some(value) => host::Authority::parse(value.as_bytes())
            .map_err(|error| format!("the Host header: {error}")),
        None if version == Version::HTTP_11 => Err("no Host header".to_string()),
        None => Ok(in_target.unwrap_or(host::Authority {
            host: "",
            port: None,
        })),
    }
}

/// The protocol an HTTP/1.1 request asks to switch to, if any.
fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are
/// not forwarded, except what an upgrade needs and `TE: trailers` (gRPC).
/// Nor are `_` spellings of those, of framing and of forwarding headers
/// (see `folded_names`).
/// `Trailer` is end to end: HTTP/1.1 only sends the trailers it declares.
fn remove_hop_by_hop(headers: &mut HeaderMap, upgrade: Option<&HeaderValue>) {
    // Most messages carry none of them: one pass over the few names the
    // message has (comparisons, no hashing), nothing to remove.
    if upgrade.is_none()
        && !headers.keys().any(|name| {
            is_hop_by_hop(name.as_str()) || folded_names::is_underscore_alias(name.as_str())
        })
    {
        return;
    }
    let aliases: Vec<HeaderName> = headers
        .keys()
        .filter(|name| folded_names::is_underscore_alias(name.as_str()))
        .cloned()
        .collect();
    for name in aliases {
        headers.remove(name);
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    let trailers = headers
        .get(header::TE)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
}

/// Whether a field, named in any case, is one of `HOP_BY_HOP` (a
/// comparison per name, no hashing: both paths ask it of every field).
fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop| hop.as_str().eq_ignore_ascii_case(name))
}

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Sets the headers that tell the app who the client is. Who sends them:
/// any client, so what a client wrote is dropped, unless the peer is a
/// proxy the operator trusts (`interceptor.trusted_proxies`), whose
/// values are kept and to whose lists this hop is appended.
fn forwarded_headers(headers: &mut HeaderMap, peer: &Peer, host: Option<HeaderValue>) {
    if !peer.trusted {
        // `insert` replaces every value the client wrote for its name.
        headers.insert(X_FORWARDED_FOR, peer.ip.clone());
        headers.insert(X_REAL_IP, peer.ip.clone());
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        headers.insert(header::FORWARDED, peer.forwarded.clone());
        match host {
            Some(host) => headers.insert(X_FORWARDED_HOST, host),
            None => headers.remove(X_FORWARDED_HOST),
        };
        return;
    }
    append_hop(headers, X_FORWARDED_FOR, &peer.ip);
    append_hop(headers, header::FORWARDED, &peer.forwarded);
    if !headers.contains_key(X_REAL_IP) {
        headers.insert(X_REAL_IP, peer.ip.clone());
    }
    // A proxy in front (TLS termination) knows the original scheme better.
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if let Some(host) = host
        && !headers.contains_key(X_FORWARDED_HOST)
    {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// Appends `hop` to a comma-separated list header (all its fields joined).
fn append_hop(headers: &mut HeaderMap, name: HeaderName, hop: &HeaderValue) {
    let mut joined: Vec<u8> = Vec::new();
    for value in headers.get_all(&name) {
        joined.extend_from_slice(value.as_bytes());
        joined.extend_from_slice(b", ");
    }
    if joined.is_empty() {
        headers.insert(name, hop.clone());
        return;
    }
    joined.extend_from_slice(hop.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(name, value);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

fn empty() -> ProxyBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// A response body that keeps something until it is done: its request
/// in flight (counted), or open on its connection (no idle deadline).
struct Keeping<B, G> {
    body: B,
    _kept: G,
}

impl<B, G> Body for Keeping<B, G>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    G: Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Connects the route's client to its upstream, whatever the URI says,
/// holding through a cold start.
#[derive(Clone)]
struct ColdStartConnector {
    upstream: Arc<Upstream>,
}

impl tower::Service<Uri> for ColdStartConnector {
    type Response = TokioIo<TcpStream>;
    type Error = UpstreamError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let deadline = upstream.deadline();
            upstream.connect(deadline).await.map(TokioIo::new)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_stay_behind_but_upgrades_and_trailers_pass() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::TRAILER, HeaderValue::from_static("x-checksum"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert("x-kept", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut headers, Some(&HeaderValue::from_static("websocket")));
        assert!(!headers.contains_key("x-private"));
        assert!(!headers.contains_key("keep-alive"));
        assert!(!headers.contains_key(header::TRANSFER_ENCODING));
        assert_eq!(headers[header::TE], "trailers");
        assert_eq!(headers[header::TRAILER], "x-checksum", "end to end");
        assert_eq!(headers[header::UPGRADE], "websocket");
        assert_eq!(headers[header::CONNECTION], "upgrade");
        assert_eq!(headers["x-kept"], "1");
    }

    #[test]
    fn path_prefixes_match_whole_segments() {
        let counters = Arc::new(RouteCounters::new(Instant::now()));
        let upstream = Arc::new(Upstream::new(
            "api".into(),
            "127.0.0.1:1".into(),
            Duration::from_secs(1),
            1,
            counters,
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let route = HttpRoute::new(
            "api".into(),
            &["Web.Example.com".to_string()],
            Some("/api/".into()),
            upstream,
            false,
            Duration::from_secs(240),
        );
        assert!(route.matches("web.example.com", "/api"));
        assert!(route.matches("web.example.com", "/api/orders"));
        assert!(!route.matches("web.example.com", "/apix"));
        assert!(!route.matches("other.example.com", "/api"));
    }

    #[test]
    fn a_peer_is_named_per_rfc_7239_and_trusted_by_network() {
        let settings = crate::config::InterceptorSettings {
            trusted_proxies: vec!["10.0.0.0/8".into()],
            ..Default::default()
        };
        let limits = ClientLimits::from(&settings);
        let v6 = Peer::new("[::1]:4000".parse().unwrap(), &limits);
        assert_eq!(v6.forwarded, "for=\"[::1]\";proto=http");
        assert_eq!(v6.ip, "::1");
        assert!(!v6.trusted);
        // A v4 client on a dual-stack listener arrives IPv4-mapped.
        let mapped = Peer::new("[::ffff:10.1.2.3]:4000".parse().unwrap(), &limits);
        assert_eq!(mapped.forwarded, "for=10.1.2.3;proto=http");
        assert!(mapped.trusted);
    }

    #[test]
    fn http2_cookie_fields_become_one_for_http1() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1"));
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        join_cookies(&mut headers);
        let cookies: Vec<_> = headers.get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);
    }
}
