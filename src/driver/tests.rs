//! Driver scheduling under tokio's paused clock. The source here is an
//! in-process counter: what is tested is when the driver asks, not what a
//! real source answers (the Redis tests in `tests/` cover that).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::Answer;
use super::*;
use crate::scalers::{Measurement, ObserveError, Query, Source, Trigger};
use crate::trigger::ScalingMode;

/// Counts calls; answers with the call number, fails while `failing` is
/// set, and never answers while `hang` is set.
#[derive(Default)]
struct Counter {
    calls: AtomicUsize,
    failing: AtomicU32,
    hang: AtomicU32,
}

impl Source for Counter {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let failing = self.failing.load(Ordering::SeqCst) > 0;
        let hang = self.hang.load(Ordering::SeqCst) > 0;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            if failing {
                Err(ObserveError::Connect("refused".into()))
            } else {
                Ok(Measurement::of(call as f64))
            }
        }
        .boxed()
    }
}

fn driver(idle_after: Duration) -> Driver {
    driver_assuming(idle_after, true)
}

/// `assume_applied`: engines count from their own decisions (these tests
/// are about the rules; counting has tests of its own).
fn driver_assuming(idle_after: Duration, assume_applied: bool) -> Driver {
    Driver::new(
        DriverSettings {
            assume_applied,
            ..DriverSettings::unlimited(
                Defaults {
                    polling_interval: Duration::from_secs(30),
                    timeout: Duration::from_secs(3),
                },
                idle_after,
            )
        },
        AuthProfiles::default(),
        Arc::new(Metrics::new()),
        CancellationToken::new(),
    )
}

fn config(source: &Arc<Counter>, query_key: &str, interval_s: u64) -> TriggerConfig {
    TriggerConfig {
        trigger: Trigger {
            polling_interval: None,
            scaler: "counter",
            metric_name: "counter".into(),
            target: 5.0,
            target_key: "target",
            activation_target: 0.0,
            query: Query {
                key: query_key.into(),
                description: format!("counter {query_key}").into(),
                endpoints: Vec::new(),
                source: source.clone(),
            },
            route: None,
        },
        polling_interval: Duration::from_secs(interval_s),
        timeout: Duration::from_secs(3),
        scaling_mode: ScalingMode::Passthrough,
        written: Default::default(),
    }
}

fn key(name: &str) -> TriggerKey {
    TriggerKey::new("default".into(), name.into(), HashMap::new())
}

#[test]
fn trigger_keys_are_equal_exactly_when_their_parts_are() {
    let metadata = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let key = |namespace: &str, name: &str, pairs: &[(&str, &str)]| {
        TriggerKey::new(namespace.into(), name.into(), metadata(pairs))
    };
    let pairs = [("listName", "jobs"), ("address", "redis:6379")];
    let reversed = [("address", "redis:6379"), ("listName", "jobs")];
    assert_eq!(key("ns", "app", &pairs), key("ns", "app", &reversed));
    // The metadata is read back from the buffer, sorted; the size counts
    // every string once.
    let read_back = key("ns", "app", &pairs);
    assert_eq!(
        read_back.metadata().collect::<Vec<_>>(),
        [("address", "redis:6379"), ("listName", "jobs")]
    );
    assert_eq!(
        read_back.size(),
        "nsapp".len() + "addressredis:6379listNamejobs".len()
    );
    assert_eq!(key("ns", "app", &[]).metadata().count(), 0);
    // The trigger map hashes the identity buffer.
    let hash = |key: &TriggerKey| {
        use std::hash::BuildHasher;
        foldhash::quality::FixedState::default().hash_one(key.identity())
    };
    assert_eq!(
        hash(&key("ns", "app", &pairs)),
        hash(&key("ns", "app", &reversed))
    );
    // The same bytes split differently are different keys.
    assert_ne!(key("nsa", "pp", &pairs), key("ns", "app", &pairs));
    assert_ne!(
        key("ns", "app", &[("ab", "c")]),
        key("ns", "app", &[("a", "bc")])
    );
    assert_ne!(key("ns", "app", &[("a", "")]), key("ns", "app", &[]));
    assert_ne!(key("ns", "app", &pairs), key("ns", "app2", &pairs));
}

#[tokio::test(start_paused = true)]
async fn a_scaled_objects_triggers_are_found_without_its_neighbours() {
    let driver = driver(Duration::from_secs(3600));
    let source = Arc::new(Counter::default());
    let named = |namespace: &str, name: &str, list: &str| {
        let metadata = HashMap::from([("listName".to_string(), list.to_string())]);
        TriggerKey::new(namespace.into(), name.into(), metadata)
    };
    // Names that are prefixes of each other, and the same bytes split
    // differently between namespace and name.
    let keys = [
        named("ns", "app", "a"),
        named("ns", "app", "b"),
        named("ns", "app2", "a"),
        named("ns", "ap", "a"),
        named("nsa", "pp", "a"),
        named("n", "sapp", "a"),
    ];
    for (index, key) in keys.iter().enumerate() {
        let query = format!("q{index}");
        driver
            .track_parsed(key.clone(), config(&source, &query, 30))
            .unwrap();
    }
    let found = |namespace: &str, name: &str| {
        let mut lists: Vec<String> = driver
            .read_state()
            .triggers
            .of_object(namespace, name)
            .iter()
            .map(|tracked| {
                assert_eq!(
                    (tracked.key.namespace.as_str(), tracked.key.name.as_str()),
                    (namespace, name)
                );
                tracked.key.metadata_map()["listName"].clone()
            })
            .collect();
        lists.sort();
        lists
    };
    assert_eq!(found("ns", "app"), ["a", "b"]);
    assert_eq!(found("ns", "ap"), ["a"]);
    assert_eq!(found("nsa", "pp"), ["a"]);
    assert!(found("ns", "a").is_empty());
    assert!(found("other", "app").is_empty());
    // Forgotten triggers leave the index with the table.
    driver.revoke(&keys[..2], "test");
    assert!(found("ns", "app").is_empty());
    assert_eq!(found("ns", "app2"), ["a"]);
}

/// Lets spawned tasks run, moving the paused clock by `by`.
async fn advance(by: Duration) {
    tokio::time::sleep(by).await;
}

#[tokio::test(start_paused = true)]
async fn first_reading_is_taken_at_once_and_then_every_interval() {
    let driver = driver(Duration::from_secs(600));
    let source = Arc::new(Counter::default());
    let tracked = driver
        .track_parsed(key("a"), config(&source, "q", 30))
        .unwrap();
    assert_eq!(tracked.current().await.value(), Some(1.0));
    advance(Duration::from_secs(29)).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    advance(Duration::from_secs(2)).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    assert_eq!(tracked.latest().value(), Some(2.0));
}

#[tokio::test(start_paused = true)]
async fn triggers_asking_the_same_question_share_one_poller_at_the_shortest_interval() {
    let driver = driver(Duration::from_secs(600));
    let source = Arc::new(Counter::default());
    let slow = driver
        .track_parsed(key("slow"), config(&source, "q", 60))
        .unwrap();
    slow.current().await;
    let fast = driver
        .track_parsed(key("fast"), config(&source, "q", 10))
        .unwrap();
    assert_eq!(driver.poller_count(), 1);
    assert_eq!(
        fast.current().await.value(),
        Some(1.0),
        "the second subscriber reads the cache"
    );
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    advance(Duration::from_secs(31)).await;
    // Polls at 0, 10, 20, 30: the 10 s subscriber sets the pace.
    assert_eq!(source.calls.load(Ordering::SeqCst), 4);
    assert_eq!(slow.latest(), fast.latest());

    let other = Arc::new(Counter::default());
    driver
        .track_parsed(key("other"), config(&other, "r", 10))
        .unwrap();
    assert_eq!(driver.poller_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_from_one_second_up_to_the_interval_and_keep_the_last_value() {
    let driver = driver(Duration::from_secs(600));
    let source = Arc::new(Counter::default());
    let tracked = driver
        .track_parsed(key("a"), config(&source, "q", 10))
        .unwrap();
    assert_eq!(tracked.current().await.value(), Some(1.0));
    source.failing.store(1, Ordering::SeqCst);
    advance(Duration::from_millis(10_100)).await; // poll 2 fails at t=10
    match tracked.latest() {
        Reading::Failed {
            consecutive_failures,
            last_value,
            ..
        } => {
            assert_eq!(consecutive_failures, 1);
            assert_eq!(last_value.map(|(v, _)| v), Some(1.0));
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    // Retries 1, 2, 4, 8 s apart (t = 11, 13, 17, 25), then 16 s capped
    // at the 10 s interval (t = 35).
    for (wait, calls) in [(1, 3), (2, 4), (4, 5), (8, 6)] {
        advance(Duration::from_secs(wait)).await;
        assert_eq!(
            source.calls.load(Ordering::SeqCst),
            calls,
            "after {wait} s more"
        );
    }
    advance(Duration::from_secs(9)).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 6);
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        7,
        "the delay is capped at the interval"
    );
    source.failing.store(0, Ordering::SeqCst);
    advance(Duration::from_secs(10)).await;
    assert_eq!(
        tracked.latest().value(),
        Some(8.0),
        "recovers on the next poll"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_source_times_out_and_the_first_read_waits_no_longer_than_the_timeout() {
    let driver = driver(Duration::from_secs(600));
    let source = Arc::new(Counter::default());
    source.hang.store(1, Ordering::SeqCst);
    let tracked = driver
        .track_parsed(key("a"), config(&source, "q", 30))
        .unwrap();
    let started = tokio::time::Instant::now();
    let reading = tracked.current().await;
    assert!(started.elapsed() <= Duration::from_secs(3));
    match reading {
        Reading::Failed { error, .. } => {
            assert_eq!(error, PollError::Timeout(Duration::from_secs(3)))
        }
        Reading::Pending => {}
        other => panic!("a hanging source produced {other:?}"),
    }
    // The poll itself gives up at the 3 s timeout.
    advance(Duration::from_secs(3) - started.elapsed() + Duration::from_millis(10)).await;
    assert!(matches!(
        tracked.latest(),
        Reading::Failed {
            error: PollError::Timeout(_),
            ..
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn idle_triggers_are_dropped_with_their_poller_but_not_while_streamed_or_asked() {
    let driver = driver(Duration::from_secs(600));
    let source = Arc::new(Counter::default());
    let asked = driver
        .track_parsed(key("asked"), config(&source, "q", 30))
        .unwrap();
    let streamed = driver
        .track_parsed(key("streamed"), config(&source, "q", 30))
        .unwrap();
    let ignored_source = Arc::new(Counter::default());
    driver
        .track_parsed(key("ignored"), config(&ignored_source, "r", 30))
        .unwrap();
    let guard = streamed.stream_guard();
    for _ in 0..12 {
        advance(Duration::from_secs(60)).await;
        asked.touch();
    }
    let names: Vec<String> = driver
        .tracked()
        .iter()
        .map(|t| t.key.name.clone())
        .collect();
    assert_eq!(driver.tracked().len(), 2, "{names:?}");
    assert!(!names.contains(&"ignored".to_string()));
    assert_eq!(driver.poller_count(), 1);
    let calls = ignored_source.calls.load(Ordering::SeqCst);
    advance(Duration::from_secs(120)).await;
    assert_eq!(
        ignored_source.calls.load(Ordering::SeqCst),
        calls,
        "its poller stopped"
    );

    drop(guard);
    drop(asked);
    advance(Duration::from_secs(660)).await;
    assert!(driver.tracked().is_empty());
    assert_eq!(driver.poller_count(), 0);
}

/// A source whose value the test sets.
#[derive(Default)]
struct Gauge(std::sync::Mutex<f64>);

impl Gauge {
    fn set(&self, value: f64) {
        *self.0.lock().unwrap() = value;
    }
}

impl Source for Gauge {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        let value = *self.0.lock().unwrap();
        async move { Ok(Measurement::of(value)) }.boxed()
    }
}

fn engine_config(source: Arc<Gauge>, metric: &str, rules: crate::engine::Rules) -> TriggerConfig {
    TriggerConfig {
        trigger: Trigger {
            polling_interval: None,
            scaler: "gauge",
            metric_name: metric.into(),
            target: 5.0,
            target_key: "target",
            activation_target: 0.0,
            query: Query {
                key: metric.into(),
                description: format!("gauge {metric}").into(),
                endpoints: Vec::new(),
                source,
            },
            route: None,
        },
        polling_interval: Duration::from_secs(rules.polling_interval),
        timeout: Duration::from_secs(3),
        scaling_mode: ScalingMode::Engine(Box::new(rules)),
        written: Default::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn engine_mode_decides_per_scaled_object_on_every_poll() {
    let driver = driver(Duration::from_secs(3600));
    let rules = crate::engine::Rules {
        max_replica_count: 20,
        ..Default::default()
    };
    let queue = Arc::new(Gauge::default());
    queue.set(50.0);
    let tracked = driver
        .track_parsed(
            key("worker"),
            engine_config(queue.clone(), "queue", rules.clone()),
        )
        .unwrap();
    let mut replicas = Vec::new();
    for _ in 0..4 {
        let decision = tracked.decision().await.expect("a decision");
        replicas.push(decision.replicas);
        // Past the next poll, and the evaluation it wakes.
        advance(Duration::from_millis(30_010)).await;
    }
    assert_eq!(replicas, [1, 4, 8, 10]);

    // A second trigger of the same ScaledObject feeds the same engine.
    let other = Arc::new(Gauge::default());
    other.set(90.0);
    let second = driver
        .track_parsed(
            key("worker").with_metadata("other"),
            engine_config(other, "other", rules.clone()),
        )
        .unwrap();
    assert!(Arc::ptr_eq(
        second.scaling.as_ref().unwrap(),
        tracked.scaling.as_ref().unwrap()
    ));
    advance(Duration::from_millis(10)).await;
    assert_eq!(
        second.decision().await.unwrap().replicas,
        10,
        "one evaluation per interval"
    );
    advance(Duration::from_secs(30)).await;
    assert_eq!(
        second.decision().await.unwrap().replicas,
        18,
        "the larger trigger wins"
    );

    // An edit of the ScaledObject: new metadata for the `other` trigger with
    // a lower maxReplicaCount. The old `other` goes at once (no clash on
    // its metric), and the engine takes the new rules, keeping its state.
    let stricter = crate::engine::Rules {
        max_replica_count: 12,
        ..rules.clone()
    };
    let edited_source = Arc::new(Gauge::default());
    edited_source.set(90.0);
    let edited = driver
        .track_parsed(
            key("worker").with_metadata("other-edited"),
            engine_config(edited_source.clone(), "other", stricter),
        )
        .unwrap();
    assert_eq!(driver.tracked().len(), 2, "the superseded trigger is gone");
    assert_eq!(
        edited
            .scaling
            .as_ref()
            .unwrap()
            .rules()
            .rules
            .max_replica_count,
        12
    );
    advance(Duration::from_secs(31)).await;
    let capped = edited.decision().await.unwrap();
    assert_eq!(
        (capped.replicas, capped.reason),
        (12, crate::engine::Reason::TooManyReplicas)
    );
    let other_source = edited_source;

    // Quiet: held through the 300 s cooldown, then zero.
    queue.set(0.0);
    other_source.set(0.0);
    // Up to one interval for the readings, one for the evaluation.
    advance(Duration::from_secs(61)).await;
    let quiet = tracked.decision().await.unwrap();
    assert!(quiet.active);
    assert_eq!(quiet.replicas, 12, "held within the cooldown: {quiet:?}");
    assert!(quiet.cooldown_ends.is_some());
    advance(Duration::from_secs(300)).await;
    let zero = tracked.decision().await.unwrap();
    assert_eq!((zero.replicas, zero.active), (0, false));
    assert_eq!(driver.scalings().len(), 1);
}

impl TriggerKey {
    fn with_metadata(self, marker: &str) -> Self {
        let mut metadata: Vec<(String, String)> = self
            .metadata()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        metadata.push(("marker".into(), marker.into()));
        Self::from_parts(self.namespace, self.name, metadata)
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_cluster_or_saved_state_the_count_is_unknown_not_zero() {
    let driver = driver_assuming(Duration::from_secs(3600), false);
    let queue = Arc::new(Gauge::default());
    queue.set(50.0);
    let tracked = driver
        .track_parsed(
            key("worker"),
            engine_config(queue.clone(), "queue", crate::engine::Rules::default()),
        )
        .unwrap();
    let Some(Answer::CountUnknown(reason)) = tracked.answer().await else {
        panic!("no count known: the engine must not answer with one");
    };
    assert!(reason.contains("engine.assume_applied"), "{reason}");
    assert!(tracked.decision().await.is_none());

    // A saved state covers the ScaledObject: its count (10) is the start.
    let restarted = driver_assuming(Duration::from_secs(3600), false);
    let mut snapshot = crate::persist::Snapshot {
        version: crate::persist::VERSION,
        ..Default::default()
    };
    snapshot.scaled_objects.insert(
        crate::persist::key("default", "worker"),
        crate::engine::State {
            current_replicas: 10,
            count_known: true,
            active: true,
            last_active: Some(restarted.clock().now()),
            ..Default::default()
        },
    );
    restarted.restore(snapshot);
    queue.set(0.0);
    let tracked = restarted
        .track_parsed(
            key("worker"),
            engine_config(queue, "queue", crate::engine::Rules::default()),
        )
        .unwrap();
    let decision = tracked
        .decision()
        .await
        .expect("a decision from the saved count");
    assert_eq!(
        decision.replicas, 10,
        "idle, but the scale-down window and cooldown hold the saved count"
    );
}

#[tokio::test(start_paused = true)]
async fn mixed_intervals_evaluate_at_the_smallest_whatever_the_order() {
    for order in [[30u64, 15], [15, 30]] {
        let driver = driver(Duration::from_secs(3600));
        let mut tracked = Vec::new();
        let mut gauges = Vec::new();
        for (i, interval) in order.iter().enumerate() {
            let gauge = Arc::new(Gauge::default());
            gauge.set(50.0);
            let rules = crate::engine::Rules {
                max_replica_count: 40,
                polling_interval: *interval,
                ..Default::default()
            };
            let metric = format!("m{i}");
            tracked.push(
                driver
                    .track_parsed(
                        key("mixed").with_metadata(&metric),
                        engine_config(gauge.clone(), &metric, rules),
                    )
                    .unwrap(),
            );
            gauges.push(gauge);
        }
        let scaling = tracked[0].scaling.clone().unwrap();
        let mut seen = vec![tracked[0].decision().await.unwrap().replicas];
        // 46 s: evaluations at 15 s steps give 1 → 4 → 8 → 10.
        for _ in 0..46 {
            advance(Duration::from_secs(1)).await;
            let now = scaling.decision().unwrap().replicas;
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
        assert_eq!(seen, [1, 4, 8, 10], "intervals {order:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn with_a_behavior_the_engine_evaluates_at_the_hpa_sync_period() {
    let driver = driver(Duration::from_secs(3600));
    let rules = crate::engine::Rules {
        max_replica_count: 100,
        behavior: Some(
            serde_json::from_str(
                r#"{"scaleUp":{"policies":[{"type":"Pods","value":4,"periodSeconds":15}]}}"#,
            )
            .unwrap(),
        ),
        ..Default::default()
    };
    let queue = Arc::new(Gauge::default());
    queue.set(500.0);
    let tracked = driver
        .track_parsed(key("burst"), engine_config(queue, "queue", rules))
        .unwrap();
    assert_eq!(tracked.decision().await.unwrap().replicas, 1);
    // One 30 s poll, two HPA syncs: +4 each, as the HPA would allow.
    advance(Duration::from_millis(30_100)).await;
    assert_eq!(
        tracked
            .scaling
            .as_ref()
            .unwrap()
            .decision()
            .unwrap()
            .replicas,
        9
    );
}

/// Answers 7 after `0`, on the paused clock.
struct Slow(Duration);

impl Source for Slow {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        let delay = self.0;
        async move {
            tokio::time::sleep(delay).await;
            Ok(Measurement::of(7.0))
        }
        .boxed()
    }
}

/// KEDA's metrics adapter gives the HPA's call 3 s and retries once: the
/// first call waits a second at most, and the measurement it started
/// answers the retry.
#[tokio::test(start_paused = true)]
async fn the_first_read_of_a_new_trigger_waits_a_second_at_most_and_the_measurement_goes_on() {
    let driver = driver(Duration::from_secs(600));
    let mut slow = config(&Arc::new(Counter::default()), "q", 30);
    slow.trigger.query.source = Arc::new(Slow(Duration::from_millis(2_500)));
    assert_eq!(slow.timeout, Duration::from_secs(3));
    let tracked = driver.track_parsed(key("a"), slow).unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(tracked.current().await, Reading::Pending);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // The retry, a second later, still finds it running.
    advance(Duration::from_secs(1)).await;
    let retried = tokio::time::Instant::now();
    assert_eq!(tracked.current().await.value(), Some(7.0));
    assert_eq!(retried.elapsed(), Duration::from_millis(500));
    // From then on the reading is answered without waiting.
    let again = tokio::time::Instant::now();
    assert_eq!(tracked.current().await.value(), Some(7.0));
    assert_eq!(again.elapsed(), Duration::ZERO);

    // A trigger timeout under a second is the bound instead.
    let mut quick = config(&Arc::new(Counter::default()), "r", 30);
    quick.timeout = Duration::from_millis(300);
    quick.trigger.query.source = Arc::new(Slow(Duration::from_secs(2)));
    let tracked = driver.track_parsed(key("b"), quick).unwrap();
    let started = tokio::time::Instant::now();
    tracked.current().await;
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

fn from_env_key(name: &str, address: Option<&str>) -> TriggerKey {
    let mut metadata = HashMap::from([("listName".to_string(), "jobs".to_string())]);
    if let Some(address) = address {
        metadata.insert("addressFromEnv".to_string(), address.to_string());
    }
    TriggerKey::new("default".into(), name.into(), metadata)
}

#[tokio::test(start_paused = true)]
async fn a_trigger_is_tracked_once_whatever_its_from_env_values() {
    let driver = driver(Duration::from_secs(3600));
    let source = Arc::new(Counter::default());
    let real = from_env_key("app", Some("redis-a:6379"));
    let tracked = driver
        .track_parsed(real.clone(), config(&source, "real", 30))
        .unwrap();
    // Forged values (and the key left out) while KEDA asks the real one:
    // refused, naming the ScaledObject; no trigger, no poller added.
    for index in 0..50 {
        let forged = from_env_key("app", Some(&format!("evil-{index}:6379")));
        let query = format!("forged-{index}");
        let error = driver
            .track_parsed(forged, config(&source, &query, 30))
            .err()
            .expect("a forged value is refused");
        assert!(matches!(error, TrackError::TriggerHeld { .. }), "{error}");
        assert!(error.to_string().contains("default/app"), "{error}");
    }
    assert_eq!((driver.tracked().len(), driver.poller_count()), (1, 1));
    // The key left out is an edit of the trigger, not a value of it: a
    // trigger of its own (with a cluster, stopped unless its ScaledObject
    // has it), never refused as the real one's.
    let without = from_env_key("app", None);
    driver
        .track_parsed(without.clone(), config(&source, "unset", 30))
        .unwrap();
    assert_eq!((driver.tracked().len(), driver.poller_count()), (2, 2));
    driver.revoke(&[without], "test");
    assert_eq!((driver.tracked().len(), driver.poller_count()), (1, 1));
    // KEDA keeps asking the real value: it keeps its place.
    for _ in 0..4 {
        advance(Duration::from_secs(30)).await;
        assert!(driver.lookup(&real).unwrap().is_some());
        let forged = from_env_key("app", Some("evil:6379"));
        assert!(
            driver
                .track_parsed(forged, config(&source, "forged", 30))
                .is_err()
        );
    }
    // The environment changed: KEDA asks only the new value; once the old
    // one goes unasked for two polls and an HPA sync it is replaced.
    advance(Duration::from_secs(76)).await;
    let moved = from_env_key("app", Some("redis-b:6379"));
    let new = driver
        .track_parsed(moved.clone(), config(&source, "moved", 30))
        .unwrap();
    assert_eq!((driver.tracked().len(), driver.poller_count()), (1, 1));
    assert!(driver.lookup(&real).unwrap().is_none());
    assert!(!Arc::ptr_eq(&new, &tracked));
    // Another ScaledObject's trigger is its own.
    driver
        .track_parsed(
            from_env_key("other", Some("x:1")),
            config(&source, "other", 30),
        )
        .unwrap();
    assert_eq!(driver.tracked().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_namespace_holds_at_most_its_share_of_tracked_triggers() {
    let driver = Driver::new(
        DriverSettings {
            max_tracked_triggers_per_namespace: 2,
            ..DriverSettings::unlimited(
                Defaults {
                    polling_interval: Duration::from_secs(30),
                    timeout: Duration::from_secs(3),
                },
                Duration::from_secs(3600),
            )
        },
        AuthProfiles::default(),
        Arc::new(Metrics::new()),
        CancellationToken::new(),
    );
    let source = Arc::new(Counter::default());
    let in_namespace = |namespace: &str, name: &str| {
        TriggerKey::new(namespace.into(), name.into(), HashMap::new())
    };
    let track = |key: TriggerKey| {
        let query = format!("{}-{}", key.namespace, key.name);
        driver.track_parsed(key, config(&source, &query, 30))
    };
    track(in_namespace("a", "one")).unwrap();
    track(in_namespace("a", "two")).unwrap();
    let refused = track(in_namespace("a", "three"))
        .err()
        .expect("past the share");
    assert!(matches!(
        refused,
        TrackError::TooManyInNamespace { limit: 2, .. }
    ));
    let message = refused.to_string();
    assert!(message.contains("a/three"), "{message}");
    assert!(
        message.contains("limits.max_tracked_triggers_per_namespace"),
        "{message}"
    );
    track(in_namespace("b", "one")).expect("another namespace has its own share");
    // A place given back is a place again.
    driver.revoke(&[in_namespace("a", "one")], "test");
    track(in_namespace("a", "three")).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_forged_from_env_value_never_moves_an_engines_inputs() {
    let driver = driver(Duration::from_secs(3600));
    let rules = crate::engine::Rules {
        max_replica_count: 20,
        ..Default::default()
    };
    let real_source = Arc::new(Gauge::default());
    real_source.set(50.0);
    let real = from_env_key("worker", Some("redis-a:6379"));
    let tracked = driver
        .track_parsed(
            real.clone(),
            engine_config(real_source, "queue", rules.clone()),
        )
        .unwrap();
    assert_eq!(tracked.decision().await.unwrap().replicas, 1);
    let forged_source = Arc::new(Gauge::default());
    forged_source.set(0.0);
    let forged = driver.track_parsed(
        from_env_key("worker", Some("evil:6379")),
        engine_config(forged_source, "queue", rules),
    );
    assert!(matches!(forged, Err(TrackError::TriggerHeld { .. })));
    let still = driver
        .lookup(&real)
        .unwrap()
        .expect("the real trigger stays");
    assert!(Arc::ptr_eq(&still, &tracked));
    assert_eq!(driver.tracked().len(), 1);
    advance(Duration::from_millis(30_010)).await;
    assert_eq!(
        tracked.decision().await.unwrap().replicas,
        4,
        "still the real queue"
    );
}

/// A runtime whose tasks run beside the threads racing through
/// [`Driver::track`] (a sync call that starts tasks).
fn threaded_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// No limits: each test sets the one it puts at its edge.
fn unlimited() -> DriverSettings {
    DriverSettings::unlimited(
        Defaults {
            polling_interval: Duration::from_secs(30),
            timeout: Duration::from_secs(3),
        },
        Duration::from_secs(3600),
    )
}

/// A caller proven by the cluster or mTLS (without a cluster here).
fn trusted_caller() -> Caller {
    Caller {
        proven: true,
        checked_in_cluster: false,
        authentication: None,
    }
}

/// Which cap a run of [`racing_tracks`] puts at its edge.
#[derive(Clone, Copy, Debug)]
enum Cap {
    Triggers,
    PerNamespace,
    MetadataBytes,
}

/// A Redis trigger in engine mode, all of one size: 4 namespaces × 5
/// ScaledObjects × 2 lists, each list asked with two values of
/// `listLength` (an edit: the same metric, so one replaces the other).
/// Its source is a closed loopback port: what is tested is the driver's
/// bookkeeping, not a reading.
fn racing_key(namespace: usize, object: usize, list: usize, variant: usize) -> TriggerKey {
    let metadata = [
        ("scaler", "redis".to_string()),
        ("address", "127.0.0.1:1".to_string()),
        ("listName", format!("l{namespace}{object}{list}")),
        ("listLength", format!("{}", 5 + variant)),
        ("scalingMode", "engine".to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect();
    TriggerKey::new(format!("ns{namespace}"), format!("app{object}"), metadata)
}

/// Eight threads track the same 80 triggers at once, each in its own
/// order, through the whole of [`Driver::track`]; returns the driver, its
/// metrics and every refusal.
fn racing_tracks(
    cap: Cap,
) -> (
    tokio::runtime::Runtime,
    Driver,
    Arc<Metrics>,
    Vec<TrackError>,
) {
    const THREADS: usize = 8;
    let runtime = threaded_runtime();
    let candidates: Vec<TriggerKey> = (0..4)
        .flat_map(|n| {
            (0..5).flat_map(move |o| (0..2).flat_map(move |l| (0..2).map(move |v| (n, o, l, v))))
        })
        .map(|(n, o, l, v)| racing_key(n, o, l, v))
        .collect();
    let size = candidates[0].size();
    assert!(candidates.iter().all(|key| key.size() == size));
    let mut settings = unlimited();
    match cap {
        Cap::Triggers => settings.max_tracked_triggers = 7,
        Cap::PerNamespace => settings.max_tracked_triggers_per_namespace = 3,
        Cap::MetadataBytes => settings.max_tracked_metadata_bytes = 9 * size + size / 2,
    }
    let metrics = Arc::new(Metrics::new());
    let driver = {
        let _runtime = runtime.enter();
        Driver::new(
            settings,
            AuthProfiles::default(),
            metrics.clone(),
            CancellationToken::new(),
        )
    };
    let caller = trusted_caller();
    let start = std::sync::Barrier::new(THREADS);
    let refusals = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (driver, caller, start, candidates) = (&driver, &caller, &start, &candidates);
                let handle = runtime.handle().clone();
                scope.spawn(move || {
                    let _runtime = handle.enter();
                    start.wait();
                    let mut refusals = Vec::new();
                    for step in 0..candidates.len() {
                        // Each thread its own order: thread t walks the
                        // list from t·11 on, every third key.
                        let at = (thread * 11 + step * 3) % candidates.len();
                        if let Err(error) = driver.track(candidates[at].clone(), caller) {
                            refusals.push(error);
                        }
                    }
                    refusals
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    });
    (runtime, driver, metrics, refusals)
}

/// Calls racing each other at the edge of `limits.max_tracked_triggers`,
/// `limits.max_tracked_triggers_per_namespace` and
/// `limits.max_tracked_metadata_bytes` never end above them (they are
/// counted where the insert happens), and no refusal leaves anything
/// behind: every trigger is tracked with its poller and its engine, or
/// none of them exists.
#[test]
fn racing_tracks_never_end_above_a_cap_nor_half_done() {
    for cap in [Cap::Triggers, Cap::PerNamespace, Cap::MetadataBytes] {
        let (runtime, driver, metrics, refusals) = racing_tracks(cap);
        let tracked = driver.tracked();
        let size = racing_key(0, 0, 0, 0).size();
        let mut per_namespace: HashMap<&str, usize> = HashMap::new();
        for trigger in &tracked {
            *per_namespace.entry(&trigger.key.namespace).or_default() += 1;
        }
        match cap {
            Cap::Triggers => assert_eq!(tracked.len(), 7, "{cap:?}"),
            Cap::PerNamespace => {
                assert_eq!(per_namespace.len(), 4, "{cap:?}");
                assert!(per_namespace.values().all(|&n| n == 3), "{per_namespace:?}");
            }
            Cap::MetadataBytes => assert_eq!(tracked.len(), 9, "{cap:?}"),
        }
        assert!(!refusals.is_empty(), "{cap:?}: no call was refused");
        for refusal in &refusals {
            let expected = match cap {
                Cap::Triggers => matches!(refusal, TrackError::TooManyTriggers { .. }),
                Cap::PerNamespace => matches!(refusal, TrackError::TooManyInNamespace { .. }),
                Cap::MetadataBytes => matches!(refusal, TrackError::MetadataBudget { .. }),
            };
            assert!(expected, "{cap:?}: {refusal}");
        }
        // The counts kept beside the table agree with it.
        let state = driver.read_state();
        assert_eq!(state.tracked_metadata, tracked.len() * size, "{cap:?}");
        assert_eq!(metrics.tracked_triggers.get(), tracked.len() as i64);
        // One edit of a list at most: the other replaced it.
        let lists: std::collections::BTreeSet<&str> = tracked
            .iter()
            .map(|trigger| &*trigger.config.trigger.query.key)
            .collect();
        assert_eq!(
            lists.len(),
            tracked.len(),
            "{cap:?}: an edit and its original both tracked"
        );
        // Every tracked trigger has its poller, and no other poller runs.
        assert_eq!(state.pollers.len(), tracked.len(), "{cap:?}");
        assert_eq!(metrics.pollers.get(), tracked.len() as i64, "{cap:?}");
        // Every tracked trigger feeds its ScaledObject's engine, and no
        // engine runs for a ScaledObject with none.
        let objects: std::collections::BTreeSet<(String, String)> = tracked
            .iter()
            .map(|trigger| (trigger.key.namespace.clone(), trigger.key.name.clone()))
            .collect();
        assert_eq!(state.engines.values().count(), objects.len(), "{cap:?}");
        for trigger in &tracked {
            let engine = state
                .engines
                .get(&(trigger.key.namespace.clone(), trigger.key.name.clone()))
                .expect("its engine");
            assert!(Arc::ptr_eq(engine, trigger.scaling.as_ref().unwrap()));
            assert!(engine.has_trigger(&trigger.config.trigger.metric_name));
        }
        drop(state);
        drop(driver);
        runtime.shutdown_background();
    }
}

/// A trigger refused at a cap after its route was claimed (calls racing
/// past the first look at the cap, refused under the lock) leaves no claim
/// behind: the routes declared are those of the tracked triggers, and a
/// place given back lets another's route in.
#[test]
fn triggers_refused_at_a_cap_leave_no_route_claimed() {
    const THREADS: usize = 8;
    let runtime = threaded_runtime();
    let mut interceptor = crate::config::InterceptorSettings {
        enabled: true,
        http_listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    };
    interceptor
        .allowed_hosts
        .insert("*".into(), vec!["*.example".into()]);
    let bound = runtime
        .block_on(crate::interceptor::Interceptor::bind(
            &interceptor,
            Duration::from_secs(1),
        ))
        .unwrap();
    let traffic = crate::interceptor::traffic::Traffic::Local(bound.control().routes());
    let mut settings = unlimited();
    settings.max_tracked_triggers = 3;
    settings.routes = Some(crate::routing::RouteRules {
        interceptor,
        config_routes: Vec::new(),
    });
    settings.context.traffic = Some(traffic);
    let driver = {
        let _runtime = runtime.enter();
        Driver::new(
            settings,
            AuthProfiles::default(),
            Arc::new(Metrics::new()),
            CancellationToken::new(),
        )
    };
    let caller = trusted_caller();
    let web = |index: usize| {
        let name = format!("web{index}");
        let metadata = [
            ("scaler", "http".to_string()),
            ("host", format!("{name}.example")),
            ("upstream", format!("{name}:80")),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect();
        TriggerKey::new("default".into(), name, metadata)
    };
    let declared = |driver: &Driver| -> std::collections::BTreeSet<String> {
        let (routes, _) = driver.routes().unwrap().snapshot();
        routes.into_iter().map(|route| route.name).collect()
    };
    let start = std::sync::Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (driver, caller, start, web) = (&driver, &caller, &start, &web);
            let handle = runtime.handle().clone();
            scope.spawn(move || {
                let _runtime = handle.enter();
                start.wait();
                for step in 0..24 {
                    let _ = driver.track(web((thread * 5 + step) % 24), caller);
                }
            });
        }
    });
    let tracked: std::collections::BTreeSet<String> = driver
        .tracked()
        .iter()
        .map(|trigger| trigger.config.trigger.route.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(tracked.len(), 3);
    assert_eq!(
        declared(&driver),
        tracked,
        "a refused trigger's claim was left"
    );
    let gone = driver.tracked()[0].key.clone();
    driver.revoke(&[gone], "test");
    let newcomer = (0..24)
        .map(web)
        .find(|key| driver.lookup(key).unwrap().is_none())
        .unwrap();
    let route = {
        let _runtime = runtime.enter();
        driver
            .track(newcomer, &caller)
            .unwrap()
            .config
            .trigger
            .route
            .clone()
            .unwrap()
    };
    assert!(declared(&driver).contains(&route.name));
    assert_eq!(declared(&driver).len(), 3);
    drop(driver);
    runtime.shutdown_background();
}
