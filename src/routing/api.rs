//! The route table on the scaler's admin port, for interceptors that run
//! as their own Deployment: `GET /routes/table` answers at once when the
//! caller is behind, else when the table next changes (a long poll).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{Registry, RouteTable};

/// The longest a `/routes/table` request waits for a change.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

pub const PATH: &str = "/routes/table";

#[derive(Clone)]
struct TableState {
    registry: Arc<Registry>,
    /// Ends open long polls, so they do not hold up a shutdown.
    shutdown: CancellationToken,
}

pub fn router(registry: Arc<Registry>, shutdown: CancellationToken) -> Router {
    Router::new()
        .route(PATH, get(get_table))
        .with_state(TableState { registry, shutdown })
}

#[derive(Debug, Deserialize)]
struct TableQuery {
    /// The scaler run the caller last heard from.
    instance: Option<String>,
    /// The version the caller has.
    version: Option<u64>,
    /// Seconds to wait for a change, at most [`MAX_WAIT`].
    wait: Option<u64>,
}

async fn get_table(
    State(TableState { registry, shutdown }): State<TableState>,
    Query(query): Query<TableQuery>,
) -> axum::Json<RouteTable> {
    let mut table = registry.table();
    let current = table.borrow_and_update().clone();
    let up_to_date = query.instance.as_deref() == Some(current.instance.as_str())
        && query.version == Some(current.version);
    if !up_to_date {
        return axum::Json((*current).clone());
    }
    let wait = Duration::from_secs(query.wait.unwrap_or(MAX_WAIT.as_secs())).min(MAX_WAIT);
    tokio::select! {
        _ = tokio::time::timeout(wait, table.changed()) => {}
        _ = shutdown.cancelled() => {}
    }
    let latest = table.borrow().clone();
    axum::Json((*latest).clone())
}
