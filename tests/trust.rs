//! Trust comes from the cluster: a caller of hoist's gRPC port cannot
//! claim a ScaledObject, a route or a namespace it does not own. Real
//! hoist servers, gRPC clients, upstream apps and HTTP clients on
//! loopback; the Kubernetes API is the loopback stand-in of
//! tests/support/kube_api.rs (no API server runs here).

#[path = "support/kube_api.rs"]
mod kube_api;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use hoist::config::Settings;
use hoist::proto::ScaledObjectRef;
use http::StatusCode;
use serde_json::{Value, json};
use tonic::Code;

use kube_api::{FakeApi, with_triggers};
use support::web::{Upstream, full, http1_client, send};
use support::{Hoist, eventually, object};

const PATIENCE: Duration = Duration::from_secs(10);

/// hoist serve with an in-process interceptor whose rules let the tests'
/// loopback apps be upstreams and `*.example` hosts be routed.
fn in_process() -> Settings {
    let mut settings = Settings::default();
    settings.interceptor.enabled = true;
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    settings.interceptor.allowed_hosts = [("*".to_string(), vec!["*.example".to_string()])].into();
    // The apps are on loopback, which declared routes may not reach by default.
    settings.interceptor.denied_networks = Vec::new();
    settings
}

/// `in_process`, reading ScaledObjects from `api`.
fn in_cluster(api: &FakeApi) -> Settings {
    let mut settings = in_process();
    settings.kubernetes.kubeconfig = Some(api.kubeconfig());
    settings.kubernetes.timeout = Duration::from_secs(2);
    settings.kubernetes.new_object_wait = Duration::from_millis(500);
    settings
}

/// An app answering every request with `name`.
async fn app(name: &'static str) -> Upstream {
    Upstream::start(move |_| async move { http::Response::new(full(name)) }).await
}

/// KEDA's call for an `http` trigger of `namespace/name` declaring a route.
fn route_call(namespace: &str, name: &str, host: &str, upstream: SocketAddr) -> ScaledObjectRef {
    ScaledObjectRef {
        namespace: namespace.into(),
        ..object(
            name,
            &[
                ("scaler", "http"),
                ("host", host),
                ("upstream", &upstream.to_string()),
            ],
        )
    }
}

fn deployment(calls: &[&ScaledObjectRef]) -> Value {
    with_triggers(json!({"scaleTargetRef": {"name": "app"}}), calls)
}

/// What the proxy answers for `host`.
async fn through(hoist: &Hoist, host: &str) -> (StatusCode, String) {
    send(&http1_client(), hoist.http_proxy.unwrap(), host, "/").await
}

async fn served_by(hoist: &Hoist, host: &str, app: &str) {
    eventually(PATIENCE, &format!("{host} served by {app}"), || async {
        through(hoist, host).await == (StatusCode::OK, app.to_string())
    })
    .await;
}

#[tokio::test]
async fn a_stranger_cannot_declare_or_move_another_teams_route() {
    let (shop_app, attacker_app) = (app("shop").await, app("attacker").await);
    let shop = route_call("shop", "web", "shop.example", shop_app.addr);
    let api = FakeApi::start().await;
    api.put_scaled_object("shop", "web", deployment(&[&shop]));
    let hoist = Hoist::start_with(in_cluster(&api)).await;
    // The route is the ScaledObject's: served before KEDA asks at all.
    served_by(&hoist, "shop.example", "shop").await;
    hoist.spec(&shop).await;
    // One host, whatever its case or a fully qualified name's dot.
    assert_eq!(through(&hoist, "SHOP.example.").await.1, "shop");

    // The same ScaledObject named, the upstream moved.
    let forged = route_call("shop", "web", "shop.example", attacker_app.addr);
    let refused = hoist.spec_refused(&forged).await;
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("shop/web") && refused.message().contains("`upstream`"),
        "{}",
        refused.message()
    );
    assert!(
        !refused.message().contains(&attacker_app.addr.to_string()),
        "values are not echoed: {}",
        refused.message()
    );
    // A ScaledObject that does not exist, in a namespace posing as hoist's own.
    let ghost = route_call("keda", "ghost", "ghost.example", attacker_app.addr);
    let refused = hoist.spec_refused(&ghost).await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused
            .message()
            .contains("keda/ghost is not in the cluster"),
        "{}",
        refused.message()
    );
    assert_eq!(through(&hoist, "shop.example").await.1, "shop");
    assert_eq!(
        through(&hoist, "ghost.example").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(attacker_app.requests(), 0);
}

#[tokio::test]
async fn a_new_scaledobject_is_waited_for_and_a_deleted_ones_trigger_stops() {
    let web_app = app("web").await;
    let web = route_call("shop", "web", "web.example", web_app.addr);
    let api = FakeApi::start().await;
    let mut settings = in_cluster(&api);
    settings.kubernetes.new_object_wait = Duration::from_secs(5);
    let hoist = Hoist::start_with(settings).await;
    let asked = {
        let (hoist_grpc, web) = (hoist.grpc, web.clone());
        tokio::spawn(async move {
            hoist::proto::external_scaler_client::ExternalScalerClient::connect(format!(
                "http://{hoist_grpc}"
            ))
            .await
            .unwrap()
            .get_metric_spec(web)
            .await
        })
    };
    // KEDA asks as it sees the new ScaledObject; hoist's watch is behind.
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.put_scaled_object("shop", "web", deployment(&[&web]));
    asked
        .await
        .unwrap()
        .expect("answered once the watch has it");
    served_by(&hoist, "web.example", "web").await;

    api.delete_scaled_object("shop", "web");
    eventually(PATIENCE, "the route gone with its ScaledObject", || async {
        through(&hoist, "web.example").await.0 == StatusCode::NOT_FOUND
    })
    .await;
    eventually(PATIENCE, "the trigger stopped", || async {
        hoist
            .get("/metrics")
            .await
            .1
            .contains("hoist_revoked_triggers_total{reason=\"cluster\"} 1")
    })
    .await;
    // A replay of KEDA's old call does not bring it back.
    assert_eq!(
        hoist.spec_refused(&web).await.code(),
        Code::PermissionDenied
    );
}

#[tokio::test]
async fn names_no_kubernetes_object_can_have_are_refused_before_anything_sees_them() {
    let api = FakeApi::start().await;
    let hoist = Hoist::start_with(in_cluster(&api)).await;
    let unclustered = Hoist::start_with(in_process()).await;
    for (namespace, name) in [("*", "web"), ("a/b", "web"), ("shop", "*"), ("shop", "a/b")] {
        let call = ScaledObjectRef {
            namespace: namespace.into(),
            ..object(name, &[("scaler", "http"), ("host", "x.example")])
        };
        for hoist in [&hoist, &unclustered] {
            let refused = hoist.spec_refused(&call).await;
            assert_eq!(refused.code(), Code::InvalidArgument, "{namespace}/{name}");
            assert!(
                refused.message().contains("DNS-1123"),
                "{}",
                refused.message()
            );
        }
    }
}

#[tokio::test]
async fn without_the_cluster_declared_routes_need_callers_the_operator_trusts() {
    let web_app = app("web").await;
    let web = route_call("default", "web", "web.example", web_app.addr);
    let anyone = Hoist::start_with(in_process()).await;
    let refused = anyone.spec_refused(&web).await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("grpc.trust_callers"),
        "{}",
        refused.message()
    );
    assert_eq!(
        through(&anyone, "web.example").await.0,
        StatusCode::NOT_FOUND
    );

    let mut trusting = in_process();
    trusting.grpc.trust_callers = true;
    let trusting = Hoist::start_with(trusting).await;
    trusting.spec(&web).await;
    served_by(&trusting, "web.example", "web").await;
}

#[tokio::test]
async fn two_scaler_replicas_agree_the_oldest_scaledobject_holds_a_host() {
    let (old_app, new_app) = (app("old").await, app("new").await);
    let old = route_call("team-b", "old", "shared.example", old_app.addr);
    let new = route_call("team-a", "new", "shared.example", new_app.addr);
    let api = FakeApi::start().await;
    // Created in this order; listed (and asked about) the other way round.
    api.put_scaled_object_created("team-b", "old", deployment(&[&old]), "2026-01-01T00:00:00Z");
    api.put_scaled_object_created("team-a", "new", deployment(&[&new]), "2026-01-02T00:00:00Z");
    let first = Hoist::start_with(in_cluster(&api)).await;
    let second = Hoist::start_with(in_cluster(&api)).await;
    for replica in [&first, &second] {
        let refused = replica.spec_refused(&new).await;
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains("team-b/old"),
            "{}",
            refused.message()
        );
        served_by(replica, "shared.example", "old").await;
    }
    second.spec(&old).await;

    // The older one deleted: both hand the host to the next oldest.
    api.delete_scaled_object("team-b", "old");
    for replica in [&first, &second] {
        served_by(replica, "shared.example", "new").await;
        replica.spec(&new).await;
    }
}

#[tokio::test]
async fn a_namespace_past_its_route_quota_is_refused_naming_the_setting() {
    let apps = [app("a").await, app("b").await];
    let a = route_call("greedy", "a", "a.example", apps[0].addr);
    let b = route_call("greedy", "b", "b.example", apps[1].addr);
    let api = FakeApi::start().await;
    api.put_scaled_object("greedy", "a", deployment(&[&a]));
    api.put_scaled_object("greedy", "b", deployment(&[&b]));
    let mut settings = in_cluster(&api);
    settings.interceptor.max_routes_per_namespace = 1;
    let hoist = Hoist::start_with(settings).await;
    served_by(&hoist, "a.example", "a").await;
    let refused = hoist.spec_refused(&b).await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused
            .message()
            .contains("interceptor.max_routes_per_namespace"),
        "{}",
        refused.message()
    );
}

#[tokio::test]
async fn a_reload_that_tightens_allowed_sources_stops_tracked_triggers() {
    let redis = support::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    let allowing = |pattern: &str| format!("[limits]\nallowed_sources = [\"{pattern}\"]\n");
    std::fs::write(&file, allowing("127.0.0.1:*")).unwrap();
    let hoist = Hoist::start_from_file(&file).await;
    let jobs = object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    hoist.spec(&jobs).await;
    std::fs::write(&file, allowing("redis.orders.svc.cluster.local:*")).unwrap();
    eventually(PATIENCE, "the trigger revoked", || async {
        hoist
            .get("/metrics")
            .await
            .1
            .contains("hoist_revoked_triggers_total{reason=\"reload\"} 1")
    })
    .await;
    let refused = hoist.spec_refused(&jobs).await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("limits.allowed_sources"),
        "{}",
        refused.message()
    );
}

#[tokio::test]
async fn a_split_interceptor_checks_the_scalers_table_against_its_own_rules() {
    let scaler_admin: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let mut follower = in_process();
    follower.interceptor.enabled = false;
    follower.interceptor.allowed_hosts =
        [("*".to_string(), vec!["*.allowed.example".to_string()])].into();
    follower.interceptor.scaler = Some(scaler_admin.to_string());
    let follower = Hoist::start_interceptor(follower).await;
    let mut scaler = in_process();
    scaler.interceptor.enabled = false;
    scaler.grpc.trust_callers = true;
    scaler.admin.listen = scaler_admin;
    scaler.interceptor.allowed_hosts = [("*".to_string(), vec!["*".to_string()])].into();
    scaler.interceptor.endpoints = vec![follower.admin.to_string()];
    let scaler = Hoist::start_with(scaler).await;
    let (good, bad) = (app("good").await, app("bad").await);
    scaler
        .spec(&route_call(
            "default",
            "good",
            "web.allowed.example",
            good.addr,
        ))
        .await;
    scaler
        .spec(&route_call("default", "bad", "web.example", bad.addr))
        .await;
    served_by(&follower, "web.allowed.example", "good").await;
    assert_eq!(
        through(&follower, "web.example").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(bad.requests(), 0);
}

#[tokio::test]
async fn two_scalers_and_two_split_interceptors_serve_one_table() {
    let (old_app, new_app) = (app("old").await, app("new").await);
    let old = route_call("team-b", "old", "shared.example", old_app.addr);
    let new = route_call("team-a", "new", "shared.example", new_app.addr);
    let api = FakeApi::start().await;
    api.put_scaled_object_created("team-a", "new", deployment(&[&new]), "2026-01-02T00:00:00Z");
    api.put_scaled_object_created("team-b", "old", deployment(&[&old]), "2026-01-01T00:00:00Z");
    let admins: Vec<SocketAddr> = (0..2)
        .map(|_| {
            format!("127.0.0.1:{}", support::free_port())
                .parse()
                .unwrap()
        })
        .collect();
    // Interceptor i follows scaler i; each scaler reads both.
    let mut interceptors = Vec::new();
    for admin in &admins {
        let mut follower = in_process();
        follower.interceptor.enabled = false;
        follower.interceptor.scaler = Some(admin.to_string());
        interceptors.push(Hoist::start_interceptor(follower).await);
    }
    let mut scalers = Vec::new();
    for admin in &admins {
        let mut scaler = in_cluster(&api);
        scaler.interceptor.enabled = false;
        scaler.admin.listen = *admin;
        scaler.interceptor.endpoints = interceptors.iter().map(|i| i.admin.to_string()).collect();
        scalers.push(Hoist::start_with(scaler).await);
    }
    // Nobody asked: every interceptor serves the oldest ScaledObject's route.
    for interceptor in &interceptors {
        served_by(interceptor, "shared.example", "old").await;
    }
    // KEDA's connection lands on one scaler; the answer is the same on both.
    for scaler in &scalers {
        let refused = scaler.spec_refused(&new).await;
        assert!(
            refused.message().contains("team-b/old"),
            "{}",
            refused.message()
        );
        scaler.spec(&old).await;
    }
    api.delete_scaled_object("team-b", "old");
    for interceptor in &interceptors {
        served_by(interceptor, "shared.example", "new").await;
    }
}

/// A Redis trigger of `default/worker` reading `jobs` with the profile
/// `orders-redis`, its address written as `address` or sent as KEDA sends
/// an `addressFromEnv` (the resolved value).
fn redis_call(address: &str, from_env: bool) -> ScaledObjectRef {
    let key = if from_env {
        "addressFromEnv"
    } else {
        "address"
    };
    object(
        "worker",
        &[
            ("scaler", "redis"),
            (key, address),
            ("listName", "jobs"),
            ("authRef", "orders-redis"),
        ],
    )
}

fn with_profile(mut settings: Settings, password: &str) -> Settings {
    settings.auth.insert(
        "orders-redis".into(),
        hoist::config::AuthProfile::new(
            &["default"],
            [(
                "password",
                hoist::config::AuthValue::Literal(password.into()),
            )],
        ),
    );
    settings
}

#[tokio::test]
async fn credentials_are_lent_only_to_callers_and_values_hoist_can_check() {
    let password = "orders-password-7781";
    let redis = support::RedisServer::start_with(&["--requirepass", password]);
    redis.command(&["RPUSH", "jobs", "a"]);
    let address = redis.address();

    // Without a cluster a namespace is the caller's word: no profile.
    let anyone = Hoist::start_with(with_profile(in_process(), password)).await;
    let refused = anyone.spec_refused(&redis_call(&address, false)).await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("`authRef`") && refused.message().contains("grpc.trust_callers"),
        "{}",
        refused.message()
    );

    // In a cluster, the ScaledObject's own literal address gets the
    // password; a value KEDA would read from the environment does not,
    // whoever sends it (a stranger could send its own server's address).
    let written = redis_call(&address, false);
    let from_env = redis_call(&address, true);
    let mut from_env_trigger = from_env.clone();
    from_env_trigger
        .scaler_metadata
        .insert("addressFromEnv".into(), "REDIS_ADDRESS".into());
    let api = FakeApi::start().await;
    api.put_scaled_object(
        "default",
        "worker",
        deployment(&[&written, &from_env_trigger]),
    );
    let hoist = Hoist::start_with(with_profile(in_cluster(&api), password)).await;
    assert_eq!(hoist.metric(&written).await.unwrap(), (1, 1.0));
    let auths = redis.calls("auth");
    let refused = hoist.spec_refused(&from_env).await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("`addressFromEnv`"),
        "{}",
        refused.message()
    );
    // One AUTH: `calls` connects with the password itself; hoist sent none.
    assert_eq!(redis.calls("auth"), auths + 1);
}

#[tokio::test]
async fn a_scaledjobs_triggers_are_served_like_a_scaledobjects() {
    let redis = support::RedisServer::start();
    redis.command(&["RPUSH", "jobs", "a", "b"]);
    let call = object(
        "batch",
        &[
            ("scaler", "redis"),
            ("address", &redis.address()),
            ("listName", "jobs"),
        ],
    );
    let api = FakeApi::start().await;
    api.put_object(
        "scaledjobs",
        "default",
        "batch",
        json!({"spec": with_triggers(json!({"jobTargetRef": {"template": {}}}), &[&call])}),
    );
    let hoist = Hoist::start_with(in_cluster(&api)).await;
    assert_eq!(hoist.metric(&call).await.unwrap(), (2, 2.0));
    // A name that is neither a ScaledObject nor a ScaledJob is refused.
    let mut other = call.clone();
    other.name = "batch-2".into();
    assert_eq!(
        hoist.spec_refused(&other).await.code(),
        Code::PermissionDenied
    );
}
