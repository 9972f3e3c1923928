//! Who may read the admin port's reports. `/healthz`, `/readyz` and
//! `/metrics` are anyone's who reaches the port (kubelet, Prometheus);
//! everything else (`/status`, `/status/config`, `/routes/table`,
//! `/interceptor/*`) lists every namespace's ScaledObjects, sources and
//! routes, so when the port is exposed (`admin.auth.require`) a caller
//! proves who it is with a client certificate from `admin.tls.client_ca_file`
//! (mTLS), or with a Kubernetes ServiceAccount token the API server vouches
//! for (TokenReview) whose user is in `admin.auth.allowed_callers`.
//! No token and no review result is ever logged.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::cluster::{ClusterError, Review, TokenReviewer};
use crate::config::{CallerPattern, KubernetesAccess, Settings};
use crate::logging::Summary;
use crate::tls::TlsListener;

/// TokenReview failures are logged once per this interval.
static REVIEW_FAILING: LazyLock<Summary> = LazyLock::new(|| {
    Summary::new(Duration::from_secs(30), |count| {
        warn!(
            count,
            "admin port: still cannot check callers' tokens; answering 503"
        );
    })
});

/// What a connection proved in its TLS handshake.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peer {
    /// A client certificate that chains to `admin.tls.client_ca_file`
    /// (rustls verified it, or ended the handshake).
    pub client_certificate: bool,
}

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(_stream: IncomingStream<'_, TcpListener>) -> Self {
        Self::default()
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        let (_, connection) = stream.io().get_ref();
        Self {
            client_certificate: connection
                .peer_certificates()
                .is_some_and(|chain| !chain.is_empty()),
        }
    }
}

/// The admin port's check of callers, built once at start.
pub struct Guard {
    required: bool,
    mtls: bool,
    reviewer: Option<TokenReviewer>,
    /// Why tokens cannot be checked though `allowed_callers` is set.
    no_review: Option<String>,
    allowed: Vec<CallerPattern>,
}

impl Guard {
    /// From `[admin]` (and `kubernetes.kubeconfig` / `kubernetes.timeout`
    /// for TokenReview). Fails when tokens are to be checked and no
    /// Kubernetes configuration is found.
    pub async fn from_settings(settings: &Settings) -> Result<Self, ClusterError> {
        let auth = &settings.admin.auth;
        let mtls = settings
            .admin
            .tls
            .as_ref()
            .is_some_and(|tls| tls.client_ca_file.is_some());
        let required = auth.required(settings.admin.listen, mtls);
        let allowed: Vec<CallerPattern> = auth
            .allowed_callers
            .iter()
            .filter_map(|pattern| CallerPattern::new(pattern).ok())
            .collect();
        // Tokens are checked with the Kubernetes API as `[kubernetes]`
        // reaches it; without access (off, or `auto` finding no
        // configuration) a token is refused, never believed.
        let mut no_review = None;
        let reviewer = if required && !allowed.is_empty() {
            let kubernetes = &settings.kubernetes;
            if kubernetes.enabled == KubernetesAccess::Off {
                no_review = Some("kubernetes.enabled = false".to_string());
                None
            } else {
                match TokenReviewer::connect(
                    kubernetes.kubeconfig.as_ref(),
                    kubernetes.timeout,
                    auth.audiences.clone(),
                    auth.cache_ttl,
                )
                .await
                {
                    Ok(reviewer) => Some(reviewer),
                    Err(ClusterError::NoConfig(reason))
                        if kubernetes.enabled == KubernetesAccess::Auto =>
                    {
                        no_review = Some(format!("no Kubernetes configuration found: {reason}"));
                        None
                    }
                    Err(error) => return Err(error),
                }
            }
        } else {
            None
        };
        if let Some(reason) = &no_review {
            warn!(%reason, "admin port: admin.auth.allowed_callers is set but tokens cannot be checked; bearer tokens are refused");
        }
        let listen = settings.admin.listen;
        match (required, mtls, reviewer.is_some()) {
            (false, _, _) => {
                info!(%listen, "admin port: every endpoint open to whoever reaches it (admin.auth.require)")
            }
            (true, false, false) => {
                warn!(%listen, "admin port: reports need an authenticated caller, and no way to authenticate is set (admin.auth.allowed_callers, admin.tls.client_ca_file): only /healthz, /readyz and /metrics answer")
            }
            (true, mtls, tokens) => {
                info!(%listen, mtls, tokens, "admin port: reports need an authenticated caller")
            }
        }
        Ok(Self {
            required,
            mtls,
            reviewer,
            no_review,
            allowed,
        })
    }

    /// A guard that lets everyone in (tests of the reports themselves).
    pub fn open() -> Self {
        Self {
            required: false,
            mtls: false,
            reviewer: None,
            no_review: None,
            allowed: Vec::new(),
        }
    }

    async fn check(&self, client_certificate: bool, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.required || client_certificate {
            return Ok(());
        }
        let Some(token) = bearer(headers) else {
            return Err(Refusal::Unauthenticated(self.how_to()));
        };
        let Some(reviewer) = &self.reviewer else {
            return Err(Refusal::Unauthenticated(self.how_to()));
        };
        match reviewer.review(token).await {
            Ok(Review::Authenticated { user }) => {
                if self.allowed.iter().any(|pattern| pattern.matches(&user)) {
                    Ok(())
                } else {
                    debug!(%user, "admin port: caller not in admin.auth.allowed_callers");
                    Err(Refusal::NotAllowed(user))
                }
            }
            Ok(Review::Unauthenticated) => Err(Refusal::Unauthenticated(
                "the bearer token is not valid (expired, revoked, or not issued for admin.auth.audiences)".to_string(),
            )),
            Err(error) => {
                if let Some(count) = REVIEW_FAILING.note() {
                    warn!(%error, count, "admin port: cannot check callers' tokens; answering 503");
                }
                Err(Refusal::Unavailable)
            }
        }
    }

    fn how_to(&self) -> String {
        if let Some(reason) = &self.no_review {
            let mtls = if self.mtls {
                "present a client certificate (mTLS); "
            } else {
                ""
            };
            return format!("{mtls}bearer tokens cannot be checked here ({reason})");
        }
        match (self.mtls, self.reviewer.is_some()) {
            (true, true) => "present a client certificate (mTLS) or a Kubernetes ServiceAccount token (Authorization: Bearer)",
            (true, false) => "present a client certificate (mTLS)",
            (false, true) => "present a Kubernetes ServiceAccount token (Authorization: Bearer)",
            (false, false) => "no way to authenticate is configured: set admin.auth.allowed_callers or admin.tls.client_ca_file",
        }
        .to_string()
    }
}

enum Refusal {
    Unauthenticated(String),
    NotAllowed(String),
    Unavailable,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Unauthenticated(how) => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                format!("authentication required: {how}\n"),
            )
                .into_response(),
            Refusal::NotAllowed(user) => (
                StatusCode::FORBIDDEN,
                format!("{user} is not in admin.auth.allowed_callers\n"),
            )
                .into_response(),
            Refusal::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot check the caller's token with the Kubernetes API (TokenReview); try again\n",
            )
                .into_response(),
        }
    }
}

/// The middleware in front of the reports.
pub async fn require_caller(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    let client_certificate = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .is_some_and(|ConnectInfo(peer)| peer.client_certificate);
    match guard.check(client_certificate, request.headers()).await {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer abc.def".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc.def"));
        headers.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "Basic dXNlcjpw".parse().unwrap());
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
