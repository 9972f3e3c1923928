//! What surrounds the ExternalScaler API: gRPC health and reflection, the
//! admin listener.

mod support;

use hoist::proto::GetMetricsRequest;
use support::{Hoist, RedisServer, eventually, object};
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

#[tokio::test]
async fn grpc_health_reports_serving_then_not_serving_on_shutdown() {
    // Watch streams end at shutdown: they do not hold it for the grace.
    let settings = hoist::config::Settings {
        shutdown_grace: std::time::Duration::from_secs(600),
        ..Default::default()
    };
    let hoist = Hoist::start_with(settings).await;
    let mut health = HealthClient::new(hoist.channel().await);
    let mut watches = Vec::new();
    for service in ["", "externalscaler.ExternalScaler"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service `{service}`");
        let mut watch = health
            .watch(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            watch.next().await.unwrap().unwrap().status,
            ServingStatus::Serving as i32
        );
        watches.push((service, watch));
    }
    let stopping = tokio::spawn(hoist.stop());
    for (service, mut watch) in watches {
        let update = watch
            .next()
            .await
            .expect("an update before the stream ends")
            .unwrap();
        assert_eq!(
            update.status,
            ServingStatus::NotServing as i32,
            "service `{service}`"
        );
        assert!(watch.next().await.is_none(), "service `{service}`: ended");
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), stopping)
        .await
        .expect("shutdown does not wait out the grace")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn reflection_lists_the_services() {
    let hoist = Hoist::start().await;
    let mut reflection = ServerReflectionClient::new(hoist.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        responses.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"externalscaler.ExternalScaler".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
}

#[tokio::test]
async fn admin_endpoints_answer_and_metrics_cover_rpcs_triggers_and_polls() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "jobs", "a", "b", "c"]);
    let hoist = Hoist::start().await;
    assert_eq!(hoist.get("/healthz").await.0, 200);
    assert_eq!(hoist.get("/readyz").await.0, 200);
    assert_eq!(hoist.get("/nope").await.0, 404);

    let jobs = object(
        "orders",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    let mut client = hoist.client().await;
    client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(jobs.clone()),
            metric_name: String::new(),
        })
        .await
        .unwrap();
    client.is_active(jobs).await.unwrap();
    client.is_active(object("bad", &[])).await.unwrap_err();

    let (status, metrics) = hoist.get("/metrics").await;
    assert_eq!(status, 200);
    let value = format!(
        "hoist_trigger_value{{scaled_object_namespace=\"default\",scaled_object=\"orders\",scaler=\"redis\",metric=\"redis-jobs\",source=\"redis list `jobs` on {} db 0\"}} 3",
        redis.address()
    );
    for expected in [
        "hoist_grpc_requests_total{method=\"GetMetrics\",code=\"Ok\"} 1",
        "hoist_grpc_requests_total{method=\"IsActive\",code=\"Ok\"} 1",
        "hoist_grpc_requests_total{method=\"IsActive\",code=\"InvalidArgument\"} 1",
        "hoist_grpc_request_duration_seconds_count{method=\"GetMetrics\"} 1",
        &value,
        "hoist_poll_duration_seconds_count{scaler=\"redis\"} 1",
        "hoist_pollers 1",
        "hoist_tracked_triggers 1",
        "hoist_triggers_without_value 0",
        "hoist_push_triggers 0",
    ] {
        assert!(
            metrics.contains(expected),
            "missing `{expected}` in:\n{metrics}"
        );
    }

    // A trigger KEDA pushes to counts while its stream is open, and after
    // it closes for as long as the trigger stays tracked (within 6 h).
    let pushed = object(
        "pushed",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    let push_triggers = || async {
        let (_, metrics) = hoist.get("/metrics").await;
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("hoist_push_triggers "))
            .map(str::to_string)
    };
    let mut stream = client.stream_is_active(pushed).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    assert_eq!(push_triggers().await.as_deref(), Some("1"));
    drop(stream);
    eventually(
        std::time::Duration::from_secs(10),
        "the stream to close",
        || async {
            hoist
                .get("/metrics")
                .await
                .1
                .contains("hoist_open_streams 0")
        },
    )
    .await;
    assert_eq!(push_triggers().await.as_deref(), Some("1"));
}

#[tokio::test]
async fn limits_refuse_oversized_metadata_too_many_triggers_and_unlisted_sources() {
    let redis = RedisServer::start();
    let mut settings = hoist::config::Settings::default();
    settings.limits.max_metadata_bytes = 400;
    settings.limits.max_tracked_triggers = 2;
    settings.limits.allowed_sources = vec!["127.0.0.1:*".into(), "*.svc.cluster.local:6379".into()];
    let hoist = Hoist::start_with(settings).await;
    let mut client = hoist.client().await;
    let redis_on = |name: &str, address: &str| {
        object(
            name,
            &[
                ("scaler", "redis"),
                ("address", address),
                ("listName", "jobs"),
            ],
        )
    };

    client
        .get_metric_spec(redis_on("first", &redis.address()))
        .await
        .unwrap();

    let elsewhere = hoist
        .spec_refused(&redis_on("elsewhere", "redis.example.com:6379"))
        .await;
    assert_eq!(elsewhere.code(), tonic::Code::PermissionDenied);
    assert!(
        elsewhere.message().contains("redis.example.com:6379"),
        "{}",
        elsewhere.message()
    );

    let padding = "x".repeat(500);
    let mut large = redis_on("large", &redis.address());
    large.scaler_metadata.insert("note".into(), padding);
    let large = hoist.spec_refused(&large).await;
    assert_eq!(large.code(), tonic::Code::ResourceExhausted);
    assert!(
        large.message().contains("max_metadata_bytes"),
        "{}",
        large.message()
    );

    client
        .get_metric_spec(redis_on("second", &redis.address()))
        .await
        .unwrap();
    let third = hoist
        .spec_refused(&redis_on("third", &redis.address()))
        .await;
    assert_eq!(third.code(), tonic::Code::ResourceExhausted);
    assert!(
        third.message().contains("max_tracked_triggers"),
        "{}",
        third.message()
    );
    // Known triggers are still answered.
    client
        .get_metric_spec(redis_on("first", &redis.address()))
        .await
        .unwrap();
}
