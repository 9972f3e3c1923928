//! Table and property tests of `decide` on synthetic instants.

use proptest::prelude::*;

use super::hpa::{Policy, PolicyType, SelectPolicy};
use super::*;

const T0: Millis = 1_700_000_000_000;

fn s(seconds: u64) -> Millis {
    T0 + seconds * 1000
}

fn reading(trigger: &str, value: f64, target: f64, at: Millis) -> Reading {
    Reading {
        trigger: trigger.into(),
        target,
        activation_target: 0.0,
        value: Observation::Value(value),
        activity: None,
        at,
    }
}

fn failure(trigger: &str, target: f64, at: Millis) -> Reading {
    Reading {
        trigger: trigger.into(),
        target,
        activation_target: 0.0,
        value: Observation::Error("connection refused".into()),
        activity: None,
        at,
    }
}

/// Feeds one trigger's value every 30 s from `from` to `to` (inclusive);
/// returns the replica counts decided.
fn run(
    state: &mut State,
    rules: &Rules,
    values: impl Fn(u64) -> f64,
    from: u64,
    to: u64,
) -> Vec<(u64, u32, Reason)> {
    (from..=to)
        .step_by(30)
        .map(|t| {
            let decision = decide(
                state,
                rules,
                &[reading("queue", values(t), 5.0, s(t))],
                s(t),
            );
            (t, decision.replicas, decision.reason)
        })
        .collect()
}

#[test]
fn aca_worked_example_steps_up_one_four_eight_ten_and_scales_to_zero_after_the_cooldown() {
    let rules = Rules {
        max_replica_count: 20,
        ..Rules::default()
    };
    let mut state = State::default();
    let up = run(&mut state, &rules, |_| 50.0, 0, 120);
    let counts: Vec<u32> = up.iter().map(|(_, replicas, _)| *replicas).collect();
    assert_eq!(counts, [1, 4, 8, 10, 10]);
    assert_eq!(up[0].2, Reason::Activated);
    assert_eq!(up[1].2, Reason::ScaleUpLimit);
    assert_eq!(up[3].2, Reason::DesiredWithinRange);

    // Empty from t=150: held for the 300 s cooldown, then zero.
    let down = run(&mut state, &rules, |_| 0.0, 150, 480);
    for (t, replicas, reason) in &down {
        if *t < 420 {
            assert_eq!(*replicas, 10, "t={t}");
            assert_eq!(*reason, Reason::Cooldown, "t={t}");
        } else {
            assert_eq!(*replicas, 0, "t={t}");
            assert_eq!(*reason, Reason::Inactive, "t={t}");
        }
    }
    assert!(!state.active);
}

#[test]
fn activation_is_strictly_above_the_threshold() {
    let rules = Rules::default();
    let mut state = State::default();
    let at_threshold = Reading {
        activation_target: 3.0,
        ..reading("queue", 3.0, 5.0, s(0))
    };
    let decision = decide(
        &mut state,
        &rules,
        std::slice::from_ref(&at_threshold),
        s(0),
    );
    assert!(!decision.active);
    assert_eq!(decision.replicas, 0);
    let above = Reading {
        value: Observation::Value(3.5),
        at: s(30),
        ..at_threshold
    };
    let decision = decide(&mut state, &rules, &[above], s(30));
    assert!(decision.active);
    assert_eq!(decision.replicas, 1);
}

#[test]
fn activity_during_the_cooldown_restarts_it() {
    let rules = Rules {
        cooldown_period: 100,
        scale_down_stabilization_window_seconds: 0,
        ..Rules::default()
    };
    let mut state = State::default();
    decide(&mut state, &rules, &[reading("q", 1.0, 5.0, s(0))], s(0));
    let quiet = decide(&mut state, &rules, &[reading("q", 0.0, 5.0, s(60))], s(60));
    assert!(quiet.active);
    assert_eq!(quiet.reason, Reason::Cooldown);
    assert_eq!(quiet.cooldown_ends, Some(s(100)));
    assert_eq!(
        quiet.next_evaluation,
        s(90),
        "the next poll comes before the cooldown ends"
    );
    decide(&mut state, &rules, &[reading("q", 2.0, 5.0, s(90))], s(90));
    let later = decide(
        &mut state,
        &rules,
        &[reading("q", 0.0, 5.0, s(150))],
        s(150),
    );
    assert_eq!(later.replicas, 1, "cooldown restarted at 90 s");
    assert_eq!(later.cooldown_ends, Some(s(190)));
    let end = decide(
        &mut state,
        &rules,
        &[reading("q", 0.0, 5.0, s(190))],
        s(190),
    );
    assert_eq!(
        (end.replicas, end.reason, end.active),
        (0, Reason::Inactive, false)
    );
}

#[test]
fn min_replica_count_is_never_undercut_and_out_of_range_counts_snap() {
    let rules = Rules {
        min_replica_count: 2,
        max_replica_count: 6,
        ..Rules::default()
    };
    let mut state = State::default();
    let first = decide(&mut state, &rules, &[reading("q", 0.0, 5.0, s(0))], s(0));
    assert_eq!((first.replicas, first.reason), (2, Reason::TooFewReplicas));
    let quiet = run(&mut state, &rules, |_| 0.0, 30, 900);
    assert!(
        quiet.iter().all(|(_, replicas, _)| *replicas == 2),
        "{quiet:?}"
    );

    state.current_replicas = 40;
    let snapped = decide(
        &mut state,
        &rules,
        &[reading("q", 100.0, 5.0, s(930))],
        s(930),
    );
    assert_eq!(
        (snapped.replicas, snapped.reason),
        (6, Reason::TooManyReplicas)
    );
}

#[test]
fn within_tolerance_nothing_changes() {
    let rules = Rules {
        max_replica_count: 20,
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 10,
        recommendations: Some(vec![]),
        ..Default::default()
    };
    // 52 / (5 × 10) = 1.04: within 10 %.
    let decision = decide(&mut state, &rules, &[reading("q", 52.0, 5.0, s(0))], s(0));
    assert_eq!(
        (decision.replicas, decision.reason),
        (10, Reason::WithinTolerance)
    );
    assert_eq!(decision.raw_desired, Some(11));
    // 56 / 50 = 1.12: outside.
    let decision = decide(&mut state, &rules, &[reading("q", 56.0, 5.0, s(30))], s(30));
    assert_eq!(decision.replicas, 12, "{decision:?}");
}

#[test]
fn the_largest_trigger_wins() {
    let rules = Rules {
        max_replica_count: 50,
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 4,
        ..Default::default()
    };
    let decision = decide(
        &mut state,
        &rules,
        &[reading("a", 10.0, 5.0, s(0)), reading("b", 35.0, 5.0, s(0))],
        s(0),
    );
    assert_eq!(decision.raw_desired, Some(7));
    assert_eq!(decision.replicas, 7);
}

#[test]
fn a_failing_trigger_blocks_scale_down_and_deactivation_but_not_scale_up() {
    let rules = Rules {
        max_replica_count: 30,
        scale_down_stabilization_window_seconds: 0,
        cooldown_period: 60,
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 8,
        active: true,
        last_active: Some(s(0)),
        ..Default::default()
    };
    let held = decide(
        &mut state,
        &rules,
        &[reading("a", 10.0, 5.0, s(0)), failure("b", 5.0, s(0))],
        s(0),
    );
    assert_eq!((held.replicas, held.reason), (8, Reason::TriggerError));
    let up = decide(
        &mut state,
        &rules,
        &[reading("a", 60.0, 5.0, s(30)), failure("b", 5.0, s(30))],
        s(30),
    );
    assert_eq!(up.replicas, 12);
    // Long after the cooldown, a failing trigger still keeps it active.
    let mut t = 60;
    while t < 600 {
        let decision = decide(
            &mut state,
            &rules,
            &[reading("a", 0.0, 5.0, s(t)), failure("b", 5.0, s(t))],
            s(t),
        );
        assert!(decision.active, "t={t}");
        assert_eq!(decision.replicas, 12, "t={t}");
        t += 30;
    }
    // At zero, a failing trigger does not wake anything.
    let mut idle = State::default();
    let decision = decide(&mut idle, &rules, &[failure("b", 5.0, s(0))], s(0));
    assert_eq!(
        (decision.replicas, decision.active, decision.reason),
        (0, false, Reason::TriggerError)
    );
}

#[test]
fn fallback_stands_in_for_the_failing_trigger_after_more_than_threshold_failures() {
    let rules = Rules {
        fallback: Some(Fallback {
            failure_threshold: 3,
            replicas: 6,
        }),
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 2,
        active: true,
        ..Default::default()
    };
    for t in [0, 0, 30, 30, 60, 60] {
        let decision = decide(&mut state, &rules, &[failure("q", 5.0, s(t))], s(t + 1));
        assert_eq!(
            decision.reason,
            Reason::TriggerError,
            "three distinct failures are not more than three"
        );
        assert_eq!(decision.replicas, 2);
    }
    // The fourth: the fallback count stands in for the trigger, through
    // the usual step-up limit (2 → 4 → 6).
    let decision = decide(&mut state, &rules, &[failure("q", 5.0, s(90))], s(90));
    assert_eq!(
        (decision.replicas, decision.reason),
        (4, Reason::ScaleUpLimit)
    );
    assert_eq!(state.triggers["q"].consecutive_failures, 4);
    let decision = decide(&mut state, &rules, &[failure("q", 5.0, s(120))], s(120));
    assert_eq!(
        (decision.replicas, decision.reason, decision.active),
        (6, Reason::Fallback, true)
    );

    // A healthy trigger asking for more wins over the fallback.
    let decision = decide(
        &mut state,
        &rules,
        &[
            failure("q", 5.0, s(150)),
            reading("other", 50.0, 5.0, s(150)),
        ],
        s(150),
    );
    assert_eq!(decision.replicas, 10);
    let recovered = decide(
        &mut state,
        &rules,
        &[reading("q", 40.0, 5.0, s(180))],
        s(180),
    );
    assert_ne!(recovered.reason, Reason::Fallback);
    assert_eq!(state.triggers["q"].consecutive_failures, 0);

    // At zero, a ScaledObject whose trigger keeps failing gets the fallback.
    let mut idle = State::default();
    for t in [0, 30, 60] {
        assert_eq!(
            decide(&mut idle, &rules, &[failure("q", 5.0, s(t))], s(t)).replicas,
            0
        );
    }
    let woken = decide(&mut idle, &rules, &[failure("q", 5.0, s(90))], s(90));
    assert_eq!((woken.replicas, woken.reason), (6, Reason::Fallback));
}

#[test]
fn behavior_policies_rate_limit_scale_down() {
    let rules = Rules {
        max_replica_count: 20,
        behavior: Some(Behavior {
            scale_up: None,
            scale_down: Some(BehaviorRules {
                stabilization_window_seconds: Some(0),
                policies: Some(vec![Policy {
                    kind: PolicyType::Pods,
                    value: 2,
                    period_seconds: 60,
                }]),
                ..Default::default()
            }),
        }),
        min_replica_count: 1,
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 10,
        ..Default::default()
    };
    let steps = run(&mut state, &rules, |_| 5.0, 0, 240);
    let counts: Vec<u32> = steps.iter().map(|(_, replicas, _)| *replicas).collect();
    // Two pods per 60 s: 8 at 0, held at 30, 6 at 60 (the event at 0 is
    // exactly one period old, so outside), ...
    assert_eq!(counts, [8, 8, 6, 6, 4, 4, 2, 2, 1]);
    assert_eq!(steps[1].2, Reason::ScaleDownLimit);
    assert!(!state.scale_down_events.is_empty());

    let disabled = Rules {
        behavior: Some(Behavior {
            scale_up: None,
            scale_down: Some(BehaviorRules {
                select_policy: Some(SelectPolicy::Disabled),
                stabilization_window_seconds: Some(0),
                ..Default::default()
            }),
        }),
        ..rules
    };
    let mut state = State {
        current_replicas: 10,
        ..Default::default()
    };
    let steps = run(&mut state, &disabled, |_| 5.0, 0, 120);
    assert!(
        steps.iter().all(|(_, replicas, _)| *replicas == 10),
        "{steps:?}"
    );
}

#[test]
fn legacy_path_records_no_scale_events() {
    let rules = Rules::default();
    let mut state = State::default();
    run(
        &mut state,
        &rules,
        |t| if t < 200 { 40.0 } else { 0.0 },
        0,
        900,
    );
    assert!(state.scale_up_events.is_empty());
    assert!(state.scale_down_events.is_empty());
}

#[test]
fn scale_up_stabilization_holds_increases_in_the_legacy_path() {
    let rules = Rules {
        scale_up_stabilization_window_seconds: 120,
        max_replica_count: 50,
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 4,
        recommendations: Some(vec![]),
        ..Default::default()
    };
    let first = decide(&mut state, &rules, &[reading("q", 20.0, 5.0, s(0))], s(0));
    assert_eq!(first.replicas, 4);
    let burst = decide(
        &mut state,
        &rules,
        &[reading("q", 100.0, 5.0, s(30))],
        s(30),
    );
    assert_eq!(
        (burst.replicas, burst.reason),
        (4, Reason::ScaleUpStabilized)
    );
    assert_eq!(
        burst.stabilization_ends,
        Some(s(120)),
        "the 4 recommended at 0 s holds for 120 s"
    );
    // The 4 recommended at 0 s holds until it is 120 s old; then the
    // step-up rule applies: 8, 16, 20.
    let steps = run(&mut state, &rules, |_| 100.0, 60, 180);
    let counts: Vec<u32> = steps.iter().map(|(_, replicas, _)| *replicas).collect();
    assert_eq!(counts, [4, 4, 8, 16, 20], "{steps:?}");
}

#[test]
fn state_round_trips_through_json() {
    let rules = Rules {
        behavior: Some(Behavior::default()),
        ..Rules::default()
    };
    let mut state = State::default();
    run(&mut state, &rules, |t| (t % 90) as f64, 0, 600);
    let json = serde_json::to_string(&state).unwrap();
    let back: State = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);
    let rules_json = serde_json::to_string(&rules).unwrap();
    assert_eq!(serde_json::from_str::<Rules>(&rules_json).unwrap(), rules);
}

fn arbitrary_rules() -> impl Strategy<Value = Rules> {
    (
        0u32..4,
        1u32..40,
        0u64..600,
        0u32..400,
        0u32..120,
        any::<bool>(),
    )
        .prop_map(
            |(min, span, cooldown, down_window, up_window, behavior)| Rules {
                min_replica_count: min,
                max_replica_count: min.max(1) + span,
                cooldown_period: cooldown,
                scale_down_stabilization_window_seconds: down_window,
                scale_up_stabilization_window_seconds: up_window,
                behavior: behavior.then(Behavior::default),
                ..Rules::default()
            },
        )
}

/// Per step: seconds since the last step, and each of two triggers'
/// value (None = the trigger failed).
fn arbitrary_trace() -> impl Strategy<Value = Vec<(u64, Option<f64>, Option<f64>)>> {
    proptest::collection::vec(
        (
            1u64..120,
            proptest::option::weighted(0.9, 0.0..500.0f64),
            proptest::option::weighted(0.9, 0.0..500.0f64),
        ),
        1..80,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn invariants_hold_on_any_trace(rules in arbitrary_rules(), trace in arbitrary_trace()) {
        let mut state = State::default();
        let mut t = 0;
        let mut history: Vec<(Millis, u32)> = Vec::new();
        for (gap, a, b) in trace {
            t += gap;
            let now = s(t);
            let readings: Vec<Reading> = [("a", a), ("b", b)]
                .into_iter()
                .map(|(name, value)| match value {
                    Some(value) => reading(name, value, 10.0, now),
                    None => failure(name, 10.0, now),
                })
                .collect();
            let before = state.current_replicas;
            let faulting = readings.iter().any(|r| r.value.is_error());
            let decision = decide(&mut state, &rules, &readings, now);
            let after = decision.replicas;

            // Replicas stay within [min, max] (zero only when min is zero).
            prop_assert!(after <= rules.max_replica_count);
            prop_assert!(after >= rules.min_replica_count);
            // A step up never exceeds the cap.
            if after > before {
                let cap = if before == 0 {
                    rules.min_replica_count.max(1)
                } else if rules.behavior.is_none() {
                    (2 * before).max(4)
                } else {
                    // Default behavior: +4 pods or +100 % per 15 s, from
                    // the count at the start of those 15 s.
                    let period_start = now - 15_000;
                    let in_effect_at_start = history.iter().rev().find(|(at, _)| *at <= period_start);
                    let start = history
                        .iter()
                        .filter(|(at, _)| *at > period_start)
                        .chain(in_effect_at_start)
                        .map(|(_, replicas)| *replicas)
                        .chain([before])
                        .max()
                        .unwrap_or(before);
                    (start + 4).max(2 * start)
                };
                prop_assert!(after <= cap.max(rules.min_replica_count), "{before} -> {after} over cap {cap}");
            }
            // A faulting trigger never lowers replicas.
            if faulting {
                prop_assert!(after >= before, "{before} -> {after} with a failing trigger");
            }
            // No scale-down to a non-zero count inside the scale-down
            // window: every recommendation younger than the window is
            // at most the new count (or above max).
            if after < before && after > 0 && rules.behavior.is_none() && before <= rules.max_replica_count {
                let window = u64::from(rules.scale_down_stabilization_window_seconds) * 1000;
                for recommendation in state.recommendations.iter().flatten() {
                    if now - recommendation.at < window {
                        let bound = (recommendation.replicas as u32).min(rules.max_replica_count);
                        prop_assert!(bound <= after.max(rules.min_replica_count.max(1)),
                            "scaled down to {after} while {} was recommended {} ms ago", recommendation.replicas, now - recommendation.at);
                    }
                }
            }
            history.push((now, after));
            // Zero only after the cooldown.
            if after == 0 && before > 0 {
                let quiet_since = state.last_active.unwrap_or(0);
                prop_assert!(now >= quiet_since + rules.cooldown_period * 1000);
            }
        }
    }
}
