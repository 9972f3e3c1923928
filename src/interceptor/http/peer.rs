//! The client end of a connection, and the forwarding fields that name
//! it to the app.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::ClientLimits;
use super::fields::{X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_REAL_IP};
use super::request_head::Forwarding;

/// The client end of a connection: how forwarded headers name it, and
/// what it is believed. Built once per connection, not per request.
pub(super) struct Peer {
    /// The address, for `X-Forwarded-For` and `X-Real-IP`.
    pub(super) ip: HeaderValue,
    /// This hop's `Forwarded` element (RFC 7239): `for=…;proto=http`.
    pub(super) forwarded: HeaderValue,
    /// In `interceptor.trusted_proxies`: its forwarded headers are kept.
    pub(super) trusted: bool,
    pub(super) allow_encoded_slashes: bool,
    /// `ip` and `forwarded` as the direct path writes them upstream.
    pub(super) forwarding: Forwarding,
}

impl Peer {
    pub(super) fn new(peer: SocketAddr, limits: &ClientLimits) -> Self {
        let ip_address = peer.ip().to_canonical();
        let address = ip_address.to_string();
        // An IPv6 node is quoted and bracketed (RFC 7239 §6).
        let node = match ip_address {
            std::net::IpAddr::V4(_) => address.clone(),
            std::net::IpAddr::V6(_) => format!("\"[{address}]\""),
        };
        let ip = HeaderValue::from_str(&address).unwrap_or(HeaderValue::from_static("unknown"));
        let forwarded = HeaderValue::from_str(&format!("for={node};proto=http"))
            .unwrap_or(HeaderValue::from_static("for=unknown;proto=http"));
        Self {
            forwarding: Forwarding::new(ip.as_bytes(), forwarded.as_bytes()),
            ip,
            forwarded,
            trusted: crate::config::network_contains(&limits.trusted_proxies, ip_address),
            allow_encoded_slashes: limits.allow_encoded_slashes,
        }
    }
}

/// Sets the headers that tell the app who the client is. Who sends them:
/// any client, so what a client wrote is dropped, unless the peer is a
/// proxy the operator trusts (`interceptor.trusted_proxies`), whose
/// values are kept and to whose lists this hop is appended.
pub(super) fn forwarded_headers(headers: &mut HeaderMap, peer: &Peer, host: Option<HeaderValue>) {
    if !peer.trusted {
        // `insert` replaces every value the client wrote for its name.
        headers.insert(X_FORWARDED_FOR, peer.ip.clone());
        headers.insert(X_REAL_IP, peer.ip.clone());
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        headers.insert(header::FORWARDED, peer.forwarded.clone());
        match host {
            Some(host) => headers.insert(X_FORWARDED_HOST, host),
            None => headers.remove(X_FORWARDED_HOST),
        };
        return;
    }
    append_hop(headers, X_FORWARDED_FOR, &peer.ip);
    append_hop(headers, header::FORWARDED, &peer.forwarded);
    if !headers.contains_key(X_REAL_IP) {
        headers.insert(X_REAL_IP, peer.ip.clone());
    }
    // A proxy in front (TLS termination) knows the original scheme better.
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if let Some(host) = host
        && !headers.contains_key(X_FORWARDED_HOST)
    {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// Appends `hop` to a comma-separated list header (all its fields joined).
fn append_hop(headers: &mut HeaderMap, name: HeaderName, hop: &HeaderValue) {
    let mut joined: Vec<u8> = Vec::new();
    for value in headers.get_all(&name) {
        joined.extend_from_slice(value.as_bytes());
        joined.extend_from_slice(b", ");
    }
    if joined.is_empty() {
        headers.insert(name, hop.clone());
        return;
    }
    joined.extend_from_slice(hop.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_named_per_rfc_7239_and_trusted_by_network() {
        let settings = crate::config::InterceptorSettings {
            trusted_proxies: vec!["10.0.0.0/8".into()],
            ..Default::default()
        };
        let limits = ClientLimits::from(&settings);
        let v6 = Peer::new("[::1]:4000".parse().unwrap(), &limits);
        assert_eq!(v6.forwarded, "for=\"[::1]\";proto=http");
        assert_eq!(v6.ip, "::1");
        assert!(!v6.trusted);
        // A v4 client on a dual-stack listener arrives IPv4-mapped.
        let mapped = Peer::new("[::ffff:10.1.2.3]:4000".parse().unwrap(), &limits);
        assert_eq!(mapped.forwarded, "for=10.1.2.3;proto=http");
        assert!(mapped.trusted);
    }
}
