//! What an interceptor tells the scaler over its admin port: every route's
//! load (`GET /interceptor/routes`) and, as a long poll, when a cold start
//! begins (`GET /interceptor/holds`), so a split setup can push activation
//! within a second instead of at the next polling tick.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tokio::sync::watch;

use super::counters::Load;
use super::follow::Following;
use super::{Protocol, Routes};
use crate::cluster::FollowedService;
use crate::routing::RouteSpec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutesReport {
    pub instance: String,
    pub routes: BTreeMap<String, RouteReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteReport {
    pub protocol: Protocol,
    /// The hosts an HTTP route serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    pub load: Load,
}

/// Per route, how many cold starts began since the interceptor started,
/// and which routes hold requests right now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldsReport {
    pub instance: String,
    pub routes: BTreeMap<String, RouteHolds>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteHolds {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    pub cold_starts: u64,
    pub held: u64,
}

impl HoldsReport {
    /// Cold starts on every route: what a long poll compares.
    pub fn generation(&self) -> u64 {
        self.routes.values().map(|route| route.cold_starts).sum()
    }
}

/// How this interceptor dials upstreams that name a Service, and the
/// Services whose pods it follows (`GET /interceptor/services`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServicesReport {
    /// Upstreams naming a Service are dialled at its ready pods
    /// (`interceptor.direct_to_pods`, with a cluster to read).
    pub direct_to_pods: bool,
    /// Why not, when `interceptor.direct_to_pods` asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    pub services: Vec<FollowedService>,
}

pub fn services_report(routes: &Routes) -> ServicesReport {
    let pods = routes.pods();
    let endpoints = pods.endpoints();
    ServicesReport {
        direct_to_pods: endpoints.is_some(),
        unavailable: pods.why_unavailable(),
        services: endpoints.map(|e| e.report()).unwrap_or_default(),
    }
}

/// The longest a `/interceptor/holds` request waits for news.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

pub fn routes_report(routes: &Routes, now: Instant) -> RoutesReport {
    RoutesReport {
        instance: routes.instance.clone(),
        routes: routes
            .current()
            .iter()
            .map(|(name, route)| {
                let report = RouteReport {
                    protocol: route.protocol(),
                    hosts: route.hosts().to_vec(),
                    load: route.counters.load(now),
                };
                (name.clone(), report)
            })
            .collect(),
    }
}

fn holds_report(routes: &Routes) -> HoldsReport {
    HoldsReport {
        instance: routes.instance.clone(),
        routes: routes
            .current()
            .iter()
            .map(|(name, route)| {
                let holds = RouteHolds {
                    hosts: route.hosts().to_vec(),
                    cold_starts: *route.counters.cold_starts().borrow(),
                    held: route.counters.held(),
                };
                (name.clone(), holds)
            })
            .collect(),
    }
}

#[derive(Clone)]
struct ReportState {
    routes: Arc<Routes>,
    following: Option<watch::Receiver<Following>>,
    /// Ends open long polls, so they do not hold up a shutdown.
    shutdown: CancellationToken,
}

/// The admin routes an interceptor adds.
pub fn router(
    routes: Arc<Routes>,
    following: Option<watch::Receiver<Following>>,
    shutdown: CancellationToken,
) -> Router {
    Router::new()
        .route("/interceptor/routes", get(get_routes))
        .route("/interceptor/holds", get(get_holds))
        .route("/interceptor/table", get(get_table))
        .route("/interceptor/services", get(get_services))
        .with_state(ReportState {
            routes,
            following,
            shutdown,
        })
}

/// The routes this interceptor serves (config and declared), the declared
/// ones it leaves out and why, and where it stands with the scaler.
#[derive(Debug, Serialize)]
pub struct TableReport {
    pub routes: Vec<RouteSpec>,
    pub skipped: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub following: Option<Following>,
}

async fn get_table(State(state): State<ReportState>) -> axum::Json<TableReport> {
    let current = state.routes.current();
    axum::Json(TableReport {
        routes: current
            .iter()
            .map(|(_, route)| route.spec.clone())
            .collect(),
        skipped: current.skipped.clone(),
        following: state.following.as_ref().map(|f| f.borrow().clone()),
    })
}

async fn get_services(State(state): State<ReportState>) -> axum::Json<ServicesReport> {
    axum::Json(services_report(&state.routes))
}

async fn get_routes(State(state): State<ReportState>) -> axum::Json<RoutesReport> {
    axum::Json(routes_report(&state.routes, Instant::now()))
}

#[derive(Debug, Deserialize)]
struct HoldsQuery {
    /// The instance the caller last heard from.
    instance: Option<String>,
    /// The sum of `cold_starts` the caller last saw.
    generation: Option<u64>,
    /// Seconds to wait for a change, at most [`MAX_WAIT`].
    wait: Option<u64>,
}

/// Answers at once when the caller is behind (another instance, or cold
/// starts it has not seen); otherwise when the next cold start begins or
/// the wait ends.
async fn get_holds(
    State(ReportState {
        routes, shutdown, ..
    }): State<ReportState>,
    Query(query): Query<HoldsQuery>,
) -> axum::Json<HoldsReport> {
    let mut watchers: Vec<_> = routes
        .current()
        .iter()
        .map(|(_, route)| route.counters.cold_starts())
        .collect();
    // A new route is news too: its first cold start must not be missed.
    let mut table = routes.changes();
    table.borrow_and_update();
    let report = holds_report(&routes);
    let current = query.instance.as_deref() == Some(routes.instance.as_str())
        && query.generation == Some(report.generation());
    if !current || watchers.is_empty() {
        return axum::Json(report);
    }
    let wait = Duration::from_secs(query.wait.unwrap_or(MAX_WAIT.as_secs())).min(MAX_WAIT);
    let any_change = futures::future::select_all(
        watchers
            .iter_mut()
            .map(|watcher| Box::pin(watcher.changed())),
    );
    tokio::select! {
        _ = tokio::time::timeout(wait, any_change) => {}
        _ = table.changed() => {}
        _ = shutdown.cancelled() => {}
    }
    axum::Json(holds_report(&routes))
}
