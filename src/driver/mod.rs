//! The driver: background pollers shared by every ScaledObject that asks
//! the same question, a cache of their readings, and the bookkeeping of who
//! asked what. It is the only layer with a clock and tasks.
//!
//! Its parts, each owning its step: `key.rs` (how KEDA names a trigger),
//! `track.rs` (tracking one, as a transaction), `state.rs` (the one lock
//! over `table.rs`'s triggers, `pollers.rs` and `engines.rs`),
//! `tracked.rs` (a tracked trigger), `poller.rs` (the poll scheduler),
//! `scaling.rs` (an engine's task), `cluster_follow.rs` (following the
//! cluster's ScaledObjects), `values.rs` (`hoist_trigger_value`).

mod cluster_follow;
mod engines;
mod error;
mod key;
mod poller;
mod pollers;
mod reading;
mod scaling;
mod state;
mod table;
mod target_index;
mod track;
mod tracked;
mod values;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use error::TrackError;
pub use key::TriggerKey;
pub use poller::Schedule;
use poller::Scheduler;
pub use reading::{PollError, Reading};
pub use scaling::{
    Answer, Clock, CountPolicy, CountSource, Counting, HPA_SYNC_MILLIS, Insight, MetadataRules,
    Scaling,
};
use state::State;
use track::{Admitted, Checked, Plan, parse_allowed};
pub use tracked::{StreamGuard, Tracked};
pub use values::TriggerValues;

use crate::auth_profiles::AuthProfiles;
use crate::callers::Caller;
use crate::cluster::{AuthenticationRef, Cluster, ResolvedAuth, TriggerAuthError};
use crate::metrics::Metrics;
use crate::persist::{self, Snapshot};
use crate::routing::{Registry, RouteError};
use crate::trigger::{Defaults, TriggerConfig};

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
                route_targets: Arc::new(settings.interceptor.route_targets()),
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

struct Inner {
    /// Swapped whole by a config reload; a trigger is checked against the
    /// settings in force when it is first tracked.
    settings: ArcSwap<DriverSettings>,
    profiles: ArcSwap<AuthProfiles>,
    /// Routes ScaledObjects declare (when there is an interceptor).
    routes: Option<Arc<Registry>>,
    metrics: Arc<Metrics>,
    /// The one lock: triggers, pollers, engines. Read on every call
    /// (`lookup`), written when a trigger comes or goes; no task is
    /// started and no store read under it.
    state: RwLock<State>,
    /// Runs every poller's polls.
    scheduler: Scheduler,
    /// The engines by the target they scale.
    targets: Arc<target_index::TargetIndex>,
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
    /// Counts triggers forgotten: a `StreamMetricSpec` stream looks again
    /// at its trigger when it moves (see [`Driver::forgotten`]).
    forgotten: tokio::sync::watch::Sender<u64>,
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
                state: RwLock::new(State::default()),
                scheduler,
                targets: Arc::default(),
                cluster: std::sync::OnceLock::new(),
                grpc_port: std::sync::OnceLock::new(),
                changed,
                clock: Clock::new(),
                cancel,
                next_id: AtomicU64::new(1),
                epoch: Instant::now(),
                forgotten: tokio::sync::watch::Sender::new(0),
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

    /// Changes whenever a tracked trigger is forgotten (evicted, revoked,
    /// re-targeted by a reload, its credentials rotated, replaced): the
    /// trigger KEDA's next call finds may then answer another spec.
    pub fn forgotten(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.forgotten.subscribe()
    }

    /// The trigger for `key` if it is tracked already (the usual case:
    /// every call after the first). Its route is claimed again: the
    /// ScaledObject's route is the one its trigger asked last, so an edit
    /// undone (old metadata asked again) takes it back.
    pub fn lookup(&self, key: &TriggerKey) -> Result<Option<Arc<Tracked>>, TrackError> {
        let Some(tracked) = self.read_state().triggers.get(key.identity()).cloned() else {
            return Ok(None);
        };
        if self.credentials_rotated(&tracked) {
            // Tracked anew with what the Secret holds now.
            info!(namespace = %key.namespace, scaled_object = %key.name, "the trigger's TriggerAuthentication or Secret changed: reading its credentials again");
            self.write_state().forget(key, &self.inner);
            return Ok(None);
        }
        tracked.touch();
        if let (Some(spec), Some(routes)) = (&tracked.config.trigger.route, &self.inner.routes) {
            routes.claim(key.identity(), spec)?;
        }
        Ok(Some(tracked))
    }

    /// The tracked trigger for `key`, parsing its metadata and starting (or
    /// joining) a poller the first time it is seen: one transaction (see
    /// `track.rs`). `caller` is what [`crate::callers`] found out about who
    /// asked.
    pub fn track(&self, key: TriggerKey, caller: &Caller) -> Result<Arc<Tracked>, TrackError> {
        if let Some(tracked) = self.lookup(&key)? {
            return Ok(tracked);
        }
        let plan = Admitted::new(self, key)?
            .lend(self, caller)?
            .parse(self)?
            .claim(self, caller)?
            .plan(self);
        self.commit(plan)
    }

    /// Like [`Driver::track`] for a trigger already parsed (a test's own
    /// source), trusted as a proven caller's: the same checks under the
    /// lock, the same apply.
    #[cfg(test)]
    pub(crate) fn track_parsed(
        &self,
        key: TriggerKey,
        config: TriggerConfig,
    ) -> Result<Arc<Tracked>, TrackError> {
        let caller = Caller {
            proven: true,
            checked_in_cluster: false,
            authentication: None,
        };
        let plan = track::Parsed::for_test(self, key, config)
            .claim(self, &caller)?
            .plan(self);
        self.commit(plan)
    }

    /// Checks and applies `plan` under the lock, then starts what it needs.
    fn commit(&self, plan: Plan) -> Result<Arc<Tracked>, TrackError> {
        let (tracked, startups) = {
            let mut state = self.write_state();
            match plan.check(&state)? {
                Checked::Tracked(tracked) => return Ok(tracked),
                Checked::Ready(ready) => ready.apply(&mut state, &self.inner),
            }
        };
        startups.start();
        Ok(tracked)
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
        // Taken out of the lock first: resolving credentials reads the
        // cluster's stores, and parsing may read auth profiles' files.
        let mut refused = Vec::new();
        let mut retargeted = Vec::new();
        for tracked in self.tracked() {
            let authentication = match tracked.credentials.as_deref() {
                None => Ok(None),
                Some((reference, _)) => self
                    .resolve_credentials(&tracked.key.namespace, reference)
                    .map(|resolved| resolved.map(|r| r.params)),
            };
            match authentication.and_then(|authentication| {
                parse_allowed(&tracked.key, &settings, &profiles, authentication)
            }) {
                Err(error) => refused.push((tracked.key.clone(), error)),
                Ok(config) if !same_metric_spec(&config, &tracked.config) => {
                    retargeted.push(tracked.key.clone());
                }
                Ok(_) => {}
            }
        }
        if !retargeted.is_empty() {
            // Tracked anew with the new target on KEDA's next call (or at
            // once by its `StreamMetricSpec` stream): GetMetricSpec and the
            // stream then answer the new spec alike.
            for key in &retargeted {
                info!(namespace = %key.namespace, scaled_object = %key.name, "the reloaded config changes the trigger's metric spec: tracking it anew");
            }
            let mut state = self.write_state();
            for key in &retargeted {
                state.forget(key, &self.inner);
            }
        }
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
        let mut state = self.write_state();
        for key in keys {
            self.inner.metrics.revoked(reason);
            state.forget(key, &self.inner);
        }
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

    /// Hands over state saved by an earlier run; each ScaledObject takes
    /// its own when its first engine-mode trigger arrives.
    pub fn restore(&self, snapshot: Snapshot) {
        if let Some(routes) = &self.inner.routes {
            routes.restore(snapshot.routes, !snapshot.routes_settling);
        }
        self.write_state().engines.restore(snapshot.scaled_objects);
    }

    /// The state of every engine, for `state_file` (restored state not yet
    /// claimed is kept too).
    pub fn snapshot(&self) -> Snapshot {
        let scaled_objects = self.read_state().engines.snapshot();
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
        self.read_state().engines.values().cloned().collect()
    }

    /// The engines whose ScaledObjects scale `kind` `namespace/name` (as
    /// each last read its object).
    pub fn scalings_of_target(&self, namespace: &str, kind: &str, name: &str) -> Vec<Arc<Scaling>> {
        let names = self.inner.targets.engines_of(namespace, kind, name);
        let state = self.read_state();
        names
            .into_iter()
            .filter_map(|object| state.engines.get(&(namespace.to_string(), object)).cloned())
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
        self.read_state().triggers.values().cloned().collect()
    }

    /// How many distinct source queries are being polled.
    pub fn poller_count(&self) -> usize {
        self.read_state().pollers.len()
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
        let mut state = self.write_state();
        let idle: Vec<TriggerKey> = state
            .triggers
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
            state.forget(key, &self.inner);
        }
        idle.len()
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
        self.write_state().pollers.reschedule(
            &tracked.config.trigger.query,
            tracked.id,
            Schedule {
                interval,
                timeout: tracked.config.timeout,
            },
        );
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

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.inner.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;

/// Whether two parses of a trigger answer `GetMetricSpec` alike.
fn same_metric_spec(a: &TriggerConfig, b: &TriggerConfig) -> bool {
    a.trigger.metric_name == b.trigger.metric_name && a.trigger.target == b.trigger.target
}
