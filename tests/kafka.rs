//! The Kafka trigger end to end: librdkafka's mock cluster in-process (a
//! real Kafka protocol peer), a real hoist server and client. With
//! `HOIST_TEST_KAFKA_BOOTSTRAP` set, one test also runs against that broker.

mod support;

use std::time::Duration;

use hoist::proto::ScaledObjectRef;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use support::{Hoist, object};
use tonic::Code;

/// Produces `count` messages into each listed partition.
fn produce(bootstrap: &str, topic: &str, per_partition: &[(i32, usize)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("a producer");
    for &(partition, count) in per_partition {
        for n in 0..count {
            let payload = format!("message {n}");
            producer
                .send(
                    BaseRecord::<(), _>::to(topic)
                        .partition(partition)
                        .payload(&payload),
                )
                .expect("queued");
        }
    }
    producer.flush(Duration::from_secs(10)).expect("delivered");
}

/// Commits offsets for `group` as its consumer would.
fn commit(bootstrap: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut list = TopicPartitionList::new();
    for &(partition, offset) in offsets {
        list.add_partition_offset(topic, partition, Offset::Offset(offset))
            .unwrap();
    }
    consumer.commit(&list, CommitMode::Sync).expect("committed");
}

async fn lag(hoist: &Hoist, object: &ScaledObjectRef) -> Result<f64, tonic::Status> {
    Ok(hoist.metric(object).await?.1)
}

async fn active(hoist: &Hoist, object: &ScaledObjectRef) -> bool {
    hoist.active(object).await.unwrap()
}

/// A trigger of group `workers` on `orders` (or `extra`'s topic; an
/// empty topic means every topic), with `extra` keys.
fn trigger<'a>(name: &'a str, bootstrap: &'a str, extra: &[(&'a str, &'a str)]) -> ScaledObjectRef {
    let mut metadata = vec![
        ("scaler", "kafka"),
        ("bootstrapServers", bootstrap),
        ("consumerGroup", "workers"),
    ];
    if !extra.iter().any(|(key, _)| *key == "topic") {
        metadata.push(("topic", "orders"));
    }
    metadata.extend(
        extra
            .iter()
            .filter(|(key, value)| *key != "topic" || !value.is_empty()),
    );
    object(name, &metadata)
}

/// `orders` has 4 partitions with 10 messages each; the group committed
/// p0 at 10, p1 at 5, p2 at 0 and nothing for p3.
fn orders_cluster() -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    String,
) {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("orders", 4, 1).unwrap();
    cluster.create_topic("audit", 2, 1).unwrap();
    produce(&bootstrap, "orders", &[(0, 10), (1, 10), (2, 10), (3, 10)]);
    produce(&bootstrap, "audit", &[(0, 7), (1, 3)]);
    commit(&bootstrap, "workers", "orders", &[(0, 10), (1, 5), (2, 0)]);
    (cluster, bootstrap)
}

#[tokio::test]
async fn lag_follows_kedas_arithmetic() {
    let (_cluster, bootstrap) = orders_cluster();
    let hoist = Hoist::start().await;
    let b = bootstrap.as_str();

    let plain = trigger("plain", b, &[]);
    let spec = hoist.spec(&plain).await;
    assert_eq!(spec.metric_name, "kafka-orders");
    assert_eq!(spec.target_size, 10);
    // p0 0 + p1 5 + p2 10 + p3 (no commit, latest) 1.
    assert_eq!(lag(&hoist, &plain).await.unwrap(), 16.0);
    assert!(active(&hoist, &plain).await);

    let cases: &[(&[(&str, &str)], f64)] = &[
        (&[("offsetResetPolicy", "earliest")], 25.0),
        (&[("scaleToZeroOnInvalidOffset", "true")], 15.0),
        (
            &[
                ("offsetResetPolicy", "earliest"),
                ("scaleToZeroOnInvalidOffset", "true"),
            ],
            15.0,
        ),
        // Capped at partitions × lagThreshold = 4 × 2.
        (&[("lagThreshold", "2")], 8.0),
        // KEDA's integer division: 16 / 5 = 3 is not above 4 partitions.
        (&[("lagThreshold", "5")], 16.0),
        (
            &[("lagThreshold", "2"), ("allowIdleConsumers", "true")],
            16.0,
        ),
        // Three partitions have lag: capped at 3 × 2.
        (
            &[("lagThreshold", "2"), ("limitToPartitionsWithLag", "true")],
            6.0,
        ),
        (&[("partitionLimitation", "0,1")], 5.0),
        (&[("partitionLimitation", "1-3")], 16.0),
        // 16 lag over 4 partitions with threshold 3: the smallest factor
        // of 4 whose consumers take it is 4 → 12 (then capped at 4 × 3).
        (
            &[
                ("lagThreshold", "3"),
                ("ensureEvenDistributionOfPartitions", "true"),
            ],
            12.0,
        ),
    ];
    for (index, (extra, expected)) in cases.iter().enumerate() {
        let name = format!("case-{index}");
        let object = trigger(&name, b, extra);
        assert_eq!(lag(&hoist, &object).await.unwrap(), *expected, "{extra:?}");
    }

    let quiet = trigger("quiet", b, &[("activationLagThreshold", "16")]);
    assert!(
        !active(&hoist, &quiet).await,
        "activation is strictly above the threshold"
    );
    let loud = trigger("loud", b, &[("activationLagThreshold", "15")]);
    assert!(active(&hoist, &loud).await);
}

#[tokio::test]
async fn without_a_topic_every_topic_the_group_committed_to_counts() {
    let (_cluster, bootstrap) = orders_cluster();
    let hoist = Hoist::start().await;
    let all = trigger("all-topics", &bootstrap, &[("topic", "")]);
    let spec = hoist.spec(&all).await;
    assert_eq!(spec.metric_name, "kafka-workers-topics");
    // `audit` has no commits from this group, so only `orders` counts.
    assert_eq!(lag(&hoist, &all).await.unwrap(), 16.0);

    commit(&bootstrap, "workers", "audit", &[(0, 2)]);
    let again = object(
        "all-topics-2",
        &[
            ("scaler", "kafka"),
            ("bootstrapServers", &bootstrap),
            ("consumerGroup", "workers"),
            ("allowIdleConsumers", "true"),
        ],
    );
    // audit: p0 7 - 2 = 5, p1 has no commit (latest) = 1.
    assert_eq!(lag(&hoist, &again).await.unwrap(), 22.0);
}

#[tokio::test]
async fn persistent_lag_is_excluded_from_the_value_but_keeps_the_trigger_active() {
    let (_cluster, bootstrap) = orders_cluster();
    let hoist = Hoist::start().await;
    let stuck = trigger(
        "stuck",
        &bootstrap,
        &[
            ("excludePersistentLag", "true"),
            ("pollingInterval", "1"),
            ("scaleToZeroOnInvalidOffset", "true"),
        ],
    );
    // First poll: every committed offset is new, so all lag counts.
    assert_eq!(lag(&hoist, &stuck).await.unwrap(), 15.0);
    // The group does not move: from the next poll on the lag is persistent.
    let mut value = 15.0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        value = lag(&hoist, &stuck).await.unwrap();
        if value == 0.0 {
            break;
        }
    }
    assert_eq!(value, 0.0);
    assert!(
        active(&hoist, &stuck).await,
        "persistent lag still counts as activity"
    );
}

#[tokio::test]
async fn a_consumer_group_that_really_consumes_brings_lag_down() {
    let (_cluster, bootstrap) = orders_cluster();
    let hoist = Hoist::start().await;
    let group = object(
        "real-group",
        &[
            ("scaler", "kafka"),
            ("bootstrapServers", &bootstrap),
            ("consumerGroup", "real"),
            ("topic", "orders"),
            ("offsetResetPolicy", "earliest"),
            ("pollingInterval", "1"),
        ],
    );
    assert_eq!(lag(&hoist, &group).await.unwrap(), 40.0);

    let consumed = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("group.id", "real")
                .set("auto.offset.reset", "earliest")
                .set("enable.auto.commit", "false")
                .create()
                .unwrap();
            consumer.subscribe(&["orders"]).unwrap();
            let mut seen = 0;
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while seen < 40 && std::time::Instant::now() < deadline {
                if let Some(Ok(_)) = consumer.poll(Duration::from_millis(200)) {
                    seen += 1;
                }
            }
            consumer.commit_consumer_state(CommitMode::Sync).unwrap();
            seen
        }
    })
    .await
    .unwrap();
    assert_eq!(consumed, 40);
    let mut value = 40.0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        value = lag(&hoist, &group).await.unwrap();
        if value == 0.0 {
            break;
        }
    }
    assert_eq!(value, 0.0);
    assert!(!active(&hoist, &group).await);
}

#[tokio::test]
async fn broker_loss_is_unavailable_and_recovers_when_it_returns() {
    let (cluster, bootstrap) = orders_cluster();
    let hoist = Hoist::start().await;
    let orders = trigger(
        "orders",
        &bootstrap,
        &[("pollingInterval", "1"), ("timeout", "2000")],
    );
    assert_eq!(lag(&hoist, &orders).await.unwrap(), 16.0);

    cluster.broker_down(-1).unwrap();
    let mut status = None;
    for _ in 0..150 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Err(error) = lag(&hoist, &orders).await {
            status = Some(error);
            break;
        }
    }
    let status = status.expect("an error while the broker is down");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("kafka group `workers`"),
        "{}",
        status.message()
    );

    cluster.broker_up(-1).unwrap();
    let mut recovered = false;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if lag(&hoist, &orders).await.ok() == Some(16.0) {
            recovered = true;
            break;
        }
    }
    assert!(recovered, "lag readable again after the broker returned");
}

#[tokio::test]
async fn bad_kafka_metadata_names_the_key() {
    let hoist = Hoist::start().await;
    let mut client = hoist.client().await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("scaler", "kafka"), ("consumerGroup", "g")],
            "`bootstrapServers`",
        ),
        (
            &[("scaler", "kafka"), ("bootstrapServers", "b:1")],
            "`consumerGroup`",
        ),
        (
            &[
                ("scaler", "kafka"),
                ("bootstrapServers", "b:1"),
                ("consumerGroup", "g"),
                ("lagThreshold", "0"),
            ],
            "`lagThreshold`",
        ),
        (
            &[
                ("scaler", "kafka"),
                ("bootstrapServers", "b:1"),
                ("consumerGroup", "g"),
                ("offsetResetPolicy", "oldest"),
            ],
            "`offsetResetPolicy`",
        ),
        (
            &[
                ("scaler", "kafka"),
                ("bootstrapServers", "b:1"),
                ("consumerGroup", "g"),
                ("topic", "t"),
                ("partitionLimitation", "1,x"),
            ],
            "`partitionLimitation`",
        ),
        (
            &[
                ("scaler", "kafka"),
                ("bootstrapServers", "b:1"),
                ("consumerGroup", "g"),
                ("sasl", "plaintext"),
            ],
            "`username`",
        ),
        (
            &[
                ("scaler", "kafka"),
                ("bootstrapServers", "b:1"),
                ("consumerGroup", "g"),
                ("limitToPartitionsWithLag", "true"),
            ],
            "`topic`",
        ),
    ];
    for (metadata, key) in cases {
        let status = client
            .get_metric_spec(object("bad", metadata))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{metadata:?}");
        assert!(
            status.message().contains(key),
            "{metadata:?}: {}",
            status.message()
        );
    }
}

#[tokio::test]
async fn against_a_real_broker_when_one_is_given() {
    let Ok(bootstrap) = std::env::var("HOIST_TEST_KAFKA_BOOTSTRAP") else {
        eprintln!("skipped: set HOIST_TEST_KAFKA_BOOTSTRAP=host:port to run against a real broker");
        return;
    };
    let topic = format!("hoist-test-{}", std::process::id());
    produce(&bootstrap, &topic, &[(0, 5)]);
    let hoist = Hoist::start().await;
    let real = object(
        "real-broker",
        &[
            ("scaler", "kafka"),
            ("bootstrapServers", &bootstrap),
            ("consumerGroup", "hoist-test"),
            ("topic", &topic),
            ("offsetResetPolicy", "earliest"),
        ],
    );
    assert_eq!(lag(&hoist, &real).await.unwrap(), 5.0);

    // Messages of a transaction still open count, as in KEDA (the high
    // watermark, not the last stable offset). The mock cluster has no
    // last stable offset, so only a real broker shows this.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set(
            "transactional.id",
            format!("hoist-test-{}", std::process::id()),
        )
        .create()
        .expect("a transactional producer");
    producer.init_transactions(Duration::from_secs(10)).unwrap();
    producer.begin_transaction().unwrap();
    for n in 0..3 {
        let payload = format!("open {n}");
        producer
            .send(
                BaseRecord::<(), _>::to(&topic)
                    .partition(0)
                    .payload(&payload),
            )
            .expect("queued");
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let open = object(
        "real-broker-open-transaction",
        &[
            ("scaler", "kafka"),
            ("bootstrapServers", &bootstrap),
            ("consumerGroup", "hoist-test"),
            ("topic", &topic),
            ("offsetResetPolicy", "earliest"),
        ],
    );
    assert_eq!(lag(&hoist, &open).await.unwrap(), 8.0);
    producer.abort_transaction(Duration::from_secs(10)).unwrap();
}

#[tokio::test]
async fn a_thousand_partitions_are_read_in_one_poll() {
    let cluster = MockCluster::new(3).expect("a mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("wide", 1000, 1).unwrap();
    let partitions: Vec<(i32, usize)> = (0..1000)
        .map(|p| (p, if p % 2 == 0 { 3 } else { 1 }))
        .collect();
    produce(&bootstrap, "wide", &partitions);
    let committed: Vec<(i32, i64)> = (0..1000).map(|p| (p, 1)).collect();
    commit(&bootstrap, "wide-group", "wide", &committed);
    let hoist = Hoist::start().await;
    let wide = object(
        "wide",
        &[
            ("scaler", "kafka"),
            ("bootstrapServers", &bootstrap),
            ("consumerGroup", "wide-group"),
            ("topic", "wide"),
            ("timeout", "10000"),
        ],
    );
    // 500 even partitions are 2 behind, 500 odd ones are caught up.
    assert_eq!(lag(&hoist, &wide).await.unwrap(), 1000.0);
}

/// Without a topic, a topic the group never consumed cannot fail the
/// poll, even when the cluster reports an error for it; with that topic
/// named, its error fails the poll, as in KEDA.
#[tokio::test]
async fn without_a_topic_other_topics_errors_do_not_fail_the_poll() {
    let (cluster, bootstrap) = orders_cluster();
    cluster.create_topic("broken", 2, 1).unwrap();
    cluster
        .topic_error(
            "broken",
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let hoist = Hoist::start().await;
    let all = trigger("all-topics", &bootstrap, &[("topic", "")]);
    assert_eq!(lag(&hoist, &all).await.unwrap(), 16.0);

    let broken = trigger("broken", &bootstrap, &[("topic", "broken")]);
    let error = lag(&hoist, &broken).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable);
    assert!(error.message().contains("broken"), "{}", error.message());
}

/// The token endpoint side of `sasl: oauthbearer`: librdkafka (built with
/// curl) asks the endpoint for a client-credentials token with the
/// trigger's client ID, secret, scopes. The mock cluster speaks no SASL, so
/// the poll itself fails; the secret and the token never show.
#[tokio::test]
async fn oauthbearer_fetches_a_client_credentials_token_from_the_endpoint() {
    use std::sync::{Arc, Mutex};

    use axum::http::HeaderMap;
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use hoist::config::{AuthProfile, AuthValue, Settings};

    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = format!(r#"{{"sub":"hoist","iat":{now},"exp":{}}}"#, now + 3600);
    let token = format!(
        "{}.{}.c2lnbmF0dXJl",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let app = axum::Router::new().route(
        "/token",
        axum::routing::post({
            let seen = seen.clone();
            let token = token.clone();
            move |headers: HeaderMap, body: String| async move {
                let authorization = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                seen.lock().unwrap().push((authorization, body));
                axum::Json(serde_json::json!({
                    "access_token": token,
                    "token_type": "bearer",
                    "expires_in": 3600,
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/token", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let (_cluster, bootstrap) = orders_cluster();
    let mut settings = Settings::default();
    let literal = |v: &str| AuthValue::Literal(v.into());
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        "oauth".into(),
        AuthProfile::new(
            &["default"],
            [
                ("sasl".to_string(), literal("oauthbearer")),
                ("username".to_string(), literal("client-id")),
                ("password".to_string(), literal("client-secret-value")),
                ("oauthTokenEndpointUri".to_string(), literal(&endpoint)),
                ("scopes".to_string(), literal("kafka,read")),
            ],
        ),
    );
    let hoist = Hoist::start_with(settings).await;
    let object = trigger("oauth", &bootstrap, &[("authRef", "oauth")]);
    let status = lag(&hoist, &object).await;

    support::eventually(Duration::from_secs(15), "a token request", || async {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    let (authorization, body) = seen.lock().unwrap()[0].clone();
    assert_eq!(
        authorization,
        format!("Basic {}", STANDARD.encode("client-id:client-secret-value"))
    );
    assert!(body.contains("grant_type=client_credentials"), "{body}");
    assert!(body.contains("scope=kafka"), "{body}");

    let (_, metrics) = hoist.get("/metrics").await;
    let message = status
        .err()
        .map(|s| s.message().to_string())
        .unwrap_or_default();
    for text in [message.as_str(), metrics.as_str()] {
        assert!(!text.contains("client-secret-value"), "{text}");
        assert!(!text.contains(&token), "{text}");
    }
}
