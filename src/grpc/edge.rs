//! The gRPC server's edge, a tower layer around every service: it gives
//! requests tonic cannot decode the codes a client can act on, and ends
//! health `Watch` streams when hoist shuts down (tonic-health never ends
//! them, which held shutdown for the whole grace period).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;

const WATCH: &str = "/grpc.health.v1.Health/Watch";

#[derive(Clone)]
pub struct EdgeLayer {
    shutdown: CancellationToken,
}

impl EdgeLayer {
    /// `shutdown`: when health `Watch` streams end.
    pub fn new(shutdown: CancellationToken) -> Self {
        Self { shutdown }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Edge {
            inner,
            shutdown: self.shutdown.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Edge<S> {
    inner: S,
    shutdown: CancellationToken,
}

impl<S, B> tower::Service<Request<Body>> for Edge<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let watch = request.uri().path() == WATCH;
        let shutdown = self.shutdown.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            recode(response.headers_mut());
            Ok(if watch {
                response.map(|body| {
                    Body::new(EndsAtShutdown {
                        body,
                        shutdown: Box::pin(shutdown.cancelled_owned()),
                        ended: false,
                    })
                })
            } else {
                response.map(Body::new)
            })
        })
    }
}

/// tonic answers a request it cannot decode with INTERNAL (bad protobuf,
/// invalid UTF-8) or OUT_OF_RANGE (past the size limit): the client's
/// fault, and its own to fix, so INVALID_ARGUMENT and RESOURCE_EXHAUSTED.
/// hoist itself never answers with either code, and these statuses are
/// always trailers-only (in the headers).
fn recode(headers: &mut HeaderMap) {
    let code = match headers.get("grpc-status").map(HeaderValue::as_bytes) {
        Some(b"13") => "3",
        Some(b"11") => "8",
        _ => return,
    };
    let message = headers
        .get("grpc-message")
        .map(|value| percent_encoding::percent_decode(value.as_bytes()).decode_utf8_lossy())
        .unwrap_or_default();
    let decoding = message.starts_with("failed to decode Protobuf message")
        || message.starts_with("Error, decoded message length too large");
    if decoding {
        headers.insert("grpc-status", HeaderValue::from_static(code));
    }
}

/// A response body that ends (status OK) once hoist shuts down, after
/// whatever the stream had ready (the NOT_SERVING update).
struct EndsAtShutdown<B> {
    body: B,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    ended: bool,
}

impl<B> HttpBody for EndsAtShutdown<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        match self.shutdown.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.ended = true;
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: &'static str, message: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static(code));
        headers.insert("grpc-message", HeaderValue::from_static(message));
        recode(&mut headers);
        headers
    }

    #[test]
    fn decoding_failures_become_the_clients_codes() {
        let bad = status(
            "13",
            "failed%20to%20decode%20Protobuf%20message:%20invalid%20string",
        );
        assert_eq!(bad["grpc-status"], "3");
        let large = status(
            "11",
            "Error,%20decoded%20message%20length%20too%20large:%20found%201",
        );
        assert_eq!(large["grpc-status"], "8");
        assert_eq!(status("13", "something else")["grpc-status"], "13");
        assert_eq!(status("14", "failed to decode")["grpc-status"], "14");
    }
}
