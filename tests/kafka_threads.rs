//! A process of its own for the thread count: other tests running beside
//! it in one binary would start threads of their own.

mod support;

use std::time::Duration;

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .map(|count| count.trim().parse().unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_failed_polls_do_not_pile_up_threads() {
    use hoist::metadata::{AuthParams, Params};
    use hoist::scalers::Source;
    use hoist::scalers::kafka::{ClientPool, KafkaSource, parse_config};

    let nobody = format!("127.0.0.1:{}", support::free_port());
    let metadata = [
        ("bootstrapServers", nobody.as_str()),
        ("consumerGroup", "g"),
        ("topic", "t"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let config = parse_config(&Params::new(&metadata, &AuthParams::new())).unwrap();
    let source = KafkaSource::new(config, ClientPool::default());
    // Warm up: the client and the first blocking call exist from here on.
    let _ = tokio::time::timeout(Duration::from_millis(200), source.observe()).await;
    let before = threads();
    for _ in 0..60 {
        // The driver gives up after its timeout; the source must not start
        // another blocking call while one is still running.
        let outcome = tokio::time::timeout(Duration::from_millis(20), source.observe()).await;
        assert!(!matches!(outcome, Ok(Ok(_))), "nobody listens there");
    }
    let after = threads();
    assert!(after <= before + 2, "threads grew from {before} to {after}");
}
