//! The scaling engine: a pure, synchronous state machine per ScaledObject.
//!
//! Time is an argument (`now`, wall-clock milliseconds), decisions are
//! values, and the state is plain serde data that can be saved, shown and
//! replayed. No I/O, no tasks, no clock.
//!
//! One evaluation, [`decide`], follows KEDA and the HPA:
//! 1. each trigger's reading becomes "active?" (value > activation target)
//!    and a proposal (the HPA's AverageValue rule: `ceil(value / target)`
//!    on the milli-values KEDA hands over, unless within tolerance); the
//!    largest proposal wins;
//! 2. at zero replicas, activity scales to `max(1, minReplicaCount)` (what
//!    KEDA does); with `minReplicaCount` 0, once `cooldownPeriod` has
//!    passed since the last activity, the engine goes to zero;
//! 3. otherwise the HPA's normalization: stabilization windows, then ACA's
//!    step-up `min(max, desired, max(4, 2 × current))` or, with a
//!    `behavior`, its rate policies; min and max bound everything.
//!
//! Faults: a trigger in error never lowers replicas or deactivates; valid
//! triggers may still scale up; after more than `failureThreshold`
//! consecutive failures (one per polling interval) the `fallback` replica
//! count applies. A value that is not a number is a failure, never a zero.

pub mod hpa;
pub mod rules;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use hpa::{Held, Limit, RateArgs, Recommendation, ScaleEvent};
pub use rules::{Behavior, BehaviorRules, Fallback, Rules};

/// Wall-clock milliseconds since the Unix epoch.
pub type Millis = u64;

/// ACA's (and the HPA's) scale-up factor without `behavior`.
pub const SCALE_UP_FACTOR: f64 = 2.0;

/// One trigger's latest reading, as fed to the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reading {
    /// Names the trigger within its ScaledObject (hoist uses the metric name).
    pub trigger: String,
    /// Target value per replica.
    pub target: f64,
    /// Active when the value is strictly above this.
    #[serde(default)]
    pub activation_target: f64,
    /// The value, or why there is none: `"value": 3` or `"error": "…"`.
    #[serde(flatten)]
    pub value: Observation,
    /// The value compared with the activation target when it differs from
    /// `value` (Kafka's persistent lag counts as activity, not as load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<f64>,
    /// When it was read. A reading fed twice (same trigger and `at`) is
    /// one reading: failures are counted once.
    pub at: Millis,
}

/// A trigger's measurement or its failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Observation {
    Value(f64),
    Error(String),
}

impl Observation {
    pub fn value(&self) -> Option<f64> {
        match self {
            Observation::Value(value) => Some(*value),
            Observation::Error(_) => None,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Observation::Error(_))
    }
}

/// Everything the engine remembers about one ScaledObject.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct State {
    /// The replica count the engine last recommended (assumed applied).
    pub current_replicas: u32,
    /// Whether `current_replicas` is a count the engine knew (read, or
    /// decided from one): a state saved before any decision (the count
    /// unknown) has 0 there, which is no count. Absent in files of earlier
    /// versions, which saved such states too: not known.
    pub count_known: bool,
    /// Whether the last decision was active.
    pub active: bool,
    /// The last time any trigger was active (or a trigger failed while
    /// active: a failure is not evidence of idleness).
    pub last_active: Option<Millis>,
    /// Past recommendations for the stabilization windows. `None` until the
    /// first evaluation at one or more replicas, which seeds it with the
    /// current count, as the HPA does.
    pub recommendations: Option<Vec<Recommendation>>,
    /// Past steps, for `behavior` rate policies.
    pub scale_up_events: Vec<ScaleEvent>,
    pub scale_down_events: Vec<ScaleEvent>,
    /// Counting from the cluster: the step last decided, not yet seen
    /// applied. The HPA records a scale event only once its rescale
    /// succeeded; a decision the HPA has not applied is no step, and must
    /// not count against the next one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_step: Option<PendingStep>,
    /// Since when the engine has decided zero while replicas still run:
    /// the start of [`HOLD_FOR_KEDA_MILLIS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub going_to_zero_since: Option<Millis>,
    /// Per trigger: the last reading seen and consecutive failures.
    pub triggers: BTreeMap<String, TriggerState>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TriggerState {
    pub last_value: Option<f64>,
    pub last_error: Option<String>,
    pub last_reading_at: Option<Millis>,
    pub consecutive_failures: u32,
    /// The reading that last added to `consecutive_failures`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_counted_failure_at: Option<Millis>,
}

/// A decided step from `from` to `to` replicas, waiting to be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingStep {
    pub from: i32,
    pub to: i32,
    /// When the engine first decided this step. The step is recorded at
    /// that time once applied, as the HPA records its own at the sync that
    /// applies it, a moment later: recorded when the engine saw it applied
    /// instead, a policy's period had not quite passed at the evaluation
    /// one period later (a strict `<`), and every step waited one more
    /// interval (1 pod per 4 s went a step every 6 s). None in a state
    /// file written before this was kept: then the time it is seen applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Millis>,
}

/// What limited (or explains) a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// The proposal applied unchanged.
    DesiredWithinRange,
    /// The step-up rule or a scale-up policy capped the increase.
    ScaleUpLimit,
    /// A scale-down policy capped the decrease.
    ScaleDownLimit,
    /// Raised to the minimum.
    TooFewReplicas,
    /// Capped at the maximum.
    TooManyReplicas,
    /// Held up by a higher recommendation in the scale-down window.
    ScaleDownStabilized,
    /// Held down by a lower recommendation in the scale-up window.
    ScaleUpStabilized,
    /// Every trigger's usage ratio is within tolerance: no change.
    WithinTolerance,
    /// Inactive, but within `cooldownPeriod` of the last activity.
    Cooldown,
    /// Woken from zero by activity.
    Activated,
    /// No activity for `cooldownPeriod`: at `minReplicaCount`.
    Inactive,
    /// A trigger failed `failureThreshold` times in a row.
    Fallback,
    /// A trigger is failing: no scale-down, no deactivation.
    TriggerError,
}

/// One evaluation's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub at: Millis,
    pub active: bool,
    /// The replica count to run now.
    pub replicas: u32,
    /// `max ceil(value / target)` over valid triggers, before any rule.
    pub raw_desired: Option<u32>,
    pub reason: Reason,
    pub message: String,
    /// When a further evaluation could change the outcome without new
    /// readings: the next poll, or the end of a cooldown.
    pub next_evaluation: Millis,
    /// When the cooldown ends, while one is running.
    pub cooldown_ends: Option<Millis>,
    /// When the recommendation holding a stabilized count leaves its
    /// window, while one holds.
    pub stabilization_ends: Option<Millis>,
    /// On the way to zero, the count still running, which GetMetrics
    /// reports instead of `replicas` (see [`HOLD_FOR_KEDA_MILLIS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_for_keda: Option<u32>,
}

impl Decision {
    /// The count the HPA is told (GetMetrics reports it × target).
    pub fn reported_replicas(&self) -> u32 {
        self.held_for_keda.unwrap_or(self.replicas)
    }
}

/// How long, at least, a decision to go to zero keeps reporting the count
/// that runs. Zero is KEDA's step, not the HPA's (KEDA's HPAs have
/// `minReplicas` ≥ 1): told 0, the HPA's next sync would first take the app
/// to its minimum, and KEDA's next poll to zero (30 → 1 → 0 where ACA goes
/// 30 → 0). KEDA polls at the ScaledObject's `pollingInterval` (30 s by
/// default), which the engine's interval only undercuts when a `behavior`
/// caps it at 15 s; twice the interval, and at least 60 s, covers its next
/// poll. If KEDA does not go to zero by then (a ScaledObject
/// `minReplicaCount` above the engine's), 0 is reported and the HPA goes
/// to its minimum.
pub const HOLD_FOR_KEDA_MILLIS: Millis = 60_000;

/// The scale target's replica counts as the cluster reports them (its
/// `/scale` subresource), which the HPA computes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    /// `spec.replicas`: the current count the HPA's limits and steps use.
    pub spec_replicas: u32,
    /// `status.replicas`: what the HPA's usage ratio of an external
    /// AverageValue metric divides by (`GetExternalPerPodMetricReplicas`).
    pub status_replicas: u32,
}

/// Evaluates the rules on the latest readings at `now`, updating `state`,
/// with the engine's own last decision as the current count.
pub fn decide(state: &mut State, rules: &Rules, readings: &[Reading], now: Millis) -> Decision {
    decide_observed(state, rules, readings, now, None)
}

/// [`decide`] from the cluster's real counts when `observed` is given:
/// the HPA and ACA compute from what runs, not from what was last asked.
pub fn decide_observed(
    state: &mut State,
    rules: &Rules,
    readings: &[Reading],
    now: Millis,
    observed: Option<Observed>,
) -> Decision {
    if let Some(observed) = observed {
        observe_applied(state, rules, observed, now);
    }
    let ratio_replicas = observed.map_or(state.current_replicas, |o| o.status_replicas);
    let cooldown = rules.cooldown_period.saturating_mul(1000);
    let interval = rules.polling_interval.saturating_mul(1000);
    let next_poll = now.saturating_add(interval);

    let checked: Vec<Checked> = readings.iter().map(check).collect();
    let fallback_due = absorb(
        state,
        &checked,
        rules.fallback.map(|f| f.failure_threshold),
        interval,
    );
    // KEDA's fallback stands in for the failing trigger's metric only.
    let fallback = rules.fallback.filter(|_| !fallback_due.is_empty());
    let errors: Vec<&Reading> = checked
        .iter()
        .filter(|c| c.outcome.is_err())
        .map(|c| c.reading)
        .collect();
    let values: Vec<(&Reading, Measured)> = checked
        .iter()
        .filter_map(|c| c.outcome.as_ref().ok().map(|m| (c.reading, *m)))
        .collect();
    let active_now = values.iter().any(|(reading, measured)| {
        reading.activity.unwrap_or(measured.value) > reading.activation_target
    });
    if active_now || (state.active && !errors.is_empty()) {
        state.last_active = Some(now);
    }
    let raw_desired = values
        .iter()
        .map(|(_, measured)| hpa::ceil_ratio(measured.usage, measured.target))
        .max()
        .map(|desired| desired.max(0) as u32);
    // KEDA scales to zero once `lastActiveTime + cooldownPeriod` is strictly
    // before now (`pkg/scaling/executor/scale_scaledobjects.go`,
    // `scaleToZeroOrIdle`): the cooldown is over one millisecond later.
    let cooldown_ends = state
        .last_active
        .map(|at| at.saturating_add(cooldown).saturating_add(1))
        .filter(|end| *end > now);
    let active = active_now || cooldown_ends.is_some();

    let max = rules.max_replica_count;
    let min = rules.min_replica_count;
    let current = state.current_replicas;
    let outcome = |replicas: u32, reason: Reason, message: String, active: bool| Decision {
        at: now,
        active,
        replicas,
        raw_desired,
        reason,
        message,
        next_evaluation: cooldown_ends.map_or(next_poll, |end| end.min(next_poll)),
        cooldown_ends: cooldown_ends.filter(|_| !active_now),
        stabilization_ends: None,
        held_for_keda: None,
    };

    let decision = if let (0, Some(fallback)) = (current, fallback.filter(|f| f.replicas > 0)) {
        // At zero, KEDA scales a ScaledObject whose metrics keep failing
        // to its fallback count, unless that count is zero
        // (`scale_scaledobjects.go`, `RequestScale`: `Fallback.Replicas != 0`).
        let replicas = fallback.replicas.clamp(min.max(1), max);
        outcome(
            replicas,
            Reason::Fallback,
            fallback_message(&fallback_due, fallback, replicas),
            true,
        )
    } else if current == 0 {
        if active_now {
            let replicas = min.max(1);
            outcome(
                replicas,
                Reason::Activated,
                "activity while at zero: starting".into(),
                true,
            )
        } else if min > 0 {
            outcome(
                min,
                Reason::TooFewReplicas,
                format!("raised to minReplicaCount {min}"),
                false,
            )
        } else if !errors.is_empty() {
            outcome(0, Reason::TriggerError, failing(&errors), false)
        } else {
            outcome(0, Reason::Inactive, "no activity".into(), false)
        }
    } else if !active && errors.is_empty() && min == 0 {
        // Counting from the cluster, `current` is what runs until KEDA's
        // poll takes it to zero: held from the first decision of zero
        // (which may come well after the cooldown's end, a trigger having
        // failed meanwhile).
        let since = *state.going_to_zero_since.get_or_insert(now);
        let hold = interval.saturating_mul(2).max(HOLD_FOR_KEDA_MILLIS);
        let held_for_keda = observed
            .filter(|_| now < since.saturating_add(hold))
            .map(|_| current);
        let mut message = format!(
            "no activity for cooldownPeriod ({} s): scaled to zero",
            rules.cooldown_period
        );
        if let Some(running) = held_for_keda {
            message.push_str(&format!(
                " (by KEDA; the HPA is told the {running} running until then)"
            ));
        }
        Decision {
            held_for_keda,
            ..outcome(0, Reason::Inactive, message, false)
        }
    } else {
        let (replicas, reason, message) = scale_from(
            state,
            rules,
            Counts {
                current,
                ratio_replicas,
                observed: observed.is_some(),
            },
            &values,
            &errors,
            &fallback_due,
            now,
        );
        let (reason, message) = match reason {
            // Only the cooldown keeps the last replica(s) running.
            Reason::TooFewReplicas | Reason::ScaleDownStabilized
                if !active_now && cooldown_ends.is_some() && min == 0 =>
            {
                let left = cooldown_ends.unwrap_or(now).saturating_sub(now) / 1000;
                let message = if left == 0 {
                    "inactive: the cooldown ends now; scaling to zero unless activity returns"
                        .to_string()
                } else {
                    format!("inactive: scaling to zero in {left} s unless activity returns")
                };
                (Reason::Cooldown, message)
            }
            _ => (reason, message),
        };
        Decision {
            stabilization_ends: stabilization_ends(state, rules, reason, replicas, now),
            ..outcome(replicas, reason, message, active)
        }
    };

    if decision.held_for_keda.is_none() && (decision.replicas != 0 || current == 0) {
        state.going_to_zero_since = None;
    }
    state.current_replicas = decision.replicas;
    state.count_known = true;
    state.active = decision.active;
    decision
}

/// For a stabilized decision: when the youngest recommendation holding the
/// count leaves its window.
fn stabilization_ends(
    state: &State,
    rules: &Rules,
    reason: Reason,
    replicas: u32,
    now: Millis,
) -> Option<Millis> {
    let window = match reason {
        Reason::ScaleDownStabilized | Reason::Cooldown => {
            rules.scale_down().stabilization_window_seconds
        }
        Reason::ScaleUpStabilized => rules.scale_up().stabilization_window_seconds,
        _ => return None,
    };
    let window = u64::from(window) * 1000;
    state
        .recommendations
        .iter()
        .flatten()
        .map(|r| (r.replicas, r.at.saturating_add(window)))
        .filter(|(held, end)| *held as i64 == replicas as i64 && *end > now)
        .map(|(_, end)| end)
        .max()
}

/// A reading's value as the HPA uses it.
#[derive(Debug, Clone, Copy)]
struct Measured {
    value: f64,
    /// The value and the target in milli-units ([`hpa::milli`]).
    usage: i64,
    target: i64,
}

/// A reading with its value checked: a number the HPA can use, or why not.
struct Checked<'a> {
    reading: &'a Reading,
    outcome: Result<Measured, Cow<'a, str>>,
}

/// A NaN or infinite value is a failed reading, never a zero; so is a
/// reading whose target is not a positive number of milli-units (the HPA
/// would divide by it).
fn check(reading: &Reading) -> Checked<'_> {
    let target = hpa::milli(reading.target).filter(|target| *target > 0);
    let outcome = match (&reading.value, target) {
        (Observation::Error(error), _) => Err(Cow::Borrowed(error.as_str())),
        (Observation::Value(_), None) => Err(Cow::Owned(format!(
            "target {} is not a positive number (at least 0.001)",
            reading.target
        ))),
        (Observation::Value(value), Some(target)) => match hpa::milli(*value) {
            Some(usage) => Ok(Measured {
                value: *value,
                usage,
                target,
            }),
            None => Err(Cow::Owned(format!("value {value} is not a number"))),
        },
    };
    Checked { reading, outcome }
}

/// Records the readings; returns the triggers whose consecutive failures
/// are past the fallback threshold (KEDA: more than `failureThreshold`).
/// One failure counts per polling interval: KEDA counts one per metrics
/// query (`pkg/fallback/fallback.go`, `GetMetricsWithFallback`), while the
/// poller retries a broken source sooner (and the same reading may be fed
/// twice). A tenth of the interval is slack for the time a read takes.
fn absorb(
    state: &mut State,
    checked: &[Checked],
    threshold: Option<u32>,
    interval: Millis,
) -> BTreeSet<String> {
    let spacing = interval - interval / 10;
    let mut due = BTreeSet::new();
    for Checked { reading, outcome } in checked {
        let trigger = state.triggers.entry(reading.trigger.clone()).or_default();
        match outcome {
            Ok(measured) => {
                trigger.last_value = Some(measured.value);
                trigger.last_error = None;
                trigger.consecutive_failures = 0;
                trigger.last_counted_failure_at = None;
            }
            Err(error) => {
                trigger.last_error = Some(error.to_string());
                let counts = trigger
                    .last_counted_failure_at
                    .is_none_or(|last| reading.at >= last.saturating_add(spacing.max(1)));
                if counts {
                    trigger.consecutive_failures = trigger.consecutive_failures.saturating_add(1);
                    trigger.last_counted_failure_at = Some(reading.at);
                }
            }
        }
        trigger.last_reading_at = Some(reading.at);
        if threshold.is_some_and(|threshold| trigger.consecutive_failures > threshold) {
            due.insert(reading.trigger.clone());
        }
    }
    due
}

fn fallback_message(due: &BTreeSet<String>, fallback: Fallback, replicas: u32) -> String {
    let names: Vec<&str> = due.iter().map(String::as_str).collect();
    format!(
        "{} failed more than {} times in a row: standing in with the fallback of {} replicas (running {replicas})",
        names.join(", "),
        fallback.failure_threshold,
        fallback.replicas
    )
}

fn failing(errors: &[&Reading]) -> String {
    let names: Vec<&str> = errors.iter().map(|r| r.trigger.as_str()).collect();
    format!(
        "trigger(s) failing, holding the current count: {}",
        names.join(", ")
    )
}

/// The counts an evaluation starts from.
struct Counts {
    /// Spec replicas: what the next step starts from.
    current: u32,
    /// Status replicas: what the usage ratio divides by.
    ratio_replicas: u32,
    /// Read from the cluster (steps are recorded once seen applied).
    observed: bool,
}

/// The HPA part for a ScaledObject at one or more replicas.
fn scale_from(
    state: &mut State,
    rules: &Rules,
    counts: Counts,
    values: &[(&Reading, Measured)],
    errors: &[&Reading],
    fallback_due: &BTreeSet<String>,
    now: Millis,
) -> (u32, Reason, String) {
    let Counts {
        current,
        ratio_replicas,
        observed,
    } = counts;
    let up = rules.scale_up();
    let down = rules.scale_down();
    let current = current.min(i32::MAX as u32) as i32;
    let ratio_replicas = ratio_replicas.min(i32::MAX as u32) as i32;
    let args = HpaArgs {
        current,
        min: rules.min_replica_count.max(1) as i32,
        max: rules.max_replica_count as i32,
        behavior: rules.behavior.is_some(),
        scale_up: &up,
        scale_down: &down,
        legacy_factor: SCALE_UP_FACTOR,
        steps_seen_applied: observed,
    };
    let mut proposals: Vec<Option<i32>> = values
        .iter()
        .map(|(_, measured)| {
            Some(hpa::average_value_proposal(
                measured.usage,
                measured.target,
                ratio_replicas,
                down.tolerance,
                up.tolerance,
            ))
        })
        .collect();
    // A failing trigger proposes nothing (so no scale-down happens), or,
    // once its fallback is due, the fallback count.
    let fallback = rules.fallback.filter(|_| !fallback_due.is_empty());
    proposals.extend(errors.iter().map(|reading| {
        fallback
            .filter(|_| fallback_due.contains(&reading.trigger))
            .map(|f| f.replicas.min(i32::MAX as u32) as i32)
    }));
    let (min, max) = (args.min, args.max);
    let (replicas, reason, message) = match hpa_reconcile(state, &args, &proposals, now) {
        HpaOutcome::Snapped { replicas, limit } => {
            let message = if limit == Limit::TooManyReplicas {
                format!("above maxReplicaCount {max}")
            } else {
                format!("below the minimum of {min}")
            };
            (replicas, reason_of(limit), message)
        }
        HpaOutcome::Held => (current, Reason::TriggerError, failing(errors)),
        HpaOutcome::Scaled {
            desired,
            stabilized,
            replicas,
            limit,
            held,
        } => {
            // Tolerance explains the outcome when the winning proposal was
            // held at the current count while its raw count differs.
            let within_tolerance = desired == current
                && values
                    .iter()
                    .zip(&proposals)
                    .all(|((_, measured), proposal)| {
                        *proposal != Some(desired)
                            || hpa::ceil_ratio(measured.usage, measured.target) != current
                    });
            match limit {
                Limit::DesiredWithinRange if stabilized != desired => match held {
                    Held::Down => (
                        replicas,
                        Reason::ScaleDownStabilized,
                        format!(
                            "wants {desired}; a higher recommendation within the scale-down window holds {stabilized}"
                        ),
                    ),
                    Held::Up => (
                        replicas,
                        Reason::ScaleUpStabilized,
                        format!(
                            "wants {desired}; a lower recommendation within the scale-up window holds {stabilized}"
                        ),
                    ),
                },
                Limit::DesiredWithinRange if within_tolerance => (
                    replicas,
                    Reason::WithinTolerance,
                    format!("usage within tolerance of {current} replicas"),
                ),
                Limit::DesiredWithinRange => (
                    replicas,
                    Reason::DesiredWithinRange,
                    format!("desired count {replicas}"),
                ),
                Limit::ScaleUpLimit => (
                    replicas,
                    Reason::ScaleUpLimit,
                    format!("wants {stabilized}; stepping up at most to {replicas}"),
                ),
                Limit::ScaleDownLimit => (
                    replicas,
                    Reason::ScaleDownLimit,
                    format!("wants {stabilized}; stepping down at most to {replicas}"),
                ),
                Limit::TooFewReplicas => (
                    replicas,
                    Reason::TooFewReplicas,
                    format!("wants {stabilized}; the minimum is {min}"),
                ),
                Limit::TooManyReplicas => (
                    replicas,
                    Reason::TooManyReplicas,
                    format!("wants {stabilized}; maxReplicaCount is {max}"),
                ),
            }
        }
    };
    let (reason, message) = match fallback {
        Some(fallback)
            if !matches!(reason, Reason::TooManyReplicas | Reason::TriggerError)
                && replicas as i64 == i64::from(fallback.replicas.max(1)) =>
        {
            let replicas = replicas.max(0) as u32;
            (
                Reason::Fallback,
                fallback_message(fallback_due, fallback, replicas),
            )
        }
        _ => (reason, message),
    };
    (replicas.max(0) as u32, reason, message)
}

fn reason_of(limit: Limit) -> Reason {
    match limit {
        Limit::DesiredWithinRange => Reason::DesiredWithinRange,
        Limit::ScaleUpLimit => Reason::ScaleUpLimit,
        Limit::ScaleDownLimit => Reason::ScaleDownLimit,
        Limit::TooFewReplicas => Reason::TooFewReplicas,
        Limit::TooManyReplicas => Reason::TooManyReplicas,
    }
}

/// The HPA's view of one reconcile.
pub struct HpaArgs<'a> {
    pub current: i32,
    pub min: i32,
    pub max: i32,
    /// Whether a `behavior` is set (rate policies, two-sided stabilization).
    pub behavior: bool,
    pub scale_up: &'a hpa::ScalingRules,
    pub scale_down: &'a hpa::ScalingRules,
    /// The no-`behavior` step-up factor (2; the Kubernetes unit tests use 8).
    pub legacy_factor: f64,
    /// Steps are recorded once the cluster shows them applied (the engine
    /// reading `/scale`); `false`: at once, as the HPA records its own
    /// rescales (and as an engine counting its own decisions must).
    pub steps_seen_applied: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HpaOutcome {
    /// The current count was outside [min, max] and snapped to the bound.
    Snapped { replicas: i32, limit: Limit },
    /// A metric failed and the others ask for fewer replicas: no change.
    Held,
    /// Normalized: the largest proposal, stabilized, then limited.
    Scaled {
        desired: i32,
        stabilized: i32,
        replicas: i32,
        limit: Limit,
        held: Held,
    },
}

/// The HPA's reconcile on per-metric proposals (`None`: the metric failed),
/// recording the recommendation and, with a `behavior`, the scale event.
pub fn hpa_reconcile(
    state: &mut State,
    args: &HpaArgs,
    proposals: &[Option<i32>],
    now: Millis,
) -> HpaOutcome {
    let current = args.current;
    let snap = if current > args.max {
        Some((args.max, Limit::TooManyReplicas))
    } else if current < args.min {
        Some((args.min, Limit::TooFewReplicas))
    } else {
        None
    };
    if let Some((replicas, limit)) = snap {
        // A snap is a rescale like any other: the controller records its
        // event (`horizontal.go`, `reconcileAutoscaler` calls
        // `storeScaleEvent` after every successful rescale).
        store_step(state, args, replicas, now);
        return HpaOutcome::Snapped { replicas, limit };
    }
    let failed = proposals.iter().any(Option::is_none);
    let Some(desired) = proposals.iter().flatten().copied().max() else {
        return HpaOutcome::Held;
    };
    if failed && desired < current {
        return HpaOutcome::Held;
    }

    let log = state.recommendations.get_or_insert_with(|| {
        vec![Recommendation {
            replicas: current,
            at: now,
        }]
    });
    let (up, down) = (args.scale_up, args.scale_down);
    if !args.behavior {
        let (stabilized, held) = if up.stabilization_window_seconds == 0 {
            let stabilized =
                hpa::stabilize_legacy(log, desired, down.stabilization_window_seconds, now);
            (stabilized, Held::Down)
        } else {
            hpa::stabilize_with_behaviors(
                log,
                current,
                desired,
                up.stabilization_window_seconds,
                down.stabilization_window_seconds,
                now,
            )
        };
        let (replicas, limit) =
            hpa::convert_with_rules(current, stabilized, args.min, args.max, args.legacy_factor);
        return HpaOutcome::Scaled {
            desired,
            stabilized,
            replicas,
            limit,
            held,
        };
    }
    let (stabilized, held) = hpa::stabilize_with_behaviors(
        log,
        current,
        desired,
        up.stabilization_window_seconds,
        down.stabilization_window_seconds,
        now,
    );
    let (replicas, limit) = hpa::convert_with_behavior_rate(
        &RateArgs {
            current,
            desired: stabilized,
            min: args.min,
            max: args.max,
            scale_up: up,
            scale_down: down,
            up_events: &state.scale_up_events,
            down_events: &state.scale_down_events,
        },
        now,
    );
    store_step(state, args, replicas, now);
    HpaOutcome::Scaled {
        desired,
        stabilized,
        replicas,
        limit,
        held,
    }
}

/// `storeScaleEvent`: with a `behavior`, a step from the current count to
/// `replicas` joins its direction's log; without one nothing is kept.
fn store_step(state: &mut State, args: &HpaArgs, replicas: i32, now: Millis) {
    if !args.behavior {
        return;
    }
    let current = args.current;
    if args.steps_seen_applied {
        // The newest decision replaces one still waiting: only what the
        // HPA applies is a step.
        let decided_at = match state.pending_step {
            Some(waiting) if (waiting.from, waiting.to) == (current, replicas) => {
                waiting.decided_at.unwrap_or(now)
            }
            _ => now,
        };
        state.pending_step = (replicas != current).then_some(PendingStep {
            from: current,
            to: replicas,
            decided_at: Some(decided_at),
        });
        return;
    }
    record_step(
        state,
        (args.scale_up, args.scale_down),
        current,
        replicas,
        now,
    );
}

/// A step from `from` to `to` replicas joins its direction's event log.
fn record_step(
    state: &mut State,
    (up, down): (&hpa::ScalingRules, &hpa::ScalingRules),
    from: i32,
    to: i32,
    now: Millis,
) {
    if to > from {
        let change = to.saturating_sub(from);
        hpa::store_scale_event(&mut state.scale_up_events, up, change, now);
    } else if to < from {
        let change = from.saturating_sub(to);
        hpa::store_scale_event(&mut state.scale_down_events, down, change, now);
    }
}

/// Takes the cluster's count and records the pending step it shows
/// applied. Alone (not through [`decide_observed`]) when the target moved
/// to the engine's own last answer (the HPA synced it): nothing is
/// decided, and the next step waits for the interval, as ACA steps once
/// per evaluation, not once per HPA sync.
pub fn observe_applied(state: &mut State, rules: &Rules, observed: Observed, now: Millis) {
    state.current_replicas = observed.spec_replicas;
    settle_pending_step(state, rules, observed.spec_replicas, now);
}

/// Records the pending step as a scale event once the cluster's count
/// (`spec`) has moved its way: the HPA applied it (or part of it, as its
/// own policies allowed; the part is what is recorded). A count that
/// moved the other way was changed by someone else: the step is dropped.
fn settle_pending_step(state: &mut State, rules: &Rules, spec: u32, now: Millis) {
    let Some(step) = state.pending_step else {
        return;
    };
    let spec = spec.min(i32::MAX as u32) as i32;
    if spec == step.from {
        return;
    }
    state.pending_step = None;
    if rules.behavior.is_none() {
        return;
    }
    let applied = if step.to > step.from && spec > step.from {
        spec.min(step.to)
    } else if step.to < step.from && spec < step.from {
        spec.max(step.to)
    } else {
        return;
    };
    let (up, down) = (rules.scale_up(), rules.scale_down());
    let at = step.decided_at.unwrap_or(now).min(now);
    record_step(state, (&up, &down), step.from, applied, at);
}

#[cfg(test)]
mod observed_tests;
#[cfg(test)]
mod tests;
