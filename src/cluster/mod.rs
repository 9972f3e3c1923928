//! The Kubernetes API as engine mode needs it: ScaledObjects (one watch for
//! the whole cluster, kept in a local store), the `/scale` subresource of
//! their targets (read at most once per evaluation interval), and Events on
//! the ScaledObject. KEDA tells an external scaler neither how many replicas
//! run nor the ScaledObject's own settings; the HPA computes from both, so
//! the engine must too.

mod changes;
mod keda_status;
mod object;
mod service_endpoints;
mod targets;
mod token_review;
mod trigger_auth;
mod unreconciled_objects;
mod watched;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

pub use changes::{Changed, ObjectKey, next_batch};
pub use keda_status::{Unreconciled, unreconciled};
pub use object::{ScaleTarget, ScaledObjectView};
pub use service_endpoints::{FollowedService, ServiceEndpoints};
pub use targets::TargetChange;
pub use token_review::{Review, ReviewError, TokenReviewer};
pub use trigger_auth::{AuthenticationKind, AuthenticationRef, ResolvedAuth, TriggerAuthError};
pub use unreconciled_objects::UnreconciledObjects;

use crate::config::{KubernetesAccess, KubernetesSettings};
use crate::engine::Observed;
use watched::Watched;

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

/// Changes a slow follower may fall behind by before it must re-read the
/// whole store (it is told so: `RecvError::Lagged`).
const CHANGE_BACKLOG: usize = 4096;

/// Watches end server-side after this (`timeoutSeconds`) and start again
/// from their resourceVersion, so that a read timeout can bound every
/// request: the initial list of a watch included, which the API server
/// does not time out itself. A list that hangs is cut and retried, instead
/// of leaving the store unsynced for good.
const WATCH_SECONDS: u32 = 50;

/// Longer than a healthy watch stays quiet ([`WATCH_SECONDS`]).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// How every watch of hoist's is made.
pub(crate) fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_SECONDS)
}

/// ScaledJobs (KEDA's CRD): KEDA calls external scalers for their
/// triggers too, naming the ScaledJob.
fn scaled_jobs() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledJob"),
        "scaledjobs",
    )
}

/// A connection to the cluster, shared by every engine.
pub struct Cluster {
    client: kube::Client,
    settings: KubernetesSettings,
    objects: Watched<DynamicObject>,
    reporter: Reporter,
    /// Scale targets' resources by (group/version, kind), found by discovery.
    kinds: Mutex<HashMap<(String, String), ApiResource>>,
    server: String,
    /// What the ScaledObject watch applied, for those who follow the
    /// store by its changes instead of reading all of it.
    changes: broadcast::Sender<ObjectChange>,
    /// ScaledJobs, whose triggers call hoist as ScaledObjects' do.
    jobs: Watched<DynamicObject>,
    /// Scale targets whose desired count may have changed.
    target_changes: broadcast::Sender<TargetChange>,
    /// With `kubernetes.trigger_authentication`: what resolves triggers'
    /// `authenticationRef`.
    trigger_auth: Option<trigger_auth::TriggerAuthStores>,
}

/// A change the ScaledObject watch applied to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectChange {
    /// This ScaledObject was added, modified or deleted.
    Object { namespace: String, name: String },
    /// The watch listed everything anew (its start, or a restart after
    /// an expired resource version): any object may have changed.
    Relisted,
}

impl ObjectChange {
    fn of(event: &watcher::Event<DynamicObject>) -> Option<Self> {
        match event {
            watcher::Event::Apply(object) | watcher::Event::Delete(object) => {
                Some(ObjectChange::Object {
                    namespace: object.metadata.namespace.clone().unwrap_or_default(),
                    name: object.metadata.name.clone().unwrap_or_default(),
                })
            }
            watcher::Event::InitDone => Some(ObjectChange::Relisted),
            watcher::Event::Init | watcher::Event::InitApply(_) => None,
        }
    }
}

impl Cluster {
    /// Connects as `settings` say: `None` when access is off, or `auto`
    /// and no configuration is found. Starts the ScaledObject watch, which
    /// ends with `cancel`.
    pub async fn connect(
        settings: &KubernetesSettings,
        cancel: CancellationToken,
    ) -> Result<Option<Arc<Cluster>>, ClusterError> {
        let Some((client, server)) = connect_client(settings).await? else {
            return Ok(None);
        };
        let reporter = Reporter {
            controller: "hoist".into(),
            instance: std::env::var("POD_NAME")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok()),
        };
        let trigger_auth = settings
            .trigger_authentication
            .then(|| trigger_auth::TriggerAuthStores::start(&client, settings, &cancel));
        let changes = broadcast::channel(CHANGE_BACKLOG).0;
        // ScaledJobs' changes are told as ScaledObjects' are: followers
        // look the name up in both.
        let told = |changes: broadcast::Sender<ObjectChange>| {
            move |event: &watcher::Event<DynamicObject>| {
                if let Some(change) = ObjectChange::of(event) {
                    // Nobody following is no error.
                    let _ = changes.send(change);
                }
            }
        };
        let jobs = Watched::start(
            (Api::all_with(client.clone(), &scaled_jobs()), scaled_jobs()),
            ("scaledjobs.keda.sh", ""),
            keep_what_is_read,
            &cancel,
            told(changes.clone()),
        );
        let objects = Watched::start(
            (
                Api::all_with(client.clone(), &scaled_objects()),
                scaled_objects(),
            ),
            ("scaledobjects.keda.sh", ""),
            keep_what_is_read,
            &cancel,
            told(changes.clone()),
        );
        let cluster = Arc::new(Cluster {
            trigger_auth,
            reporter,
            client: client.clone(),
            settings: settings.clone(),
            objects,
            kinds: Mutex::new(HashMap::new()),
            server: server.clone(),
            changes,
            jobs,
            target_changes: broadcast::channel(CHANGE_BACKLOG).0,
        });
        targets::start(&client, cluster.target_changes.clone(), &cancel);
        info!(server = %server, "reading ScaledObjects and replica counts from Kubernetes");
        Ok(Some(cluster))
    }

    /// The params a trigger's `authenticationRef` gives a ScaledObject in
    /// `namespace`, from the watched TriggerAuthentications and Secrets.
    pub fn trigger_authentication(
        &self,
        namespace: &str,
        reference: &AuthenticationRef,
    ) -> Result<ResolvedAuth, TriggerAuthError> {
        match &self.trigger_auth {
            Some(stores) => stores.resolve(namespace, reference),
            None => Err(TriggerAuthError::Disabled {
                auth: reference.describe(namespace),
            }),
        }
    }

    /// The API server's address, for `/status`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Why ScaledObjects cannot be read, while they cannot.
    pub fn watch_error(&self) -> Option<String> {
        self.objects.error()
    }

    /// The ScaledObject as the watch last saw it.
    pub fn scaled_object(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ScaledObjectView, ClusterError> {
        let key = ObjectRef::new_with(name, scaled_objects()).within(namespace);
        match self.objects.store().get(&key) {
            Some(object) => ScaledObjectView::parse(&object),
            None => match self.watch_error() {
                Some(error) => Err(ClusterError::NotSynced(error)),
                None if self.objects.store().is_empty() && !self.objects.listed() => Err(
                    ClusterError::NotSynced("the first list has not finished".into()),
                ),
                None => Err(ClusterError::NoScaledObject {
                    namespace: namespace.into(),
                    name: name.into(),
                }),
            },
        }
    }

    /// The ScaledObject as the API server sent it, if the watch has it.
    pub fn raw_scaled_object(&self, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        let key = ObjectRef::new_with(name, scaled_objects()).within(namespace);
        self.objects.store().get(&key)
    }

    /// The ScaledObject, or else the ScaledJob, named so: what owns the
    /// triggers KEDA calls about. `Err` while ScaledJobs cannot be listed
    /// and no ScaledObject has the name (it may be a ScaledJob).
    pub fn raw_trigger_owner(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<DynamicObject>>, String> {
        if let Some(object) = self.raw_scaled_object(namespace, name) {
            return Ok(Some(object));
        }
        if !self.jobs.listed() {
            let reason = self
                .jobs
                .error()
                .unwrap_or_else(|| "the ScaledJob watch has not listed them yet".to_string());
            return Err(reason);
        }
        let key = ObjectRef::new_with(name, scaled_jobs()).within(namespace);
        Ok(self.jobs.store().get(&key))
    }

    /// The ScaledObjects calling the hoist on `grpc_port` that KEDA has not
    /// set up, by namespace and name (see [`unreconciled`]).
    pub fn unreconciled(&self, grpc_port: Option<u16>) -> Vec<String> {
        let mut found: Vec<String> = self
            .objects
            .store()
            .state()
            .iter()
            .filter_map(|object| unreconciled(object, grpc_port))
            .map(|found| format!("{}/{}", found.namespace, found.name))
            .collect();
        found.sort();
        found
    }

    /// Every ScaledObject the watch has.
    pub fn all_scaled_objects(&self) -> Vec<Arc<DynamicObject>> {
        self.objects.store().state()
    }

    /// Scale targets (Deployments, StatefulSets) whose spec changed, from
    /// now on.
    pub fn target_changes(&self) -> broadcast::Receiver<TargetChange> {
        self.target_changes.subscribe()
    }

    /// The watch's changes from now on.
    pub fn changes(&self) -> broadcast::Receiver<ObjectChange> {
        self.changes.subscribe()
    }

    /// Whether the store can answer "does this ScaledObject exist": its
    /// first list has completed (a later watch failure keeps the last
    /// state, as the API server last showed it).
    pub fn has_listed(&self) -> bool {
        self.objects.listed()
    }

    /// Waits (at most `kubernetes.timeout`) for the watch's first list.
    pub async fn wait_synced(&self) {
        self.objects.wait_listed(self.settings.timeout).await;
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
        self.post_event_on(object.reference(), event);
    }

    /// Posts an Event on the object `reference` names, as [`Self::post_event`].
    pub fn post_event_on(self: &Arc<Self>, reference: ObjectReference, event: ObjectEvent) {
        if !self.settings.events {
            return;
        }
        let cluster = self.clone();
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

/// A client of the API server as `settings` say, and the server's
/// address: `None` when access is off, or `auto` and no configuration is
/// found.
pub async fn connect_client(
    settings: &KubernetesSettings,
) -> Result<Option<(kube::Client, String)>, ClusterError> {
    let config = match (&settings.kubeconfig, settings.enabled) {
        (_, KubernetesAccess::Off) => return Ok(None),
        (Some(path), _) => Some(from_file(path).await?),
        (None, enabled) => match kube::Config::infer().await {
            Ok(config) => Some(config),
            Err(error) if enabled == KubernetesAccess::Auto => {
                info!(
                    "no Kubernetes configuration found: hoist reads nothing from the cluster ({error})"
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
    // The connection, and every read: watches end server-side before
    // the read timeout (see `WATCH_SECONDS`). Single calls are bounded
    // more tightly where they are made.
    config.connect_timeout = Some(settings.timeout);
    config.read_timeout = Some(READ_TIMEOUT);
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| ClusterError::Client(e.to_string()))?;
    Ok(Some((client, server)))
}

/// Drops from a stored object what the API server and `kubectl` keep for
/// themselves: the field managers, and the copy of the whole object
/// `kubectl apply` keeps in an annotation.
fn drop_bookkeeping<K: kube::ResourceExt>(object: &mut K) {
    object.managed_fields_mut().clear();
    object
        .annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
}

/// Drops from a stored KEDA object (ScaledObject, ScaledJob, and the
/// (Cluster)TriggerAuthentications) what hoist never reads: most of KEDA's
/// status (rewritten on every poll of an active ScaledObject; only the HPA's
/// name and the `Ready` condition are kept, see [`keda_status`]), the
/// field managers, and the copy of the whole object `kubectl apply` keeps
/// in an annotation. In a real cluster they are most of an object's bytes,
/// and a store holds every object.
fn keep_what_is_read(object: &mut DynamicObject) {
    drop_bookkeeping(object);
    if let Some(fields) = object.data.as_object_mut()
        && let Some(status) = fields.remove("status")
        && let Some(kept) = keda_status::keep_readiness(status)
    {
        fields.insert("status".into(), kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_object_keeps_its_spec_and_loses_what_is_never_read() {
        let mut object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {
                "name": "worker",
                "namespace": "orders",
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{}}",
                    "autoscaling.keda.sh/paused": "true"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            },
            "spec": {"scaleTargetRef": {"name": "worker"}},
            "status": {"lastActiveTime": "2026-11-26T03:00:00Z", "hpaName": "keda-hpa-worker"}
        }))
        .unwrap();
        keep_what_is_read(&mut object);
        assert_eq!(
            object
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["autoscaling.keda.sh/paused"]
        );
        assert!(
            object
                .metadata
                .managed_fields
                .as_ref()
                .is_none_or(Vec::is_empty)
        );
        assert_eq!(
            object.data,
            serde_json::json!({
                "spec": {"scaleTargetRef": {"name": "worker"}},
                "status": {"hpaName": "keda-hpa-worker"}
            })
        );
    }
}
