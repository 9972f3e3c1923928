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

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;

use super::{Context, Kind, Measurement, ObserveError, Query, Source, Trigger, metric_name};
use crate::interceptor::Protocol;
use crate::interceptor::traffic::{RouteSelector, Traffic};
use crate::metadata::{MetadataError, Origin, Params};

pub static KIND: Kind = Kind {
    scalers: &["http", "tcp"],
    parse,
};

/// ACA evaluates HTTP and TCP rules every 15 s, the length of their window.
pub const DEFAULT_POLLING_INTERVAL: Duration = Duration::from_secs(15);
const DEFAULT_TARGET: f64 = 10.0;
const METADATA: &[Origin] = &[Origin::Metadata];

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
    let protocol = if scaler == "tcp" { Protocol::Tcp } else { Protocol::Http };
    let keys = keys(protocol);
    let route = match (
        params.string(&["route"], METADATA),
        params.string(&["host"], METADATA),
    ) {
        (Some(_), Some(_)) => {
            return Err(MetadataError::invalid("host", "set `route` or `host`, not both"));
        }
        (Some(name), None) if !name.trim().is_empty() => RouteSelector::Name(name.trim().to_string()),
        (None, Some(host)) if protocol == Protocol::Http && !host.trim().is_empty() => {
            RouteSelector::Host(host.trim().to_ascii_lowercase())
        }
        (None, Some(_)) => {
            return Err(MetadataError::invalid("host", "`tcp` triggers select their route by `route`"));
        }
        _ => {
            let also = if protocol == Protocol::Http { " (or `host`)" } else { "" };
            return Err(MetadataError::missing(
                "route",
                format!("name the interceptor route to measure{also}"),
            ));
        }
    };
    let target = params.number::<f64>(&[keys.target], METADATA, DEFAULT_TARGET)?;
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
    traffic
        .check(protocol, &route)
        .map_err(|reason| MetadataError::invalid(selector_key, reason))?;
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
            key: format!("{scaler}|{route:?}|{metric}"),
            description: format!("{scaler} {route} ({metric})"),
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
    })
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
