//! The head of a plain HTTP/1.1 request, checked for the direct path and
//! rewritten for the upstream.
//!
//! Who sends it: any client of the proxy. The direct path takes only the
//! requests whose framing no two readers can disagree on: HTTP/1.1, an
//! origin-form target of plain characters, one `Host`, no
//! `Transfer-Encoding`, at most one `Content-Length` of digits, no
//! `Expect`, `Upgrade`, `TE` or `Connection` option other than `close` and
//! `keep-alive`. Everything else (every request smuggling shape among it)
//! is `Fallback`: hyper reads it from its first byte and answers it as it
//! always did, its checks and its error answers unchanged. So this module
//! never has to refuse anything itself; being unsure is enough.

use std::mem::MaybeUninit;

use super::fields::{self, Role};
use super::host::Authority;

/// Header fields read per message, at most (hyper's default too).
pub const MAX_HEADERS: usize = 100;

/// The longest request target hyper takes (its `MAX_URI_LEN`).
const MAX_TARGET: usize = (u16::MAX - 1) as usize;

pub type HeaderSlots<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

pub fn header_slots<'b>() -> HeaderSlots<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// A request the direct path takes.
#[derive(Debug)]
pub struct RequestHead<'b> {
    pub method: &'b str,
    /// The target's path, as sent (normalised later).
    pub path: &'b str,
    /// The target's query, without its `?`.
    pub query: Option<&'b str>,
    /// The `Host` header's host and port: written upstream normalised
    /// as `Host` and `X-Forwarded-Host`.
    pub authority: Authority<'b>,
    /// The host without its port, any case (for routing).
    pub host: &'b str,
    pub content_length: u64,
    /// The client asked to close the connection after this request.
    pub close: bool,
    /// The head's length in bytes; the body follows.
    pub length: usize,
    /// The fields to forward, in order, as sent.
    pub kept: Kept,
}

/// Which of the request's fields go upstream: a bit per field.
#[derive(Debug, Clone, Copy)]
pub struct Kept(u128);

impl Kept {
    pub fn contains(self, index: usize) -> bool {
        self.0 & (1 << index) != 0
    }
}

#[derive(Debug)]
pub enum Reading<'b> {
    /// More bytes are needed.
    Partial,
    Direct(RequestHead<'b>),
    /// For hyper, from the first byte.
    Fallback,
}

/// Reads a request head at the start of `buf`; `headers` holds its fields
/// for as long as the head is used.
pub fn read<'h, 'b>(
    buf: &'b [u8],
    headers: &'h mut HeaderSlots<'b>,
) -> (Reading<'b>, &'h [httparse::Header<'b>]) {
    let mut request = httparse::Request::new(&mut []);
    let length = match request.parse_with_uninit_headers(buf, headers) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return (Reading::Partial, &[]),
        Err(_) => return (Reading::Fallback, &[]),
    };
    let fields: &'h [httparse::Header<'b>] = request.headers;
    let reading = match check(&request, fields, length) {
        Some(head) => Reading::Direct(head),
        None => Reading::Fallback,
    };
    (reading, fields)
}

fn check<'b>(
    request: &httparse::Request<'_, 'b>,
    fields: &[httparse::Header<'b>],
    length: usize,
) -> Option<RequestHead<'b>> {
    let method = request.method?;
    let target = request.path?;
    if request.version != Some(1) || method == "CONNECT" {
        return None;
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    // Longer targets get hyper's 414.
    if target.len() > MAX_TARGET || !path.starts_with('/') || !target.bytes().all(plain_target_byte)
    {
        return None;
    }
    let mut host_header = None;
    let mut content_length = None;
    let mut close = false;
    let mut kept = 0u128;
    for (index, field) in fields.iter().enumerate() {
        let class = fields::classify(field.name);
        if class.hand_over {
            return None;
        }
        match class.role {
            Role::EndToEnd => kept |= 1 << index,
            Role::HopByHop | Role::Forwarding | Role::Alias => {}
            Role::Host => {
                // Written normalised, not as sent.
                if host_header.replace(field.value).is_some() {
                    return None;
                }
            }
            Role::ContentLength => {
                if content_length.is_some() {
                    return None;
                }
                content_length = Some(digits(field.value)?);
                kept |= 1 << index;
            }
            Role::Connection => {
                for option in field.value.split(|b| *b == b',') {
                    let option = option.trim_ascii();
                    if option.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if !option.eq_ignore_ascii_case(b"keep-alive") && !option.is_empty() {
                        // It names a field to drop, or asks for an upgrade.
                        return None;
                    }
                }
            }
        }
    }
    // Not one host: hyper's path answers 400.
    let authority = Authority::parse(host_header?).ok()?;
    if authority.host.is_empty() {
        return None;
    }
    Some(RequestHead {
        method,
        path,
        query,
        authority,
        host: authority.host,
        content_length: content_length.unwrap_or(0),
        close,
        length,
        kept: Kept(kept),
    })
}

/// A `Content-Length` value: digits only, no sign, no list, no overflow.
pub(super) fn digits(value: &[u8]) -> Option<u64> {
    // Nineteen digits never overflow a u64 (twenty may), so the sum needs
    // no check; read per response, where `str::parse` cost five times this.
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0u64, |sum, byte| {
        byte.is_ascii_digit()
            .then(|| sum * 10 + u64::from(byte - b'0'))
    })
}

/// Bytes of a target the direct path forwards as they are: unreserved,
/// sub-delims, `:`, `@`, `/`, `?` and `%` (RFC 3986). Anything else is
/// hyper's to judge.
fn plain_target_byte(byte: u8) -> bool {
    super::host::unreserved_or_sub_delim(byte) || matches!(byte, b':' | b'@' | b'/' | b'?' | b'%')
}

/// The client end's forwarding fields as written upstream: the same for
/// every request of a connection, so rendered once, with it.
pub struct Forwarding(Vec<u8>);

impl Forwarding {
    /// `X-Forwarded-For` and `X-Real-IP` (`ip`), `X-Forwarded-Proto`,
    /// `Forwarded` (`forwarded`).
    pub fn new(ip: &[u8], forwarded: &[u8]) -> Self {
        let mut lines = Vec::with_capacity(2 * ip.len() + forwarded.len() + 64);
        field_line(&mut lines, b"x-forwarded-for", ip);
        field_line(&mut lines, b"x-real-ip", ip);
        field_line(&mut lines, b"x-forwarded-proto", b"http");
        field_line(&mut lines, b"forwarded", forwarded);
        Self(lines)
    }
}

/// Writes the upstream's request head into `out`: the request line with
/// the normalised path, the kept fields as sent, then hoist's forwarding
/// headers.
pub fn write_upstream_head(
    out: &mut Vec<u8>,
    head: &RequestHead<'_>,
    path: &str,
    fields: &[httparse::Header<'_>],
    forwarding: &Forwarding,
) {
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    if let Some(query) = head.query {
        out.push(b'?');
        out.extend_from_slice(query.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    let host_start = out.len();
    head.authority.write_normalised(out);
    let host = host_start..out.len();
    out.extend_from_slice(b"\r\n");
    for (index, field) in fields.iter().enumerate() {
        if head.kept.contains(index) {
            field_line(out, field.name.as_bytes(), field.value);
        }
    }
    out.extend_from_slice(&forwarding.0);
    out.extend_from_slice(b"x-forwarded-host: ");
    out.extend_from_within(host);
    out.extend_from_slice(b"\r\n\r\n");
}

pub fn field_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(raw: &str) -> Option<(RequestHead<'_>, Vec<(String, String)>)> {
        let mut slots = header_slots();
        let (reading, fields) = read(raw.as_bytes(), &mut slots);
        let fields = fields
            .iter()
            .map(|f| (f.name.to_string(), String::from_utf8_lossy(f.value).into()))
            .collect();
        match reading {
            Reading::Direct(head) => Some((head, fields)),
            _ => None,
        }
    }

    fn goes_to_hyper(raw: &str) -> bool {
        let mut slots = header_slots();
        matches!(read(raw.as_bytes(), &mut slots).0, Reading::Fallback)
    }

    #[test]
    fn a_plain_request_is_taken_and_rewritten() {
        let raw = "GET /a/b?x=1 HTTP/1.1\r\nHost: Web.Example:8080\r\nAccept: */*\r\n\
                   Connection: keep-alive\r\nX-Forwarded-For: 6.6.6.6\r\nKeep-Alive: 5\r\n\r\n";
        let mut slots = header_slots();
        let (reading, fields) = read(raw.as_bytes(), &mut slots);
        let Reading::Direct(head) = reading else {
            panic!("not direct: {reading:?}");
        };
        assert_eq!(head.host, "Web.Example");
        assert_eq!(head.length, raw.len());
        assert!(!head.close);
        let mut out = Vec::new();
        let forwarding = Forwarding::new(b"10.0.0.9", b"for=10.0.0.9;proto=http");
        write_upstream_head(&mut out, &head, "/a/b", fields, &forwarding);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /a/b?x=1 HTTP/1.1\r\nhost: web.example:8080\r\nAccept: */*\r\n\
             x-forwarded-for: 10.0.0.9\r\nx-real-ip: 10.0.0.9\r\nx-forwarded-proto: http\r\n\
             forwarded: for=10.0.0.9;proto=http\r\nx-forwarded-host: web.example:8080\r\n\r\n"
        );
    }

    #[test]
    fn a_head_in_pieces_is_partial() {
        let mut slots = header_slots();
        let (reading, _) = read(b"GET / HTTP/1.1\r\nHost: a\r\n", &mut slots);
        assert!(matches!(reading, Reading::Partial));
    }

    #[test]
    fn a_length_is_digits_only_and_reads_as_the_standard_parser_does() {
        for value in [
            "0",
            "7",
            "007",
            "20",
            "18446744073709551615",
            "9999999999999999999",
            "1000000000000000000",
            "",
            "+1",
            "-1",
            " 1",
            "1 ",
            "1,1",
            "0x10",
            "12a",
            "١",
        ] {
            let standard = (!value.is_empty()
                && value.len() <= 19
                && value.bytes().all(|b| b.is_ascii_digit()))
            .then(|| value.parse::<u64>().unwrap());
            assert_eq!(digits(value.as_bytes()), standard, "{value:?}");
        }
        assert_eq!(
            digits(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(digits(b"18446744073709551615"), None, "twenty digits");
    }

    #[test]
    fn a_body_length_and_close_are_read() {
        let (head, _) =
            direct("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nConnection: close\r\n\r\n")
                .unwrap();
        assert_eq!(head.content_length, 12);
        assert!(head.close);
    }

    #[test]
    fn every_doubtful_framing_goes_to_hyper() {
        for raw in [
            // Smuggling shapes: hyper judges them, as before.
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding : chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: \r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a:@b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a\"b HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a\\b HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: x-secret\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n  folded\r\n\r\n",
        ] {
            assert!(goes_to_hyper(raw), "taken directly: {raw:?}");
        }
    }

    #[test]
    fn the_kept_fields_are_the_end_to_end_ones() {
        let (head, fields) = direct(
            "GET / HTTP/1.1\r\nHost: a\r\nProxy-Authorization: x\r\nX-Real-IP: 1.2.3.4\r\n\
             Forwarded: for=1.2.3.4\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil\r\n\
             Proxy-Connection: keep-alive\r\nCookie: a=1\r\nX_Forwarded_For: 6.6.6.6\r\n\
             Content_Length: 5\r\nTransfer_Encoding: chunked\r\nX_Request_Id: 7\r\n\r\n",
        )
        .unwrap();
        let kept: Vec<&str> = fields
            .iter()
            .enumerate()
            .filter(|(i, _)| head.kept.contains(*i))
            .map(|(_, (name, _))| name.as_str())
            .collect();
        assert_eq!(
            kept,
            ["Cookie", "X_Request_Id"],
            "Host is written normalised; `_` spellings of guarded names stay behind"
        );
    }
}
