//! Accepting connections, the same way for every listener hoist runs.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

/// How long to pause after a failed accept (out of file descriptors and
/// the like): long enough not to spin, short enough not to be noticed.
const PAUSE_AFTER_ERROR: Duration = Duration::from_millis(50);

/// The next connection, with Nagle's algorithm off: hoist's replies are
/// small and must not wait for the peer's delayed ACK (up to 40 ms).
/// Failed accepts are logged and retried after a pause. Cancel-safe.
pub async fn accept(listener: &TcpListener, what: &str) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(error) => {
                warn!(listener = what, %error, "cannot accept a connection");
                tokio::time::sleep(PAUSE_AFTER_ERROR).await;
            }
        }
    }
}
