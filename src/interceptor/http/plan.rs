//! The routing decision both HTTP paths make about a request, before any
//! I/O: what hoist does not serve at all, the one host, the path, the
//! route. Each path reads its own bytes into a `Head` and carries out the
//! `Plan`; a routing rule added here holds on both.

use std::borrow::Cow;
use std::sync::Arc;

use http::{Request, StatusCode, Version, header};

use super::answer::Answer;
use super::host::Authority;
use super::request_head::RequestHead;
use super::route::{HttpRoute, HttpRouter};
use crate::interceptor::request_path;

/// What the decision reads of a request.
pub struct Head<'a> {
    /// hoist is no forward proxy: a tunnel to a host of the client's
    /// choosing is not for an app to be asked (it would get `CONNECT /`).
    pub connect: bool,
    /// The one host the request is for, or why there is none.
    pub authority: Result<Authority<'a>, String>,
    /// The target's path as sent, without its query.
    pub path: &'a str,
}

pub enum Plan<'a> {
    Routed(Routed<'a>),
    /// hoist answers itself (405, 400, 404), counted nowhere: no route.
    Answer(Answer),
}

pub struct Routed<'a> {
    pub route: Arc<HttpRoute>,
    /// Normalised: routed by, and forwarded with.
    pub path: Cow<'a, str>,
    /// The app gets it normalised as `Host` and `X-Forwarded-Host`.
    pub authority: Authority<'a>,
}

/// Decides where a request goes, or hoist's own answer to it.
pub fn plan<'a>(head: Head<'a>, allow_encoded_slashes: bool, routes: &HttpRouter) -> Plan<'a> {
    if head.connect {
        return Plan::Answer(Answer::connect_refused());
    }
    let authority = match head.authority {
        Ok(authority) => authority,
        Err(reason) => return Plan::Answer(Answer::bad_request(&reason)),
    };
    let path = match request_path::normalize(head.path, allow_encoded_slashes) {
        Ok(path) => path,
        Err(reason) => return Plan::Answer(Answer::bad_request(&reason)),
    };
    match routes.find(authority.host, &path) {
        Some(route) => Plan::Routed(Routed {
            route: route.clone(),
            path,
            authority,
        }),
        None => Plan::Answer(Answer::new(
            StatusCode::NOT_FOUND,
            format!(
                "hoist interceptor: no route for host `{}` and path `{path}`\n",
                authority.host
            ),
        )),
    }
}

impl<'a> Head<'a> {
    /// A request the direct path read (it takes no `CONNECT`).
    pub fn of_direct(head: &RequestHead<'a>) -> Self {
        Self {
            connect: false,
            authority: Ok(head.authority),
            path: head.path,
        }
    }

    /// A request hyper read (any version).
    pub fn of_request<B>(request: &'a Request<B>) -> Self {
        Self {
            connect: request.method() == http::Method::CONNECT,
            authority: request_host(request),
            path: request.uri().path(),
        }
    }
}

/// The host a request is for (see `host`): an HTTP/1.1 absolute-form
/// target's authority, else the one `Host` header, else HTTP/2's
/// `:authority`. Several `Host` headers, or none in HTTP/1.1, is a bad
/// request (RFC 9112 §3.2), and so is any value that is not one host.
fn request_host<B>(request: &Request<B>) -> Result<Authority<'_>, String> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header".to_string());
    }
    let in_target = request
        .uri()
        .authority()
        .map(|authority| Authority::parse(authority.as_str().as_bytes()))
        .transpose()
        .map_err(|error| format!("the request target's authority: {error}"))?;
    let version = request.version();
    if version < Version::HTTP_2
        && let Some(authority) = in_target
    {
        return Ok(authority);
    }
    // A request whose `Host` names another authority than `:authority`
    // is malformed (RFC 9113 §8.3.1): which one a hop routes by, and which
    // one the app believes, would differ.
    if version == Version::HTTP_2
        && let (Some(host), Some(authority)) = (host, request.uri().authority())
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        return Err("the Host header differs from :authority".to_string());
    }
    match host {
        Some(value) => {
            Authority::parse(value.as_bytes()).map_err(|error| format!("the Host header: {error}"))
        }
        None if version == Version::HTTP_11 => Err("no Host header".to_string()),
        None => Ok(in_target.unwrap_or(Authority {
            host: "",
            port: None,
        })),
    }
}
