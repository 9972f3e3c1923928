//! hoist end to end: a real tonic client, a real hoist server, real
//! `redis-server` processes (standalone, cluster, sentinel).

mod support;

use std::time::Duration;

use hoist::config::{AuthProfile, AuthValue, Settings};
use hoist::proto::{GetMetricsRequest, ScaledObjectRef};
use support::{Hoist, RedisCluster, RedisSentinel, RedisServer, eventually, object};

/// How long a test waits for a poller to notice Redis going or coming back.
const PATIENCE: Duration = Duration::from_secs(15);
use tokio_stream::StreamExt;
use tonic::Code;

async fn metric(hoist: &Hoist, object: &ScaledObjectRef) -> Result<(i64, f64), tonic::Status> {
    hoist.metric(object).await
}

async fn active(hoist: &Hoist, object: &ScaledObjectRef) -> Result<bool, tonic::Status> {
    hoist.active(object).await
}

#[tokio::test]
async fn serves_every_rpc_from_a_real_redis() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "jobs", "1", "2", "3", "4", "5", "6", "7"]);
    let hoist = Hoist::start().await;
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    let mut client = hoist.client().await;

    let spec = hoist.spec(&jobs).await;
    assert_eq!(spec.metric_name, "redis-jobs");
    assert_eq!(spec.target_size, 5);
    assert_eq!(spec.target_size_float, 5.0);

    assert_eq!(metric(&hoist, &jobs).await.unwrap(), (7, 7.0));
    assert!(active(&hoist, &jobs).await.unwrap());

    // The metric name KEDA sends back (prefix stripped) is accepted;
    // another name is not served.
    let named = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(jobs.clone()),
            metric_name: "redis-jobs".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(named.metric_values[0].metric_name, "redis-jobs");
    let wrong = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(jobs.clone()),
            metric_name: "redis-other".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::NotFound);

    // Activation is strictly above the threshold.
    let threshold = |n: &str| {
        object(
            "orders",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "jobs"),
                ("activationListLength", n),
                ("listLength", "2"),
            ],
        )
    };
    assert!(!active(&hoist, &threshold("7")).await.unwrap());
    assert!(active(&hoist, &threshold("6")).await.unwrap());
    let spec = hoist.spec(&threshold("6")).await;
    assert_eq!(spec.target_size, 2);
}

#[tokio::test]
async fn counts_lists_sets_sorted_sets_and_hashes_and_a_missing_key_is_zero() {
    let redis = RedisServer::start();
    redis.command(&["SADD", "a-set", "x", "y"]);
    redis.command(&["ZADD", "a-zset", "1", "x", "2", "y", "3", "z"]);
    redis.command(&["HSET", "a-hash", "f1", "v", "f2", "v", "f3", "v", "f4", "v"]);
    redis.command(&["SET", "a-string", "v"]);
    let hoist = Hoist::start().await;
    let on = |list: &str| {
        object(
            list,
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", list),
            ],
        )
    };

    assert_eq!(metric(&hoist, &on("a-set")).await.unwrap(), (2, 2.0));
    assert_eq!(metric(&hoist, &on("a-zset")).await.unwrap(), (3, 3.0));
    assert_eq!(metric(&hoist, &on("a-hash")).await.unwrap(), (4, 4.0));
    assert_eq!(metric(&hoist, &on("missing")).await.unwrap(), (0, 0.0));
    assert!(!active(&hoist, &on("missing")).await.unwrap());

    let string = metric(&hoist, &on("a-string")).await.unwrap_err();
    assert_eq!(string.code(), Code::Unavailable);
    assert!(
        string.message().contains("a-string"),
        "{}",
        string.message()
    );
    assert!(string.message().contains("string"), "{}", string.message());
}

#[tokio::test]
async fn scaled_objects_asking_the_same_question_share_one_poller() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "shared", "a", "b"]);
    let hoist = Hoist::start().await;
    // A long interval: only the first measurement happens during the test.
    let watcher = |name: &str| {
        object(
            name,
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "shared"),
                ("pollingInterval", "3600"),
            ],
        )
    };
    let (first, second) = (watcher("first"), watcher("second"));
    for _ in 0..5 {
        assert_eq!(metric(&hoist, &first).await.unwrap(), (2, 2.0));
        assert_eq!(metric(&hoist, &second).await.unwrap(), (2, 2.0));
        assert!(active(&hoist, &second).await.unwrap());
    }
    assert_eq!(
        redis.calls("llen"),
        1,
        "one LLEN for ten GetMetrics and five IsActive"
    );

    let (_, metrics) = hoist.get("/metrics").await;
    assert!(metrics.contains("hoist_pollers 1"), "{metrics}");
    assert!(metrics.contains("hoist_tracked_triggers 2"), "{metrics}");

    // A different list is a different question.
    let other = object(
        "third",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "other"),
        ],
    );
    assert_eq!(metric(&hoist, &other).await.unwrap(), (0, 0.0));
    assert_eq!(redis.calls("llen"), 2);
}

#[tokio::test]
async fn bad_metadata_is_invalid_argument_naming_the_key() {
    let hoist = Hoist::start().await;
    let mut client = hoist.client().await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("listName", "jobs"), ("address", "a:1")], "`scaler`"),
        (&[("scaler", "rabbitmq")], "redis-sentinel"),
        (&[("scaler", "redis"), ("address", "a:1")], "`listName`"),
        (&[("scaler", "redis"), ("listName", "jobs")], "`address`"),
        (
            &[
                ("scaler", "redis"),
                ("address", "a:1"),
                ("listName", "j"),
                ("listLength", "AA"),
            ],
            "`listLength`",
        ),
        (
            &[
                ("scaler", "redis"),
                ("address", "a:1"),
                ("listName", "j"),
                ("activationListLength", "x"),
            ],
            "`activationListLength`",
        ),
        (
            &[
                ("scaler", "redis"),
                ("address", "a:1"),
                ("listName", "j"),
                ("enableTLS", "maybe"),
            ],
            "`enableTLS`",
        ),
        (
            &[
                ("scaler", "redis"),
                ("address", "a:port"),
                ("listName", "j"),
            ],
            "`address`",
        ),
        (
            &[
                ("scaler", "redis"),
                ("address", "a:1"),
                ("listName", "j"),
                ("pollingInterval", "0"),
            ],
            "`pollingInterval`",
        ),
        (
            &[
                ("scaler", "redis-cluster"),
                ("hosts", "a,b"),
                ("ports", "1"),
                ("listName", "j"),
            ],
            "`hosts`",
        ),
    ];
    for (metadata, key) in cases {
        let request = object("bad", metadata);
        let responses = [
            client.get_metric_spec(request.clone()).await.map(drop),
            client.is_active(request.clone()).await.map(drop),
            client
                .get_metrics(GetMetricsRequest {
                    scaled_object_ref: Some(request.clone()),
                    metric_name: String::new(),
                })
                .await
                .map(drop),
            client.stream_is_active(request.clone()).await.map(drop),
        ];
        for response in responses {
            let status = response.unwrap_err();
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{metadata:?}: {status:?}"
            );
            assert!(
                status.message().contains(key),
                "{metadata:?}: `{}` lacks {key}",
                status.message()
            );
        }
    }
}

#[tokio::test]
async fn redis_stopping_mid_run_is_unavailable_without_a_hang_and_recovers() {
    let mut redis = RedisServer::start();
    redis.command(&["RPUSH", "jobs", "a", "b", "c"]);
    let hoist = Hoist::start().await;
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("pollingInterval", "1"),
            ("timeout", "500"),
        ],
    );
    assert_eq!(metric(&hoist, &jobs).await.unwrap(), (3, 3.0));

    redis.stop();
    eventually(PATIENCE, "GetMetrics to fail", || async {
        metric(&hoist, &jobs).await.is_err()
    })
    .await;
    let started = std::time::Instant::now();
    let status = metric(&hoist, &jobs).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answered from cache, not the source"
    );
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains(&redis.address()),
        "names the source: {}",
        status.message()
    );
    assert!(
        status.message().contains("last good value 3"),
        "{}",
        status.message()
    );
    assert_eq!(
        active(&hoist, &jobs).await.unwrap_err().code(),
        Code::Unavailable
    );
    let (_, metrics) = hoist.get("/metrics").await;
    assert!(
        metrics.contains("hoist_poll_errors_total{scaler=\"redis\""),
        "{metrics}"
    );

    // A trigger first seen while the source is down: an error within its
    // timeout, not a hang.
    let newcomer = object(
        "newcomer",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "other"),
            ("timeout", "500"),
        ],
    );
    let started = std::time::Instant::now();
    assert_eq!(
        metric(&hoist, &newcomer).await.unwrap_err().code(),
        Code::Unavailable
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    redis.restart();
    redis.command(&["RPUSH", "jobs", "x", "y"]);
    eventually(PATIENCE, "GetMetrics to recover", || async {
        metric(&hoist, &jobs).await.ok() == Some((2, 2.0))
    })
    .await;
    assert!(active(&hoist, &jobs).await.unwrap());
}

type Activity = Option<Result<hoist::proto::IsActiveResponse, tonic::Status>>;

/// The next stream message within 2.5 s (a poll is 1 s), or `Err` if none.
async fn next(
    stream: &mut tonic::Streaming<hoist::proto::IsActiveResponse>,
) -> Result<Activity, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_millis(2500), stream.next()).await
}

#[tokio::test]
async fn stream_is_active_pushes_only_inactive_to_active_edges() {
    let redis = RedisServer::start();
    let hoist = Hoist::start().await;
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("pollingInterval", "1"),
        ],
    );
    let mut stream = hoist
        .client()
        .await
        .stream_is_active(jobs.clone())
        .await
        .unwrap()
        .into_inner();
    // Empty list: nothing is sent.
    assert!(
        next(&mut stream).await.is_err(),
        "no message while inactive"
    );

    redis.command(&["RPUSH", "jobs", "a"]);
    let message = next(&mut stream)
        .await
        .expect("a push within a poll")
        .unwrap()
        .unwrap();
    assert!(message.result);
    redis.command(&["RPUSH", "jobs", "b", "c"]);
    assert!(
        next(&mut stream).await.is_err(),
        "no repeated true while active"
    );

    redis.command(&["DEL", "jobs"]);
    assert!(
        next(&mut stream).await.is_err(),
        "deactivation is not pushed"
    );
    redis.command(&["RPUSH", "jobs", "again"]);
    let message = next(&mut stream)
        .await
        .expect("a second edge")
        .unwrap()
        .unwrap();
    assert!(message.result);

    // A stream opened while already active starts with true.
    let mut late = hoist
        .client()
        .await
        .stream_is_active(jobs.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(
        next(&mut late)
            .await
            .expect("an immediate true")
            .unwrap()
            .unwrap()
            .result
    );
}

#[tokio::test]
async fn shutdown_ends_open_streams_with_ok_and_stops_serving() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "jobs", "a"]);
    let hoist = Hoist::start().await;
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = hoist
            .client()
            .await
            .stream_is_active(jobs.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(stream.next().await.unwrap().unwrap().result);
        streams.push(stream);
    }
    let grpc = hoist.grpc;
    let stopped = tokio::time::timeout(Duration::from_secs(5), hoist.stop()).await;
    stopped
        .expect("shutdown is bounded")
        .expect("a clean shutdown");
    for mut stream in streams {
        // The stream ends (None), not with an error status.
        let end = tokio::time::timeout(Duration::from_secs(2), stream.next())
            .await
            .unwrap();
        assert!(end.is_none(), "expected a clean end, got {end:?}");
    }
    assert!(
        tokio::net::TcpStream::connect(grpc).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test]
async fn redis_cluster_trigger_reads_the_list_from_its_owner() {
    let cluster = RedisCluster::start();
    cluster.on_owner("cluster-jobs", &["RPUSH", "a", "b", "c", "d"]);
    let hoist = Hoist::start().await;
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis-cluster"),
            ("addresses", &cluster.addresses()),
            ("listName", "cluster-jobs"),
        ],
    );
    assert_eq!(metric(&hoist, &jobs).await.unwrap(), (4, 4.0));
    let by_hosts = object(
        "orders-hosts",
        &[
            ("scaler", "redis-cluster"),
            ("hosts", "127.0.0.1"),
            ("ports", &cluster.nodes[1].port.to_string()),
            ("listName", "cluster-jobs"),
        ],
    );
    assert_eq!(
        metric(&hoist, &by_hosts).await.unwrap(),
        (4, 4.0),
        "one seed node finds the rest"
    );
}

#[tokio::test]
async fn redis_sentinel_trigger_asks_the_sentinel_for_the_master() {
    let sentinel = RedisSentinel::start();
    sentinel.master.command(&["RPUSH", "jobs", "a", "b"]);
    let hoist = Hoist::start().await;
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis-sentinel"),
            ("addresses", &sentinel.address()),
            ("sentinelMaster", "mymaster"),
            ("listName", "jobs"),
        ],
    );
    assert_eq!(metric(&hoist, &jobs).await.unwrap(), (2, 2.0));
    let wrong_master = object(
        "orders",
        &[
            ("scaler", "redis-sentinel"),
            ("addresses", &sentinel.address()),
            ("sentinelMaster", "nosuchmaster"),
            ("listName", "jobs"),
        ],
    );
    assert_eq!(
        metric(&hoist, &wrong_master).await.unwrap_err().code(),
        Code::Unavailable
    );
}

#[tokio::test]
async fn passwords_come_from_auth_profiles_and_never_show_in_errors() {
    let password = "s3cret-Pa55word";
    let redis = RedisServer::start_with(&["--requirepass", password]);
    redis.command(&["RPUSH", "jobs", "a"]);
    let mut settings = Settings::default();
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        "orders-redis".into(),
        AuthProfile::new(
            &["default"],
            [("password".to_string(), AuthValue::Literal(password.into()))],
        ),
    );
    settings.auth.insert(
        "wrong".into(),
        AuthProfile::new(
            &["default"],
            [("password".to_string(), AuthValue::Literal("not-it".into()))],
        ),
    );
    let hoist = Hoist::start_with(settings).await;
    let with = |profile: &str| {
        object(
            "orders",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "jobs"),
                ("authRef", profile),
            ],
        )
    };
    assert_eq!(
        metric(&hoist, &with("orders-redis")).await.unwrap(),
        (1, 1.0)
    );

    let refused = metric(&hoist, &with("wrong")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(
        refused.message().contains("credentials refused"),
        "{}",
        refused.message()
    );

    // A password resolved by KEDA from the target's env works the same way.
    let from_env = object(
        "orders-env",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("passwordFromEnv", password),
        ],
    );
    assert_eq!(metric(&hoist, &from_env).await.unwrap(), (1, 1.0));

    let unknown = metric(&hoist, &with("nope")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::FailedPrecondition);
    assert!(
        unknown.message().contains("`nope`"),
        "{}",
        unknown.message()
    );

    let (_, metrics) = hoist.get("/metrics").await;
    for text in [refused.message(), unknown.message(), metrics.as_str()] {
        assert!(!text.contains(password), "the password leaked: {text}");
    }
}

#[tokio::test]
async fn tls_to_redis_with_a_ca_from_the_auth_profile() {
    let TlsRedis {
        redis,
        port: tls_port,
        ca_file,
        _dir,
        ..
    } = TlsRedis::start(false);
    redis.command(&["RPUSH", "secure", "a", "b"]);

    let mut settings = Settings::default();
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        "tls-redis".into(),
        AuthProfile::new(
            &["default"],
            [
                ("tls".to_string(), AuthValue::Literal("enable".into())),
                (
                    "ca".to_string(),
                    AuthValue::File {
                        file: ca_file.clone().into(),
                    },
                ),
            ],
        ),
    );
    let hoist = Hoist::start_with(settings).await;
    let address = format!("localhost:{tls_port}");
    let verified = object(
        "secure",
        &[
            ("scaler", "redis"),
            ("address", &address),
            ("listName", "secure"),
            ("authRef", "tls-redis"),
        ],
    );
    assert_eq!(metric(&hoist, &verified).await.unwrap(), (2, 2.0));

    // Without hoist knowing the CA, verification fails...
    let unknown_ca = object(
        "secure-2",
        &[
            ("scaler", "redis"),
            ("address", &address),
            ("listName", "secure"),
            ("enableTLS", "true"),
        ],
    );
    assert_eq!(
        metric(&hoist, &unknown_ca).await.unwrap_err().code(),
        Code::Unavailable
    );
    // ...unless told to skip it.
    let unsafe_ssl = object(
        "secure-3",
        &[
            ("scaler", "redis"),
            ("address", &address),
            ("listName", "secure"),
            ("enableTLS", "true"),
            ("unsafeSsl", "true"),
        ],
    );
    assert_eq!(metric(&hoist, &unsafe_ssl).await.unwrap(), (2, 2.0));
}

#[tokio::test]
async fn two_replicas_behind_one_service_answer_alike_in_passthrough_mode() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "jobs", "a", "b", "c", "d", "e", "f"]);
    let (first, second) = (Hoist::start().await, Hoist::start().await);
    let jobs = object(
        "orders",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
            ("pollingInterval", "1"),
        ],
    );
    // KEDA round-robins over the replicas: each answers from its own
    // poller of the same source.
    for _ in 0..3 {
        assert_eq!(
            metric(&first, &jobs).await.unwrap(),
            metric(&second, &jobs).await.unwrap()
        );
        assert_eq!(
            active(&first, &jobs).await.unwrap(),
            active(&second, &jobs).await.unwrap()
        );
    }
    redis.command(&["RPUSH", "jobs", "g", "h"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(metric(&first, &jobs).await.unwrap(), (8, 8.0));
    assert_eq!(metric(&second, &jobs).await.unwrap(), (8, 8.0));
}

#[tokio::test]
async fn pollers_of_one_redis_share_one_connection() {
    let redis = RedisServer::start();
    let clients = |redis: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query(&mut redis.connection())
            .unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("connected_clients:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap()
    };
    let before = clients(&redis);
    let hoist = Hoist::start().await;
    let address = redis.address();
    for list in 0..20 {
        redis.command(&["RPUSH", &format!("jobs-{list}"), "a"]);
        let name = format!("jobs-{list}");
        let object = object(
            &format!("worker-{list}"),
            &[
                ("scaler", "redis"),
                ("address", &address),
                ("listName", &name),
            ],
        );
        assert_eq!(metric(&hoist, &object).await.unwrap(), (1, 1.0));
    }
    // 20 pollers, one socket (the counting call adds its own, as `before` did).
    assert_eq!(clients(&redis), before + 1);
    hoist.stop().await.unwrap();
}

/// KEDA sends plain `EVAL`: a Redis ACL user granted `+eval` (and the
/// commands the script calls) but not `+evalsha` can scale.
#[tokio::test]
async fn an_acl_user_with_eval_and_without_evalsha_can_scale() {
    let redis = RedisServer::start();
    redis.command(&["RPUSH", "jobs", "a", "b", "c"]);
    redis.command(&["SADD", "a-set", "x"]);
    redis.command(&[
        "ACL",
        "SETUSER",
        "scaler",
        "on",
        ">scaler-pass",
        "~*",
        "+@connection",
        "+eval",
        "+type",
        "+llen",
        "+scard",
        "+zcard",
        "+hlen",
        "-evalsha",
        "-script",
    ]);
    // The user really cannot run EVALSHA.
    let mut as_scaler = redis::Client::open(format!(
        "redis://scaler:scaler-pass@127.0.0.1:{}/",
        redis.port
    ))
    .unwrap()
    .get_connection()
    .unwrap();
    let refused: redis::RedisResult<i64> = redis::cmd("EVALSHA")
        .arg("0000000000000000000000000000000000000000")
        .arg(0)
        .query(&mut as_scaler);
    let refused = refused.unwrap_err().to_string();
    assert!(
        refused.to_ascii_lowercase().contains("permission"),
        "the ACL refuses EVALSHA: {refused}"
    );

    let mut settings = Settings::default();
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        "eval-only".into(),
        AuthProfile::new(
            &["default"],
            [
                ("username".to_string(), AuthValue::Literal("scaler".into())),
                (
                    "password".to_string(),
                    AuthValue::Literal("scaler-pass".into()),
                ),
            ],
        ),
    );
    let hoist = Hoist::start_with(settings).await;
    let on = |list: &str| {
        object(
            list,
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", list),
                ("authRef", "eval-only"),
            ],
        )
    };
    assert_eq!(metric(&hoist, &on("jobs")).await.unwrap(), (3, 3.0));
    assert_eq!(metric(&hoist, &on("a-set")).await.unwrap(), (1, 1.0));
    assert!(redis.calls("eval") >= 2);
    assert_eq!(redis.calls("evalsha"), 0);
    assert_eq!(redis.calls("script|load"), 0);
}

/// Encrypted PKCS#8 client keys (`key` with `keyPassword`) are decrypted
/// and presented to a Redis that requires client certificates. The key
/// was encrypted by OpenSSL (`openssl pkcs8 -topk8 -v2 aes-256-cbc`).
#[tokio::test]
async fn mtls_to_redis_with_an_encrypted_client_key() {
    const PASSWORD: &str = "kafka&redis key";
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let encrypted = std::fs::read_to_string(data.join("client-key.aes256.pkcs8.pem")).unwrap();
    let clear = std::fs::read_to_string(data.join("client-key.clear.pkcs8.pem")).unwrap();

    let TlsRedis {
        redis,
        port: tls_port,
        ca,
        issuer,
        _dir,
        ..
    } = TlsRedis::start(true);
    let client_key = rcgen::KeyPair::from_pem(&clear).unwrap();
    let client = named("hoist", vec!["hoist".to_string()])
        .signed_by(&client_key, &issuer)
        .unwrap();
    redis.command(&["RPUSH", "secure", "a", "b", "c"]);

    let profile = |password: &str| -> hoist::config::AuthProfile {
        AuthProfile::new(
            &["default"],
            [
                ("tls".to_string(), AuthValue::Literal("enable".into())),
                ("ca".to_string(), AuthValue::Literal(ca.clone())),
                ("cert".to_string(), AuthValue::Literal(client.pem())),
                ("key".to_string(), AuthValue::Literal(encrypted.clone())),
                (
                    "keyPassword".to_string(),
                    AuthValue::Literal(password.into()),
                ),
            ],
        )
    };
    let mut settings = Settings::default();
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert("encrypted".into(), profile(PASSWORD));
    settings
        .auth
        .insert("wrong-password".into(), profile("not-the-password"));
    let hoist = Hoist::start_with(settings).await;
    let address = format!("localhost:{tls_port}");
    let with = |name: &str, profile: &str| {
        object(
            name,
            &[
                ("scaler", "redis"),
                ("address", &address),
                ("listName", "secure"),
                ("authRef", profile),
            ],
        )
    };
    assert_eq!(
        metric(&hoist, &with("secure", "encrypted")).await.unwrap(),
        (3, 3.0)
    );
    let refused = metric(&hoist, &with("secure-2", "wrong-password"))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("`keyPassword`"),
        "{}",
        refused.message()
    );
    assert!(!refused.message().contains("not-the-password"));
}

/// Certificate parameters with a name of their own: OpenSSL (a Redis
/// verifying hoist) takes a leaf named like its issuer for self-signed.
fn named(name: &str, sans: Vec<String>) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::new(sans).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params
}

/// A `redis-server` with a TLS port, its certificate issued by a CA made
/// here; with `require_client_certs`, clients must present one it issued.
struct TlsRedis {
    redis: RedisServer,
    port: String,
    ca: String,
    ca_file: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// Holds the certificate files; keep it bound while Redis runs.
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    fn start(require_client_certs: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = named("hoist test CA", Vec::new());
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = named("redis", vec!["localhost".to_string()])
            .signed_by(&server_key, &issuer)
            .unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path.display().to_string()
        };
        let ca_file = write("ca.pem", ca.clone());
        let cert_file = write("server.pem", server.pem());
        let key_file = write("server.key", server_key.serialize_pem());
        let port = support::free_port().to_string();
        let redis = RedisServer::start_with(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert_file,
            "--tls-key-file",
            &key_file,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            if require_client_certs { "yes" } else { "no" },
        ]);
        Self {
            redis,
            port,
            ca,
            ca_file,
            issuer,
            _dir: dir,
        }
    }
}
