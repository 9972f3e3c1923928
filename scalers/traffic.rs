//! `http` and `tcp`: Azure Container Apps' HTTP and TCP scale rules,
//! measured by hoist's own interceptor (see `src/interceptor/`).
//!
//! - `http`: `route` (or `host`), `concurrentRequests` (target per replica,
//!   default 10), `metric`: `requestRate` (default; requests of the past
//!   15 s ÷ 15, as ACA) or `concurrency` (requests in flight, averaged over
//!   15 s), `activationConcurrentRequests` (default 0).
//! - `tcp`: `route`, `concurrentConnections` (default 10), `metric`:
//!   `connectionRate` (default) or `concurrency`,
//!   `activationConcurrentConnections` (default 0).
//!
//! With `upstream`, the trigger declares its own route instead of naming
//! one of hoist's config: `http` takes `host` (a comma-separated list),
//! `pathPrefix`, `upstreamHTTP2`, `coldStartTimeout`, `responseTimeout`;
//! `tcp` takes `listenPort` and `coldStartTimeout`. `upstream` is
//! `service:port` (the ScaledObject's namespace), `service.namespace:port`
//! or a full `host:port`.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;

use super::{Context, Kind, Measurement, ObserveError, Query, Source, Trigger, metric_name};
use http::uri::Authority;

use crate::interceptor::Protocol;
use crate::interceptor::traffic::{RouteSelector, Traffic};
use crate::metadata::{Absent, Key, MetadataError, Origin, Params};
use crate::routing::{Listen, RouteSpec};

pub static KIND: Kind = Kind {
    scalers: &["http", "tcp"],
    keys: KEYS,
    parse,
};

/// What a trigger naming a config route targets when it sets no target.
const ROUTE_TARGET: &str =
    "the config route's `concurrent_requests` / `concurrent_connections`, else `10`";

/// The keys of ACA's HTTP and TCP rules, and of a declared route.
pub const KEYS: &[Key] = &[
    Key::optional("route", Absent::None),
    Key::optional("host", Absent::None),
    Key::optional("concurrentRequests", Described(ROUTE_TARGET)),
    Key::optional("concurrentConnections", Described(ROUTE_TARGET)),
    Key::optional("activationConcurrentRequests", Value("0")),
    Key::optional("activationConcurrentConnections", Value("0")),
    Key::optional("metric", Described("`requestRate` / `connectionRate`")),
    Key::optional("upstream", Absent::None),
    Key::optional("pathPrefix", Described("the whole host")),
    Key::optional("upstreamHTTP2", Value("false")),
    Key::optional("coldStartTimeout", Described("`interceptor.cold_start_timeout`")),
    Key::optional("responseTimeout", Described("`interceptor.response_timeout`")),
    Key::optional("listenPort", Absent::None),
];

/// ACA evaluates HTTP and TCP rules every 15 s, the length of their window.
pub const DEFAULT_POLLING_INTERVAL: Duration = Duration::from_secs(15);
const DEFAULT_TARGET: f64 = 10.0;
const METADATA: &[Origin] = &[Origin::Metadata];
use Absent::{Described, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// Started per second over the window.
    Rate,
    /// In flight, averaged over the window.
    Concurrency,
}

struct Keys {
    target: &'static str,
    activation: &'static str,
    rate: &'static str,
}

fn keys(protocol: Protocol) -> Keys {
    match protocol {
        Protocol::Http => Keys {
            target: "concurrentRequests",
            activation: "activationConcurrentRequests",
            rate: "requestRate",
        },
        Protocol::Tcp => Keys {
            target: "concurrentConnections",
            activation: "activationConcurrentConnections",
            rate: "connectionRate",
        },
    }
}

fn parse(scaler: &'static str, params: &Params, context: &Context) -> Result<Trigger, MetadataError> {
    let params = &params.declaring(KEYS);
    let protocol = if scaler == "tcp" { Protocol::Tcp } else { Protocol::Http };
    let keys = keys(protocol);
    let declared = declared_route(protocol, params, context)?;
    let route = match &declared {
        Some(spec) => RouteSelector::Name(spec.name.clone()),
        None => selected_route(protocol, params)?,
    };
    // A config route may set the target of the triggers naming it; the
    // trigger's own key still wins.
    let route_target = match (&declared, &route) {
        (None, RouteSelector::Name(name)) => context.route_targets.get(name).copied(),
        _ => None,
    };
    let default_target = route_target.unwrap_or(DEFAULT_TARGET);
    let target = params.number::<f64>(&[keys.target], METADATA, default_target)?;
    if !(target >= 1.0 && target.is_finite()) {
        return Err(MetadataError::invalid(keys.target, "must be a number of at least 1"));
    }
    let activation = params.number::<f64>(&[keys.activation], METADATA, 0.0)?;
    if !(activation >= 0.0 && activation.is_finite()) {
        return Err(MetadataError::invalid(keys.activation, "must be a number of at least 0"));
    }
    let measure = match params.string(&["metric"], METADATA).as_deref() {
        None => Measure::Rate,
        Some(name) if name == keys.rate => Measure::Rate,
        Some("concurrency") => Measure::Concurrency,
        Some(other) => {
            return Err(MetadataError::invalid(
                "metric",
                format!("`{other}` is not `{}` or `concurrency`", keys.rate),
            ));
        }
    };
    let Some(traffic) = context.traffic.clone() else {
        return Err(MetadataError::invalid(
            "scaler",
            format!(
                "`{scaler}` triggers measure traffic through hoist's interceptor, and this hoist has none: configure [[interceptor.{scaler}_routes]] (in-process) or interceptor.endpoints (interceptors in their own Deployment)"
            ),
        ));
    };
    let selector_key = match route {
        RouteSelector::Name(_) => "route",
        RouteSelector::Host(_) => "host",
    };
    // A declared route is made when the trigger is tracked, after this.
    if declared.is_none() {
        traffic
            .check(protocol, &route)
            .map_err(|reason| MetadataError::invalid(selector_key, reason))?;
    }
    let label = match &route {
        RouteSelector::Name(name) | RouteSelector::Host(name) => name.clone(),
    };
    let metric = match measure {
        Measure::Rate => keys.rate,
        Measure::Concurrency => "concurrency",
    };
    Ok(Trigger {
        scaler,
        metric_name: metric_name(&format!("{scaler}-{label}")),
        target,
        target_key: keys.target,
        activation_target: activation,
        polling_interval: Some(DEFAULT_POLLING_INTERVAL),
        query: Query {
            key: format!("{scaler}|{route:?}|{metric}").into(),
            description: format!("{scaler} {route} ({metric})").into(),
            // hoist's own interceptor: nothing a ScaledObject points at.
            endpoints: Vec::new(),
            source: Arc::new(TrafficSource {
                traffic,
                protocol,
                route,
                measure,
                activation,
            }),
        },
        route: declared.map(Box::new),
    })
}

/// The route a trigger without `upstream` measures: one of hoist's config
/// (`route`), or the HTTP route serving `host`.
fn selected_route(protocol: Protocol, params: &Params) -> Result<RouteSelector, MetadataError> {
    for key in ROUTE_KEYS {
        if params.find(&[key], METADATA).is_some() {
            return Err(MetadataError::invalid(
                key,
                "declares a route, which needs `upstream` (where the traffic goes)",
            ));
        }
    }
    match (
        params.string(&["route"], METADATA),
        params.string(&["host"], METADATA),
    ) {
        (Some(_), Some(_)) => Err(MetadataError::invalid("host", "set `route` or `host`, not both")),
        (Some(name), None) if !name.trim().is_empty() => Ok(RouteSelector::Name(name.trim().to_string())),
        (None, Some(host)) if protocol == Protocol::Http && !host.trim().is_empty() => {
            Ok(RouteSelector::Host(host.trim().to_ascii_lowercase()))
        }
        (None, Some(_)) => Err(MetadataError::invalid("host", "`tcp` triggers select their route by `route`")),
        _ => {
            let also = if protocol == Protocol::Http { " (or `host`)" } else { "" };
            Err(MetadataError::missing(
                "route",
                format!("name the interceptor route to measure{also}, or declare one with `upstream`"),
            ))
        }
    }
}

/// Keys that only a declared route takes.
const ROUTE_KEYS: [&str; 5] = [
    "pathPrefix",
    "listenPort",
    "upstreamHTTP2",
    "coldStartTimeout",
    "responseTimeout",
];

/// The route an `http` or `tcp` trigger's metadata declares, if any, as
/// the trigger would declare it (for routes read from the cluster's
/// ScaledObjects rather than from KEDA's calls).
pub fn route_declared_by(
    scaler: &str,
    params: &Params,
    context: &Context,
) -> Result<Option<RouteSpec>, MetadataError> {
    let params = &params.declaring(KEYS);
    match scaler {
        "http" => declared_route(Protocol::Http, params, context),
        "tcp" => declared_route(Protocol::Tcp, params, context),
        _ => Ok(None),
    }
}

/// The route the metadata declares, when it has `upstream`.
fn declared_route(
    protocol: Protocol,
    params: &Params,
    context: &Context,
) -> Result<Option<RouteSpec>, MetadataError> {
    let Some(upstream) = params.string(&["upstream"], METADATA) else {
        return Ok(None);
    };
    let Some(owner) = context.owner.clone() else {
        return Err(MetadataError::invalid(
            "upstream",
            "a route is declared by a ScaledObject, and this trigger has none",
        ));
    };
    if params.find(&["route"], METADATA).is_some() {
        return Err(MetadataError::invalid(
            "route",
            "a trigger with `upstream` declares its own route (named after its ScaledObject): remove `route`",
        ));
    }
    let allowed: &[&str] = match protocol {
        Protocol::Http => &["pathPrefix", "upstreamHTTP2", "coldStartTimeout", "responseTimeout"],
        Protocol::Tcp => &["listenPort", "coldStartTimeout"],
    };
    if let Some(key) = ROUTE_KEYS
        .iter()
        .find(|key| !allowed.contains(key) && params.find(&[**key], METADATA).is_some())
    {
        return Err(MetadataError::invalid(
            *key,
            format!("`{protocol}` routes do not take `{key}`"),
        ));
    }
    let upstream = qualified_upstream(upstream.trim(), &owner.namespace, &context.cluster_domain)
        .map_err(|reason| MetadataError::invalid("upstream", reason))?;
    let mut spec = RouteSpec {
        name: RouteSpec::declared_name(protocol, &owner),
        protocol,
        owner: Some(owner),
        hosts: Vec::new(),
        path_prefix: None,
        listen: None,
        upstream,
        upstream_http2: false,
        cold_start_timeout: duration(params, "coldStartTimeout")?,
        response_timeout: None,
    };
    match protocol {
        Protocol::Http => {
            let (_, hosts) = params.list(&["host"], METADATA).ok_or_else(|| {
                MetadataError::missing("host", "the host (or comma-separated hosts) the route serves")
            })?;
            for host in hosts {
                // `Shop.example.com.` and `shop.example.com` are one host:
                // folded, so neither is a claim of its own.
                let host = host.to_ascii_lowercase().trim_end_matches('.').to_string();
                if host.is_empty() || host.contains(['/', ' ', ':', '@', '*']) || Authority::try_from(host.as_str()).is_err() {
                    return Err(MetadataError::invalid(
                        "host",
                        format!("`{host}` is not a host name (no port, scheme, path or wildcard)"),
                    ));
                }
                if !spec.hosts.contains(&host) {
                    spec.hosts.push(host);
                }
            }
            if let Some(prefix) = params.string(&["pathPrefix"], METADATA) {
                if !prefix.starts_with('/') || prefix.contains(['?', '#', ' ']) {
                    return Err(MetadataError::invalid("pathPrefix", format!("`{prefix}` must be a path starting with `/`")));
                }
                spec.path_prefix = Some(prefix);
            }
            spec.upstream_http2 = params.boolean(&["upstreamHTTP2"], METADATA, false)?;
            spec.response_timeout = duration(params, "responseTimeout")?;
        }
        Protocol::Tcp => {
            let port = params.required(&["listenPort"], METADATA, "the port the route listens on")?;
            let port = port
                .value
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|port| *port != 0)
                .ok_or_else(|| MetadataError::invalid("listenPort", format!("`{}` is not a port (1 to 65535)", port.value)))?;
            spec.listen = Some(Listen::Port(port));
        }
    }
    Ok(Some(spec))
}

/// A declared `upstream` in full: `service:port` is a Service of the
/// ScaledObject's namespace, `service.namespace:port` one of another
/// namespace; a longer name is taken as written.
fn qualified_upstream(upstream: &str, namespace: &str, cluster_domain: &str) -> Result<String, String> {
    let bad = || format!("`{upstream}` is not `service:port`, `service.namespace:port` or `host:port`");
    if !crate::config::plain_address(upstream) {
        return Err(crate::config::NOT_PLAIN_ADDRESS.to_string());
    }
    let (host, port) = upstream.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().ok().filter(|port| *port != 0).is_none() || host.contains(['/', '@', ' ']) {
        return Err(bad());
    }
    let host = host.to_ascii_lowercase();
    let full = match host.split('.').count() {
        1 => format!("{host}.{namespace}.svc.{cluster_domain}"),
        2 => format!("{host}.svc.{cluster_domain}"),
        _ => host,
    };
    Ok(format!("{full}:{port}"))
}

/// A timeout key: `90s`, `2m`, or a number of seconds; more than zero and
/// at most an hour, as the config's.
fn duration(params: &Params, key: &str) -> Result<Option<Duration>, MetadataError> {
    let Some(text) = params.string(&[key], METADATA) else {
        return Ok(None);
    };
    let text = text.trim();
    let parsed = match text.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => humantime::parse_duration(text).ok(),
    };
    match parsed {
        Some(timeout) if !timeout.is_zero() && timeout <= Duration::from_secs(3600) => Ok(Some(timeout)),
        _ => Err(MetadataError::invalid(key, format!("`{text}` is not a duration from 1s to 1h (`90s`, `2m`)"))),
    }
}

struct TrafficSource {
    traffic: Traffic,
    protocol: Protocol,
    route: RouteSelector,
    measure: Measure,
    activation: f64,
}

impl Source for TrafficSource {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        Box::pin(async move {
            let load = self.traffic.load(self.protocol, &self.route).await?;
            let value = match self.measure {
                Measure::Rate => load.rate,
                Measure::Concurrency => load.concurrency,
            };
            // A request held for an app at zero can only be served once the
            // app starts: it activates whatever the activation threshold.
            let activity = if load.held > 0 {
                value.max(self.activation + 1.0)
            } else {
                value
            };
            Ok(Measurement { value, activity })
        })
    }

    fn wakeups(&self) -> Option<watch::Receiver<u64>> {
        self.traffic.wakeups(&self.route)
    }
}
