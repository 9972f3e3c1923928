//! An upstream's response to a request of the direct path: its head
//! checked and rewritten for the client, its body's framing, and chunked
//! bodies framed again.
//!
//! Who sends it: the app behind a route, which the interceptor does not
//! trust to frame its messages well. A response whose length two readers
//! could read differently (two different `Content-Length`s, a transfer
//! coding other than `chunked`, a chunk size that does not parse) is not
//! passed on: 502 before its head, a closed connection after it. Chunked
//! bodies are decoded and encoded again, so chunk extensions and trailers
//! never reach the client, whatever the app wrote.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use super::fields;
use super::request_head::{digits, field_line, header_slots};

/// How the body of a response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: a response to `HEAD`, a 204 or a 304.
    Empty,
    Length(u64),
    Chunked,
    /// Until the app closes the connection (no length given).
    UntilClose,
}

#[derive(Debug)]
pub struct ResponseHead {
    /// The head's length in bytes; the body follows.
    pub length: usize,
    pub framing: Framing,
    /// The app keeps the connection open for another request.
    pub reusable: bool,
    /// The client's connection is closed after this response.
    pub close_client: bool,
}

#[derive(Debug)]
pub enum ResponseReading {
    Partial,
    /// An informational (1xx) response of this many bytes, not passed on
    /// (as hyper's client does); the final one follows.
    Interim(usize),
    /// The client's head is written.
    Final(ResponseHead),
    Bad(&'static str),
}

/// Reads the response head at the start of `buf`; for a final response
/// writes the client's head into `out`.
pub fn read(
    buf: &[u8],
    request_was_head: bool,
    client_close: bool,
    out: &mut Vec<u8>,
) -> ResponseReading {
    // Uninitialised slots: nothing to clear per response, however many
    // fields it may have.
    let mut slots = header_slots();
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut slots,
    );
    let length = match parsed {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return ResponseReading::Partial,
        Err(httparse::Error::TooManyHeaders) => {
            return ResponseReading::Bad("the app sent too many header fields");
        }
        Err(_) => return ResponseReading::Bad("the app's response head does not parse"),
    };
    final_or_interim(&response, length, request_was_head, client_close, out)
}

fn final_or_interim(
    response: &httparse::Response<'_, '_>,
    length: usize,
    request_was_head: bool,
    client_close: bool,
    out: &mut Vec<u8>,
) -> ResponseReading {
    let (Some(status), Some(version)) = (response.code, response.version) else {
        return ResponseReading::Bad("the app's response head does not parse");
    };
    match status {
        0..=99 => return ResponseReading::Bad("the app sent a status below 100"),
        101 => return ResponseReading::Bad("the app switched protocols unasked"),
        100..=199 => return ResponseReading::Interim(length),
        _ => {}
    }
    let fields = &*response.headers;
    let reason = response.reason.unwrap_or("");
    let mut content_length = None;
    let mut chunked = false;
    let mut close = false;
    let mut keep_alive = false;
    // Fields the app's `Connection` names: they end at this hop.
    let mut named: Vec<&[u8]> = Vec::new();
    for field in fields {
        let name = field.name;
        if name.eq_ignore_ascii_case("content-length") {
            let Some(value) = digits(field.value.trim_ascii()) else {
                return ResponseReading::Bad("the app sent an invalid Content-Length");
            };
            if content_length.is_some_and(|known| known != value) {
                return ResponseReading::Bad("the app sent two different Content-Lengths");
            }
            content_length = Some(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked || !field.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return ResponseReading::Bad("the app sent a transfer coding other than chunked");
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for option in field.value.split(|b| *b == b',') {
                let option = option.trim_ascii();
                if option.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                } else if !option.is_empty() {
                    named.push(option);
                }
            }
        }
    }
    if chunked && version == 0 {
        return ResponseReading::Bad("the app sent a chunked HTTP/1.0 response");
    }
    let framing = if request_was_head || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else if let Some(length) = content_length {
        Framing::Length(length)
    } else {
        Framing::UntilClose
    };
    let kept_open = if version == 0 { keep_alive } else { !close };
    // A length given twice over (RFC 9112 §6.3): read as chunked, and the
    // connection not trusted with another message. Nor after a message
    // whose body hoist does not read although the app may send one (to
    // HEAD; a 204 or 304 with a length): a body the app writes late would
    // be read as the answer to the next request on the connection.
    let stray_body_possible = request_was_head
        || ((status == 204 || status == 304) && (content_length.is_some() || chunked));
    let reusable = kept_open
        && framing != Framing::UntilClose
        && !(chunked && content_length.is_some())
        && !stray_body_possible;
    let close_client = client_close || framing == Framing::UntilClose;

    out.extend_from_slice(b"HTTP/1.1 ");
    // httparse reads exactly three digits.
    out.extend_from_slice(&[
        b'0' + (status / 100 % 10) as u8,
        b'0' + (status / 10 % 10) as u8,
        b'0' + (status % 10) as u8,
    ]);
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut wrote_length = false;
    let mut wrote_date = false;
    for field in fields {
        let name = field.name;
        let dropped = if name.eq_ignore_ascii_case("content-length") {
            // The framing the client reads by: never dropped because the
            // app's `Connection` names it; written once.
            chunked || status == 204 || std::mem::replace(&mut wrote_length, true)
        } else {
            fields::classify(name).role.stays_behind()
                || named
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
        };
        if !dropped {
            wrote_date |= name.eq_ignore_ascii_case("date");
            field_line(out, name.as_bytes(), field.value);
        }
    }
    if !wrote_date {
        write_date(out);
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if close_client {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    ResponseReading::Final(ResponseHead {
        length,
        framing,
        reusable,
        close_client,
    })
}

/// A `Date` field for responses that came without one (RFC 9110 §6.6.1),
/// formatted once a second per thread.
pub fn write_date(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            *text = httpdate::fmt_http_date(now);
        }
        field_line(out, b"date", text.as_bytes());
    });
}

/// The longest chunk-size line (with extensions) and trailer section read.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

/// Decodes a chunked body as it arrives and encodes it again for the
/// client: sizes rewritten bare, extensions and trailers left behind.
#[derive(Debug, Default)]
pub struct Rechunker {
    state: ChunkState,
    trailer_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

/// The app's chunked framing is broken.
#[derive(Debug, PartialEq, Eq)]
pub struct BadChunk;

impl Rechunker {
    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Takes what it can of `input`, appending the client's bytes to
    /// `out`; returns how many bytes of `input` it used. What is left is
    /// an incomplete line, to be given again with more bytes after it. On
    /// an error `out` holds what was well framed before it.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, BadChunk> {
        let mut at = 0;
        loop {
            let rest = &input[at..];
            match self.state {
                ChunkState::Done => return Ok(at),
                ChunkState::Size => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        // httparse lets any byte through in an extension;
                        // a bare CR or LF there is a line two readers
                        // would end in different places.
                        let line = &rest[..used];
                        if !line.ends_with(b"\r\n")
                            || line[..used - 2].iter().any(|b| *b == b'\r' || *b == b'\n')
                        {
                            return Err(BadChunk);
                        }
                        at += used;
                        if size == 0 {
                            self.state = ChunkState::Trailers;
                        } else {
                            out.extend_from_slice(format!("{size:x}\r\n").as_bytes());
                            self.state = ChunkState::Data(size);
                        }
                    }
                    Ok(httparse::Status::Partial) if rest.len() <= MAX_CHUNK_LINE => return Ok(at),
                    _ => return Err(BadChunk),
                },
                ChunkState::Data(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    if take == 0 {
                        return Ok(at);
                    }
                    out.extend_from_slice(&rest[..take]);
                    at += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                }
                ChunkState::DataEnd => {
                    if rest.len() < 2 {
                        return Ok(at);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(BadChunk);
                    }
                    at += 2;
                    out.extend_from_slice(b"\r\n");
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => match rest.windows(2).position(|w| w == b"\r\n") {
                    Some(0) => {
                        at += 2;
                        out.extend_from_slice(b"0\r\n\r\n");
                        self.state = ChunkState::Done;
                    }
                    Some(end) => {
                        let line = &rest[..end];
                        if !valid_trailer(line) {
                            return Err(BadChunk);
                        }
                        self.trailer_bytes += end + 2;
                        if self.trailer_bytes > MAX_TRAILERS {
                            return Err(BadChunk);
                        }
                        at += end + 2;
                    }
                    None if self.trailer_bytes + rest.len() <= MAX_TRAILERS => return Ok(at),
                    None => return Err(BadChunk),
                },
            }
        }
    }
}

/// `name: value`, with a token for a name and no bare CR or LF.
fn valid_trailer(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|b| *b == b':') else {
        return false;
    };
    colon > 0
        && line[..colon]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
        && !line.iter().any(|b| *b == b'\r' || *b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn final_head(raw: &str, head_request: bool) -> (ResponseHead, String) {
        let mut out = Vec::new();
        match read(raw.as_bytes(), head_request, false, &mut out) {
            ResponseReading::Final(head) => (head, String::from_utf8(out).unwrap()),
            other => panic!("{other:?}"),
        }
    }

    fn bad(raw: &str) -> bool {
        matches!(
            read(raw.as_bytes(), false, false, &mut Vec::new()),
            ResponseReading::Bad(_)
        )
    }

    #[test]
    fn a_response_with_a_length_is_passed_on_without_its_hop_fields() {
        let raw = "HTTP/1.1 200 OK\r\nDate: x\r\nContent-Length: 5\r\nConnection: keep-alive, x-hop\r\n\
                   X-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-App: 2\r\n\r\nhello";
        let (head, out) = final_head(raw, false);
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.reusable);
        assert_eq!(head.length, raw.len() - "hello".len());
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nDate: x\r\nContent-Length: 5\r\nX-App: 2\r\n\r\n"
        );
    }

    #[test]
    fn framing_follows_rfc_9112_section_6_3() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                true,
                Framing::Empty,
            ),
            ("HTTP/1.1 204 No Content\r\n\r\n", false, Framing::Empty),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                Framing::Empty,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                Framing::Chunked,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, Framing::UntilClose),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
                false,
                Framing::Length(1),
            ),
        ];
        for (raw, head_request, framing) in cases {
            assert_eq!(final_head(raw, head_request).0.framing, framing, "{raw}");
        }
        let (until_close, out) = final_head("HTTP/1.1 200 OK\r\nDate: x\r\n\r\n", false);
        assert!(!until_close.reusable && until_close.close_client);
        assert!(out.ends_with("connection: close\r\n\r\n"));
        // HTTP/1.0 keeps a connection only when it says so.
        assert!(
            !final_head("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false)
                .0
                .reusable
        );
        // Both lengths: chunked wins, the Content-Length is not passed on,
        // the connection is not used again.
        let (both, out) = final_head(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nDate: x\r\n\r\n",
            false,
        );
        assert_eq!(both.framing, Framing::Chunked);
        assert!(!both.reusable);
        assert!(
            !out.to_ascii_lowercase().contains("content-length"),
            "{out}"
        );
        assert!(out.contains("transfer-encoding: chunked\r\n"));
    }

    #[test]
    fn a_connection_that_may_carry_a_late_body_is_not_used_again() {
        for (raw, head_request, reusable) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true, false),
            ("HTTP/1.1 200 OK\r\n\r\n", true, false),
            (
                "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
                false,
                false,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                false,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                false,
            ),
            ("HTTP/1.1 204 No Content\r\n\r\n", false, true),
            ("HTTP/1.1 304 Not Modified\r\n\r\n", false, true),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false, true),
        ] {
            assert_eq!(final_head(raw, head_request).0.reusable, reusable, "{raw}");
        }
    }

    #[test]
    fn the_length_survives_the_apps_connection_option_and_is_written_once() {
        let (head, out) = final_head(
            "HTTP/1.1 200 OK\r\nDate: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\
             Connection: Content-Length, Date\r\n\r\nhello",
            false,
        );
        assert_eq!(head.framing, Framing::Length(5));
        assert_eq!(out.matches("Content-Length: 5").count(), 1, "{out}");
        assert!(!out.contains("Date: x"), "named by Connection: {out}");
        assert!(out.contains("\r\ndate: "), "one of hoist's instead: {out}");
    }

    #[test]
    fn a_date_is_added_when_the_app_sent_none() {
        let (_, out) = final_head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false);
        assert!(out.contains("\r\ndate: "), "{out}");
    }

    #[test]
    fn doubtful_responses_are_refused() {
        assert!(bad(
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
        ));
        assert!(bad("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"));
        assert!(bad(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        ));
        assert!(bad(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(bad("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"));
        assert!(bad(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"
        ));
        assert!(bad("HTTP/1.1 2000 OK\r\n\r\n"));
        assert!(bad("HTTP/1.1 042 Odd\r\nContent-Length: 0\r\n\r\n"));
        // Same length twice is one length.
        assert!(!bad(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n"
        ));
    }

    #[test]
    fn interim_responses_are_skipped() {
        let raw = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n";
        match read(raw, false, false, &mut Vec::new()) {
            ResponseReading::Interim(length) => assert_eq!(&raw[length..length + 8], b"HTTP/1.1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chunks_are_framed_again_without_extensions_or_trailers() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: 1\r\n\r\n";
        // Whole, and one byte at a time: the same bytes come out.
        for step in [body.len(), 1] {
            let mut chunks = Rechunker::default();
            let mut out = Vec::new();
            let mut pending: Vec<u8> = Vec::new();
            for piece in body.chunks(step) {
                pending.extend_from_slice(piece);
                let used = chunks.feed(&pending, &mut out).unwrap();
                pending.drain(..used);
            }
            assert!(chunks.done());
            assert!(pending.is_empty());
            assert_eq!(out, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
        }
    }

    #[test]
    fn broken_chunks_are_refused() {
        for body in [
            &b"5\r\nhelloXX"[..],
            b"zz\r\n",
            b"ffffffffffffffffff\r\n",
            b"0\r\nno colon\r\n\r\n",
            b"0\r\nX: a\rb\r\n\r\n",
            b"5;a=\nb\r\nhello\r\n",
            b"5\n",
        ] {
            let mut chunks = Rechunker::default();
            assert_eq!(
                chunks.feed(body, &mut Vec::new()),
                Err(BadChunk),
                "{body:?}"
            );
        }
        let mut chunks = Rechunker::default();
        let endless = vec![b'a'; MAX_CHUNK_LINE + 10];
        assert_eq!(chunks.feed(&endless, &mut Vec::new()), Err(BadChunk));
    }
}
