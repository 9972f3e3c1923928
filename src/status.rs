//! `/status`: every tracked ScaledObject with its triggers, readings,
//! activity, replica counts and the reason behind them. Built from the
//! driver's cache; holds no secret (sources are described by address and
//! key name only, metadata is never copied).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::driver::{Driver, Reading, Tracked};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub scaled_objects: Vec<ObjectStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    pub namespace: String,
    pub name: String,
    /// `passthrough` (KEDA and the HPA decide) or `engine`.
    pub mode: String,
    pub active: Option<bool>,
    /// The engine's count in force (engine mode only: in passthrough mode
    /// hoist does not know what the HPA runs).
    pub current_replicas: Option<u32>,
    /// Engine mode: the decided count. Passthrough: `max ceil(value /
    /// target)`, what the HPA would ask for before its own limits.
    pub desired_replicas: Option<u32>,
    pub reason: String,
    pub message: String,
    pub cooldown_left_seconds: Option<f64>,
    pub stabilization_left_seconds: Option<f64>,
    pub triggers: Vec<TriggerStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TriggerStatus {
    pub scaler: String,
    pub metric: String,
    pub source: String,
    pub target: f64,
    pub activation_target: f64,
    pub value: Option<f64>,
    /// Seconds since the latest poll (successful or not).
    pub reading_age_seconds: Option<f64>,
    pub error: Option<String>,
    pub consecutive_failures: u32,
    pub active: Option<bool>,
}

fn trigger_status(tracked: &Tracked, now: Instant) -> TriggerStatus {
    let trigger = &tracked.config.trigger;
    let age = |at: Instant| Some(now.saturating_duration_since(at).as_secs_f64());
    let (value, reading_age_seconds, error, consecutive_failures) = match tracked.latest() {
        Reading::Pending => (None, None, None, 0),
        Reading::Value { value, at, .. } => (Some(value), age(at), None, 0),
        Reading::Failed {
            error,
            at,
            consecutive_failures,
            ..
        } => (None, age(at), Some(error.to_string()), consecutive_failures),
    };
    TriggerStatus {
        scaler: trigger.scaler.to_string(),
        metric: trigger.metric_name.clone(),
        source: trigger.query.description.clone(),
        target: trigger.target,
        activation_target: trigger.activation_target,
        value,
        reading_age_seconds,
        error,
        consecutive_failures,
        active: tracked.latest().activity().map(|a| tracked.is_active(a)),
    }
}

/// A snapshot of everything the driver tracks.
pub fn snapshot(driver: &Driver) -> Status {
    let now = Instant::now();
    let wall_now = driver.clock().now();
    let mut objects: BTreeMap<(String, String), Vec<std::sync::Arc<Tracked>>> = BTreeMap::new();
    for tracked in driver.tracked() {
        objects
            .entry((tracked.key.namespace.clone(), tracked.key.name.clone()))
            .or_default()
            .push(tracked);
    }
    let scaled_objects = objects
        .into_iter()
        .map(|((namespace, name), mut members)| {
            members.sort_by(|a, b| {
                a.config
                    .trigger
                    .metric_name
                    .cmp(&b.config.trigger.metric_name)
            });
            let triggers: Vec<TriggerStatus> =
                members.iter().map(|t| trigger_status(t, now)).collect();
            let seconds_until =
                |at: Option<u64>| at.map(|at| at.saturating_sub(wall_now) as f64 / 1000.0);
            match members.iter().find_map(|t| t.scaling.clone()) {
                Some(scaling) => {
                    let decision = scaling.decision();
                    let state = scaling.state();
                    ObjectStatus {
                        namespace,
                        name,
                        mode: "engine".into(),
                        active: decision.as_ref().map(|d| d.active),
                        current_replicas: Some(state.current_replicas),
                        desired_replicas: decision.as_ref().map(|d| d.replicas),
                        reason: decision
                            .as_ref()
                            .map_or("NoDecisionYet".into(), |d| format!("{:?}", d.reason)),
                        message: decision
                            .as_ref()
                            .map_or_else(String::new, |d| d.message.clone()),
                        cooldown_left_seconds: seconds_until(
                            decision.as_ref().and_then(cooldown_running),
                        ),
                        stabilization_left_seconds: seconds_until(
                            decision.as_ref().and_then(|d| d.stabilization_ends),
                        ),
                        triggers,
                    }
                }
                None => {
                    let desired = members
                        .iter()
                        .zip(&triggers)
                        .filter_map(|(tracked, status)| {
                            status
                                .value
                                .map(|v| (v / tracked.config.trigger.target).ceil().max(0.0) as u32)
                        })
                        .max();
                    let failing = triggers.iter().any(|t| t.error.is_some());
                    ObjectStatus {
                        namespace,
                        name,
                        mode: "passthrough".into(),
                        active: triggers
                            .iter()
                            .filter_map(|t| t.active)
                            .reduce(|a, b| a || b),
                        current_replicas: None,
                        desired_replicas: desired,
                        reason: if failing {
                            "TriggerError"
                        } else {
                            "Passthrough"
                        }
                        .into(),
                        message: if failing {
                            "a source is failing: KEDA gets an error and keeps the current count"
                                .into()
                        } else {
                            "raw values reported; KEDA and the HPA decide".into()
                        },
                        cooldown_left_seconds: None,
                        stabilization_left_seconds: None,
                        triggers,
                    }
                }
            }
        })
        .collect();
    Status { scaled_objects }
}

/// When the decision's cooldown ends, if one is counting down: not while
/// the ScaledObject is active, as it is through a failing trigger (the
/// engine keeps the cooldown's end, but activity holds it).
fn cooldown_running(decision: &crate::engine::Decision) -> Option<u64> {
    if decision.active && decision.reason == crate::engine::Reason::TriggerError {
        return None;
    }
    decision.cooldown_ends
}

/// The status as a table for people (`hoist status`).
pub fn table(status: &Status) -> String {
    let mut rows = vec![[
        "SCALEDOBJECT".to_string(),
        "MODE".to_string(),
        "ACTIVE".to_string(),
        "CURRENT".to_string(),
        "DESIRED".to_string(),
        "REASON".to_string(),
        "WAIT".to_string(),
        "TRIGGERS".to_string(),
    ]];
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
    for object in &status.scaled_objects {
        let wait = match (
            object.cooldown_left_seconds,
            object.stabilization_left_seconds,
        ) {
            (Some(cooldown), _) => Some(format!("cooldown {cooldown:.0}s")),
            (None, Some(window)) => Some(format!("window {window:.0}s")),
            _ => None,
        };
        let triggers = object
            .triggers
            .iter()
            .map(|t| match (&t.value, &t.error) {
                (Some(value), _) => format!(
                    "{}={value} ({:.0}s ago)",
                    t.metric,
                    t.reading_age_seconds.unwrap_or_default()
                ),
                (None, Some(error)) => {
                    format!("{}=ERROR x{}: {error}", t.metric, t.consecutive_failures)
                }
                _ => format!("{}=pending", t.metric),
            })
            .collect::<Vec<_>>()
            .join("; ");
        rows.push([
            format!("{}/{}", object.namespace, object.name),
            object.mode.clone(),
            or_dash(
                object
                    .active
                    .map(|a| if a { "yes" } else { "no" }.to_string()),
            ),
            or_dash(object.current_replicas.map(|n| n.to_string())),
            or_dash(object.desired_replicas.map(|n| n.to_string())),
            object.reason.clone(),
            or_dash(wait),
            triggers,
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(column, cell)| {
                if column == 7 {
                    cell.clone()
                } else {
                    format!("{cell:<width$}", width = widths[column])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(metric: &str, value: Option<f64>, error: Option<&str>) -> TriggerStatus {
        TriggerStatus {
            scaler: "redis".into(),
            metric: metric.into(),
            source: format!("redis list `{metric}` on r:6379 db 0"),
            target: 5.0,
            activation_target: 0.0,
            value,
            reading_age_seconds: Some(3.2),
            error: error.map(String::from),
            consecutive_failures: u32::from(error.is_some()) * 4,
            active: value.map(|v| v > 0.0),
        }
    }

    #[test]
    fn no_cooldown_countdown_while_active_through_a_trigger_error() {
        let mut decision = crate::engine::Decision {
            at: 0,
            active: true,
            replicas: 3,
            raw_desired: None,
            reason: crate::engine::Reason::TriggerError,
            message: String::new(),
            next_evaluation: 30_000,
            cooldown_ends: Some(300_000),
            stabilization_ends: None,
        };
        assert_eq!(cooldown_running(&decision), None);
        decision.active = false;
        decision.reason = crate::engine::Reason::Cooldown;
        assert_eq!(cooldown_running(&decision), Some(300_000));
    }

    #[test]
    fn the_table_lines_up_and_says_what_waits() {
        let status = Status {
            scaled_objects: vec![
                ObjectStatus {
                    namespace: "default".into(),
                    name: "worker".into(),
                    mode: "engine".into(),
                    active: Some(true),
                    current_replicas: Some(10),
                    desired_replicas: Some(10),
                    reason: "Cooldown".into(),
                    message: String::new(),
                    cooldown_left_seconds: Some(212.4),
                    stabilization_left_seconds: None,
                    triggers: vec![trigger("redis-jobs", Some(0.0), None)],
                },
                ObjectStatus {
                    namespace: "orders".into(),
                    name: "mailer".into(),
                    mode: "passthrough".into(),
                    active: None,
                    current_replicas: None,
                    desired_replicas: None,
                    reason: "TriggerError".into(),
                    message: String::new(),
                    cooldown_left_seconds: None,
                    stabilization_left_seconds: None,
                    triggers: vec![trigger("redis-mail", None, Some("cannot connect: refused"))],
                },
            ],
        };
        let table = table(&status);
        let expected = "\
SCALEDOBJECT    MODE         ACTIVE  CURRENT  DESIRED  REASON        WAIT           TRIGGERS
default/worker  engine       yes     10       10       Cooldown      cooldown 212s  redis-jobs=0 (3s ago)
orders/mailer   passthrough  -       -        -        TriggerError  -              redis-mail=ERROR x4: cannot connect: refused
";
        assert_eq!(table, expected, "\n{table}");
    }
}
