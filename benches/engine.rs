//! The engine's cost: one decision, and `simulate` over a day of 1 s
//! samples with five triggers. `cargo bench --bench engine`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hoist::engine::{self, Behavior, Observation, Reading, Rules, State};
use hoist::simulate::{Sample, Scenario, TriggerSpec, simulate};

fn readings(at: u64, values: &[f64]) -> Vec<Reading> {
    values
        .iter()
        .enumerate()
        .map(|(index, value)| Reading {
            trigger: format!("trigger-{index}"),
            target: 10.0,
            activation_target: 0.0,
            value: Observation::Value(*value),
            activity: None,
            at,
        })
        .collect()
}

/// A warmed-up state: 300 s of history at 1 s.
fn warmed(rules: &Rules) -> (State, u64) {
    let mut state = State::default();
    let mut now = 1_700_000_000_000;
    for step in 0..300u64 {
        now += 1000;
        let value = 200.0 + (step % 50) as f64;
        engine::decide(
            &mut state,
            rules,
            &readings(now, &[value, value / 2.0]),
            now,
        );
    }
    (state, now)
}

fn one_decision(c: &mut Criterion) {
    for (name, rules) in [
        ("aca (no behavior)", Rules::default()),
        (
            "hpa behavior",
            Rules {
                behavior: Some(Behavior::default()),
                ..Rules::default()
            },
        ),
    ] {
        let (state, now) = warmed(&rules);
        let input = readings(now + 1000, &[180.0, 90.0]);
        c.bench_function(
            &format!("decide, 2 triggers, 300 s of history, {name}"),
            |b| {
                b.iter_batched_ref(
                    // A clone's log has no spare capacity, while a running
                    // engine's has grown into it: without room for one more
                    // entry the timed decision would reallocate the log.
                    || {
                        let mut state = state.clone();
                        if let Some(log) = state.recommendations.as_mut() {
                            log.reserve(1);
                        }
                        state
                    },
                    |state| engine::decide(state, black_box(&rules), black_box(&input), now + 1000),
                    criterion::BatchSize::SmallInput,
                )
            },
        );
    }
}

fn a_day_of_samples(c: &mut Criterion) {
    let scenario = Scenario {
        rules: Rules {
            max_replica_count: 100,
            ..Rules::default()
        },
        triggers: (0..5)
            .map(|index| TriggerSpec {
                name: format!("trigger-{index}"),
                target: 10.0,
                activation_target: 0.0,
            })
            .collect(),
    };
    let samples: Vec<Sample> = (0..86_400u64)
        .map(|second| {
            let wave = ((second as f64) / 3_600.0).sin().abs();
            Sample {
                seconds: second as f64,
                readings: (0..5)
                    .map(|index| {
                        Observation::Value((wave * 400.0 * (index + 1) as f64 / 5.0).round())
                    })
                    .collect(),
            }
        })
        .collect();
    let mut group = c.benchmark_group("simulate");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("24 h at 1 s, 5 triggers", |b| {
        b.iter(|| simulate(black_box(&scenario), black_box(&samples)))
    });
    group.finish();
}

criterion_group!(benches, one_decision, a_day_of_samples);
criterion_main!(benches);
