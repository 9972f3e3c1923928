//! `decide_observed`: the engine computing from the cluster's counts, and
//! the ScaledObject's settings filling in for unwritten metadata keys.

use super::rules::{ObjectSettings, Source, WrittenKeys};
use super::*;

const T0: Millis = 1_700_000_000_000;

fn reading(value: f64) -> Reading {
    Reading {
        trigger: "queue".into(),
        target: 5.0,
        activation_target: 0.0,
        value: Observation::Value(value),
        activity: None,
        at: T0,
    }
}

fn counts(spec_replicas: u32, status_replicas: u32) -> Option<Observed> {
    Some(Observed {
        spec_replicas,
        status_replicas,
    })
}

#[test]
fn the_current_count_is_the_clusters_not_the_last_decision() {
    let rules = Rules {
        max_replica_count: 100,
        ..Rules::default()
    };
    // The engine last decided 1, but 11 run: ACA's step doubles what runs.
    let mut state = State {
        current_replicas: 1,
        active: true,
        ..State::default()
    };
    let decision = decide_observed(&mut state, &rules, &[reading(200.0)], T0, counts(11, 11));
    assert_eq!(decision.replicas, 22);
    assert_eq!(decision.reason, Reason::ScaleUpLimit);
}

#[test]
fn the_usage_ratio_divides_by_status_replicas_as_the_hpa_does() {
    let rules = Rules {
        max_replica_count: 100,
        ..Rules::default()
    };
    // 50 over target 5: at status 10 the ratio is exactly 1, so the
    // proposal is the status count (10), not spec's 11; at status 11 it is
    // 0.91, within tolerance: 11.
    let mut state = State::default();
    let spec_11_status_10 =
        decide_observed(&mut state, &rules, &[reading(50.0)], T0, counts(11, 10));
    assert_eq!(spec_11_status_10.raw_desired, Some(10));
    let mut state = State {
        recommendations: Some(Vec::new()),
        ..State::default()
    };
    let down = decide_observed(&mut state, &rules, &[reading(50.0)], T0, counts(11, 10));
    assert_eq!(down.replicas, 10, "no higher recommendation holds it");
    let mut state = State {
        recommendations: Some(Vec::new()),
        ..State::default()
    };
    let held = decide_observed(&mut state, &rules, &[reading(50.0)], T0, counts(11, 11));
    assert_eq!(held.replicas, 11, "{held:?}");
    assert_eq!(held.reason, Reason::WithinTolerance);
}

#[test]
fn metadata_wins_then_the_scaledobject_then_the_defaults() {
    let metadata = Rules {
        max_replica_count: 20,
        ..Rules::default()
    };
    let written: WrittenKeys = ["maxReplicaCount"].into_iter().collect();
    assert!(written.contains("maxReplicaCount") && !written.contains("minReplicaCount"));
    let object = ObjectSettings {
        min_replica_count: Some(2),
        max_replica_count: Some(8),
        cooldown_period: Some(0),
        ..ObjectSettings::default()
    };
    let (rules, sources) = metadata.with_object(&written, Some(&object));
    assert_eq!(rules.max_replica_count, 20);
    assert_eq!(rules.min_replica_count, 2);
    assert_eq!(rules.cooldown_period, 0);
    assert_eq!(rules.polling_interval, 30);
    assert_eq!(sources["maxReplicaCount"], Source::Metadata);
    assert_eq!(sources["minReplicaCount"], Source::ScaledObject);
    assert_eq!(sources["pollingInterval"], Source::Default);
    let (alone, _) = metadata.with_object(&written, None);
    assert_eq!(alone, metadata);
}

/// A behavior whose scale-up allows 4 pods per minute, from the cluster's
/// count: the engine's answer with the load held high.
fn rate_limited() -> Rules {
    Rules {
        max_replica_count: 100,
        behavior: Some(rules::Behavior {
            scale_up: Some(rules::BehaviorRules {
                stabilization_window_seconds: Some(0),
                policies: Some(vec![hpa::Policy {
                    kind: hpa::PolicyType::Pods,
                    value: 4,
                    period_seconds: 60,
                }]),
                ..Default::default()
            }),
            scale_down: None,
        }),
        ..Rules::default()
    }
}

fn high_load(at: Millis) -> Reading {
    Reading {
        at,
        ..reading(500.0)
    }
}

#[test]
fn a_step_the_hpa_has_not_applied_does_not_count_against_the_next() {
    let rules = rate_limited();
    let mut state = State::default();
    let first = decide_observed(&mut state, &rules, &[high_load(T0)], T0, counts(1, 1));
    assert_eq!(first.replicas, 5);
    assert!(state.scale_up_events.is_empty(), "decided, not applied");
    // Evaluated again before the HPA's sync: the same answer, not 1.
    let again = decide_observed(
        &mut state,
        &rules,
        &[high_load(T0 + 5_000)],
        T0 + 5_000,
        counts(1, 1),
    );
    assert_eq!(again.replicas, 5);
    // The HPA applied it: now it is a step, and the policy holds the next.
    let applied = decide_observed(
        &mut state,
        &rules,
        &[high_load(T0 + 15_000)],
        T0 + 15_000,
        counts(5, 5),
    );
    assert_eq!(state.scale_up_events.len(), 1);
    assert_eq!(state.scale_up_events[0].change, 4);
    assert_eq!(applied.replicas, 5, "4 pods a minute are used up");
    let next_minute = decide_observed(
        &mut state,
        &rules,
        &[high_load(T0 + 80_000)],
        T0 + 80_000,
        counts(5, 5),
    );
    assert_eq!(next_minute.replicas, 9);
}

proptest::proptest! {
    /// However engine evaluations and HPA syncs interleave, with the load
    /// held, the engine's answer never falls.
    #[test]
    fn the_answer_never_falls_while_the_load_holds(
        steps in proptest::collection::vec((proptest::bool::ANY, 1u64..30), 1..60)
    ) {
        let rules = rate_limited();
        let mut state = State::default();
        let (mut spec, mut answer, mut now) = (1u32, 0u32, T0);
        for (engine_turn, seconds) in steps {
            now += seconds * 1000;
            if engine_turn {
                let decision = decide_observed(
                    &mut state,
                    &rules,
                    &[high_load(now)],
                    now,
                    counts(spec, spec),
                );
                proptest::prop_assert!(
                    decision.replicas >= answer,
                    "fell from {answer} to {} at +{}s with {spec} running",
                    decision.replicas,
                    (now - T0) / 1000
                );
                answer = decision.replicas;
            } else if answer > 0 {
                // The HPA's sync applies the engine's answer.
                spec = answer;
            }
        }
    }
}

#[test]
fn going_to_zero_the_running_count_is_reported_until_keda_can_poll() {
    let rules = Rules::default();
    // Active until T0, cooldown 300 s: zero is decided after it.
    let ended = T0 + 300_000 + 1;
    let fresh = || State {
        current_replicas: 30,
        active: true,
        last_active: Some(T0),
        ..State::default()
    };
    let mut state = fresh();
    let zero = decide_observed(&mut state, &rules, &[reading(0.0)], ended, counts(30, 30));
    assert_eq!((zero.replicas, zero.reason), (0, Reason::Inactive));
    assert!(!zero.active);
    // The HPA is told the 30 that run (it cannot go to zero itself; KEDA's
    // next poll does), not 0, which it would take to its minimum first.
    assert_eq!(zero.reported_replicas(), 30);
    // KEDA had time to poll since zero was first decided: 0 is reported.
    let late = decide_observed(
        &mut state,
        &rules,
        &[reading(0.0)],
        ended + HOLD_FOR_KEDA_MILLIS,
        counts(30, 30),
    );
    assert_eq!(late.reported_replicas(), 0);
    // Zero decided long after the cooldown ended (a trigger failed
    // meanwhile): the hold runs from that decision.
    let mut state = fresh();
    let delayed = decide_observed(
        &mut state,
        &rules,
        &[reading(0.0)],
        ended + 600_000,
        counts(30, 30),
    );
    assert_eq!(delayed.reported_replicas(), 30);
    // KEDA took it to zero: the next time starts afresh.
    decide_observed(
        &mut state,
        &rules,
        &[reading(0.0)],
        ended + 610_000,
        counts(0, 0),
    );
    assert_eq!(state.going_to_zero_since, None);
    // Counting from its own decisions the engine cannot know what runs.
    let mut state = fresh();
    let own = decide_observed(&mut state, &rules, &[reading(0.0)], ended, None);
    assert_eq!(own.reported_replicas(), 0);
}
