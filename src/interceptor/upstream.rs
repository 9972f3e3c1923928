//! Connecting to a route's upstream, holding on through a cold start: while
//! the upstream refuses connections (scaled to zero, still starting), the
//! caller waits and hoist retries, so the first request is delayed instead
//! of failed.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::counters::RouteCounters;

/// How often a held connection retries its upstream: short enough that a
/// request leaves within tens of milliseconds of the upstream listening.
pub const RETRY_EVERY: Duration = Duration::from_millis(25);

/// Why a connection to the upstream was not made. Messages name the route
/// and upstream (configuration, not secrets) and are sent to clients.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error(
        "route `{route}`: upstream {upstream} did not accept a connection within the cold start timeout of {timeout:?} (last error: {last_error})"
    )]
    ColdStartTimeout {
        route: String,
        upstream: String,
        timeout: Duration,
        last_error: String,
    },
    #[error(
        "route `{route}`: {limit} requests are already waiting for upstream {upstream} to start (interceptor.max_held_per_route)"
    )]
    TooManyHeld {
        route: String,
        upstream: String,
        limit: usize,
    },
}

/// One route's upstream and how long to wait for it.
#[derive(Clone)]
pub struct Upstream {
    pub route: String,
    pub address: String,
    pub cold_start_timeout: Duration,
    pub max_held: usize,
    pub counters: Arc<RouteCounters>,
}

impl Upstream {
    /// Connects at once when the upstream listens; otherwise holds the
    /// caller and retries until it does or the cold start timeout passes.
    pub async fn connect(&self) -> Result<TcpStream, UpstreamError> {
        let deadline = Instant::now() + self.cold_start_timeout;
        let mut last_error = match self.attempt(deadline).await {
            Ok(stream) => return Ok(stream),
            Err(error) => error,
        };
        let Some(_held) = self.counters.try_hold(self.max_held as u64) else {
            return Err(UpstreamError::TooManyHeld {
                route: self.route.clone(),
                upstream: self.address.clone(),
                limit: self.max_held,
            });
        };
        tracing::debug!(route = %self.route, upstream = %self.address, error = %last_error, "holding a request until the upstream accepts");
        loop {
            let next = Instant::now() + RETRY_EVERY;
            if next >= deadline {
                return Err(UpstreamError::ColdStartTimeout {
                    route: self.route.clone(),
                    upstream: self.address.clone(),
                    timeout: self.cold_start_timeout,
                    last_error,
                });
            }
            tokio::time::sleep_until(next).await;
            match self.attempt(deadline).await {
                Ok(stream) => return Ok(stream),
                Err(error) => last_error = error,
            }
        }
    }

    /// One connection attempt, bounded by the deadline: an upstream that
    /// drops SYNs must not outlast the cold start timeout.
    async fn attempt(&self, deadline: Instant) -> Result<TcpStream, String> {
        match tokio::time::timeout_at(deadline, TcpStream::connect(self.address.as_str())).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("connect timed out".to_string()),
        }
    }
}
