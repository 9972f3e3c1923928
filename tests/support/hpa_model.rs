//! A model of the Kubernetes HPA controller for one HorizontalPodAutoscaler
//! with one external `AverageValue` metric (the HPA KEDA creates for a
//! ScaledObject), written from `pkg/controller/podautoscaler/horizontal.go`
//! and `replica_calculator.go`: `reconcileAutoscaler`, the legacy
//! `normalizeDesiredReplicas` (no `behavior`) and
//! `normalizeDesiredReplicasWithBehaviors`, `storeScaleEvent`, and
//! `GetExternalPerPodMetricReplicas`.
//!
//! It shares no code with hoist's engine (`src/engine/hpa.rs`): the closed
//! loop (tests/closed_loop.rs) runs the engine against this model, so the
//! model must stand on its own. `tests/hpa_conformance.rs` holds it to the
//! HPA's own unit-test vectors (`tests/data/hpa-*.json`).

#![allow(dead_code)]

use serde_json::Value;

/// Milliseconds on the test's clock.
pub type Millis = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Pods,
    Percent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    Max,
    Min,
    Disabled,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub kind: PolicyKind,
    pub value: i32,
    pub period_seconds: u64,
}

/// `HPAScalingRules` after the API server's defaulting.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// `None` for scale-down: the controller's
    /// `--horizontal-pod-autoscaler-downscale-stabilization` (300 s).
    pub window_seconds: Option<u64>,
    pub select: Select,
    pub policies: Vec<Policy>,
    /// `tolerance` (Kubernetes 1.33+, `HPAConfigurableTolerance`).
    pub tolerance: f64,
}

impl Rules {
    /// `GenerateHPAScaleUpRules` with nothing set.
    pub fn default_up() -> Self {
        Self {
            window_seconds: Some(0),
            select: Select::Max,
            policies: vec![
                Policy {
                    kind: PolicyKind::Pods,
                    value: 4,
                    period_seconds: 15,
                },
                Policy {
                    kind: PolicyKind::Percent,
                    value: 100,
                    period_seconds: 15,
                },
            ],
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// `GenerateHPAScaleDownRules` with nothing set.
    pub fn default_down() -> Self {
        Self {
            window_seconds: None,
            select: Select::Max,
            policies: vec![Policy {
                kind: PolicyKind::Percent,
                value: 100,
                period_seconds: 15,
            }],
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// Fields of a `scaleUp`/`scaleDown` object (Kubernetes names) over
    /// `defaults`, as the API's defaulting fills a partial behavior.
    fn from_json(value: &Value, defaults: Rules) -> Self {
        let mut rules = defaults;
        if let Some(window) = value["stabilizationWindowSeconds"].as_u64() {
            rules.window_seconds = Some(window);
        }
        if let Some(select) = value["selectPolicy"].as_str() {
            rules.select = match select {
                "Min" => Select::Min,
                "Disabled" => Select::Disabled,
                _ => Select::Max,
            };
        }
        if let Some(policies) = value["policies"].as_array() {
            rules.policies = policies
                .iter()
                .map(|p| Policy {
                    kind: if p["type"] == "Pods" {
                        PolicyKind::Pods
                    } else {
                        PolicyKind::Percent
                    },
                    value: p["value"].as_i64().unwrap() as i32,
                    period_seconds: p["periodSeconds"].as_u64().unwrap(),
                })
                .collect();
        }
        if let Some(tolerance) = value["tolerance"].as_f64() {
            rules.tolerance = tolerance;
        }
        rules
    }
}

/// `--horizontal-pod-autoscaler-tolerance`.
pub const DEFAULT_TOLERANCE: f64 = 0.1;
/// `--horizontal-pod-autoscaler-downscale-stabilization`.
pub const DOWNSCALE_STABILIZATION_SECONDS: u64 = 300;
/// `scaleUpLimitFactor` and `scaleUpLimitMinimum` of the legacy path.
const SCALE_UP_LIMIT_FACTOR: i32 = 2;
const SCALE_UP_LIMIT_MINIMUM: i32 = 4;

#[derive(Debug, Clone, PartialEq)]
pub struct Behavior {
    pub up: Rules,
    pub down: Rules,
}

impl Behavior {
    /// A ScaledObject's `advanced.horizontalPodAutoscalerConfig.behavior`,
    /// which KEDA copies into the HPA it creates.
    pub fn from_json(value: &Value) -> Self {
        Self {
            up: Rules::from_json(&value["scaleUp"], Rules::default_up()),
            down: Rules::from_json(&value["scaleDown"], Rules::default_down()),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Recommendation {
    replicas: i32,
    at: Millis,
}

#[derive(Debug, Clone, Copy)]
struct ScaleEvent {
    change: i32,
    at: Millis,
    outdated: bool,
}

/// One HPA's controller state (the controller keeps it in memory, keyed
/// by HPA) and spec.
#[derive(Debug, Clone)]
pub struct Hpa {
    pub min: i32,
    pub max: i32,
    pub behavior: Option<Behavior>,
    /// `None` until the first sync seeds it (`recordInitialRecommendation`).
    recommendations: Option<Vec<Recommendation>>,
    up_events: Vec<ScaleEvent>,
    down_events: Vec<ScaleEvent>,
}

impl Hpa {
    pub fn new(min: i32, max: i32, behavior: Option<Behavior>) -> Self {
        Self {
            min,
            max,
            behavior,
            recommendations: None,
            up_events: Vec::new(),
            down_events: Vec::new(),
        }
    }

    /// Seeds the recommendation history (the vectors' `recommendations`;
    /// an empty list is a history, unlike none).
    pub fn remember(&mut self, history: &[(i32, Millis)]) {
        self.recommendations = Some(
            history
                .iter()
                .map(|&(replicas, at)| Recommendation { replicas, at })
                .collect(),
        );
    }

    /// The (scale-down, scale-up) tolerances the usage ratio is held to.
    pub fn tolerances(&self) -> (f64, f64) {
        match &self.behavior {
            Some(behavior) => (behavior.down.tolerance, behavior.up.tolerance),
            None => (DEFAULT_TOLERANCE, DEFAULT_TOLERANCE),
        }
    }

    /// One sync (`reconcileAutoscaler`) of a target whose `spec.replicas`
    /// is `current`, with one proposal per metric (`None`: the metric
    /// could not be read). Returns the new `spec.replicas`, or `None`
    /// when the HPA does not rescale.
    pub fn reconcile(
        &mut self,
        now: Millis,
        current: i32,
        proposals: &[Option<i32>],
    ) -> Option<i32> {
        self.recommendations.get_or_insert_with(|| {
            vec![Recommendation {
                replicas: current,
                at: now,
            }]
        });
        let desired = if current == 0 && self.min != 0 {
            // "Autoscaling is disabled for this resource".
            return None;
        } else if current > self.max {
            self.max
        } else if current < self.min {
            self.min
        } else {
            // computeReplicasForMetrics: the largest valid proposal; with
            // every metric invalid, or some invalid and the rest asking
            // for less, the sync fails and nothing changes.
            let valid: Vec<i32> = proposals.iter().flatten().copied().collect();
            let invalid = proposals.len() - valid.len();
            let largest = *valid.iter().max()?;
            if invalid > 0 && largest < current {
                return None;
            }
            match self.behavior.clone() {
                None => self.normalize_legacy(now, current, largest),
                Some(behavior) => self.normalize_with_behaviors(now, &behavior, current, largest),
            }
        };
        if desired == current {
            return None;
        }
        self.store_scale_event(now, current, desired);
        Some(desired)
    }

    /// `normalizeDesiredReplicas`: `stabilizeRecommendation`, then
    /// `convertDesiredReplicasWithRules`.
    fn normalize_legacy(&mut self, now: Millis, current: i32, proposal: i32) -> i32 {
        let cutoff = now.saturating_sub(DOWNSCALE_STABILIZATION_SECONDS * 1000);
        let mut stabilized = proposal;
        let mut old = None;
        for (index, recommendation) in self.history().iter().enumerate() {
            if recommendation.at < cutoff {
                old = Some(index);
            } else {
                stabilized = stabilized.max(recommendation.replicas);
            }
        }
        self.record(old, proposal, now);
        let scale_up_limit = (SCALE_UP_LIMIT_FACTOR * current).max(SCALE_UP_LIMIT_MINIMUM);
        let maximum = self.max.min(scale_up_limit);
        if stabilized < self.min {
            self.min
        } else if stabilized > maximum {
            maximum
        } else {
            stabilized
        }
    }

    /// `normalizeDesiredReplicasWithBehaviors`:
    /// `stabilizeRecommendationWithBehaviors`, then
    /// `convertDesiredReplicasWithBehaviorRate`.
    fn normalize_with_behaviors(
        &mut self,
        now: Millis,
        behavior: &Behavior,
        current: i32,
        proposal: i32,
    ) -> i32 {
        let up_window = behavior.up.window_seconds.unwrap_or(0);
        let down_window = behavior
            .down
            .window_seconds
            .unwrap_or(DOWNSCALE_STABILIZATION_SECONDS);
        let up_cutoff = now.saturating_sub(up_window * 1000);
        let down_cutoff = now.saturating_sub(down_window * 1000);
        let (mut up, mut down) = (proposal, proposal);
        let mut old = None;
        for (index, recommendation) in self.history().iter().enumerate() {
            if recommendation.at > up_cutoff {
                up = up.min(recommendation.replicas);
            }
            if recommendation.at > down_cutoff {
                down = down.max(recommendation.replicas);
            }
            if recommendation.at < up_cutoff && recommendation.at < down_cutoff {
                old = Some(index);
            }
        }
        self.record(old, proposal, now);
        let stabilized = current.max(up).min(down);

        if stabilized > current {
            let limit = rate_limit(
                true,
                now,
                current,
                &self.up_events,
                &self.down_events,
                &behavior.up,
            )
            .max(current);
            stabilized.min(self.max.min(limit))
        } else if stabilized < current {
            let limit = rate_limit(
                false,
                now,
                current,
                &self.up_events,
                &self.down_events,
                &behavior.down,
            )
            .min(current);
            stabilized.max(self.min.max(limit))
        } else {
            stabilized
        }
    }

    fn history(&self) -> &[Recommendation] {
        self.recommendations.as_deref().unwrap_or_default()
    }

    /// Keeps the unstabilized recommendation, reusing an expired slot.
    fn record(&mut self, old: Option<usize>, replicas: i32, at: Millis) {
        let recommendation = Recommendation { replicas, at };
        let history = self.recommendations.get_or_insert_with(Vec::new);
        match old {
            Some(index) => history[index] = recommendation,
            None => history.push(recommendation),
        }
    }

    /// `storeScaleEvent`: only an HPA with a behavior keeps events.
    fn store_scale_event(&mut self, now: Millis, previous: i32, new: i32) {
        let Some(behavior) = &self.behavior else {
            return;
        };
        let (events, rules, change) = if new > previous {
            (&mut self.up_events, &behavior.up, new - previous)
        } else {
            (&mut self.down_events, &behavior.down, previous - new)
        };
        let longest = rules
            .policies
            .iter()
            .map(|p| p.period_seconds)
            .max()
            .unwrap_or(0);
        let cutoff = now.saturating_sub(longest * 1000);
        for event in events.iter_mut() {
            if event.at < cutoff {
                event.outdated = true;
            }
        }
        let event = ScaleEvent {
            change,
            at: now,
            outdated: false,
        };
        match events.iter().position(|e| e.outdated) {
            Some(index) => events[index] = event,
            None => events.push(event),
        }
    }
}

/// `getReplicasChangePerPeriod`.
fn change_in_period(now: Millis, period_seconds: u64, events: &[ScaleEvent]) -> i32 {
    let cutoff = now.saturating_sub(period_seconds * 1000);
    events
        .iter()
        .filter(|e| e.at > cutoff)
        .map(|e| e.change)
        .sum()
}

/// `calculateScaleUpLimitWithScalingRules` (`up`) and
/// `calculateScaleDownLimitWithBehaviors`: each policy's limit from the
/// count at the start of its period; `Max` picks the largest change
/// (highest limit up, lowest down), `Min` the smallest.
fn rate_limit(
    up: bool,
    now: Millis,
    current: i32,
    ups: &[ScaleEvent],
    downs: &[ScaleEvent],
    rules: &Rules,
) -> i32 {
    let largest_change = match rules.select {
        Select::Disabled => return current,
        Select::Max => true,
        Select::Min => false,
    };
    let pick_highest = up == largest_change;
    let mut result = if pick_highest { i32::MIN } else { i32::MAX };
    for policy in &rules.policies {
        let start = current - change_in_period(now, policy.period_seconds, ups)
            + change_in_period(now, policy.period_seconds, downs);
        let fraction = policy.value as f64 / 100.0;
        let proposed = match (policy.kind, up) {
            (PolicyKind::Pods, true) => start + policy.value,
            (PolicyKind::Pods, false) => start - policy.value,
            // Rounded up: a percentage must be able to add a pod.
            (PolicyKind::Percent, true) => (start as f64 * (1.0 + fraction)).ceil() as i32,
            (PolicyKind::Percent, false) => (start as f64 * (1.0 - fraction)) as i32,
        };
        result = if pick_highest {
            result.max(proposed)
        } else {
            result.min(proposed)
        };
    }
    result
}

/// `GetExternalPerPodMetricReplicas`: the metric's sum over the target per
/// pod, divided by `status.replicas` for the tolerance check.
pub fn per_pod_proposal(
    usage_milli: i64,
    target_milli: i64,
    status_replicas: i32,
    tolerances: (f64, f64),
) -> i32 {
    let ratio = usage_milli as f64 / (target_milli as f64 * status_replicas as f64);
    let (down, up) = tolerances;
    if (1.0 - down) <= ratio && ratio <= (1.0 + up) {
        return status_replicas;
    }
    (usage_milli as f64 / target_milli as f64).ceil() as i32
}
