//! The HTTP side of the management API: one pooled client, and GETs
//! retried on the answers Azure documents as transient.

use std::sync::OnceLock;
use std::time::Duration;

use reqwest::StatusCode;

use crate::scalers::ObserveError;
use crate::secret::Secret;

fn http_client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(15))
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("hoist/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("the HTTP client builds with static settings")
    })
}

/// One GET with `authorization`, retried on 408, 429 and 5xx (and failed
/// connections): after 200 ms, then 400 ms, or the `Retry-After` up to
/// 2 s. The driver's timeout drops the future, so retries never outlive it.
pub async fn get(url: &str, authorization: &Secret) -> Result<(StatusCode, String), ObserveError> {
    const ATTEMPTS: u32 = 3;
    let mut delay = Duration::from_millis(200);
    for attempt in 1..=ATTEMPTS {
        let sent = http_client()
            .get(url)
            .header(reqwest::header::AUTHORIZATION, authorization.expose())
            .send()
            .await;
        let transient = match &sent {
            Ok(response) => {
                let status = response.status();
                status == StatusCode::REQUEST_TIMEOUT
                    || status == StatusCode::TOO_MANY_REQUESTS
                    || status.is_server_error()
            }
            Err(error) => error.is_connect() || error.is_timeout(),
        };
        if transient && attempt < ATTEMPTS {
            let wait = sent
                .as_ref()
                .ok()
                .and_then(|r| r.headers().get(reqwest::header::RETRY_AFTER))
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(delay, |s| {
                    Duration::from_secs(s).min(Duration::from_secs(2))
                });
            tokio::time::sleep(wait).await;
            delay *= 2;
            continue;
        }
        // `without_url`: the URL is safe, but errors stay short.
        let response = sent.map_err(|e| ObserveError::Connect(e.without_url().to_string()))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| ObserveError::Connect(e.without_url().to_string()))?;
        return Ok((status, body));
    }
    unreachable!("the last attempt returns")
}
