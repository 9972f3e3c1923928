//! `[interceptor]`: its listeners, deadlines and caps, its config routes,
//! and the rules for routes ScaledObjects declare.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::networks::{self, OWN_ADDRESSES, parse_network};
use super::{
    ClientTlsSettings, ConfigError, HostOverrides, HostPattern, SourcePattern, host_port,
    not_host_port,
};

/// The interceptor: its routes (run by `hoist interceptor`, and by `hoist
/// serve` when `endpoints` is empty), or where a scaler finds interceptors
/// that run as their own Deployment (`endpoints`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InterceptorSettings {
    /// Run the proxies in `hoist serve` even with no route in this file,
    /// for routes ScaledObjects declare (on by itself when routes are
    /// configured and `endpoints` is empty).
    pub enabled: bool,
    /// The HTTP proxy's listener; a declared TCP route listens on this
    /// address's IP with its own `listenPort`.
    pub http_listen: SocketAddr,
    /// How long a request waits for an upstream at zero to accept a
    /// connection before it gets a 504 (a TCP connection is closed).
    #[serde(with = "humantime_serde")]
    pub cold_start_timeout: Duration,
    /// How long an HTTP request waits for the app's response headers once
    /// the app has it (not counting a cold start), before it gets a 504.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Requests (connections) held per route at most; more get a 503.
    pub max_held_per_route: usize,
    /// A client connection that sends no byte for this long after it is
    /// accepted is closed.
    #[serde(with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// A client connection with no request open is closed when no request
    /// has started for this long (since it opened or its last request
    /// ended): idle keep-alive, a silent HTTP/2 preface or SETTINGS.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A client connection whose writes wait this long for it to read
    /// (no byte taken) is closed, its requests' places given back.
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// Most bytes of request headers (HTTP/1.1: the whole head; HTTP/2:
    /// the header list); more get a 431.
    pub max_header_bytes: usize,
    /// Open client connections per listener at most; more are refused as
    /// they are accepted (HTTP: 503; counted).
    pub max_connections: usize,
    /// Open client connections one address may hold per listener; unset:
    /// half of what the listener can hold, so that one client never takes
    /// every place.
    pub max_connections_per_client: Option<usize>,
    /// HTTP/2 streams one client connection may have open at once.
    pub http2_max_concurrent_streams: u32,
    /// How often an HTTP/2 client connection is pinged; one that does not
    /// answer within `http2_keepalive_timeout` is closed.
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_timeout: Duration,
    /// Split setup, scaler side: `host:port` of the interceptors' admin
    /// ports. A headless Service name resolves to every replica.
    pub endpoints: Vec<String>,
    /// Bound on reading one interceptor replica's counters.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    pub http_routes: Vec<HttpRouteSettings>,
    pub tcp_routes: Vec<TcpRouteSettings>,
    /// Whether ScaledObjects may declare routes in `http`/`tcp` trigger
    /// metadata (`upstream`, `host`, `listenPort`).
    pub declared_routes: bool,
    /// `host:port` patterns (`*` any run of characters; `{namespace}` the
    /// ScaledObject's namespace) a declared route's upstream must match.
    /// Empty: the ScaledObject's own namespace's Services only
    /// (`*.{namespace}.svc.<cluster_domain>:*`).
    pub allowed_upstreams: Vec<String>,
    /// Host patterns a declared HTTP route may serve, by namespace (`*`:
    /// every namespace; `{namespace}` in a pattern is the ScaledObject's).
    /// A namespace with no pattern (here or under `*`) may declare no HTTP
    /// route: hosts are the platform team's to hand out.
    pub allowed_hosts: BTreeMap<String, Vec<String>>,
    /// Ports (`8000` or `8000-8099`) a declared TCP route may listen on,
    /// by namespace (`*`: every namespace). Empty: any port from 1024
    /// that hoist does not use itself.
    pub allowed_listen_ports: BTreeMap<String, Vec<String>>,
    /// Routes the ScaledObjects of one namespace may declare at most.
    pub max_routes_per_namespace: usize,
    /// TCP listeners (declared `tcp` routes) one namespace may open at
    /// most.
    pub max_listen_ports_per_namespace: usize,
    /// The cluster's DNS domain, which completes a declared `upstream`
    /// (`web:80` is `web.<namespace>.svc.<cluster_domain>:80`).
    pub cluster_domain: String,
    /// Split setup, interceptor side: `host:port` of the scaler's admin
    /// port, whose route table (routes ScaledObjects declare) this
    /// interceptor follows.
    pub scaler: Option<String>,
    /// TLS for the scaler↔interceptor channel (used by the scaler reading
    /// interceptors, and by interceptors reading the scaler): the other
    /// side's admin port must then serve TLS (`admin.tls`).
    pub tls: Option<ClientTlsSettings>,
    /// Networks (CIDRs, or single addresses) a declared route's upstream
    /// may not connect to, checked at every new upstream connection;
    /// `self` stands for hoist's own addresses. Config-file routes are
    /// exempt. Default: loopback, link-local, unspecified, `self`.
    pub denied_networks: Vec<String>,
    /// Peers (CIDRs) whose `X-Forwarded-*`, `Forwarded` and `X-Real-IP`
    /// headers are kept (appended to); anyone else's are replaced.
    pub trusted_proxies: Vec<String>,
    /// Let `%2F` and `%5C` (an encoded `/` or `\`) through in request
    /// paths; by default such a request gets a 400.
    pub allow_encoded_slashes: bool,
    /// Dial an upstream that names a Service
    /// (`name.namespace.svc[.<cluster_domain>]`) at its ready pods, as
    /// the Service's EndpointSlices show them, instead of at the
    /// Service's address: a held request reaches a pod as soon as it is
    /// Ready, not when kube-proxy next syncs. Needs Kubernetes access and
    /// list/watch on services and discovery.k8s.io endpointslices.
    pub direct_to_pods: bool,
    /// Names resolved without the system's resolver (code only: tests).
    /// A reload reads no code: routes built after one resolve through
    /// the system again.
    #[serde(skip)]
    pub host_overrides: HostOverrides,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRouteSettings {
    /// What `route:` in a ScaledObject names.
    pub name: String,
    /// Requests whose `Host` (or HTTP/2 authority) is this host, any port.
    pub host: String,
    /// Only requests whose path is this prefix or under it (whole segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// `host:port` the requests go to.
    pub upstream: String,
    /// Speak HTTP/2 without TLS (h2c) to the upstream, e.g. for gRPC apps.
    #[serde(default)]
    pub upstream_http2: bool,
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub cold_start_timeout: Option<Duration>,
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub response_timeout: Option<Duration>,
    /// The `concurrentRequests` of `http` triggers that name this route
    /// and set none themselves. A reload that changes it re-targets them:
    /// KEDA 2.21 hears it on `StreamMetricSpec` and updates the HPA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_requests: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpRouteSettings {
    pub name: String,
    pub listen: SocketAddr,
    pub upstream: String,
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub cold_start_timeout: Option<Duration>,
    /// The `concurrentConnections` of `tcp` triggers that name this route
    /// and set none themselves (see `HttpRouteSettings::concurrent_requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_connections: Option<f64>,
}

impl Default for InterceptorSettings {
    fn default() -> Self {
        Self {
            http_listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            cold_start_timeout: Duration::from_secs(60),
            // Azure Container Apps' ingress gives an app 240 s to answer.
            response_timeout: Duration::from_secs(240),
            max_held_per_route: 1000,
            first_byte_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            // nginx's send_timeout.
            send_timeout: Duration::from_secs(60),
            max_header_bytes: 64 * 1024,
            max_connections: 10_000,
            max_connections_per_client: None,
            http2_max_concurrent_streams: 250,
            http2_keepalive_interval: Duration::from_secs(20),
            http2_keepalive_timeout: Duration::from_secs(20),
            endpoints: Vec::new(),
            read_timeout: Duration::from_secs(1),
            http_routes: Vec::new(),
            tcp_routes: Vec::new(),
            enabled: false,
            declared_routes: true,
            allowed_upstreams: Vec::new(),
            allowed_hosts: BTreeMap::new(),
            allowed_listen_ports: BTreeMap::new(),
            max_routes_per_namespace: 50,
            max_listen_ports_per_namespace: 10,
            cluster_domain: "cluster.local".to_string(),
            scaler: None,
            tls: None,
            denied_networks: networks::default_denied_networks(),
            trusted_proxies: Vec::new(),
            allow_encoded_slashes: false,
            direct_to_pods: false,
            host_overrides: HostOverrides::default(),
        }
    }
}

pub(super) const TIMEOUT_RANGE: &str = "must be more than zero and at most one hour";

/// The range of the interceptor's per-request timeouts.
pub(super) fn in_range(timeout: Duration) -> bool {
    !timeout.is_zero() && timeout <= Duration::from_secs(3600)
}

impl InterceptorSettings {
    /// The scale target each config route sets for the triggers naming
    /// it, by route name (names are unique across both lists).
    pub fn route_targets(&self) -> std::collections::BTreeMap<String, f64> {
        let http = self
            .http_routes
            .iter()
            .filter_map(|r| Some((r.name.clone(), r.concurrent_requests?)));
        let tcp = self
            .tcp_routes
            .iter()
            .filter_map(|r| Some((r.name.clone(), r.concurrent_connections?)));
        http.chain(tcp).collect()
    }

    /// Whether this process has routes to proxy.
    pub fn has_routes(&self) -> bool {
        !self.http_routes.is_empty() || !self.tcp_routes.is_empty()
    }

    /// Whether `hoist serve` runs the proxies itself (else it reads remote
    /// interceptors, or has no `http`/`tcp` triggers at all).
    pub fn in_process(&self) -> bool {
        self.endpoints.is_empty() && (self.enabled || self.has_routes())
    }

    /// The ports a declared TCP route may listen on in `namespace`:
    /// `None` when any port from 1024 is allowed.
    pub fn listen_ports_for(&self, namespace: &str) -> Option<Vec<(u16, u16)>> {
        if self.allowed_listen_ports.is_empty() {
            return None;
        }
        let ranges = [namespace, "*"]
            .iter()
            .filter_map(|key| self.allowed_listen_ports.get(*key))
            .flatten()
            .filter_map(|range| port_range(range).ok())
            .collect();
        Some(ranges)
    }

    /// The host patterns a declared HTTP route may serve in `namespace`
    /// (none: it may serve no host).
    pub fn host_patterns_for(&self, namespace: &str) -> Vec<HostPattern> {
        [namespace, "*"]
            .iter()
            .filter_map(|key| self.allowed_hosts.get(*key))
            .flatten()
            .filter_map(|pattern| HostPattern::new(&pattern.replace("{namespace}", namespace)).ok())
            .collect()
    }

    /// The upstream patterns for routes `namespace` declares.
    pub fn upstream_patterns_for(&self, namespace: &str) -> Vec<SourcePattern> {
        let own = [format!("*.{{namespace}}.svc.{}:*", self.cluster_domain)];
        let texts = if self.allowed_upstreams.is_empty() {
            &own[..]
        } else {
            &self.allowed_upstreams[..]
        };
        texts
            .iter()
            .filter_map(|text| SourcePattern::new(&text.replace("{namespace}", namespace)).ok())
            .collect()
    }

    fn validate_declared_route_rules(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| ConfigError::Invalid {
            key: key.to_string(),
            reason,
        };
        for pattern in &self.allowed_upstreams {
            SourcePattern::new(&pattern.replace("{namespace}", "namespace"))
                .map_err(|reason| invalid("interceptor.allowed_upstreams", reason))?;
        }
        for (namespace, patterns) in &self.allowed_hosts {
            for pattern in patterns {
                HostPattern::new(&pattern.replace("{namespace}", "namespace")).map_err(
                    |reason| invalid(&format!("interceptor.allowed_hosts.{namespace}"), reason),
                )?;
            }
        }
        for (namespace, ranges) in &self.allowed_listen_ports {
            for range in ranges {
                port_range(range).map_err(|reason| {
                    invalid(
                        &format!("interceptor.allowed_listen_ports.{namespace}"),
                        reason,
                    )
                })?;
            }
        }
        let domain_ok = !self.cluster_domain.is_empty()
            && http::uri::Authority::try_from(self.cluster_domain.as_str()).is_ok()
            && !self.cluster_domain.contains([':', '/', '@', ' ']);
        if !domain_ok {
            return Err(invalid(
                "interceptor.cluster_domain",
                format!("`{}` is not a DNS domain", self.cluster_domain),
            ));
        }
        for entry in &self.denied_networks {
            if entry != OWN_ADDRESSES {
                parse_network(entry).map_err(|reason| {
                    invalid(
                        "interceptor.denied_networks",
                        format!("{reason}, or `{OWN_ADDRESSES}` (hoist's own addresses)"),
                    )
                })?;
            }
        }
        for entry in &self.trusted_proxies {
            parse_network(entry)
                .map_err(|reason| invalid("interceptor.trusted_proxies", reason))?;
        }
        if let Some(scaler) = &self.scaler
            && !host_port(scaler)
        {
            return Err(invalid(
                "interceptor.scaler",
                format!("{} (the scaler's admin port)", not_host_port(scaler)),
            ));
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        validate_channel_tls(self.tls.as_ref())?;
        let invalid = |key: String, reason: String| ConfigError::Invalid { key, reason };
        self.validate_declared_route_rules()?;
        if self.read_timeout > Duration::from_secs(60) {
            return Err(invalid(
                "interceptor.read_timeout".into(),
                "must be at most one minute".into(),
            ));
        }
        if self.read_timeout.is_zero() {
            return Err(invalid(
                "interceptor.read_timeout".into(),
                "must be more than zero".into(),
            ));
        }
        let at_least_one = [
            ("interceptor.max_held_per_route", self.max_held_per_route),
            ("interceptor.max_connections", self.max_connections),
            (
                "interceptor.max_connections_per_client",
                self.max_connections_per_client.unwrap_or(1),
            ),
            (
                "interceptor.http2_max_concurrent_streams",
                self.http2_max_concurrent_streams as usize,
            ),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(invalid(key.into(), "must be at least 1".into()));
            }
        }
        let timeouts = [
            ("interceptor.cold_start_timeout", self.cold_start_timeout),
            ("interceptor.response_timeout", self.response_timeout),
            ("interceptor.first_byte_timeout", self.first_byte_timeout),
            ("interceptor.idle_timeout", self.idle_timeout),
            ("interceptor.send_timeout", self.send_timeout),
            (
                "interceptor.http2_keepalive_interval",
                self.http2_keepalive_interval,
            ),
            (
                "interceptor.http2_keepalive_timeout",
                self.http2_keepalive_timeout,
            ),
        ];
        for (key, timeout) in timeouts {
            if !in_range(timeout) {
                return Err(invalid(key.into(), TIMEOUT_RANGE.into()));
            }
        }
        // hyper's HTTP/1.1 read buffer has a floor of 8 KiB; HTTP/2's
        // header list size is a u32.
        if !(8192..=16 * 1024 * 1024).contains(&self.max_header_bytes) {
            return Err(invalid(
                "interceptor.max_header_bytes".into(),
                "must be between 8192 and 16777216".into(),
            ));
        }
        for endpoint in &self.endpoints {
            if !host_port(endpoint) {
                return Err(invalid(
                    "interceptor.endpoints".into(),
                    format!("{} (an interceptor's admin port)", not_host_port(endpoint)),
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        let mut listens = std::collections::BTreeSet::new();
        let routes = self
            .http_routes
            .iter()
            .map(|r| {
                let target = ("concurrent_requests", r.concurrent_requests);
                (
                    "http_routes",
                    &r.name,
                    &r.upstream,
                    r.cold_start_timeout,
                    target,
                )
            })
            .chain(self.tcp_routes.iter().map(|r| {
                let target = ("concurrent_connections", r.concurrent_connections);
                (
                    "tcp_routes",
                    &r.name,
                    &r.upstream,
                    r.cold_start_timeout,
                    target,
                )
            }));
        for (list, name, upstream, cold_start, (target_key, target)) in routes {
            let key = |field: &str| format!("interceptor.{list}[{name}].{field}");
            let name_ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !name_ok {
                return Err(invalid(
                    format!("interceptor.{list}.name"),
                    format!("`{name}` must be letters, digits, `-`, `_` or `.`"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(invalid(key("name"), "another route has this name".into()));
            }
            if !host_port(upstream) {
                return Err(invalid(key("upstream"), not_host_port(upstream)));
            }
            if cold_start.is_some_and(|timeout| !in_range(timeout)) {
                return Err(invalid(key("cold_start_timeout"), TIMEOUT_RANGE.into()));
            }
            if target.is_some_and(|target| !(target >= 1.0 && target.is_finite())) {
                return Err(invalid(
                    key(target_key),
                    "must be a number of at least 1".into(),
                ));
            }
        }
        let mut hosts = std::collections::BTreeSet::new();
        for route in &self.http_routes {
            let key = |field: &str| format!("interceptor.http_routes[{}].{field}", route.name);
            if route
                .response_timeout
                .is_some_and(|timeout| !in_range(timeout))
            {
                return Err(invalid(key("response_timeout"), TIMEOUT_RANGE.into()));
            }
            let authority = http::uri::Authority::try_from(route.host.as_str());
            if route.host.contains(['/', ' ', ':', '@']) || authority.is_err() {
                return Err(invalid(
                    key("host"),
                    format!(
                        "`{}` is not a host name (no port, scheme or path)",
                        route.host
                    ),
                ));
            }
            if let Some(prefix) = &route.path_prefix
                && !prefix.starts_with('/')
            {
                return Err(invalid(
                    key("path_prefix"),
                    format!("`{prefix}` must start with `/`"),
                ));
            }
            let prefix = route
                .path_prefix
                .as_deref()
                .unwrap_or("/")
                .trim_end_matches('/');
            if !hosts.insert((route.host.to_ascii_lowercase(), prefix.to_string())) {
                return Err(invalid(
                    key("host"),
                    "another route serves the same host and path prefix".into(),
                ));
            }
        }
        // The HTTP proxy listens whenever the interceptor runs.
        listens.insert(self.http_listen);
        for route in &self.tcp_routes {
            if route.listen.port() != 0 && !listens.insert(route.listen) {
                return Err(invalid(
                    format!("interceptor.tcp_routes[{}].listen", route.name),
                    format!("{} is already used by another route", route.listen),
                ));
            }
        }
        Ok(())
    }
}

/// `8000` or `8000-8099`, from 1 to 65535.
pub fn port_range(text: &str) -> Result<(u16, u16), String> {
    let bad = || format!("`{text}` is not a port or a range of ports (`8000-8099`)");
    let (low, high) = text.split_once('-').unwrap_or((text, text));
    let low: u16 = low.trim().parse().map_err(|_| bad())?;
    let high: u16 = high.trim().parse().map_err(|_| bad())?;
    if low == 0 || low > high {
        return Err(bad());
    }
    Ok((low, high))
}

/// `[interceptor.tls]`, as far as it can be checked without the files.
fn validate_channel_tls(tls: Option<&ClientTlsSettings>) -> Result<(), ConfigError> {
    match tls {
        Some(tls) => tls.validate().map_err(|error| ConfigError::Invalid {
            key: format!("interceptor.tls.{}", error.field),
            reason: error.reason,
        }),
        None => Ok(()),
    }
}
