//! hoist's interceptor: HTTP and TCP proxies in front of apps that count
//! what passes (the `http` and `tcp` triggers read those counts) and hold
//! requests while an app scales from zero.
//!
//! It runs inside `hoist serve` (one process) or alone as `hoist
//! interceptor`, in which case the scaler reads every replica's counters
//! over HTTP (`fleet`).

pub mod counters;
mod deadline;
pub mod fleet;
mod http;
mod http1_pool;
pub mod report;
mod tcp;
pub mod traffic;
pub mod upstream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::InterceptorSettings;
use crate::listen::ConnectionLimit;
use counters::RouteCounters;
use http::{ClientLimits, HttpRoute, HttpRouter};
use upstream::Upstream;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http,
    Tcp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Http => "http",
            Protocol::Tcp => "tcp",
        })
    }
}

/// One route as the counters' readers see it.
pub struct RouteInfo {
    pub protocol: Protocol,
    /// The host an HTTP route serves (lower case).
    pub host: Option<String>,
    pub counters: Arc<RouteCounters>,
}

/// Every route of this process, by name.
pub struct Routes {
    /// Changes at every start, so readers can tell a restarted replica.
    pub instance: String,
    routes: BTreeMap<String, RouteInfo>,
    /// Each listener's connection cap, for metrics.
    pub listeners: Vec<Arc<ConnectionLimit>>,
}

impl Routes {
    pub fn get(&self, name: &str) -> Option<&RouteInfo> {
        self.routes.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &RouteInfo)> {
        self.routes.iter()
    }

    pub fn names(&self, protocol: Protocol) -> Vec<&str> {
        self.routes
            .iter()
            .filter(|(_, route)| route.protocol == protocol)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Takes one concurrency sample per route per second, for as long as
    /// the interceptor runs.
    async fn sample_every_second(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    let now = Instant::now();
                    for route in self.routes.values() {
                        route.counters.sample(now);
                    }
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InterceptorError {
    #[error("cannot listen on {addr} (interceptor {what}): {source}")]
    Bind {
        what: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The proxies, bound and not yet serving.
pub struct Interceptor {
    routes: Arc<Routes>,
    http: Option<(TcpListener, Arc<HttpRouter>, Arc<ConnectionLimit>)>,
    tcp: Vec<(TcpListener, Arc<Upstream>, Arc<ConnectionLimit>)>,
    limits: ClientLimits,
    /// Every route's upstream, released at shutdown.
    upstreams: Vec<Arc<Upstream>>,
}

impl Interceptor {
    /// Binds a listener for HTTP (when there are HTTP routes) and one per
    /// TCP route. Settings are validated when loaded.
    pub async fn bind(settings: &InterceptorSettings) -> Result<Self, InterceptorError> {
        let epoch = Instant::now();
        let mut routes = BTreeMap::new();
        // One budget for every listener, within the descriptors the
        // process has; each listener also has its own cap.
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let budget =
            crate::listen::proxied_connection_budget(crate::listen::raise_descriptor_limit());
        let limit = |listener: String| {
            Arc::new(ConnectionLimit::new(
                listener,
                settings.max_connections,
                open.clone(),
                budget,
            ))
        };
        let mut upstreams = Vec::new();
        let upstream = |name: &str, address: &str, cold_start: Option<Duration>| {
            Arc::new(Upstream::new(
                name.to_string(),
                address.to_string(),
                cold_start.unwrap_or(settings.cold_start_timeout),
                settings.max_held_per_route,
                Arc::new(RouteCounters::new(epoch)),
            ))
        };
        let mut http_routes = Vec::new();
        for route in &settings.http_routes {
            let upstream = upstream(&route.name, &route.upstream, route.cold_start_timeout);
            upstreams.push(upstream.clone());
            let counters = upstream.counters.clone();
            let http_route = HttpRoute::new(
                route.name.clone(),
                &route.host,
                route.path_prefix.clone(),
                upstream,
                route.upstream_http2,
                route.response_timeout.unwrap_or(settings.response_timeout),
            );
            routes.insert(
                route.name.clone(),
                RouteInfo {
                    protocol: Protocol::Http,
                    host: Some(http_route.host.clone()),
                    counters,
                },
            );
            http_routes.push(Arc::new(http_route));
        }
        let http = if http_routes.is_empty() {
            None
        } else {
            let listener = bind("HTTP proxy".to_string(), settings.http_listen).await?;
            Some((
                listener,
                Arc::new(HttpRouter::new(http_routes)),
                limit("http".to_string()),
            ))
        };
        let mut tcp = Vec::new();
        for route in &settings.tcp_routes {
            let upstream = upstream(&route.name, &route.upstream, route.cold_start_timeout);
            upstreams.push(upstream.clone());
            routes.insert(
                route.name.clone(),
                RouteInfo {
                    protocol: Protocol::Tcp,
                    host: None,
                    counters: upstream.counters.clone(),
                },
            );
            let listener = bind(format!("TCP route `{}`", route.name), route.listen).await?;
            tcp.push((listener, upstream, limit(format!("tcp:{}", route.name))));
        }
        let listeners = http
            .iter()
            .map(|(_, _, limit)| limit.clone())
            .chain(tcp.iter().map(|(_, _, limit)| limit.clone()))
            .collect();
        Ok(Self {
            routes: Arc::new(Routes {
                instance: instance_id(),
                routes,
                listeners,
            }),
            http,
            tcp,
            limits: ClientLimits::from(settings),
            upstreams,
        })
    }

    pub fn routes(&self) -> Arc<Routes> {
        self.routes.clone()
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
            .as_ref()
            .and_then(|(listener, _, _)| listener.local_addr().ok())
    }

    /// The bound address of each TCP route, by route name.
    pub fn tcp_addrs(&self) -> BTreeMap<String, SocketAddr> {
        self.tcp
            .iter()
            .filter_map(|(listener, upstream, _)| {
                Some((upstream.route.clone(), listener.local_addr().ok()?))
            })
            .collect()
    }

    /// Serves every proxy until `shutdown`; then held requests are
    /// answered at once (503 with `Retry-After`; held TCP connections are
    /// closed) and open ones get `grace` to finish.
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let mut tasks = JoinSet::new();
        tasks.spawn(self.routes.clone().sample_every_second(shutdown.clone()));
        if let Some((listener, router, connections)) = self.http {
            tasks.spawn(http::serve(
                listener,
                router,
                self.limits,
                connections,
                shutdown.clone(),
                grace,
            ));
        }
        for (listener, upstream, connections) in self.tcp {
            tasks.spawn(tcp::serve(
                listener,
                upstream,
                connections,
                shutdown.clone(),
                grace,
            ));
        }
        let upstreams = self.upstreams;
        tasks.spawn(async move {
            shutdown.cancelled().await;
            for upstream in &upstreams {
                upstream.close();
            }
        });
        while tasks.join_next().await.is_some() {}
    }
}

async fn bind(what: String, addr: SocketAddr) -> Result<TcpListener, InterceptorError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| InterceptorError::Bind { what, addr, source })
}

/// A value that differs between processes and starts.
fn instance_id() -> String {
    use std::hash::BuildHasher;
    let seed = (
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!(
        "{:016x}",
        std::collections::hash_map::RandomState::new().hash_one(seed)
    )
}
