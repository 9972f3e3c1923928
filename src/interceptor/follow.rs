//! An interceptor in its own Deployment follows the scaler's route table
//! (routes ScaledObjects declare) with a long poll on the scaler's admin
//! port, so a new route is served here within a second of its declaration.
//! While the scaler cannot be reached the last table stays in force.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::table::RouteControl;
use crate::logging::Summary;
use crate::routing::RouteTable;
use crate::routing::api::{MAX_WAIT, PATH};

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
                if seen.as_ref() != Some(&table) {
                    if seen.as_ref().is_none_or(|seen| seen.routes != table.routes) {
                        info!(version = table.version, routes = table.routes.len(), "route table from the scaler");
                        control.apply_declared(table.routes.clone());
                    }
                    status.send_replace(Following {
                        instance: Some(table.instance.clone()),
                        version: Some(table.version),
                        routes: table.routes.len(),
                        error: None,
                    });
                    seen = Some(table);
                } else {
                    status.send_modify(|following| following.error = None);
                }
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
