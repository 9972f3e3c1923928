//! Table and property tests of `decide` on synthetic instants.

use proptest::prelude::*;

use super::hpa::{Policy, PolicyType, Recommendation, ScaleEvent, SelectPolicy};
use super::rules::MAX_COOLDOWN_PERIOD as MAX_COOLDOWN;
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
fn aca_worked_example_steps_up_one_four_eight_ten_and_scales_to_zero_once_the_cooldown_is_past() {
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

    // Empty from t=150: held for the 300 s cooldown from the last active
    // reading (120 s); at 420 s it has not yet passed, so zero at 450 s.
    let down = run(&mut state, &rules, |_| 0.0, 150, 480);
    for (t, replicas, reason) in &down {
        if *t <= 420 {
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
    assert_eq!(
        quiet.cooldown_ends,
        Some(s(100) + 1),
        "over once lastActive + cooldownPeriod is strictly past"
    );
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
    assert_eq!(later.cooldown_ends, Some(s(190) + 1));
    // KEDA: `lastActiveTime.Add(cooldown).Before(now)`, so exactly at
    // 90 s + 100 s the cooldown still runs.
    let boundary = decide(
        &mut state,
        &rules,
        &[reading("q", 0.0, 5.0, s(190))],
        s(190),
    );
    assert_eq!(
        (boundary.replicas, boundary.reason, boundary.active),
        (1, Reason::Cooldown, true)
    );
    assert_eq!(boundary.next_evaluation, s(190) + 1);
    let end = decide(
        &mut state,
        &rules,
        &[reading("q", 0.0, 5.0, s(190))],
        s(190) + 1,
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

proptest::proptest! {
    /// The fast path of `milli` agrees with formatting the exact value, at
    /// and one to four ulps around every tie (`x.yyy5`) and every exact
    /// thousandth, at several magnitudes, and anywhere in range.
    #[test]
    fn milli_is_exact_formatting_near_ties_and_anywhere(
        whole in 0u64..100_000_000,
        thousandths in 0u64..1000,
        half in proptest::bool::ANY,
        nudge in -4i64..=4,
        shift in 0i32..4,
        anywhere in 0.0f64..9.2e15,
    ) {
        let at = (whole as f64 * 1000.0 + thousandths as f64 + if half { 0.5 } else { 0.0 })
            / 1000.0
            / 10f64.powi(shift);
        let near = f64::from_bits((at.to_bits() as i64 + nudge).max(0) as u64);
        proptest::prop_assert_eq!(hpa::milli(near), hpa::milli_exact(near), "{}", near);
        proptest::prop_assert_eq!(hpa::milli(anywhere), hpa::milli_exact(anywhere), "{}", anywhere);
    }
}

#[test]
fn values_and_targets_are_milli_quantities_as_keda_writes_them() {
    // Three decimals, rounded from the exact binary value as Go's `%.3f`.
    assert_eq!(hpa::milli(2.7), Some(2700));
    assert_eq!(hpa::milli(0.3), Some(300));
    assert_eq!(hpa::milli(4.35), Some(4350), "not truncated to 4349");
    assert_eq!(hpa::milli(0.0005), Some(1));
    assert_eq!(hpa::milli(0.0625), Some(62), "an exact tie rounds to even");
    assert_eq!(hpa::milli(0.0004), Some(0));
    assert_eq!(hpa::milli(-3.0), Some(0), "negative values count as zero");
    assert_eq!(hpa::milli(1e300), Some(i64::MAX));
    assert_eq!(hpa::milli(f64::NAN), None);
    assert_eq!(hpa::milli(f64::NEG_INFINITY), None);

    let rules = Rules {
        max_replica_count: 20,
        scale_down_stabilization_window_seconds: 0,
        ..Rules::default()
    };
    let at = |replicas| State {
        current_replicas: replicas,
        active: true,
        recommendations: Some(vec![]),
        ..Default::default()
    };
    // 2.7 / 0.3 is 9.000000000000002 in f64; the HPA divides 2700 by 300.
    let mut state = at(5);
    let decision = decide(&mut state, &rules, &[reading("q", 2.7, 0.3, s(0))], s(0));
    assert_eq!((decision.raw_desired, decision.replicas), (Some(9), 9));
    // 2.31 / (0.7 × 3) is just above 1.1 in f64; 2310 / 2100 is 1.1,
    // inside the tolerance.
    let mut state = at(3);
    let decision = decide(&mut state, &rules, &[reading("q", 2.31, 0.7, s(0))], s(0));
    assert_eq!(
        (decision.replicas, decision.reason),
        (3, Reason::WithinTolerance)
    );
}

#[test]
fn a_value_that_is_no_number_is_a_failed_reading_and_a_bad_target_too() {
    let rules = Rules {
        max_replica_count: 20,
        scale_down_stabilization_window_seconds: 0,
        ..Rules::default()
    };
    for (value, target) in [
        (f64::NAN, 5.0),
        (f64::INFINITY, 5.0),
        (f64::NEG_INFINITY, 5.0),
        (3.0, 0.0),
        (3.0, -5.0),
        (3.0, f64::NAN),
        (3.0, 0.0004),
    ] {
        let mut state = State {
            current_replicas: 6,
            active: true,
            last_active: Some(s(0)),
            ..Default::default()
        };
        let decision = decide(
            &mut state,
            &rules,
            &[reading("q", value, target, s(600))],
            s(600),
        );
        let case = format!("value {value}, target {target}");
        assert_eq!(
            (decision.replicas, decision.reason, decision.active),
            (6, Reason::TriggerError, true),
            "{case}"
        );
        assert_eq!(decision.raw_desired, None, "{case}");
        let trigger = &state.triggers["q"];
        assert_eq!(trigger.consecutive_failures, 1, "{case}");
        assert!(trigger.last_error.is_some(), "{case}");
        assert_eq!(trigger.last_value, None, "{case}: never a zero");
    }
}

#[test]
fn time_arithmetic_saturates_at_the_end_of_time() {
    let rules = Rules {
        cooldown_period: MAX_COOLDOWN,
        ..Rules::default()
    };
    let end = Millis::MAX;
    let mut state = State {
        current_replicas: 5,
        active: true,
        last_active: Some(end - 1000),
        recommendations: Some(vec![Recommendation {
            replicas: 5,
            at: end - 1000,
        }]),
        ..Default::default()
    };
    let now = end - 500;
    let decision = decide(&mut state, &rules, &[reading("q", 0.0, 5.0, now)], now);
    assert_eq!((decision.replicas, decision.reason), (5, Reason::Cooldown));
    assert_eq!(decision.cooldown_ends, Some(Millis::MAX));
    assert_eq!(decision.stabilization_ends, Some(Millis::MAX));
    assert_eq!(decision.next_evaluation, Millis::MAX);
}

#[test]
fn at_zero_a_broken_source_counts_one_failure_per_polling_interval() {
    let rules = Rules {
        polling_interval: 30,
        fallback: Some(Fallback {
            failure_threshold: 3,
            replicas: 4,
        }),
        ..Rules::default()
    };
    let mut state = State::default();
    // The poller retries after 1, 2, 4, 8 and 16 s, then every interval;
    // each retry is a fresh reading, fed once on arrival and again at the
    // next evaluation.
    let mut decisions = Vec::new();
    for t in [0, 1, 3, 7, 15, 31, 61, 91] {
        for _ in 0..2 {
            let decision = decide(&mut state, &rules, &[failure("q", 5.0, s(t))], s(t));
            decisions.push((t, decision.replicas, decision.reason));
        }
    }
    let counted: Vec<u64> = decisions
        .iter()
        .filter(|(_, replicas, _)| *replicas == 0)
        .map(|(t, ..)| *t)
        .collect();
    assert_eq!(counted.last(), Some(&61), "{decisions:?}");
    assert_eq!(
        decisions.last(),
        Some(&(91, 4, Reason::Fallback)),
        "the fourth interval's failure is the one past the threshold"
    );
    assert_eq!(state.triggers["q"].consecutive_failures, 4);
    assert_eq!(state.triggers["q"].last_counted_failure_at, Some(s(91)));
}

#[test]
fn fallback_replicas_zero_starts_nothing_at_zero() {
    let rules = Rules {
        fallback: Some(Fallback {
            failure_threshold: 1,
            replicas: 0,
        }),
        ..Rules::default()
    };
    let mut state = State::default();
    for t in (0..=300).step_by(30) {
        let decision = decide(&mut state, &rules, &[failure("q", 5.0, s(t))], s(t));
        assert_eq!(
            (decision.replicas, decision.active, decision.reason),
            (0, false, Reason::TriggerError),
            "t={t}"
        );
    }
    assert_eq!(state.triggers["q"].consecutive_failures, 11);
}

#[test]
fn snapping_to_min_or_max_records_a_scale_event_as_every_hpa_rescale_does() {
    let rules = Rules {
        min_replica_count: 3,
        max_replica_count: 6,
        behavior: Some(Behavior {
            scale_up: Some(BehaviorRules {
                policies: Some(vec![Policy {
                    kind: PolicyType::Pods,
                    value: 2,
                    period_seconds: 60,
                }]),
                ..Default::default()
            }),
            scale_down: None,
        }),
        ..Rules::default()
    };
    // Above max (the rules changed): snapped down, and the step is logged.
    let mut state = State {
        current_replicas: 10,
        active: true,
        ..Default::default()
    };
    let snapped = decide(&mut state, &rules, &[reading("q", 50.0, 5.0, s(0))], s(0));
    assert_eq!(
        (snapped.replicas, snapped.reason),
        (6, Reason::TooManyReplicas)
    );
    let changes = |events: &[ScaleEvent]| events.iter().map(|e| e.change).collect::<Vec<_>>();
    assert_eq!(changes(&state.scale_down_events), [4]);
    assert!(state.scale_up_events.is_empty());

    // Below min: raised, and the rise uses up the scale-up policy
    // (2 pods per 60 s) for the rest of its period.
    let mut state = State {
        current_replicas: 1,
        active: true,
        ..Default::default()
    };
    let raised = decide(&mut state, &rules, &[reading("q", 30.0, 5.0, s(0))], s(0));
    assert_eq!(
        (raised.replicas, raised.reason),
        (3, Reason::TooFewReplicas)
    );
    assert_eq!(changes(&state.scale_up_events), [2]);
    let held = decide(&mut state, &rules, &[reading("q", 30.0, 5.0, s(30))], s(30));
    assert_eq!((held.replicas, held.reason), (3, Reason::ScaleUpLimit));
    let later = decide(&mut state, &rules, &[reading("q", 30.0, 5.0, s(60))], s(60));
    assert_eq!(later.replicas, 5);

    // Without a behavior the HPA keeps no events at all.
    let mut state = State {
        current_replicas: 10,
        active: true,
        ..Default::default()
    };
    decide(
        &mut state,
        &Rules {
            behavior: None,
            ..rules
        },
        &[reading("q", 50.0, 5.0, s(0))],
        s(0),
    );
    assert!(state.scale_down_events.is_empty());
}

#[test]
fn a_behavior_without_scale_up_steps_up_by_the_hpa_default_not_acas() {
    let rules = Rules {
        max_replica_count: 40,
        behavior: Some(Behavior {
            scale_up: None,
            scale_down: Some(BehaviorRules {
                stabilization_window_seconds: Some(60),
                ..Default::default()
            }),
        }),
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 1,
        active: true,
        ..Default::default()
    };
    // 4 pods or 100 % per 15 s, whichever is more (ACA's rule: 1 → 4 → 8).
    let counts: Vec<u32> = (0..4)
        .map(|step| {
            let now = s(15 * step);
            decide(&mut state, &rules, &[reading("q", 500.0, 5.0, now)], now).replicas
        })
        .collect();
    assert_eq!(counts, [5, 10, 20, 40]);
}

#[test]
fn above_zero_the_cooldown_does_not_hold_a_scale_down() {
    let rules = Rules {
        min_replica_count: 2,
        scale_down_stabilization_window_seconds: 0,
        cooldown_period: 300,
        ..Rules::default()
    };
    let mut state = State {
        current_replicas: 6,
        active: true,
        last_active: Some(s(0)),
        recommendations: Some(vec![]),
        ..Default::default()
    };
    let decision = decide(&mut state, &rules, &[reading("q", 0.0, 5.0, s(30))], s(30));
    assert_eq!(
        (decision.replicas, decision.reason),
        (2, Reason::TooFewReplicas),
        "KEDA's cooldown applies only on the way to zero"
    );
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

    /// Values and targets written with at most three decimals reach the
    /// HPA unchanged, and the engine's count is the integer ceiling of
    /// their quotient, whatever f64 makes of the decimals.
    #[test]
    fn milli_values_divide_as_integers(usage in 0i64..1_000_000_000, target in 1i64..1_000_000) {
        let (value, target_value) = (usage as f64 / 1000.0, target as f64 / 1000.0);
        prop_assert_eq!(hpa::milli(value), Some(usage));
        prop_assert_eq!(hpa::milli(target_value), Some(target));
        let rules = Rules { max_replica_count: i32::MAX as u32, ..Rules::default() };
        let mut state = State { current_replicas: 1, active: true, ..Default::default() };
        let decision = decide(&mut state, &rules, &[reading("q", value, target_value, s(0))], s(0));
        let exact = (usage + target - 1) / target;
        prop_assert_eq!(decision.raw_desired, Some(exact as u32));
    }

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
                prop_assert!(now > quiet_since + rules.cooldown_period * 1000);
            }
        }
    }
}
