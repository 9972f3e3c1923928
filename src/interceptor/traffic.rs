//! Where the `http` and `tcp` triggers read traffic from: this process's
//! own interceptor, or a fleet of interceptor replicas.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::counters::Load;
use super::fleet::Fleet;
use super::{Protocol, Routes};
use crate::scalers::ObserveError;

#[derive(Clone)]
pub enum Traffic {
    /// The interceptor runs inside this process.
    Local(Arc<Routes>),
    /// Interceptors run as their own Deployment (`interceptor.endpoints`).
    Remote(Arc<Fleet>),
}

/// Which route a trigger measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteSelector {
    Name(String),
    /// The HTTP route serving this host (lower case).
    Host(String),
}

impl RouteSelector {
    pub fn selects(&self, name: &str, host: Option<&str>) -> bool {
        match self {
            RouteSelector::Name(wanted) => wanted == name,
            RouteSelector::Host(wanted) => host == Some(wanted.as_str()),
        }
    }

    fn wake_key(&self) -> String {
        match self {
            RouteSelector::Name(name) => format!("route:{name}"),
            RouteSelector::Host(host) => format!("host:{host}"),
        }
    }
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
    /// Resolves the selector where the routes are known now (in process):
    /// a route no interceptor has is an error, not a silent zero. Remote
    /// routes are checked at every read.
    pub fn resolve(
        &self,
        protocol: Protocol,
        route: RouteSelector,
    ) -> Result<RouteSelector, String> {
        let Traffic::Local(routes) = self else {
            return Ok(route);
        };
        let found = match &route {
            RouteSelector::Name(name) => routes
                .get(name)
                .filter(|info| info.protocol == protocol)
                .map(|_| name.as_str()),
            RouteSelector::Host(host) => routes
                .by_host(host)
                .filter(|(_, info)| info.protocol == protocol)
                .map(|(name, _)| name),
        };
        match found {
            Some(name) => Ok(RouteSelector::Name(name.to_string())),
            None => {
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
        }
    }

    pub async fn load(
        &self,
        protocol: Protocol,
        route: &RouteSelector,
    ) -> Result<Load, ObserveError> {
        match self {
            Traffic::Local(routes) => {
                let RouteSelector::Name(name) = route else {
                    return Err(ObserveError::Config(format!("{route} was not resolved")));
                };
                let info = routes
                    .get(name)
                    .ok_or_else(|| ObserveError::Config(format!("no {protocol} route `{name}`")))?;
                Ok(info.counters.load(Instant::now()))
            }
            Traffic::Remote(fleet) => fleet.load(protocol, route).await,
        }
    }

    /// Ticks when a cold start begins on the route.
    pub fn wakeups(&self, route: &RouteSelector) -> Option<watch::Receiver<u64>> {
        match (self, route) {
            (Traffic::Local(routes), RouteSelector::Name(name)) => {
                routes.get(name).map(|info| info.counters.holds())
            }
            (Traffic::Local(_), RouteSelector::Host(_)) => None,
            (Traffic::Remote(fleet), route) => Some(fleet.wakeups(&route.wake_key())),
        }
    }
}
