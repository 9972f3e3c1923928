//! What hoist does with a header field, by its name: the one table both
//! HTTP paths read, for requests and responses.
//!
//! Who sends the fields: any client of the proxy, and the app behind a
//! route. Hop-by-hop fields (RFC 9110 §7.6.1) belong to one connection
//! and stay behind; the forwarding fields say who the client is, so hoist
//! writes its own; `Host` and `Content-Length` are read, not trusted.
//!
//! `_` spellings: CGI and the servers that follow it (Rack, PHP, WSGI and
//! Puma's CVE-2024-45614) read a field as `HTTP_` + its name upper-cased
//! with `-` made `_`, so `X_Forwarded_For` and `X-Forwarded-For` land in
//! one variable, the client's value beside hoist's or in its place. So
//! the `_` spelling of every name here that has a `-` is dropped too, on
//! both paths, whoever the peer is (a trusted proxy passes its clients'
//! fields on). Other names with `_` pass: they fold onto no field hoist
//! vouches for, and a client could send their `-` spelling anyway, so
//! dropping them (nginx's `underscores_in_headers off`) would break apps
//! that use them and protect nothing hoist promises.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// What a field is to hoist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Passes end to end, as sent.
    EndToEnd,
    /// Routed by; the app gets it normalised.
    Host,
    /// The body's length.
    ContentLength,
    /// This hop's options, and the names of more fields that end here.
    Connection,
    /// Belongs to one connection: stays behind.
    HopByHop,
    /// Says who the client is: hoist writes its own.
    Forwarding,
    /// The `_` spelling of a field above whose name has a `-`: stays
    /// behind.
    Alias,
}

impl Role {
    /// Whether a field of this role is dropped on the way through
    /// (forwarding fields are replaced instead, or appended to).
    pub fn stays_behind(self) -> bool {
        matches!(self, Role::Connection | Role::HopByHop | Role::Alias)
    }
}

/// One named field: its role, and whether a request carrying it is left
/// to hyper by the direct path (it asks something of this hop that hyper
/// answers: a transfer coding, an upgrade, `100-continue`, trailers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub role: Role,
    pub hand_over: bool,
}

const fn field(name: &'static str, role: Role, hand_over: bool) -> (&'static str, Class) {
    (name, Class { role, hand_over })
}

/// Every field hoist treats otherwise than passing it on, shortest name
/// first (see `SPANS`).
const FIELDS: [(&str, Class); 18] = [
    field("te", Role::HopByHop, true),
    field("host", Role::Host, false),
    field("expect", Role::EndToEnd, true),
    field("upgrade", Role::HopByHop, true),
    field("trailer", Role::EndToEnd, true),
    field("x-real-ip", Role::Forwarding, false),
    field("forwarded", Role::Forwarding, false),
    field("connection", Role::Connection, false),
    field("keep-alive", Role::HopByHop, false),
    field("content-length", Role::ContentLength, false),
    // Only meaningful beside `Upgrade: h2c` (RFC 7540 §3.2.1), where it
    // carries this connection's settings.
    field("http2-settings", Role::HopByHop, true),
    field("x-forwarded-for", Role::Forwarding, false),
    field("x-forwarded-host", Role::Forwarding, false),
    field("proxy-connection", Role::HopByHop, false),
    field("transfer-encoding", Role::HopByHop, true),
    field("x-forwarded-proto", Role::Forwarding, false),
    field("proxy-authenticate", Role::HopByHop, false),
    field("proxy-authorization", Role::HopByHop, false),
];

const LONGEST: usize = 19;

/// Where the names of each length are in `FIELDS`: most names are ruled
/// out by their length alone, the rest compared with one or two.
const SPANS: [(usize, usize); LONGEST + 1] = {
    let mut spans = [(0, 0); LONGEST + 1];
    let mut index = 0;
    while index < FIELDS.len() {
        let length = FIELDS[index].0.len();
        assert!(length <= LONGEST);
        assert!(index == 0 || FIELDS[index - 1].0.len() <= length, "sorted");
        if spans[length].1 == 0 {
            spans[length].0 = index;
        }
        spans[length].1 = index + 1;
        index += 1;
    }
    spans
};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

const PASSES: Class = Class {
    role: Role::EndToEnd,
    hand_over: false,
};

/// The class of a field named `name`, in any case (a few comparisons, no
/// hashing: both paths ask it of every field).
pub fn classify(name: &str) -> Class {
    if let Some(&(start, end)) = SPANS.get(name.len()) {
        for (known, class) in &FIELDS[start..end] {
            if known.eq_ignore_ascii_case(name) {
                return *class;
            }
        }
    }
    if is_alias(name) {
        return Class {
            role: Role::Alias,
            hand_over: false,
        };
    }
    PASSES
}

/// Whether `name` is a `-` name of `FIELDS` (not passed end to end)
/// spelled with `_` for some `-`, in any case.
fn is_alias(name: &str) -> bool {
    // Most names have no `_`: one scan, nothing compared.
    if !name.as_bytes().contains(&b'_') {
        return false;
    }
    FIELDS.iter().any(|(known, class)| {
        class.role != Role::EndToEnd
            && known.len() == name.len()
            && known.contains('-')
            && known.bytes().zip(name.bytes()).all(|(want, got)| {
                want == if got == b'_' {
                    b'-'
                } else {
                    got.to_ascii_lowercase()
                }
            })
    })
}

/// Drops the fields of a message (hyper's path, both ways) that stay
/// behind, and those its `Connection` names; keeps what an upgrade needs
/// and `TE: trailers` (gRPC). `Trailer` is end to end: HTTP/1.1 only
/// sends the trailers it declares.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: Option<&HeaderValue>) {
    // Most messages carry none of them: one pass over the few names the
    // message has, nothing collected.
    let mut staying: Vec<HeaderName> = headers
        .keys()
        .filter(|name| classify(name.as_str()).role.stays_behind())
        .cloned()
        .collect();
    if staying.is_empty() && upgrade.is_none() {
        return;
    }
    let named_from = staying.len();
    staying.extend(
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok()),
    );
    // A `TE` the client's `Connection` names is not passed on either.
    let trailers = !staying[named_from..].contains(&header::TE)
        && headers
            .get(header::TE)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for name in staying {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_known_name_has_its_class() {
        for (name, class) in &FIELDS {
            for spelling in [name.to_string(), name.to_ascii_uppercase()] {
                assert_eq!(classify(&spelling), *class, "{spelling}");
            }
            let alias = name.replace('-', "_");
            let expected = if alias == *name || class.role == Role::EndToEnd {
                // No other spelling, or nothing hoist vouches for.
                classify(name)
            } else {
                Class {
                    role: Role::Alias,
                    hand_over: false,
                }
            };
            if alias != *name {
                assert_eq!(classify(&alias), expected, "{alias}");
            }
        }
    }

    #[test]
    fn underscore_spellings_of_guarded_names_fold_onto_them() {
        for name in [
            "X_Forwarded_For",
            "x_forwarded-for",
            "X_REAL_IP",
            "X_Forwarded_Proto",
            "X_Forwarded_Host",
            "Transfer_Encoding",
            "Content_Length",
            "Keep_Alive",
            "Proxy_Authorization",
            "HTTP2_Settings",
        ] {
            assert_eq!(classify(name).role, Role::Alias, "{name}");
        }
        for name in [
            "X-Request-Id",
            "X_Request_Id",
            "api_key",
            "X_Forwarded_Fo",
            "X__Forwarded_For",
            "a-name-longer-than-sixty-four-bytes-is-nothing-hoist-knows-of-at-all",
        ] {
            assert_eq!(classify(name), PASSES, "{name}");
        }
    }

    #[test]
    fn hop_by_hop_headers_stay_behind_but_upgrades_and_trailers_pass() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::TRAILER, HeaderValue::from_static("x-checksum"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers, Some(&HeaderValue::from_static("websocket")));
        assert!(!headers.contains_key("x-private"));
        assert!(!headers.contains_key("keep-alive"));
        assert!(!headers.contains_key(header::TRANSFER_ENCODING));
        assert_eq!(headers[header::TE], "trailers");
        assert_eq!(headers[header::TRAILER], "x-checksum", "end to end");
        assert_eq!(headers[header::UPGRADE], "websocket");
        assert_eq!(headers[header::CONNECTION], "upgrade");
        assert_eq!(headers["x-kept"], "1");
    }
}
