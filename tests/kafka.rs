//! The Kafka trigger end to end against a real broker: Apache Kafka 4.1
//! (KRaft, one node) started once for this binary by `scripts/kafka.sh`
//! (tests/support/kafka.rs), a real hoist server and client. Each test has
//! topics and groups of its own.
//!
//! librdkafka's mock cluster stays only where the real broker cannot do
//! what the test needs here; each such test says why.

#[path = "support/kafka.rs"]
mod kafka_broker;
mod support;

use std::time::Duration;

use hoist::config::{AuthProfile, AuthValue, Settings};
use hoist::proto::ScaledObjectRef;
use kafka_broker::{broker, commit, offset_list, produce};
use rdkafka::ClientConfig;
use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use support::{Hoist, object};
use tonic::Code;

async fn lag(hoist: &Hoist, object: &ScaledObjectRef) -> Result<f64, tonic::Status> {
    Ok(hoist.metric(object).await?.1)
}

async fn active(hoist: &Hoist, object: &ScaledObjectRef) -> bool {
    hoist.active(object).await.unwrap()
}

/// Polls `object` (whose `pollingInterval` is 1) until its lag is `wanted`;
/// the last lag seen otherwise.
async fn lag_becomes(hoist: &Hoist, object: &ScaledObjectRef, wanted: f64) -> f64 {
    let mut value = f64::NAN;
    for _ in 0..100 {
        value = lag(hoist, object).await.unwrap_or(f64::NAN);
        if value == wanted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    value
}

/// A trigger of `group` on `topic` (empty: every topic) of `bootstrap`,
/// with `extra` keys.
fn trigger(
    name: &str,
    bootstrap: &str,
    group: &str,
    topic: &str,
    extra: &[(&str, &str)],
) -> ScaledObjectRef {
    let mut metadata = vec![
        ("scaler", "kafka"),
        ("bootstrapServers", bootstrap),
        ("consumerGroup", group),
    ];
    if !topic.is_empty() {
        metadata.push(("topic", topic));
    }
    metadata.extend(extra);
    object(name, &metadata)
}

/// `topic` with 4 partitions of 10 messages each, and `group` committed
/// at p0 10, p1 5, p2 0, nothing for p3.
async fn orders(topic: &str, group: &str) -> &'static str {
    let broker = broker();
    broker.create_topic(topic, 4).await;
    broker.produce(topic, &[(0, 10), (1, 10), (2, 10), (3, 10)]);
    broker.commit(group, topic, &[(0, 10), (1, 5), (2, 0)]);
    &broker.plaintext
}

#[tokio::test]
async fn lag_follows_kedas_arithmetic() {
    let b = orders("arithmetic", "workers").await;
    let hoist = Hoist::start().await;
    let plain = trigger("plain", b, "workers", "arithmetic", &[]);
    let spec = hoist.spec(&plain).await;
    assert_eq!(spec.metric_name, "kafka-arithmetic");
    assert_eq!(spec.target_size, 10);
    // Partial commits: p0 0 + p1 5 + p2 10 + p3 (never committed, latest) 1.
    assert_eq!(lag(&hoist, &plain).await.unwrap(), 16.0);
    assert!(active(&hoist, &plain).await);

    let cases: &[(&[(&str, &str)], f64)] = &[
        // Never committed, earliest: p3's whole retained log.
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
        // Three partitions have lag (p3's 1 counts, as in KEDA): 3 × 2.
        (
            &[("lagThreshold", "2"), ("limitToPartitionsWithLag", "true")],
            6.0,
        ),
        (&[("partitionLimitation", "0,1")], 5.0),
        (&[("partitionLimitation", "1-3")], 16.0),
        // 16 over 4 partitions at 3 each: the smallest factor of 4 whose
        // consumers take it is 4 → 12.
        (
            &[
                ("lagThreshold", "3"),
                ("ensureEvenDistributionOfPartitions", "true"),
            ],
            12.0,
        ),
    ];
    for (index, (extra, expected)) in cases.iter().enumerate() {
        let object = trigger(&format!("case-{index}"), b, "workers", "arithmetic", extra);
        assert_eq!(lag(&hoist, &object).await.unwrap(), *expected, "{extra:?}");
    }

    let quiet = trigger(
        "quiet",
        b,
        "workers",
        "arithmetic",
        &[("activationLagThreshold", "16")],
    );
    assert!(
        !active(&hoist, &quiet).await,
        "activation is strictly above the threshold"
    );
    let loud = trigger(
        "loud",
        b,
        "workers",
        "arithmetic",
        &[("activationLagThreshold", "15")],
    );
    assert!(active(&hoist, &loud).await);
}

/// kedacore/keda#5880: `limitToPartitionsWithLag` keeps replicas to the
/// partitions that have lag, here one of four.
#[tokio::test]
async fn limit_to_partitions_with_lag_caps_at_the_partitions_behind() {
    let broker = broker();
    broker.create_topic("uneven", 4).await;
    broker.produce("uneven", &[(0, 100), (1, 5), (2, 5), (3, 5)]);
    broker.commit("uneven-group", "uneven", &[(0, 0), (1, 5), (2, 5), (3, 5)]);
    let hoist = Hoist::start().await;
    let b = broker.plaintext.as_str();
    let limited = trigger(
        "limited",
        b,
        "uneven-group",
        "uneven",
        &[("limitToPartitionsWithLag", "true")],
    );
    assert_eq!(
        lag(&hoist, &limited).await.unwrap(),
        10.0,
        "1 partition × 10"
    );
    let capped = trigger("capped", b, "uneven-group", "uneven", &[]);
    assert_eq!(
        lag(&hoist, &capped).await.unwrap(),
        40.0,
        "4 partitions × 10"
    );
    let idle = trigger(
        "idle",
        b,
        "uneven-group",
        "uneven",
        &[("allowIdleConsumers", "true")],
    );
    assert_eq!(lag(&hoist, &idle).await.unwrap(), 100.0);
}

/// kedacore/keda#7936, as KEDA 2.21 fixed it: a partition never committed
/// with `earliest` counts what a consumer could still fetch, from the log
/// start retention (here DeleteRecords) moved, not every offset ever
/// written.
#[tokio::test]
async fn earliest_counts_from_the_log_start_retention_left() {
    let broker = broker();
    broker.create_topic("retained", 3).await;
    broker.produce("retained", &[(0, 10), (1, 10), (2, 10)]);
    broker.commit("retained-group", "retained", &[(0, 4)]);
    broker.delete_records("retained", &[(1, 7), (2, 10)]).await;
    let hoist = Hoist::start().await;
    let earliest = trigger(
        "retained",
        &broker.plaintext,
        "retained-group",
        "retained",
        &[
            ("offsetResetPolicy", "earliest"),
            ("allowIdleConsumers", "true"),
        ],
    );
    // p0 committed: 10 - 4; p1 retained 10 - 7; p2 retention emptied: 0.
    assert_eq!(lag(&hoist, &earliest).await.unwrap(), 9.0);
    let latest = trigger(
        "retained-latest",
        &broker.plaintext,
        "retained-group",
        "retained",
        &[("allowIdleConsumers", "true")],
    );
    assert_eq!(lag(&hoist, &latest).await.unwrap(), 8.0, "6 + 1 + 1");
}

/// Without a topic, KEDA lists the group's committed offsets and counts
/// those topics; a group that committed nothing has no lag (where KEDA
/// 2.21 describes every topic of the cluster: kedacore/keda#8114).
#[tokio::test]
async fn without_a_topic_only_the_topics_the_group_committed_to_count() {
    let broker = broker();
    broker.create_topic("all-orders", 4).await;
    broker.create_topic("all-audit", 2).await;
    broker.produce("all-orders", &[(0, 10), (1, 10), (2, 10), (3, 10)]);
    broker.produce("all-audit", &[(0, 7), (1, 3)]);
    broker.commit("all-workers", "all-orders", &[(0, 10), (1, 5), (2, 0)]);
    let hoist = Hoist::start().await;
    let b = broker.plaintext.as_str();
    let all = trigger("all", b, "all-workers", "", &[("pollingInterval", "1")]);
    assert_eq!(
        hoist.spec(&all).await.metric_name,
        "kafka-all-workers-topics"
    );
    assert_eq!(
        lag(&hoist, &all).await.unwrap(),
        16.0,
        "all-audit is not the group's"
    );

    broker.commit("all-workers", "all-audit", &[(0, 2)]);
    // all-audit: p0 7 - 2, p1 never committed (latest) 1.
    assert_eq!(lag_becomes(&hoist, &all, 22.0).await, 22.0);

    let nothing = trigger("nothing", b, "never-committed", "", &[]);
    assert_eq!(lag(&hoist, &nothing).await.unwrap(), 0.0);
    assert!(!active(&hoist, &nothing).await);
}

/// `excludePersistentLag`: a committed offset that did not move since the
/// last poll is left out of the value but still counts as activity; so is
/// a partition with no committed offset at two polls in a row
/// (kedacore/keda#5274, #5906: KEDA never leaves those out).
#[tokio::test]
async fn persistent_lag_is_excluded_from_the_value_but_keeps_the_trigger_active() {
    let b = orders("persistent", "stuck").await;
    let hoist = Hoist::start().await;
    let stuck = trigger(
        "stuck",
        b,
        "stuck",
        "persistent",
        &[("excludePersistentLag", "true"), ("pollingInterval", "1")],
    );
    // First poll: every committed offset is new, so all lag counts.
    assert_eq!(lag(&hoist, &stuck).await.unwrap(), 16.0);
    // Nobody consumes: from the next poll on every partition's lag is
    // persistent, p3's (never committed) too.
    assert_eq!(lag_becomes(&hoist, &stuck, 0.0).await, 0.0);
    assert!(
        active(&hoist, &stuck).await,
        "persistent lag still counts as activity"
    );
    // The group moves on p1: its remaining lag counts again, once.
    broker().commit("stuck", "persistent", &[(1, 8)]);
    assert_eq!(lag_becomes(&hoist, &stuck, 2.0).await, 2.0);
}

/// A consumer group that really consumes, on the classic protocol and on
/// the new one (KIP-848, `group.protocol=consumer`), brings lag to zero;
/// hoist reads the offsets while the group's member is alive.
#[tokio::test]
async fn consuming_groups_classic_and_kip_848_bring_lag_down() {
    let broker = broker();
    broker.create_topic("consumed", 4).await;
    broker.produce("consumed", &[(0, 10), (1, 10), (2, 10), (3, 10)]);
    let hoist = Hoist::start().await;
    for protocol in ["classic", "consumer"] {
        let group = format!("consumed-{protocol}");
        let object = trigger(
            &group,
            &broker.plaintext,
            &group,
            "consumed",
            &[("offsetResetPolicy", "earliest"), ("pollingInterval", "1")],
        );
        // A new group's first OffsetFetch may meet a coordinator still
        // loading (NOT_COORDINATOR): that poll fails, the next one reads.
        assert_eq!(lag_becomes(&hoist, &object, 40.0).await, 40.0, "{protocol}");
        let bootstrap = broker.plaintext.clone();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let consumer = std::thread::spawn(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("group.id", &group)
                .set("group.protocol", protocol)
                .set("auto.offset.reset", "earliest")
                .set("enable.auto.commit", "false")
                .create()
                .unwrap();
            consumer.subscribe(&["consumed"]).unwrap();
            let mut seen = 0;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while stopped.try_recv().is_err() && std::time::Instant::now() < deadline {
                if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
                    seen += 1;
                    if seen == 40 {
                        consumer.commit_consumer_state(CommitMode::Sync).unwrap();
                    }
                }
            }
            seen
        });
        assert_eq!(lag_becomes(&hoist, &object, 0.0).await, 0.0, "{protocol}");
        assert!(!active(&hoist, &object).await, "{protocol}");
        stop.send(()).unwrap();
        assert_eq!(consumer.join().unwrap(), 40, "{protocol}");
    }
}

/// Transactions: messages of an open transaction count (KEDA reads the
/// high watermark, not the last stable offset). After the commit, its
/// marker holds an offset no consumer reads: a consumer that commits its
/// position (librdkafka's, past the marker) leaves no lag, and one that
/// commits the offset after its last message leaves 1, as in KEDA
/// (kedacore/keda#5675).
#[tokio::test]
async fn transaction_markers_and_open_transactions() {
    let broker = broker();
    broker.create_topic("transactional", 1).await;
    let hoist = Hoist::start().await;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.plaintext)
        .set("transactional.id", "hoist-test-transactions")
        .create()
        .expect("a transactional producer");
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    for n in 0..3 {
        let payload = format!("in transaction {n}");
        producer
            .send(
                BaseRecord::<(), _>::to("transactional")
                    .partition(0)
                    .payload(&payload),
            )
            .expect("queued");
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let open = trigger(
        "open",
        &broker.plaintext,
        "transactions",
        "transactional",
        &[("offsetResetPolicy", "earliest"), ("pollingInterval", "1")],
    );
    assert_eq!(
        lag(&hoist, &open).await.unwrap(),
        3.0,
        "an open transaction counts"
    );
    producer
        .commit_transaction(Duration::from_secs(30))
        .unwrap();
    // Three messages and the commit marker.
    assert_eq!(lag_becomes(&hoist, &open, 4.0).await, 4.0);

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &broker.plaintext)
        .set("group.id", "transactions")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    consumer.subscribe(&["transactional"]).unwrap();
    let mut last = -1;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while last < 2 && std::time::Instant::now() < deadline {
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
            last = rdkafka::Message::offset(&message);
        }
    }
    assert_eq!(last, 2, "three messages read");
    // The offset after the last message: the marker is left as lag.
    consumer
        .commit(
            &offset_list("transactional", &[(0, last + 1)]),
            CommitMode::Sync,
        )
        .unwrap();
    assert_eq!(lag_becomes(&hoist, &open, 1.0).await, 1.0);
    // The consumer's own position, once it has fetched past the marker.
    let mut position = 0;
    for _ in 0..50 {
        let _ = consumer.poll(Duration::from_millis(100));
        position = match consumer.position().unwrap().elements()[0].offset() {
            Offset::Offset(offset) => offset,
            _ => 0,
        };
        if position == 4 {
            break;
        }
    }
    assert_eq!(position, 4, "librdkafka's position skips the marker");
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    assert_eq!(lag_becomes(&hoist, &open, 0.0).await, 0.0);
}

/// Partitions added to a tracked topic count from the next poll.
#[tokio::test]
async fn partitions_added_while_tracked_count() {
    let broker = broker();
    broker.create_topic("growing", 2).await;
    broker.produce("growing", &[(0, 5), (1, 5)]);
    broker.commit("growing-group", "growing", &[(0, 5), (1, 5)]);
    let hoist = Hoist::start().await;
    let growing = trigger(
        "growing",
        &broker.plaintext,
        "growing-group",
        "growing",
        &[("offsetResetPolicy", "earliest"), ("pollingInterval", "1")],
    );
    assert_eq!(lag(&hoist, &growing).await.unwrap(), 0.0);
    broker.add_partitions("growing", 4).await;
    broker.produce("growing", &[(2, 6), (3, 1)]);
    assert_eq!(lag_becomes(&hoist, &growing, 7.0).await, 7.0);
}

/// An auth profile named by `authRef`, lent to the `default` namespace.
fn profile(settings: &mut Settings, name: &str, params: &[(&str, &str)]) {
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        name.into(),
        AuthProfile::new(
            &["default"],
            params
                .iter()
                .map(|(k, v)| (k.to_string(), AuthValue::Literal(v.to_string()))),
        ),
    );
}

/// SASL/PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 on the broker's SASL
/// listener, TLS with a client certificate, and SCRAM over TLS; a wrong
/// password is refused, and the secrets reach neither the error nor
/// `/metrics`.
#[tokio::test]
async fn sasl_and_tls_against_the_brokers_listeners() {
    let broker = broker();
    broker.create_topic("secured", 1).await;
    broker.produce("secured", &[(0, 3)]);
    let (ca, cert, key) = (
        broker.pem("ca.crt"),
        broker.pem("client.crt"),
        broker.pem("client.key"),
    );
    let user = broker.user.as_str();
    let password = broker.password.as_str();
    let mut settings = Settings::default();
    for (name, sasl) in [
        ("plain", "plaintext"),
        ("scram256", "scram_sha256"),
        ("scram512", "scram_sha512"),
    ] {
        profile(
            &mut settings,
            name,
            &[("sasl", sasl), ("username", user), ("password", password)],
        );
    }
    profile(
        &mut settings,
        "tls",
        &[
            ("tls", "enable"),
            ("ca", &ca),
            ("cert", &cert),
            ("key", &key),
        ],
    );
    profile(
        &mut settings,
        "scram-tls",
        &[
            ("sasl", "scram_sha512"),
            ("username", user),
            ("password", password),
            ("tls", "enable"),
            ("ca", &ca),
        ],
    );
    profile(
        &mut settings,
        "wrong",
        &[
            ("sasl", "scram_sha512"),
            ("username", user),
            ("password", "not-the-password"),
        ],
    );
    let hoist = Hoist::start_with(settings).await;
    let earliest = ("offsetResetPolicy", "earliest");
    for (profile, address) in [
        ("plain", &broker.sasl),
        ("scram256", &broker.sasl),
        ("scram512", &broker.sasl),
        ("tls", &broker.tls),
        ("scram-tls", &broker.sasl_tls),
    ] {
        let object = trigger(
            profile,
            address,
            "secured-group",
            "secured",
            &[("authRef", profile), earliest],
        );
        let value = lag(&hoist, &object).await;
        assert_eq!(
            value.map_err(|e| e.message().to_string()),
            Ok(3.0),
            "{profile}"
        );
    }
    let wrong = trigger(
        "wrong",
        &broker.sasl,
        "secured-group",
        "secured",
        &[("authRef", "wrong"), earliest, ("timeout", "5000")],
    );
    let error = lag(&hoist, &wrong).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{}", error.message());
    let (_, metrics) = hoist.get("/metrics").await;
    for text in [error.message(), metrics.as_str()] {
        assert!(!text.contains(password), "{text}");
        assert!(!text.contains("not-the-password"), "{text}");
    }
    // Without its client certificate the TLS listener refuses hoist.
    let mut bare = Settings::default();
    profile(&mut bare, "tls-bare", &[("tls", "enable"), ("ca", &ca)]);
    let hoist = Hoist::start_with(bare).await;
    let refused = trigger(
        "tls-bare",
        &broker.tls,
        "secured-group",
        "secured",
        &[("authRef", "tls-bare"), ("timeout", "5000")],
    );
    assert!(lag(&hoist, &refused).await.is_err());
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

/// Mock cluster: the broker vanishes mid-run and comes back, which the
/// mock does on demand (`broker_down`/`broker_up`) and a real broker here
/// cannot without stopping every other test of this binary.
#[tokio::test]
async fn broker_loss_is_unavailable_and_recovers_when_it_returns() {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("orders", 4, 1).unwrap();
    produce(&bootstrap, "orders", &[(0, 10), (1, 10), (2, 10), (3, 10)]);
    commit(&bootstrap, "workers", "orders", &[(0, 10), (1, 5), (2, 0)]);
    let hoist = Hoist::start().await;
    let orders = trigger(
        "orders",
        &bootstrap,
        "workers",
        "orders",
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

/// Mock cluster: a thousand partitions led by three brokers, read in one
/// poll (one ListOffsets per leader); the real broker here is one node.
#[tokio::test]
async fn a_thousand_partitions_on_three_brokers_are_read_in_one_poll() {
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
    let wide = trigger(
        "wide",
        &bootstrap,
        "wide-group",
        "wide",
        &[("timeout", "10000")],
    );
    // 500 even partitions are 2 behind, 500 odd ones are caught up.
    assert_eq!(lag(&hoist, &wide).await.unwrap(), 1000.0);
}

/// Mock cluster: an error injected for one topic (`topic_error`), which a
/// real broker gives only with ACLs this single-node setup does not
/// configure. Without a topic, a topic the group never consumed cannot
/// fail the poll; with that topic named, its error fails the poll, as in
/// KEDA.
#[tokio::test]
async fn without_a_topic_other_topics_errors_do_not_fail_the_poll() {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("orders", 4, 1).unwrap();
    cluster.create_topic("broken", 2, 1).unwrap();
    produce(&bootstrap, "orders", &[(0, 10), (1, 10), (2, 10), (3, 10)]);
    commit(&bootstrap, "workers", "orders", &[(0, 10), (1, 5), (2, 0)]);
    cluster
        .topic_error(
            "broken",
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let hoist = Hoist::start().await;
    let all = trigger("all-topics", &bootstrap, "workers", "", &[]);
    assert_eq!(lag(&hoist, &all).await.unwrap(), 16.0);

    let broken = trigger("broken", &bootstrap, "workers", "broken", &[]);
    let error = lag(&hoist, &broken).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable);
    assert!(error.message().contains("broken"), "{}", error.message());
}

/// The token endpoint side of `sasl: oauthbearer`: librdkafka (built with
/// curl) asks the endpoint for a client-credentials token with the
/// trigger's client ID, secret, scopes. The broker here has no OAUTHBEARER
/// listener, so the poll itself fails; the secret and the token never show.
#[tokio::test]
async fn oauthbearer_fetches_a_client_credentials_token_from_the_endpoint() {
    use std::sync::{Arc, Mutex};

    use axum::http::HeaderMap;
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

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

    let broker = broker();
    let mut settings = Settings::default();
    profile(
        &mut settings,
        "oauth",
        &[
            ("sasl", "oauthbearer"),
            ("username", "client-id"),
            ("password", "client-secret-value"),
            ("oauthTokenEndpointUri", &endpoint),
            ("scopes", "kafka,read"),
        ],
    );
    let hoist = Hoist::start_with(settings).await;
    let object = trigger(
        "oauth",
        &broker.sasl,
        "oauth-group",
        "oauth",
        &[("authRef", "oauth"), ("timeout", "5000")],
    );
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
