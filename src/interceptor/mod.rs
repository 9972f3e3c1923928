//! hoist's interceptor: HTTP and TCP proxies in front of apps that count
//! what passes (the `http` and `tcp` triggers read those counts) and hold
//! requests while an app scales from zero.
//!
//! It runs inside `hoist serve` (one process) or alone as `hoist
//! interceptor`, in which case the scaler reads every replica's counters
//! over HTTP (`fleet`).

pub mod counters;
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
use counters::RouteCounters;
use http::{HttpRoute, HttpRouter};
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
    http: Option<(TcpListener, Arc<HttpRouter>)>,
    tcp: Vec<(TcpListener, Arc<Upstream>)>,
}

impl Interceptor {
    /// Binds a listener for HTTP (when there are HTTP routes) and one per
    /// TCP route. Settings are validated when loaded.
    pub async fn bind(settings: &InterceptorSettings) -> Result<Self, InterceptorError> {
        let epoch = Instant::now();
        let mut routes = BTreeMap::new();
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
            Some((listener, Arc::new(HttpRouter::new(http_routes))))
        };
        let mut tcp = Vec::new();
        for route in &settings.tcp_routes {
            let upstream = upstream(&route.name, &route.upstream, route.cold_start_timeout);
            routes.insert(
                route.name.clone(),
                RouteInfo {
                    protocol: Protocol::Tcp,
                    host: None,
                    counters: upstream.counters.clone(),
                },
            );
            let listener = bind(format!("TCP route `{}`", route.name), route.listen).await?;
            tcp.push((listener, upstream));
        }
        Ok(Self {
            routes: Arc::new(Routes {
                instance: instance_id(),
                routes,
            }),
            http,
            tcp,
        })
    }

    pub fn routes(&self) -> Arc<Routes> {
        self.routes.clone()
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// The bound address of each TCP route, by route name.
    pub fn tcp_addrs(&self) -> BTreeMap<String, SocketAddr> {
        self.tcp
            .iter()
            .filter_map(|(listener, upstream)| {
                Some((upstream.route.clone(), listener.local_addr().ok()?))
            })
            .collect()
    }

    /// Serves every proxy until `shutdown`; open requests and connections
    /// then get `grace` to finish.
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let mut tasks = JoinSet::new();
        tasks.spawn(self.routes.clone().sample_every_second(shutdown.clone()));
        if let Some((listener, router)) = self.http {
            tasks.spawn(http::serve(listener, router, shutdown.clone(), grace));
        }
        for (listener, upstream) in self.tcp {
            tasks.spawn(tcp::serve(listener, upstream, shutdown.clone(), grace));
        }
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
