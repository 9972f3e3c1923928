//! The Kubernetes API as engine mode needs it: ScaledObjects (one watch for
//! the whole cluster, kept in a local store), the `/scale` subresource of
//! their targets (read at most once per evaluation interval), and Events on
//! the ScaledObject. KEDA tells an external scaler neither how many replicas
//! run nor the ScaledObject's own settings; the HPA computes from both, so
//! the engine must too.

mod object;
mod token_review;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use object::{ScaleTarget, ScaledObjectView};
pub use token_review::{Review, ReviewError, TokenReviewer};

use crate::config::{KubernetesAccess, KubernetesSettings};
use crate::engine::Observed;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no Kubernetes configuration found (kubernetes.enabled = true): {0}")]
    NoConfig(String),
    #[error("cannot read the kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(String),
    /// The API answered with an error status.
    #[error("{what}: the API server answered {code} {reason}: {message}")]
    Api {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("{what}: {reason}")]
    Unreachable { what: String, reason: String },
    #[error("{what}: no answer within {timeout:?} (kubernetes.timeout)")]
    Timeout { what: String, timeout: Duration },
    #[error(
        "ScaledObject {namespace}/{name} is not in the cluster (keda.sh/v1alpha1); it may be new: the watch has not seen it yet"
    )]
    NoScaledObject { namespace: String, name: String },
    #[error("ScaledObjects are not readable yet: {0}")]
    NotSynced(String),
    #[error("ScaledObject {scaled_object}: {reason}")]
    BadScaledObject {
        scaled_object: String,
        reason: String,
    },
}

impl ClusterError {
    fn from_kube(what: String, error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => ClusterError::Api {
                what,
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
            },
            other => ClusterError::Unreachable {
                what,
                reason: other.to_string(),
            },
        }
    }
}

/// The ScaledObject resource (KEDA's CRD).
fn scaled_objects() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    )
}

/// A connection to the cluster, shared by every engine.
pub struct Cluster {
    client: kube::Client,
    settings: KubernetesSettings,
    objects: Store<DynamicObject>,
    /// Why the ScaledObject watch is failing, while it is.
    watch_error: Arc<Mutex<Option<String>>>,
    reporter: Reporter,
    /// Scale targets' resources by (group/version, kind), found by discovery.
    kinds: Mutex<HashMap<(String, String), ApiResource>>,
    server: String,
}

impl Cluster {
    /// Connects as `settings` say: `None` when access is off, or `auto`
    /// and no configuration is found. Starts the ScaledObject watch, which
    /// ends with `cancel`.
    pub async fn connect(
        settings: &KubernetesSettings,
        cancel: CancellationToken,
    ) -> Result<Option<Arc<Cluster>>, ClusterError> {
        let config = match (&settings.kubeconfig, settings.enabled) {
            (_, KubernetesAccess::Off) => return Ok(None),
            (Some(path), _) => Some(from_file(path).await?),
            (None, enabled) => match kube::Config::infer().await {
                Ok(config) => Some(config),
                Err(error) if enabled == KubernetesAccess::Auto => {
                    info!(
                        "no Kubernetes configuration found: engine mode cannot read replica counts ({error})"
                    );
                    None
                }
                Err(error) => return Err(ClusterError::NoConfig(error.to_string())),
            },
        };
        let Some(mut config) = config else {
            return Ok(None);
        };
        // Two TLS providers are linked (reqwest brings aws-lc-rs): name one,
        // as the rest of hoist does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Only the connection: a read timeout would also cut the
        // ScaledObject watch, which is quiet for minutes. Single calls are
        // bounded where they are made.
        config.connect_timeout = Some(settings.timeout);
        let server = config.cluster_url.to_string();
        let client =
            kube::Client::try_from(config).map_err(|e| ClusterError::Client(e.to_string()))?;
        let resource = scaled_objects();
        let writer = reflector::store::Writer::new(resource.clone());
        let objects = writer.as_reader();
        let watch_error = Arc::new(Mutex::new(None));
        let reporter = Reporter {
            controller: "hoist".into(),
            instance: std::env::var("POD_NAME")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok()),
        };
        let cluster = Arc::new(Cluster {
            reporter,
            client: client.clone(),
            settings: settings.clone(),
            objects,
            watch_error: watch_error.clone(),
            kinds: Mutex::new(HashMap::new()),
            server: server.clone(),
        });
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        );
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    _ = cancel.cancelled() => return,
                    next = stream.next() => next,
                };
                let Some(event) = next else { return };
                let mut error = watch_error.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    Ok(_) => {
                        if error.take().is_some() {
                            info!("watching ScaledObjects again");
                        }
                    }
                    Err(failure) => {
                        let reason = describe_watch_error(&failure);
                        if error.as_deref() != Some(reason.as_str()) {
                            warn!(error = %reason, "cannot watch ScaledObjects");
                        }
                        *error = Some(reason);
                    }
                }
            }
        });
        info!(server = %server, "reading ScaledObjects and replica counts from Kubernetes");
        Ok(Some(cluster))
    }

    /// The API server's address, for `/status`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Why ScaledObjects cannot be read, while they cannot.
    pub fn watch_error(&self) -> Option<String> {
        self.watch_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The ScaledObject as the watch last saw it.
    pub fn scaled_object(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ScaledObjectView, ClusterError> {
        let key = ObjectRef::new_with(name, scaled_objects()).within(namespace);
        match self.objects.get(&key) {
            Some(object) => ScaledObjectView::parse(&object),
            None => match self.watch_error() {
                Some(error) => Err(ClusterError::NotSynced(error)),
                None if self.objects.is_empty() && !self.synced() => Err(ClusterError::NotSynced(
                    "the first list has not finished".into(),
                )),
                None => Err(ClusterError::NoScaledObject {
                    namespace: namespace.into(),
                    name: name.into(),
                }),
            },
        }
    }

    /// Waits (at most `kubernetes.timeout`) for the watch's first list.
    pub async fn wait_synced(&self) {
        let _ = tokio::time::timeout(self.settings.timeout, self.objects.wait_until_ready()).await;
    }

    fn synced(&self) -> bool {
        // The store is ready once the watch's first list has completed.
        futures::FutureExt::now_or_never(self.objects.wait_until_ready()).is_some()
    }

    /// The target's counts from its `/scale` subresource.
    pub async fn read_scale(
        &self,
        namespace: &str,
        target: &ScaleTarget,
    ) -> Result<Observed, ClusterError> {
        let what = format!(
            "reading the scale of {} {namespace}/{}",
            target.kind, target.name
        );
        let timeout = self.settings.timeout;
        let read = async {
            let resource = self.resource(target).await?;
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), namespace, &resource);
            api.get_scale(&target.name)
                .await
                .map_err(|e| ClusterError::from_kube(what.clone(), e))
        };
        let scale =
            tokio::time::timeout(timeout, read)
                .await
                .map_err(|_| ClusterError::Timeout {
                    what: what.clone(),
                    timeout,
                })??;
        let spec = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
        let status = scale.status.map_or(0, |s| s.replicas);
        Ok(Observed {
            spec_replicas: spec.max(0) as u32,
            status_replicas: status.max(0) as u32,
        })
    }

    /// The API resource of a scale target: Deployments and StatefulSets
    /// are known; anything else is found by discovery, once per kind.
    async fn resource(&self, target: &ScaleTarget) -> Result<ApiResource, ClusterError> {
        let (group, version) = target.group_version();
        let gvk = GroupVersionKind::gvk(group, version, &target.kind);
        let known = match (group, version, target.kind.as_str()) {
            ("apps", "v1", "Deployment") => Some("deployments"),
            ("apps", "v1", "StatefulSet") => Some("statefulsets"),
            _ => None,
        };
        if let Some(plural) = known {
            return Ok(ApiResource::from_gvk_with_plural(&gvk, plural));
        }
        let cache_key = (target.api_version.clone(), target.kind.clone());
        if let Some(found) = self.lock_kinds().get(&cache_key) {
            return Ok(found.clone());
        }
        let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| {
                ClusterError::from_kube(
                    format!("discovering {} {}", target.api_version, target.kind),
                    e,
                )
            })?;
        self.lock_kinds().insert(cache_key, resource.clone());
        Ok(resource)
    }

    fn lock_kinds(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), ApiResource>> {
        self.kinds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts an Event on the ScaledObject, in the background: a slow or
    /// refusing API server must never hold up a decision.
    pub fn post_event(self: &Arc<Self>, object: &ScaledObjectView, event: ObjectEvent) {
        if !self.settings.events {
            return;
        }
        let cluster = self.clone();
        let reference = object.reference();
        tokio::spawn(async move {
            let event = Event {
                type_: if event.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: event.reason.into(),
                note: Some(truncate(event.note, 1000)),
                action: event.action.into(),
                secondary: None,
            };
            // A recorder per Event: a shared one merges Events of the same
            // reason into a series that keeps its first note ("New size").
            let recorder = Recorder::new(cluster.client.clone(), cluster.reporter.clone());
            let posted = tokio::time::timeout(
                cluster.settings.timeout,
                recorder.publish(&event, &reference),
            )
            .await;
            match posted {
                Ok(Ok(())) => {}
                Ok(Err(error)) => debug!(%error, reason = %event.reason, "cannot post an Event"),
                Err(_) => debug!(reason = %event.reason, "posting an Event timed out"),
            }
        });
    }
}

/// An Event hoist posts on a ScaledObject.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

fn truncate(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

async fn from_file(path: &Path) -> Result<kube::Config, ClusterError> {
    let shown = path.display().to_string();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| ClusterError::Kubeconfig {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| ClusterError::Kubeconfig {
            path: shown,
            reason: e.to_string(),
        })
}

fn describe_watch_error(error: &watcher::Error) -> String {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status),
        watcher::Error::WatchError(status) => Some(status),
        _ => None,
    };
    match status {
        Some(status) if status.code == 403 => format!(
            "listing scaledobjects.keda.sh is forbidden (403): grant hoist's ServiceAccount get/list/watch on scaledobjects.keda.sh ({})",
            status.message
        ),
        Some(status) => format!(
            "listing scaledobjects.keda.sh: the API server answered {} {}: {}",
            status.code, status.reason, status.message
        ),
        None => format!("listing scaledobjects.keda.sh: {error}"),
    }
}
