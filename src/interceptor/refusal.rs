//! The answer to an HTTP client refused at accept (a connection cap met):
//! `503` with `Retry-After`, written before its request is read, then its
//! request drained for a moment, because closing a socket with unread
//! input resets the connection, and a reset can destroy the response
//! before the client reads it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
retry-after: 1\r\n\
content-length: 0\r\n\
connection: close\r\n\r\n";

/// Refused connections being answered at once, at most: past this they are
/// closed unanswered, so that answering a flood never costs more than the
/// caps it met save.
const MAX_ANSWERING: usize = 256;

/// How long one answer may take, draining included.
const ANSWER_FOR: Duration = Duration::from_millis(500);

static ANSWERING: AtomicUsize = AtomicUsize::new(0);

/// Answers `stream` with 503 in the background, or closes it when too many
/// answers are under way.
pub fn refuse(stream: TcpStream) {
    if ANSWERING.fetch_add(1, Ordering::AcqRel) >= MAX_ANSWERING {
        ANSWERING.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(ANSWER_FOR, answer(stream)).await;
        ANSWERING.fetch_sub(1, Ordering::AcqRel);
    });
}

async fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    stream.write_all(RESPONSE).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 4096];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}
