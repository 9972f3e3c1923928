//! The driver: background pollers shared by every ScaledObject that asks
//! the same question, a cache of their readings, and the bookkeeping of who
//! asked what. It is the only layer with a clock and tasks.

mod cluster_follow;
mod poller;
mod reading;
mod scaling;
mod table;
mod target_index;
mod unreconciled;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use poller::Schedule;
use poller::{Poller, Scheduler};
pub use reading::{PollError, Reading};
pub use scaling::{
    Answer, Clock, CountPolicy, CountSource, Counting, HPA_SYNC_MILLIS, Insight, MetadataRules,
    Scaling,
};
use table::Triggers;

use arc_swap::ArcSwap;

use crate::auth_profiles::AuthProfiles;
use crate::callers::Caller;
use crate::cluster::{AuthenticationRef, Cluster, ResolvedAuth, TriggerAuthError};
use crate::engine::{Decision, Rules};
use crate::metadata::{AuthParams, MetadataError};
use crate::metrics::Metrics;
use crate::persist::{self, Snapshot};
use crate::routing::{Owner, Registry, RouteError};
use crate::trigger::{self, Defaults, ScalingMode, TriggerConfig};

#[derive(Debug, Clone)]
pub struct DriverSettings {
    pub defaults: Defaults,
    /// A trigger nobody asked about for this long is dropped.
    pub idle_after: Duration,
    pub max_metadata_bytes: usize,
    pub max_tracked_triggers: usize,
    /// Most triggers tracked at once for the ScaledObjects of one namespace.
    pub max_tracked_triggers_per_namespace: usize,
    /// Metadata bytes of every tracked trigger together, at most.
    pub max_tracked_metadata_bytes: usize,
    /// Empty: every source is allowed.
    pub allowed_sources: Vec<SourcePattern>,
    /// hoist's own parts triggers may measure (the interceptor).
    pub context: crate::scalers::Context,
    /// `engine.assume_applied`: without a known replica count, engines
    /// compute from their own last decision instead of answering
    /// `Unavailable`.
    pub assume_applied: bool,
    /// What routes ScaledObjects may declare; none without an interceptor.
    pub routes: Option<crate::routing::RouteRules>,
}

impl DriverSettings {
    /// The driver's part of hoist's settings, at start and at every
    /// reload; `traffic` is where this process reads the interceptor
    /// (fixed at start).
    pub fn from_config(
        settings: &crate::config::Settings,
        traffic: Option<crate::interceptor::traffic::Traffic>,
    ) -> Self {
        Self {
            defaults: Defaults {
                polling_interval: settings.polling.default_interval,
                timeout: settings.polling.default_timeout,
            },
            idle_after: settings.polling.idle_after,
            max_metadata_bytes: settings.limits.max_metadata_bytes,
            max_tracked_triggers: settings.limits.max_tracked_triggers,
            max_tracked_triggers_per_namespace: settings.limits.max_tracked_triggers_per_namespace,
            max_tracked_metadata_bytes: settings.limits.max_tracked_metadata_bytes,
            allowed_sources: settings
                .limits
                .allowed_sources
                .iter()
                .filter_map(|pattern| SourcePattern::new(pattern).ok())
                .collect(),
            routes: traffic.is_some().then(|| crate::routing::RouteRules {
                interceptor: settings.interceptor.clone(),
                config_routes: crate::interceptor::table::config_routes(&settings.interceptor),
            }),
            context: crate::scalers::Context {
                traffic,
                owner: None,
                cluster_domain: settings.interceptor.cluster_domain.clone(),
                authentication: None,
                kafka: Default::default(),
            },
            assume_applied: settings.engine.assume_applied,
        }
    }

    /// No limits beyond the defaults' own; for tests and tools.
    pub fn unlimited(defaults: Defaults, idle_after: Duration) -> Self {
        Self {
            defaults,
            idle_after,
            max_metadata_bytes: usize::MAX,
            max_tracked_triggers: usize::MAX,
            max_tracked_triggers_per_namespace: usize::MAX,
            max_tracked_metadata_bytes: usize::MAX,
            allowed_sources: Vec::new(),
            context: Default::default(),
            assume_applied: false,
            routes: None,
        }
    }
}

pub use crate::config::SourcePattern;

/// Why a trigger is not tracked.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    #[error("bad trigger metadata: {0}")]
    Metadata(#[from] MetadataError),
    #[error(
        "the trigger's metadata is {size} bytes; hoist accepts at most {limit} (limits.max_metadata_bytes)"
    )]
    MetadataTooLarge { size: usize, limit: usize },
    #[error(
        "ScaledObject {namespace}/{name}: hoist already tracks {limit} triggers (limits.max_tracked_triggers); idle ones are dropped after polling.idle_after"
    )]
    TooManyTriggers {
        namespace: String,
        name: String,
        limit: usize,
    },
    #[error(
        "ScaledObject {namespace}/{name}: hoist already tracks {limit} triggers in namespace {namespace} (limits.max_tracked_triggers_per_namespace); idle ones are dropped after polling.idle_after"
    )]
    TooManyInNamespace {
        namespace: String,
        name: String,
        limit: usize,
    },
    /// Values of `FromEnv` keys are the caller's word: a new one takes the
    /// trigger over only once the old one is no longer asked, which
    /// KEDA's own calls keep doing while they carry it.
    #[error(
        "ScaledObject {namespace}/{name}: this trigger is tracked already with other values of its `FromEnv` keys, asked {asked_ago:?} ago; one trigger of a ScaledObject is one tracked trigger (the limit), and new values replace the old only once those go unasked for {quiet:?}"
    )]
    TriggerHeld {
        namespace: String,
        name: String,
        asked_ago: Duration,
        quiet: Duration,
    },
    #[error(
        "the triggers hoist tracks already hold {limit} bytes of metadata (limits.max_tracked_metadata_bytes); idle ones are dropped after polling.idle_after"
    )]
    MetadataBudget { limit: usize },
    #[error("`{endpoint}` is not among hoist's allowed sources (limits.allowed_sources)")]
    SourceNotAllowed { endpoint: String },
    #[error("bad trigger metadata: {0}")]
    Route(#[from] RouteError),
    #[error("{0}")]
    TriggerAuth(#[from] TriggerAuthError),
    #[error("`{key}`: {reason} ({setting})")]
    NotLent {
        key: String,
        setting: &'static str,
        reason: String,
    },
}

/// Whether hoist may lend the caller of `key` the credentials it holds
/// (an `authRef` profile, or the TriggerAuthentication of an
/// `authenticationRef`): only a proven caller may have them (without
/// cluster access a namespace is the caller's word), and only for values
/// hoist could check: a `*FromEnv` value is whatever the caller sends
/// (KEDA reads it from the scale target's environment), so a stranger
/// naming the right ScaledObject could point the credentials at its own
/// server through one.
fn lendable(
    key: &TriggerKey,
    caller: &Caller,
    trigger_authentication: bool,
) -> Result<(), TrackError> {
    let profile = key.metadata().any(|(name, _)| name == "authRef");
    if !profile && !trigger_authentication {
        return Ok(());
    }
    let source = if profile {
        "authRef"
    } else {
        "authenticationRef"
    };
    if !caller.proven {
        return Err(TrackError::NotLent {
            key: source.to_string(),
            setting: "grpc.trust_callers",
            reason: "hoist cannot check who asks (no cluster access, no gRPC mTLS), so it lends no credentials it holds; without a cluster, trust callers explicitly (single-tenant only)".to_string(),
        });
    }
    if caller.checked_in_cluster
        && let Some((from_env, _)) = key.metadata().find(|(name, _)| name.ends_with("FromEnv"))
    {
        return Err(TrackError::NotLent {
            key: from_env.to_string(),
            setting: source_setting(profile),
            reason: format!(
                "hoist cannot check a value KEDA reads from the scale target's environment, so it lends no credentials ({source}) to a trigger with one: write the value in the trigger's metadata, or put it in the credentials"
            ),
        });
    }
    Ok(())
}

fn source_setting(profile: bool) -> &'static str {
    if profile {
        "auth profiles"
    } else {
        "kubernetes.trigger_authentication"
    }
}

/// A trigger's metadata parsed with the settings and auth profiles in
/// force, and checked against `limits.allowed_sources`.
fn parse_allowed(
    key: &TriggerKey,
    settings: &DriverSettings,
    profiles: &AuthProfiles,
    authentication: Option<AuthParams>,
) -> Result<TriggerConfig, TrackError> {
    let context = crate::scalers::Context {
        owner: Some(Owner {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        }),
        authentication,
        ..settings.context.clone()
    };
    let mut config = trigger::parse(&key.metadata_map(), profiles, settings.defaults, &context)?;
    if !settings.allowed_sources.is_empty()
        && let Some(endpoint) = config
            .trigger
            .query
            .endpoints
            .iter()
            .find(|e| !settings.allowed_sources.iter().any(|p| p.allows(e)))
    {
        return Err(TrackError::SourceNotAllowed {
            endpoint: endpoint.clone(),
        });
    }
    // Checked: a tracked trigger need not hold them (a reload parses again).
    config.trigger.query.endpoints = Vec::new();
    Ok(config)
}

/// Who is asking: KEDA identifies a trigger by its ScaledObject and its
/// whole metadata map (one ScaledObject may have several triggers).
///
/// Keys compare and hash by `identity`, all of the above in one buffer:
/// with thousands of triggers asked in turn, comparing a dozen separately
/// allocated strings cost a cache miss each on every call. The metadata
/// lives only there (read back by [`TriggerKey::metadata`]), and the
/// trigger map's key shares the buffer: a tracked trigger holds its
/// metadata once, not three times.
#[derive(Debug, Clone)]
pub struct TriggerKey {
    pub namespace: String,
    pub name: String,
    identity: Arc<[u8]>,
}

impl PartialEq for TriggerKey {
    fn eq(&self, other: &Self) -> bool {
        self.identity == other.identity
    }
}

impl Eq for TriggerKey {}

impl TriggerKey {
    pub fn new(namespace: String, name: String, metadata: HashMap<String, String>) -> Self {
        Self::from_parts(namespace, name, metadata.into_iter().collect())
    }

    fn from_parts(namespace: String, name: String, mut metadata: Vec<(String, String)>) -> Self {
        metadata.sort_unstable();
        let strings = || {
            [&namespace, &name]
                .into_iter()
                .chain(metadata.iter().flat_map(|(key, value)| [key, value]))
        };
        let mut identity = Vec::with_capacity(strings().map(|s| s.len() + 4).sum());
        for string in strings() {
            push_length_prefixed(&mut identity, string);
        }
        Self {
            identity: identity.into(),
            namespace,
            name,
        }
    }

    /// What every identity of ScaledObject `namespace/name` starts with.
    fn object_prefix(namespace: &str, name: &str) -> Vec<u8> {
        let mut prefix = Vec::with_capacity(namespace.len() + name.len() + 8);
        push_length_prefixed(&mut prefix, namespace);
        push_length_prefixed(&mut prefix, name);
        prefix
    }

    /// Which trigger of its ScaledObject this is, whatever its `FromEnv`
    /// values: the identity without those keys (KEDA leaves one out when
    /// its variable is unset). None when it has none: the identity is
    /// the slot.
    fn slot(&self) -> Option<Vec<u8>> {
        if !self.metadata().any(|(name, _)| is_from_env(name)) {
            return None;
        }
        let mut slot = Self::object_prefix(&self.namespace, &self.name);
        for (name, value) in self.metadata().filter(|(name, _)| !is_from_env(name)) {
            push_length_prefixed(&mut slot, name);
            push_length_prefixed(&mut slot, value);
        }
        Some(slot)
    }

    /// Namespace, name and sorted metadata, each length-prefixed.
    fn identity(&self) -> &[u8] {
        &self.identity
    }

    /// The length-prefixed strings of `identity`, in order.
    fn strings(&self) -> impl Iterator<Item = &str> {
        let mut rest: &[u8] = &self.identity;
        std::iter::from_fn(move || {
            let (length, tail) = rest.split_first_chunk::<4>()?;
            let length = u32::from_le_bytes(*length) as usize;
            let (string, tail) = tail.split_at_checked(length)?;
            rest = tail;
            // Written from `String`s in `from_parts`: always UTF-8.
            std::str::from_utf8(string).ok()
        })
    }

    /// The metadata, sorted by key.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut strings = self.strings().skip(2);
        std::iter::from_fn(move || Some((strings.next()?, strings.next()?)))
    }

    /// The bytes `limits.max_metadata_bytes` counts: name, namespace,
    /// metadata keys and values.
    fn size(&self) -> usize {
        self.strings().map(str::len).sum()
    }

    pub fn metadata_map(&self) -> HashMap<String, String> {
        self.metadata()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }
}

fn is_from_env(key: &str) -> bool {
    key.ends_with("FromEnv")
}

/// Length-prefixed: no two different keys share an identity, and a
/// ScaledObject's identities share a prefix.
fn push_length_prefixed(buffer: &mut Vec<u8>, string: &str) {
    let length = u32::try_from(string.len()).unwrap_or(u32::MAX);
    buffer.extend_from_slice(&length.to_le_bytes());
    buffer.extend_from_slice(string.as_bytes());
}

/// A trigger hoist is tracking, and the reading of its source.
pub struct Tracked {
    pub key: TriggerKey,
    pub config: TriggerConfig,
    /// The engine deciding for this trigger's ScaledObject (engine mode).
    pub scaling: Option<Arc<Scaling>>,
    id: u64,
    readings: watch::Receiver<Reading>,
    interval_ms: Arc<AtomicU64>,
    last_seen_ms: AtomicU64,
    open_streams: AtomicUsize,
    /// When a `StreamIsActive` stream of it last opened or closed (ms
    /// since `epoch`; 0: never): KEDA pushes to it (`external-push`).
    last_streamed_ms: AtomicU64,
    epoch: Instant,
    /// The TriggerAuthentication its credentials came from, and the
    /// version they were read at (a rotation shows as a new version).
    /// Boxed: most triggers have none, and every tracked trigger holds
    /// this field.
    credentials: Option<Box<(AuthenticationRef, String)>>,
}

impl Tracked {
    /// The latest reading, without waiting.
    pub fn latest(&self) -> Reading {
        self.readings.borrow().clone()
    }

    /// The latest reading; while the first measurement is still running,
    /// waits for it up to the trigger's timeout, but never longer than
    /// a second: KEDA's metrics adapter gives the HPA's call
    /// 3 s in all and retries once, so an answer must leave that budget
    /// (the measurement goes on in the background for the retry).
    pub async fn current(&self) -> Reading {
        // The usual case, answered without setting up a wait: a reading
        // is there and its poller is running.
        {
            let latest = self.readings.borrow();
            if !matches!(*latest, Reading::Pending) && self.readings.has_changed().is_ok() {
                return latest.clone();
            }
        }
        let mut readings = self.readings.clone();
        let first = readings.wait_for(|reading| *reading != Reading::Pending);
        let outcome = tokio::time::timeout(self.first_wait(), first)
            .await
            .map(|waited| waited.map(|reading| reading.clone()));
        let polled = readings.has_changed().is_ok();
        match outcome {
            Ok(Ok(reading)) if polled => reading,
            // The poller is gone (shutting down): nothing here is current.
            Ok(_) => Reading::Failed {
                error: PollError::Stopped,
                at: Instant::now(),
                consecutive_failures: 0,
                last_value: self.latest().last_value(),
            },
            Err(_) => self.latest(),
        }
    }

    /// The engine's latest answer (engine mode); while there is none yet,
    /// waits for the first up to the trigger's timeout.
    pub async fn answer(&self) -> Option<Answer> {
        let scaling = self.scaling.as_ref()?;
        let mut answers = scaling.answers();
        let first = answers.wait_for(Option::is_some);
        match tokio::time::timeout(self.config.timeout, first).await {
            Ok(Ok(answer)) => answer.clone(),
            _ => scaling.answer(),
        }
    }

    /// The engine's latest decision (engine mode), waiting as [`Tracked::answer`].
    pub async fn decision(&self) -> Option<Decision> {
        match self.answer().await? {
            Answer::Decided(decision) => Some(decision),
            Answer::CountUnknown(_) => None,
        }
    }

    /// The polling interval in force: the trigger's `pollingInterval`, else
    /// its ScaledObject's, else the default.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// How long a call waits for a new trigger's first measurement: a
    /// second at most (KEDA's metrics adapter gives the HPA's call 3 s and
    /// retries once), or the trigger's timeout when shorter.
    pub fn first_wait(&self) -> Duration {
        const FIRST_READING_WAIT: Duration = Duration::from_secs(1);
        self.config.timeout.min(FIRST_READING_WAIT)
    }

    /// A receiver that wakes on every new reading.
    pub fn watch(&self) -> watch::Receiver<Reading> {
        self.readings.clone()
    }

    /// Marks the trigger as wanted, postponing its eviction.
    pub fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_seen_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Holds the trigger against eviction while a `StreamIsActive` stream
    /// is open; dropping the guard releases it.
    pub fn stream_guard(self: &Arc<Self>) -> StreamGuard {
        self.open_streams.fetch_add(1, Ordering::Relaxed);
        self.note_stream();
        StreamGuard(self.clone())
    }

    fn note_stream(&self) {
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.last_streamed_ms.store(now, Ordering::Relaxed);
    }

    /// KEDA pushes to it: a stream is open, or was within
    /// [`PUSHED_LATELY`] (a ScaledObject moved to `external` stops
    /// counting then; a deleted one when it is evicted).
    fn pushed_lately(&self) -> bool {
        if self.open_streams.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let last = self.last_streamed_ms.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64;
        last != 0 && now.saturating_sub(last) < PUSHED_LATELY.as_millis() as u64
    }

    /// The refusal of `key`, this trigger with other `FromEnv` values,
    /// while this one is still asked: streamed, or asked within two of
    /// its polls and an HPA sync (KEDA asks at every poll, the HPA every
    /// 15 s while the target runs). A forged value therefore never takes
    /// the place of the one KEDA keeps asking, and an engine never swaps
    /// between them; a real change (the scale target's environment
    /// edited) takes over once KEDA asks only the new value.
    fn held_against(&self, key: &TriggerKey, now: Instant) -> Option<TrackError> {
        let quiet = self.interval() * 2 + Duration::from_millis(HPA_SYNC_MILLIS);
        let asked_ago = self.idle_for(now);
        let streamed = self.open_streams.load(Ordering::Relaxed) > 0;
        (streamed || asked_ago < quiet).then(|| TrackError::TriggerHeld {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            asked_ago,
            quiet,
        })
    }

    fn idle_for(&self, now: Instant) -> Duration {
        let last_seen =
            self.epoch + Duration::from_millis(self.last_seen_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last_seen)
    }

    /// Whether an activity value (see [`crate::scalers::Measurement`])
    /// is above the trigger's activation threshold.
    pub fn is_active(&self, activity: f64) -> bool {
        activity > self.config.trigger.activation_target
    }
}

/// How long a trigger counts as pushed to after its last stream
/// (`hoist_push_triggers`).
const PUSHED_LATELY: Duration = Duration::from_secs(6 * 3600);

pub struct StreamGuard(Arc<Tracked>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.note_stream();
        self.0.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Inner {
    /// Swapped whole by a config reload; a trigger is checked against the
    /// settings in force when it is first tracked.
    settings: ArcSwap<DriverSettings>,
    profiles: ArcSwap<AuthProfiles>,
    /// Routes ScaledObjects declare (when there is an interceptor).
    routes: Option<Arc<Registry>>,
    metrics: Arc<Metrics>,
    /// Lock order: `triggers` before `pollers`.
    triggers: RwLock<Triggers>,
    pollers: Mutex<HashMap<Arc<str>, Poller>>,
    /// Runs every poller's polls.
    scheduler: Scheduler,
    /// Engine-mode ScaledObjects by (namespace, name). Locked after `pollers`.
    scalings: Mutex<BTreeMap<(String, String), Arc<Scaling>>>,
    /// The engines by the target they scale.
    targets: Arc<target_index::TargetIndex>,
    /// Engine state restored from `state_file`, waiting for its
    /// ScaledObject to be seen again.
    restored: Mutex<std::collections::BTreeMap<String, crate::engine::State>>,
    /// The cluster, when engine mode can read it.
    cluster: std::sync::OnceLock<Arc<Cluster>>,
    /// The port KEDA calls this hoist on (its gRPC listener's), once bound.
    grpc_port: std::sync::OnceLock<u16>,
    /// Signalled when an engine's decision changes.
    changed: Arc<tokio::sync::Notify>,
    clock: Clock,
    cancel: CancellationToken,
    next_id: AtomicU64,
    epoch: Instant,
    /// Metadata bytes of every tracked trigger (see [`TriggerKey::size`]).
    tracked_metadata: AtomicUsize,
}

/// Cheap to clone: every clone is the same driver.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

impl Driver {
    /// Creates the driver and starts its eviction sweep. Everything stops
    /// when `cancel` is cancelled.
    pub fn new(
        settings: DriverSettings,
        profiles: AuthProfiles,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
    ) -> Self {
        let changed = Arc::new(tokio::sync::Notify::new());
        let routes = settings
            .routes
            .clone()
            .map(|rules| Arc::new(Registry::new(rules, changed.clone())));
        let scheduler = Scheduler::start(metrics.clone(), cancel.clone());
        let driver = Self {
            inner: Arc::new(Inner {
                settings: ArcSwap::from_pointee(settings),
                profiles: ArcSwap::from_pointee(profiles),
                routes,
                metrics,
                triggers: RwLock::new(Triggers::default()),
                pollers: Mutex::new(HashMap::new()),
                scheduler,
                scalings: Mutex::new(BTreeMap::new()),
                targets: Arc::default(),
                restored: Mutex::new(Default::default()),
                cluster: std::sync::OnceLock::new(),
                grpc_port: std::sync::OnceLock::new(),
                changed,
                clock: Clock::new(),
                cancel,
                next_id: AtomicU64::new(1),
                epoch: Instant::now(),
                tracked_metadata: AtomicUsize::new(0),
            }),
        };
        tokio::spawn(driver.clone().sweep_idle());
        driver
    }

    /// Lets engines read replica counts and ScaledObjects from `cluster`
    /// (before the first trigger is tracked), and follows its
    /// ScaledObjects: declared routes, callers, polling intervals.
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        if self.inner.cluster.set(cluster.clone()).is_ok() {
            if let Some(routes) = &self.inner.routes {
                routes.follow_cluster();
            }
            tokio::spawn(cluster_follow::follow_targets(
                self.clone(),
                cluster.clone(),
            ));
            tokio::spawn(cluster_follow::follow(self.clone(), cluster));
        }
    }

    /// Where KEDA calls this hoist: the gRPC listener's port, which tells
    /// this hoist's ScaledObjects from another's in one cluster.
    pub fn set_grpc_port(&self, port: u16) {
        let _ = self.inner.grpc_port.set(port);
    }

    pub fn grpc_port(&self) -> Option<u16> {
        self.inner.grpc_port.get().copied()
    }

    pub fn cluster(&self) -> Option<Arc<Cluster>> {
        self.inner.cluster.get().cloned()
    }

    /// Resolves whenever an engine's decision changes: state worth saving.
    pub fn state_changes(&self) -> Arc<tokio::sync::Notify> {
        self.inner.changed.clone()
    }

    /// The trigger for `key` if it is tracked already (the usual case:
    /// every call after the first). Its route is claimed again: the
    /// ScaledObject's route is the one its trigger asked last, so an edit
    /// undone (old metadata asked again) takes it back.
    pub fn lookup(&self, key: &TriggerKey) -> Result<Option<Arc<Tracked>>, TrackError> {
        let Some(tracked) = self.read_triggers().get(key.identity()).cloned() else {
            return Ok(None);
        };
        if self.credentials_rotated(&tracked) {
            // Tracked anew with what the Secret holds now.
            info!(namespace = %key.namespace, scaled_object = %key.name, "the trigger's TriggerAuthentication or Secret changed: reading its credentials again");
            let mut triggers = self
                .inner
                .triggers
                .write()
                .unwrap_or_else(|e| e.into_inner());
            self.forget(&mut triggers, key);
            return Ok(None);
        }
        tracked.touch();
        if let (Some(spec), Some(routes)) = (&tracked.config.trigger.route, &self.inner.routes) {
            routes.claim(key.identity(), spec)?;
        }
        Ok(Some(tracked))
    }

    /// The tracked trigger for `key`, parsing its metadata and starting (or
    /// joining) a poller the first time it is seen. `caller` is what
    /// [`crate::callers`] found out about who asked.
    pub fn track(&self, key: TriggerKey, caller: &Caller) -> Result<Arc<Tracked>, TrackError> {
        if let Some(tracked) = self.lookup(&key)? {
            return Ok(tracked);
        }
        let settings = self.inner.settings.load();
        let size = key.size();
        if size > settings.max_metadata_bytes {
            return Err(TrackError::MetadataTooLarge {
                size,
                limit: settings.max_metadata_bytes,
            });
        }
        // Checked before anything is parsed or asked of the cluster: a
        // forged `FromEnv` value costs a lookup.
        let replaces = {
            let triggers = self.read_triggers();
            match triggers.holder_of_slot(&key) {
                Some(holder) => {
                    if let Some(refusal) = holder.held_against(&key, Instant::now()) {
                        return Err(refusal);
                    }
                    true
                }
                None => false,
            }
        };
        // A trigger taking its own old values' place adds none.
        if !replaces && self.read_triggers().len() >= settings.max_tracked_triggers {
            return Err(TrackError::TooManyTriggers {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                limit: settings.max_tracked_triggers,
            });
        }
        let tracked_bytes = self.inner.tracked_metadata.load(Ordering::Relaxed);
        if tracked_bytes.saturating_add(size) > settings.max_tracked_metadata_bytes {
            return Err(TrackError::MetadataBudget {
                limit: settings.max_tracked_metadata_bytes,
            });
        }
        let credentials = self.credentials(&key, caller)?;
        lendable(&key, caller, credentials.is_some())?;
        let config = parse_allowed(
            &key,
            &settings,
            &self.inner.profiles.load(),
            credentials
                .as_ref()
                .map(|(_, resolved)| resolved.params.clone()),
        )?;
        let credentials = credentials.map(|(reference, resolved)| (reference, resolved.version));
        // Claimed before tracking: a trigger that replaces an older one of
        // its ScaledObject (an edit) takes the route over, never dropping it.
        let declared = config.trigger.route.clone();
        if let Some(spec) = &declared {
            if !caller.proven {
                return Err(RouteError::Denied {
                    key: "upstream",
                    setting: "grpc.trust_callers",
                    reason: "hoist cannot check who declares this route: it has no cluster access (kubernetes.enabled), and gRPC callers are not proven by mTLS (grpc.tls.client_ca_file) nor trusted by the operator".to_string(),
                }
                .into());
            }
            let routes = self.inner.routes.as_ref().ok_or_else(|| {
                MetadataError::invalid(
                    "upstream",
                    "this hoist runs no interceptor to route through",
                )
            })?;
            routes.claim(key.identity(), spec)?;
        }
        let identity = key.identity.clone();
        self.track_with_credentials(key, config, credentials)
            .inspect_err(|_| {
                if let (Some(spec), Some(routes)) = (&declared, &self.inner.routes) {
                    routes.release(&identity, &spec.name);
                }
            })
    }

    /// The credentials of the caller's TriggerAuthentication, when hoist
    /// resolves them (`kubernetes.trigger_authentication`); otherwise the
    /// trigger's `authenticationRef` is KEDA's own business (the TLS it
    /// uses to reach hoist) and is left alone.
    fn credentials(
        &self,
        key: &TriggerKey,
        caller: &Caller,
    ) -> Result<Option<(AuthenticationRef, ResolvedAuth)>, TrackError> {
        let Some(reference) = &caller.authentication else {
            return Ok(None);
        };
        Ok(self
            .resolve_credentials(&key.namespace, reference)?
            .map(|resolved| (reference.clone(), resolved)))
    }

    fn resolve_credentials(
        &self,
        namespace: &str,
        reference: &AuthenticationRef,
    ) -> Result<Option<ResolvedAuth>, TrackError> {
        let Some(cluster) = self.cluster() else {
            return Ok(None);
        };
        match cluster.trigger_authentication(namespace, reference) {
            Ok(resolved) => Ok(Some(resolved)),
            Err(TriggerAuthError::Disabled { .. }) => Ok(None),
            Err(error) => Err(TrackError::TriggerAuth(error)),
        }
    }

    /// Whether the TriggerAuthentication (or a Secret it reads) changed
    /// since the trigger's credentials were read.
    fn credentials_rotated(&self, tracked: &Tracked) -> bool {
        let Some((reference, version)) = tracked.credentials.as_deref() else {
            return false;
        };
        match self.resolve_credentials(&tracked.key.namespace, reference) {
            Ok(Some(resolved)) => resolved.version != *version,
            // A watch hiccup is no rotation: keep what was read.
            Err(TrackError::TriggerAuth(TriggerAuthError::NotSynced { .. })) => false,
            // Gone or refused: tracked anew, the refusal says why.
            Ok(None) | Err(_) => true,
        }
    }

    /// Settings from a reloaded config, for triggers tracked from now on
    /// (tracked ones keep what they were checked against). Refused whole
    /// when the new config routes take a declared route's claim, or when
    /// `first` refuses: see [`Registry::reconfigure`].
    pub fn reconfigure<E: From<RouteError>>(
        &self,
        settings: DriverSettings,
        profiles: AuthProfiles,
        first: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        // The Kafka clients outlive a reload: triggers parsed after it
        // share the clients of those parsed before.
        let mut settings = settings;
        settings.context.kafka = self.inner.settings.load().context.kafka.clone();
        match (&self.inner.routes, &settings.routes) {
            (Some(routes), Some(rules)) => routes.reconfigure(rules.clone(), first)?,
            _ => first()?,
        }
        self.inner.settings.store(Arc::new(settings));
        self.inner.profiles.store(Arc::new(profiles));
        self.revoke_disallowed();
        Ok(())
    }

    /// Stops tracked triggers the settings in force no longer allow (a
    /// removed or narrowed auth profile, a tightened
    /// `limits.allowed_sources`, a removed config route): they were
    /// checked against the old config, and a reload must not leave them
    /// polling. KEDA's next call is refused with the reason.
    fn revoke_disallowed(&self) {
        let settings = self.inner.settings.load();
        let profiles = self.inner.profiles.load();
        let refused: Vec<(TriggerKey, TrackError)> = self
            .read_triggers()
            .values()
            .filter_map(|tracked| {
                let authentication = match tracked.credentials.as_deref() {
                    None => Ok(None),
                    Some((reference, _)) => self
                        .resolve_credentials(&tracked.key.namespace, reference)
                        .map(|resolved| resolved.map(|r| r.params)),
                };
                authentication
                    .and_then(|authentication| {
                        parse_allowed(&tracked.key, &settings, &profiles, authentication)
                    })
                    .err()
                    .map(|error| (tracked.key.clone(), error))
            })
            .collect();
        if refused.is_empty() {
            return;
        }
        for (key, error) in &refused {
            warn!(namespace = %key.namespace, scaled_object = %key.name, %error, "trigger stopped: the reloaded config no longer allows it");
        }
        let keys: Vec<TriggerKey> = refused.into_iter().map(|(key, _)| key).collect();
        self.revoke(&keys, "reload");
    }

    /// Stops tracked triggers that are no longer allowed, counted by why.
    fn revoke(&self, keys: &[TriggerKey], reason: &str) {
        let mut triggers = self
            .inner
            .triggers
            .write()
            .unwrap_or_else(|e| e.into_inner());
        for key in keys {
            self.inner.metrics.revoked(reason);
            self.forget(&mut triggers, key);
        }
        self.inner
            .metrics
            .tracked_triggers
            .set(triggers.len() as i64);
    }

    /// The routes ScaledObjects declared, when this hoist has an interceptor.
    /// Whether sources are still polled: false once the poll scheduler has
    /// ended, at shutdown or through a bug (a panic in it). Nothing brings
    /// it back but a restart, so health checks say so.
    pub fn polling(&self) -> bool {
        self.inner.scheduler.running()
    }

    /// Resolves when the poll scheduler has ended.
    pub async fn polling_ended(&self) {
        self.inner.scheduler.ended().await;
    }

    #[cfg(test)]
    pub(crate) fn kill_scheduler(&self) {
        self.inner.scheduler.kill();
    }

    pub fn routes(&self) -> Option<Arc<Registry>> {
        self.inner.routes.clone()
    }

    /// Like [`Driver::track`], for a trigger already parsed.
    pub fn track_parsed(
        &self,
        key: TriggerKey,
        config: TriggerConfig,
    ) -> Result<Arc<Tracked>, TrackError> {
        self.track_with_credentials(key, config, None)
    }

    fn track_with_credentials(
        &self,
        key: TriggerKey,
        mut config: TriggerConfig,
        credentials: Option<(AuthenticationRef, String)>,
    ) -> Result<Arc<Tracked>, TrackError> {
        let mut triggers = self
            .inner
            .triggers
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(tracked) = triggers.get(key.identity()) {
            // Another request parsed the same trigger meanwhile.
            tracked.touch();
            return Ok(tracked.clone());
        }
        if let Some(holder) = triggers.holder_of_slot(&key).cloned() {
            if let Some(refusal) = holder.held_against(&key, Instant::now()) {
                return Err(refusal);
            }
            info!(namespace = %key.namespace, scaled_object = %key.name, "the trigger's FromEnv values changed and the old ones are no longer asked: replacing the old trigger");
            self.forget(&mut triggers, &holder.key);
        } else {
            // Under the lock: calls racing past it cannot overfill a namespace.
            let limit = self
                .inner
                .settings
                .load()
                .max_tracked_triggers_per_namespace;
            if triggers.in_namespace(&key.namespace) >= limit {
                return Err(TrackError::TooManyInNamespace {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    limit,
                });
            }
        }
        let scaling = match &config.scaling_mode {
            ScalingMode::Passthrough => None,
            ScalingMode::Engine(rules) => {
                // An edited ScaledObject arrives with new metadata, so a new
                // key: the trigger it replaces (same metric) goes at once.
                let superseded: Vec<TriggerKey> = triggers
                    .values()
                    .filter(|tracked| {
                        tracked.key.namespace == key.namespace
                            && tracked.key.name == key.name
                            && tracked.scaling.is_some()
                            && tracked.config.trigger.metric_name == config.trigger.metric_name
                    })
                    .map(|tracked| tracked.key.clone())
                    .collect();
                for old in &superseded {
                    info!(namespace = %key.namespace, scaled_object = %key.name, "trigger metadata changed: replacing the old trigger");
                    self.forget(&mut triggers, old);
                }
                let rules = MetadataRules {
                    rules: Rules::clone(rules),
                    written: config.written,
                };
                Some(self.scaling_for(&key, rules, &config.trigger.metric_name)?)
            }
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let interval = self.interval_for(&key, &config);
        let interval_ms = Arc::new(AtomicU64::new(interval.as_millis() as u64));
        let schedule = Schedule {
            interval,
            timeout: config.timeout,
        };
        let query = &config.trigger.query;
        let (readings, shared_query) = {
            let mut pollers = self.lock_pollers();
            if pollers.get(&query.key).is_some_and(Poller::is_dead) {
                warn!(source = %query.description, "replacing a poller that stopped unexpectedly");
                if let Some(dead) = pollers.remove(&query.key) {
                    dead.stop(&self.inner.metrics);
                    self.inner.metrics.pollers.dec();
                }
            }
            let poller = pollers.entry(query.key.clone()).or_insert_with(|| {
                info!(source = %query.description, "starting poller");
                self.inner.metrics.pollers.inc();
                Poller::spawn(
                    config.trigger.scaler,
                    query,
                    schedule,
                    &self.inner.scheduler,
                )
            });
            poller.subscribe(id, schedule);
            (poller.readings.clone(), poller.query().clone())
        };
        // The poller's question, the same as this one's: triggers sharing a
        // source share one copy of it (its connection settings, its key).
        config.trigger.query = shared_query;
        let query = &config.trigger.query;
        info!(
            namespace = %key.namespace,
            scaled_object = %key.name,
            scaler = config.trigger.scaler,
            source = %query.description,
            "tracking trigger"
        );
        if let Some(scaling) = &scaling {
            let trigger = &config.trigger;
            scaling.join(
                id,
                &trigger.metric_name,
                (trigger.target, trigger.activation_target),
                interval_ms.clone(),
                readings.clone(),
            );
        }
        let tracked = Arc::new(Tracked {
            key: key.clone(),
            config,
            scaling,
            id,
            readings,
            interval_ms,
            last_seen_ms: AtomicU64::new(0),
            open_streams: AtomicUsize::new(0),
            last_streamed_ms: AtomicU64::new(0),
            epoch: self.inner.epoch,
            credentials: credentials.map(Box::new),
        });
        tracked.touch();
        self.inner
            .tracked_metadata
            .fetch_add(key.size(), Ordering::Relaxed);
        triggers.insert(key.identity.clone(), tracked.clone());
        self.inner
            .metrics
            .tracked_triggers
            .set(triggers.len() as i64);
        Ok(tracked)
    }

    /// The engine of the trigger's ScaledObject, started on first use. Every
    /// engine-mode trigger of one ScaledObject must carry the same rules
    /// and report a distinct metric.
    fn scaling_for(
        &self,
        key: &TriggerKey,
        rules: MetadataRules,
        metric: &str,
    ) -> Result<Arc<Scaling>, MetadataError> {
        let mut scalings = self.lock_scalings();
        let object = (key.namespace.clone(), key.name.clone());
        if let Some(scaling) = scalings.get(&object) {
            if scaling.rules() != rules {
                // The newest metadata wins: the ScaledObject was edited and
                // its other triggers will follow on their next call.
                info!(
                    namespace = %key.namespace,
                    scaled_object = %key.name,
                    changed = %first_difference(&scaling.rules().rules, &rules.rules),
                    "engine rules changed"
                );
                scaling.set_rules(rules);
            }
            if scaling.has_trigger(metric) {
                return Err(MetadataError::invalid(
                    "scalingMode",
                    format!(
                        "another engine-mode trigger of ScaledObject {}/{} already reports \
                         metric `{metric}`: in engine mode the triggers of one ScaledObject \
                         must measure different things",
                        key.namespace, key.name
                    ),
                ));
            }
            return Ok(scaling.clone());
        }
        let restored = self
            .inner
            .restored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&persist::key(&key.namespace, &key.name));
        // A record saved while the count was unknown holds no count: its
        // `currentReplicas` of 0 must never stand in for the real one.
        let count_restored = restored.as_ref().is_some_and(|state| state.count_known);
        match &restored {
            Some(_) if count_restored => {
                info!(namespace = %key.namespace, scaled_object = %key.name, "engine state restored");
            }
            Some(_) => {
                info!(namespace = %key.namespace, scaled_object = %key.name, "engine state restored without a count: it was saved while the count was unknown");
            }
            None => {}
        }
        let counting = match self.cluster() {
            Some(cluster) => Counting::Cluster(cluster),
            None => Counting::OwnDecisions,
        };
        let scaling = Scaling::start(scaling::Start {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            rules,
            policy: CountPolicy {
                assume_applied: self.inner.settings.load().assume_applied,
                restored: count_restored,
            },
            state: restored.unwrap_or_default(),
            counting,
            clock: self.inner.clock,
            changed: self.inner.changed.clone(),
            cancel: self.inner.cancel.child_token(),
            metrics: self.inner.metrics.clone(),
            targets: self.inner.targets.clone(),
        });
        scalings.insert(object, scaling.clone());
        Ok(scaling)
    }

    /// Hands over state saved by an earlier run; each ScaledObject takes
    /// its own when its first engine-mode trigger arrives.
    pub fn restore(&self, snapshot: Snapshot) {
        if let Some(routes) = &self.inner.routes {
            routes.restore(snapshot.routes, !snapshot.routes_settling);
        }
        *self
            .inner
            .restored
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = snapshot.scaled_objects;
    }

    /// The state of every engine, for `state_file` (restored state not yet
    /// claimed is kept too).
    pub fn snapshot(&self) -> Snapshot {
        let mut scaled_objects = self
            .inner
            .restored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for scaling in self.scalings() {
            scaled_objects.insert(
                persist::key(&scaling.namespace, &scaling.name),
                scaling.state(),
            );
        }
        let (routes, routes_settling) = self
            .inner
            .routes
            .as_ref()
            .map(|routes| routes.snapshot())
            .unwrap_or_default();
        Snapshot {
            version: persist::VERSION,
            scaled_objects,
            routes,
            routes_settling,
        }
    }

    /// Every engine-mode ScaledObject.
    pub fn scalings(&self) -> Vec<Arc<Scaling>> {
        self.lock_scalings().values().cloned().collect()
    }

    /// The engines whose ScaledObjects scale `kind` `namespace/name` (as
    /// each last read its object).
    pub fn scalings_of_target(&self, namespace: &str, kind: &str, name: &str) -> Vec<Arc<Scaling>> {
        let names = self.inner.targets.engines_of(namespace, kind, name);
        let scalings = self.lock_scalings();
        names
            .into_iter()
            .filter_map(|object| scalings.get(&(namespace.to_string(), object)).cloned())
            // A name filed by an engine since replaced: the new one decides
            // for itself once it has read its object.
            .filter(|scaling| scaling.scales(namespace, kind, name))
            .collect()
    }

    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    /// Every tracked trigger.
    pub fn tracked(&self) -> Vec<Arc<Tracked>> {
        self.read_triggers().values().cloned().collect()
    }

    /// How many distinct source queries are being polled.
    pub fn poller_count(&self) -> usize {
        self.lock_pollers().len()
    }

    /// Resolves when the driver is shutting down.
    pub fn shutting_down(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.inner.cancel.cancelled()
    }

    /// Drops triggers idle for longer than `idle_after` and stops pollers
    /// left without subscribers. Returns how many triggers were dropped.
    pub fn evict_idle(&self) -> usize {
        let now = Instant::now();
        let idle_after = self.inner.settings.load().idle_after;
        if let Some(routes) = &self.inner.routes {
            routes.drop_unclaimed(idle_after);
        }
        let mut triggers = self
            .inner
            .triggers
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let idle: Vec<TriggerKey> = triggers
            .values()
            .filter(|t| {
                t.open_streams.load(Ordering::Relaxed) == 0 && t.idle_for(now) >= idle_after
            })
            .map(|t| t.key.clone())
            .collect();
        for key in &idle {
            info!(
                namespace = %key.namespace,
                scaled_object = %key.name,
                idle_for = ?idle_after,
                "dropping idle trigger"
            );
            self.forget(&mut triggers, key);
        }
        self.inner
            .metrics
            .tracked_triggers
            .set(triggers.len() as i64);
        idle.len()
    }

    /// Stops tracking `key`: leaves its poller (stopped when nobody is left)
    /// and its engine (stopped likewise). The caller holds `triggers`.
    fn forget(&self, triggers: &mut Triggers, key: &TriggerKey) {
        let Some(tracked) = triggers.remove(key.identity()) else {
            return;
        };
        if let (Some(spec), Some(routes)) = (&tracked.config.trigger.route, &self.inner.routes) {
            routes.release(key.identity(), &spec.name);
        }
        self.inner
            .tracked_metadata
            .fetch_sub(tracked.key.size(), Ordering::Relaxed);
        let query = &tracked.config.trigger.query;
        {
            let mut pollers = self.lock_pollers();
            let empty = pollers
                .get_mut(&query.key)
                .is_some_and(|poller| poller.unsubscribe(tracked.id));
            if empty && let Some(poller) = pollers.remove(&query.key) {
                info!(source = %query.description, "stopping poller");
                poller.stop(&self.inner.metrics);
                self.inner.metrics.pollers.dec();
            }
        }
        if let Some(scaling) = &tracked.scaling
            && scaling.leave(tracked.id)
        {
            scaling.stop();
            self.lock_scalings()
                .remove(&(key.namespace.clone(), key.name.clone()));
        }
    }

    /// A trigger's polling interval: its own `pollingInterval`, else its
    /// ScaledObject's `spec.pollingInterval` (KEDA's built-in scalers are
    /// polled at that cadence, and KEDA never sends it to an external
    /// scaler), else the scaler's or hoist's default.
    fn interval_for(&self, key: &TriggerKey, config: &TriggerConfig) -> Duration {
        if config.written.contains("pollingInterval") {
            return config.polling_interval;
        }
        self.cluster()
            .and_then(|cluster| cluster.scaled_object(&key.namespace, &key.name).ok())
            .and_then(|object| object.settings.polling_interval)
            .filter(|seconds| (1..=crate::config::MAX_POLLING_INTERVAL).contains(seconds))
            .map_or(config.polling_interval, Duration::from_secs)
    }

    /// Follows an edit of a ScaledObject's `pollingInterval`: re-schedules
    /// the trigger's poller when it takes that interval.
    fn refresh_interval(&self, tracked: &Tracked) {
        let interval = self.interval_for(&tracked.key, &tracked.config);
        if interval == tracked.interval() {
            return;
        }
        info!(
            namespace = %tracked.key.namespace,
            scaled_object = %tracked.key.name,
            interval = ?interval,
            "polling interval changed"
        );
        tracked
            .interval_ms
            .store(interval.as_millis() as u64, Ordering::Relaxed);
        let query = &tracked.config.trigger.query;
        if let Some(poller) = self.lock_pollers().get_mut(&query.key) {
            poller.subscribe(
                tracked.id,
                Schedule {
                    interval,
                    timeout: tracked.config.timeout,
                },
            );
        }
        if let Some(scaling) = &tracked.scaling {
            scaling.poke();
        }
    }

    async fn sweep_idle(self) {
        let every = (self.inner.settings.load().idle_after / 10)
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = ticks.tick() => { self.evict_idle(); }
            }
        }
    }

    fn read_triggers(&self) -> std::sync::RwLockReadGuard<'_, Triggers> {
        self.inner
            .triggers
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn lock_pollers(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Poller>> {
        self.inner.pollers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_scalings(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Arc<Scaling>>> {
        self.inner
            .scalings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// The metadata key of the first rule that differs, for error messages.
fn first_difference(a: &Rules, b: &Rules) -> String {
    let (a, b) = (serde_json::to_value(a), serde_json::to_value(b));
    if let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) {
        for (key, value) in &a {
            if b.get(key) != Some(value) {
                return key.clone();
            }
        }
    }
    "scalingMode".to_string()
}

#[cfg(test)]
mod tests;

/// Exposes each trigger's current value as `hoist_trigger_value`, read
/// from the cache at scrape time.
pub struct TriggerValues(pub Driver);

impl std::fmt::Debug for TriggerValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TriggerValues")
    }
}

/// The labels of one trigger's series. None is named like a label
/// Prometheus attaches to the scrape target (`namespace`, `pod`, `job`,
/// `instance`): under the default `honor_labels: false` it would be
/// renamed `exported_*`. `source` tells two triggers of one ScaledObject
/// apart where `metric` does not (`requestRate` and `concurrency` on one
/// route are both `http-<route>`); it is the poller's description, which
/// never holds a secret, and the `source` of `hoist_poll_errors_total`.
/// Borrowed from the tracked triggers: a scrape of 100,000 triggers
/// allocates no copy of their names (the derive takes no lifetime, hence
/// the hand-written encoding).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct TriggerLabels<'a> {
    scaled_object_namespace: &'a str,
    scaled_object: &'a str,
    scaler: &'static str,
    metric: &'a str,
    source: &'a str,
}

impl prometheus_client::encoding::EncodeLabelSet for TriggerLabels<'_> {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeLabel;
        ("scaled_object_namespace", self.scaled_object_namespace).encode(encoder.encode_label())?;
        ("scaled_object", self.scaled_object).encode(encoder.encode_label())?;
        ("scaler", self.scaler).encode(encoder.encode_label())?;
        ("metric", self.metric).encode(encoder.encode_label())?;
        ("source", self.source).encode(encoder.encode_label())
    }
}

impl Collector for TriggerValues {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Triggers with the same labels read the same source for the same
        // measure: one series, the most recently asked one's value (an
        // edited ScaledObject briefly has its old and new trigger).
        let tracked_now = self.0.tracked();
        let mut series: HashMap<TriggerLabels, (u64, f64)> = HashMap::new();
        let mut without_value: i64 = 0;
        let mut pushed: i64 = 0;
        for tracked in &tracked_now {
            pushed += i64::from(tracked.pushed_lately());
            let Some(value) = tracked.latest().value() else {
                without_value += 1;
                continue;
            };
            let trigger = &tracked.config.trigger;
            let labels = TriggerLabels {
                scaled_object_namespace: &tracked.key.namespace,
                scaled_object: &tracked.key.name,
                scaler: trigger.scaler,
                metric: &trigger.metric_name,
                source: &trigger.query.description,
            };
            let seen = tracked.last_seen_ms.load(Ordering::Relaxed);
            let slot = series.entry(labels).or_insert((seen, value));
            if seen > slot.0 {
                *slot = (seen, value);
            }
        }
        let mut values = encoder.encode_descriptor(
            "hoist_trigger_value",
            "Each trigger's latest value (absent while its source is failing)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (labels, (_, value)) in series {
            ConstGauge::new(value).encode(values.encode_family(&labels)?)?;
        }
        // Counted here, not from the series above: alerts compare no
        // series counts, which merged triggers would skew.
        let missing = encoder.encode_descriptor(
            "hoist_triggers_without_value",
            "Tracked triggers with no value now: their first poll has not ended, or their source's latest poll failed",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(without_value).encode(missing)?;
        let push = encoder.encode_descriptor(
            "hoist_push_triggers",
            "Tracked triggers KEDA pushes to (external-push): a StreamIsActive stream open now or within 6 hours",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(pushed).encode(push)?;
        Ok(())
    }
}
