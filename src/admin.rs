//! The admin HTTP listener: `/healthz`, `/readyz`, `/metrics` (open to
//! whoever reaches the port), and the reports behind [`auth`]: `/status`
//! and `/routes/table` (scaler), `/status/config` (config reloads),
//! `/interceptor/*` (interceptor).

pub mod auth;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::driver::Driver;

#[derive(Clone)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    /// The scaler's driver; none in `hoist interceptor`.
    pub driver: Option<Driver>,
    /// This process's interceptor routes, if it runs one.
    pub interceptor: Option<Arc<crate::interceptor::Routes>>,
    /// An interceptor following the scaler's route table: where it stands.
    pub following: Option<watch::Receiver<crate::interceptor::follow::Following>>,
    /// Fires at shutdown, ending long polls.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// True while hoist is serving; false while starting or shutting down.
    pub ready: watch::Receiver<bool>,
    /// Reloads of the config, when this process reloads it.
    pub reload: Option<Arc<crate::reload::Reloader>>,
    /// Who may read the reports.
    pub auth: Arc<auth::Guard>,
}

/// Serve it with `into_make_service_with_connect_info::<auth::Peer>()`:
/// without that, a client certificate is not seen.
pub fn router(state: AdminState) -> Router {
    let open = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    let guard = state.auth.clone();
    let mut router = Router::new();
    if state.driver.is_some() {
        router = router.route("/status", get(status));
    }
    if state.reload.is_some() {
        router = router.route("/status/config", get(config_status));
    }
    let interceptor = state.interceptor.clone();
    let following = state.following.clone();
    let shutdown = state.shutdown.clone();
    let declared = state.driver.as_ref().and_then(Driver::routes);
    let mut router = router.with_state(state);
    if let Some(routes) = interceptor {
        router = router.merge(crate::interceptor::report::router(
            routes,
            following,
            shutdown.clone(),
        ));
    }
    if let Some(declared) = declared {
        router = router.merge(crate::routing::api::router(declared, shutdown));
    }
    // Every report, present and future, sits behind the guard: only the
    // three routes above are open.
    open.merge(router.route_layer(axum::middleware::from_fn_with_state(
        guard,
        auth::require_caller,
    )))
}

/// Alive as long as the process answers and, with a driver, polls: a
/// poll scheduler that ended outside shutdown (a bug) would leave every
/// answer frozen at its last reading, and only a restart brings it back.
async fn healthz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    liveness(state.driver.as_ref(), state.shutdown.is_cancelled())
}

fn liveness(driver: Option<&Driver>, shutting_down: bool) -> (StatusCode, &'static str) {
    match driver {
        Some(driver) if !driver.polling() && !shutting_down => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not alive: the poll scheduler stopped; no source is polled (restart hoist)\n",
        ),
        _ => (StatusCode::OK, "ok\n"),
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if *state.ready.borrow() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting or shutting down\n",
        )
    }
}

async fn status(State(state): State<AdminState>) -> axum::response::Response {
    match &state.driver {
        Some(driver) => {
            let mut status = crate::status::snapshot(driver);
            status.config = state.reload.as_ref().map(|reload| reload.status());
            axum::Json(status).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no scaler in this process\n").into_response(),
    }
}

/// The `config` section of `/status` alone: `hoist interceptor` has no
/// `/status`.
async fn config_status(State(state): State<AdminState>) -> axum::response::Response {
    match &state.reload {
        Some(reload) => axum::Json(reload.status()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "this process does not reload its config\n",
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "cannot encode metrics\n".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverSettings;
    use crate::trigger::Defaults;
    use std::time::Duration;

    #[tokio::test]
    async fn healthz_fails_once_the_poll_scheduler_has_stopped_outside_shutdown() {
        let driver = Driver::new(
            DriverSettings::unlimited(
                Defaults {
                    polling_interval: Duration::from_secs(30),
                    timeout: Duration::from_secs(3),
                },
                Duration::from_secs(300),
            ),
            Default::default(),
            Arc::new(crate::metrics::Metrics::new()),
            tokio_util::sync::CancellationToken::new(),
        );
        assert_eq!(liveness(Some(&driver), false).0, StatusCode::OK);
        driver.kill_scheduler();
        tokio::time::timeout(Duration::from_secs(5), driver.polling_ended())
            .await
            .expect("the scheduler's end is seen");
        assert_eq!(
            liveness(Some(&driver), false).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // At shutdown the scheduler ends on purpose.
        assert_eq!(liveness(Some(&driver), true).0, StatusCode::OK);
        assert_eq!(liveness(None, false).0, StatusCode::OK, "hoist interceptor");
    }
}
