//! An answer the interceptor gives itself (a refused request, an app that
//! failed or is not there), for hyper's path as a response and for the
//! direct path as HTTP/1.1 bytes.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tracing::debug;

use super::ProxyBody;
use super::response_head;
use crate::interceptor::upstream::UpstreamError;

/// An answer the interceptor gives itself: a line of text saying why.
pub struct Answer {
    pub status: StatusCode,
    text: String,
    /// Another replica (or this app, once up) can take it at once.
    retry_soon: bool,
    /// The methods hoist serves (a 405's `Allow`).
    allow: bool,
}

impl Answer {
    pub fn new(status: StatusCode, text: String) -> Self {
        Self {
            status,
            text,
            retry_soon: false,
            allow: false,
        }
    }

    pub fn bad_request(reason: &dyn std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            format!("hoist interceptor: {reason}\n"),
        )
    }

    pub fn connect_refused() -> Self {
        Self {
            allow: true,
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "hoist interceptor: CONNECT is not served\n".to_string(),
            )
        }
    }

    pub fn refusal(error: &UpstreamError) -> Self {
        let status = match error {
            UpstreamError::ColdStartTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            UpstreamError::Denied { .. } => StatusCode::BAD_GATEWAY,
            UpstreamError::TooManyHeld { .. }
            | UpstreamError::ShuttingDown { .. }
            | UpstreamError::Moved { .. }
            | UpstreamError::Removed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self {
            retry_soon: matches!(
                error,
                UpstreamError::ShuttingDown { .. } | UpstreamError::Moved { .. }
            ),
            ..Self::new(status, format!("hoist interceptor: {error}\n"))
        }
    }

    /// The app's connection failed; `cause` is logged, not sent.
    pub fn upstream_failure(route: &str, cause: &dyn std::fmt::Display) -> Self {
        debug!(route, error = %cause, "upstream failed");
        Self::new(
            StatusCode::BAD_GATEWAY,
            format!("hoist interceptor: route `{route}`: the app's connection failed\n"),
        )
    }

    pub fn too_slow(route: &str, timeout: Duration) -> Self {
        debug!(route, ?timeout, "the app did not answer in time");
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "hoist interceptor: route `{route}`: the app did not answer within {} (response_timeout)\n",
                humantime::format_duration(timeout)
            ),
        )
    }

    pub fn response(self) -> Response<ProxyBody> {
        let mut response = Response::new(
            Full::new(Bytes::from(self.text))
                .map_err(|never| match never {})
                .boxed(),
        );
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT));
        if self.retry_soon {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.allow {
            headers.insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        }
        response
    }

    /// The same answer as an HTTP/1.1 message, for the direct path; to a
    /// `HEAD` request without its body (the client reads none).
    pub fn write_http1(&self, out: &mut Vec<u8>, close: bool, head: bool) {
        use std::io::Write;
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-type: {TEXT}\r\ncontent-length: {}\r\n",
            self.status.as_str(),
            self.status.canonical_reason().unwrap_or(""),
            self.text.len()
        );
        if self.retry_soon {
            out.extend_from_slice(b"retry-after: 1\r\n");
        }
        if self.allow {
            let _ = write!(out, "allow: {ALLOW}\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        response_head::write_date(out);
        out.extend_from_slice(b"\r\n");
        if !head {
            out.extend_from_slice(self.text.as_bytes());
        }
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";
