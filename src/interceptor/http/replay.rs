//! A client connection handed to hyper after the direct path read part of
//! it: hyper reads those bytes first, as if it had read them itself.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Replay<T> {
    already_read: BytesMut,
    io: T,
}

impl<T> Replay<T> {
    pub fn new(already_read: BytesMut, io: T) -> Self {
        Self { already_read, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Replay<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.already_read.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let take = buf.remaining().min(self.already_read.len());
        buf.put_slice(&self.already_read[..take]);
        self.already_read.advance(take);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Replay<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn what_was_read_comes_first_then_the_connection() {
        let (mut near, far) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut near, b" world")
            .await
            .unwrap();
        drop(near);
        let mut replay = Replay::new(BytesMut::from(&b"hello"[..]), far);
        let mut all = String::new();
        replay.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }
}
