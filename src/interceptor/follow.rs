//! An interceptor in its own Deployment follows the scaler's route table
//! (routes ScaledObjects declare) with a long poll on the scaler's admin
//! port, so a new route is served here within a second of its declaration.
//! While the scaler cannot be reached the last table stays in force, and
//! while a restarted scaler is still settling (it lost the routes of its
//! run before and not every trigger has declared its own again) the routes
//! it lacks stay in force too.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::table::RouteControl;
use crate::logging::Summary;
use crate::routing::api::{MAX_WAIT, PATH};
use crate::routing::{RouteSpec, RouteTable};

/// How long to wait before asking again after a failure.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Failures to reach the scaler are logged once per this interval.
static UNREACHABLE: Summary = Summary::new(Duration::from_secs(30));

/// Where the follower stands, for the interceptor's admin report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Following {
    /// The scaler run and table version in force here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    pub routes: usize,
    /// The scaler restarted without its earlier routes and may lack some
    /// (see `carried`).
    pub settling: bool,
    /// Routes kept from the scaler's run before while it settles: ones
    /// its table lacks and nothing in it clashes with.
    pub carried: usize,
    /// The last failure to read the table, cleared by the next success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Follows `{base}/routes/table` (`base`: `http://scaler:9091`, or https)
/// until `shutdown`.
pub async fn follow(
    base: String,
    client: reqwest::Client,
    control: RouteControl,
    status: watch::Sender<Following>,
    shutdown: CancellationToken,
) {
    let mut seen: Option<RouteTable> = None;
    // What is in force here: the table's routes, then the carried ones.
    let mut applied: Vec<RouteSpec> = Vec::new();
    let mut carried: Vec<RouteSpec> = Vec::new();
    loop {
        let mut url = format!("{base}{PATH}?wait={}", MAX_WAIT.as_secs());
        if let Some(seen) = &seen {
            url.push_str(&format!(
                "&instance={}&version={}",
                seen.instance, seen.version
            ));
        }
        let answer = tokio::select! {
            _ = shutdown.cancelled() => return,
            answer = read(&client, &url) => answer,
        };
        match answer {
            Ok(table) => {
                if seen.as_ref() == Some(&table) {
                    status.send_modify(|following| following.error = None);
                    continue;
                }
                let restarted = seen
                    .as_ref()
                    .is_some_and(|seen| seen.instance != table.instance);
                if !table.settling {
                    carried.clear();
                } else if restarted {
                    carried = applied.clone();
                }
                carried.retain(|spec| !in_table(spec, &table.routes));
                if restarted && !carried.is_empty() {
                    info!(
                        carried = carried.len(),
                        "the scaler restarted without its routes; keeping ours until its triggers declare theirs again"
                    );
                }
                let in_force: Vec<RouteSpec> =
                    table.routes.iter().chain(&carried).cloned().collect();
                if in_force != applied {
                    info!(
                        version = table.version,
                        routes = table.routes.len(),
                        carried = carried.len(),
                        "route table from the scaler"
                    );
                    control.apply_declared(in_force.clone());
                    applied = in_force;
                }
                status.send_replace(Following {
                    instance: Some(table.instance.clone()),
                    version: Some(table.version),
                    routes: table.routes.len(),
                    settling: table.settling,
                    carried: carried.len(),
                    error: None,
                });
                seen = Some(table);
            }
            Err(error) => {
                if let Some(count) = UNREACHABLE.note() {
                    warn!(%error, count, "cannot read the scaler's route table; keeping the last one");
                }
                status.send_modify(|following| following.error = Some(error));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(RETRY_AFTER) => {}
                }
            }
        }
    }
}

/// Whether the table has this route, or another that claims what it does
/// (which then wins: the carried route is the stale one).
fn in_table(spec: &RouteSpec, routes: &[RouteSpec]) -> bool {
    let claims = spec.exclusive_claims();
    routes.iter().any(|route| {
        route.name == spec.name
            || route
                .exclusive_claims()
                .iter()
                .any(|claim| claims.contains(claim))
    })
}

async fn read(client: &reqwest::Client, url: &str) -> Result<RouteTable, String> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|error| super::fleet::describe(&error))?;
    if !response.status().is_success() {
        return Err(format!("the scaler answered {}", response.status()));
    }
    response
        .json()
        .await
        .map_err(|error| super::fleet::describe(&error))
}
