//! `kafka-groups`: the consumer groups of scripts/bench-keda.sh's Kafka
//! part, on a real broker: the topic, the groups caught up (lag 0), one
//! message produced (lag 1: every ScaledObject active).

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, ValueEnum};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, ValueEnum)]
enum Action {
    /// Creates the topic (if missing) with `--partitions` partitions.
    CreateTopic,
    /// Commits every group at the end of every partition: lag 0.
    CatchUp,
    /// Produces one message into partition 0: lag 1 for every group.
    Produce,
}

#[derive(Args)]
pub(super) struct KafkaGroupsArgs {
    #[arg(value_enum)]
    action: Action,
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    /// Groups `PREFIX-1` … `PREFIX-N`.
    #[arg(long, default_value = "bench")]
    group_prefix: String,
    #[arg(long, default_value_t = 1)]
    groups: usize,
}

pub(super) fn kafka_groups(args: KafkaGroupsArgs) -> anyhow::Result<()> {
    match args.action {
        Action::CreateTopic => create_topic(&args),
        Action::CatchUp => catch_up(&args),
        Action::Produce => produce(&args),
    }
}

fn create_topic(args: &KafkaGroupsArgs) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .create()?;
    let topic = [NewTopic::new(
        &args.topic,
        args.partitions,
        TopicReplication::Fixed(1),
    )];
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for result in futures::executor::block_on(admin.create_topics(&topic, &options))? {
        match result {
            Ok(_) => {}
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, error)) => bail!("creating {name}: {error}"),
        }
    }
    Ok(())
}

fn catch_up(args: &KafkaGroupsArgs) -> anyhow::Result<()> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .create()?;
    let mut ends = TopicPartitionList::new();
    for partition in 0..args.partitions {
        let (_, high) = reader
            .fetch_watermarks(&args.topic, partition, TIMEOUT)
            .with_context(|| format!("the end of {}/{partition}", args.topic))?;
        ends.add_partition_offset(&args.topic, partition, Offset::Offset(high))?;
    }
    // A commit is a client of its own (its `group.id`): a few at a time,
    // so that 1,000 groups take seconds, not minutes.
    let groups: Vec<usize> = (1..=args.groups).collect();
    let ends = &ends;
    std::thread::scope(|scope| {
        let workers: Vec<_> = groups
            .chunks(args.groups.div_ceil(COMMITTERS).max(1))
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .try_for_each(|group| commit(args, *group, ends))
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().map_err(|_| anyhow!("a committer panicked"))?)
    })
}

/// Committing threads of `catch-up`.
const COMMITTERS: usize = 8;

fn commit(args: &KafkaGroupsArgs, group: usize, ends: &TopicPartitionList) -> anyhow::Result<()> {
    let group = format!("{}-{group}", args.group_prefix);
    // A group with no member: the broker keeps its offsets all the same.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()?;
    consumer
        .commit(ends, CommitMode::Sync)
        .with_context(|| format!("committing {group}"))
}

fn produce(args: &KafkaGroupsArgs) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .create()?;
    producer
        .send(
            BaseRecord::<(), _>::to(&args.topic)
                .partition(0)
                .payload("job"),
        )
        .map_err(|(error, _)| anyhow!("queueing: {error}"))?;
    producer.flush(TIMEOUT)?;
    Ok(())
}
