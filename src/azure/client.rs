//! The HTTP side of the management API: one pooled client whose GETs are
//! retried (reqwest-retry) on the answers Azure documents as transient.

use std::sync::OnceLock;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;

use crate::observe_error::ObserveError;
use crate::secret::Secret;

fn http_client() -> &'static ClientWithMiddleware {
    static CLIENT: OnceLock<ClientWithMiddleware> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(15))
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("hoist/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("the HTTP client builds with static settings");
        // Two retries, 200 ms to 2 s apart (with jitter); the driver's
        // timeout drops the future, so retries never outlive it.
        let backoff = ExponentialBackoff::builder()
            .retry_bounds(Duration::from_millis(200), Duration::from_secs(2))
            .build_with_max_retries(2);
        reqwest_middleware::ClientBuilder::new(client)
            .with(RetryTransientMiddleware::new_with_policy(backoff))
            .build()
    })
}

/// One GET with `authorization`; 408, 429, 5xx and failed connections are
/// retried.
pub async fn get(url: &str, authorization: &Secret) -> Result<(StatusCode, String), ObserveError> {
    let response = http_client()
        .get(url)
        .header(reqwest::header::AUTHORIZATION, authorization.expose())
        .send()
        .await
        .map_err(|error| match error {
            reqwest_middleware::Error::Reqwest(error) => {
                ObserveError::Connect(error.without_url().to_string())
            }
            reqwest_middleware::Error::Middleware(error) => {
                ObserveError::Connect(error.to_string())
            }
        })?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|e| ObserveError::Connect(e.without_url().to_string()))?;
    Ok((status, body))
}
