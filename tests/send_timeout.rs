//! `interceptor.send_timeout` against clients that ask for a large answer
//! and read none of it, their receive buffer shrunk to 4 KiB (the kernel
//! still takes megabytes into hoist's send buffer first): on the direct
//! HTTP/1.1 path, hyper's HTTP/1.1 path and h2c, each is let go, counted,
//! and its place in the route's in-flight count given back.
//!
//! Real sockets need real time: the timeout is short and only behaviour
//! is asserted (let go, counted, cut short), never how fast.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::web::{Upstream, full, http_route, proxying};
use support::{Hoist, eventually};

const PATIENCE: Duration = Duration::from_secs(20);
const ANSWER: usize = 8 << 20;
const CLIENTS: u64 = 10;

/// A client socket whose receive buffer is 4 KiB (set before connecting,
/// so the window it offers is small from the start).
fn small_buffer_client(proxy: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&proxy.into()).unwrap();
    socket.set_nonblocking(true).unwrap();
    TcpStream::from_std(socket.into()).unwrap()
}

/// Waits until every client so far was let go: counted, none in flight.
async fn all_let_go(hoist: &Hoist, expected: u64, shape: &str) {
    eventually(
        PATIENCE,
        &format!("{shape}: {expected} send timeouts"),
        || async { hoist.send_timeouts().await >= expected },
    )
    .await;
    eventually(
        PATIENCE,
        &format!("{shape}: no request in flight"),
        || async { hoist.in_flight("web").await == 0 },
    )
    .await;
    assert_eq!(
        hoist.send_timeouts().await,
        expected,
        "{shape}: one per client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_nothing_are_let_go_on_every_path() {
    let answer = Bytes::from(vec![b'a'; ANSWER]);
    let app = Upstream::start(move |_| {
        let answer = answer.clone();
        async move { http::Response::new(full(answer)) }
    })
    .await;
    let mut settings = proxying(vec![http_route("web", "web.test", app.addr)]);
    settings.interceptor.send_timeout = Duration::from_millis(300);
    settings.interceptor.idle_timeout = Duration::from_millis(300);
    let hoist = Hoist::start_with(settings).await;
    let proxy = hoist.http_proxy.unwrap();

    // `TE: trailers` sends a request to hyper's path.
    let mut expected = 0;
    for (shape, request) in [
        ("direct", "GET / HTTP/1.1\r\nHost: web.test\r\n\r\n"),
        (
            "hyper HTTP/1.1",
            "GET / HTTP/1.1\r\nHost: web.test\r\nTE: trailers\r\n\r\n",
        ),
    ] {
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let mut client = small_buffer_client(proxy);
            client.write_all(request.as_bytes()).await.unwrap();
            clients.push(client);
        }
        expected += CLIENTS;
        all_let_go(&hoist, expected, shape).await;
        // What was buffered, then the end: hoist closed them.
        for mut client in clients {
            let mut sink = Vec::new();
            let ended = tokio::time::timeout(PATIENCE, client.read_to_end(&mut sink)).await;
            assert!(ended.is_ok(), "{shape}: the connection is closed");
            assert!(sink.len() < ANSWER, "{shape}: the answer was cut off");
        }
    }

    // h2c: the client's connection task runs (it answers pings) but the
    // body is never polled, so the stream's window (RFC 9113's default,
    // 64 KiB) is never given back: hoist has nothing left to write.
    let mut bodies = Vec::new();
    for _ in 0..CLIENTS {
        let io = TokioIo::new(small_buffer_client(proxy));
        let (mut sender, connection) =
            hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(65_535)
                .initial_connection_window_size(65_535)
                .handshake(io)
                .await
                .unwrap();
        let driver = tokio::spawn(connection);
        let request = Request::builder()
            .uri("http://web.test/")
            .body(full(""))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        bodies.push((response.into_body(), driver));
    }
    expected += CLIENTS;
    all_let_go(&hoist, expected, "h2c").await;
    for (body, driver) in bodies {
        // The connection ended: the body fails or ends short.
        let read = tokio::time::timeout(PATIENCE, body.collect()).await;
        if let Ok(collected) = read.expect("h2c: the stream ended") {
            assert!(collected.to_bytes().len() < ANSWER, "h2c: cut off");
        }
        let _ = tokio::time::timeout(PATIENCE, driver).await;
    }
    hoist.stop().await.unwrap();
}
