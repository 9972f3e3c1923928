//! The Kubernetes HPA's normalization rules, as pure functions over
//! explicit instants: stabilization windows, the legacy scale-up limit,
//! `behavior` rate policies and the scale-event log. Names follow the
//! controller's (`pkg/controller/podautoscaler/horizontal.go`) so the
//! conformance vectors map one to one.

use serde::{Deserialize, Serialize};

use super::Millis;

/// A past recommendation, kept for the stabilization windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recommendation {
    pub replicas: i32,
    pub at: Millis,
}

/// A past scaling step, kept for `behavior` rate policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleEvent {
    pub change: i32,
    pub at: Millis,
    /// Older than every policy period: its slot may be reused.
    #[serde(default)]
    pub outdated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyType {
    Pods,
    Percent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(rename = "type")]
    pub kind: PolicyType,
    pub value: i32,
    pub period_seconds: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SelectPolicy {
    #[default]
    Max,
    Min,
    Disabled,
}

/// One direction of an HPA `behavior`, with the API defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    pub stabilization_window_seconds: u32,
    pub select_policy: SelectPolicy,
    pub policies: Vec<Policy>,
    pub tolerance: f64,
}

/// Why the final count differs from the stabilized recommendation, or
/// that it does not: the HPA's `ScalingLimited` reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limit {
    DesiredWithinRange,
    ScaleUpLimit,
    ScaleDownLimit,
    TooFewReplicas,
    TooManyReplicas,
}

/// Whether an event at `at` is inside a window of `seconds` ending at `now`
/// (strictly: Go's `timestamp.After(now - window)`).
fn within(at: Millis, seconds: u32, now: Millis) -> bool {
    (now as i128 - at as i128) < seconds as i128 * 1000
}

/// Older than a window of `seconds` (Go's `timestamp.Before(now - window)`).
fn older(at: Millis, seconds: u32, now: Millis) -> bool {
    (now as i128 - at as i128) > seconds as i128 * 1000
}

/// `getReplicasChangePerPeriod`: replicas added (or removed) by the events
/// inside the period.
pub fn replicas_change_in_period(period_seconds: u32, events: &[ScaleEvent], now: Millis) -> i32 {
    let sum: i64 = events
        .iter()
        .filter(|event| within(event.at, period_seconds, now))
        .map(|event| i64::from(event.change))
        .sum();
    sum.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// `calculateScaleUpLimitWithScalingRules`.
pub fn scale_up_limit(
    current: i32,
    up_events: &[ScaleEvent],
    down_events: &[ScaleEvent],
    rules: &ScalingRules,
    now: Millis,
) -> i32 {
    // `Max` picks the largest allowed increase, `Min` the smallest.
    let pick: fn(i32, i32) -> i32 = match rules.select_policy {
        SelectPolicy::Disabled => return current,
        SelectPolicy::Min => i32::min,
        SelectPolicy::Max => i32::max,
    };
    let proposals =
        period_starts(current, up_events, down_events, rules, now).map(|(policy, start)| {
            match policy.kind {
                PolicyType::Pods => start.saturating_add(policy.value),
                PolicyType::Percent => {
                    (start as f64 * (1.0 + policy.value as f64 / 100.0)).ceil() as i32
                }
            }
        });
    proposals.reduce(pick).unwrap_or(current)
}

/// `calculateScaleDownLimitWithBehaviors`. For scale-down, `Min` (the
/// smallest change) keeps the most replicas.
pub fn scale_down_limit(
    current: i32,
    up_events: &[ScaleEvent],
    down_events: &[ScaleEvent],
    rules: &ScalingRules,
    now: Millis,
) -> i32 {
    let pick: fn(i32, i32) -> i32 = match rules.select_policy {
        SelectPolicy::Disabled => return current,
        SelectPolicy::Min => i32::max,
        SelectPolicy::Max => i32::min,
    };
    let proposals =
        period_starts(current, up_events, down_events, rules, now).map(|(policy, start)| {
            match policy.kind {
                PolicyType::Pods => start.saturating_sub(policy.value),
                // Truncation toward zero, as Go's int32(float64) conversion.
                PolicyType::Percent => (start as f64 * (1.0 - policy.value as f64 / 100.0)) as i32,
            }
        });
    proposals.reduce(pick).unwrap_or(current)
}

/// Each policy with the replica count at the start of its period: the
/// current count less the steps taken inside the period.
fn period_starts<'a>(
    current: i32,
    up_events: &'a [ScaleEvent],
    down_events: &'a [ScaleEvent],
    rules: &'a ScalingRules,
    now: Millis,
) -> impl Iterator<Item = (&'a Policy, i32)> + 'a {
    rules.policies.iter().map(move |policy| {
        let added = replicas_change_in_period(policy.period_seconds, up_events, now);
        let removed = replicas_change_in_period(policy.period_seconds, down_events, now);
        (
            policy,
            current.saturating_sub(added).saturating_add(removed),
        )
    })
}

/// `convertDesiredReplicasWithBehaviorRate`: min/max and the policies.
pub struct RateArgs<'a> {
    pub current: i32,
    pub desired: i32,
    pub min: i32,
    pub max: i32,
    pub scale_up: &'a ScalingRules,
    pub scale_down: &'a ScalingRules,
    pub up_events: &'a [ScaleEvent],
    pub down_events: &'a [ScaleEvent],
}

pub fn convert_with_behavior_rate(args: &RateArgs, now: Millis) -> (i32, Limit) {
    if args.desired > args.current {
        let limit = scale_up_limit(
            args.current,
            args.up_events,
            args.down_events,
            args.scale_up,
            now,
        )
        .max(args.current);
        let (allowed, reason) = if args.max > limit {
            (limit, Limit::ScaleUpLimit)
        } else {
            (args.max, Limit::TooManyReplicas)
        };
        if args.desired > allowed {
            return (allowed, reason);
        }
    } else if args.desired < args.current {
        let limit = scale_down_limit(
            args.current,
            args.up_events,
            args.down_events,
            args.scale_down,
            now,
        )
        .min(args.current);
        let (allowed, reason) = if args.min < limit {
            (limit, Limit::ScaleDownLimit)
        } else {
            (args.min, Limit::TooFewReplicas)
        };
        if args.desired < allowed {
            return (allowed, reason);
        }
    }
    (args.desired, Limit::DesiredWithinRange)
}

/// `calculateScaleUpLimit`: ACA's step-up, `max(4, factor × current)`.
pub fn legacy_scale_up_limit(current: i32, factor: f64) -> i32 {
    (factor * current as f64).max(4.0) as i32
}

/// `convertDesiredReplicasWithRules`: the no-`behavior` path.
pub fn convert_with_rules(
    current: i32,
    desired: i32,
    min: i32,
    max: i32,
    factor: f64,
) -> (i32, Limit) {
    let limit = legacy_scale_up_limit(current, factor);
    let (allowed, reason) = if max > limit {
        (limit, Limit::ScaleUpLimit)
    } else {
        (max, Limit::TooManyReplicas)
    };
    if desired < min {
        (min, Limit::TooFewReplicas)
    } else if desired > allowed {
        (allowed, reason)
    } else {
        (desired, Limit::DesiredWithinRange)
    }
}

/// `stabilizeRecommendation`: the no-`behavior` path. The highest
/// recommendation inside the scale-down window wins; the new one is
/// recorded (reusing the last slot that fell out of the window).
pub fn stabilize_legacy(
    log: &mut Vec<Recommendation>,
    desired: i32,
    window_seconds: u32,
    now: Millis,
) -> i32 {
    let mut highest = desired;
    let mut old_slot = None;
    for (index, recommendation) in log.iter().enumerate() {
        if older(recommendation.at, window_seconds, now) {
            old_slot = Some(index);
        } else if recommendation.replicas > highest {
            highest = recommendation.replicas;
        }
    }
    record(log, old_slot, desired, now);
    highest
}

/// Which way a stabilized recommendation was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Up,
    Down,
}

/// `stabilizeRecommendationWithBehaviors`: the current count, kept between
/// the lowest recommendation of the scale-up window and the highest of
/// the scale-down window.
pub fn stabilize_with_behaviors(
    log: &mut Vec<Recommendation>,
    current: i32,
    desired: i32,
    up_window_seconds: u32,
    down_window_seconds: u32,
    now: Millis,
) -> (i32, Held) {
    let mut up = desired;
    let mut down = desired;
    let mut old_slot = None;
    for (index, recommendation) in log.iter().enumerate() {
        if within(recommendation.at, up_window_seconds, now) {
            up = up.min(recommendation.replicas);
        }
        if within(recommendation.at, down_window_seconds, now) {
            down = down.max(recommendation.replicas);
        }
        if older(recommendation.at, up_window_seconds, now)
            && older(recommendation.at, down_window_seconds, now)
        {
            old_slot = Some(index);
        }
    }
    let stabilized = current.max(up).min(down);
    record(log, old_slot, desired, now);
    let held = if desired >= current {
        Held::Up
    } else {
        Held::Down
    };
    (stabilized, held)
}

fn record(log: &mut Vec<Recommendation>, old_slot: Option<usize>, replicas: i32, now: Millis) {
    let recommendation = Recommendation { replicas, at: now };
    match old_slot {
        Some(index) => log[index] = recommendation,
        None => log.push(recommendation),
    }
}

/// `storeScaleEvent` (with `markScaleEventsOutdated`): records a step,
/// reusing the last slot older than the direction's longest policy period.
pub fn store_scale_event(
    events: &mut Vec<ScaleEvent>,
    rules: &ScalingRules,
    change: i32,
    now: Millis,
) {
    let longest = rules
        .policies
        .iter()
        .map(|p| p.period_seconds)
        .max()
        .unwrap_or(0);
    let mut old_slot = None;
    for (index, event) in events.iter_mut().enumerate() {
        if older(event.at, longest, now) {
            event.outdated = true;
        }
        if event.outdated {
            old_slot = Some(index);
        }
    }
    let event = ScaleEvent {
        change,
        at: now,
        outdated: false,
    };
    match old_slot {
        Some(index) => events[index] = event,
        None => events.push(event),
    }
}

/// A value or target as the HPA reads it, in milli-units. KEDA hands both
/// over as Kubernetes quantities with three decimals
/// (`pkg/scalers/scaler.go`, `GenerateMetricInMili` and
/// `GetMetricTargetMili` via `quantityFromFloat64`: `%.3f`, negative values
/// as zero) and the HPA reads `Quantity.MilliValue()`. Formatting rounds the
/// exact binary value the way Go's `%.3f` does, so 2.7 is 2700 and 0.3 is
/// 300 (their f64 quotient is just above 9). Too large for an `int64`:
/// `i64::MAX`. `None` for NaN and infinities, which are no reading at all.
pub fn milli(value: f64) -> Option<i64> {
    // Above this, value × 1000 leaves the int64 range.
    const LARGEST: f64 = 9.2e15;
    if !value.is_finite() {
        return None;
    }
    if value <= 0.0 {
        return Some(0);
    }
    if value >= LARGEST {
        return Some(i64::MAX);
    }
    // The product's rounding error is below `value × 1000 × 2⁻⁵³`: unless
    // it lies that close to a half (a tie of `%.3f`), the exact value
    // rounds the same way as the float. Exact formatting only near a tie
    // (it was 40 % of `simulate`'s time).
    let scaled = value * 1000.0;
    if scaled < FAST_BELOW {
        let fraction = scaled - scaled.floor();
        let margin = scaled * 4.0 * f64::EPSILON + f64::MIN_POSITIVE;
        if (fraction - 0.5).abs() > margin {
            return Some(scaled.round() as i64);
        }
    }
    milli_exact(value)
}

/// Where the fast path of [`milli`] stops: from 2⁵² on, floats have no
/// fraction left to tell a tie by.
const FAST_BELOW: f64 = 4_503_599_627_370_496.0;

/// [`milli`] by formatting the exact binary value as Go's `%.3f` does.
pub(crate) fn milli_exact(value: f64) -> Option<i64> {
    let text = format!("{value:.3}");
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, "0"));
    let whole: i64 = whole.parse().ok()?;
    let fraction: i64 = fraction.parse().ok()?;
    Some(whole.saturating_mul(1000).saturating_add(fraction))
}

/// `ceil(usage / target)` as the controller computes it: float64 division
/// of the integer milli-values, saturating into int32.
pub fn ceil_ratio(usage_milli: i64, target_milli: i64) -> i32 {
    // Rust's float-to-int cast saturates (NaN, from 0/0, is 0).
    (usage_milli as f64 / target_milli as f64).ceil() as i32
}

/// The replica count one external metric with an `AverageValue` target
/// asks for (`replica_calculator.go`, `GetExternalPerPodMetricReplicas`):
/// unchanged while the usage ratio is within tolerance, else
/// `ceil(usage / target)`, both in milli-units.
pub fn average_value_proposal(
    usage_milli: i64,
    target_milli: i64,
    current: i32,
    tolerance_down: f64,
    tolerance_up: f64,
) -> i32 {
    let ratio = usage_milli as f64 / (target_milli as f64 * f64::from(current));
    if (1.0 - tolerance_down..=1.0 + tolerance_up).contains(&ratio) {
        current
    } else {
        ceil_ratio(usage_milli, target_milli)
    }
}
