//! A real Apache Kafka broker for tests/kafka.rs: one KRaft node (broker
//! and controller in one process) started by `scripts/kafka.sh up`, one per
//! test binary, started by the first test that asks and stopped by the
//! script's watcher when the binary exits. Tests share it: each names its
//! own topics and groups.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

pub struct Broker {
    pub dir: PathBuf,
    /// `PLAINTEXT`: no authentication.
    pub plaintext: String,
    /// `SASL_PLAINTEXT` with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
    pub sasl: String,
    /// `SSL`, client certificates required.
    pub tls: String,
    /// `SASL_SSL` with SCRAM-SHA-512.
    pub sasl_tls: String,
    pub user: String,
    pub password: String,
}

static BROKER: OnceLock<Broker> = OnceLock::new();

/// The broker of this test binary, started on first use.
pub fn broker() -> &'static Broker {
    BROKER.get_or_init(Broker::start)
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

impl Broker {
    fn start() -> Self {
        let dir = root()
            .join("target/kafka")
            .join(format!("run-{}", std::process::id()));
        let started = Instant::now();
        let output = Command::new(root().join("scripts/kafka.sh"))
            .arg("up")
            .env("KAFKA_DIR", &dir)
            .env("KAFKA_PARENT", std::process::id().to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/kafka.sh runs");
        assert!(
            output.status.success(),
            "scripts/kafka.sh up failed (logs in {})",
            dir.join("logs").display()
        );
        let ports: HashMap<String, String> = std::fs::read_to_string(dir.join("ports.env"))
            .expect("`up` writes ports.env")
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        eprintln!(
            "kafka broker up in {:.1}s: {}",
            started.elapsed().as_secs_f64(),
            ports["PLAINTEXT"]
        );
        let broker = Self {
            plaintext: ports["PLAINTEXT"].clone(),
            sasl: ports["SASL"].clone(),
            tls: ports["TLS"].clone(),
            sasl_tls: ports["SASL_TLS"].clone(),
            user: ports["USER"].clone(),
            password: ports["PASSWORD"].clone(),
            dir,
        };
        broker.warm_up();
        broker
    }

    /// The first commit creates the group coordinator's topic
    /// (`__consumer_offsets`); until its partitions are loaded, OffsetFetch
    /// answers NOT_COORDINATOR. One commit here, so tests start after that.
    fn warm_up(&self) {
        let admin = self.admin();
        let topic = [NewTopic::new("warm-up", 1, TopicReplication::Fixed(1))];
        let options = AdminOptions::new();
        // librdkafka's own thread completes the future: no runtime needed
        // (and this may run inside a test's).
        let created = futures::executor::block_on(admin.create_topics(&topic, &options));
        for result in created.expect("CreateTopics answered") {
            result.unwrap_or_else(|(name, e)| panic!("creating {name}: {e}"));
        }
        self.wait_for_partitions("warm-up", 1);
        self.commit("warm-up", "warm-up", &[(0, 0)]);
    }

    /// PEM files the script made: `ca.crt`, `client.crt`, `client.key`.
    pub fn pem(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("pki").join(name)).unwrap()
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.plaintext)
            .create()
            .expect("an admin client")
    }

    /// Creates `topic` with `partitions` partitions and waits until every
    /// partition has a leader.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin = self.admin();
        let results = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .expect("CreateTopics answered");
        for result in results {
            result.unwrap_or_else(|(name, e)| panic!("creating {name}: {e}"));
        }
        self.wait_for_partitions(topic, partitions as usize);
    }

    /// Grows `topic` to `partitions` partitions.
    pub async fn add_partitions(&self, topic: &str, partitions: usize) {
        let results = self
            .admin()
            .create_partitions(
                &[NewPartitions::new(topic, partitions)],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .expect("CreatePartitions answered");
        for result in results {
            result.unwrap_or_else(|(name, e)| panic!("growing {name}: {e}"));
        }
        self.wait_for_partitions(topic, partitions);
    }

    /// DeleteRecords: moves each partition's log start to `offset`, as
    /// retention does.
    pub async fn delete_records(&self, topic: &str, before: &[(i32, i64)]) {
        let answered = self
            .admin()
            .delete_records(&offset_list(topic, before), &AdminOptions::new())
            .await
            .expect("DeleteRecords answered");
        for element in answered.elements() {
            element.error().expect("records deleted");
        }
    }

    fn wait_for_partitions(&self, topic: &str, partitions: usize) {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.plaintext)
            .create()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .and_then(|m| {
                    m.topics().first().map(|t| {
                        t.error().is_none()
                            && t.partitions().len() == partitions
                            && t.partitions().iter().all(|p| p.leader() >= 0)
                    })
                })
                .unwrap_or(false);
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{topic} has no {partitions} led partitions"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Produces `count` messages into each listed partition.
    pub fn produce(&self, topic: &str, per_partition: &[(i32, usize)]) {
        produce(&self.plaintext, topic, per_partition);
    }

    /// Commits offsets for `group` as its consumer would (a group with no
    /// member: the broker keeps its offsets all the same).
    pub fn commit(&self, group: &str, topic: &str, offsets: &[(i32, i64)]) {
        commit(&self.plaintext, group, topic, offsets);
    }
}

/// Produces `count` messages into each listed partition of `topic` on
/// `bootstrap` (this broker, or librdkafka's mock cluster).
pub fn produce(bootstrap: &str, topic: &str, per_partition: &[(i32, usize)]) {
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
    producer.flush(Duration::from_secs(30)).expect("delivered");
}

/// Commits offsets of `topic` for `group` on `bootstrap`.
pub fn commit(bootstrap: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    consumer
        .commit(&offset_list(topic, offsets), CommitMode::Sync)
        .expect("committed");
}

/// `topic`'s partitions at the given offsets.
pub fn offset_list(topic: &str, offsets: &[(i32, i64)]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for &(partition, offset) in offsets {
        list.add_partition_offset(topic, partition, Offset::Offset(offset))
            .unwrap();
    }
    list
}
