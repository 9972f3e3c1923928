//! hyper's path: a client connection hyper serves (from its first
//! request, or from the first one the direct path did not take), each
//! request planned as on the direct path (`plan`) and forwarded through
//! hyper's client, upgrades tunnelled.

use std::borrow::Cow;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;
use tracing::debug;

use super::answer::Answer;
use super::http1_client::SendError;
use super::peer::{Peer, forwarded_headers};
use super::plan::{Head, Plan, Routed, plan};
use super::replay::Replay;
use super::route::HttpRoute;
use super::stream_deadline::StreamDeadlines;
use super::{BoxError, ClientConnection, ClientLimits, HEADER_READ_TIMEOUT, ProxyBody, fields};
use crate::interceptor::Routes;
use crate::interceptor::counters::InFlight;
use crate::interceptor::upstream::UpstreamError;

pub(super) type ServerBuilder = hyper_util::server::conn::auto::Builder<TokioExecutor>;

/// Serves a client connection with hyper; `already_read` is what the
/// direct path read of it (hyper reads it first).
pub(super) async fn serve_with_hyper(client: ClientConnection, already_read: BytesMut) {
    let ClientConnection {
        stream,
        activity,
        peer,
        address,
        routes,
        hyper,
        send_timeout,
        watcher,
        ..
    } = client;
    let send_timeouts = routes.send_timeouts();
    // The socket's write deadline does not see an HTTP/2 stream the
    // client gives no window (see `stream_deadline`).
    let streams = StreamDeadlines::new(send_timeout);
    let watched = streams.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (routes, peer, watched) = (routes.clone(), peer.clone(), watched.clone());
        let open = activity.request();
        let http2 = request.version() == Version::HTTP_2;
        async move {
            let response = proxy(&routes, &peer, request).await;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                open.upgraded();
            }
            let response = response.map(|body| Keeping { body, _kept: open }.boxed());
            Ok::<_, Infallible>(if http2 {
                response.map(|body| watched.watch(body).boxed())
            } else {
                response
            })
        }
    });
    let connection = hyper
        .serve_connection_with_upgrades(TokioIo::new(Replay::new(already_read, stream)), service)
        .into_owned();
    let ended = tokio::select! {
        ended = watcher.watch(connection) => ended,
        () = streams.stalled() => {
            send_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            debug!(peer = %address, "an HTTP/2 client took nothing for send_timeout; closing");
            Ok(())
        }
    };
    if let Err(error) = ended {
        debug!(%error, peer = %address, "client connection ended with an error");
    }
}

pub(super) fn server_builder(limits: &ClientLimits) -> ServerBuilder {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client gets this long to send a request's headers (slow-loris),
    // and this many bytes for them (hyper answers 431 past it).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(limits.max_header_bytes);
    // A peer that stops answering pings (gone node, half-open connection)
    // is dropped with its streams.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keepalive_interval)
        .keep_alive_timeout(limits.http2_keepalive_timeout)
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

async fn proxy(
    routes: &Routes,
    peer: &Peer,
    mut request: Request<Incoming>,
) -> Response<ProxyBody> {
    let current = routes.current();
    let plan = plan(
        Head::of_request(&request),
        peer.allow_encoded_slashes,
        &current.http,
    );
    let forward = match plan {
        Plan::Answer(answer) => return answer.response(),
        Plan::Routed(routed) => Forward::of(routed),
    };
    let route = forward.route.clone();
    let now = Instant::now();
    let in_flight = route.counters.start(now);
    let client_version = request.version();
    let upgrade = upgrade_protocol(request.headers());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let request = match upstream_request(request, forward, upgrade.as_ref(), peer) {
        Ok(request) => request,
        Err(answer) => return answer.response(),
    };

    // Held here, each request on its own deadline and under the cap, while
    // the upstream is at zero; connecting waits the same way for the rest.
    let deadline = route.upstream.deadline(now);
    if let Err(error) = route.upstream.admit(now, deadline).await {
        return route.counted_refusal(Answer::refusal(&error));
    }
    let mut response = match (&route.h2c, client_upgrade.is_some()) {
        (None, false) => {
            return match route.http1.send(request, deadline).await {
                Ok(response) => answered(&route, response, client_version, in_flight),
                Err(error) => not_answered(&route, error),
            };
        }
        (None, true) => match route.http1.send_upgrade(request, deadline).await {
            Ok(response) => response,
            Err(error) => return not_answered(&route, error),
        },
        (Some(h2c), _) => {
            // Here the clock also runs while the connector holds a request
            // through a cold start that began after `admit`: rare, and
            // bounded either way.
            match tokio::time::timeout(route.response_timeout, h2c.request(request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => {
                    return route.counted_refusal(client_failure(&route.name, &error));
                }
                Err(_) => {
                    return route
                        .counted_refusal(Answer::too_slow(&route.name, route.response_timeout));
                }
            }
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        let route_name = route.name.clone();
        tokio::spawn(async move {
            tunnel(client_upgrade, upstream_upgrade, &route_name).await;
            drop(in_flight);
        });
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, empty());
    }

    answered(&route, response, client_version, in_flight)
}

/// What the plan decided, owned: the request is taken apart next.
struct Forward {
    route: Arc<HttpRoute>,
    /// The normalised path, when it differs from the target's.
    rewritten: Option<String>,
    /// The normalised host, unless the request named none (HTTP/1.0).
    host: Option<HeaderValue>,
}

impl Forward {
    fn of(routed: Routed<'_>) -> Self {
        let authority = routed.authority;
        Self {
            route: routed.route,
            rewritten: match routed.path {
                Cow::Owned(path) => Some(path),
                Cow::Borrowed(_) => None,
            },
            host: (!authority.host.is_empty())
                .then(|| HeaderValue::from_bytes(&authority.normalised()).ok())
                .flatten(),
        }
    }
}

/// The request as the app gets it: the normalised target and host, this
/// hop's fields gone, hoist's forwarding fields, the upstream's version.
fn upstream_request(
    request: Request<Incoming>,
    forward: Forward,
    upgrade: Option<&HeaderValue>,
    peer: &Peer,
) -> Result<Request<Incoming>, Answer> {
    let route = &forward.route;
    let (mut parts, body) = request.into_parts();
    let client_version = parts.version;
    // The app gets the host hoist routed by, normalised: an HTTP/2
    // client may name it in `:authority` only, and an HTTP/1.1
    // absolute-form target replaces `Host` (RFC 9112 §3.2.2).
    if let Some(value) = &forward.host {
        parts.headers.insert(header::HOST, value.clone());
    }
    parts.uri = upstream_target(std::mem::take(&mut parts.uri), route, forward.rewritten)?;
    fields::strip_hop_by_hop(&mut parts.headers, upgrade);
    if route.upstream_http2 {
        // HTTP/2 carries the host as `:authority` (the route's host).
        parts.version = Version::HTTP_2;
        parts.headers.remove(header::HOST);
    } else {
        parts.version = Version::HTTP_11;
        if client_version == Version::HTTP_2 {
            join_cookies(&mut parts.headers);
        }
    }
    forwarded_headers(&mut parts.headers, peer, forward.host);
    Ok(Request::from_parts(parts, body))
}

/// The target the app gets: the normalised path with the query as sent,
/// in the form the route's client writes.
fn upstream_target(uri: Uri, route: &HttpRoute, rewritten: Option<String>) -> Result<Uri, Answer> {
    let mut uri = uri.into_parts();
    if let Some(path) = rewritten {
        let query = uri.path_and_query.as_ref().and_then(|pq| pq.query());
        let target = match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        uri.path_and_query = PathAndQuery::try_from(target).ok();
    }
    if route.upstream_http2 {
        // hyper-util's client wants the absolute form; it sends
        // `:authority`.
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = route.authority.clone();
    } else {
        // Written as is on the connection: an HTTP/1.1 origin server gets
        // the origin form (`/path?query`), as from any client.
        uri.scheme = None;
        uri.authority = None;
    }
    if uri.path_and_query.is_none() {
        uri.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    Uri::from_parts(uri).map_err(|_| {
        Answer::new(
            StatusCode::BAD_REQUEST,
            "hoist interceptor: the request target cannot be forwarded\n".to_string(),
        )
    })
}

/// The app's response on its way to the client: its hop-by-hop fields
/// stay behind, and the request stays in flight until its body ends.
fn answered<B>(
    route: &HttpRoute,
    mut response: Response<B>,
    client_version: Version,
    in_flight: InFlight,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
{
    route.upstream.reached();
    *response.version_mut() = client_version;
    fields::strip_hop_by_hop(response.headers_mut(), None);
    response.map(|body| counted(body, in_flight))
}

/// hoist's answer when the app's did not come.
fn not_answered(route: &HttpRoute, error: SendError) -> Response<ProxyBody> {
    match error {
        SendError::Upstream(error) => route.counted_refusal(Answer::refusal(&error)),
        // The client's own request body failed (it left mid-upload).
        SendError::Http(error) if error.is_user() => {
            debug!(route = %route.name, %error, "the client's request failed");
            Answer::new(
                StatusCode::BAD_REQUEST,
                "hoist interceptor: the request's body could not be read\n".to_string(),
            )
            .response()
        }
        SendError::Http(error) => {
            route.counted_refusal(Answer::upstream_failure(&route.name, &cause_of(&error)))
        }
        SendError::ResponseTimeout(timeout) => {
            route.counted_refusal(Answer::too_slow(&route.name, timeout))
        }
    }
}

fn counted<B>(body: B, in_flight: InFlight) -> ProxyBody
where
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
{
    Keeping {
        body,
        _kept: in_flight,
    }
    .boxed()
}

/// Copies bytes both ways between an upgraded client and upstream
/// connection (WebSocket and other `Upgrade` protocols).
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    route: &str,
) {
    match tokio::try_join!(client, upstream) {
        Ok((client, upstream)) => {
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                debug!(route, %error, "upgraded connection ended with an error");
            }
        }
        Err(error) => debug!(route, %error, "upgrade failed"),
    }
}

fn client_failure(route: &str, error: &hyper_util::client::legacy::Error) -> Answer {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(upstream) = current.downcast_ref::<UpstreamError>() {
            return Answer::refusal(upstream);
        }
        source = current.source();
    }
    Answer::upstream_failure(route, &cause_of(error))
}

/// The innermost cause of an error (what a log line wants).
fn cause_of(error: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(std::error::Error::source(error), |e| e.source())
        .last()
        .map_or_else(|| error.to_string(), ToString::to_string)
}

/// An HTTP/2 client may split `Cookie` into several fields; HTTP/1.1
/// servers expect one (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    let cookies: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    if cookies.len() > 1
        && let Ok(joined) = HeaderValue::from_str(&cookies.join("; "))
    {
        headers.insert(header::COOKIE, joined);
    }
}

/// The protocol an HTTP/1.1 request asks to switch to, if any.
fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

fn empty() -> ProxyBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// A response body that keeps something until it is done: its request
/// in flight (counted), or open on its connection (no idle deadline).
struct Keeping<B, G> {
    body: B,
    _kept: G,
}

impl<B, G> Body for Keeping<B, G>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    G: Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http2_cookie_fields_become_one_for_http1() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1"));
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        join_cookies(&mut headers);
        let cookies: Vec<_> = headers.get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);
    }
}
