//! `worker`: the queue consumer the node's scenarios scale (tests/node.rs,
//! docs/getting-started.md). It pops one job at a time from a Redis list,
//! works on it for `--job-ms`, and records it as done, so that a test can
//! compare the jobs pushed with the jobs finished.
//!
//! Each job is recorded once however often the record is retried: the
//! job's payload joins the set `NAME:finished` and `NAME:done` is
//! incremented only when it was new, in one script Redis runs atomically.
//! Payloads must therefore be unique (the scenarios push `job-1`,
//! `job-2`, …). SIGTERM (what the kubelet sends when a Deployment scales
//! down) and SIGINT stop it after the job in hand: a pop Redis already
//! answered is never dropped, and no new one starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Args)]
pub(super) struct WorkerArgs {
    /// Redis, HOST:PORT.
    #[arg(long)]
    redis: String,
    /// The list jobs are popped from; the counter is `NAME:done`.
    #[arg(long)]
    list: String,
    /// How long one job takes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    job_ms: u64,
}

/// How long one pop waits for a job before the worker looks at its stop
/// flag again.
const POP_WAIT_SECONDS: f64 = 1.0;

/// Adds the job to the finished set and counts it only if it was new.
const RECORD_ONCE: &str = r"
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  return redis.call('INCR', KEYS[1])
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
";

pub(super) async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let stopping = Arc::new(AtomicBool::new(false));
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        let mut signals = signal(kind)?;
        let stopping = Arc::clone(&stopping);
        tokio::spawn(async move {
            signals.recv().await;
            stopping.store(true, Ordering::SeqCst);
        });
    }
    let client = redis::Client::open(format!("redis://{}/", args.redis))?;
    let done_key = format!("{}:done", args.list);
    let finished_key = format!("{}:finished", args.list);
    let mut connection = connect(&client, &stopping).await;
    eprintln!(
        "worker: popping {} from {} ({} ms a job)",
        args.list, args.redis, args.job_ms
    );
    while !stopping.load(Ordering::SeqCst) {
        let Some(redis_connection) = connection.as_mut() else {
            connection = connect(&client, &stopping).await;
            continue;
        };
        // Never cancelled: a job Redis handed over must be worked.
        let popped: redis::RedisResult<Option<(String, String)>> = redis::cmd("BLPOP")
            .arg(&args.list)
            .arg(POP_WAIT_SECONDS)
            .query_async(redis_connection)
            .await;
        let job = match popped {
            Ok(Some((_, job))) => job,
            Ok(None) => continue,
            Err(error) => {
                eprintln!("worker: pop failed ({error}); reconnecting");
                connection = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tokio::time::sleep(Duration::from_millis(args.job_ms)).await;
        let done = loop {
            let attempt = match connection.as_mut() {
                Some(redis_connection) => {
                    redis::cmd("EVAL")
                        .arg(RECORD_ONCE)
                        .arg(2)
                        .arg(&done_key)
                        .arg(&finished_key)
                        .arg(&job)
                        .query_async::<i64>(redis_connection)
                        .await
                }
                None => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "not connected",
                ))),
            };
            match attempt {
                Ok(done) => break done,
                Err(error) => {
                    eprintln!("worker: recording {job} failed ({error}); retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    connection = connect(&client, &AtomicBool::new(false)).await;
                }
            }
        };
        println!("worker: {job} done ({done} in all)");
    }
    eprintln!("worker: stopped");
    Ok(())
}

/// A connection without a response timeout (a blocking pop waits up to
/// `POP_WAIT_SECONDS`, and a pop given up by the client could still take
/// a job on the server), retried every second until it succeeds or the
/// worker is stopping.
async fn connect(client: &redis::Client, stopping: &AtomicBool) -> Option<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(5)));
    loop {
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(connection) => return Some(connection),
            Err(error) if stopping.load(Ordering::SeqCst) => {
                eprintln!("worker: cannot reach Redis ({error}) while stopping");
                return None;
            }
            Err(error) => {
                eprintln!("worker: cannot reach Redis ({error}); retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
