//! `redis-load`: what Redis runs (its `INFO commandstats`) for many
//! ScaledObjects on one list while KEDA asks about every object each
//! interval: the answers must come from hoist's cache, not from Redis.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use hoist::proto::ScaledObjectRef;
use serde_json::json;
use tokio::time::Instant;

use crate::grpc::{channels, register, scaled_object};
use crate::results::emit;

#[derive(Args)]
pub(super) struct RedisLoadArgs {
    #[arg(long)]
    target: String,
    #[arg(long)]
    redis: String,
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    #[arg(long, default_value = "shared")]
    list: String,
    /// pollingInterval, seconds.
    #[arg(long, default_value_t = 1)]
    interval: u64,
    /// Polling intervals to count over.
    #[arg(long, default_value_t = 10)]
    intervals: u64,
}

async fn command_calls(
    connection: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect())
}

pub(super) async fn redis_load(args: RedisLoadArgs) -> anyhow::Result<()> {
    let client = redis::Client::open(format!("redis://{}/", args.redis))?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("DEL")
        .arg(&args.list)
        .query_async(&mut connection)
        .await?;
    let _: () = redis::cmd("RPUSH")
        .arg(&args.list)
        .arg("a")
        .arg("b")
        .arg("c")
        .query_async(&mut connection)
        .await?;
    let interval = args.interval.to_string();
    let objects: Arc<Vec<ScaledObjectRef>> = Arc::new(
        (0..args.objects)
            .map(|index| {
                scaled_object(
                    format!("shared-{index:05}"),
                    &[
                        ("scaler", "redis"),
                        ("address", &args.redis),
                        ("listName", &args.list),
                        ("pollingInterval", &interval),
                    ],
                )
            })
            .collect(),
    );
    let channels = channels(&args.target, 4).await?;
    let (errors, first_error, _) = register(&channels, objects.clone(), None, 64).await;
    if errors > 0 {
        bail!(
            "{errors} first reads failed: {}",
            first_error.unwrap_or_default()
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = command_calls(&mut connection).await?;
    let started = Instant::now();
    // KEDA asks about every object once per interval meanwhile: all of
    // it must come from the cache.
    let mut asked = 0u64;
    for round in 0..args.intervals {
        let (errors, first_error, _) = register(&channels, objects.clone(), None, 64).await;
        if errors > 0 {
            bail!("{errors} reads failed: {}", first_error.unwrap_or_default());
        }
        asked += objects.len() as u64;
        tokio::time::sleep_until(started + Duration::from_secs(args.interval * (round + 1))).await;
    }
    let window = started.elapsed();
    let after = command_calls(&mut connection).await?;
    let delta = |name: &str| after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0);
    // Our own INFO is one of the `info` calls.
    let result = json!({
        "bench": "redis-load",
        "objects": args.objects,
        "interval_s": args.interval,
        "intervals": args.intervals,
        "window_s": window.as_secs_f64(),
        "get_metrics_calls": asked,
        "llen": delta("llen"),
        "evalsha": delta("evalsha"),
        "eval": delta("eval"),
        "type": delta("type"),
        "all_commands": after.values().sum::<u64>() - before.values().sum::<u64>() - 1,
    });
    eprintln!(
        "{} objects on one list, {} GetMetrics over {} intervals: {} LLEN",
        args.objects,
        asked,
        args.intervals,
        delta("llen")
    );
    emit(result);
    Ok(())
}
