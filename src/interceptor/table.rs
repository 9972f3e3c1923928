//! Changing the routes of a running interceptor: routes from hoist's config
//! (set again by a reload) and routes ScaledObjects declare (from the
//! scaler's route table) are merged into one table and swapped in whole.
//!
//! What carries on across a change: open connections and requests (they
//! hold their route), each route's counters (kept by name), upstream
//! connection pools and TCP listeners (reused while their settings stand).
//! A removed route's held requests get 503; a route whose upstream moved
//! tells its held requests to retry.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::counters::RouteCounters;
use super::dial::{Dialer, Fence};
use super::http::{ClientLimits, HttpRoute, HttpRouter};
use super::upstream::{Closing, Upstream};
use super::{InterceptorError, RouteInfo, RouteSet, Routes, tcp};
use crate::cluster::ServiceEndpoints;
use crate::config::{HostOverrides, InterceptorSettings};
use crate::listen::{ConnectionCaps, ConnectionLimit};
use crate::routing::{Claim, Listen, Protocol, RouteSpec};

/// What a route takes from the interceptor's settings when it sets
/// nothing itself; a reload may change them.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteDefaults {
    pub http_listen: SocketAddr,
    pub cold_start_timeout: Duration,
    pub response_timeout: Duration,
    pub max_held_per_route: usize,
    pub connections: ConnectionCaps,
    /// Where declared routes' upstreams may not connect.
    pub fence: Fence,
    pub hosts: HostOverrides,
}

impl From<&InterceptorSettings> for RouteDefaults {
    fn from(settings: &InterceptorSettings) -> Self {
        Self {
            http_listen: settings.http_listen,
            cold_start_timeout: settings.cold_start_timeout,
            response_timeout: settings.response_timeout,
            max_held_per_route: settings.max_held_per_route,
            connections: ConnectionCaps {
                max: settings.max_connections,
                per_client: settings.max_connections_per_client,
            },
            fence: Fence::from(settings),
            hosts: settings.host_overrides.clone(),
        }
    }
}

/// The routes of hoist's config file.
pub fn config_routes(settings: &InterceptorSettings) -> Vec<RouteSpec> {
    let http = settings.http_routes.iter().map(|route| RouteSpec {
        name: route.name.clone(),
        protocol: Protocol::Http,
        owner: None,
        hosts: vec![route.host.to_ascii_lowercase()],
        path_prefix: route.path_prefix.clone(),
        listen: None,
        upstream: route.upstream.clone(),
        upstream_http2: route.upstream_http2,
        cold_start_timeout: route.cold_start_timeout,
        response_timeout: route.response_timeout,
    });
    let tcp = settings.tcp_routes.iter().map(|route| RouteSpec {
        name: route.name.clone(),
        protocol: Protocol::Tcp,
        owner: None,
        hosts: Vec::new(),
        path_prefix: None,
        listen: Some(Listen::Address(route.listen)),
        upstream: route.upstream.clone(),
        upstream_http2: false,
        cold_start_timeout: route.cold_start_timeout,
        response_timeout: None,
    });
    http.chain(tcp).collect()
}

/// Changes the routes of one interceptor. Cheap to clone.
#[derive(Clone)]
pub struct RouteControl {
    inner: Arc<Inner>,
}

struct Inner {
    routes: Arc<Routes>,
    limits: Arc<ArcSwap<ClientLimits>>,
    /// Shared by every declared route's upstream: a reload's
    /// `denied_networks` applies to their next connection.
    fence: Arc<ArcSwap<Fence>>,
    epoch: Instant,
    /// Open connections of every listener, within `budget`.
    open: Arc<AtomicUsize>,
    budget: usize,
    grace: Duration,
    /// Fires when the interceptor shuts down.
    shutdown: CancellationToken,
    /// The TCP listeners' tasks, awaited at shutdown.
    tasks: TaskTracker,
    live: Mutex<Live>,
}

#[derive(Default)]
struct Live {
    defaults: Option<RouteDefaults>,
    config: Vec<RouteSpec>,
    declared: Vec<RouteSpec>,
    counters: HashMap<String, Arc<RouteCounters>>,
    upstreams: HashMap<String, Arc<Upstream>>,
    http: HashMap<String, Arc<HttpRoute>>,
    /// By the address asked for.
    tcp: HashMap<ListenKey, TcpListening>,
    http_limit: Option<Arc<ConnectionLimit>>,
}

/// A TCP listener's identity: the address asked for, and for port 0 (any
/// free port) the route too, since each such route gets its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ListenKey(SocketAddr, Option<String>);

impl ListenKey {
    fn of(spec: &RouteSpec, listen: Listen, http_listen: SocketAddr) -> Self {
        let address = listen.resolve(http_listen);
        let route = (address.port() == 0).then(|| spec.name.clone());
        Self(address, route)
    }
}

struct TcpListening {
    bound: SocketAddr,
    /// The route this address serves now.
    target: Arc<ArcSwap<Upstream>>,
    stop: CancellationToken,
    limit: Arc<ConnectionLimit>,
}

/// What the merge of config and declared routes comes to.
struct Merged {
    routes: Vec<RouteSpec>,
    skipped: BTreeMap<String, String>,
}

impl RouteControl {
    pub fn new(
        routes: Arc<Routes>,
        defaults: RouteDefaults,
        limits: ClientLimits,
        grace: Duration,
    ) -> Self {
        let budget =
            crate::listen::proxied_connection_budget(crate::listen::raise_descriptor_limit());
        Self {
            inner: Arc::new(Inner {
                routes,
                limits: Arc::new(ArcSwap::from_pointee(limits)),
                fence: Arc::new(ArcSwap::from_pointee(defaults.fence.clone())),
                epoch: Instant::now(),
                open: Arc::new(AtomicUsize::new(0)),
                budget,
                grace,
                shutdown: CancellationToken::new(),
                tasks: TaskTracker::new(),
                live: Mutex::new(Live {
                    defaults: Some(defaults),
                    ..Live::default()
                }),
            }),
        }
    }

    pub fn routes(&self) -> Arc<Routes> {
        self.inner.routes.clone()
    }

    /// From now on, every upstream that names a Service dials its ready
    /// pods as `pods` shows them (`interceptor.direct_to_pods`).
    pub fn dial_pods(&self, pods: ServiceEndpoints) {
        self.inner.routes.pods().follow(pods);
    }

    /// `interceptor.direct_to_pods` cannot be honoured, for `why`: the
    /// Services are dialled, and `GET /interceptor/services` says why.
    pub fn dial_services(&self, why: &str) {
        self.inner.routes.pods().unavailable(why);
    }

    pub(super) fn client_limits(&self) -> Arc<ArcSwap<ClientLimits>> {
        self.inner.limits.clone()
    }

    pub(super) fn grace(&self) -> Duration {
        self.inner.grace
    }

    /// The connection cap of a listener, within the process-wide budget.
    pub(super) fn listener_limit(&self, listener: String) -> Arc<ConnectionLimit> {
        let mut live = self.lock();
        let caps = live.defaults().connections;
        let limit = Arc::new(ConnectionLimit::new(
            listener,
            caps,
            self.inner.open.clone(),
            self.inner.budget,
        ));
        if listener_is_http(&limit) {
            live.http_limit = Some(limit.clone());
        }
        self.publish_listeners(&live);
        limit
    }

    /// Routes from hoist's config (at start, or reloaded) with the defaults
    /// they take. All or nothing: a listener that cannot be bound leaves
    /// every route as it was.
    pub fn apply_config(
        &self,
        config: Vec<RouteSpec>,
        defaults: RouteDefaults,
    ) -> Result<(), InterceptorError> {
        let mut live = self.lock();
        let declared = live.declared.clone();
        self.apply(&mut live, config, declared, defaults)
    }

    /// New limits for client connections accepted from now on.
    pub fn set_client_limits(&self, limits: ClientLimits) {
        self.inner.limits.store(Arc::new(limits));
    }

    /// Routes ScaledObjects declared (the scaler's table). A declared route
    /// that cannot be served here (its claim is a config route's, or its
    /// port cannot be bound) is left out, with the reason in
    /// [`RouteSet::skipped`]; the others are served.
    pub fn apply_declared(&self, declared: Vec<RouteSpec>) {
        let mut live = self.lock();
        let (config, defaults) = (live.config.clone(), live.defaults().clone());
        if let Err(error) = self.apply(&mut live, config, declared, defaults) {
            // Only config routes make an apply fail, and they were bound.
            warn!(%error, "route table not applied");
        }
    }

    /// Serves the routes `registry` holds (ScaledObjects' declarations),
    /// each change as it is made: the in-process setup.
    pub fn serve_declared(&self, registry: &crate::routing::Registry) {
        let control = self.clone();
        registry.serve_locally(Box::new(move |routes| {
            control.apply_declared(routes.to_vec());
            control.routes().current().skipped.clone()
        }));
    }

    /// At shutdown: stops every listener, answers held requests, and
    /// waits (up to the grace period) for TCP connections to finish.
    pub(super) async fn shut_down(&self) {
        self.inner.shutdown.cancel();
        {
            let live = self.lock();
            for upstream in live.upstreams.values() {
                upstream.close(Closing::ShuttingDown);
            }
        }
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.inner.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish_listeners(&self, live: &Live) {
        let listeners = live
            .http_limit
            .iter()
            .cloned()
            .chain(live.tcp.values().map(|tcp| tcp.limit.clone()))
            .collect();
        self.inner.routes.set_listeners(listeners);
    }

    fn apply(
        &self,
        live: &mut Live,
        config: Vec<RouteSpec>,
        declared: Vec<RouteSpec>,
        defaults: RouteDefaults,
    ) -> Result<(), InterceptorError> {
        let merged = merge(&config, &declared, &defaults);
        self.inner.fence.store(Arc::new(defaults.fence.clone()));
        let mut routes = merged.routes;
        let mut skipped = merged.skipped;

        // Bind what is new first: a config route that cannot listen
        // refuses the whole change before anything has moved.
        let mut bound_now: HashMap<ListenKey, std::net::TcpListener> = HashMap::new();
        let mut failed = Vec::new();
        for spec in &routes {
            let Some(listen) = spec.listen else { continue };
            let key = ListenKey::of(spec, listen, defaults.http_listen);
            let address = key.0;
            if live.tcp.contains_key(&key) || bound_now.contains_key(&key) {
                continue;
            }
            match bind_now(address) {
                Ok(listener) => {
                    bound_now.insert(key, listener);
                }
                Err(source) if spec.owner.is_none() => {
                    return Err(InterceptorError::Bind {
                        what: format!("TCP route `{}`", spec.name),
                        addr: address,
                        source,
                    });
                }
                Err(error) => {
                    skipped.insert(
                        spec.name.clone(),
                        format!("cannot listen on {address}: {error}"),
                    );
                    failed.push(spec.name.clone());
                }
            }
        }
        routes.retain(|spec| !failed.contains(&spec.name));

        let mut counters = HashMap::new();
        let mut upstreams = HashMap::new();
        let mut http = HashMap::new();
        let mut http_routes = Vec::new();
        let mut infos = BTreeMap::new();
        let mut tcp_targets: HashMap<ListenKey, Arc<Upstream>> = HashMap::new();
        for spec in routes {
            let route_counters = live
                .counters
                .get(&spec.name)
                .cloned()
                .unwrap_or_else(|| Arc::new(RouteCounters::new(self.inner.epoch)));
            let cold_start = spec
                .cold_start_timeout
                .unwrap_or(defaults.cold_start_timeout);
            // Declared routes are fenced; config-file routes (the
            // operator's own) are not.
            let fenced = spec.owner.is_some();
            let upstream = match live.upstreams.get(&spec.name) {
                Some(upstream)
                    if upstream.address == spec.upstream && upstream.fenced() == fenced =>
                {
                    upstream.set_limits(cold_start, defaults.max_held_per_route);
                    upstream.clone()
                }
                _ => {
                    let fence = fenced.then(|| self.inner.fence.clone());
                    Arc::new(
                        Upstream::new(
                            spec.name.clone(),
                            spec.upstream.clone(),
                            cold_start,
                            defaults.max_held_per_route,
                            route_counters.clone(),
                        )
                        .with_dialer(
                            Dialer::new(defaults.hosts.clone(), fence)
                                .with_pods(self.inner.routes.pods()),
                        ),
                    )
                }
            };
            let mut bound = None;
            match spec.protocol {
                Protocol::Http => {
                    let response_timeout =
                        spec.response_timeout.unwrap_or(defaults.response_timeout);
                    let reusable = live.http.get(&spec.name).filter(|route| {
                        Arc::ptr_eq(&route.upstream, &upstream)
                            && route.hosts == spec.hosts
                            && route.path_prefix == spec.path_prefix
                            && route.upstream_http2 == spec.upstream_http2
                            && route.response_timeout() == response_timeout
                    });
                    let route = match reusable {
                        Some(route) => route.clone(),
                        None => Arc::new(HttpRoute::new(
                            spec.name.clone(),
                            &spec.hosts,
                            spec.path_prefix.clone(),
                            upstream.clone(),
                            spec.upstream_http2,
                            response_timeout,
                        )),
                    };
                    http_routes.push(route.clone());
                    http.insert(spec.name.clone(), route);
                }
                Protocol::Tcp => {
                    if let Some(listen) = spec.listen {
                        let key = ListenKey::of(&spec, listen, defaults.http_listen);
                        bound = live
                            .tcp
                            .get(&key)
                            .map(|tcp| tcp.bound)
                            .or_else(|| bound_now.get(&key)?.local_addr().ok());
                        tcp_targets.insert(key, upstream.clone());
                    }
                }
            }
            counters.insert(spec.name.clone(), route_counters.clone());
            upstreams.insert(spec.name.clone(), upstream);
            infos.insert(
                spec.name.clone(),
                RouteInfo {
                    spec,
                    counters: route_counters,
                    bound,
                },
            );
        }

        // Everything is ready: switch.
        for (name, old) in &live.upstreams {
            match upstreams.get(name) {
                None => {
                    info!(route = %name, "route removed");
                    old.close(Closing::Removed);
                }
                Some(new) if !Arc::ptr_eq(new, old) => {
                    info!(route = %name, upstream = %new.address, "route's upstream changed");
                    old.close(Closing::Moved);
                }
                Some(_) => {}
            }
        }
        // Logged as removals are: what a reload (or a declaration) added.
        for (name, new) in &upstreams {
            if !live.upstreams.contains_key(name) {
                info!(route = %name, upstream = %new.address, "route added");
            }
        }
        live.tcp.retain(|key, listening| {
            let keep = tcp_targets.contains_key(key);
            if !keep {
                info!(listen = %listening.bound, "TCP route listener closed");
                listening.stop.cancel();
            }
            keep
        });
        for (key, upstream) in &tcp_targets {
            if let Some(listening) = live.tcp.get(key) {
                listening.target.store(upstream.clone());
                listening.limit.set_caps(defaults.connections);
            }
        }
        for (key, listener) in bound_now {
            let Some(upstream) = tcp_targets.get(&key) else {
                continue;
            };
            if let Some(listening) = self.serve_tcp(key.0, listener, upstream.clone(), &defaults) {
                info!(route = %upstream.route, listen = %listening.bound, "TCP route listener opened");
                live.tcp.insert(key, listening);
            }
        }
        if let Some(limit) = &live.http_limit {
            limit.set_caps(defaults.connections);
        }
        self.inner.routes.replace(RouteSet {
            routes: infos,
            http: HttpRouter::new(http_routes),
            skipped,
        });
        live.counters = counters;
        live.upstreams = upstreams;
        live.http = http;
        live.config = config;
        live.declared = declared;
        live.defaults = Some(defaults);
        self.publish_listeners(live);
        Ok(())
    }

    fn serve_tcp(
        &self,
        address: SocketAddr,
        listener: std::net::TcpListener,
        upstream: Arc<Upstream>,
        defaults: &RouteDefaults,
    ) -> Option<TcpListening> {
        let bound = listener.local_addr().ok()?;
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                warn!(%address, %error, "cannot serve a TCP route's listener");
                return None;
            }
        };
        let limit = Arc::new(ConnectionLimit::new(
            format!("tcp:{}", upstream.route),
            defaults.connections,
            self.inner.open.clone(),
            self.inner.budget,
        ));
        let target = Arc::new(ArcSwap::new(upstream));
        let stop = self.inner.shutdown.child_token();
        self.inner.tasks.spawn(tcp::serve(
            listener,
            target.clone(),
            limit.clone(),
            stop.clone(),
            self.inner.shutdown.clone(),
            self.inner.grace,
        ));
        Some(TcpListening {
            bound,
            target,
            stop,
            limit,
        })
    }
}

impl Live {
    fn defaults(&self) -> &RouteDefaults {
        self.defaults
            .as_ref()
            .expect("a route control is made with defaults")
    }
}

fn listener_is_http(limit: &ConnectionLimit) -> bool {
    limit.listener == "http"
}

/// Config routes first; a declared route whose claim a config route (or
/// an earlier declared route) holds, or that would take the HTTP proxy's
/// own port, is left out.
fn merge(config: &[RouteSpec], declared: &[RouteSpec], defaults: &RouteDefaults) -> Merged {
    let mut claims: HashMap<Claim, String> = HashMap::new();
    claims.insert(
        Claim::Tcp {
            port: defaults.http_listen.port(),
        },
        "the interceptor's HTTP proxy (interceptor.http_listen)".to_string(),
    );
    let mut routes = Vec::new();
    let mut skipped = BTreeMap::new();
    for spec in config {
        for claim in spec.exclusive_claims() {
            claims.insert(claim, spec.origin());
        }
        routes.push(spec.clone());
    }
    for spec in declared {
        let clash = spec
            .exclusive_claims()
            .into_iter()
            .find_map(|claim| claims.get(&claim).map(|holder| (claim, holder.clone())));
        if let Some((claim, holder)) = clash {
            skipped.insert(spec.name.clone(), format!("{claim} is taken by {holder}"));
            continue;
        }
        for claim in spec.exclusive_claims() {
            claims.insert(claim, spec.origin());
        }
        routes.push(spec.clone());
    }
    Merged { routes, skipped }
}

fn bind_now(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    // std's bind sets SO_REUSEADDR on Unix, as tokio's does.
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}
