//! The direct HTTP/1.1 path's hand-written parsers on bytes alone, for
//! the fuzz targets (`tests/fuzz`) and the seed corpus test below.
//!
//! Each entry point panics when an invariant breaks, which is what a
//! fuzzer reports; any other outcome (taken, handed to hyper, refused) is
//! fine. Not part of hoist's interface.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::plan::Head;
use super::request_head::{self, Forwarding, Reading};
use super::response_head::{self, Framing, Rechunker, ResponseReading};

/// The request head classifier: a head it takes names one host, one
/// length of digits, and is rewritten for the app into a head that
/// parses with that host and no field the client named for this hop.
pub fn request_head(bytes: &[u8]) {
    let mut slots = request_head::header_slots();
    let (reading, fields) = request_head::read(bytes, &mut slots);
    let Reading::Direct(head) = reading else {
        return;
    };
    assert!(head.length <= bytes.len());
    assert!(!head.host.is_empty());
    let mut out = Vec::new();
    let forwarding = Forwarding::new(b"10.0.0.1", b"for=10.0.0.1;proto=http");
    request_head::write_upstream_head(&mut out, &head, head.path, fields, &forwarding);
    let mut written = [httparse::EMPTY_HEADER; request_head::MAX_HEADERS + 8];
    let mut parsed = httparse::Request::new(&mut written);
    let length = match parsed.parse(&out) {
        Ok(httparse::Status::Complete(length)) => length,
        other => panic!("the app's head does not parse: {other:?}"),
    };
    assert_eq!(length, out.len(), "one head, nothing after it");
    assert_eq!(parsed.method, Some(head.method));
    let count = |name: &str| fields_named(parsed.headers, name);
    assert_eq!(count("host"), 1);
    assert!(count("content-length") <= 1);
    for hop in [
        "transfer-encoding",
        "connection",
        "te",
        "upgrade",
        "keep-alive",
    ] {
        assert_eq!(count(hop), 0, "{hop} reached the app");
    }
    for own in [
        "x-forwarded-for",
        "x-real-ip",
        "x-forwarded-proto",
        "x-forwarded-host",
        "forwarded",
    ] {
        assert_eq!(count(own), 1, "{own} is hoist's alone");
    }
    assert!(
        !parsed
            .headers
            .iter()
            .any(|field| super::fields::classify(field.name).role == super::fields::Role::Alias),
        "an underscore spelling reached the app"
    );
}

/// The chunked re-framer: fed in any pieces it frames the same bytes the
/// same way, and what it writes is canonical chunked framing that it
/// takes back unchanged.
pub fn rechunk(bytes: &[u8]) {
    let Some((&piece, input)) = bytes.split_first() else {
        return;
    };
    let whole = feed(input, input.len().max(1));
    let pieces = feed(input, usize::from(piece % 16) + 1);
    assert_eq!(whole, pieces, "pieces of {piece} change the framing");
    if let Ok((out, _, true)) = whole {
        let again = feed(&out, out.len().max(1));
        assert_eq!(again, Ok((out.clone(), out.len(), true)), "not canonical");
    }
}

/// Feeds `input` `piece` bytes at a time, giving back what was not used,
/// as the direct path does: what came out, how much was used, whether
/// the body ended.
fn feed(input: &[u8], piece: usize) -> Result<(Vec<u8>, usize, bool), Vec<u8>> {
    let mut chunks = Rechunker::default();
    let mut out = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut used_total = 0;
    for part in input.chunks(piece) {
        pending.extend_from_slice(part);
        let used = chunks.feed(&pending, &mut out).map_err(|_| out.clone())?;
        used_total += used;
        pending.drain(..used);
        if chunks.done() {
            return Ok((out, used_total, true));
        }
    }
    Ok((out, used_total, chunks.done()))
}

/// The response head parser: a final head it passes on parses again as
/// one response with the same status, one framing, and no hop-by-hop
/// field.
pub fn response_head(bytes: &[u8]) {
    let Some((&flags, input)) = bytes.split_first() else {
        return;
    };
    let (head_request, close) = (flags & 1 == 1, flags & 2 == 2);
    let mut out = Vec::new();
    let head = match response_head::read(input, head_request, close, &mut out) {
        ResponseReading::Final(head) => head,
        ResponseReading::Interim(length) => {
            assert!(length <= input.len());
            return;
        }
        ResponseReading::Partial | ResponseReading::Bad(_) => return,
    };
    assert!(head.length <= input.len());
    let mut fields = [httparse::EMPTY_HEADER; request_head::MAX_HEADERS + 8];
    let mut parsed = httparse::Response::new(&mut fields);
    match parsed.parse(&out) {
        Ok(httparse::Status::Complete(length)) => assert_eq!(length, out.len()),
        other => panic!("the client's head does not parse: {other:?}"),
    }
    let mut original = [httparse::EMPTY_HEADER; request_head::MAX_HEADERS];
    let mut app = httparse::Response::new(&mut original);
    let _ = app.parse(input);
    assert_eq!(parsed.code, app.code);
    let count = |name: &str| fields_named(parsed.headers, name);
    let lengths = count("content-length");
    let chunked = count("transfer-encoding");
    assert!(lengths <= 1 && chunked <= 1 && lengths + chunked <= 1);
    assert_eq!(chunked == 1, head.framing == Framing::Chunked);
    if let Framing::Length(length) = head.framing {
        let value = parsed
            .headers
            .iter()
            .find(|field| field.name.eq_ignore_ascii_case("content-length"))
            .and_then(|field| request_head::digits(field.value.trim_ascii()));
        // The app's digits go on as written (`00` is a length of 0).
        assert_eq!(value, Some(length));
    }
    for hop in ["te", "upgrade", "keep-alive", "proxy-connection"] {
        assert_eq!(count(hop), 0, "{hop} reached the client");
    }
    assert_eq!(count("connection") == 1, head.close_client);
}

/// What hyper's HTTP/1.1 server read of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub target: String,
    /// Lower-case names and values, sorted.
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// What the routing decision (`plan`) reads of it: the same on both
    /// paths, so both route it alike.
    pub plan_reads: String,
}

/// The `Head` that `plan` decides on, as text to compare.
fn plan_reads(head: &Head<'_>) -> String {
    format!("{} {:?} {}", head.connect, head.authority, head.path)
}

/// Differential: a request the direct path takes is read by hyper's
/// HTTP/1.1 server, from the same bytes, as one request with the same
/// method, target, fields and body boundaries. Run it on a tokio runtime
/// (any clock: nothing here waits on time).
pub async fn differential(bytes: &[u8]) {
    let mut slots = request_head::header_slots();
    let (reading, fields) = request_head::read(bytes, &mut slots);
    let Reading::Direct(head) = reading else {
        return;
    };
    // A body not all there is hyper's to stream: nothing to compare.
    let Some(end) = usize::try_from(head.content_length)
        .ok()
        .and_then(|body| head.length.checked_add(body))
        .filter(|end| *end <= bytes.len())
    else {
        return;
    };
    let target = match head.query {
        Some(query) => format!("{}?{query}", head.path),
        None => head.path.to_string(),
    };
    let mut expected_fields: Vec<(String, Vec<u8>)> = fields
        .iter()
        .map(|field| (field.name.to_ascii_lowercase(), field.value.to_vec()))
        .collect();
    expected_fields.sort();
    let expected = Seen {
        method: head.method.to_string(),
        target,
        fields: expected_fields,
        body: bytes[head.length..end].to_vec(),
        plan_reads: plan_reads(&Head::of_direct(&head)),
    };
    let seen = hyper_reads(&bytes[..end]).await;
    match seen.as_slice() {
        [one] => assert_eq!(one, &expected, "hyper read another request"),
        other => panic!("the direct path took one request, hyper read {other:?}"),
    }
}

/// [`differential`] on a runtime of the calling thread's own (the fuzz
/// targets have none).
pub fn differential_blocking(bytes: &[u8]) {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
    }
    RUNTIME.with(|runtime| runtime.block_on(differential(bytes)));
}

/// The requests hyper's HTTP/1.1 server reads from `bytes` (the client
/// then closes its sending side).
async fn hyper_reads(bytes: &[u8]) -> Vec<Seen> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let recorded = recorded.clone();
        async move {
            let plan_reads = plan_reads(&Head::of_request(&request));
            let (parts, body) = request.into_parts();
            let body = body.collect().await?.to_bytes().to_vec();
            let mut fields: Vec<(String, Vec<u8>)> = parts
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
                .collect();
            fields.sort();
            recorded
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Seen {
                    method: parts.method.to_string(),
                    target: parts.uri.to_string(),
                    fields,
                    body,
                    plan_reads,
                });
            Ok::<_, hyper::Error>(hyper::Response::new(Empty::<Bytes>::new()))
        }
    });
    let (mut client, server) = tokio::io::duplex(bytes.len() + 64 * 1024);
    let connection = hyper::server::conn::http1::Builder::new()
        // Reading on after the client's end: every request it sent is read.
        .half_close(true)
        .header_read_timeout(None)
        .serve_connection(hyper_util::rt::TokioIo::new(server), service);
    let client = async move {
        let _ = client.write_all(bytes).await;
        let _ = client.shutdown().await;
        let mut answers = Vec::new();
        let _ = client.read_to_end(&mut answers).await;
    };
    let _ = tokio::join!(connection, client);
    seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// How many of `fields` are named `name` (in any case).
fn fields_named(fields: &[httparse::Header], name: &str) -> usize {
    fields
        .iter()
        .filter(|field| field.name.eq_ignore_ascii_case(name))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed seed of the fuzz targets runs here too, so the
    /// smuggling shapes among them are checked by every test run.
    fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fuzz/corpus")
            .join(target);
        let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| {
                let path = entry.unwrap().path();
                (path.display().to_string(), std::fs::read(&path).unwrap())
            })
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
        seeds
    }

    #[test]
    fn the_seed_corpus_keeps_every_invariant() {
        for (_, seed) in seeds("http1_request_head") {
            request_head(&seed);
        }
        for (_, seed) in seeds("http1_rechunk") {
            rechunk(&seed);
        }
        for (_, seed) in seeds("http1_response_head") {
            response_head(&seed);
        }
    }

    #[test]
    fn the_fuzz_targets_runtime_reads_like_the_tests() {
        differential_blocking(b"GET /a HTTP/1.1\r\nHost: web.test\r\n\r\n");
    }

    #[tokio::test]
    async fn hyper_reads_every_seed_the_direct_path_takes_alike() {
        let mut taken = 0;
        for (name, seed) in seeds("http1_differential") {
            let mut slots = request_head::header_slots();
            if matches!(request_head::read(&seed, &mut slots).0, Reading::Direct(_)) {
                taken += 1;
            }
            eprintln!("{name}");
            differential(&seed).await;
        }
        assert!(taken > 0, "some seeds are direct requests");
    }
}
