//! Where the `http` and `tcp` triggers read traffic from: this process's
//! own interceptor, or a fleet of interceptor replicas.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::counters::Load;
use super::fleet::Fleet;
pub use super::selector::RouteSelector;
use super::{Protocol, RouteSet, Routes};
use crate::observe_error::ObserveError;

#[derive(Clone)]
pub enum Traffic {
    /// The interceptor runs inside this process.
    Local(Arc<Routes>),
    /// Interceptors run as their own Deployment (`interceptor.endpoints`).
    Remote(Arc<Fleet>),
}

/// The local routes a selector picks.
fn selected<'a>(
    routes: &'a RouteSet,
    protocol: Protocol,
    route: &'a RouteSelector,
) -> impl Iterator<Item = (&'a String, &'a super::RouteInfo)> {
    routes.iter().filter(move |(name, info)| {
        info.protocol() == protocol && route.selects(name, info.hosts())
    })
}

impl std::fmt::Display for RouteSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteSelector::Name(name) => write!(f, "route `{name}`"),
            RouteSelector::Host(host) => write!(f, "host `{host}`"),
        }
    }
}

impl Traffic {
    /// Checks the selector where the routes are known now (in process): a
    /// route no interceptor has, or a host several routes serve, is an
    /// error, not a silent zero. Remote routes are checked at every read.
    pub fn check(&self, protocol: Protocol, route: &RouteSelector) -> Result<(), String> {
        let Traffic::Local(routes) = self else {
            return Ok(());
        };
        let routes = routes.current();
        let candidates: Vec<&str> = selected(&routes, protocol, route)
            .map(|(name, _)| name.as_str())
            .collect();
        match candidates.as_slice() {
            [_] => Ok(()),
            [] => {
                let known = routes.names(protocol);
                Err(format!(
                    "hoist's interceptor has no {protocol} {route} (its {protocol} routes: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ))
            }
            several => Err(format!(
                "{route} is served by several routes ({}): select one with `route`",
                several.join(", ")
            )),
        }
    }

    pub async fn load(
        &self,
        protocol: Protocol,
        route: &RouteSelector,
    ) -> Result<Load, ObserveError> {
        match self {
            Traffic::Local(routes) => selected(&routes.current(), protocol, route)
                .next()
                .map(|(_, info)| info.counters.load(Instant::now()))
                .ok_or_else(|| ObserveError::Config(format!("no {protocol} {route}"))),
            Traffic::Remote(fleet) => fleet.load(protocol, route).await,
        }
    }

    /// Ticks when a cold start begins on the route.
    pub fn wakeups(&self, route: &RouteSelector) -> Option<watch::Receiver<u64>> {
        match self {
            Traffic::Local(routes) => routes
                .current()
                .iter()
                .find(|(name, info)| route.selects(name, info.hosts()))
                .map(|(_, info)| info.counters.cold_starts()),
            Traffic::Remote(fleet) => Some(fleet.wakeups(&route.wake_key())),
        }
    }
}
