//! `kafka-load`: the Kafka requests hoist makes per poll of a wide topic,
//! as received by librdkafka's mock cluster started in this process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Args;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use hoist::proto::{GetMetricsRequest, ScaledObjectRef};
use serde_json::json;
use tokio::time::Instant;

use crate::grpc::{channels, register, scaled_object};
use crate::results::emit;

#[derive(Args)]
pub(super) struct KafkaLoadArgs {
    #[arg(long)]
    target: String,
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    #[arg(long, default_value_t = 1000)]
    partitions: i32,
    #[arg(long, default_value_t = 3)]
    brokers: i32,
    #[arg(long, default_value_t = 1)]
    interval: u64,
    #[arg(long, default_value_t = 10)]
    intervals: u64,
}

fn api_name(key: i16) -> String {
    match key {
        0 => "Produce",
        1 => "Fetch",
        2 => "ListOffsets",
        3 => "Metadata",
        8 => "OffsetCommit",
        9 => "OffsetFetch",
        10 => "FindCoordinator",
        11 => "JoinGroup",
        12 => "Heartbeat",
        18 => "ApiVersions",
        19 => "CreateTopics",
        32 => "DescribeConfigs",
        36 => "SaslAuthenticate",
        71 => "GetTelemetrySubscriptions",
        _ => return format!("api-{key}"),
    }
    .to_string()
}

/// The requests the mock cluster received since tracking started:
/// (API key, timestamp in µs).
fn mock_requests(cluster: *mut rdkafka::bindings::rd_kafka_mock_cluster_t) -> Vec<(i16, i64)> {
    use rdkafka::bindings as rd;
    let mut count = 0usize;
    // SAFETY: the cluster outlives this call; the array and its requests
    // are ours to free, once, after reading them.
    unsafe {
        let requests = rd::rd_kafka_mock_get_requests(cluster, &mut count);
        if requests.is_null() {
            return Vec::new();
        }
        let list = (0..count)
            .map(|i| {
                let request = *requests.add(i);
                (
                    rd::rd_kafka_mock_request_api_key(request),
                    rd::rd_kafka_mock_request_timestamp(request),
                )
            })
            .collect();
        rd::rd_kafka_mock_request_destroy_array(requests, count);
        list
    }
}

pub(super) fn kafka_load(
    runtime: &tokio::runtime::Runtime,
    args: KafkaLoadArgs,
) -> anyhow::Result<()> {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};

    // A producer with test.mock.num.brokers owns a mock cluster; its raw
    // handle gives the request log rdkafka's MockCluster does not expose.
    let producer: BaseProducer = ClientConfig::new()
        .set("test.mock.num.brokers", args.brokers.to_string())
        .set("log_level", "3")
        .create()?;
    let mock = producer
        .client()
        .mock_cluster()
        .ok_or_else(|| anyhow!("no mock cluster"))?;
    let bootstrap = mock.bootstrap_servers();
    let topic = "wide";
    mock.create_topic(topic, args.partitions, 1)?;
    // SAFETY: the producer (and so the cluster) lives until the end.
    let cluster =
        unsafe { rdkafka::bindings::rd_kafka_handle_mock_cluster(producer.client().native_ptr()) };
    if cluster.is_null() {
        bail!("no mock cluster handle");
    }
    // Two messages per partition; the group committed 1: lag 1 each.
    for partition in 0..args.partitions {
        for _ in 0..2 {
            producer
                .send(
                    BaseRecord::<(), _>::to(topic)
                        .partition(partition)
                        .payload("m"),
                )
                .map_err(|(e, _)| e)?;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    let group = "wide-group";
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()?;
    let mut list = TopicPartitionList::new();
    for partition in 0..args.partitions {
        list.add_partition_offset(topic, partition, Offset::Offset(1))?;
    }
    consumer.commit(&list, CommitMode::Sync)?;
    drop(consumer);

    let interval = args.interval.to_string();
    let objects: Arc<Vec<ScaledObjectRef>> = Arc::new(
        (0..args.objects)
            .map(|index| {
                scaled_object(
                    format!("kafka-{index:05}"),
                    &[
                        ("scaler", "kafka"),
                        ("bootstrapServers", &bootstrap),
                        ("consumerGroup", group),
                        ("topic", topic),
                        ("pollingInterval", &interval),
                        ("timeout", "10000"),
                        ("allowIdleConsumers", "true"),
                    ],
                )
            })
            .collect(),
    );
    let value = runtime.block_on(async {
        let channels = channels(&args.target, 4).await?;
        let (errors, first_error, took) = register(&channels, objects.clone(), None, 64).await;
        if errors > 0 {
            bail!(
                "{errors} first reads failed: {}",
                first_error.unwrap_or_default()
            );
        }
        eprintln!(
            "{} Kafka objects registered in {:.2} s",
            objects.len(),
            took.as_secs_f64()
        );
        let mut client = ExternalScalerClient::new(channels[0].clone());
        let response = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(objects[0].clone()),
                metric_name: String::new(),
            })
            .await?
            .into_inner();
        anyhow::Ok(response.metric_values.first().map(|v| v.metric_value_float))
    })?;

    // SAFETY: see above.
    unsafe {
        rdkafka::bindings::rd_kafka_mock_start_request_tracking(cluster);
        rdkafka::bindings::rd_kafka_mock_clear_requests(cluster);
    }
    let window = Duration::from_secs(args.interval * args.intervals);
    let asked = runtime.block_on(async {
        let channels = channels(&args.target, 4).await?;
        let started = Instant::now();
        let mut asked = 0u64;
        for round in 0..args.intervals {
            register(&channels, objects.clone(), None, 64).await;
            asked += objects.len() as u64;
            tokio::time::sleep_until(started + Duration::from_secs(args.interval * (round + 1)))
                .await;
        }
        anyhow::Ok(asked)
    })?;
    let requests = mock_requests(cluster);
    // SAFETY: see above.
    unsafe { rdkafka::bindings::rd_kafka_mock_stop_request_tracking(cluster) };

    let mut by_api: BTreeMap<String, u64> = BTreeMap::new();
    for (key, _) in &requests {
        *by_api.entry(api_name(*key)).or_default() += 1;
    }
    // Polls show as bursts of requests; a gap of 200 ms separates them.
    let mut stamps: Vec<i64> = requests.iter().map(|(_, at)| *at).collect();
    stamps.sort_unstable();
    let bursts = if stamps.is_empty() {
        0
    } else {
        1 + stamps.windows(2).filter(|w| w[1] - w[0] > 200_000).count()
    };
    let result = json!({
        "bench": "kafka-load",
        "objects": args.objects,
        "partitions": args.partitions,
        "brokers": args.brokers,
        "interval_s": args.interval,
        "intervals": args.intervals,
        "window_s": window.as_secs_f64(),
        "get_metrics_calls": asked,
        "lag": value,
        "requests": requests.len(),
        "bursts": bursts,
        "by_api": by_api,
    });
    eprintln!(
        "{} objects, {} partitions on {} brokers, {} intervals: {} requests in {} bursts: {:?}",
        args.objects,
        args.partitions,
        args.brokers,
        args.intervals,
        requests.len(),
        bursts,
        by_api
    );
    emit(result);
    drop(mock);
    drop(producer);
    Ok(())
}
