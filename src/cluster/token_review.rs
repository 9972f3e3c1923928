//! Who a bearer token belongs to, asked of the Kubernetes API with a
//! TokenReview (`authentication.k8s.io/v1`), for the admin port. Answers
//! are kept a short while, keyed by a SHA-256 of the token (never the
//! token), so a caller polling every second does not cost a review every
//! second.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use super::ClusterError;

/// More distinct tokens than this within one TTL: the cache starts over
/// rather than grow without bound (strangers choose how many tokens they
/// send).
const MAX_CACHED: usize = 4096;

/// TokenReviews in flight at once: a stranger sending new tokens as fast
/// as it can does not turn hoist into a flood on the API server (the rest
/// wait, within `kubernetes.timeout`, then get 503).
const MAX_IN_FLIGHT: usize = 8;

/// What the API server said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    /// A valid token (for one of the audiences asked for) of this user.
    Authenticated { user: String },
    /// Not a valid token, or not for these audiences.
    Unauthenticated,
}

/// The review could not be made: the caller is neither let in nor told
/// its token is bad. Messages never carry the token.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("TokenReview: the API server answered {code} {reason}")]
    Api { code: u16, reason: String },
    #[error("TokenReview: {0}")]
    Unreachable(String),
    #[error("TokenReview: no answer within {0:?} (kubernetes.timeout)")]
    Timeout(Duration),
}

pub struct TokenReviewer {
    api: Api<TokenReview>,
    audiences: Vec<String>,
    timeout: Duration,
    ttl: Duration,
    cache: Mutex<HashMap<[u8; 32], (Instant, Review)>>,
    in_flight: tokio::sync::Semaphore,
}

impl TokenReviewer {
    /// A client for the API server hoist's kubeconfig (`kubeconfig`, else
    /// `KUBECONFIG`, `~/.kube/config` or the in-cluster ServiceAccount)
    /// names. Needs `create` on `tokenreviews.authentication.k8s.io`.
    pub async fn connect(
        kubeconfig: Option<&PathBuf>,
        timeout: Duration,
        audiences: Vec<String>,
        ttl: Duration,
    ) -> Result<Self, ClusterError> {
        let mut config = match kubeconfig {
            Some(path) => super::from_file(path).await?,
            None => kube::Config::infer().await.map_err(|error| {
                ClusterError::NoConfig(format!(
                    "admin.auth.allowed_callers checks tokens with the Kubernetes API: {error}"
                ))
            })?,
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        config.connect_timeout = Some(timeout);
        let client =
            kube::Client::try_from(config).map_err(|e| ClusterError::Client(e.to_string()))?;
        Ok(Self {
            api: Api::all(client),
            audiences,
            timeout,
            ttl,
            cache: Mutex::new(HashMap::new()),
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        })
    }

    /// Who `token` belongs to: from the cache while an answer is fresh,
    /// else from the API server. Failures are not cached.
    pub async fn review(&self, token: &str) -> Result<Review, ReviewError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((expires, review)) = self.lock().get(&key)
            && *expires > now
        {
            return Ok(review.clone());
        }
        let review = self.ask(token).await?;
        let mut cache = self.lock();
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (expires, _)| *expires > now);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(key, (now + self.ttl, review.clone()));
        Ok(review)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (Instant, Review)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn ask(&self, token: &str) -> Result<Review, ReviewError> {
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..Default::default()
        };
        let answer = tokio::time::timeout(self.timeout, async {
            // Never closed: the semaphore lives as long as `self`.
            let _permit = self.in_flight.acquire().await;
            self.api.create(&PostParams::default(), &request).await
        })
        .await
        .map_err(|_| ReviewError::Timeout(self.timeout))?
        .map_err(|error| match error {
            kube::Error::Api(status) => ReviewError::Api {
                code: status.code,
                reason: status.reason.clone(),
            },
            other => ReviewError::Unreachable(other.to_string()),
        })?;
        let Some(status) = answer.status else {
            return Ok(Review::Unauthenticated);
        };
        let user = status.user.and_then(|user| user.username);
        // The API server checks the audiences itself; the answer's list is
        // checked too, as the API documents, in case an authenticator
        // ignored them.
        let audience_ok = self.audiences.is_empty()
            || status
                .audiences
                .unwrap_or_default()
                .iter()
                .any(|audience| self.audiences.contains(audience));
        Ok(match (status.authenticated, user) {
            (Some(true), Some(user)) if audience_ok && !user.is_empty() => {
                Review::Authenticated { user }
            }
            _ => Review::Unauthenticated,
        })
    }
}
