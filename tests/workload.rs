//! The workload tools the node's scenarios run in pods (`hoist-load
//! worker` and `hoist-load upstream`), against a real `redis-server` on
//! loopback: every job is done exactly once however many workers share a
//! list, and SIGTERM ends a worker only after the job in hand.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{RedisServer, free_port, wait_until};

fn worker(redis: &RedisServer, list: &str, job_ms: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hoist-load"))
        .args(["--threads", "1", "worker", "--redis"])
        .arg(redis.address())
        .args(["--list", list, "--job-ms", &job_ms.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("hoist-load worker starts")
}

fn integer(redis: &RedisServer, args: &[&str]) -> i64 {
    match redis.command(args) {
        redis::Value::Int(n) => n,
        redis::Value::Nil => 0,
        redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap().parse().unwrap(),
        other => panic!("{args:?}: {other:?}"),
    }
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    child.wait().unwrap()
}

#[test]
fn three_workers_drain_a_list_and_count_every_job_once() {
    let redis = RedisServer::start();
    let jobs: Vec<String> = (1..=60).map(|n| format!("job-{n}")).collect();
    let mut push = vec!["RPUSH", "jobs"];
    push.extend(jobs.iter().map(String::as_str));
    redis.command(&push);

    let mut workers: Vec<Child> = (0..3).map(|_| worker(&redis, "jobs", 20)).collect();
    wait_until(Duration::from_secs(30), "every job done", || {
        integer(&redis, &["GET", "jobs:done"]) == jobs.len() as i64
    });
    for worker in &mut workers {
        assert!(terminate(worker).success(), "a stopped worker exits 0");
    }
    assert_eq!(integer(&redis, &["LLEN", "jobs"]), 0);
    assert_eq!(integer(&redis, &["GET", "jobs:done"]), 60);
    assert_eq!(
        integer(&redis, &["SCARD", "jobs:finished"]),
        60,
        "each job finished once, none twice"
    );
}

#[test]
fn sigterm_finishes_the_job_in_hand_and_starts_no_other() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "slow", "job-1", "job-2"]);
    let mut worker = worker(&redis, "slow", 1_500);
    // job-1 is in hand once it has left the list.
    wait_until(Duration::from_secs(10), "job-1 popped", || {
        integer(&redis, &["LLEN", "slow"]) == 1
    });
    assert_eq!(integer(&redis, &["GET", "slow:done"]), 0, "still working");
    assert!(terminate(&mut worker).success());
    assert_eq!(integer(&redis, &["GET", "slow:done"]), 1, "job-1 finished");
    assert_eq!(
        integer(&redis, &["LLEN", "slow"]),
        1,
        "job-2 left for another worker"
    );
    let mut out = String::new();
    std::io::Read::read_to_string(&mut worker.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(out.trim(), "worker: job-1 done (1 in all)");
}

/// `hoist-load upstream` on loopback `port`, answering `body`.
fn upstream_app(port: u16, body: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hoist-load"))
        .args(["--threads", "1", "upstream", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--body", body])
        .stderr(Stdio::null())
        .spawn()
        .expect("hoist-load upstream starts")
}

#[test]
fn the_upstream_answers_http() {
    let port = free_port();
    let mut upstream = upstream_app(port, "from the app\n");
    let mut answer = String::new();
    wait_until(Duration::from_secs(10), "the upstream answers", || {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n")
            .unwrap();
        answer.clear();
        stream.read_to_string(&mut answer).is_ok()
    });
    upstream.kill().unwrap();
    upstream.wait().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("from the app\n"), "{answer}");
}

#[test]
fn pace_sends_the_rate_asked_and_times_every_answer() {
    let port = free_port();
    let mut upstream = upstream_app(port, "hello\n");
    wait_until(Duration::from_secs(10), "the upstream listens", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let app_pid = upstream.id().to_string();
    let pace = |target: String| {
        Command::new(env!("CARGO_BIN_EXE_hoist-load"))
            .args(["--threads", "1", "pace", "--target", &target])
            .args(["--rate", "200", "--seconds", "1", "--connections", "4"])
            .args(["--pid", &app_pid, "--label", "app"])
            .output()
            .expect("hoist-load pace runs")
    };
    let paced = pace(format!("127.0.0.1:{port}"));
    assert!(paced.status.success(), "{paced:?}");
    let result: serde_json::Value = serde_json::from_slice(&paced.stdout).unwrap();
    // Four connections, one request each per 20 ms for a second.
    assert_eq!(result["answered"], 200, "{result}");
    assert_eq!(result["failed"], 0, "{result}");
    assert_eq!(result["label"], "app");
    let p50 = result["p50_ms"].as_f64().unwrap();
    assert!(
        p50 > 0.0 && p50 <= result["p99_ms"].as_f64().unwrap(),
        "{result}"
    );
    assert!(result["cpu_us_per_request"].is_number(), "{result}");

    upstream.kill().unwrap();
    upstream.wait().unwrap();
    let refused = pace(format!("127.0.0.1:{port}"));
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("connecting to 127.0.0.1:"), "{stderr}");
}
