//! hoist's interceptor: HTTP and TCP proxies in front of apps that count
//! what passes (the `http` and `tcp` triggers read those counts) and hold
//! requests while an app scales from zero.
//!
//! It runs inside `hoist serve` (one process) or alone as `hoist
//! interceptor`, in which case the scaler reads every replica's counters
//! over HTTP (`fleet`) and each replica follows the scaler's route table
//! (`follow`). Routes come from hoist's config and from ScaledObjects
//! (declared in trigger metadata); both change at runtime (`table`).

mod cold_start_times;
pub mod counters;
mod deadline;
mod dial;
pub mod fleet;
pub mod follow;
mod http;
mod lazy_timer;
mod refusal;
pub mod report;
mod request_path;
pub mod route_metrics;
mod selector;
pub mod table;
mod tcp;
pub mod traffic;
pub mod upstream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::InterceptorSettings;
use crate::listen::ConnectionLimit;
pub use crate::routing::Protocol;
use crate::routing::RouteSpec;
use counters::RouteCounters;
pub use http::ClientLimits;
use http::HttpRouter;
/// The direct HTTP/1.1 path's parsers, for the fuzz targets.
#[doc(hidden)]
pub use http::fuzz as http_fuzz;
use table::{RouteControl, RouteDefaults};

/// One route as the counters' readers see it.
pub struct RouteInfo {
    pub spec: RouteSpec,
    pub counters: Arc<RouteCounters>,
    /// TCP: the address the route's listener is bound to.
    pub bound: Option<SocketAddr>,
}

impl RouteInfo {
    pub fn protocol(&self) -> Protocol {
        self.spec.protocol
    }

    /// The hosts an HTTP route serves (lower case).
    pub fn hosts(&self) -> &[String] {
        &self.spec.hosts
    }
}

/// One version of the route table: what a request is routed by.
#[derive(Default)]
pub struct RouteSet {
    routes: BTreeMap<String, RouteInfo>,
    http: HttpRouter,
    /// Declared routes this interceptor does not serve, with the reason.
    pub skipped: BTreeMap<String, String>,
}

impl RouteSet {
    pub fn get(&self, name: &str) -> Option<&RouteInfo> {
        self.routes.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &RouteInfo)> {
        self.routes.iter()
    }

    pub fn names(&self, protocol: Protocol) -> Vec<&str> {
        self.routes
            .iter()
            .filter(|(_, route)| route.protocol() == protocol)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// Every route of this process: the table in force, swapped whole when
/// routes change, so a request sees one version from start to end.
pub struct Routes {
    /// Changes at every start, so readers can tell a restarted replica.
    pub instance: String,
    current: ArcSwap<RouteSet>,
    /// Bumped at every change of the table.
    version: watch::Sender<u64>,
    /// Each listener's connection cap, for metrics.
    listeners: Mutex<Vec<Arc<ConnectionLimit>>>,
    /// HTTP connections the direct path handed to hyper, by why.
    http_handovers: http::Handovers,
    /// HTTP client connections closed by `send_timeout`.
    send_timeouts: Arc<std::sync::atomic::AtomicU64>,
    /// How upstreams naming a Service are dialled.
    pods: Arc<dial::PodDialling>,
}

impl Routes {
    fn new() -> Self {
        Self {
            instance: instance_id(),
            current: ArcSwap::from_pointee(RouteSet::default()),
            version: watch::Sender::new(0),
            listeners: Mutex::new(Vec::new()),
            http_handovers: http::Handovers::default(),
            send_timeouts: Arc::default(),
            pods: Arc::default(),
        }
    }

    /// How upstreams naming a Service are dialled
    /// (`interceptor.direct_to_pods`).
    pub fn pods(&self) -> Arc<dial::PodDialling> {
        self.pods.clone()
    }

    /// Counts the HTTP client connections `send_timeout` closed.
    pub(crate) fn send_timeouts(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.send_timeouts.clone()
    }

    /// The table in force now.
    pub fn current(&self) -> Arc<RouteSet> {
        self.current.load_full()
    }

    /// Ticks at every change of the table.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    pub fn listeners(&self) -> Vec<Arc<ConnectionLimit>> {
        self.listeners
            .lock()
            .map(|listeners| listeners.clone())
            .unwrap_or_default()
    }

    fn replace(&self, set: RouteSet) {
        self.current.store(Arc::new(set));
        self.version.send_modify(|version| *version += 1);
    }

    fn set_listeners(&self, listeners: Vec<Arc<ConnectionLimit>>) {
        if let Ok(mut current) = self.listeners.lock() {
            *current = listeners;
        }
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
                    for (_, route) in self.current().iter() {
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
    control: RouteControl,
    http: (TcpListener, Arc<ConnectionLimit>),
}

impl Interceptor {
    /// Binds the HTTP listener and one per TCP route of the config.
    /// Settings are validated when loaded.
    pub async fn bind(
        settings: &InterceptorSettings,
        grace: Duration,
    ) -> Result<Self, InterceptorError> {
        let listener = TcpListener::bind(settings.http_listen)
            .await
            .map_err(|source| InterceptorError::Bind {
                what: "HTTP proxy".to_string(),
                addr: settings.http_listen,
                source,
            })?;
        let control = RouteControl::new(
            Arc::new(Routes::new()),
            RouteDefaults::from(settings),
            ClientLimits::from(settings),
            grace,
        );
        control.apply_config(
            table::config_routes(settings),
            RouteDefaults::from(settings),
        )?;
        let limit = control.listener_limit("http".to_string());
        Ok(Self {
            control,
            http: (listener, limit),
        })
    }

    pub fn routes(&self) -> Arc<Routes> {
        self.control.routes()
    }

    /// Changes the routes while the proxies serve.
    pub fn control(&self) -> RouteControl {
        self.control.clone()
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.0.local_addr().ok()
    }

    /// The bound address of each TCP route, by route name.
    pub fn tcp_addrs(&self) -> BTreeMap<String, SocketAddr> {
        self.control.routes().current().tcp_addrs()
    }

    /// Serves every proxy until `shutdown`; then held requests are
    /// answered at once (503 with `Retry-After`; held TCP connections are
    /// closed) and open ones get the grace period to finish.
    pub async fn run(self, shutdown: CancellationToken) {
        let routes = self.control.routes();
        let sampling = tokio::spawn(routes.clone().sample_every_second(shutdown.clone()));
        let (listener, limit) = self.http;
        let http = tokio::spawn(http::serve(
            listener,
            routes,
            self.control.client_limits(),
            limit,
            shutdown.clone(),
            self.control.grace(),
        ));
        shutdown.cancelled().await;
        self.control.shut_down().await;
        let _ = http.await;
        let _ = sampling.await;
    }
}

impl RouteSet {
    /// The bound address of each TCP route, by route name.
    pub fn tcp_addrs(&self) -> BTreeMap<String, SocketAddr> {
        self.routes
            .iter()
            .filter_map(|(name, route)| Some((name.clone(), route.bound?)))
            .collect()
    }
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

/// A reqwest error with its causes, which its `Display` leaves out.
pub(crate) fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
