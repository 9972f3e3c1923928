//! Engine mode reading the cluster: the real replica count from the
//! target's `/scale`, the ScaledObject's own settings, Events, and
//! `Unavailable` whenever the count cannot be known. A real hoist, a real
//! `redis-server` as the source, and the Kubernetes API served from
//! loopback (see `support/kube_api.rs` for why it is a stand-in).

#[path = "support/kube_api.rs"]
mod kube_api;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use hoist::config::Settings;
use hoist::proto::ScaledObjectRef;
use hoist::status::Status;
use kube_api::{FakeApi, with_triggers};
use serde_json::json;
use support::{Hoist, RedisServer, eventually};

const LIMIT: Duration = Duration::from_secs(15);

async fn hoist_reading(api: &FakeApi) -> Hoist {
    let mut settings = Settings::default();
    settings.kubernetes.kubeconfig = Some(api.kubeconfig());
    settings.kubernetes.timeout = Duration::from_secs(2);
    Hoist::start_with(settings).await
}

/// An engine-mode Redis trigger of `namespace/name` (target 5 per replica).
fn engine_trigger(
    namespace: &str,
    name: &str,
    redis: &RedisServer,
    extra: &[(&str, &str)],
) -> ScaledObjectRef {
    let address = redis.address();
    let mut metadata: HashMap<String, String> = [
        ("scalerAddress", "hoist.keda:9090"),
        ("scaler", "redis"),
        ("address", address.as_str()),
        ("listName", name),
        ("listLength", "5"),
        ("scalingMode", "engine"),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    metadata
        .entry("pollingInterval".into())
        .or_insert("1".into());
    ScaledObjectRef {
        name: name.into(),
        namespace: namespace.into(),
        scaler_metadata: metadata,
    }
}

/// The engine's count as GetMetrics reports it (replicas × 5).
async fn replicas(hoist: &Hoist, object: &ScaledObjectRef) -> Result<f64, tonic::Status> {
    hoist.metric(object).await.map(|(_, value)| value / 5.0)
}

async fn replicas_become(hoist: &Hoist, object: &ScaledObjectRef, wanted: f64) {
    eventually(LIMIT, &format!("{wanted} replicas"), || async {
        matches!(replicas(hoist, object).await, Ok(value) if value == wanted)
    })
    .await;
}

/// Awaits `check` every 25 ms until it finds something.
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn status(hoist: &Hoist) -> Status {
    let (code, body) = hoist.get("/status").await;
    assert_eq!(code, 200);
    serde_json::from_str(&body).unwrap()
}

fn deployment_object(max: u32) -> serde_json::Value {
    json!({"scaleTargetRef": {"name": "worker"}, "maxReplicaCount": max})
}

/// ScaledObject `orders/worker` on a Deployment `worker` that runs
/// `running` replicas, KEDA's `maxReplicaCount` `keda_max`, `jobs` in its
/// list, and its engine-mode trigger (with `extra` metadata).
struct World {
    redis: RedisServer,
    api: FakeApi,
    hoist: Hoist,
    worker: ScaledObjectRef,
}

async fn world(jobs: usize, keda_max: u32, running: i64, extra: &[(&str, &str)]) -> World {
    let redis = RedisServer::start();
    redis.fill("worker", jobs);
    let api = FakeApi::start().await;
    let worker = engine_trigger("orders", "worker", &redis, extra);
    api.put_scaled_object(
        "orders",
        "worker",
        with_triggers(deployment_object(keda_max), &[&worker]),
    );
    api.set_scale("deployments", "orders", "worker", running, running);
    let hoist = hoist_reading(&api).await;
    World {
        redis,
        api,
        hoist,
        worker,
    }
}

#[tokio::test]
async fn a_restarted_hoist_keeps_the_count_that_runs() {
    let World {
        redis: _redis,
        api: _api,
        hoist,
        worker,
    } = world(20, 20, 10, &[]).await;

    // No state file from before, yet not 1 and not 4: the app runs 10,
    // and the scale-down window starts from what runs.
    replicas_become(&hoist, &worker, 10.0).await;
    let status = status(&hoist).await;
    let object = &status.scaled_objects[0];
    assert_eq!(object.reason, "ScaleDownStabilized", "{object:?}");
    assert_eq!(object.current_replicas, Some(10));
    let engine = object.engine.as_ref().unwrap();
    assert_eq!(engine.count_source.as_deref(), Some("cluster"));
    assert_eq!(engine.spec_replicas, Some(10));
    assert_eq!(
        engine.target.as_deref(),
        Some("Deployment worker (apps/v1)")
    );
    assert!(status.kubernetes.as_ref().unwrap().error.is_none());
}

#[tokio::test]
async fn a_restarted_hoist_does_not_send_an_idle_running_app_to_zero_at_once() {
    // Idle, 3 running, nothing saved: the engine cannot know when activity
    // ended, so its cooldown starts now instead of being over already.
    let World {
        redis: _redis,
        api: _api,
        hoist,
        worker,
    } = world(0, 20, 3, &[]).await;
    replicas_become(&hoist, &worker, 3.0).await;
    let status = status(&hoist).await;
    assert_eq!(status.scaled_objects[0].reason, "Cooldown", "{status:?}");
    assert!(status.scaled_objects[0].cooldown_left_seconds.unwrap() > 250.0);
}

#[tokio::test]
async fn the_engine_steps_from_the_count_the_hpa_holds_and_posts_its_rescales() {
    let World {
        redis,
        api,
        hoist,
        worker,
    } = world(50, 50, 11, &[("maxReplicaCount", "50")]).await;
    replicas_become(&hoist, &worker, 11.0).await;
    assert_eq!(
        status(&hoist).await.scaled_objects[0].reason,
        "WithinTolerance"
    );

    // Load quadruples: ACA's step-up doubles what runs (11 → 22), not a
    // count the engine imagined.
    redis.fill("worker", 200);
    replicas_become(&hoist, &worker, 22.0).await;
    eventually(LIMIT, "a rescale Event", || async {
        api.events().iter().any(|event| {
            event["reason"] == "SuccessfulRescale"
                && event["type"] == "Normal"
                && event["regarding"]["name"] == "worker"
                && event["regarding"]["kind"] == "ScaledObject"
                && event["note"].as_str().is_some_and(|note| {
                    note.starts_with("New size: 22;") && note.contains("was 11")
                })
        })
    })
    .await;
}

#[tokio::test]
async fn a_keda_maximum_below_the_engines_is_warned_about_and_the_real_count_followed() {
    let World {
        redis: _redis,
        api,
        hoist,
        worker,
    } = world(200, 8, 8, &[("maxReplicaCount", "20")]).await;

    // The engine asks for 16 (2 × 8); KEDA keeps the HPA at 8, so the
    // next step is again from 8: 16, never 20 or 32.
    replicas_become(&hoist, &worker, 16.0).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(replicas(&hoist, &worker).await.unwrap(), 16.0);
    let status = status(&hoist).await;
    let engine = status.scaled_objects[0].engine.clone().unwrap();
    assert!(
        engine
            .warnings
            .iter()
            .any(|w| w.contains("KEDA caps the HPA at spec.maxReplicaCount 8")),
        "{:?}",
        engine.warnings
    );
    assert_eq!(engine.settings["maxReplicaCount"].source, "metadata");
    assert_eq!(engine.settings["maxReplicaCount"].value, json!(20));
    eventually(LIMIT, "a warning Event", || async {
        api.events().iter().any(|event| {
            event["type"] == "Warning"
                && event["reason"] == "EngineLimitedByScaledObject"
                && event["note"]
                    .as_str()
                    .is_some_and(|note| note.contains("spec.maxReplicaCount 8"))
        })
    })
    .await;
}

#[tokio::test]
async fn a_manual_scale_is_where_the_next_step_starts() {
    let World {
        redis,
        api,
        hoist,
        worker,
    } = world(15, 50, 3, &[("maxReplicaCount", "50")]).await;
    replicas_become(&hoist, &worker, 3.0).await;

    // `kubectl scale --replicas 6`, then a burst: 2 × 6, not 2 × 3.
    api.set_scale("deployments", "orders", "worker", 6, 6);
    redis.fill("worker", 200);
    replicas_become(&hoist, &worker, 12.0).await;
}

#[tokio::test]
async fn an_outside_scale_is_seen_at_once_not_at_the_next_interval() {
    // 50 jobs at 5 each want 10, and 10 run; evaluated once a minute, and
    // the test waits at most LIMIT (15 s).
    let World {
        redis: _redis,
        api,
        hoist,
        worker,
    } = world(
        50,
        50,
        10,
        &[("maxReplicaCount", "50"), ("pollingInterval", "60")],
    )
    .await;
    replicas_become(&hoist, &worker, 10.0).await;
    let reads = api.scale_reads();
    // `kubectl scale --replicas 3`: the Deployment's generation moves and
    // the engine steps from 3 now (ACA: 3 → 6 → 10), so the HPA's next
    // sync does not take the answer computed from 10 and jump to 10.
    api.set_scale("deployments", "orders", "worker", 3, 3);
    replicas_become(&hoist, &worker, 6.0).await;
    assert!(api.scale_reads() > reads, "read again on the change");
}

#[tokio::test]
async fn an_edited_target_is_followed_at_once_and_its_outside_scales_too() {
    // 50 jobs at 5 each want 10; evaluated once a minute, and the test
    // waits at most LIMIT (15 s): every step below comes from the watch.
    let World {
        redis: _redis,
        api,
        hoist,
        worker,
    } = world(50, 50, 10, &[("pollingInterval", "60")]).await;
    replicas_become(&hoist, &worker, 10.0).await;

    // The ScaledObject now scales `worker-v2`, where 2 run: the engine
    // steps from 2 (ACA: 2 → 4), not from the 10 of the old target.
    api.set_scale("deployments", "orders", "worker-v2", 2, 2);
    let moved = json!({"scaleTargetRef": {"name": "worker-v2"}, "maxReplicaCount": 50});
    api.put_scaled_object("orders", "worker", with_triggers(moved, &[&worker]));
    replicas_become(&hoist, &worker, 4.0).await;

    // `kubectl scale` of the new target is an outside change of this
    // engine's; one of the old target is no longer.
    api.set_scale("deployments", "orders", "worker", 1, 1);
    api.set_scale("deployments", "orders", "worker-v2", 3, 3);
    replicas_become(&hoist, &worker, 6.0).await;

    // A lowered maximum (the ScaledObject's, the metadata writes none) is
    // taken at once, not a minute later.
    let lowered = json!({"scaleTargetRef": {"name": "worker-v2"}, "maxReplicaCount": 5});
    api.put_scaled_object("orders", "worker", with_triggers(lowered, &[&worker]));
    replicas_become(&hoist, &worker, 5.0).await;
}

#[tokio::test]
async fn statefulsets_and_custom_resources_are_counted_through_their_scale() {
    let redis = RedisServer::start();
    redis.fill("db", 25);
    redis.fill("widget", 35);
    let api = FakeApi::start().await;
    let db = engine_trigger("orders", "db", &redis, &[]);
    let widget = engine_trigger("orders", "widget", &redis, &[]);
    api.put_scaled_object(
        "orders",
        "db",
        with_triggers(
            json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}}),
            &[&db],
        ),
    );
    api.set_scale("statefulsets", "orders", "db", 5, 5);
    api.add_kind("example.com/v1", "Widget", "widgets");
    api.put_scaled_object(
        "orders",
        "widget",
        with_triggers(
            json!({"scaleTargetRef": {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w"}}),
            &[&widget],
        ),
    );
    api.set_scale("widgets", "orders", "w", 7, 7);
    let hoist = hoist_reading(&api).await;
    replicas_become(&hoist, &db, 5.0).await;
    replicas_become(&hoist, &widget, 7.0).await;
    let status = status(&hoist).await;
    let targets: Vec<_> = status
        .scaled_objects
        .iter()
        .map(|o| o.engine.as_ref().unwrap().target.clone().unwrap())
        .collect();
    assert_eq!(
        targets,
        ["StatefulSet db (apps/v1)", "Widget w (example.com/v1)"]
    );
}

#[tokio::test]
async fn with_the_api_down_the_last_count_serves_one_interval_then_unavailable() {
    let World {
        redis: _redis,
        api,
        hoist,
        worker,
    } = world(20, 20, 4, &[]).await;
    replicas_become(&hoist, &worker, 4.0).await;

    api.set_down(true);
    assert_eq!(
        replicas(&hoist, &worker).await.unwrap(),
        4.0,
        "the last known count, for now"
    );
    let refused = until("Unavailable", || async {
        replicas(&hoist, &worker).await.err()
    })
    .await;
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("replica count")
            && refused.message().contains("Deployment orders/worker"),
        "{refused:?}"
    );
    assert!(
        !hoist.active(&worker).await.is_ok_and(|active| !active),
        "never reported inactive"
    );

    api.set_down(false);
    replicas_become(&hoist, &worker, 4.0).await;
    // The Event posted while the API was down was lost with it: once the
    // count is known again, one says how long it was not.
    let note = until("the recovery Event", || async {
        api.events().into_iter().find_map(|event| {
            let note = event["note"].as_str()?.to_string();
            (event["reason"] == "ReplicaCountUnknown" && note.contains("was unknown for"))
                .then_some(note)
        })
    })
    .await;
    assert!(note.contains("known again, answering 4"), "{note}");
}

#[tokio::test]
async fn refused_by_rbac_the_status_says_what_to_grant() {
    let redis = RedisServer::start();
    redis.fill("worker", 20);
    let api = FakeApi::start().await;
    let worker = engine_trigger("orders", "worker", &redis, &[]);
    api.put_scaled_object(
        "orders",
        "worker",
        with_triggers(deployment_object(20), &[&worker]),
    );
    api.set_scale("deployments", "orders", "worker", 4, 4);
    api.forbid_scale(true);
    let hoist = hoist_reading(&api).await;
    let refused = until("a refusal", || async {
        replicas(&hoist, &worker).await.err()
    })
    .await;
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(refused.message().contains("403"), "{refused:?}");
    let status = status(&hoist).await;
    let engine = status.scaled_objects[0].engine.clone().unwrap();
    let error = engine.count_error.unwrap();
    assert!(
        error.contains("403") && error.contains("deployments/scale"),
        "{error}"
    );
    assert_eq!(status.scaled_objects[0].reason, "CountUnknown");
}

#[tokio::test]
async fn a_forbidden_scaledobject_watch_is_shown_and_nothing_is_guessed() {
    let redis = RedisServer::start();
    redis.fill("worker", 20);
    let api = FakeApi::start().await;
    api.forbid_list(true);
    let hoist = hoist_reading(&api).await;
    let worker = engine_trigger("orders", "worker", &redis, &[]);
    let error = until("the watch error in /status", || async {
        status(&hoist).await.kubernetes.and_then(|k| k.error)
    })
    .await;
    assert!(
        error.contains("403")
            && error.contains("ServiceAccount list/watch on scaledobjects.keda.sh"),
        "{error}"
    );
    assert_eq!(
        replicas(&hoist, &worker).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );
}

#[tokio::test]
async fn the_scaledobjects_own_settings_are_the_engines_defaults() {
    let redis = RedisServer::start();
    redis.fill("worker", 100); // wants 20
    redis.fill("feeder", 3);
    // No rule keys and no pollingInterval in the metadata.
    let mut worker = engine_trigger("orders", "worker", &redis, &[]);
    worker.scaler_metadata.remove("pollingInterval");
    let feeder = ScaledObjectRef {
        namespace: "orders".into(),
        ..support::object(
            "feeder",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "feeder"),
            ],
        )
    };
    let api = FakeApi::start().await;
    api.put_scaled_object(
        "orders",
        "worker",
        with_triggers(
            json!({
                "scaleTargetRef": {"name": "worker"},
                "minReplicaCount": 2,
                "maxReplicaCount": 6,
                "cooldownPeriod": 0,
                "pollingInterval": 1,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                    "scaleDown": {"stabilizationWindowSeconds": 0}
                }}},
            }),
            &[&worker],
        ),
    );
    api.put_scaled_object(
        "orders",
        "feeder",
        with_triggers(
            json!({"scaleTargetRef": {"name": "feeder"}, "pollingInterval": 2}),
            &[&feeder],
        ),
    );
    api.set_scale("deployments", "orders", "worker", 2, 2);
    let hoist = hoist_reading(&api).await;
    // From 2, the HPA's default scale-up (the ScaledObject's behavior has
    // no scaleUp) allows 2 + 4 at once; the ScaledObject caps at 6.
    replicas_become(&hoist, &worker, 6.0).await;
    assert_eq!(
        status(&hoist).await.scaled_objects[0].reason,
        "TooManyReplicas"
    );

    assert_eq!(hoist.metric(&feeder).await.unwrap().1, 3.0);

    let status = status(&hoist).await;
    let worker_status = status
        .scaled_objects
        .iter()
        .find(|o| o.name == "worker")
        .unwrap();
    let engine = worker_status.engine.as_ref().unwrap();
    for (key, value) in [
        ("minReplicaCount", json!(2)),
        ("maxReplicaCount", json!(6)),
        ("cooldownPeriod", json!(0)),
        ("pollingInterval", json!(1)),
    ] {
        assert_eq!(engine.settings[key].source, "scaledObject", "{key}");
        assert_eq!(engine.settings[key].value, value, "{key}");
    }
    assert_eq!(engine.settings["behavior"].source, "scaledObject");
    assert_eq!(engine.settings["fallback"].source, "default");
    assert!(
        engine.warnings.iter().all(|w| !w.contains("stabilization")),
        "a zero HPA window is no warning: {:?}",
        engine.warnings
    );
    let feeder_status = status
        .scaled_objects
        .iter()
        .find(|o| o.name == "feeder")
        .unwrap();
    assert_eq!(feeder_status.triggers[0].polling_interval_seconds, 2.0);
    assert_eq!(
        feeder_status.triggers[0].polling_interval_source,
        "scaledObject"
    );
}

#[tokio::test]
async fn the_api_is_asked_once_per_interval_however_often_keda_asks() {
    let World {
        redis: _redis,
        api,
        hoist,
        worker,
    } = world(20, 20, 4, &[("pollingInterval", "2")]).await;
    replicas_become(&hoist, &worker, 4.0).await;
    let before = api.scale_reads();
    let started = std::time::Instant::now();
    let mut calls = 0;
    while started.elapsed() < Duration::from_secs(5) {
        replicas(&hoist, &worker).await.unwrap();
        calls += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reads = api.scale_reads() - before;
    let intervals = started.elapsed().as_secs_f64() / 2.0;
    assert!(calls > 100, "{calls}");
    assert!(
        (reads as f64) <= intervals.ceil() + 1.0,
        "{reads} scale reads in {intervals:.1} intervals for {calls} RPCs"
    );
}

/// The API server takes the first lists of hoist's watches and never
/// answers (a lost connection, a wedged apiserver): every read has a
/// client-side timeout, so the lists are cut, asked again, and the
/// ScaledObject store fills; KEDA's call for its trigger is then checked
/// against it. Paused clock: a minute passes in no time.
#[tokio::test(start_paused = true)]
async fn a_first_list_that_is_never_answered_is_asked_again() {
    let api = FakeApi::start().await;
    let worker = support::object(
        "worker",
        &[
            ("scalerAddress", "hoist.keda:9090"),
            ("scaler", "redis"),
            ("address", "127.0.0.1:1"),
            ("listName", "jobs"),
        ],
    );
    api.put_scaled_object(
        "default",
        "worker",
        with_triggers(deployment_object(10), &[&worker]),
    );
    api.swallow(true);
    let hoist = hoist_reading(&api).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    api.swallow(false);
    // The store is still empty: the call cannot be checked yet.
    let refused = hoist.spec_refused(&worker).await;
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // Past the read timeout the lists are cut and asked again.
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert_eq!(hoist.spec(&worker).await.metric_name, "redis-jobs");
}
