//! The Kubernetes API as engine mode needs it: ScaledObjects (one watch for
//! the whole cluster, kept in a local store), the `/scale` subresource of
//! their targets (read at most once per evaluation interval), and Events on
//! the ScaledObject. KEDA tells an external scaler neither how many replicas
//! run nor the ScaledObject's own settings; the HPA computes from both, so
//! the engine must too.

mod keda_status;
mod object;
mod targets;
mod token_review;
mod trigger_auth;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use keda_status::{Unreconciled, unreconciled};
pub use object::{ScaleTarget, ScaledObjectView};
pub use targets::TargetChange;
pub use token_review::{Review, ReviewError, TokenReviewer};
pub use trigger_auth::{AuthenticationKind, AuthenticationRef, ResolvedAuth, TriggerAuthError};

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
    objects: Store<DynamicObject>,
    /// Why the ScaledObject watch is failing, while it is.
    watch_error: Arc<Mutex<Option<String>>>,
    reporter: Reporter,
    /// Scale targets' resources by (group/version, kind), found by discovery.
    kinds: Mutex<HashMap<(String, String), ApiResource>>,
    server: String,
    /// What the ScaledObject watch applied, for those who follow the
    /// store by its changes instead of reading all of it.
    changes: broadcast::Sender<ObjectChange>,
    /// Whether the watch's first list has completed.
    listed: tokio::sync::watch::Sender<bool>,
    /// ScaledJobs, whose triggers call hoist as ScaledObjects' do.
    jobs: Store<DynamicObject>,
    jobs_listed: tokio::sync::watch::Sender<bool>,
    jobs_error: Arc<Mutex<Option<String>>>,
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
        // The connection, and every read: watches end server-side before
        // the read timeout (see `WATCH_SECONDS`). Single calls are bounded
        // more tightly where they are made.
        config.connect_timeout = Some(settings.timeout);
        config.read_timeout = Some(READ_TIMEOUT);
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
        let trigger_auth = settings
            .trigger_authentication
            .then(|| trigger_auth::TriggerAuthStores::start(&client, settings, &cancel));
        let jobs_writer = reflector::store::Writer::new(scaled_jobs());
        let jobs = jobs_writer.as_reader();
        let jobs_error = Arc::new(Mutex::new(None));
        let cluster = Arc::new(Cluster {
            trigger_auth,
            reporter,
            client: client.clone(),
            settings: settings.clone(),
            objects,
            watch_error: watch_error.clone(),
            kinds: Mutex::new(HashMap::new()),
            server: server.clone(),
            changes: broadcast::channel(CHANGE_BACKLOG).0,
            listed: tokio::sync::watch::Sender::new(false),
            jobs,
            jobs_listed: tokio::sync::watch::Sender::new(false),
            jobs_error: jobs_error.clone(),
            target_changes: broadcast::channel(CHANGE_BACKLOG).0,
        });
        targets::start(&client, cluster.target_changes.clone(), &cancel);
        {
            let (changes, listed) = (cluster.changes.clone(), cluster.jobs_listed.clone());
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &scaled_jobs());
            let stream = reflector::reflector(
                jobs_writer,
                watcher(api, watch_config()).modify(keep_what_is_read),
            );
            follow(
                stream,
                "scaledjobs.keda.sh",
                "",
                jobs_error,
                cancel.clone(),
                move |event: &watcher::Event<DynamicObject>| {
                    if let watcher::Event::InitDone = event {
                        listed.send_replace(true);
                    }
                    if let Some(change) = ObjectChange::of(event) {
                        let _ = changes.send(change);
                    }
                },
            );
        }
        let changes = cluster.changes.clone();
        let listed = cluster.listed.clone();
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        let stream = reflector::reflector(
            writer,
            watcher(api, watch_config()).modify(keep_what_is_read),
        );
        follow(
            stream,
            "scaledobjects.keda.sh",
            "",
            watch_error,
            cancel,
            move |event: &watcher::Event<DynamicObject>| {
                if let watcher::Event::InitDone = event {
                    listed.send_replace(true);
                }
                if let Some(change) = ObjectChange::of(event) {
                    // Nobody following is no error.
                    let _ = changes.send(change);
                }
            },
        );
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

    /// The ScaledObject as the API server sent it, if the watch has it.
    pub fn raw_scaled_object(&self, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        let key = ObjectRef::new_with(name, scaled_objects()).within(namespace);
        self.objects.get(&key)
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
        if !*self.jobs_listed.borrow() {
            let reason = self
                .jobs_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_else(|| "the ScaledJob watch has not listed them yet".to_string());
            return Err(reason);
        }
        let key = ObjectRef::new_with(name, scaled_jobs()).within(namespace);
        Ok(self.jobs.get(&key))
    }

    /// The ScaledObjects calling the hoist on `grpc_port` that KEDA has not
    /// set up, by namespace and name (see [`unreconciled`]).
    pub fn unreconciled(&self, grpc_port: Option<u16>) -> Vec<String> {
        let mut found: Vec<String> = self
            .objects
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
        self.objects.state()
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
        self.synced()
    }

    /// Waits (at most `kubernetes.timeout`) for the watch's first list.
    pub async fn wait_synced(&self) {
        // Not the store's own `wait_until_ready`: of several tasks waiting
        // on it at once, only one was woken.
        let mut listed = self.listed.subscribe();
        let _ =
            tokio::time::timeout(self.settings.timeout, listed.wait_for(|listed| *listed)).await;
    }

    fn synced(&self) -> bool {
        *self.listed.borrow()
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

/// Drops from a stored KEDA object (ScaledObject, ScaledJob, and the
/// (Cluster)TriggerAuthentications) what hoist never reads: most of KEDA's
/// status (rewritten on every poll of an active ScaledObject; only the HPA's
/// name and the `Ready` condition are kept, see [`keda_status`]), the
/// field managers, and the copy of the whole object `kubectl apply` keeps
/// in an annotation. In a real cluster they are most of an object's bytes,
/// and a store holds every object.
fn keep_what_is_read(object: &mut DynamicObject) {
    use kube::ResourceExt;
    object.managed_fields_mut().clear();
    object
        .annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
    if let Some(fields) = object.data.as_object_mut()
        && let Some(status) = fields.remove("status")
        && let Some(kept) = keda_status::keep_readiness(status)
    {
        fields.insert("status".into(), kept);
    }
}

/// How long a failing watch waits before it lists again: doubling from
/// [`FIRST_RETRY`] to [`LAST_RETRY`], and back to the first only once the
/// API has answered (kube-runtime's own backoff starts over at every
/// `Init`, which opens each re-list, also one that is about to be refused:
/// a refused list was retried about once a second for good).
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// True for the events only an answering API server produces: a listed
/// object, a completed list, a watch event. `Init` is not one of them.
fn shows_the_api_answering<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}

/// Drives a reflector's stream until `cancel`, keeping in `error` why the
/// watch of `resource` fails while it does; `grant` completes the advice
/// for a 403. One warning when an outage starts and one line when the
/// watch works again, however long it lasts and however often it is
/// retried in between.
fn follow<S, K>(
    stream: S,
    resource: &'static str,
    grant: &'static str,
    error: Arc<Mutex<Option<String>>>,
    cancel: CancellationToken,
    on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
) where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut retry = FIRST_RETRY;
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                next = stream.next() => next,
            };
            let Some(event) = next else { return };
            match event {
                Ok(event) => {
                    on_event(&event);
                    if shows_the_api_answering(&event) {
                        retry = FIRST_RETRY;
                        let mut error = error.lock().unwrap_or_else(|e| e.into_inner());
                        if error.take().is_some() {
                            info!(resource, "watching again");
                        }
                    }
                }
                Err(failure) => {
                    let reason = describe_watch_error(resource, grant, &failure);
                    {
                        let mut error = error.lock().unwrap_or_else(|e| e.into_inner());
                        match error.as_deref() {
                            None => {
                                warn!(resource, error = %reason, retry_in = ?retry, "cannot watch")
                            }
                            Some(before) if before != reason => {
                                debug!(resource, error = %reason, "still cannot watch")
                            }
                            Some(_) => {}
                        }
                        *error = Some(reason);
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(LAST_RETRY);
                }
            }
        }
    });
}

/// Why the watch of `resource` fails; `grant` completes the advice for a
/// 403 (which RBAC rule grants it).
fn describe_watch_error(resource: &str, grant: &str, error: &watcher::Error) -> String {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status),
        watcher::Error::WatchError(status) => Some(status),
        _ => None,
    };
    match status {
        Some(status) if status.code == 403 => format!(
            "listing {resource} is forbidden (403): grant hoist's ServiceAccount list/watch on {resource}{grant} ({})",
            status.message
        ),
        Some(status) => format!(
            "listing {resource}: the API server answered {} {}: {}",
            status.code, status.reason, status.message
        ),
        None => format!("listing {resource}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type WatchError = Arc<Mutex<Option<String>>>;

    /// `follow` of the ScaledObject watch over `stream`: where it keeps
    /// the error, and what stops it.
    fn followed<S>(stream: S) -> (WatchError, CancellationToken)
    where
        S: futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>
            + Send
            + 'static,
    {
        let error = Arc::new(Mutex::new(None));
        let cancel = CancellationToken::new();
        follow(
            stream,
            "scaledobjects.keda.sh",
            "",
            error.clone(),
            cancel.clone(),
            |_| {},
        );
        (error, cancel)
    }

    /// kube-runtime's watcher against an API server that refuses every
    /// list: `Init` (it opens each re-list), then the refusal, for good.
    /// hoist took that `Init` for recovery and reset its backoff: a list
    /// about once a second, and two log lines each time.
    #[tokio::test(start_paused = true)]
    async fn a_refused_list_backs_off_and_an_init_is_no_recovery() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let lists = Arc::new(AtomicUsize::new(0));
        let counted = lists.clone();
        let refusing = futures::stream::unfold(0u64, move |n| {
            let counted = counted.clone();
            async move {
                let item = if n % 2 == 0 {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok(watcher::Event::<DynamicObject>::Init)
                } else {
                    Err(watcher::Error::NoResourceVersion)
                };
                Some((item, n + 1))
            }
        });
        let (error, cancel) = followed(refusing);
        tokio::time::sleep(Duration::from_secs(60)).await;
        // Lists at 0, 1, 3, 7, 15 and 31 s (waits doubling from 1 s), the
        // next at 61 s: six in the first minute, where it was sixty.
        let tried = lists.load(Ordering::SeqCst);
        assert_eq!(tried, 6, "lists in a minute of refusals");
        assert!(
            error.lock().unwrap().is_some(),
            "the refusal stays reported across the Init of every retry"
        );
        cancel.cancel();
    }

    /// A list that completes is the API answering again: the error clears
    /// (for `/status`) and the next failure waits the first retry again.
    #[tokio::test(start_paused = true)]
    async fn a_completed_list_clears_the_error() {
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::<DynamicObject>::Init),
            Err(watcher::Error::NoResourceVersion),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
        ])
        .chain(futures::stream::pending());
        let (error, cancel) = followed(events);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(error.lock().unwrap().is_some(), "refused, then waiting");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*error.lock().unwrap(), None, "listed again");
        cancel.cancel();
    }

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
