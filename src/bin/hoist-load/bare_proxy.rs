//! `bare-proxy`: a minimal reverse proxy on the interceptor's stack (hyper
//! server, hyper-util's pooled client), forwarding as is: the stack's
//! limit, to compare hoist's interceptor with.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[derive(Args)]
pub(super) struct BareProxyArgs {
    #[arg(long)]
    listen: SocketAddr,
    #[arg(long)]
    upstream: SocketAddr,
}

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

pub(super) async fn bare_proxy(args: BareProxyArgs) -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;

    let listener = TcpListener::bind(args.listen).await?;
    eprintln!("bare proxy on {} to {}", args.listen, args.upstream);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // The interceptor's client settings.
    let client: Client<HttpConnector, hyper::body::Incoming> =
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
    let authority = http::uri::Authority::try_from(args.upstream.to_string())?;
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let authority = authority.clone();
        let service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let client = client.clone();
                let authority = authority.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    let mut uri = http::uri::Parts::default();
                    uri.scheme = Some(http::uri::Scheme::HTTP);
                    uri.authority = Some(authority);
                    uri.path_and_query = parts.uri.path_and_query().cloned();
                    parts.uri = http::Uri::from_parts(uri).expect("a valid URI");
                    let response = match client
                        .request(hyper::Request::from_parts(parts, body))
                        .await
                    {
                        Ok(response) => response.map(|body| body.boxed()),
                        Err(_) => {
                            let mut response = hyper::Response::new(
                                Full::new(Bytes::from_static(b"bad gateway\n"))
                                    .map_err(|never| match never {})
                                    .boxed(),
                            );
                            *response.status_mut() = http::StatusCode::BAD_GATEWAY;
                            response
                        }
                    };
                    Ok::<hyper::Response<ProxyBody>, Infallible>(response)
                }
            });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
