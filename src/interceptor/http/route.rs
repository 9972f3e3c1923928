//! One HTTP route (which requests it takes, where they go, the app's
//! connections kept for it) and the table that picks a request's route.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::uri::Authority;
use http::{Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::ProxyBody;
use super::answer::Answer;
use super::http1_client::Http1Client;
use super::idle_pool::IdlePool;
use crate::interceptor::counters::RouteCounters;
use crate::interceptor::upstream::{Upstream, UpstreamError};

/// One HTTP route: which requests it takes and where they go.
pub struct HttpRoute {
    pub name: String,
    /// Lower case, without a port.
    pub hosts: Vec<String>,
    pub path_prefix: Option<String>,
    pub counters: Arc<RouteCounters>,
    pub upstream_http2: bool,
    /// The route's (first) host as a URI authority, for hyper-util's
    /// client: it keys that client's pool (one per route, whatever `Host`
    /// spellings clients send) and is an h2c upstream's `:authority`.
    pub(super) authority: Option<Authority>,
    pub(crate) upstream: Arc<Upstream>,
    /// An HTTP/1.1 upstream's idle connections, for both paths: the direct
    /// path takes them as they are, hyper's through `http1`.
    pub(super) idle: Arc<IdlePool>,
    pub(super) http1: Http1Client,
    /// An h2c upstream's connections (multiplexed: a pool of another kind).
    pub(super) h2c: Option<Client<ColdStartConnector, Incoming>>,
    /// How long the app has to send a response's head (then 504).
    pub(super) response_timeout: Duration,
}

/// Idle upstream connections kept per route, at most.
const MAX_IDLE_PER_ROUTE: usize = 1024;
/// How long an idle upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

impl HttpRoute {
    /// Counts an answer the interceptor gave itself (502, 503, 504).
    pub(super) fn counted_refusal(&self, answer: Answer) -> Response<ProxyBody> {
        self.counters.refused(answer.status.as_u16());
        answer.response()
    }

    pub fn new(
        name: String,
        hosts: &[String],
        path_prefix: Option<String>,
        upstream: Arc<Upstream>,
        upstream_http2: bool,
        response_timeout: Duration,
    ) -> Self {
        let counters = upstream.counters.clone();
        let h2c = upstream_http2.then(|| {
            let mut builder = Client::builder(TokioExecutor::new());
            // Without a timer the idle timeout is never enforced.
            builder
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(IDLE_TIMEOUT)
                .pool_max_idle_per_host(MAX_IDLE_PER_ROUTE)
                .http2_only(true);
            builder.build(ColdStartConnector {
                upstream: upstream.clone(),
            })
        });
        let idle = IdlePool::new(MAX_IDLE_PER_ROUTE, IDLE_TIMEOUT);
        let hosts: Vec<String> = hosts
            .iter()
            .map(|h| crate::routing::spec::fold_host(h))
            .collect();
        Self {
            name,
            authority: hosts
                .first()
                .and_then(|host| Authority::try_from(host.as_str()).ok()),
            hosts,
            path_prefix,
            counters,
            upstream_http2,
            http1: Http1Client::new(upstream.clone(), idle.clone(), response_timeout),
            idle,
            upstream,
            h2c,
            response_timeout,
        }
    }

    pub fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// `host` as the client sent it: any case, no port, perhaps the
    /// trailing dot of a fully qualified name (one host with or without).
    pub(super) fn matches(&self, host: &str, path: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        if !self.hosts.iter().any(|own| own.eq_ignore_ascii_case(host)) {
            return false;
        }
        match &self.path_prefix {
            None => true,
            Some(prefix) => {
                let prefix = prefix.trim_end_matches('/');
                path == prefix
                    || prefix.is_empty()
                    || path
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
        }
    }
}

/// The routes, most specific (longest path prefix) first.
#[derive(Default)]
pub struct HttpRouter {
    routes: Vec<Arc<HttpRoute>>,
}

impl HttpRouter {
    pub fn new(mut routes: Vec<Arc<HttpRoute>>) -> Self {
        routes.sort_by_key(|route| {
            std::cmp::Reverse(route.path_prefix.as_deref().map_or(0, str::len))
        });
        Self { routes }
    }

    pub(super) fn find(&self, host: &str, path: &str) -> Option<&Arc<HttpRoute>> {
        self.routes.iter().find(|route| route.matches(host, path))
    }
}

/// Connects the route's client to its upstream, whatever the URI says,
/// holding through a cold start.
#[derive(Clone)]
pub(super) struct ColdStartConnector {
    upstream: Arc<Upstream>,
}

impl tower::Service<Uri> for ColdStartConnector {
    type Response = TokioIo<TcpStream>;
    type Error = UpstreamError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let deadline = upstream.deadline(Instant::now());
            upstream.connect(deadline).await.map(TokioIo::new)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_prefixes_match_whole_segments() {
        let counters = Arc::new(RouteCounters::new(Instant::now()));
        let upstream = Arc::new(Upstream::new(
            "api".into(),
            "127.0.0.1:1".into(),
            Duration::from_secs(1),
            1,
            counters,
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let route = HttpRoute::new(
            "api".into(),
            &["Web.Example.com".to_string()],
            Some("/api/".into()),
            upstream,
            false,
            Duration::from_secs(240),
        );
        assert!(route.matches("web.example.com", "/api"));
        assert!(route.matches("web.example.com", "/api/orders"));
        assert!(!route.matches("web.example.com", "/apix"));
        assert!(!route.matches("other.example.com", "/api"));
    }
}
