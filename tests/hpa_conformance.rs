//! The Kubernetes HPA's own unit-test vectors (`tests/data/hpa-vectors.json`
//! and `hpa-external-vectors.json`, transcribed from
//! `pkg/controller/podautoscaler/*_test.go`) run against hoist's engine.
//!
//! Vectors that do not apply, and why:
//! - `GetExternalMetricReplicas` (target type `Value`, 9 vectors): KEDA's
//!   external triggers use `AverageValue` targets, the only kind hoist's
//!   engine computes (`hpa::average_value_proposal`, 11 vectors run).
//! - Reconcile vectors at zero replicas (`spec_replicas == 0`:
//!   reconcile_16, 25, 26, 27, 29, 30, 31, 32, 33, 34): with KEDA the HPA
//!   never acts at zero; scaling from and to zero is KEDA's activation,
//!   which the engine implements instead (0 → max(1, minReplicaCount) on
//!   activity, see the engine's table tests).
//! - `storeScaleEvent` vectors without a behavior (2 of 8): they assert
//!   that nothing is stored; the engine's `legacy_path_records_no_scale_events`
//!   test covers that through `decide`.

use hoist::engine::hpa::{
    self, Held, Limit, Policy, PolicyType, RateArgs, Recommendation, ScaleEvent, ScalingRules,
    SelectPolicy,
};
use hoist::engine::{HpaArgs, HpaOutcome, State, hpa_reconcile};
use serde_json::{Value, json};

// The closed loop's model of the HPA controller (tests/closed_loop.rs) is
// held to the same vectors: the loop runs against the controller
// Kubernetes ships, not a guess of it.
#[path = "support/hpa_model.rs"]
mod hpa_model;

const NOW: u64 = 1_700_000_000_000;

fn vectors(file: &str) -> Vec<Value> {
    let text = match file {
        "hpa" => include_str!("data/hpa-vectors.json"),
        _ => include_str!("data/hpa-external-vectors.json"),
    };
    let all: Value = serde_json::from_str(text).unwrap();
    all["vectors"].as_array().unwrap().clone()
}

fn int(value: &Value) -> i64 {
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not an integer: {value}"))
}

fn num(value: &Value) -> f64 {
    value
        .as_f64()
        .filter(|_| !value.is_string())
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

fn at(age: &Value) -> u64 {
    NOW - (num(age) * 1000.0) as u64
}

fn rules(value: &Value, default_window: u32) -> ScalingRules {
    let policies = value["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Policy {
            kind: match p["type"].as_str().unwrap() {
                "Pods" => PolicyType::Pods,
                _ => PolicyType::Percent,
            },
            value: int(&p["value"]) as i32,
            period_seconds: int(&p["period_s"]) as u32,
        })
        .collect();
    ScalingRules {
        stabilization_window_seconds: value["stabilization_window_s"]
            .as_u64()
            .map_or(default_window, |w| w as u32),
        select_policy: match value["select_policy"].as_str().unwrap() {
            "Min" => SelectPolicy::Min,
            "Disabled" => SelectPolicy::Disabled,
            _ => SelectPolicy::Max,
        },
        policies,
        tolerance: value["tolerance"].as_f64().unwrap_or(0.1),
    }
}

fn default_up() -> ScalingRules {
    ScalingRules {
        stabilization_window_seconds: 0,
        select_policy: SelectPolicy::Max,
        policies: vec![
            Policy {
                kind: PolicyType::Pods,
                value: 4,
                period_seconds: 15,
            },
            Policy {
                kind: PolicyType::Percent,
                value: 100,
                period_seconds: 15,
            },
        ],
        tolerance: 0.1,
    }
}

fn default_down(window: u32) -> ScalingRules {
    ScalingRules {
        stabilization_window_seconds: window,
        select_policy: SelectPolicy::Max,
        policies: vec![Policy {
            kind: PolicyType::Percent,
            value: 100,
            period_seconds: 15,
        }],
        tolerance: 0.1,
    }
}

fn events(value: &Value) -> Vec<ScaleEvent> {
    value
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| ScaleEvent {
                    change: int(&e["replica_change"]) as i32,
                    at: at(&e["age_s"]),
                    outdated: e["outdated"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn recommendations(value: &Value) -> Vec<Recommendation> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Recommendation {
            replicas: int(&r["replicas"]) as i32,
            at: at(&r["age_s"]),
        })
        .collect()
}

/// Each metric's proposal (`None`: the metric is invalid).
fn proposals(inputs: &Value) -> Vec<Option<i32>> {
    inputs["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["proposal"].as_i64().map(|p| p as i32))
        .collect()
}

fn replicas_of(log: &[Recommendation]) -> Vec<i64> {
    log.iter().map(|r| r.replicas as i64).collect()
}

fn limit_name(limit: Limit) -> &'static str {
    match limit {
        Limit::DesiredWithinRange => "DesiredWithinRange",
        Limit::ScaleUpLimit => "ScaleUpLimit",
        Limit::ScaleDownLimit => "ScaleDownLimit",
        Limit::TooFewReplicas => "TooFewReplicas",
        Limit::TooManyReplicas => "TooManyReplicas",
    }
}

fn of(function: &str) -> Vec<Value> {
    let matching: Vec<Value> = vectors("hpa")
        .into_iter()
        .filter(|v| v["function"].as_str() == Some(function))
        .collect();
    assert!(!matching.is_empty(), "no `{function}` vectors");
    matching
}

#[test]
fn convert_desired_replicas_with_rules() {
    for v in of("convertDesiredReplicasWithRules") {
        let i = &v["inputs"];
        // horizontal_test.go sets scaleUpLimitFactor = 8; the engine runs
        // with ACA's 2 (`hoist::engine::SCALE_UP_FACTOR`).
        let (replicas, limit) = hpa::convert_with_rules(
            int(&i["current_replicas"]) as i32,
            int(&i["desired_replicas"]) as i32,
            int(&i["min_replicas"]) as i32,
            int(&i["max_replicas"]) as i32,
            8.0,
        );
        assert_eq!(
            replicas as i64,
            int(&v["expected"]["replicas"]),
            "{}",
            v["id"]
        );
        assert_eq!(limit_name(limit), v["expected"]["reason"], "{}", v["id"]);
    }
    assert_eq!(
        hpa::legacy_scale_up_limit(3, hoist::engine::SCALE_UP_FACTOR),
        6
    );
}

#[test]
fn scale_limits_with_scaling_rules() {
    for (function, up) in [
        ("calculateScaleUpLimitWithScalingRules", true),
        ("calculateScaleDownLimitWithBehaviors", false),
    ] {
        for v in of(function) {
            let i = &v["inputs"];
            let r = rules(&i["rules"], 0);
            let (ups, downs) = (
                events(&i["scale_up_events"]),
                events(&i["scale_down_events"]),
            );
            let current = int(&i["current_replicas"]) as i32;
            let limit = if up {
                hpa::scale_up_limit(current, &ups, &downs, &r, NOW)
            } else {
                hpa::scale_down_limit(current, &ups, &downs, &r, NOW)
            };
            assert_eq!(limit as i64, int(&v["expected"]["limit"]), "{}", v["id"]);
        }
    }
}

#[test]
fn stabilize_recommendation_legacy() {
    for v in of("stabilizeRecommendation") {
        let i = &v["inputs"];
        let mut log = recommendations(&i["recommendations"]);
        let stabilized = hpa::stabilize_legacy(
            &mut log,
            int(&i["prenormalized_desired_replicas"]) as i32,
            int(&i["downscale_stabilization_window_s"]) as u32,
            NOW,
        );
        let e = &v["expected"];
        assert_eq!(
            stabilized as i64,
            int(&e["stabilized_replicas"]),
            "{}",
            v["id"]
        );
        assert_eq!(
            log.len() as i64,
            int(&e["recommendation_log_length_after"]),
            "{}",
            v["id"]
        );
        let after: Vec<i64> = e["recommendations_after"]
            .as_array()
            .unwrap()
            .iter()
            .map(int)
            .collect();
        assert_eq!(replicas_of(&log), after, "{}", v["id"]);
    }
}

#[test]
fn stabilize_recommendation_with_behaviors() {
    for v in of("stabilizeRecommendationWithBehaviors") {
        let i = &v["inputs"];
        let mut log = recommendations(&i["recommendations"]);
        let desired = int(&i["desired_replicas"]) as i32;
        let (stabilized, held) = hpa::stabilize_with_behaviors(
            &mut log,
            int(&i["current_replicas"]) as i32,
            desired,
            int(&i["scale_up_stabilization_window_s"]) as u32,
            int(&i["scale_down_stabilization_window_s"]) as u32,
            NOW,
        );
        let e = &v["expected"];
        assert_eq!(stabilized as i64, int(&e["replicas"]), "{}", v["id"]);
        let after = e
            .get("recommendations_after")
            .or(e.get("recommendations_after_derived"))
            .unwrap();
        let after: Vec<i64> = after.as_array().unwrap().iter().map(int).collect();
        assert_eq!(replicas_of(&log), after, "{}", v["id"]);
        if let Some(reason) = e["reason_if_condition_set"].as_str() {
            assert_ne!(stabilized, desired, "{}", v["id"]);
            let name = match held {
                Held::Up => "ScaleUpStabilized",
                Held::Down => "ScaleDownStabilized",
            };
            assert_eq!(name, reason, "{}", v["id"]);
        }
    }
}

#[test]
fn convert_desired_replicas_with_behavior_rate() {
    for v in of("convertDesiredReplicasWithBehaviorRate") {
        let i = &v["inputs"];
        let up = rules(&i["scale_up_rules"], 0);
        let down = rules(&i["scale_down_rules"], 300);
        let (ups, downs) = (
            events(&i["scale_up_events"]),
            events(&i["scale_down_events"]),
        );
        let (replicas, limit) = hpa::convert_with_behavior_rate(
            &RateArgs {
                current: int(&i["current_replicas"]) as i32,
                desired: int(&i["desired_replicas"]) as i32,
                min: int(&i["min_replicas"]) as i32,
                max: int(&i["max_replicas"]) as i32,
                scale_up: &up,
                scale_down: &down,
                up_events: &ups,
                down_events: &downs,
            },
            NOW,
        );
        assert_eq!(
            replicas as i64,
            int(&v["expected"]["replicas"]),
            "{}",
            v["id"]
        );
        assert_eq!(limit_name(limit), v["expected"]["reason"], "{}", v["id"]);
    }
}

#[test]
fn replicas_change_per_period_then_store_scale_event() {
    let mut stored = 0;
    for v in of("getReplicasChangePerPeriod(60) then storeScaleEvent") {
        let i = &v["inputs"];
        let mut log = events(&i["previous_events"]);
        let e = &v["expected"];
        assert_eq!(
            hpa::replicas_change_in_period(60, &log, NOW) as i64,
            int(&e["replicas_change_in_last_60s_before_store"]),
            "{}",
            v["id"]
        );
        if !i["behavior_present"].as_bool().unwrap() {
            continue; // see the module comment
        }
        let r = rules(&i["rules"], 0);
        hpa::store_scale_event(&mut log, &r, int(&i["replica_change_to_store"]) as i32, NOW);
        let after: Vec<(i64, bool)> = log.iter().map(|e| (e.change as i64, e.outdated)).collect();
        let expected: Vec<(i64, bool)> = e["events_after"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (int(&e["replica_change"]), e["outdated"].as_bool().unwrap()))
            .collect();
        assert_eq!(after, expected, "{}", v["id"]);
        stored += 1;
    }
    assert_eq!(stored, 6);
}

#[test]
fn reconcile_end_to_end() {
    let mut ran = 0;
    for v in of("reconcileAutoscaler (end to end)") {
        let i = &v["inputs"];
        if int(&i["spec_replicas"]) == 0 {
            continue; // see the module comment
        }
        let behavior = &i["behavior"];
        let (up, down) = if behavior.is_null() {
            (default_up(), default_down(300))
        } else {
            let direction = |value: &Value, fallback: ScalingRules, window: u32| {
                if value.is_string() || value.get("rest").is_some() {
                    ScalingRules {
                        tolerance: value["tolerance"].as_f64().unwrap_or(0.1),
                        ..fallback
                    }
                } else {
                    rules(value, window)
                }
            };
            (
                direction(&behavior["scale_up"], default_up(), 0),
                direction(&behavior["scale_down"], default_down(300), 300),
            )
        };
        let mut state = State {
            recommendations: i["recommendations"]
                .as_array()
                .map(|_| recommendations(&i["recommendations"])),
            ..Default::default()
        };
        let proposals = proposals(i);
        let current = int(&i["spec_replicas"]) as i32;
        let args = HpaArgs {
            current,
            min: int(&i["min_replicas"]) as i32,
            max: int(&i["max_replicas"]) as i32,
            behavior: !behavior.is_null(),
            scale_up: &up,
            scale_down: &down,
            legacy_factor: hoist::engine::SCALE_UP_FACTOR,
            steps_seen_applied: false,
        };
        let outcome = hpa_reconcile(&mut state, &args, &proposals, NOW);
        let e = &v["expected"];
        let expected = int(e
            .get("expected_with_production_factor_2")
            .unwrap_or(&e["replicas"]));
        let replicas = match outcome {
            HpaOutcome::Snapped { replicas, .. } | HpaOutcome::Scaled { replicas, .. } => replicas,
            HpaOutcome::Held => current,
        };
        assert_eq!(replicas as i64, expected, "{}: {}", v["id"], v["case"]);
        assert_eq!(
            replicas != current,
            e["scale_updated"].as_bool().unwrap(),
            "{}",
            v["id"]
        );
        // `storeScaleEvent` follows every rescale, and keeps events only
        // for an HPA with a behavior.
        let changes = |events: &[ScaleEvent]| events.iter().map(|e| e.change).collect::<Vec<_>>();
        let step = replicas - current;
        let (ups, downs) = match (behavior.is_null(), step) {
            (false, step) if step > 0 => (vec![step], vec![]),
            (false, step) if step < 0 => (vec![], vec![-step]),
            _ => (vec![], vec![]),
        };
        assert_eq!(changes(&state.scale_up_events), ups, "{}", v["id"]);
        assert_eq!(changes(&state.scale_down_events), downs, "{}", v["id"]);
        for condition in e["conditions"].as_array().into_iter().flatten() {
            let reason = condition["reason"].as_str().unwrap();
            match (condition["type"].as_str().unwrap(), outcome) {
                ("ScalingLimited", HpaOutcome::Scaled { limit, .. }) => {
                    assert_eq!(limit_name(limit), reason, "{}", v["id"]);
                }
                (
                    "AbleToScale",
                    HpaOutcome::Scaled {
                        desired,
                        stabilized,
                        ..
                    },
                ) if reason == "ScaleDownStabilized" => {
                    assert!(stabilized > desired, "{}", v["id"]);
                }
                ("ScalingActive", HpaOutcome::Held) => {
                    assert_ne!(reason, "ValidMetricFound", "{}", v["id"])
                }
                _ => {}
            }
        }
        ran += 1;
    }
    assert_eq!(ran, 24);
}

#[test]
fn external_average_value_proposals() {
    let mut ran = 0;
    for v in vectors("external") {
        if !v["function"].as_str().unwrap().contains("AverageValue") {
            continue; // see the module comment
        }
        let i = &v["inputs"];
        // The controller sums the samples, capped at MaxInt64.
        let usage = i["metric_values_milli"]
            .as_array()
            .unwrap()
            .iter()
            .map(int)
            .fold(0i64, i64::saturating_add);
        let proposal = hpa::average_value_proposal(
            usage,
            int(&i["target_average_value_milli"]),
            int(&i["status_replicas"]) as i32,
            num(&i["tolerance"]["scale_down"]),
            num(&i["tolerance"]["scale_up"]),
        );
        assert_eq!(
            proposal as i64,
            int(&v["expected"]["replicas"]),
            "{}",
            v["id"]
        );
        // The closed loop's HPA model computes the same.
        let tolerances = (
            num(&i["tolerance"]["scale_down"]),
            num(&i["tolerance"]["scale_up"]),
        );
        let modelled = hpa_model::per_pod_proposal(
            usage,
            int(&i["target_average_value_milli"]),
            int(&i["status_replicas"]) as i32,
            tolerances,
        );
        assert_eq!(modelled, proposal, "model: {}", v["id"]);
        ran += 1;
    }
    assert_eq!(ran, 11);
}

/// The vectors' behavior (snake_case, `"defaults"`) as Kubernetes writes it.
fn vector_behavior(value: &Value) -> Value {
    let direction = |rules: &Value| -> Value {
        if rules.is_string() {
            return json!({});
        }
        let mut out = json!({});
        if let Some(window) = rules.get("stabilization_window_s") {
            out["stabilizationWindowSeconds"] = window.clone();
        }
        if let Some(select) = rules.get("select_policy") {
            out["selectPolicy"] = select.clone();
        }
        if let Some(tolerance) = rules.get("tolerance") {
            out["tolerance"] = tolerance.clone();
        }
        if let Some(policies) = rules.get("policies").and_then(Value::as_array) {
            out["policies"] = policies
                .iter()
                .map(|p| json!({"type": p["type"], "value": p["value"], "periodSeconds": p["period_s"]}))
                .collect();
        }
        out
    };
    json!({"scaleUp": direction(&value["scale_up"]), "scaleDown": direction(&value["scale_down"])})
}

#[test]
fn the_hpa_model_passes_the_hpas_reconcile_vectors() {
    let mut ran = 0;
    for v in of("reconcileAutoscaler (end to end)") {
        let i = &v["inputs"];
        // KEDA's HPAs have `minReplicas` ≥ 1 and no `HPAScaleToZero`: zero
        // is KEDA's. The model is the HPA KEDA creates (9 vectors skipped).
        if int(&i["min_replicas"]) == 0 || i["feature_gate_HPAScaleToZero"] == true {
            continue;
        }
        let spec = int(&i["spec_replicas"]) as i32;
        let behavior = &i["behavior"];
        let mut hpa = hpa_model::Hpa::new(
            int(&i["min_replicas"]) as i32,
            int(&i["max_replicas"]) as i32,
            (!behavior.is_null())
                .then(|| hpa_model::Behavior::from_json(&vector_behavior(behavior))),
        );
        if let Some(history) = i["recommendations"].as_array() {
            let history: Vec<(i32, u64)> = history
                .iter()
                .map(|r| (int(&r["replicas"]) as i32, at(&r["age_s"])))
                .collect();
            hpa.remember(&history);
        }
        let proposals = proposals(i);
        let rescaled = hpa.reconcile(NOW, spec, &proposals);
        let e = &v["expected"];
        let expected = int(e
            .get("expected_with_production_factor_2")
            .unwrap_or(&e["replicas"])) as i32;
        assert_eq!(
            rescaled.unwrap_or(spec),
            expected,
            "{}: {}",
            v["id"],
            v["case"]
        );
        assert_eq!(
            rescaled.is_some(),
            e["scale_updated"].as_bool().unwrap(),
            "{}",
            v["id"]
        );
        ran += 1;
    }
    assert_eq!(ran, 25);
}
