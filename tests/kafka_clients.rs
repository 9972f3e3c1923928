//! hoist's own cost on one real broker, in a process of its own: it
//! counts this process's connections to the broker, which other tests
//! beside it in one binary would open too.

#[path = "support/kafka.rs"]
mod kafka_broker;
mod support;

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use hoist::metadata::{AuthParams, Params};
use hoist::scalers::{Context, Trigger};
use kafka_broker::broker;

/// This process's established TCP connections to `address` (IPv4).
fn connections_to(address: &str) -> usize {
    let port: u16 = address.rsplit_once(':').unwrap().1.parse().unwrap();
    let own: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    std::fs::read_to_string("/proc/self/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields[2]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            // State 01: ESTABLISHED; field 9: the socket's inode.
            remote_port == Some(port) && fields[3] == "01" && own.contains(fields[9])
        })
        .count()
}

/// A field of /proc/self/status (`VmRSS` in kB, `Threads`).
fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

/// CPU time this process has used (user + system), in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// One trigger of `group` with `lagThreshold` `threshold`: a question of
/// its own (the driver would not share its poller with another).
fn kafka_trigger(context: &Context, bootstrap: &str, group: usize, threshold: usize) -> Trigger {
    let metadata: HashMap<String, String> = [
        ("bootstrapServers", bootstrap.to_string()),
        ("consumerGroup", format!("group-{group}")),
        ("topic", "shared".to_string()),
        ("lagThreshold", threshold.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    hoist::scalers::parse(
        "kafka",
        &Params::new(&metadata, &AuthParams::new()),
        context,
    )
    .expect("a valid trigger")
}

/// Triggers `range` (trigger n: group n % 100, `lagThreshold` 1 + n / 100),
/// each polled once.
async fn first_polls(
    context: &Context,
    bootstrap: &str,
    range: std::ops::Range<usize>,
) -> Vec<Trigger> {
    let mut triggers = Vec::new();
    for n in range {
        let trigger = kafka_trigger(context, bootstrap, n % 100, 1 + n / 100);
        let measurement = trigger.query.source.observe().await.expect("a lag");
        // 11 partitions never committed (1 each, latest) + p0's 0.
        assert_eq!(measurement.value, 11.0);
        triggers.push(trigger);
    }
    triggers
}

/// 1,000 triggers on 100 groups of one broker hold one client, and as
/// many connections as the first trigger did: the cost follows the broker
/// set, neither the groups nor the ScaledObjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_triggers_on_a_hundred_groups_hold_one_client() {
    let broker = broker();
    broker.create_topic("shared", 12).await;
    broker.produce("shared", &(0..12).map(|p| (p, 5)).collect::<Vec<_>>());
    for group in 0..100 {
        broker.commit(&format!("group-{group}"), "shared", &[(0, 5)]);
    }
    let context = Context::default();
    let (rss_before, threads_before) = (status("VmRSS"), status("Threads"));
    let started = Instant::now();
    let mut triggers = first_polls(&context, &broker.plaintext, 0..1).await;
    let first_trigger = started.elapsed();
    assert_eq!(context.kafka.live(), 1);
    let after_one = connections_to(&broker.plaintext);
    assert!(after_one >= 1, "the client is connected");
    triggers.extend(first_polls(&context, &broker.plaintext, 1..100).await);
    assert_eq!(context.kafka.live(), 1, "one client for 100 groups");
    assert_eq!(
        connections_to(&broker.plaintext),
        after_one,
        "no connection per group"
    );
    triggers.extend(first_polls(&context, &broker.plaintext, 100..1000).await);
    assert_eq!(context.kafka.live(), 1, "one client for 1,000 triggers");
    let after_thousand = connections_to(&broker.plaintext);
    assert_eq!(after_thousand, after_one, "no connection per trigger");
    // A second poll of every trigger opens nothing new.
    let started_again = Instant::now();
    for trigger in &triggers {
        trigger.query.source.observe().await.expect("a lag");
    }
    let thousand_polls = started_again.elapsed();
    assert_eq!(connections_to(&broker.plaintext), after_thousand);
    // At rest: the client held, no poll running (a measurement for
    // docs/BENCHMARKS.md, not a pass/fail limit).
    let ticks = cpu_ticks();
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let rest_ticks = cpu_ticks() - ticks;
    eprintln!(
        "1,000 triggers on 100 groups: {} clients, {after_thousand} connections, \
         RSS +{} MiB, threads +{}; the first poll {:.2} s (client made), \
         1,000 polls {:.1} s; at rest {rest_ticks} ticks of CPU in 10 s",
        context.kafka.live(),
        status("VmRSS").saturating_sub(rss_before) / 1024,
        status("Threads").saturating_sub(threads_before),
        first_trigger.as_secs_f64(),
        thousand_polls.as_secs_f64(),
    );
    drop(triggers);
    assert_eq!(context.kafka.live(), 0, "the client goes with its triggers");
}
