//! hoist called by the real KEDA: a real kube-apiserver and etcd, the real
//! HPA controller (kube-controller-manager) and KEDA's real operator and
//! metrics adapter, built from their Go modules and started on loopback by
//! `scripts/controlplane.sh` (see `support/controlplane.rs`). hoist runs in
//! this process as the Helm chart's ServiceAccount, with the chart's RBAC
//! and nothing more; Redis is a real `redis-server`. KEDA polls every
//! second or two and the HPA syncs every second, so each scenario takes
//! seconds; every wait is bounded and asserts the replica trajectory the
//! Deployment went through, not just where it ended. No kubelet: pods
//! stay Pending, which the HPA's external-metric arithmetic does not mind.

#[path = "support/controlplane.rs"]
mod controlplane;
mod support;

use std::time::Duration;

use controlplane::{ControlPlane, control_plane, replicas, trajectory, visits};
use hoist::config::Settings;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use support::web::{Upstream, echo, http_route, http1_client, send};
use support::{Hoist, RedisServer, free_port};

/// Scenarios that stop parts of the control plane take this alone; every
/// other scenario shares it (they run at once, each in its own namespace).
static DISRUPTION: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Long enough for KEDA's first reconcile, an HPA sync and a poll, with
/// room for a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(90);

/// A Deployment `name` at `replicas` (its pods never run: no kubelet).
fn deployment(namespace: &str, name: &str, replicas: i32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: app, image: registry.invalid/{name}:1}}]
"#
    )
}

/// hoist as the chart's ServiceAccount with hoist's defaults, on `grpc`
/// (a port KEDA is told), its admin port on a free one.
async fn hoist_in(plane: &ControlPlane, grpc: u16, tune: impl FnOnce(&mut Settings)) -> Hoist {
    let mut settings = Settings::default();
    tune(&mut settings);
    plane.start_hoist(settings, grpc).await
}

/// The notes of the Events hoist posted on ScaledObjects in `namespace`
/// with `reason`, read back from the API.
async fn hoist_events(client: &kube::Client, namespace: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), namespace);
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some(reason)
                && event.reporting_controller.as_deref() == Some("hoist")
                && event.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ScaledObject")
        })
        .filter_map(|event| event.note)
        .collect()
}

/// How many times ScaledObject `name` was written in the next `window`,
/// counted from a watch of it.
async fn writes_to(client: &kube::Client, namespace: &str, name: &str, window: Duration) -> usize {
    use futures::StreamExt;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, WatchEvent, WatchParams};
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let version = api
        .get(name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(window.as_secs() as u32 + 5);
    let mut events = api.watch(&params, &version).await.unwrap().boxed();
    let mut writes = 0;
    let until = tokio::time::Instant::now() + window;
    while let Ok(Some(event)) = tokio::time::timeout_at(until, events.next()).await {
        if let Ok(WatchEvent::Modified(_)) = event {
            writes += 1;
        }
    }
    writes
}

/// One scenario's world: a namespace of its own with a Deployment
/// `worker` at 0, a Redis, and hoist (as the chart's ServiceAccount) on a
/// port KEDA is told.
struct Scene {
    namespace: String,
    redis: RedisServer,
    grpc: u16,
    hoist: Hoist,
    client: kube::Client,
    deployments: Api<Deployment>,
}

impl Scene {
    async fn start(
        plane: &ControlPlane,
        namespace: &str,
        redis: RedisServer,
        tune: impl FnOnce(&mut Settings),
    ) -> Self {
        let namespace = plane.namespace(namespace);
        let grpc = free_port();
        let hoist = hoist_in(plane, grpc, tune).await;
        plane.apply(&deployment(&namespace, "worker", 0));
        let client = plane.client().await;
        let deployments = Api::namespaced(client.clone(), &namespace);
        Self {
            namespace,
            redis,
            grpc,
            hoist,
            client,
            deployments,
        }
    }

    /// The worker's `spec.replicas` (what KEDA and the HPA write).
    async fn replicas(&self) -> Option<i32> {
        replicas(&self.deployments, "worker").await
    }

    /// The worker's replicas as they change, until `done` holds for them.
    async fn until(&self, what: &str, done: impl Fn(&[i32]) -> bool) -> Vec<i32> {
        trajectory(LIMIT, what, || self.replicas(), done).await
    }

    /// Until the worker asks for `replicas`.
    async fn reaches(&self, replicas: i32) -> Vec<i32> {
        self.until(&format!("{replicas} replicas"), |seen| {
            seen.last() == Some(&replicas)
        })
        .await
    }

    /// Every value the worker's replicas took over `how_long` from `start`.
    async fn holds(&self, start: i32, how_long: Duration) -> Vec<i32> {
        let mut seen = vec![start];
        let until = std::time::Instant::now() + how_long;
        while std::time::Instant::now() < until {
            if let Some(now) = self.replicas().await
                && seen.last() != Some(&now)
            {
                seen.push(now);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    }

    /// hoist stopped and started again where KEDA knows it.
    async fn restart_hoist(self, plane: &ControlPlane, tune: impl FnOnce(&mut Settings)) -> Self {
        self.hoist.stop().await.unwrap();
        Self {
            hoist: hoist_in(plane, self.grpc, tune).await,
            ..self
        }
    }
}

/// KEDA's intervals for a passthrough ScaledObject, in seconds.
struct Polling {
    every: u32,
    cooldown: u32,
    max: u32,
}

/// A passthrough ScaledObject for the scene's worker on its Redis list
/// `jobs` (5 jobs per replica, hoist polling every second), with a trigger
/// of `kind` (`external` or `external-push`) and its own
/// TriggerAuthentication when named.
fn redis_scaled_object(
    scene: &Scene,
    polling: Polling,
    kind: &str,
    authentication: Option<&str>,
) -> String {
    let authentication = authentication
        .map(|name| format!("    authenticationRef: {{name: {name}}}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: worker, namespace: {namespace}}}
spec:
  scaleTargetRef: {{name: worker}}
  pollingInterval: {every}
  cooldownPeriod: {cooldown}
  minReplicaCount: 0
  maxReplicaCount: {max}
  triggers:
  - type: {kind}
{authentication}    metadata:
      scalerAddress: 127.0.0.1:{grpc}
      scaler: redis
      address: {address}
      listName: jobs
      listLength: "5"
      pollingInterval: "1"
"#,
        namespace = scene.namespace,
        every = polling.every,
        cooldown = polling.cooldown,
        max = polling.max,
        grpc = scene.grpc,
        address = scene.redis.address()
    )
}

/// The Secret `redis-secret` holding `password` under `password`.
fn redis_secret(namespace: &str, password: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: redis-secret, namespace: {namespace}}}\nstringData: {{password: {password}}}\n"
    )
}

/// `redis_secret` and the TriggerAuthentication `redis-auth` that lends
/// its password to a trigger as `password`.
fn redis_credentials(namespace: &str, password: &str) -> String {
    format!(
        r#"{secret}---
apiVersion: keda.sh/v1alpha1
kind: TriggerAuthentication
metadata: {{name: redis-auth, namespace: {namespace}}}
spec:
  secretTargetRef:
  - {{parameter: password, name: redis-secret, key: password}}
"#,
        secret = redis_secret(namespace, password)
    )
}

/// A Service `name` without a selector (so only the test makes its
/// EndpointSlices) on port 80 (`http`, to target port 8080), and one
/// EndpointSlice of it whose one endpoint is `app`, ready or not.
fn service_with_slice(
    namespace: &str,
    name: &str,
    app: std::net::SocketAddr,
    ready: bool,
) -> String {
    service_with_slices(namespace, name, &[(app, ready)])
}

/// As `service_with_slice`, with one EndpointSlice per app (`{name}-1`,
/// `{name}-2`, ...): apps on one address differ by port, which a slice
/// gives all its endpoints alike (as in a rollout that changes the
/// target port).
fn service_with_slices(
    namespace: &str,
    name: &str,
    apps: &[(std::net::SocketAddr, bool)],
) -> String {
    let mut manifests = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"#
    );
    for (index, (app, ready)) in apps.iter().enumerate() {
        manifests.push_str(&format!(
            r#"---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-{number}
  namespace: {namespace}
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
  - addresses: ["{ip}"]
    conditions: {{ready: {ready}}}
"#,
            number = index + 1,
            ip = app.ip(),
            port = app.port(),
        ));
    }
    manifests
}

/// An app on this machine's own address (not loopback, which an
/// EndpointSlice may not hold): the address a UDP socket "connected"
/// towards a documentation address would send from (nothing is sent).
async fn app_on_this_machines_address() -> Upstream {
    Upstream::serve(listener_on_this_machines_address().await, echo)
}

async fn listener_on_this_machines_address() -> tokio::net::TcpListener {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    probe.connect("192.0.2.1:9").unwrap();
    let address = probe.local_addr().unwrap().ip();
    assert!(
        !address.is_loopback(),
        "this machine has an address of its own"
    );
    tokio::net::TcpListener::bind((address, 0)).await.unwrap()
}

/// hoist's interceptor with one route, `host` to the Service `name` in
/// `namespace` by its cluster name (which resolves nowhere on this
/// machine: only the Service's EndpointSlices lead to the app), dialling
/// pods (`interceptor.direct_to_pods`).
fn dial_pods_of(settings: &mut Settings, host: &str, name: &str, namespace: &str) {
    let upstream = format!("{name}.{namespace}.svc.cluster.local:80");
    let mut route = http_route(name, host, "127.0.0.1:1".parse().unwrap());
    route.upstream = upstream;
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_routes = vec![route];
    settings.interceptor.direct_to_pods = true;
}

/// Fails with the names of the API calls RBAC refused hoist, if any.
fn assert_hoist_never_forbidden(plane: &ControlPlane) {
    let forbidden = plane.hoist_forbidden();
    assert!(
        forbidden.is_empty(),
        "hoist needed calls the chart's RBAC does not grant: {forbidden:?}"
    );
}

/// Passthrough: KEDA creates the HPA from hoist's GetMetricSpec, activates
/// the Deployment 0 → 1 from IsActive, the HPA scales it to the list's
/// length / 5 from GetMetrics through KEDA's adapter, and KEDA takes it
/// back to 0 after its cooldown once the list is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_and_the_hpa_scale_a_redis_worker_from_hoists_answers() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let scene = Scene::start(plane, "passthrough", RedisServer::start(), |_| {}).await;
    let (namespace, redis) = (&scene.namespace, &scene.redis);
    plane.apply(&redis_scaled_object(
        &scene,
        Polling {
            every: 1,
            cooldown: 8,
            max: 10,
        },
        "external",
        None,
    ));
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(scene.client.clone(), namespace);

    // KEDA made the HPA from hoist's metric spec (its `s0-` prefix on
    // hoist's metric name, AverageValue 5).
    let hpa = {
        let deadline = std::time::Instant::now() + LIMIT;
        loop {
            if let Ok(hpa) = hpas.get("keda-hpa-worker").await {
                break hpa;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "KEDA made no HPA:\n{}",
                plane.log_tail("keda-operator", 30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let metric = &hpa.spec.unwrap().metrics.unwrap()[0];
    let external = metric.external.as_ref().expect("an External metric");
    assert!(
        external.metric.name.starts_with("s0-"),
        "KEDA's index prefix: {}",
        external.metric.name
    );
    assert_eq!(
        external.target.average_value.as_ref().map(|q| q.0.as_str()),
        Some("5")
    );

    redis.fill("jobs", 20);
    let seen = scene.reaches(4).await;
    assert!(visits(&seen, &[0, 1, 4]), "replicas went {seen:?}");

    // How often KEDA writes an active ScaledObject: every such write is a
    // watch event to every hoist (engine mode's watch cost was sized on
    // KEDA's code: its status patched on every poll).
    let window = Duration::from_secs(6);
    let writes = writes_to(&scene.client, namespace, "worker", window).await;
    eprintln!(
        "KEDA wrote the active ScaledObject {writes} times in {window:?} (pollingInterval 1 s)"
    );
    assert!(writes >= 1, "KEDA writes an active ScaledObject's status");

    redis.fill("jobs", 0);
    let seen = scene
        .until("back to 0 after KEDA's cooldown", |seen| {
            seen.last() == Some(&0)
        })
        .await;
    assert_eq!(seen, vec![4, 0], "straight from 4 to 0 after the cooldown");

    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// `external-push`: KEDA holds a StreamIsActive stream; a push scales
/// 0 → 1 without waiting for a poll (the ScaledObject polls once a
/// minute), and after hoist restarts on the same port KEDA's stream comes
/// back and the next push is heard too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_through_stream_is_active_scales_from_zero_and_survives_a_restart() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let scene = Scene::start(plane, "push", RedisServer::start(), |_| {}).await;
    let redis = &scene.redis;
    plane.apply(&redis_scaled_object(
        &scene,
        Polling {
            every: 60,
            cooldown: 5,
            max: 3,
        },
        "external-push",
        None,
    ));
    // KEDA has opened its stream once hoist has seen the ScaledObject's
    // trigger; give its first poll time to pass with an empty list.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(scene.replicas().await, Some(0));

    redis.fill("jobs", 3);
    let started = std::time::Instant::now();
    let seen = scene.reaches(1).await;
    assert_eq!(seen, vec![0, 1]);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the push, not KEDA's 60 s poll, activated it"
    );

    // Back to zero once the list is empty, then hoist restarts while KEDA
    // holds the stream.
    redis.fill("jobs", 0);
    scene.reaches(0).await;
    let scene = scene.restart_hoist(plane, |_| {}).await;
    let redis = &scene.redis;
    // KEDA reconnects (2 s backoff, doubling) and hoist pushes again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    redis.fill("jobs", 3);
    let seen = scene
        .until("0 → 1 from a push after hoist's restart", |seen| {
            seen.last() == Some(&1)
        })
        .await;
    assert_eq!(seen, vec![0, 1]);
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// docs/engine.md's recommended engine-mode ScaledObject on a Redis list (5
/// jobs per replica, the engine's cooldown 10 s), KEDA polling every 2 s,
/// the HPA's policies with a 1 s period (see the test below).
fn engine_scaled_object(namespace: &str, grpc: u16, redis: &RedisServer, max: u32) -> String {
    engine_object(
        namespace,
        grpc,
        redis,
        max,
        "[{type: Percent, value: 1000, periodSeconds: 1}]",
        "behavior: none",
    )
}

/// An engine-mode ScaledObject as [`engine_scaled_object`], with the HPA's
/// `scaleUp` policies `scale_up` and the trigger's `behavior` line
/// (`behavior: none` for ACA's steps; empty: the engine adopts the
/// ScaledObject's `behavior`).
fn engine_object(
    namespace: &str,
    grpc: u16,
    redis: &RedisServer,
    max: u32,
    scale_up: &str,
    trigger_behavior: &str,
) -> String {
    format!(
        r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: worker, namespace: {namespace}}}
spec:
  scaleTargetRef: {{name: worker}}
  pollingInterval: 2
  minReplicaCount: 0
  maxReplicaCount: {max}
  cooldownPeriod: 0
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleUp:
          stabilizationWindowSeconds: 0
          policies: {scale_up}
        scaleDown:
          stabilizationWindowSeconds: 0
          policies: [{{type: Percent, value: 100, periodSeconds: 1}}]
  triggers:
  - type: external
    metadata:
      scalerAddress: 127.0.0.1:{grpc}
      scaler: redis
      address: {address}
      listName: jobs
      listLength: "5"
      scalingMode: engine
      cooldownPeriod: "10"
      {trigger_behavior}
"#,
        address = redis.address()
    )
}

/// Engine mode with the real HPA: docs/engine.md's recommended ScaledObject
/// (its policies' period at 1 s, not 15: with KEDA polling every 2 s, a
/// 15 s period would hold the third step, as the real HPA showed: 1 → 4 →
/// 8 → 11, 11 being 1000 % of the count 15 s before), 100 jobs at 5 per
/// replica; KEDA activates 0 → 1 and the HPA applies the engine's ACA
/// steps 1 → 4 → 8 → 16 → 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mode_steps_one_four_eight_through_the_real_hpa() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let scene = Scene::start(plane, "engine", RedisServer::start(), |_| {}).await;
    let (namespace, redis, grpc) = (&scene.namespace, &scene.redis, scene.grpc);
    plane.apply(&engine_scaled_object(namespace, grpc, redis, 20));
    redis.fill("jobs", 100);
    let seen = scene.reaches(20).await;
    eprintln!("engine mode, real HPA: replicas went {seen:?}");
    assert_eq!(seen, vec![0, 1, 4, 8, 16, 20], "ACA's step-up, in order");

    // hoist's Events on the ScaledObject, read back from the API: one
    // SuccessfulRescale per step, by the `hoist` controller.
    let notes = hoist_events(&scene.client, namespace, "SuccessfulRescale").await;
    for size in [4, 8, 16, 20] {
        assert!(
            notes
                .iter()
                .any(|note| note.starts_with(&format!("New size: {size};"))),
            "an Event for the step to {size}: {notes:#?}"
        );
    }

    redis.fill("jobs", 0);
    let seen = scene
        .until("back to 0 after the engine's cooldown", |seen| {
            seen.last() == Some(&0)
        })
        .await;
    eprintln!("engine mode, real HPA, going to zero: {seen:?}");
    assert_eq!(seen, vec![20, 0], "20 → 0, not through the HPA's minimum");
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// The HPA's `scaleUp` policy of the next two scenarios: one pod per 4 s.
const ONE_POD_PER_4S: &str = "[{type: Pods, value: 1, periodSeconds: 4}]";

/// A worker under an HPA of one pod per 4 s (KEDA polling every 2 s),
/// with the trigger's `behavior` line `trigger_behavior`, given 50 jobs
/// at 5 per replica: the scene, the replicas it went through from 1 to
/// 10, and how long that took.
async fn one_pod_per_4s(
    plane: &ControlPlane,
    name: &str,
    trigger_behavior: &str,
) -> (Scene, Vec<i32>, Duration) {
    let scene = Scene::start(plane, name, RedisServer::start(), |_| {}).await;
    plane.apply(&engine_object(
        &scene.namespace,
        scene.grpc,
        &scene.redis,
        10,
        ONE_POD_PER_4S,
        trigger_behavior,
    ));
    scene.redis.fill("jobs", 50);
    scene.reaches(1).await;
    let from_one = std::time::Instant::now();
    let seen = scene.reaches(10).await;
    let took = from_one.elapsed();
    (scene, seen, took)
}

/// The closed-loop model's `an_adopted_rate_policy_is_met_at_its_own_pace`
/// against the real HPA: a ScaledObject `behavior` of one pod per 4 s,
/// which the engine adopts (no `behavior` in the trigger), KEDA polling
/// every 2 s. The count climbs one pod at a time to 10, the HPA applying
/// each step the engine decides. The pace is printed (a timing, not a
/// pass/fail): the policy allows 1 → 10 in 36 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_behavior_policy_is_stepped_one_pod_at_a_time_by_the_real_hpa() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let (scene, seen, took) = one_pod_per_4s(plane, "adopted", "").await;
    eprintln!(
        "adopted 1 pod per 4 s, real HPA: replicas went {seen:?}, 1 → 10 in {:.1} s (the policy allows 36 s)",
        took.as_secs_f64()
    );
    assert_eq!(seen, (1..=10).collect::<Vec<_>>(), "one pod per step");
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// The closed-loop model's
/// `an_hpa_policy_stricter_than_the_engine_converges_one_pod_per_period`
/// against the real HPA: the engine steps ACA's way (`behavior: none`:
/// 1 → 4 → 8 …) while the ScaledObject's HPA allows one pod per 4 s. The
/// HPA's limit wins, the count climbs one pod at a time to 10, and hoist
/// says why with `EngineLimitedByScaledObject`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_policy_stricter_than_the_engine_holds_and_hoist_says_so() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let (scene, seen, took) = one_pod_per_4s(plane, "strict-hpa", "behavior: none").await;
    eprintln!(
        "ACA steps under an HPA of 1 pod per 4 s, real HPA: replicas went {seen:?}, 1 → 10 in {:.1} s",
        took.as_secs_f64()
    );
    assert_eq!(seen, (1..=10).collect::<Vec<_>>(), "the HPA's limit wins");
    let warned = hoist_events(
        &scene.client,
        &scene.namespace,
        "EngineLimitedByScaledObject",
    )
    .await;
    assert!(!warned.is_empty(), "hoist says the HPA limits the engine");
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// The closed-loop model's `a_behavior_with_only_a_scale_down_window`
/// against the real HPA, on a shorter clock: a ScaledObject `behavior` with
/// only a scale-down window (10 s), which the engine takes as its own and
/// KEDA gives the HPA too. Up by the HPA's default policy (4 pods or 100 %
/// per 15 s): 1 → 5 → 10 → 20. Down to 5 held by the engine's window and
/// then the HPA's; with the list empty, 1 (the HPA's minimum) while the
/// engine's cooldown (20 s) runs, then KEDA's 0. The model's trajectory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_behavior_with_only_a_scale_down_window_through_the_real_hpa() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let scene = Scene::start(plane, "down-window", RedisServer::start(), |_| {}).await;
    let (namespace, redis, grpc) = (&scene.namespace, &scene.redis, scene.grpc);
    plane.apply(&format!(
        r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: worker, namespace: {namespace}}}
spec:
  scaleTargetRef: {{name: worker}}
  pollingInterval: 2
  minReplicaCount: 0
  maxReplicaCount: 30
  cooldownPeriod: 0
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown: {{stabilizationWindowSeconds: 10}}
  triggers:
  - type: external
    metadata:
      scalerAddress: 127.0.0.1:{grpc}
      scaler: redis
      address: {address}
      listName: jobs
      listLength: "5"
      scalingMode: engine
      cooldownPeriod: "20"
"#,
        address = redis.address()
    ));
    redis.fill("jobs", 100);
    let up = scene.reaches(20).await;
    redis.fill("jobs", 25);
    let down = scene.reaches(5).await;
    redis.fill("jobs", 0);
    let idle = scene
        .until("0 after the engine's cooldown", |seen| {
            seen.last() == Some(&0)
        })
        .await;
    eprintln!("scale-down window only, real HPA: {up:?} {down:?} {idle:?}");
    assert_eq!(up, vec![0, 1, 5, 10, 20], "the HPA's default scale-up");
    assert_eq!(down, vec![20, 5], "one step down, after both windows");
    // The HPA's step to its minimum (1) and KEDA's step to zero after the
    // engine's cooldown race each other: 5 → 1 → 0 when the HPA's window
    // ends first (the model's trajectory), 5 → 0 when KEDA's poll does.
    // Never up, never a step below 5 but the HPA's minimum, and zero last.
    assert!(
        idle == vec![5, 1, 0] || idle == vec![5, 0],
        "the HPA's minimum, then KEDA's zero: {idle:?}"
    );
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// A trigger's own TriggerAuthentication, resolved by hoist
/// (`kubernetes.trigger_authentication`) from the real API with the
/// chart's RBAC: KEDA sends no credentials to an external scaler, so hoist
/// reads the Secret the TriggerAuthentication names. The team then rotates
/// the password (the Secret, then Redis) and hoist follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_authentication_is_resolved_by_hoist_and_follows_a_rotation() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let (old, new) = ("first-password-7731", "rotated-password-0459");
    let scene = Scene::start(
        plane,
        "credentials",
        RedisServer::start_with(&["--requirepass", old]),
        |settings| {
            settings.kubernetes.trigger_authentication = true;
        },
    )
    .await;
    let (namespace, redis) = (&scene.namespace, &scene.redis);
    plane.apply(&redis_credentials(namespace, old));
    plane.apply(&redis_scaled_object(
        &scene,
        Polling {
            every: 1,
            cooldown: 300,
            max: 10,
        },
        "external",
        Some("redis-auth"),
    ));
    let mut admin = redis::Client::open(format!("redis://:{old}@{}", redis.address()))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(&["jobs", "a", "b"])
        .query(&mut admin)
        .unwrap();
    let seen = scene.reaches(1).await;
    assert_eq!(seen, vec![0, 1]);

    // The rotation: the Secret first, then Redis, whose clients must all
    // log in again.
    plane.apply(&redis_secret(namespace, new));
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", new])
        .query(&mut admin)
        .unwrap();
    let _: redis::Value = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query(&mut admin)
        .unwrap();
    let values: Vec<String> = (0..13).map(|i| i.to_string()).collect();
    let _: () = redis::cmd("RPUSH")
        .arg("jobs")
        .arg(&values)
        .query(&mut admin)
        .unwrap();
    let seen = scene.reaches(3).await;
    assert_eq!(seen, vec![1, 3]);
    let status = scene.hoist.get("/status").await.1;
    assert!(
        !status.contains(old) && !status.contains(new),
        "no password in /status"
    );
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// The admin port with real ServiceAccount tokens checked by the real
/// API server's TokenReview (the chart grants hoist `create` on
/// tokenreviews when adminAuth is on): a token of an allowed namespace's
/// ServiceAccount for hoist's audience reads /status; another namespace's
/// is refused (403); a token for the API server's own audience is no
/// token for hoist (401); none at all is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_checks_real_service_account_tokens() {
    use hoist::config::Require;
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    for namespace in ["monitoring", "intruders"] {
        plane.namespace(namespace);
        plane.must(&["create", "serviceaccount", "prom", "--namespace", namespace]);
    }
    let token = |namespace: &str, audience: Option<&str>| {
        let mut args = vec!["create", "token", "prom", "--namespace", namespace];
        if let Some(audience) = audience {
            args.extend(["--audience", audience]);
        }
        plane.must(&args).trim().to_string()
    };
    let hoist = hoist_in(plane, free_port(), |settings| {
        settings.admin.auth.require = Require::Always;
        settings.admin.auth.allowed_callers = vec!["system:serviceaccount:monitoring:*".into()];
        settings.admin.auth.audiences = vec!["hoist".into()];
    })
    .await;
    let read = |token: Option<String>| {
        let admin = hoist.admin;
        let header = token
            .map(|token| format!("Authorization: Bearer {token}\r\n"))
            .unwrap_or_default();
        async move { support::http_get_with(admin, "/status", &header).await.0 }
    };
    assert_eq!(read(Some(token("monitoring", Some("hoist")))).await, 200);
    assert_eq!(read(Some(token("intruders", Some("hoist")))).await, 403);
    assert_eq!(read(Some(token("monitoring", None))).await, 401);
    assert_eq!(read(None).await, 401);
    assert_hoist_never_forbidden(plane);
    hoist.stop().await.unwrap();
}

/// Engine mode through outside changes and restarts, with the real HPA
/// and KEDA: a manual `kubectl scale` mid-run is stepped from (16 → 3 →
/// 6 → 12 → 24 → 30); hoist restarted mid-run (without its state) holds
/// the count; the API server restarted after etcd's history was compacted
/// (every watch resumes with `410 Gone` and lists again) holds it too, and
/// hoist's `/status` shows no error once its watches are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mode_steps_from_a_manual_scale_and_holds_through_restarts() {
    let plane = control_plane();
    let _alone = DISRUPTION.write().await;
    let scene = Scene::start(plane, "outside", RedisServer::start(), |_| {}).await;
    let (namespace, redis, grpc) = (&scene.namespace, &scene.redis, scene.grpc);
    plane.apply(&engine_scaled_object(namespace, grpc, redis, 30));
    redis.fill("jobs", 150);
    let seen = scene.reaches(16).await;
    assert_eq!(seen, vec![0, 1, 4, 8, 16]);

    plane.must(&[
        "scale",
        "deployment",
        "worker",
        "--replicas",
        "3",
        "-n",
        namespace,
    ]);
    let seen = scene
        .until("the steps from a manual 3 up to 30", |seen| {
            seen.last() == Some(&30)
        })
        .await;
    eprintln!("after kubectl scale --replicas=3: {seen:?}");
    let from_three: Vec<i32> = seen.iter().copied().skip_while(|&r| r != 3).collect();
    assert_eq!(
        from_three,
        vec![3, 6, 12, 24, 30],
        "stepped from 3: {seen:?}"
    );

    // hoist restarts, as a rollout would: the count comes from the cluster.
    let scene = scene.restart_hoist(plane, |_| {}).await;
    let redis = &scene.redis;
    let held = scene.holds(30, Duration::from_secs(8)).await;
    assert_eq!(held, vec![30], "hoist's restart moved the count");

    // The API server restarts after etcd forgot the history hoist's
    // watches would resume from.
    assert_hoist_never_forbidden(plane);
    let lists_before = hoist_lists(plane, "scaledobjects");
    plane.compact_etcd();
    plane.restart("kube-apiserver");
    let held = scene.holds(30, Duration::from_secs(8)).await;
    assert_eq!(held, vec![30], "the API server's restart moved the count");
    support::eventually(LIMIT, "hoist to list ScaledObjects again", || async {
        hoist_lists(plane, "scaledobjects") > lists_before
    })
    .await;
    support::eventually(LIMIT, "hoist's /status to clear the outage", || async {
        let body = scene.hoist.get("/status").await.1;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        status["kubernetes"]["error"].is_null()
    })
    .await;
    let refused = plane.excuse_refusals_so_far();
    eprintln!("refused by the API server just restarted (RBAC not yet loaded): {refused:?}");

    redis.fill("jobs", 0);
    let seen = scene
        .until("back to 0 after the engine's cooldown", |seen| {
            seen.last() == Some(&0)
        })
        .await;
    assert_eq!(seen, vec![30, 0]);
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// How many lists of `resource` hoist has made (each watch starts with
/// one; a `410 Gone` makes another).
fn hoist_lists(plane: &ControlPlane, resource: &str) -> usize {
    plane
        .hoist_requests()
        .iter()
        .filter(|request| request.verb == "list" && request.resource == resource)
        .count()
}

/// The chart grants exactly what hoist uses: one hoist with every feature
/// that reads the API on (engine mode, `kubernetes.trigger_authentication`,
/// the admin port's TokenReview) scales a worker up and back, and every
/// rule of the chart's ClusterRole must show in the audit log as a call
/// this hoist's own token made; a rule never used is reported and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_of_the_chart_is_used() {
    use hoist::config::Require;
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let (kubeconfig, credential) = plane.hoist_credential("hoist-rbac.kubeconfig");
    let password = "grants-password-5510";
    plane.namespace("rbac-readers");
    plane.must(&["create", "serviceaccount", "prom", "-n", "rbac-readers"]);
    let app = app_on_this_machines_address().await;
    let scene = Scene::start(
        plane,
        "grants",
        RedisServer::start_with(&["--requirepass", password]),
        |settings| {
            settings.kubernetes.kubeconfig = Some(kubeconfig);
            settings.kubernetes.trigger_authentication = true;
            settings.admin.auth.require = Require::Always;
            settings.admin.auth.allowed_callers =
                vec!["system:serviceaccount:rbac-readers:*".into()];
            dial_pods_of(settings, "web.grants.test", "web", "grants");
        },
    )
    .await;
    let namespace = &scene.namespace;
    // The interceptor reads the Service's pods (`directToPods`).
    plane.apply(&service_with_slice(namespace, "web", app.addr, true));
    let proxy = scene
        .hoist
        .http_proxy
        .expect("the interceptor proxies HTTP");
    let (status, _) = send(&http1_client(), proxy, "web.grants.test", "/").await;
    assert_eq!(status, 200);
    let mut scaled_object = engine_scaled_object(namespace, scene.grpc, &scene.redis, 10);
    scaled_object = scaled_object.replace(
        "  - type: external\n",
        "  - type: external\n    authenticationRef: {name: redis-auth}\n",
    );
    plane.apply(&redis_credentials(namespace, password));
    plane.apply(&scaled_object);
    let mut redis = redis::Client::open(format!("redis://:{password}@{}", scene.redis.address()))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg("jobs")
        .arg(&["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"])
        .query(&mut redis)
        .unwrap();
    let seen = scene.reaches(2).await;
    assert!(visits(&seen, &[0, 1, 2]), "{seen:?}");
    let _: () = redis::cmd("DEL").arg("jobs").query(&mut redis).unwrap();
    scene.reaches(0).await;
    let token = plane.must(&["create", "token", "prom", "-n", "rbac-readers"]);
    let (code, _) = support::http_get_with(
        scene.hoist.admin,
        "/status",
        &format!("Authorization: Bearer {}\r\n", token.trim()),
    )
    .await;
    assert_eq!(code, 200);

    let role: serde_json::Value = serde_json::from_str(&plane.must(&[
        "get",
        "clusterrole",
        controlplane::RELEASE,
        "-o",
        "json",
    ]))
    .unwrap();
    let used: Vec<_> = plane
        .hoist_requests()
        .into_iter()
        .filter(|request| request.credential == credential && request.code < 400)
        .collect();
    let mut unused = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|value| value.as_str().unwrap().to_string())
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    let matches = |request: &&controlplane::AuditedRequest| {
                        request.verb == verb
                            && (group == "*" || request.group == group)
                            && match resource.strip_prefix('*') {
                                Some(sub) => request.resource.ends_with(sub),
                                None => request.resource == resource,
                            }
                    };
                    if !used.iter().any(|request| matches(&request)) {
                        unused.push(format!("{verb} {group}/{resource}"));
                    }
                }
            }
        }
    }
    eprintln!(
        "hoist's calls with the chart's grants: {:?}",
        used.iter()
            .map(ToString::to_string)
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(
        unused.is_empty(),
        "the chart grants what hoist never used: {unused:?}"
    );
    assert_hoist_never_forbidden(plane);
    scene.hoist.stop().await.unwrap();
}

/// `interceptor.direct_to_pods` against the real API, as the chart's
/// ServiceAccount: a request to a Service whose one pod is not ready is
/// held; once the pod's EndpointSlice marks it ready, hoist dials that
/// pod's address and port (the slice's: the Service's name resolves
/// nowhere here, and its port is 80) and the request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_goes_to_the_pod_its_endpoint_slice_marks_ready() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let namespace = plane.namespace("direct-pods");
    let app = app_on_this_machines_address().await;
    plane.apply(&service_with_slice(&namespace, "web", app.addr, false));
    let hoist = hoist_in(plane, free_port(), |settings| {
        dial_pods_of(settings, "web.test", "web", &namespace);
    })
    .await;
    let proxy = hoist.http_proxy.expect("the interceptor proxies HTTP");
    let request =
        tokio::spawn(async move { send(&http1_client(), proxy, "web.test", "/held").await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !request.is_finished(),
        "answered while the only pod was not ready: {:?}",
        request.await
    );
    assert_eq!(app.requests(), 0);

    plane.apply(&service_with_slice(&namespace, "web", app.addr, true));
    let (status, body) = tokio::time::timeout(LIMIT, request)
        .await
        .expect("served once the pod is ready")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("/held"), "the app's own answer: {body}");
    assert_eq!(app.requests(), 1);

    assert_hoist_never_forbidden(plane);
    hoist.stop().await.unwrap();
}

/// `interceptor.direct_to_pods` with two ready pods: new connections go
/// to each in turn (as kube-proxy spreads them), one marked not ready gets
/// no more, and `/interceptor/services` shows the Service followed with
/// its ready endpoints. Each app closes its connection after answering,
/// so every request is a new dial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_spread_over_the_ready_pods_and_leave_one_not_ready() {
    use support::web::{full, http1_client, send};
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let namespace = plane.namespace("direct-pods-spread");
    let app = |name: &'static str| async move {
        Upstream::serve(
            listener_on_this_machines_address().await,
            move |_| async move {
                let mut response = http::Response::new(full(name));
                response
                    .headers_mut()
                    .insert(http::header::CONNECTION, "close".parse().unwrap());
                response
            },
        )
    };
    let (first, second) = (app("first").await, app("second").await);
    plane.apply(&service_with_slices(
        &namespace,
        "web",
        &[(first.addr, true), (second.addr, true)],
    ));
    let hoist = hoist_in(plane, free_port(), |settings| {
        dial_pods_of(settings, "web.test", "web", &namespace);
    })
    .await;
    let proxy = hoist.http_proxy.expect("the interceptor proxies HTTP");
    let services = || async {
        let (status, body) = support::http_get(hoist.admin, "/interceptor/services").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let followed = |report: &serde_json::Value, ready: u64| {
        report["direct_to_pods"] == true
            && report["services"].as_array().is_some_and(|services| {
                services.iter().any(|s| {
                    s["namespace"] == namespace.as_str()
                        && s["name"] == "web"
                        && s["listed"] == true
                        && s["error"].is_null()
                        && s["ready_endpoints"] == ready
                })
            })
    };

    // The first request starts the watches; wait until both pods show.
    assert_eq!(send(&http1_client(), proxy, "web.test", "/").await.0, 200);
    support::eventually(LIMIT, "web followed with two ready endpoints", || async {
        followed(&services().await, 2)
    })
    .await;
    let (status, metrics) = support::http_get(hoist.admin, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        format!(
            "hoist_interceptor_service_endpoints{{upstream_namespace=\"{namespace}\",upstream_service=\"web\",standing=\"ready\"}} 2"
        ),
        format!(
            "hoist_interceptor_service_endpoints{{upstream_namespace=\"{namespace}\",upstream_service=\"web\",standing=\"serving_only\"}} 0"
        ),
        format!(
            "hoist_interceptor_service_watch_up{{upstream_namespace=\"{namespace}\",upstream_service=\"web\"}} 1"
        ),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    let (before_first, before_second) = (first.requests(), second.requests());
    for _ in 0..10 {
        let (status, body) = send(&http1_client(), proxy, "web.test", "/").await;
        assert_eq!(status, 200, "{body}");
    }
    let (to_first, to_second) = (
        first.requests() - before_first,
        second.requests() - before_second,
    );
    assert_eq!(to_first + to_second, 10);
    assert!(
        to_first >= 4 && to_second >= 4,
        "ten new connections spread over two pods: {to_first} and {to_second}"
    );

    plane.apply(&service_with_slices(
        &namespace,
        "web",
        &[(first.addr, true), (second.addr, false)],
    ));
    support::eventually(LIMIT, "web followed with one ready endpoint", || async {
        followed(&services().await, 1)
    })
    .await;
    let before_second = second.requests();
    for _ in 0..6 {
        let (status, body) = send(&http1_client(), proxy, "web.test", "/").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, "first");
    }
    assert_eq!(
        second.requests(),
        before_second,
        "the pod not ready gets none"
    );

    assert_hoist_never_forbidden(plane);
    hoist.stop().await.unwrap();
}

/// Declared routes with trust from the real ScaledObject store and real
/// RBAC: two teams' ScaledObjects declare the same host (team-b's first);
/// two hoist replicas agree that the older one holds it, a forged call
/// that names team-b's ScaledObject with another upstream is refused, and
/// when team-b's ScaledObject is deleted both replicas hand the host to
/// team-a's. KEDA calls the first replica, as its scalerAddress says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_agree_on_declared_routes_from_the_real_store() {
    use support::web::{Upstream, full, http1_client, send};
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let app = |name: &'static str| {
        Upstream::start(move |_| async move { http::Response::new(full(name)) })
    };
    let (older, newer, attacker) = (
        app("older").await,
        app("newer").await,
        app("attacker").await,
    );
    let interceptor = |settings: &mut Settings| {
        settings.interceptor.enabled = true;
        settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
        settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
        settings.interceptor.allowed_hosts =
            [("*".to_string(), vec!["*.example".to_string()])].into();
        // The apps are on loopback, which declared routes may not reach by default.
        settings.interceptor.denied_networks = Vec::new();
    };
    let first_port = free_port();
    let first = hoist_in(plane, first_port, interceptor).await;
    let second = hoist_in(plane, free_port(), interceptor).await;
    let declaring = |namespace: &str, upstream: std::net::SocketAddr| {
        format!(
            r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: web, namespace: {namespace}}}
spec:
  scaleTargetRef: {{name: web}}
  minReplicaCount: 1
  triggers:
  - type: external
    metadata:
      scalerAddress: 127.0.0.1:{first_port}
      scaler: http
      host: shared.example
      upstream: "{upstream}"
"#
        )
    };
    for (namespace, upstream) in [("team-b", older.addr), ("team-a", newer.addr)] {
        plane.namespace(namespace);
        plane.apply(&deployment(namespace, "web", 1));
        plane.apply(&declaring(namespace, upstream));
        // creationTimestamp has whole seconds: the second one is younger.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let through = |hoist: &Hoist| {
        let proxy = hoist.http_proxy.unwrap();
        async move { send(&http1_client(), proxy, "shared.example", "/").await.1 }
    };
    for replica in [&first, &second] {
        support::eventually(LIMIT, "shared.example served by team-b's app", || async {
            through(replica).await == "older"
        })
        .await;
    }

    // A caller of the gRPC port posing as team-b's ScaledObject.
    let forged = hoist::proto::ScaledObjectRef {
        name: "web".into(),
        namespace: "team-b".into(),
        scaler_metadata: [
            ("scalerAddress", format!("127.0.0.1:{first_port}")),
            ("scaler", "http".into()),
            ("host", "shared.example".into()),
            ("upstream", attacker.addr.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    };
    let refused = second.spec_refused(&forged).await;
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("team-b/web") && refused.message().contains("`upstream`"),
        "{}",
        refused.message()
    );
    assert_eq!(through(&second).await, "older");
    assert_eq!(attacker.requests(), 0);

    plane.must(&["delete", "scaledobject", "web", "-n", "team-b"]);
    for replica in [&first, &second] {
        support::eventually(LIMIT, "shared.example handed to team-a's app", || async {
            through(replica).await == "newer"
        })
        .await;
    }
    assert_hoist_never_forbidden(plane);
    first.stop().await.unwrap();
    second.stop().await.unwrap();
}

/// A worker at `replicas` whose ScaledObject (with `extra` spec lines)
/// names a hoist that is not there yet, on a Redis list of 10 jobs; the
/// namespace, the Redis and the port hoist will answer on.
fn before_hoist(
    plane: &ControlPlane,
    namespace: &str,
    replicas: i32,
    extra: &str,
) -> (String, RedisServer, u16) {
    let namespace = plane.namespace(namespace);
    let redis = RedisServer::start();
    redis.fill("jobs", 10);
    let grpc = free_port();
    plane.apply(&deployment(&namespace, "worker", replicas));
    plane.apply(&format!(
        r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: worker, namespace: {namespace}}}
spec:
  scaleTargetRef: {{name: worker}}
  pollingInterval: 1
  maxReplicaCount: 5
{extra}  triggers:
  - type: external
    metadata:
      scalerAddress: 127.0.0.1:{grpc}
      scaler: redis
      address: {address}
      listName: jobs
      listLength: "5"
"#,
        address = redis.address()
    ));
    (namespace, redis, grpc)
}

/// kedacore/keda#5787, measured: a ScaledObject created while its external
/// scaler is not reachable yet (hoist starting after the ScaledObject, as
/// in a Helm install of both). KEDA's reconcile fails (`Ready` False,
/// `ScaledObjectCheckFailed`) and it makes no HPA; with hoist up, KEDA's
/// own retries (controller-runtime's per-object backoff, 5 ms doubling)
/// make the HPA without anyone editing the ScaledObject, after a delay
/// that grows with how long hoist was away. The test prints that delay.
/// Meanwhile hoist, answering, says what KEDA has not done: the gauge
/// `hoist_keda_unreconciled_scaledobjects`, `/status`, and one Event
/// `KedaSetupPending` naming the command that makes KEDA retry at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaledobject_made_before_hoist_gets_its_hpa_once_hoist_answers() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let (namespace, _redis, grpc) = before_hoist(plane, "late-scaler", 0, "  minReplicaCount: 0\n");
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(plane.client().await, &namespace);
    let ready = || {
        let output = plane.must(&[
            "get",
            "scaledobject",
            "worker",
            "-n",
            &namespace,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}/{.status.conditions[?(@.type==\"Ready\")].reason}",
        ]);
        output.trim().to_string()
    };
    support::eventually(LIMIT, "KEDA to mark the ScaledObject not ready", || async {
        ready() == "False/ScaledObjectCheckFailed"
    })
    .await;
    let away = Duration::from_secs(15);
    tokio::time::sleep(away).await;
    assert!(
        hpas.get_opt("keda-hpa-worker").await.unwrap().is_none(),
        "no HPA while the scaler cannot be reached"
    );

    let started = std::time::Instant::now();
    let hoist = hoist_in(plane, grpc, |_| {}).await;
    // What hoist does about it: it sees KEDA's condition in its watch and
    // says so (gauge, /status, an Event with the command that makes KEDA
    // retry now) until KEDA has set the ScaledObject up.
    let unreconciled = || async {
        let page = hoist.get("/metrics").await.1;
        page.lines()
            .find_map(|line| line.strip_prefix("hoist_keda_unreconciled_scaledobjects "))
            .map(|value| value.trim().to_string())
    };
    let mut seen_pending = false;
    while hpas.get_opt("keda-hpa-worker").await.unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "KEDA made no HPA in 180 s with hoist answering"
        );
        if !seen_pending && unreconciled().await.as_deref() == Some("1") {
            let status = hoist.get("/status").await.1;
            assert!(
                status.contains(&format!("{namespace}/worker")),
                "/status names the ScaledObject: {status}"
            );
            seen_pending = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waited = started.elapsed();
    assert!(
        seen_pending,
        "hoist counted the ScaledObject KEDA had not set up before KEDA did"
    );
    let client = plane.client().await;
    let notes = hoist_events(&client, &namespace, "KedaSetupPending").await;
    assert_eq!(notes.len(), 1, "one Event for the episode: {notes:#?}");
    assert!(
        notes[0].contains("ScaledObjectCheckFailed")
            && notes[0].contains(&format!(
                "kubectl annotate scaledobject worker -n {namespace} autoscaling.keda.sh/paused=false --overwrite"
            )),
        "{}",
        notes[0]
    );
    eprintln!(
        "keda#5787: hoist away {away:?} after KEDA's first failed reconcile; KEDA made the HPA {:.1} s after hoist answered, unedited",
        waited.as_secs_f64()
    );
    support::eventually(LIMIT, "KEDA to mark the ScaledObject ready", || async {
        ready().starts_with("True/")
    })
    .await;
    support::eventually(LIMIT, "hoist to count it set up", || async {
        unreconciled().await.as_deref() == Some("0")
    })
    .await;
    assert!(!hoist.get("/status").await.1.contains("unreconciled"));
    assert_hoist_never_forbidden(plane);
    hoist.stop().await.unwrap();
}

/// kedacore/keda#8056, measured: `fallback` never fires while the external
/// scaler cannot be reached, because KEDA's `GetMetricSpec` fails before
/// any metric exists to fall back for. A worker at 1 replica with a
/// fallback of 3 after 2 failures stays at 1 for as long as hoist is away;
/// what keeps capacity then is hoist staying up (replicas and a PDB), not
/// the ScaledObject's fallback. Once hoist answers, scaling resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_never_fires_while_the_external_scaler_is_unreachable() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let (namespace, _redis, grpc) = before_hoist(
        plane,
        "no-fallback",
        1,
        "  minReplicaCount: 1\n  fallback: {failureThreshold: 2, replicas: 3}\n",
    );
    let deployments: Api<Deployment> = Api::namespaced(plane.client().await, &namespace);
    let mut seen = vec![1];
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < until {
        if let Some(now) = replicas(&deployments, "worker").await
            && seen.last() != Some(&now)
        {
            seen.push(now);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let conditions = plane.must(&[
        "get",
        "scaledobject",
        "worker",
        "-n",
        &namespace,
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status}/{.reason} {end}",
    ]);
    eprintln!("keda#8056: 20 s with hoist away: replicas {seen:?}; conditions {conditions}");
    assert_eq!(seen, vec![1], "KEDA applied no fallback: {conditions}");
    assert!(
        conditions.contains("Ready=False/ScaledObjectCheckFailed"),
        "{conditions}"
    );

    let hoist = hoist_in(plane, grpc, |_| {}).await;
    let seen = trajectory(
        Duration::from_secs(180),
        "1 → 2 once hoist answers",
        || replicas(&deployments, "worker"),
        |seen| seen.last() == Some(&2),
    )
    .await;
    assert_eq!(seen, vec![1, 2]);
    assert_hoist_never_forbidden(plane);
    hoist.stop().await.unwrap();
}

/// Which KEDA the control plane runs: `scripts/controlplane.sh`'s
/// `CONTROLPLANE_VERSIONS` (`current`: 2.21, which opens
/// `StreamMetricSpec`; `previous`: 2.20, which only pulls `GetMetricSpec`).
fn keda_streams_metric_specs() -> bool {
    std::env::var("CONTROLPLANE_VERSIONS")
        .as_deref()
        .unwrap_or("current")
        != "previous"
}

/// The `averageValue` KEDA's HPA for `scaled_object` targets, once it has one.
async fn hpa_target(client: &kube::Client, namespace: &str, scaled_object: &str) -> Option<String> {
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), namespace);
    let hpa = hpas
        .get_opt(&format!("keda-hpa-{scaled_object}"))
        .await
        .ok()??;
    let metric = hpa.spec?.metrics?.into_iter().next()?;
    let quantity = metric.external?.target.average_value?;
    Some(quantity.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_changed_in_hoist_alone_reaches_the_hpa_through_stream_metric_spec() {
    let plane = control_plane();
    let _shared = DISRUPTION.read().await;
    let namespace = plane.namespace("respec");
    let (grpc, admin) = (free_port(), free_port());
    // hoist's whole config in the file it reloads, the route's target in it.
    let config = |target: u32| {
        format!(
            "[grpc]\nlisten = \"127.0.0.1:{grpc}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [kubernetes]\nkubeconfig = \"{kubeconfig}\"\n\
             [interceptor]\nhttp_listen = \"127.0.0.1:0\"\n\
             [[interceptor.http_routes]]\nname = \"shop\"\nhost = \"shop.example\"\n\
             upstream = \"127.0.0.1:1\"\nconcurrent_requests = {target}\n",
            kubeconfig = plane.hoist_kubeconfig.display()
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(&file, config(20)).unwrap();
    let hoist = Hoist::start_from_file(&file).await;
    plane.apply(&deployment(&namespace, "storefront", 1));
    plane.apply(&format!(
        r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: storefront, namespace: {namespace}}}
spec:
  scaleTargetRef: {{name: storefront}}
  minReplicaCount: 1
  maxReplicaCount: 3
  pollingInterval: 5
  triggers:
  - type: external-push
    metadata:
      scalerAddress: 127.0.0.1:{grpc}
      scaler: http
      route: shop
"#
    ));
    let client = plane.client().await;
    let target = || hpa_target(&client, &namespace, "storefront");
    support::eventually(LIMIT, "the HPA targets the route's 20", || async {
        target().await.as_deref() == Some("20")
    })
    .await;
    let generation = || {
        plane.must(&[
            "get",
            "scaledobject",
            "storefront",
            "-n",
            &namespace,
            "-o",
            "jsonpath={.metadata.generation}",
        ])
    };
    let before = generation();

    // The platform team raises the route's target in hoist's config: the
    // ScaledObject is not touched.
    std::fs::write(&file, config(35)).unwrap();
    if keda_streams_metric_specs() {
        let started = std::time::Instant::now();
        support::eventually(LIMIT, "the HPA targets 35 from the stream", || async {
            target().await.as_deref() == Some("35")
        })
        .await;
        eprintln!(
            "StreamMetricSpec: reload → HPA target in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    } else {
        // KEDA 2.20 re-reads GetMetricSpec only when the ScaledObject's
        // generation moves: the HPA keeps 20 until an edit of it.
        support::eventually(LIMIT, "hoist answers 35", || async {
            hoist.spec(&storefront_call(grpc)).await.target_size_float == 35.0
        })
        .await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            target().await.as_deref(),
            Some("20"),
            "the pull fallback keeps the old target"
        );
        plane.must(&[
            "patch",
            "scaledobject",
            "storefront",
            "-n",
            &namespace,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"pollingInterval":6}}"#,
        ]);
        support::eventually(LIMIT, "the HPA targets 35 after an edit", || async {
            target().await.as_deref() == Some("35")
        })
        .await;
    }
    if keda_streams_metric_specs() {
        assert_eq!(generation(), before, "no edit of the ScaledObject");
    }
    assert_hoist_never_forbidden(plane);
    hoist.stop().await.unwrap();
}

/// KEDA's call for the storefront's trigger (as it sends it).
fn storefront_call(grpc: u16) -> hoist::proto::ScaledObjectRef {
    hoist::proto::ScaledObjectRef {
        name: "storefront".into(),
        namespace: "respec".into(),
        scaler_metadata: [
            ("scalerAddress", format!("127.0.0.1:{grpc}")),
            ("scaler", "http".into()),
            ("route", "shop".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    }
}
