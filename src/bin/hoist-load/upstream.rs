//! `upstream`: a small HTTP/1.1 server (keep-alive, a fixed body), the
//! upstream of the interceptor benchmarks.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use clap::Args;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[derive(Args)]
pub(super) struct UpstreamArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// The response body.
    #[arg(long, default_value = "hello from upstream\n")]
    body: String,
}

pub(super) async fn upstream(args: UpstreamArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    eprintln!("upstream on {}", args.listen);
    serve(listener, Bytes::from(args.body)).await
}

/// Answers every request on `listener` with 200 and `body`.
pub(crate) async fn serve(listener: TcpListener, body: Bytes) -> anyhow::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_request| {
                let body = body.clone();
                async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(body))) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
