//! `scalingMode: engine` end to end: a real Redis, a real hoist server and
//! client, the engine deciding, `/status` and `hoist status` explaining.

mod support;

use std::time::Duration;

use hoist::proto::{GetMetricsRequest, ScaledObjectRef};
use hoist::status::Status;
use support::{Hoist, RedisServer, object};
use tokio_stream::StreamExt;

async fn reported(hoist: &Hoist, object: &ScaledObjectRef) -> (f64, bool) {
    let mut client = hoist.client().await;
    let metrics = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(object.clone()),
            metric_name: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let active = client
        .is_active(object.clone())
        .await
        .unwrap()
        .into_inner()
        .result;
    (metrics.metric_values[0].metric_value_float, active)
}

async fn status(hoist: &Hoist) -> Status {
    let (code, body) = hoist.get("/status").await;
    assert_eq!(code, 200);
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn the_engine_steps_up_explains_itself_and_scales_to_zero_after_the_cooldown() {
    let redis = RedisServer::start();
    let values: Vec<String> = (0..50).map(|i| i.to_string()).collect();
    let mut push = vec!["RPUSH", "jobs"];
    push.extend(values.iter().map(String::as_str));
    redis.command(&push);
    let hoist = Hoist::start_with(support::assuming_applied()).await;
    let worker = object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("listLength", "5"),
            ("scalingMode", "engine"),
            ("maxReplicaCount", "20"),
            ("pollingInterval", "1"),
            ("cooldownPeriod", "2"),
        ],
    );
    let mut stream = hoist
        .client()
        .await
        .stream_is_active(worker.clone())
        .await
        .unwrap()
        .into_inner();

    // GetMetrics reports replicas × target, so the HPA's ceil(value /
    // target) is the engine's count: 1, then 4, 8, 10 one poll apart.
    let (value, active) = reported(&hoist, &worker).await;
    assert_eq!((value, active), (5.0, true));
    let first = tokio::time::timeout(Duration::from_secs(3), stream.next())
        .await
        .unwrap();
    assert!(first.unwrap().unwrap().result, "pushed active at once");
    let mut seen = vec![1];
    for _ in 0..80 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let replicas = (reported(&hoist, &worker).await.0 / 5.0) as u32;
        if seen.last() != Some(&replicas) {
            seen.push(replicas);
        }
        if replicas == 10 {
            break;
        }
    }
    assert_eq!(seen, [1, 4, 8, 10]);

    let now = status(&hoist).await;
    let object = &now.scaled_objects[0];
    assert_eq!(
        (object.namespace.as_str(), object.name.as_str()),
        ("default", "worker")
    );
    assert_eq!(object.mode, "engine");
    assert_eq!(object.desired_replicas, Some(10));
    assert_eq!(object.current_replicas, Some(10));
    assert_eq!(object.triggers[0].value, Some(50.0));
    assert!(object.triggers[0].source.contains("jobs"));

    // `hoist status` prints the same as a table.
    let admin = format!("http://{}", hoist.admin);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hoist"))
            .args(["status", "--admin", &admin])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(table.starts_with("SCALEDOBJECT"), "{table}");
    assert!(
        table.contains("default/worker")
            && table.contains("engine")
            && table.contains("redis-jobs=50"),
        "{table}"
    );

    // Empty: the cooldown (2 s) runs, shown in /status, then zero.
    redis.command(&["DEL", "jobs"]);
    let mut cooling = false;
    for _ in 0..80 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let object = status(&hoist).await.scaled_objects.remove(0);
        if object.reason == "Cooldown" {
            assert!(object.cooldown_left_seconds.is_some_and(|left| left <= 2.0));
            assert_eq!(object.active, Some(true));
            cooling = true;
        }
        if object.desired_replicas == Some(0) {
            break;
        }
    }
    assert!(cooling, "the cooldown showed in /status");
    assert_eq!(reported(&hoist, &worker).await, (0.0, false));
}

#[tokio::test]
async fn engine_rule_keys_are_validated_and_an_edit_replaces_the_rules() {
    let redis = RedisServer::start();
    let hoist = Hoist::start_with(support::assuming_applied()).await;
    let mut client = hoist.client().await;
    let trigger = |list: &str, max: &str| {
        object(
            "worker",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", list),
                ("scalingMode", "engine"),
                ("maxReplicaCount", max),
            ],
        )
    };
    client.get_metric_spec(trigger("a", "10")).await.unwrap();
    client.get_metric_spec(trigger("b", "10")).await.unwrap();
    // The ScaledObject is edited: its triggers arrive with new metadata
    // one by one. Nothing is refused; the newest rules apply, and the
    // superseded trigger is dropped at once.
    client.get_metric_spec(trigger("a", "12")).await.unwrap();
    let worker = status(&hoist).await.scaled_objects.remove(0);
    assert_eq!(worker.triggers.len(), 2, "{worker:?}");

    let bad = hoist.spec_refused(&trigger("c", "none")).await;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(
        bad.message().contains("`maxReplicaCount`"),
        "{}",
        bad.message()
    );
    let zero_target = object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "d"),
            ("listLength", "0"),
            ("scalingMode", "engine"),
        ],
    );
    let bad = hoist.spec_refused(&zero_target).await;
    assert!(bad.message().contains("`listLength`"), "{}", bad.message());
}

#[tokio::test]
async fn engine_state_survives_a_restart_and_a_corrupt_file_is_ignored() {
    let redis = RedisServer::start();
    let values: Vec<String> = (0..50).map(|i| i.to_string()).collect();
    let mut push = vec!["RPUSH", "jobs"];
    push.extend(values.iter().map(String::as_str));
    redis.command(&push);
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("hoist-state.json");
    let settings = || hoist::config::Settings {
        state_file: Some(state_file.clone()),
        ..Default::default()
    };
    // The first run has nothing saved and no cluster: it assumes its
    // decisions are applied. Later runs count from the saved state alone.
    let assuming = || {
        let mut settings = settings();
        settings.engine.assume_applied = true;
        settings
    };
    let worker = object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("scalingMode", "engine"),
            ("maxReplicaCount", "20"),
            ("pollingInterval", "1"),
        ],
    );

    let first = Hoist::start_with(assuming()).await;
    let mut replicas = 0.0;
    for _ in 0..60 {
        replicas = reported(&first, &worker).await.0 / 5.0;
        if replicas >= 8.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(replicas, 8.0);
    first.stop().await.unwrap();
    let saved = std::fs::read_to_string(&state_file).unwrap();
    assert!(saved.contains("\"default/worker\""), "{saved}");

    // A new process continues from 8 (ACA's next step is 10), instead of
    // starting over at 1.
    let second = Hoist::start_with(settings()).await;
    assert_eq!(reported(&second, &worker).await.0, 50.0);
    second.stop().await.unwrap();

    std::fs::write(&state_file, "{ this is not state").unwrap();
    let third = Hoist::start_with(settings()).await;
    let refused = third.metric(&worker).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::Unavailable,
        "no saved state, no cluster: the count is unknown, never 1: {refused:?}"
    );
    assert!(
        refused.message().contains("engine.assume_applied"),
        "{refused:?}"
    );
    third.stop().await.unwrap();
    let saved = std::fs::read_to_string(&state_file).unwrap();
    assert!(saved.contains("\"version\": 1"), "rewritten");
    assert!(
        saved.contains("\"default/worker\"") && saved.contains("\"countKnown\": false"),
        "the third run saved its engine without a count: {saved}"
    );

    // That record holds no count: a fourth run does not compute from its
    // 0 (1, 4, 8 … for an app KEDA keeps at 10), it still answers
    // Unavailable.
    let fourth = Hoist::start_with(settings()).await;
    let refused = fourth.metric(&worker).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::Unavailable,
        "a record saved while the count was unknown restores no count: {refused:?}"
    );
    fourth.stop().await.unwrap();
}
