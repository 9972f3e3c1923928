//! Real HTTP parts for the interceptor tests: an upstream server (HTTP/1.1,
//! h2c, upgrades) that says what it received, and clients that send to the
//! proxy with any `Host`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use hoist::config::{HttpRouteSettings, Settings};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

pub type Body = BoxBody<Bytes, Infallible>;

/// An HTTP route of the config file: `host` to `upstream`, HTTP/1.1,
/// every other setting at its default.
pub fn http_route(name: &str, host: &str, upstream: SocketAddr) -> HttpRouteSettings {
    HttpRouteSettings {
        name: name.into(),
        host: host.into(),
        path_prefix: None,
        upstream: upstream.to_string(),
        upstream_http2: false,
        cold_start_timeout: None,
        response_timeout: None,
        concurrent_requests: None,
    }
}

/// hoist with an interceptor on a free port serving `routes`.
pub fn proxying(routes: Vec<HttpRouteSettings>) -> Settings {
    let mut settings = Settings::default();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = routes;
    settings
}

pub fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into()).boxed()
}

/// A real HTTP server (HTTP/1.1 and h2c, with upgrades) answering with
/// `handler`; counts the requests it got.
pub struct Upstream {
    pub addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Upstream {
    pub async fn start<F, Fut>(handler: F) -> Self
    where
        F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, handler)
    }

    pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> Self
    where
        F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let counted = counted.clone();
                let service = hyper::service::service_fn(move |request| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let response = handler(request);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                tokio::spawn(async move {
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, requests }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Describes what the upstream received.
pub async fn echo(request: Request<Incoming>) -> Response<Body> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    // HTTP/2 carries the host as `:authority`, HTTP/1.1 as `Host`.
    let host = match request.uri().authority() {
        Some(authority) if request.version() == http::Version::HTTP_2 => authority.to_string(),
        _ => header("host"),
    };
    let cookies: Vec<_> = request
        .headers()
        .get_all("cookie")
        .iter()
        .map(|value| value.to_str().unwrap_or("?").to_string())
        .collect();
    let text = format!(
        "host={host} target={} xff={} xfp={} path={} version={:?} private={} cookies={}",
        request.uri(),
        header("x-forwarded-for"),
        header("x-forwarded-proto"),
        request.uri().path_and_query().map_or("", |p| p.as_str()),
        request.version(),
        header("x-private"),
        cookies.join("|"),
    );
    Response::new(full(text))
}

pub fn http1_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Body>,
    proxy: SocketAddr,
    host: &str,
    path: &str,
) -> (StatusCode, String) {
    let request = Request::builder()
        .uri(format!("http://{host}{path}"))
        .header("host", host)
        .body(full(""))
        .unwrap();
    // The client connects to the URI's authority: point it at the proxy
    // while keeping the Host header.
    let (mut parts, body) = request.into_parts();
    parts.uri = format!("http://{proxy}{path}").parse().unwrap();
    let response = client
        .request(Request::from_parts(parts, body))
        .await
        .expect("a response");
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The port of an app that is not up yet (an app at zero). The port stays
/// bound, not listening, for as long as this lives: connections to it are
/// refused, and no other socket (another test's listener, or an outgoing
/// connection's source port) can take it meanwhile. `listen` starts the
/// app on it. (A port that was free a moment ago guarantees none of that.)
pub struct AppPort {
    socket: socket2::Socket,
    pub addr: SocketAddr,
}

impl AppPort {
    pub fn reserve() -> Self {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        // No SO_REUSEADDR: that is what keeps others off the port.
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        Self { socket, addr }
    }

    /// The port listens but answers no connection attempt, as a Service
    /// whose endpoints are not yet programmed may: its accept queue is
    /// filled by the connections returned (keep them), so the kernel drops
    /// further attempts unanswered. `listen` lets everyone in.
    pub fn listen_unanswered(&self) -> Vec<std::net::TcpStream> {
        self.socket.listen(0).unwrap();
        (0..4)
            .filter_map(|_| {
                std::net::TcpStream::connect_timeout(
                    &self.addr,
                    std::time::Duration::from_millis(200),
                )
                .ok()
            })
            .collect()
    }

    /// The app comes up: the reserved port starts listening.
    pub fn listen(self) -> TcpListener {
        self.socket.listen(1024).unwrap();
        self.socket.set_nonblocking(true).unwrap();
        TcpListener::from_std(self.socket.into()).unwrap()
    }
}

pub async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Dials one address whatever the request's URI names, so a request can
/// carry the host it is for as its URI authority (HTTP/2's `:authority`)
/// and still reach the proxy.
#[derive(Clone)]
pub struct Dial(pub SocketAddr);

impl tower::Service<http::Uri> for Dial {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let address = self.0;
        Box::pin(async move { TcpStream::connect(address).await.map(TokioIo::new) })
    }
}

/// An h2c client (HTTP/2 with prior knowledge) to `proxy`.
pub fn h2c_client(proxy: SocketAddr) -> Client<Dial, Body> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(Dial(proxy))
}

/// [`send`] over h2c, the host as `:authority` (no `Host` field, as
/// HTTP/2 clients send it).
pub async fn send_h2(proxy: SocketAddr, host: &str, path: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .uri(format!("http://{host}{path}"))
        .body(full(""))
        .unwrap();
    let response = h2c_client(proxy)
        .request(request)
        .await
        .expect("a response");
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
