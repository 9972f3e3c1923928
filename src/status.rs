//! `/status`: every tracked ScaledObject with its triggers, readings,
//! activity, replica counts and the reason behind them. Built from the
//! driver's cache; holds no secret (sources are described by address and
//! key name only, metadata is never copied).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::driver::{Answer, CountSource, Driver, Insight, Reading, Tracked};
use crate::engine::rules::Source;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub scaled_objects: Vec<ObjectStatus>,
    /// Kubernetes access (engine mode's replica counts), when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesStatus>,
    /// Reloads of hoist's config, when it reloads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<crate::reload::ConfigStatus>,
    /// Routes ScaledObjects declare, when hoist has an interceptor (in
    /// process or followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<RoutesStatus>,
}

/// The declared routes: what interceptors serve besides hoist's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutesStatus {
    /// The table's version, as interceptors following it report it.
    pub version: u64,
    /// Started without the earlier run's whole table, within
    /// `polling.idle_after`: split interceptors keep routes this run has
    /// not heard of yet.
    pub settling: bool,
    /// In claim order (the first claim wins).
    pub declared: Vec<DeclaredRouteStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeclaredRouteStatus {
    pub name: String,
    /// `http` or `tcp`.
    pub protocol: String,
    /// `namespace/name` of the ScaledObject.
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<u16>,
    pub upstream: String,
    /// Tracked triggers declaring it (0: restored from the state file and
    /// not declared again yet).
    pub triggers: usize,
    /// Restored and not declared again for this long; dropped after
    /// `polling.idle_after`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undeclared_for_seconds: Option<f64>,
}

fn routes_status(report: crate::routing::RegistryReport) -> RoutesStatus {
    RoutesStatus {
        version: report.version,
        settling: report.settling,
        declared: report
            .routes
            .into_iter()
            .map(|route| DeclaredRouteStatus {
                name: route.spec.name,
                protocol: route.spec.protocol.to_string(),
                owner: route
                    .spec
                    .owner
                    .map(|owner| format!("{}/{}", owner.namespace, owner.name)),
                hosts: route.spec.hosts,
                path_prefix: route.spec.path_prefix,
                listen_port: route.spec.listen.map(|listen| listen.port()),
                upstream: route.spec.upstream,
                triggers: route.triggers,
                undeclared_for_seconds: route.unclaimed_for.map(|d| d.as_secs_f64()),
            })
            .collect(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesStatus {
    pub server: String,
    /// Why ScaledObjects cannot be watched, while they cannot.
    pub error: Option<String>,
    /// ScaledObjects calling hoist that KEDA has not set up (no HPA:
    /// kedacore/keda#5787), as `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreconciled: Vec<String>,
}

/// What engine mode computed from, beyond the decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    /// The scale target, e.g. `Deployment worker (apps/v1)`.
    pub target: Option<String>,
    /// `cluster` (the target's /scale) or `ownDecision`; none while unknown.
    pub count_source: Option<String>,
    /// `spec.replicas` and `status.replicas` as last read, and their age.
    pub spec_replicas: Option<u32>,
    pub status_replicas: Option<u32>,
    pub count_age_seconds: Option<f64>,
    /// Why the count or the ScaledObject cannot be read.
    pub count_error: Option<String>,
    /// Each ScaledObject-level setting: its value and where it came from
    /// (`metadata`, `scaledObject` or `default`).
    pub settings: BTreeMap<String, Setting>,
    /// Where KEDA's or the HPA's own settings limit the engine again.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Setting {
    pub value: serde_json::Value,
    pub source: String,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineStatus>,
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
    /// The polling interval in force and where it came from (`metadata`,
    /// `scaledObject` or `default`).
    #[serde(default)]
    pub polling_interval_seconds: f64,
    #[serde(default)]
    pub polling_interval_source: String,
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
        source: trigger.query.description.to_string(),
        target: trigger.target,
        activation_target: trigger.activation_target,
        value,
        reading_age_seconds,
        error,
        consecutive_failures,
        active: tracked.latest().activity().map(|a| tracked.is_active(a)),
        polling_interval_seconds: tracked.interval().as_secs_f64(),
        polling_interval_source: if tracked.config.written.contains("pollingInterval") {
            "metadata"
        } else if tracked.interval() != tracked.config.polling_interval {
            "scaledObject"
        } else {
            "default"
        }
        .into(),
    }
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Metadata => "metadata",
        Source::ScaledObject => "scaledObject",
        Source::Default => "default",
    }
}

fn engine_status(insight: Insight, wall_now: u64) -> EngineStatus {
    let rules = insight
        .rules
        .as_ref()
        .and_then(|r| serde_json::to_value(r).ok())
        .unwrap_or_default();
    let settings = insight
        .sources
        .iter()
        .map(|(key, source)| {
            // The sources are keyed by the rules' own (camelCase) names.
            let value = rules.get(*key).cloned().unwrap_or_default();
            (
                key.to_string(),
                Setting {
                    value,
                    source: source_name(*source).into(),
                },
            )
        })
        .collect();
    EngineStatus {
        target: insight.target,
        count_source: insight.count_source.map(|s| {
            match s {
                CountSource::Cluster => "cluster",
                CountSource::OwnDecision => "ownDecision",
            }
            .into()
        }),
        spec_replicas: insight.observed.map(|o| o.spec_replicas),
        status_replicas: insight.observed.map(|o| o.status_replicas),
        count_age_seconds: insight
            .observed_at
            .map(|at| wall_now.saturating_sub(at) as f64 / 1000.0),
        count_error: insight.count_error,
        settings,
        warnings: insight.warnings,
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
                    let answer = scaling.answer();
                    let decision = scaling.decision();
                    let state = scaling.state();
                    let (reason, message) = match &answer {
                        Some(Answer::Decided(d)) => (format!("{:?}", d.reason), d.message.clone()),
                        Some(Answer::CountUnknown(why)) => ("CountUnknown".into(), why.clone()),
                        None => ("NoDecisionYet".into(), String::new()),
                    };
                    let insight = scaling.insight();
                    ObjectStatus {
                        namespace,
                        name,
                        mode: "engine".into(),
                        active: decision.as_ref().map(|d| d.active),
                        current_replicas: insight
                            .observed
                            .filter(|_| insight.count_source == Some(CountSource::Cluster))
                            .map(|o| o.spec_replicas)
                            .or_else(|| decision.as_ref().map(|_| state.current_replicas)),
                        desired_replicas: decision.as_ref().map(|d| d.replicas),
                        reason,
                        message,
                        cooldown_left_seconds: seconds_until(
                            decision.as_ref().and_then(cooldown_running),
                        ),
                        stabilization_left_seconds: seconds_until(
                            decision.as_ref().and_then(|d| d.stabilization_ends),
                        ),
                        triggers,
                        engine: Some(engine_status(insight, wall_now)),
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
                        engine: None,
                    }
                }
            }
        })
        .collect();
    Status {
        scaled_objects,
        kubernetes: driver.cluster().map(|cluster| KubernetesStatus {
            server: cluster.server().to_string(),
            error: cluster.watch_error(),
            unreconciled: cluster.unreconciled(driver.grpc_port()),
        }),
        config: None,
        routes: driver
            .routes()
            .map(|registry| routes_status(registry.report())),
    }
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
    for object in &status.scaled_objects {
        let Some(engine) = &object.engine else {
            continue;
        };
        let name = format!("{}/{}", object.namespace, object.name);
        let settings: Vec<String> = engine
            .settings
            .iter()
            .filter(|(_, setting)| !setting.value.is_null())
            .map(|(key, setting)| format!("{key}={} ({})", setting.value, setting.source))
            .collect();
        if !settings.is_empty() {
            out.push_str(&format!("{name}: {}\n", settings.join(", ")));
        }
        if object.reason == "CountUnknown" {
            out.push_str(&format!("{name}: {}\n", object.message));
        }
        for warning in &engine.warnings {
            out.push_str(&format!("{name}: warning: {warning}\n"));
        }
    }
    if let Some(routes) = &status.routes {
        for route in &routes.declared {
            let claim = match (route.listen_port, &route.path_prefix) {
                (Some(port), _) => format!("port {port}"),
                (None, Some(prefix)) => format!("hosts {} prefix {prefix}", route.hosts.join(",")),
                (None, None) => format!("hosts {}", route.hosts.join(",")),
            };
            let owner = route.owner.as_deref().unwrap_or("hoist's config");
            let declared_by = match (route.triggers, route.undeclared_for_seconds) {
                (0, Some(seconds)) => format!("saved, not declared again for {seconds:.0}s"),
                (1, _) => "1 trigger".to_string(),
                (n, _) => format!("{n} triggers"),
            };
            out.push_str(&format!(
                "route {} ({owner}, {declared_by}): {claim} -> {}\n",
                route.name, route.upstream
            ));
        }
        if routes.settling {
            out.push_str("routes: settling (started without the earlier run's whole table; split interceptors keep routes not declared again yet)\n");
        }
    }
    if let Some(error) = status.kubernetes.as_ref().and_then(|k| k.error.as_ref()) {
        out.push_str(&format!("kubernetes: {error}\n"));
    }
    for object in status.kubernetes.iter().flat_map(|k| &k.unreconciled) {
        out.push_str(&format!(
            "kubernetes: KEDA has not set up ScaledObject {object} (no HPA; see its Events)\n"
        ));
    }
    if let Some(config) = &status.config {
        if let Some(error) = config
            .last_reload
            .as_ref()
            .and_then(|last| last.error.as_ref())
        {
            out.push_str(&format!("config: last reload refused: {error}\n"));
        }
        if !config.restart_needed.is_empty() {
            let keys = config.restart_needed.join(", ");
            out.push_str(&format!("config: changed, and take a restart: {keys}\n"));
        }
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
            polling_interval_seconds: 30.0,
            polling_interval_source: "default".into(),
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
            held_for_keda: None,
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
                    engine: Some(EngineStatus {
                        target: Some("Deployment worker (apps/v1)".into()),
                        count_source: Some("cluster".into()),
                        spec_replicas: Some(10),
                        status_replicas: Some(10),
                        count_age_seconds: Some(4.0),
                        count_error: None,
                        settings: [
                            ("cooldownPeriod", 300, "default"),
                            ("maxReplicaCount", 20, "metadata"),
                            ("minReplicaCount", 0, "scaledObject"),
                        ]
                        .into_iter()
                        .map(|(key, value, source)| {
                            (
                                key.to_string(),
                                Setting {
                                    value: value.into(),
                                    source: source.into(),
                                },
                            )
                        })
                        .collect(),
                        warnings: vec!["KEDA caps the HPA at spec.maxReplicaCount 8".into()],
                    }),
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
                    engine: None,
                },
            ],
            kubernetes: None,
            config: None,
            routes: Some(RoutesStatus {
                version: 7,
                settling: false,
                declared: vec![
                    DeclaredRouteStatus {
                        name: "http/default/shop".into(),
                        protocol: "http".into(),
                        owner: Some("default/shop".into()),
                        hosts: vec!["shop.test".into(), "www.shop.test".into()],
                        path_prefix: Some("/api".into()),
                        listen_port: None,
                        upstream: "shop.default.svc.cluster.local:80".into(),
                        triggers: 1,
                        undeclared_for_seconds: None,
                    },
                    DeclaredRouteStatus {
                        name: "tcp/orders/db".into(),
                        protocol: "tcp".into(),
                        owner: Some("orders/db".into()),
                        hosts: Vec::new(),
                        path_prefix: None,
                        listen_port: Some(5432),
                        upstream: "postgres.orders.svc.cluster.local:5432".into(),
                        triggers: 0,
                        undeclared_for_seconds: Some(41.7),
                    },
                ],
            }),
        };
        let table = table(&status);
        let expected = "\
SCALEDOBJECT    MODE         ACTIVE  CURRENT  DESIRED  REASON        WAIT           TRIGGERS
default/worker  engine       yes     10       10       Cooldown      cooldown 212s  redis-jobs=0 (3s ago)
orders/mailer   passthrough  -       -        -        TriggerError  -              redis-mail=ERROR x4: cannot connect: refused
default/worker: cooldownPeriod=300 (default), maxReplicaCount=20 (metadata), minReplicaCount=0 (scaledObject)
default/worker: warning: KEDA caps the HPA at spec.maxReplicaCount 8
route http/default/shop (default/shop, 1 trigger): hosts shop.test,www.shop.test prefix /api -> shop.default.svc.cluster.local:80
route tcp/orders/db (orders/db, saved, not declared again for 42s): port 5432 -> postgres.orders.svc.cluster.local:5432
";
        assert_eq!(table, expected, "\n{table}");
    }
}
