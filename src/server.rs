//! `hoist serve`: the gRPC ExternalScaler and the admin listener, wired to
//! one driver, with a graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::{self, AdminState};
use crate::auth_profiles::AuthProfiles;
use crate::callers::CallerPolicy;
use crate::cluster::Cluster;
use crate::config::Settings;
use crate::driver::{Driver, DriverSettings, TriggerValues};
use crate::grpc::ScalerService;
use crate::grpc::edge::EdgeLayer;
use crate::interceptor::Interceptor;
use crate::interceptor::fleet::Fleet;
use crate::interceptor::route_metrics::RouteTraffic;
use crate::interceptor::table::RouteControl;
use crate::interceptor::traffic::Traffic;
use crate::metrics::Metrics;
use crate::persist;
use crate::proto::external_scaler_server::ExternalScalerServer;
use crate::reload::{ConfigSource, Reloader, Targets};
use crate::tls::{self, TlsListener};
use crate::token_file::TokenFile;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    // The causes follow in the error chain.
    #[error("gRPC server failed")]
    Grpc(#[from] tonic::transport::Error),
    #[error("gRPC reflection setup failed")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("admin server failed")]
    Admin(#[source] std::io::Error),
    #[error("TLS")]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Interceptor(#[from] crate::interceptor::InterceptorError),
    #[error("cannot build the client that reads interceptors")]
    FleetClient(#[source] reqwest::Error),
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error(
        "`hoist interceptor` needs routes: add [[interceptor.http_routes]] or [[interceptor.tcp_routes]] to the config, or set interceptor.scaler to follow the routes ScaledObjects declare"
    )]
    NoRoutes,
    #[error("cannot build the client that reads the scaler's route table")]
    TableClient(#[source] reqwest::Error),
}

/// Listeners bound, nothing served yet: tests bind to port 0 and read the
/// real addresses before running.
pub struct Server {
    settings: Settings,
    /// None in `hoist interceptor`, which serves no gRPC.
    grpc: Option<TcpListener>,
    admin: TcpListener,
    interceptor: Option<Interceptor>,
    /// Where to read the config again (SIGHUP, a changed file).
    reload: Option<ConfigSource>,
}

impl Server {
    /// `hoist serve`: the scaler, plus the interceptor's proxies when it
    /// has routes and no remote interceptors to read.
    pub async fn bind(settings: Settings) -> Result<Self, ServerError> {
        let grpc = bind("gRPC", settings.grpc.listen).await?;
        let admin = bind("admin", settings.admin.listen).await?;
        let interceptor = if settings.interceptor.in_process() {
            Some(Interceptor::bind(&settings.interceptor, settings.grace()).await?)
        } else {
            None
        };
        Ok(Self {
            settings,
            grpc: Some(grpc),
            admin,
            interceptor,
            reload: None,
        })
    }

    /// `hoist interceptor`: the proxies and the admin port only.
    pub async fn bind_interceptor(settings: Settings) -> Result<Self, ServerError> {
        if !settings.interceptor.has_routes() && settings.interceptor.scaler.is_none() {
            return Err(ServerError::NoRoutes);
        }
        let admin = bind("admin", settings.admin.listen).await?;
        let interceptor = Interceptor::bind(&settings.interceptor, settings.grace()).await?;
        Ok(Self {
            settings,
            grpc: None,
            admin,
            interceptor: Some(interceptor),
            reload: None,
        })
    }

    /// Reloads the config from `source` on SIGHUP and when its file
    /// changes, while serving.
    pub fn reload_from(mut self, source: ConfigSource) -> Self {
        self.reload = Some(source);
        self
    }

    /// The gRPC address; none for `hoist interceptor`.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.as_ref().and_then(|grpc| grpc.local_addr().ok())
    }

    /// The HTTP proxy's address, when this process proxies HTTP.
    pub fn http_proxy_addr(&self) -> Option<SocketAddr> {
        self.interceptor.as_ref().and_then(Interceptor::http_addr)
    }

    /// Each TCP route's listener, by route name.
    pub fn tcp_proxy_addrs(&self) -> std::collections::BTreeMap<String, SocketAddr> {
        self.interceptor
            .as_ref()
            .map(Interceptor::tcp_addrs)
            .unwrap_or_default()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then: readiness and gRPC health go
    /// NOT_SERVING, activity streams end with OK, pollers stop, and
    /// connections get `shutdown_grace` to finish.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServerError> {
        let Self {
            settings,
            grpc,
            admin,
            interceptor,
            reload,
        } = self;
        let Some(grpc) = grpc else {
            return run_interceptor(settings, admin, interceptor, reload, shutdown).await;
        };
        let metrics = Arc::new(Metrics::new());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mode = if interceptor.is_some() {
            "in-process"
        } else {
            "scaler"
        };
        crate::metrics::register_build_info(&mut registry, mode);

        let cancel = CancellationToken::new();
        let stop = CancellationToken::new();
        let routes = interceptor.as_ref().map(Interceptor::routes);
        let traffic = match &routes {
            Some(routes) => Some(Traffic::Local(routes.clone())),
            None if !settings.interceptor.endpoints.is_empty() => {
                let tls = settings.interceptor.tls.as_ref();
                let tls = tls.map(tls::ClientTls::new).transpose()?;
                let fleet = Arc::new(
                    Fleet::new(
                        settings.interceptor.endpoints.clone(),
                        settings.interceptor.read_timeout,
                        tls.as_ref(),
                    )
                    .map_err(ServerError::FleetClient)?
                    .with_token(TokenFile::new(&settings.admin.auth.token_file)),
                );
                tokio::spawn(fleet.clone().watch_cold_starts(cancel.clone()));
                Some(Traffic::Remote(fleet))
            }
            None => None,
        };
        if let Some(routes) = &routes {
            registry.register_collector(Box::new(RouteTraffic(routes.clone())));
        }
        let local_routes = interceptor.as_ref().map(Interceptor::control);
        if let Some(control) = &local_routes {
            dial_pods(&settings, control, cancel.clone()).await?;
        }
        let http_addr = interceptor.as_ref().and_then(Interceptor::http_addr);
        let proxies = interceptor.map(|interceptor| {
            info!(http = ?interceptor.http_addr(), tcp = ?interceptor.tcp_addrs(), "interceptor is proxying");
            tokio::spawn(interceptor.run(stop.clone()))
        });
        let driver = Driver::new(
            DriverSettings::from_config(&settings, traffic.clone()),
            AuthProfiles::from_settings(&settings),
            metrics.clone(),
            cancel.clone(),
        );
        registry.register_collector(Box::new(TriggerValues(driver.clone())));
        if let Some(routes) = driver.routes() {
            // A port 0 in the settings is chosen at bind: reserve the real
            // one. Interceptors in their own Deployment use the same
            // `http_listen` setting.
            let bound = [
                (grpc.local_addr().ok(), "grpc.listen"),
                (admin.local_addr().ok(), "admin.listen"),
                (
                    http_addr.or(Some(settings.interceptor.http_listen)),
                    "interceptor.http_listen",
                ),
            ];
            routes.reserve(
                bound
                    .into_iter()
                    .filter_map(|(address, key)| Some((address?.port(), key.to_string())))
                    .collect(),
            );
            if let Some(control) = &local_routes {
                control.serve_declared(&routes);
            }
        }
        let reload = reload.map(|source| {
            let targets = Targets {
                interceptor: local_routes.clone(),
                driver: Some(driver.clone()),
                traffic: traffic.clone(),
            };
            watch_config(source, &settings, targets, &mut registry, &cancel)
        });
        if let Ok(address) = grpc.local_addr() {
            driver.set_grpc_port(address.port());
        }
        if let Some(cluster) = Cluster::connect(&settings.kubernetes, cancel.clone()).await? {
            driver.set_cluster(cluster);
        }
        let state_file = usable_state_file(&settings);
        let saver = state_file.clone().map(|path| {
            Arc::new(persist::StateSaver::new(
                path,
                metrics.state_save_failures.clone(),
            ))
        });
        if let Some(path) = &state_file {
            match persist::load(path) {
                Ok(Some(snapshot)) => {
                    info!(path = %path.display(), scaled_objects = snapshot.scaled_objects.len(), "engine state loaded");
                    driver.restore(snapshot);
                }
                Ok(None) => info!(path = %path.display(), "no engine state saved yet"),
                Err(error) => warn!(%error, "ignoring the state file: engines start fresh"),
            }
        }
        if let Some(saver) = &saver {
            tokio::spawn(save_state_on_change(
                driver.clone(),
                saver.clone(),
                cancel.clone(),
            ));
        }

        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<ExternalScalerServer<ScalerService>>()
            .await;
        tokio::spawn(report_stopped_polling(
            driver.clone(),
            health.clone(),
            cancel.clone(),
        ));
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let callers = CallerPolicy::new(
            driver.cluster(),
            settings.kubernetes.new_object_wait,
            settings
                .grpc
                .tls
                .as_ref()
                .is_some_and(|tls| tls.client_ca_file.is_some()),
            settings.grpc.trust_callers,
        );
        let scaler =
            ExternalScalerServer::new(ScalerService::new(driver.clone(), callers, metrics.clone()))
                .max_decoding_message_size(decoding_limit(settings.limits.max_metadata_bytes));

        let (ready_tx, ready) = watch::channel(false);
        let grpc_addr = grpc.local_addr().ok();
        // A peer that stops answering pings (lost node, partition) is
        // dropped, and its StreamIsActive streams with it.
        let grpc_router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(settings.grpc.keepalive_interval))
            .http2_keepalive_timeout(Some(settings.grpc.keepalive_timeout))
            .layer(EdgeLayer::new(stop.clone()))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(scaler);
        let grpc_signal = stop.clone().cancelled_owned();
        let grpc_task = match &settings.grpc.tls {
            None => {
                // Small gRPC replies must not wait for the peer's delayed
                // ACK (Nagle): up to 40 ms per call otherwise.
                let incoming = tonic::transport::server::TcpIncoming::from(grpc)
                    .with_nodelay(Some(true))
                    .with_keepalive(Some(crate::listen::TCP_KEEPALIVE_IDLE))
                    .with_keepalive_interval(Some(crate::listen::TCP_KEEPALIVE_INTERVAL))
                    .with_keepalive_retries(Some(crate::listen::TCP_KEEPALIVE_RETRIES));
                tokio::spawn(grpc_router.serve_with_incoming_shutdown(incoming, grpc_signal))
            }
            Some(tls) => {
                let acceptor = tls::acceptor(tls, stop.clone())?;
                let incoming = TlsListener::new(grpc, acceptor, stop.clone()).into_stream();
                tokio::spawn(grpc_router.serve_with_incoming_shutdown(incoming, grpc_signal))
            }
        };
        let admin_addr = admin.local_addr().ok();
        let admin_router = admin::router(AdminState {
            registry: Arc::new(registry),
            driver: Some(driver.clone()),
            interceptor: routes,
            following: None,
            shutdown: stop.clone(),
            ready,
            reload,
            auth: Arc::new(admin::auth::Guard::from_settings(&settings).await?),
        });
        // The admin port answers until the end: `/readyz` says 503 while
        // the rest shuts down, instead of refusing connections.
        let admin_stop = CancellationToken::new();
        let admin_task = serve_admin(&settings, admin, admin_router, &admin_stop)?;
        ready_tx.send_replace(true);
        info!(grpc = ?grpc_addr, admin = ?admin_addr, "hoist is serving");

        shutdown.await;
        drain(&settings).await;
        let grace = settings.grace();
        info!(?grace, "shutting down");
        let until = tokio::time::Instant::now() + grace;
        ready_tx.send_replace(false);
        health
            .set_not_serving::<ExternalScalerServer<ScalerService>>()
            .await;
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        cancel.cancel();
        stop.cancel();
        if let Some(saver) = &saver {
            saver.save(&driver.snapshot());
        }

        let finished = tokio::time::timeout_at(until, async {
            let grpc = grpc_task.await;
            if let Some(proxies) = proxies {
                let _ = proxies.await;
            }
            grpc
        })
        .await;
        let grpc = match finished {
            Ok(grpc) => grpc,
            Err(_) => {
                warn!(
                    ?grace,
                    "connections still open after the grace period; exiting anyway"
                );
                admin_stop.cancel();
                return Ok(());
            }
        };
        admin_stop.cancel();
        let admin = tokio::time::timeout_at(until, admin_task).await;
        if let Ok(result) = grpc {
            result?;
        }
        match admin {
            Ok(Ok(result)) => result?,
            Ok(Err(_)) => {}
            Err(_) => warn!("admin connections still open after the grace period; exiting anyway"),
        }
        info!("shutdown complete");
        Ok(())
    }
}

/// `hoist interceptor`: the proxies and the admin port (health, metrics,
/// the counters the scaler reads) until `shutdown`.
async fn run_interceptor(
    settings: Settings,
    admin: TcpListener,
    interceptor: Option<Interceptor>,
    reload: Option<ConfigSource>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let interceptor = interceptor.ok_or(ServerError::NoRoutes)?;
    let routes = interceptor.routes();
    let stop = CancellationToken::new();
    dial_pods(&settings, &interceptor.control(), stop.clone()).await?;
    let following = match &settings.interceptor.scaler {
        Some(scaler) => {
            let (status, following) = watch::channel(Default::default());
            let tls = settings
                .interceptor
                .tls
                .as_ref()
                .map(tls::ClientTls::new)
                .transpose()?;
            let (builder, scheme) = tls::client_builder(tls.as_ref());
            let client = builder
                .connect_timeout(settings.interceptor.read_timeout)
                .timeout(crate::routing::api::MAX_WAIT + settings.interceptor.read_timeout)
                .build()
                .map_err(ServerError::TableClient)?;
            tokio::spawn(crate::interceptor::follow::follow(
                format!("{scheme}://{scaler}"),
                client,
                TokenFile::new(&settings.admin.auth.token_file),
                interceptor.control(),
                crate::routing::RouteRules {
                    interceptor: settings.interceptor.clone(),
                    config_routes: Vec::new(),
                },
                status,
                stop.clone(),
            ));
            Some(following)
        }
        None => None,
    };
    let mut registry = Registry::default();
    crate::metrics::register_build_info(&mut registry, "interceptor");
    registry.register_collector(Box::new(RouteTraffic(routes.clone())));
    let reload = reload.map(|source| {
        let targets = Targets {
            interceptor: Some(interceptor.control()),
            driver: None,
            traffic: None,
        };
        watch_config(source, &settings, targets, &mut registry, &stop)
    });
    let (ready_tx, ready) = watch::channel(false);
    let admin_addr = admin.local_addr().ok();
    let admin_router = admin::router(AdminState {
        registry: Arc::new(registry),
        driver: None,
        interceptor: Some(routes),
        following,
        shutdown: stop.clone(),
        ready,
        reload,
        auth: Arc::new(admin::auth::Guard::from_settings(&settings).await?),
    });
    let admin_stop = CancellationToken::new();
    let admin_task = serve_admin(&settings, admin, admin_router, &admin_stop)?;
    info!(http = ?interceptor.http_addr(), tcp = ?interceptor.tcp_addrs(), admin = ?admin_addr, "hoist interceptor is proxying");
    let grace = settings.grace();
    let proxies = tokio::spawn(interceptor.run(stop.clone()));
    ready_tx.send_replace(true);

    shutdown.await;
    drain(&settings).await;
    info!(?grace, "shutting down");
    ready_tx.send_replace(false);
    stop.cancel();
    // The proxies bound their own drain by the grace period; the admin
    // port answers (`/readyz`: 503) until they are done.
    let _ = proxies.await;
    admin_stop.cancel();
    match tokio::time::timeout(grace, admin_task).await {
        Ok(Ok(result)) => result?,
        Ok(Err(_)) => {}
        Err(_) => warn!("admin connections still open after the grace period; exiting anyway"),
    }
    info!("shutdown complete");
    Ok(())
}

fn serve_admin(
    settings: &Settings,
    admin: TcpListener,
    router: axum::Router,
    stop: &CancellationToken,
) -> Result<tokio::task::JoinHandle<Result<(), ServerError>>, ServerError> {
    let signal = stop.clone().cancelled_owned();
    // The connection's TLS handshake tells the admin guard whether the
    // caller presented a client certificate.
    let service = router.into_make_service_with_connect_info::<admin::auth::Peer>();
    Ok(match &settings.admin.tls {
        None => tokio::spawn(async move {
            axum::serve(admin, service)
                .with_graceful_shutdown(signal)
                .await
                .map_err(ServerError::Admin)
        }),
        Some(tls) => {
            let acceptor = tls::admin_acceptor(tls, stop.clone())?;
            let listener = TlsListener::new(admin, acceptor, stop.clone());
            tokio::spawn(async move {
                axum::serve(listener, service)
                    .with_graceful_shutdown(signal)
                    .await
                    .map_err(ServerError::Admin)
            })
        }
    })
}

/// With `interceptor.direct_to_pods`, the proxies dial Services' ready
/// pods from their EndpointSlices; without a cluster to read (`auto` and
/// no configuration found) they dial the Services, and the log says so.
async fn dial_pods(
    settings: &Settings,
    control: &RouteControl,
    cancel: CancellationToken,
) -> Result<(), ServerError> {
    if !settings.interceptor.direct_to_pods {
        return Ok(());
    }
    match crate::cluster::connect_client(&settings.kubernetes).await? {
        Some((client, _)) => control.dial_pods(crate::cluster::ServiceEndpoints::new(
            client,
            &settings.interceptor.cluster_domain,
            cancel,
        )),
        None => {
            let why = "no Kubernetes configuration found: the proxies dial Services' addresses, not their pods";
            warn!(setting = "interceptor.direct_to_pods", "{why}");
            control.dial_services(why);
        }
    }
    Ok(())
}

/// Starts reloading the config (see [`crate::reload`]), with its metrics.
fn watch_config(
    source: ConfigSource,
    settings: &Settings,
    targets: Targets,
    registry: &mut Registry,
    cancel: &CancellationToken,
) -> Arc<Reloader> {
    let reloader = Arc::new(Reloader::new(source, settings.clone(), targets));
    reloader.register(registry);
    reloader.watch(cancel.clone());
    reloader
}

/// The state file, when its directory exists or can be made: without
/// one engines still run, with their state in memory only.
fn usable_state_file(settings: &Settings) -> Option<std::path::PathBuf> {
    let path = settings.state_path()?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Err(error) = std::fs::create_dir_all(dir)
    {
        warn!(path = %path.display(), %error, "cannot create the state file's directory: engine state lives in memory only (set state_file)");
        return None;
    }
    Some(path.to_path_buf())
}

/// Keeps serving and accepting for `shutdown.drain_delay` after the
/// signal, while Kubernetes removes this pod from its Services' endpoints
/// (clients still send to it until then).
async fn drain(settings: &Settings) {
    let delay = settings.shutdown.drain_delay;
    if !delay.is_zero() {
        info!(
            ?delay,
            "termination signal: serving on while endpoints are removed"
        );
        tokio::time::sleep(delay).await;
    }
}

/// A poll scheduler that ends outside shutdown (a panic: a bug) leaves
/// every answer frozen at its last reading: the gRPC health check (the
/// scaler's liveness probe in the manifests and chart) then says
/// NOT_SERVING, so the kubelet restarts hoist.
async fn report_stopped_polling(
    driver: Driver,
    health: tonic_health::server::HealthReporter,
    cancel: CancellationToken,
) {
    tokio::select! {
        () = cancel.cancelled() => {}
        () = driver.polling_ended() => {
            if cancel.is_cancelled() {
                return;
            }
            tracing::error!(
                "the poll scheduler stopped: no source is polled any more; health checks now fail so that hoist is restarted"
            );
            health
                .set_not_serving::<ExternalScalerServer<ScalerService>>()
                .await;
        }
    }
}

/// The largest ExternalScaler request tonic decodes: a trigger at
/// `limits.max_metadata_bytes`, with room for protobuf's own framing
/// (tags and lengths, a few bytes per metadata entry). Anything larger is
/// refused before it is decoded.
pub fn decoding_limit(max_metadata_bytes: usize) -> usize {
    max_metadata_bytes.saturating_mul(2).saturating_add(4096)
}

/// How often engine state is written to `state_file` while serving, at
/// least; every engine decision change is saved too, after this short a
/// pause (which gathers a burst of changes into one write).
const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
const SAVE_DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(250);

async fn save_state_on_change(
    driver: Driver,
    saver: Arc<persist::StateSaver>,
    cancel: CancellationToken,
) {
    let changes = driver.state_changes();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(SAVE_EVERY) => {}
            _ = changes.notified() => tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(SAVE_DEBOUNCE) => {}
            },
        }
        saver.save(&driver.snapshot());
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { what, addr, source })
}
