//! An upstream connection with hyper's HTTP/1.1 client on it: what
//! hyper's path sends requests on, and what it leaves in the idle pool.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A connection with hyper's HTTP/1.1 client on it.
pub struct Http1Connection {
    pub(super) sender: SendRequest<Incoming>,
    /// `None` once hyper says the connection is over: a finished future
    /// must not be polled again.
    pub(super) driver: Option<Connection<TokioIo<TcpStream>, Incoming>>,
}

impl Http1Connection {
    /// hyper's client on `stream` (no I/O).
    pub(super) async fn handshake(stream: TcpStream) -> Result<Self, hyper::Error> {
        let (sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        Ok(Self {
            sender,
            driver: Some(driver),
        })
    }

    /// Moves the connection along (writes, reads, state changes); false
    /// once it has closed.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = self.driver.as_mut() else {
            return false;
        };
        match Pin::new(driver).poll(cx) {
            Poll::Pending => true,
            Poll::Ready(_) => {
                self.driver = None;
                false
            }
        }
    }

    /// The socket again, with nothing of hyper's on it; `None` when hyper
    /// holds bytes the app sent after the message.
    pub fn into_socket(mut self) -> Option<TcpStream> {
        let parts = self.driver.take()?.into_parts();
        parts.read_buf.is_empty().then(|| parts.io.into_inner())
    }

    /// Open, between messages, and ready to take the next request.
    pub fn reusable(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx) && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }
}
