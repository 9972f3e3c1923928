//! The one host a request is for, read from `Host`, an absolute-form
//! target or HTTP/2's `:authority`.
//!
//! Who sends it: any client of the proxy. hoist routes by the host and
//! the app builds links, redirects and cache keys from what it receives;
//! if the two read one value differently (`app.example:@evil.example` is
//! routed as `app.example` by what precedes a `:`, and read as host
//! `evil.example` by every URL parser) a client chooses the links another
//! user gets. So a value is a host (RFC 3986 §3.2.2: a reg-name, an IPv4
//! address or a bracketed IPv6 one) and an optional port of digits, and
//! nothing else: no userinfo, no second `:`, no character outside that
//! grammar. The app receives the host hoist routed by, normalised.

use std::fmt::Write as _;

/// A host and port as hoist routes by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authority<'a> {
    /// As sent (any case), without the port; empty when none was sent.
    pub host: &'a str,
    pub port: Option<u16>,
}

/// Why a value is not one host (the answer is a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host carries userinfo (`@`)")]
    Userinfo,
    #[error("the host's port is not a port number")]
    Port,
    #[error("the host has a character outside RFC 3986's host grammar")]
    Character,
    #[error("the host's IPv6 address is malformed")]
    Ipv6,
}

impl<'a> Authority<'a> {
    /// Reads `value` as `host[:port]`.
    pub fn parse(value: &'a [u8]) -> Result<Self, HostError> {
        Self::parse_plain(value).unwrap_or_else(|| Self::parse_any(value))
    }

    /// Any value, each fault named.
    fn parse_any(value: &'a [u8]) -> Result<Self, HostError> {
        if value.contains(&b'@') {
            return Err(HostError::Userinfo);
        }
        let text = std::str::from_utf8(value).map_err(|_| HostError::Character)?;
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (address, after) = rest.split_once(']').ok_or(HostError::Ipv6)?;
            // A zone (`%25eth0`) names an interface of the client's: no
            // route can mean it.
            address
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| HostError::Ipv6)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or(HostError::Port)?),
            };
            (&text[..address.len() + 2], port)
        } else {
            let (host, port) = match text.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            };
            if !reg_name(host.as_bytes()) {
                return Err(HostError::Character);
            }
            (host, port)
        };
        Ok(Self {
            host,
            port: match port {
                // `host:` is allowed by the grammar: no port.
                None | Some("") => None,
                Some(digits) => Some(port_number(digits)?),
            },
        })
    }

    /// The shape nearly every request has, `name[:port]` of unreserved
    /// and sub-delim bytes, read in one pass; `None` for anything else
    /// (percent-encoding, brackets, a byte outside the grammar), which
    /// `parse` reads the long way and names the fault of.
    fn parse_plain(value: &'a [u8]) -> Option<Result<Self, HostError>> {
        let mut colon = None;
        for (at, &byte) in value.iter().enumerate() {
            let fits = match colon {
                None if byte == b':' => {
                    colon = Some(at);
                    true
                }
                None => unreserved_or_sub_delim(byte),
                Some(_) => byte.is_ascii_digit(),
            };
            if !fits {
                return None;
            }
        }
        let (host, port) = match colon {
            Some(at) => (&value[..at], &value[at + 1..]),
            None => (value, &[][..]),
        };
        // Every byte is ASCII: neither can fail.
        let host = std::str::from_utf8(host).ok()?;
        let port = match port {
            [] => None,
            digits => match port_number(std::str::from_utf8(digits).ok()?) {
                Ok(port) => Some(port),
                Err(error) => return Some(Err(error)),
            },
        };
        Some(Ok(Self { host, port }))
    }

    /// Lower-case host without the trailing dot of a fully qualified
    /// name (routes match it either way), and the port as a number: what
    /// the app receives as `Host` and `X-Forwarded-Host`.
    pub fn write_normalised(&self, out: &mut Vec<u8>) {
        let host = self.host.strip_suffix('.').unwrap_or(self.host);
        out.extend(host.bytes().map(|b| b.to_ascii_lowercase()));
        if let Some(port) = self.port {
            out.push(b':');
            let mut digits = String::with_capacity(5);
            let _ = write!(digits, "{port}");
            out.extend_from_slice(digits.as_bytes());
        }
    }

    pub fn normalised(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.host.len() + 6);
        self.write_normalised(&mut out);
        out
    }
}

fn port_number(digits: &str) -> Result<u16, HostError> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostError::Port);
    }
    digits.parse().map_err(|_| HostError::Port)
}

/// RFC 3986 `reg-name`: unreserved, sub-delims and percent-encoded
/// octets (an IPv4 address is one too).
fn reg_name(host: &[u8]) -> bool {
    let mut rest = host;
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        let allowed = unreserved_or_sub_delim(byte);
        if allowed {
            continue;
        }
        if byte != b'%' {
            return false;
        }
        match rest {
            [a, b, tail @ ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => rest = tail,
            _ => return false,
        }
    }
    true
}

/// RFC 3986's unreserved characters and sub-delims: what a host name may
/// hold as it is, and most of what a request target may.
pub(super) fn unreserved_or_sub_delim(byte: u8) -> bool {
    UNRESERVED_OR_SUB_DELIM[usize::from(byte)]
}

/// A table, as every request's host and target go through it byte by byte.
static UNRESERVED_OR_SUB_DELIM: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        byte += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(value: &str) -> Result<(String, Option<u16>), HostError> {
        Authority::parse(value.as_bytes()).map(|a| (a.host.to_string(), a.port))
    }

    #[test]
    fn a_host_and_a_port_of_digits_are_one_host() {
        assert_eq!(
            parsed("Web.Example:8080"),
            Ok(("Web.Example".into(), Some(8080)))
        );
        assert_eq!(parsed("web.example"), Ok(("web.example".into(), None)));
        assert_eq!(parsed("web.example:"), Ok(("web.example".into(), None)));
        assert_eq!(parsed("10.0.0.1:80"), Ok(("10.0.0.1".into(), Some(80))));
        assert_eq!(parsed("[::1]:8080"), Ok(("[::1]".into(), Some(8080))));
        assert_eq!(parsed("[::1]"), Ok(("[::1]".into(), None)));
        assert_eq!(parsed(""), Ok(("".into(), None)));
        let normalised = Authority::parse(b"Web.EXAMPLE.:0080").unwrap().normalised();
        assert_eq!(normalised, b"web.example:80");
    }

    #[test]
    fn the_one_pass_reading_agrees_with_the_long_one() {
        let mut values: Vec<String> = [
            "web.example",
            "Web.Example:8080",
            "web.example:",
            "10.0.0.1:80",
            "",
            ":",
            ":80",
            "a:65535",
            "a:65536",
            "a:99999",
            "a:000080",
            "a:0080",
            "a:0",
            "a:8a",
            "a:80:90",
            "a:+80",
            "a@b",
            "a%41",
            "[::1]:80",
            "a b",
            "a/b",
            "~!$&'()*+,;=-._",
        ]
        .iter()
        .map(|value| value.to_string())
        .collect();
        // Every byte, alone and around a colon.
        for byte in 0..=127u8 {
            let c = char::from(byte);
            values.extend([format!("a{c}b"), format!("a:{c}"), format!("{c}:8")]);
        }
        for value in values {
            if let Some(plain) = Authority::parse_plain(value.as_bytes()) {
                assert_eq!(plain, Authority::parse_any(value.as_bytes()), "{value:?}");
            }
        }
        // The common shapes take the one pass.
        for value in ["web.example", "web.example:8080", "10.0.0.1:80"] {
            assert!(
                Authority::parse_plain(value.as_bytes()).is_some(),
                "{value}"
            );
        }
    }

    #[test]
    fn anything_a_url_parser_reads_as_another_host_is_refused() {
        for (value, error) in [
            ("app.example:@evil.example", HostError::Userinfo),
            ("app.example:80@evil.example", HostError::Userinfo),
            ("user:pass@app.example", HostError::Userinfo),
            ("app.example:80x", HostError::Port),
            ("app.example:80:90", HostError::Port),
            ("app.example:65536", HostError::Port),
            ("app.example:+80", HostError::Port),
            ("app.example/evil", HostError::Character),
            ("app.example\\evil", HostError::Character),
            ("app.example#x", HostError::Character),
            ("app.example?x", HostError::Character),
            ("app example", HostError::Character),
            ("app.example%zz", HostError::Character),
            ("[::1", HostError::Ipv6),
            ("[::1]x", HostError::Port),
            ("[evil.example]", HostError::Ipv6),
            ("[fe80::1%25eth0]", HostError::Ipv6),
        ] {
            assert_eq!(parsed(value), Err(error), "{value}");
        }
    }
}
