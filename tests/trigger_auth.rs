//! Credentials bound to namespaces (issue 21, item 3): an auth profile
//! serves only the namespaces it lists, over real gRPC against a real
//! `redis-server`; and a trigger's `authenticationRef` resolved from
//! TriggerAuthentications, ClusterTriggerAuthentications and Secrets
//! watched on the Kubernetes API (served from loopback: see
//! `support/kube_api.rs`), a rotated Secret included.

#[path = "support/kube_api.rs"]
mod kube_api;
mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use hoist::cluster::{
    AuthenticationKind, AuthenticationRef, Cluster, ResolvedAuth, TriggerAuthError,
};
use hoist::config::{AuthProfile, AuthValue, KubernetesAccess, KubernetesSettings, Settings};
use kube_api::FakeApi;
use serde_json::json;
use support::{Hoist, RedisServer, eventually, object};
use tokio_util::sync::CancellationToken;
use tonic::Code;

const LIMIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_profile_serves_only_the_namespaces_it_lists() {
    let password = "orders-team-password-3391";
    let redis = RedisServer::start_with(&["--requirepass", password]);
    redis.command(&["RPUSH", "jobs", "a"]);
    let mut settings = Settings::default();
    let secret = || [("password", AuthValue::Literal(password.into()))];
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        "orders-redis".into(),
        AuthProfile::new(&["orders"], secret()),
    );
    settings
        .auth
        .insert("shared-redis".into(), AuthProfile::new(&["*"], secret()));
    let hoist = Hoist::start_with(settings).await;
    let trigger = |namespace: &str, profile: &str| {
        let mut object = object(
            "worker",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "jobs"),
                ("authRef", profile),
            ],
        );
        object.namespace = namespace.into();
        object
    };

    // A tenant in `shop` names the orders team's profile.
    let auths_before = redis.calls("auth");
    let refused = hoist.spec_refused(&trigger("shop", "orders-redis")).await;
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let message = refused.message();
    assert!(
        message.contains("`orders-redis`") && message.contains("`shop`"),
        "{message}"
    );
    assert!(!message.contains(password), "{message}");
    let refused = hoist
        .metric(&trigger("shop", "orders-redis"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    // One AUTH: `calls` itself connects with the password; hoist sent none.
    assert_eq!(
        redis.calls("auth"),
        auths_before + 1,
        "hoist never used the password for shop"
    );

    // The orders team itself, and a profile open to every namespace.
    assert_eq!(
        hoist
            .metric(&trigger("orders", "orders-redis"))
            .await
            .unwrap(),
        (1, 1.0)
    );
    assert_eq!(
        hoist
            .metric(&trigger("shop", "shared-redis"))
            .await
            .unwrap(),
        (1, 1.0)
    );
}

#[test]
fn check_config_refuses_a_profile_without_namespaces_and_warns_about_star() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    let check = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_hoist"))
            .args(["check-config", "--config", file.to_str().unwrap()])
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };

    let (ok, stderr) = check("[auth.orders-redis]\npassword = \"hunter2-canary\"\n");
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("auth.orders-redis.namespaces"), "{stderr}");
    assert!(
        stderr.contains("add `namespaces = [\"<namespace>\"]` to [auth.orders-redis]"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2-canary"), "{stderr}");

    let (ok, stderr) = check("[auth.shared]\nnamespaces = [\"*\"]\npassword = \"x\"\n");
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("warning: auth profile `shared` has namespaces = [\"*\"]"),
        "{stderr}"
    );

    let (ok, stderr) = check("[auth.orders]\nnamespaces = [\"orders\"]\npassword = \"x\"\n");
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

async fn connect(api: &FakeApi, trigger_authentication: bool) -> (Arc<Cluster>, CancellationToken) {
    let settings = KubernetesSettings {
        enabled: KubernetesAccess::On,
        kubeconfig: Some(api.kubeconfig()),
        timeout: Duration::from_secs(2),
        trigger_authentication,
        ..KubernetesSettings::default()
    };
    let cancel = CancellationToken::new();
    let cluster = Cluster::connect(&settings, cancel.clone())
        .await
        .unwrap()
        .expect("cluster access");
    (cluster, cancel)
}

fn reference(name: &str, kind: AuthenticationKind) -> AuthenticationRef {
    AuthenticationRef {
        name: name.into(),
        kind,
    }
}

/// Resolves until `check` accepts the answer (the watch catches up), or
/// fails with the last answer after `LIMIT`.
async fn resolved_until(
    cluster: &Cluster,
    namespace: &str,
    reference: &AuthenticationRef,
    what: &str,
    check: impl Fn(&Result<ResolvedAuth, TriggerAuthError>) -> bool,
) -> Result<ResolvedAuth, TriggerAuthError> {
    let mut last = None;
    eventually(LIMIT, what, || {
        let answer = cluster.trigger_authentication(namespace, reference);
        let done = check(&answer);
        last = Some(answer);
        async move { done }
    })
    .await;
    last.unwrap()
}

#[tokio::test]
async fn secret_target_refs_resolve_and_follow_a_rotated_secret() {
    let api = FakeApi::start().await;
    api.put_secret("shop", "redis-auth", &[("pw", "first-password")]);
    api.put_trigger_authentication(
        "shop",
        "orders",
        json!({"secretTargetRef": [{"parameter": "Password", "name": "redis-auth", "key": "pw"}]}),
    );
    let (cluster, cancel) = connect(&api, true).await;
    let orders = reference("orders", AuthenticationKind::TriggerAuthentication);

    let first = resolved_until(
        &cluster,
        "shop",
        &orders,
        "the first resolution",
        Result::is_ok,
    )
    .await
    .unwrap();
    assert_eq!(
        first.params,
        [("password".to_string(), "first-password".to_string())].into()
    );
    assert!(
        !format!("{first:?}").contains("first-password"),
        "Debug hides values"
    );

    // Rotation: a new version of the Secret through the API.
    api.put_secret("shop", "redis-auth", &[("pw", "second-password")]);
    let second = resolved_until(
        &cluster,
        "shop",
        &orders,
        "the rotated password",
        |answer| matches!(answer, Ok(auth) if auth.params["password"] == "second-password"),
    )
    .await
    .unwrap();
    assert_ne!(second.version, first.version);

    // An edit of the TriggerAuthentication changes the version too.
    api.put_trigger_authentication(
        "shop",
        "orders",
        json!({"secretTargetRef": [
            {"parameter": "password", "name": "redis-auth", "key": "pw"},
            {"parameter": "username", "name": "redis-auth", "key": "pw"},
        ]}),
    );
    let third = resolved_until(
        &cluster,
        "shop",
        &orders,
        "the edited TriggerAuthentication",
        |answer| matches!(answer, Ok(auth) if auth.params.contains_key("username")),
    )
    .await
    .unwrap();
    assert_ne!(third.version, second.version);

    // Another namespace's ScaledObject naming it finds its own namespace's
    // TriggerAuthentication, which does not exist.
    let error = cluster
        .trigger_authentication("other", &orders)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "TriggerAuthentication other/orders does not exist (keda.sh/v1alpha1)"
    );
    cancel.cancel();
}

#[tokio::test]
async fn a_cluster_trigger_authentication_reads_the_cluster_object_namespace() {
    let api = FakeApi::start().await;
    api.put_secret("keda", "shared-redis", &[("password", "from-keda")]);
    // A Secret of the same name in the ScaledObject's namespace is not it.
    api.put_secret("shop", "shared-redis", &[("password", "from-shop")]);
    api.put_cluster_trigger_authentication(
        "shared",
        json!({
            "podIdentity": {"provider": "none"},
            "secretTargetRef": [{"parameter": "password", "name": "shared-redis", "key": "password"}],
        }),
    );
    let (cluster, cancel) = connect(&api, true).await;
    let shared = reference("shared", AuthenticationKind::ClusterTriggerAuthentication);
    let auth = resolved_until(&cluster, "shop", &shared, "the resolution", Result::is_ok)
        .await
        .unwrap();
    assert_eq!(auth.params["password"], "from-keda");
    // A TriggerAuthentication of that name is another object.
    let namespaced = reference("shared", AuthenticationKind::TriggerAuthentication);
    assert!(matches!(
        cluster.trigger_authentication("shop", &namespaced),
        Err(TriggerAuthError::NotFound { .. })
    ));
    cancel.cancel();
}

#[tokio::test]
async fn missing_secrets_keys_and_unsupported_sources_are_named() {
    let api = FakeApi::start().await;
    api.put_secret("shop", "redis-auth", &[("pw", "secret-value-8812")]);
    let target = |name: &str, key: &str| json!({"secretTargetRef": [{"parameter": "password", "name": name, "key": key}]});
    api.put_trigger_authentication("shop", "no-secret", target("absent", "pw"));
    api.put_trigger_authentication("shop", "no-key", target("redis-auth", "password"));
    api.put_trigger_authentication(
        "shop",
        "vault",
        json!({"hashiCorpVault": {"address": "http://vault:8200"}}),
    );
    let (cluster, cancel) = connect(&api, true).await;
    let kind = AuthenticationKind::TriggerAuthentication;
    let not_syncing = |answer: &Result<ResolvedAuth, TriggerAuthError>| {
        !matches!(answer, Err(TriggerAuthError::NotSynced { .. }))
    };

    // Once the stores have listed, every answer is final.
    resolved_until(
        &cluster,
        "shop",
        &reference("no-secret", kind),
        "the stores",
        not_syncing,
    )
    .await
    .unwrap_err();
    let refused = |name: &str| {
        let error = cluster
            .trigger_authentication("shop", &reference(name, kind))
            .unwrap_err();
        assert!(!error.to_string().contains("secret-value-8812"), "{error}");
        error
    };
    assert_eq!(
        refused("no-secret").to_string(),
        "TriggerAuthentication shop/no-secret: secretTargetRef parameter `password` reads Secret shop/absent, which does not exist"
    );
    assert_eq!(
        refused("no-key").to_string(),
        "TriggerAuthentication shop/no-key: secretTargetRef parameter `password` reads key `password` of Secret shop/redis-auth, which has no such key"
    );
    let vault = refused("vault");
    assert!(
        matches!(&vault, TriggerAuthError::Unsupported { field, .. } if field == "hashiCorpVault"),
        "{vault}"
    );
    assert!(
        vault
            .to_string()
            .starts_with("TriggerAuthentication shop/vault: `spec.hashiCorpVault`"),
        "{vault}"
    );

    // The Secret appears: the same reference now resolves.
    api.put_secret("shop", "absent", &[("pw", "late")]);
    let late = resolved_until(
        &cluster,
        "shop",
        &reference("no-secret", kind),
        "the new Secret",
        Result::is_ok,
    )
    .await
    .unwrap();
    assert_eq!(late.params["password"], "late");
    cancel.cancel();
}

#[tokio::test]
async fn without_the_setting_or_the_rbac_it_says_why() {
    let api = FakeApi::start().await;
    api.put_trigger_authentication("shop", "orders", json!({}));
    let orders = reference("orders", AuthenticationKind::TriggerAuthentication);

    let (off, cancel) = connect(&api, false).await;
    let error = off.trigger_authentication("shop", &orders).unwrap_err();
    assert!(
        matches!(error, TriggerAuthError::Disabled { .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("kubernetes.trigger_authentication"),
        "{error}"
    );
    cancel.cancel();

    api.forbid("triggerauthentications", true);
    let (forbidden, cancel) = connect(&api, true).await;
    let error = resolved_until(&forbidden, "shop", &orders, "the 403 to be seen", |answer| {
        matches!(answer, Err(TriggerAuthError::NotSynced { reason, .. }) if reason.contains("403"))
    })
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("triggerauthentications.keda.sh"),
        "{error}"
    );
    // Granted: the watch recovers on its own.
    api.forbid("triggerauthentications", false);
    let auth = resolved_until(
        &forbidden,
        "shop",
        &orders,
        "the watch to recover",
        Result::is_ok,
    )
    .await
    .unwrap();
    assert!(auth.params.is_empty());
    cancel.cancel();
}

#[tokio::test]
async fn keda_calls_use_the_triggers_own_trigger_authentication_and_follow_a_rotation() {
    let (old, new) = ("first-password-1187", "rotated-password-5523");
    let redis = RedisServer::start_with(&["--requirepass", old]);
    redis.command(&["RPUSH", "jobs", "a", "b"]);
    let call = {
        let mut call = object(
            "worker",
            &[
                ("scaler", "redis"),
                ("address", &redis.address()),
                ("listName", "jobs"),
            ],
        );
        call.namespace = "orders".into();
        call
    };
    let api = FakeApi::start().await;
    api.put_secret("orders", "redis-secret", &[("password", old)]);
    api.put_trigger_authentication(
        "orders",
        "redis-auth",
        json!({"secretTargetRef": [{"parameter": "password", "name": "redis-secret", "key": "password"}]}),
    );
    let mut spec = kube_api::with_triggers(json!({"scaleTargetRef": {"name": "worker"}}), &[&call]);
    spec["triggers"][0]["authenticationRef"] = json!({"name": "redis-auth"});
    api.put_scaled_object("orders", "worker", spec);
    let mut settings = Settings::default();
    settings.kubernetes.kubeconfig = Some(api.kubeconfig());
    settings.kubernetes.trigger_authentication = true;
    let hoist = Hoist::start_with(settings).await;
    assert_eq!(hoist.metric(&call).await.unwrap(), (2, 2.0));

    // The team rotates its password: the Secret, then Redis, whose open
    // connections are closed so that every client must log in again.
    redis.command(&["RPUSH", "jobs", "c"]);
    api.put_secret("orders", "redis-secret", &[("password", new)]);
    redis.command(&["CONFIG", "SET", "requirepass", new]);
    let mut admin = redis::Client::open(format!("redis://:{new}@{}", redis.address()))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: redis::Value = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query(&mut admin)
        .unwrap();
    eventually(Duration::from_secs(15), "the new password used", || async {
        hoist.metric(&call).await.ok() == Some((3, 3.0))
    })
    .await;
}
