//! Engine-mode ScaledObjects: one engine per ScaledObject, evaluated once
//! per interval on its triggers' newest readings and the target's real
//! replica count, at once from zero, and when a cooldown ends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::reading::Reading;
use super::target_index::TargetIndex;
use crate::cluster::{Cluster, ObjectEvent, ScaleTarget, ScaledObjectView};
use crate::engine::rules::Source;
use crate::engine::{self, Decision, Millis, Observation, Observed, Rules};

/// The HPA controller's sync period: with a `behavior`, its rate policies
/// are counted per sync, so the engine evaluates at least this often.
pub const HPA_SYNC_MILLIS: Millis = 15_000;

/// How soon an engine whose count is unknown looks again.
const UNKNOWN_RETRY_MILLIS: Millis = 1000;

/// How often a warning Event about the same problem is posted again.
const WARNING_EVENT_EVERY: Millis = 30 * 60 * 1000;

/// Maps the driver's monotonic instants to the engine's wall-clock
/// milliseconds (so saved engine state stays meaningful across restarts).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
    epoch_wall: Millis,
}

impl Clock {
    pub fn new() -> Self {
        let epoch_wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as Millis);
        Self {
            epoch: Instant::now(),
            epoch_wall,
        }
    }

    pub fn wall(&self, at: Instant) -> Millis {
        self.epoch_wall + at.saturating_duration_since(self.epoch).as_millis() as Millis
    }

    pub fn now(&self) -> Millis {
        self.wall(Instant::now())
    }

    fn instant(&self, wall: Millis) -> Instant {
        self.epoch + std::time::Duration::from_millis(wall.saturating_sub(self.epoch_wall))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Where an engine learns how many replicas run.
#[derive(Clone)]
pub enum Counting {
    /// The target's `/scale` subresource, read at most once per interval.
    Cluster(Arc<Cluster>),
    /// No cluster access: the engine's own last decision, assumed applied.
    OwnDecisions,
}

/// How an engine may count when the real count is unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountPolicy {
    /// `engine.assume_applied`: compute from the engine's own last
    /// decision instead of answering `Unavailable`.
    pub assume_applied: bool,
    /// A saved state covers this ScaledObject (its last count is known).
    pub restored: bool,
}

/// What the engine tells KEDA.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Decided(Decision),
    /// The current replica count cannot be known: answering with a count
    /// could shrink a running app, so KEDA is told `Unavailable` and keeps
    /// the count it has.
    CountUnknown(String),
}

/// Where the engine's current count came from, for `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CountSource {
    /// The target's `/scale`, read from the cluster.
    Cluster,
    /// The engine's own last decision (no cluster access, a saved state,
    /// or `engine.assume_applied`).
    OwnDecision,
}

/// What `/status` shows of an engine beyond its decision.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Insight {
    /// The scale target, when the ScaledObject was read.
    pub target: Option<String>,
    /// The last counts read from the cluster, and how old they are.
    pub observed: Option<Observed>,
    pub observed_at: Option<Millis>,
    pub count_source: Option<CountSource>,
    /// Why the count (or the ScaledObject) cannot be read, while it cannot.
    pub count_error: Option<String>,
    /// Each rule setting's value source, by its ScaledObject name.
    pub sources: BTreeMap<&'static str, Source>,
    /// The rules in force (metadata, then the ScaledObject, then defaults).
    pub rules: Option<Rules>,
    /// Where KEDA's or the HPA's own settings limit the engine again.
    pub warnings: Vec<String>,
}

struct Member {
    id: u64,
    trigger: String,
    target: f64,
    activation_target: f64,
    /// The trigger's polling interval in force (ms); the driver updates it
    /// when the ScaledObject's `pollingInterval` changes.
    interval: Arc<AtomicU64>,
    readings: watch::Receiver<Reading>,
    /// The task waking the engine on its readings; started by
    /// [`Scaling::forward`], outside the driver's lock.
    forwarder: Option<tokio::task::AbortHandle>,
}

/// Reads of the target's count.
#[derive(Default)]
struct CountReads {
    last: Option<(Observed, Millis)>,
    last_attempt: Option<Millis>,
    /// The first failed read since the last good one.
    failing_since: Option<Millis>,
    error: Option<String>,
}

/// The rules a ScaledObject's triggers wrote in their metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataRules {
    pub rules: Rules,
    /// The rule keys the metadata set (see `engine::rules::RULE_KEYS`).
    pub written: crate::engine::rules::WrittenKeys,
}

/// The engine of one ScaledObject and the triggers feeding it.
pub struct Scaling {
    pub namespace: String,
    pub name: String,
    rules: Mutex<MetadataRules>,
    state: Mutex<engine::State>,
    answers: watch::Sender<Option<Answer>>,
    members: Mutex<Vec<Member>>,
    counting: Counting,
    policy: CountPolicy,
    reads: Mutex<CountReads>,
    last_object: Mutex<Option<ScaledObjectView>>,
    /// Where this engine is filed by the target its ScaledObject names.
    targets: Arc<TargetIndex>,
    insight: Mutex<Insight>,
    /// A fingerprint of the warnings last posted as an Event, and when:
    /// the sentences themselves are in `insight` (one copy per engine).
    warned: Mutex<(Option<u64>, Millis)>,
    /// The scale target changed outside: evaluate now, whatever the
    /// interval.
    target_moved: std::sync::atomic::AtomicBool,
    /// The ScaledObject's target or settings were edited: decide again
    /// now, from the count of what it names now.
    edited: std::sync::atomic::AtomicBool,
    /// Since when, and why, the engine has answered `CountUnknown`: the
    /// Event posted meanwhile may have been lost with the API, so another
    /// says how long it lasted once the count is known again.
    unknown_since: Mutex<Option<(Millis, String)>>,
    /// Signalled when a decision changes (state worth saving).
    changed: Arc<Notify>,
    metrics: Arc<crate::metrics::Metrics>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
    clock: Clock,
}

/// Everything an engine starts with.
pub struct Start {
    pub namespace: String,
    pub name: String,
    pub rules: MetadataRules,
    pub state: engine::State,
    pub counting: Counting,
    pub policy: CountPolicy,
    pub clock: Clock,
    pub changed: Arc<Notify>,
    pub cancel: CancellationToken,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub targets: Arc<TargetIndex>,
}

impl Scaling {
    /// The engine, not running yet: [`Scaling::run_in_background`] starts
    /// it (outside the driver's lock).
    pub fn new(start: Start) -> Arc<Self> {
        Arc::new(Self {
            namespace: start.namespace,
            name: start.name,
            rules: Mutex::new(start.rules),
            state: Mutex::new(start.state),
            answers: watch::channel(None).0,
            members: Mutex::new(Vec::new()),
            counting: start.counting,
            policy: start.policy,
            reads: Mutex::new(CountReads::default()),
            last_object: Mutex::new(None),
            targets: start.targets,
            insight: Mutex::new(Insight::default()),
            warned: Mutex::new((None, 0)),
            unknown_since: Mutex::new(None),
            target_moved: std::sync::atomic::AtomicBool::new(false),
            edited: std::sync::atomic::AtomicBool::new(false),
            changed: start.changed,
            metrics: start.metrics,
            wake: Arc::new(Notify::new()),
            cancel: start.cancel,
            clock: start.clock,
        })
    }

    /// Starts deciding; it ends when the engine is stopped (at once, if it
    /// was stopped meanwhile).
    pub fn run_in_background(self: &Arc<Self>) {
        tokio::spawn(self.clone().run(self.clock));
    }

    /// The rules the triggers' metadata wrote (before the ScaledObject's).
    pub fn rules(&self) -> MetadataRules {
        lock(&self.rules).clone()
    }

    /// Replaces the rules; the state (windows, cooldown) carries over.
    pub fn set_rules(&self, rules: MetadataRules) {
        *lock(&self.rules) = rules;
        self.wake.notify_one();
    }

    /// Whether a trigger reporting `metric` already feeds this engine.
    pub fn has_trigger(&self, metric: &str) -> bool {
        lock(&self.members).iter().any(|m| m.trigger == metric)
    }

    /// Adds a trigger; its readings wake the engine once
    /// [`Scaling::forward`] has started their forwarder.
    pub fn join(
        &self,
        id: u64,
        trigger: &str,
        (target, activation_target): (f64, f64),
        interval: Arc<AtomicU64>,
        readings: watch::Receiver<Reading>,
    ) {
        lock(&self.members).push(Member {
            id,
            trigger: trigger.to_string(),
            target,
            activation_target,
            interval,
            readings,
            forwarder: None,
        });
        self.wake.notify_one();
    }

    /// Starts waking the engine on trigger `id`'s readings (unless it
    /// left meanwhile).
    pub fn forward(&self, id: u64) {
        let mut members = lock(&self.members);
        let Some(member) = members.iter_mut().find(|member| member.id == id) else {
            return;
        };
        if member.forwarder.is_some() {
            return;
        }
        let wake = self.wake.clone();
        let mut changes = member.readings.clone();
        member.forwarder = Some(
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    wake.notify_one();
                }
            })
            .abort_handle(),
        );
        self.wake.notify_one();
    }

    /// Removes a trigger; returns true when none is left.
    pub fn leave(&self, id: u64) -> bool {
        let mut members = lock(&self.members);
        members.retain(|member| {
            if member.id == id
                && let Some(forwarder) = &member.forwarder
            {
                forwarder.abort();
            }
            member.id != id
        });
        members.is_empty()
    }

    pub fn stop(&self) {
        self.cancel.cancel();
        for member in lock(&self.members).iter() {
            if let Some(forwarder) = &member.forwarder {
                forwarder.abort();
            }
        }
        if let Some(object) = lock(&self.last_object).as_ref() {
            let target = &object.target;
            self.targets
                .leave(&self.namespace, &self.name, (&target.kind, &target.name));
        }
    }

    /// Wakes the engine (an interval of one of its triggers changed).
    pub fn poke(&self) {
        self.wake.notify_one();
    }

    /// Whether this engine's ScaledObject scales `kind` `namespace/name`
    /// (as its ScaledObject last read says).
    pub fn scales(&self, namespace: &str, kind: &str, name: &str) -> bool {
        self.namespace == namespace
            && lock(&self.last_object)
                .as_ref()
                .is_some_and(|object| object.target.kind == kind && object.target.name == name)
    }

    /// The target changed outside (`kubectl scale`, the HPA applying a
    /// step): read its count and decide again now, not at the interval's
    /// end, so KEDA's next answer already steps from what runs.
    pub fn target_changed(&self) {
        self.decide_now(&self.target_moved);
    }

    /// Reads the count again and decides at once; `why` is the flag the
    /// run loop reads to tell how (see `moved_only` there).
    fn decide_now(&self, why: &std::sync::atomic::AtomicBool) {
        lock(&self.reads).last_attempt = None;
        why.store(true, Ordering::Relaxed);
        self.poke();
    }

    /// The ScaledObject changed in the watch (most often KEDA writing its
    /// status): when its target or settings differ from what the engine
    /// last read, it decides again now rather than at the interval's end.
    pub fn object_changed(&self) {
        let Counting::Cluster(cluster) = &self.counting else {
            return;
        };
        let Ok(now) = cluster.scaled_object(&self.namespace, &self.name) else {
            return;
        };
        let edited = lock(&self.last_object)
            .as_ref()
            .is_some_and(|last| last.target != now.target || last.settings != now.settings);
        if edited {
            self.decide_now(&self.edited);
        }
    }

    /// The latest answer, if any.
    pub fn answer(&self) -> Option<Answer> {
        self.answers.borrow().clone()
    }

    /// The latest decision, if any (also while the count is unknown: the
    /// last one made).
    pub fn decision(&self) -> Option<Decision> {
        match self.answer()? {
            Answer::Decided(decision) => Some(decision),
            Answer::CountUnknown(_) => None,
        }
    }

    pub fn answers(&self) -> watch::Receiver<Option<Answer>> {
        self.answers.subscribe()
    }

    /// A copy of the engine's state.
    pub fn state(&self) -> engine::State {
        lock(&self.state).clone()
    }

    pub fn insight(&self) -> Insight {
        lock(&self.insight).clone()
    }

    /// The evaluation interval: the smallest of the triggers' polling
    /// intervals (whatever order they were tracked in), and with a
    /// `behavior` at most the HPA's sync period.
    fn interval(&self, rules: &Rules) -> Millis {
        let smallest = lock(&self.members)
            .iter()
            .map(|m| m.interval.load(Ordering::Relaxed))
            .min()
            .unwrap_or(rules.polling_interval.saturating_mul(1000))
            .max(1);
        if rules.behavior.is_some() {
            smallest.min(HPA_SYNC_MILLIS)
        } else {
            smallest
        }
    }

    /// Evaluates once per interval on the newest readings, as the HPA does
    /// on its own period however many metrics it has: a reading arriving
    /// early waits for the interval to complete. Exceptions: at zero
    /// replicas a new reading is evaluated at once (scale from zero without
    /// delay), a cooldown's end is evaluated when it comes, and with a
    /// `behavior` the engine evaluates every interval even without new
    /// readings (rate policies count per HPA sync).
    async fn run(self: Arc<Self>, clock: Clock) {
        let mut last: Option<Millis> = None;
        let mut pending = false;
        let mut deadline: Option<Millis> = None;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = self.wake.notified() => pending = true,
                _ = async {
                    match deadline {
                        Some(wall) => tokio::time::sleep_until(clock.instant(wall)).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            let now = clock.now();
            // Read once per turn: the store lookup parses the spec.
            let mut object = self.object();
            let (interval, periodic) = {
                let rules = self.current_rules(&object);
                (self.interval(&rules), rules.behavior.is_some())
            };
            let decision = self.decision();
            let at_zero = decision.as_ref().is_none_or(|d| d.replicas == 0);
            let cooldown_over = decision
                .as_ref()
                .and_then(|d| d.cooldown_ends)
                .is_some_and(|end| now >= end);
            let interval_over = last.is_none_or(|at| now >= at.saturating_add(self.wait(interval)));
            let wanted = pending || (periodic && last.is_some());
            let target_moved = self.target_moved.swap(false, Ordering::Relaxed);
            let edited = self.edited.swap(false, Ordering::Relaxed);
            let due =
                (wanted && (interval_over || at_zero || target_moved || edited)) || cooldown_over;
            // Due only because the target moved: if it moved to the
            // engine's own answer, that is the HPA applying it, not an
            // outside change.
            let moved_only = target_moved && !(interval_over || at_zero || cooldown_over || edited);
            if due
                && object.is_err()
                && let Counting::Cluster(cluster) = &self.counting
            {
                // Just started: the watch's first list is on its way.
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    _ = cluster.wait_synced() => {}
                }
                object = self.object();
            }
            // A stopped engine publishes nothing more: an evaluation waiting
            // on the API (up to its timeout) is dropped at once.
            let evaluated = if due {
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    // Boxed: an engine rests far longer than it evaluates,
                    // and its resting task need not carry the space of an
                    // API read (4 KiB of 10,000 engines' memory each).
                    answer = Box::pin(self.evaluate(&clock, interval, object, moved_only)) => answer,
                }
            } else {
                None
            };
            if let Some(answer) = evaluated {
                last = Some(now);
                // An unknown count is asked again next interval.
                pending = matches!(answer, Answer::CountUnknown(_));
            }
            // The next interval (when something waits for it), or an
            // earlier cooldown end: it must not wait a whole interval.
            let next_interval = last
                .filter(|_| pending || periodic)
                .map(|at| at.saturating_add(self.wait(interval)));
            let cooldown_end = self.decision().and_then(|d| d.cooldown_ends);
            // Only deadlines still ahead: one already past (no reading to
            // evaluate yet) waits for the next reading instead of spinning.
            deadline = next_interval
                .into_iter()
                .chain(cooldown_end)
                .filter(|at| *at > now)
                .min();
        }
    }

    /// How long after an evaluation the next one is due: the interval, or
    /// within a second while the count is unknown (a new ScaledObject
    /// reaches the watch a moment after KEDA asks; the API itself is still
    /// asked at most once per interval).
    fn wait(&self, interval: Millis) -> Millis {
        match self.answer() {
            Some(Answer::CountUnknown(_)) => interval.min(UNKNOWN_RETRY_MILLIS),
            _ => interval,
        }
    }

    /// The metadata rules completed by the ScaledObject's settings, as far
    /// as they are known now.
    fn current_rules(&self, object: &Result<ScaledObjectView, String>) -> Rules {
        let metadata = self.rules();
        metadata
            .rules
            .with_object(&metadata.written, object.as_ref().ok().map(|o| &o.settings))
            .0
    }

    /// The ScaledObject as last read: while the watch cannot say (a
    /// re-list, a 403), the last good view keeps its settings and target,
    /// never hoist's defaults in their place.
    fn object(&self) -> Result<ScaledObjectView, String> {
        let Counting::Cluster(cluster) = &self.counting else {
            return Err("no cluster access".into());
        };
        let mut last = lock(&self.last_object);
        match cluster.scaled_object(&self.namespace, &self.name) {
            Ok(view) => {
                let previous = last.as_ref().map(|object| &object.target);
                if previous != Some(&view.target) {
                    let target = &view.target;
                    self.targets.file(
                        &self.namespace,
                        &self.name,
                        previous.map(|p| (p.kind.as_str(), p.name.as_str())),
                        (&target.kind, &target.name),
                        &self.cancel,
                    );
                }
                *last = Some(view.clone());
                Ok(view)
            }
            Err(error) => last.clone().ok_or_else(|| error.to_string()),
        }
    }

    /// Runs the engine on every trigger's latest reading and the current
    /// count; `None` while no trigger has a reading yet, or when
    /// `moved_only` and the target shows the engine's own answer applied
    /// (the count is taken, the next decision waits for the interval).
    async fn evaluate(
        &self,
        clock: &Clock,
        interval: Millis,
        object: Result<ScaledObjectView, String>,
        moved_only: bool,
    ) -> Option<Answer> {
        let metadata = self.rules();
        let (rules, sources) = metadata
            .rules
            .with_object(&metadata.written, object.as_ref().ok().map(|o| &o.settings));
        let shown = rules.clone();
        // The engine's own cadence: the smallest trigger interval, and the
        // HPA's sync with a behavior.
        let rules = Rules {
            polling_interval: interval.div_ceil(1000).max(1),
            ..rules
        };
        let readings = self.readings(clock);
        if readings.is_empty() {
            return None;
        }
        let warnings = object
            .as_ref()
            .map(|o| o.relimits(&rules))
            .unwrap_or_default();
        let counted = self.count(clock, interval, &object).await;
        let now = clock.now();
        {
            let reads = lock(&self.reads);
            let mut insight = lock(&self.insight);
            *insight = Insight {
                target: object.as_ref().ok().map(|o| describe(&o.target)),
                observed: reads.last.map(|(o, _)| o),
                observed_at: reads.last.map(|(_, at)| at),
                count_source: counted.as_ref().ok().map(|c| match c {
                    Some(_) => CountSource::Cluster,
                    None => CountSource::OwnDecision,
                }),
                count_error: reads.error.clone().or_else(|| {
                    // No cluster: say why the count is the engine's own.
                    counted.as_ref().err().cloned()
                }),
                sources,
                rules: Some(shown),
                warnings: warnings.clone(),
            };
        }
        if let Err(reason) = rules.validate() {
            let answer = Answer::CountUnknown(format!(
                "the rules from trigger metadata and the ScaledObject do not fit together: {reason}"
            ));
            return Some(self.publish(answer, None, &object, now));
        }
        if moved_only
            && let Ok(Some(observed)) = &counted
            && self
                .decision()
                .is_some_and(|d| d.replicas == observed.spec_replicas)
        {
            engine::observe_applied(&mut lock(&self.state), &rules, *observed, now);
            return None;
        }
        let observed = match counted {
            Ok(observed) => observed,
            Err(reason) => {
                return Some(self.publish(Answer::CountUnknown(reason), None, &object, now));
            }
        };
        let decision = {
            let mut state = lock(&self.state);
            if let Some(observed) = observed
                && observed.spec_replicas > 0
                && state.last_active.is_none()
                && state.recommendations.is_none()
            {
                // A fresh engine (hoist restarted without saved state) cannot
                // know when activity ended: the cooldown runs from now, so a
                // running app is not sent to zero on the first evaluation.
                state.last_active = Some(now);
            }
            engine::decide_observed(&mut state, &rules, &readings, now, observed)
        };
        self.post_warnings(&object, &warnings, now);
        let previous = self.decision();
        Some(self.publish(Answer::Decided(decision), previous, &object, now))
    }

    /// The triggers' latest readings, for the engine.
    fn readings(&self, clock: &Clock) -> Vec<engine::Reading> {
        lock(&self.members)
            .iter()
            .filter_map(|member| {
                let (value, activity, at) = match &*member.readings.borrow() {
                    Reading::Pending => return None,
                    Reading::Value {
                        value,
                        activity,
                        at,
                    } => (
                        Observation::Value(*value),
                        (activity != value).then_some(*activity),
                        *at,
                    ),
                    Reading::Failed { error, at, .. } => {
                        (Observation::Error(error.to_string()), None, *at)
                    }
                };
                Some(engine::Reading {
                    trigger: member.trigger.clone(),
                    target: member.target,
                    activation_target: member.activation_target,
                    value,
                    activity,
                    at: clock.wall(at),
                })
            })
            .collect()
    }

    /// The current count: `Ok(Some)` read from the cluster, `Ok(None)` the
    /// engine's own last decision, `Err` unknown (and why).
    async fn count(
        &self,
        clock: &Clock,
        interval: Millis,
        object: &Result<ScaledObjectView, String>,
    ) -> Result<Option<Observed>, String> {
        let Counting::Cluster(cluster) = &self.counting else {
            return if self.policy.assume_applied || self.policy.restored {
                Ok(None)
            } else {
                Err(format!(
                    "engine mode cannot know how many replicas ScaledObject {}/{} runs: \
                     Kubernetes access is off or no configuration was found (kubernetes.enabled) \
                     and no saved state covers it; give hoist cluster access, or set \
                     engine.assume_applied = true to compute from hoist's own last decision",
                    self.namespace, self.name
                ))
            };
        };
        let now = clock.now();
        // A little slack: the loop's own schedule starts a moment before
        // this read's stamp, and a scheduled evaluation must read afresh.
        let slack = (interval / 10).min(1000);
        let due = lock(&self.reads)
            .last_attempt
            .is_none_or(|at| now.saturating_add(slack) >= at.saturating_add(interval));
        if due || object.is_err() {
            let result = match object {
                Ok(object) => {
                    // At most one API request per interval.
                    lock(&self.reads).last_attempt = Some(now);
                    cluster
                        .read_scale(&self.namespace, &object.target)
                        .await
                        .map_err(|e| e.to_string())
                }
                Err(reason) => Err(reason.clone()),
            };
            let mut reads = lock(&self.reads);
            match result {
                Ok(observed) => {
                    if reads.error.take().is_some() {
                        info!(namespace = %self.namespace, scaled_object = %self.name, "replica count readable again");
                    }
                    reads.last = Some((observed, now));
                    reads.failing_since = None;
                }
                Err(error) => {
                    if reads.error.as_deref() != Some(error.as_str()) {
                        warn!(namespace = %self.namespace, scaled_object = %self.name, %error, "cannot read the replica count");
                    }
                    reads.failing_since.get_or_insert(now);
                    reads.error = Some(error);
                }
            }
        }
        let reads = lock(&self.reads);
        // The last known count serves for one interval of failures, judged
        // now that the read is over: a read that hangs to its timeout is
        // part of the failure, not time before it.
        let judged_at = clock.now();
        let failing_long = reads
            .failing_since
            .is_some_and(|since| judged_at >= since.saturating_add(interval));
        match (&reads.last, failing_long) {
            (Some((observed, _)), false) => Ok(Some(*observed)),
            // A saved count, but only with the ScaledObject's own settings
            // known: hoist's defaults (max 10) could shrink the app.
            (None, false) if self.policy.restored && object.is_ok() => Ok(None),
            _ if self.policy.assume_applied => Ok(None),
            _ => Err(format!(
                "the replica count of ScaledObject {}/{} is unknown: {}",
                self.namespace,
                self.name,
                reads.error.as_deref().unwrap_or("not read yet")
            )),
        }
    }

    /// Publishes an answer; logs, signals and posts an Event when the
    /// count or activity changed.
    fn publish(
        &self,
        answer: Answer,
        previous: Option<Decision>,
        object: &Result<ScaledObjectView, String>,
        now: Millis,
    ) -> Answer {
        self.note_unknown_period(&answer, object, now);
        let changed = match (&answer, &previous) {
            (Answer::Decided(decision), Some(previous)) => {
                previous.replicas != decision.replicas || previous.active != decision.active
            }
            (Answer::Decided(_), None) => true,
            (Answer::CountUnknown(reason), _) => {
                !matches!(self.answer(), Some(Answer::CountUnknown(ref old)) if old == reason)
            }
        };
        if changed {
            match &answer {
                Answer::Decided(decision) => {
                    info!(
                        namespace = %self.namespace,
                        scaled_object = %self.name,
                        replicas = decision.replicas,
                        active = decision.active,
                        reason = ?decision.reason,
                        message = %decision.message,
                        "engine decision"
                    );
                    if let (Some(previous), Counting::Cluster(cluster), Ok(object)) =
                        (&previous, &self.counting, object)
                        && previous.replicas != decision.replicas
                    {
                        cluster.post_event(
                            object,
                            ObjectEvent {
                                warning: false,
                                reason: "SuccessfulRescale",
                                action: "Scale",
                                note: format!(
                                    "New size: {}; reason: {} ({:?}; was {})",
                                    decision.replicas,
                                    decision.message,
                                    decision.reason,
                                    previous.replicas
                                ),
                            },
                        );
                    }
                }
                Answer::CountUnknown(reason) => {
                    warn!(namespace = %self.namespace, scaled_object = %self.name, %reason, "answering Unavailable");
                    self.post_count_unknown(object, reason.clone());
                }
            }
        }
        // State worth saving at once (a SIGKILL must not cut a cooldown
        // short): the count, the activity or the cooldown's end moved.
        let saved_differs = match (&answer, &previous) {
            (Answer::Decided(decision), Some(previous)) => {
                (previous.replicas, previous.active, previous.cooldown_ends)
                    != (decision.replicas, decision.active, decision.cooldown_ends)
            }
            (Answer::Decided(_), None) => true,
            (Answer::CountUnknown(_), _) => false,
        };
        if saved_differs {
            self.changed.notify_one();
        }
        let reason = match &answer {
            Answer::Decided(decision) => format!("{:?}", decision.reason),
            Answer::CountUnknown(_) => "CountUnknown".to_string(),
        };
        self.metrics
            .engine_decisions
            .get_or_create(&crate::metrics::ReasonLabels { reason })
            .inc();
        self.answers.send_replace(Some(answer.clone()));
        answer
    }

    /// A `ReplicaCountUnknown` Event on the ScaledObject, when it is known.
    fn post_count_unknown(&self, object: &Result<ScaledObjectView, String>, note: String) {
        if let (Counting::Cluster(cluster), Ok(object)) = (&self.counting, object) {
            cluster.post_event(
                object,
                ObjectEvent {
                    warning: true,
                    reason: "ReplicaCountUnknown",
                    action: "Scale",
                    note,
                },
            );
        }
    }

    /// Remembers when the count became unknown; once it is known again,
    /// posts (once) how long it was not, and why.
    fn note_unknown_period(
        &self,
        answer: &Answer,
        object: &Result<ScaledObjectView, String>,
        now: Millis,
    ) {
        let mut unknown = lock(&self.unknown_since);
        match answer {
            Answer::CountUnknown(reason) => {
                unknown.get_or_insert_with(|| (now, reason.clone()));
            }
            Answer::Decided(decision) => {
                let Some((since, reason)) = unknown.take() else {
                    return;
                };
                self.post_count_unknown(
                    object,
                    format!(
                        "the replica count was unknown for {}s (answered Unavailable meanwhile): {reason}; known again, answering {}",
                        now.saturating_sub(since).div_ceil(1000),
                        decision.replicas
                    ),
                );
            }
        }
    }

    /// Posts the warnings as an Event when they change, and again every
    /// half hour while they last.
    fn post_warnings(
        &self,
        object: &Result<ScaledObjectView, String>,
        warnings: &[String],
        now: Millis,
    ) {
        let (Counting::Cluster(cluster), Ok(object)) = (&self.counting, object) else {
            return;
        };
        let mut warned = lock(&self.warned);
        if warnings.is_empty() {
            warned.0 = None;
            return;
        }
        // A collision would only wait for the half-hourly repeat.
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            warnings.hash(&mut hasher);
            hasher.finish()
        };
        let due =
            warned.0 != Some(fingerprint) || now >= warned.1.saturating_add(WARNING_EVENT_EVERY);
        if !due {
            return;
        }
        cluster.post_event(
            object,
            ObjectEvent {
                warning: true,
                reason: "EngineLimitedByScaledObject",
                action: "Scale",
                note: warnings.join("; "),
            },
        );
        *warned = (Some(fingerprint), now);
    }
}

fn describe(target: &ScaleTarget) -> String {
    format!("{} {} ({})", target.kind, target.name, target.api_version)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
