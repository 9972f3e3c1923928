//! Pods that run: the real control plane with a real node
//! (`CONTROLPLANE_NODE=1 scripts/controlplane.sh up`: containerd 2 with
//! runc and a bridge CNI, kubelet, kube-proxy in iptables mode,
//! kube-scheduler and CoreDNS; KEDA's operator and metrics adapter as pods
//! from KEDA's own manifests; see docs/CONTROLPLANE.md), with every image
//! built here. docs/getting-started.md runs block by block as written
//! (`node/page_walk.rs`); then hoist is installed by its chart, exactly as
//! the README says, and scales real workers that drain a real Redis list
//! and an HTTP app woken through its interceptor. At the end `down` must
//! leave the machine as it found it.
//!
//! One test, its steps in order: they share one node (one per machine: it
//! owns the pod bridge and kubelet's paths), the chart's release moves
//! from step to step, and the last step takes the node down.

#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "node/machine.rs"]
mod machine;
#[path = "walkthrough/page.rs"]
mod page;
#[path = "node/page_walk.rs"]
mod page_walk;
mod support;
#[path = "node/watch.rs"]
mod watch;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use controlplane::{ControlPlane, control_plane_with_node};
use machine::{MachineState, kube_chains, kubepods_cgroups, mounts_under};
use watch::{ReplicaWatch, rises_then_falls};

const SMOKE: &str = "smoke";
/// The scenarios' namespace (the page's walk, run first, has `demo`).
const DEMO: &str = "apps";
/// The address every ScaledObject of the docs names.
const HOIST_ADDRESS: &str = "hoist.keda.svc.cluster.local:9090";
/// How long one worker's job takes.
const JOB_MS: u64 = 400;

/// A Redis pod of the image built here, Ready when it answers PING.
fn redis_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {SMOKE}, labels: {{app: {name}}}}}
spec:
  containers:
  - name: redis
    image: localhost/redis:test
    imagePullPolicy: Never
    ports: [{{containerPort: 6379}}]
    readinessProbe:
      exec: {{command: [redis-cli, ping]}}
      periodSeconds: 1
"#
    )
}

/// The scenarios' Redis (a Deployment and its Service) and the
/// worker at zero: `hoist-load worker` from hoist's image.
fn demo_workload() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: redis, namespace: {DEMO}}}
spec:
  selector: {{matchLabels: {{app: redis}}}}
  template:
    metadata: {{labels: {{app: redis}}}}
    spec:
      containers:
      - name: redis
        image: localhost/redis:test
        imagePullPolicy: Never
        ports: [{{containerPort: 6379}}]
        readinessProbe: {{exec: {{command: [redis-cli, ping]}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: redis, namespace: {DEMO}}}
spec:
  selector: {{app: redis}}
  ports: [{{port: 6379}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: worker, namespace: {DEMO}}}
spec:
  replicas: 0
  selector: {{matchLabels: {{app: worker}}}}
  template:
    metadata: {{labels: {{app: worker}}}}
    spec:
      containers:
      - name: worker
        image: localhost/hoist:test
        imagePullPolicy: Never
        command: [hoist-load, --threads, "1", worker, --redis, "redis.{DEMO}.svc.cluster.local:6379", --list, jobs, --job-ms, "{JOB_MS}"]
"#
    )
}

/// The worker's ScaledObject: five jobs per replica, at most 8. In engine
/// mode hoist decides with ACA's step-up and a 20 s cooldown (the
/// walkthrough's ScaledObject); in passthrough KEDA's HPA does.
fn worker_scaled_object(engine: bool) -> String {
    let mode = if engine {
        "scalingMode: engine\n      cooldownPeriod: \"20\"\n      behavior: none"
    } else {
        "scalingMode: passthrough"
    };
    format!(
        r#"apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: worker, namespace: {DEMO}}}
spec:
  scaleTargetRef: {{name: worker}}
  pollingInterval: 5
  minReplicaCount: 0
  maxReplicaCount: 8
  cooldownPeriod: {cooldown}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleUp:
          stabilizationWindowSeconds: 0
          policies: [{{type: Percent, value: 1000, periodSeconds: 5}}]
        scaleDown:
          stabilizationWindowSeconds: 0
          policies: [{{type: Percent, value: 100, periodSeconds: 5}}]
  triggers:
  - type: external-push
    metadata:
      scalerAddress: {HOIST_ADDRESS}
      scaler: redis
      address: redis.{DEMO}.svc.cluster.local:6379
      listName: jobs
      listLength: "5"
      {mode}
"#,
        cooldown = if engine { 0 } else { 10 },
    )
}

/// An HTTP app at zero (`hoist-load upstream`), its Service, and the
/// ScaledObject whose `http` trigger declares its route. `ready_after`:
/// the readiness probe's initial delay (a slow app).
fn web_app(name: &str, ready_after: u32) -> String {
    format!(
        r#"{}---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: {name}, namespace: {DEMO}}}
spec:
  scaleTargetRef: {{name: {name}}}
  pollingInterval: 5
  minReplicaCount: 0
  maxReplicaCount: 5
  cooldownPeriod: 10
  triggers:
  - type: external-push
    metadata:
      scalerAddress: {HOIST_ADDRESS}
      scaler: http
      host: {name}.{DEMO}.example.com
      upstream: {name}:8080
      concurrentRequests: "10"
"#,
        web_workload(name, ready_after)
    )
}

/// The HTTP app alone: a Deployment at zero running `hoist-load
/// upstream`, and its Service.
fn web_workload(name: &str, ready_after: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {DEMO}}}
spec:
  replicas: 0
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - name: web
        image: localhost/hoist:test
        imagePullPolicy: Never
        command: [hoist-load, --threads, "1", upstream, --listen, "0.0.0.0:8080", --body, "hello from {name}"]
        ports: [{{containerPort: 8080}}]
        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1, initialDelaySeconds: {ready_after}}}
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {DEMO}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 8080}}]
"#
    )
}

/// The same app for the KEDA HTTP add-on: an HTTPScaledObject
/// (`http.keda.sh/v1alpha1`, v0.15.0's CRD) with the settings of
/// `web_app`'s ScaledObject; the add-on's operator makes the ScaledObject
/// from it (trigger `external-push` to the add-on's scaler).
fn addon_http_scaled_object(name: &str) -> String {
    format!(
        r#"apiVersion: http.keda.sh/v1alpha1
kind: HTTPScaledObject
metadata: {{name: {name}, namespace: {DEMO}}}
spec:
  hosts: [{name}.{DEMO}.example.com]
  scaleTargetRef: {{name: {name}, kind: Deployment, apiVersion: apps/v1, service: {name}, port: 8080}}
  replicas: {{min: 0, max: 5}}
  scaledownPeriod: 10
  scalingMetric: {{concurrency: {{targetValue: 10}}}}
"#
    )
}

/// The values the walkthrough gives the chart for the HTTP app, for the
/// scenarios' namespace.
fn interceptor_values() -> String {
    format!(
        r#"interceptor:
  mode: inProcess
config:
  interceptor:
    allowed_hosts:
      {DEMO}: ["*.{DEMO}.example.com"]
"#
    )
}

fn wait_ready(plane: &ControlPlane, namespace: &str, what: &str) {
    let output = plane.kubectl(&[
        "wait",
        "-n",
        namespace,
        "--for=condition=Ready",
        "--timeout=180s",
        what,
    ]);
    assert!(
        output.status.success(),
        "{what} not Ready: {}\n{}\nkubelet: {}",
        String::from_utf8_lossy(&output.stderr),
        plane.must(&["get", "pods", "-A", "-o", "wide"]),
        plane.log_tail("kubelet", 30)
    );
}

fn rollout(plane: &ControlPlane, namespace: &str, deployment: &str) {
    let output = plane.kubectl(&[
        "rollout",
        "status",
        "-n",
        namespace,
        &format!("deployment/{deployment}"),
        "--timeout=240s",
    ]);
    assert!(
        output.status.success(),
        "{deployment} not rolled out: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        plane.must(&["get", "pods", "-n", namespace, "-o", "wide"])
    );
}

/// A ScaledObject KEDA has set up (its HPA made, `Ready` true).
fn wait_scaled_object_ready(plane: &ControlPlane, name: &str) {
    let output = plane.kubectl(&[
        "wait",
        "-n",
        DEMO,
        "--for=condition=Ready",
        "--timeout=120s",
        &format!("scaledobject/{name}"),
    ]);
    assert!(
        output.status.success(),
        "ScaledObject {name} not Ready: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        plane.must(&["describe", "scaledobject", "-n", DEMO, name])
    );
}

fn cluster_ip(plane: &ControlPlane, namespace: &str, service: &str) -> String {
    plane.must(&[
        "get",
        "service",
        "-n",
        namespace,
        service,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
}

/// The scenarios' Redis, reached from the host through its Service's ClusterIP
/// (kube-proxy's rules apply to the host's own connections too). Until
/// kube-proxy has programmed a new Service (at most once a second), its
/// ClusterIP is no address here: the connection leaves by the default
/// route, and whatever answers there is not Redis. So: until a PING
/// answers PONG.
fn demo_redis(plane: &ControlPlane) -> redis::Connection {
    let ip = cluster_ip(plane, DEMO, "redis");
    let client = redis::Client::open(format!("redis://{ip}:6379/")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answered = client.get_connection().and_then(|mut connection| {
            redis::cmd("PING")
                .query::<String>(&mut connection)
                .map(|pong| (connection, pong))
        });
        match answered {
            Ok((connection, pong)) if pong == "PONG" => return connection,
            other if Instant::now() > deadline => panic!(
                "the demo Redis through its Service ({ip}:6379): {:?}",
                other.map(|(_, pong)| pong)
            ),
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

fn counter(redis: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("GET")
        .arg(key)
        .query::<Option<i64>>(redis)
        .unwrap()
        .unwrap_or(0)
}

/// Pushes `count` jobs (unique payloads) after clearing the counters.
fn push_jobs(redis: &mut redis::Connection, count: usize) {
    let _: () = redis::cmd("DEL")
        .arg(&["jobs", "jobs:done", "jobs:finished"][..])
        .query(redis)
        .unwrap();
    let jobs: Vec<String> = (1..=count).map(|n| format!("job-{n}")).collect();
    let _: () = redis::cmd("RPUSH")
        .arg("jobs")
        .arg(jobs)
        .query(redis)
        .unwrap();
}

/// One HTTP/1.1 request to `address` for `host`: status line and body,
/// and how long the answer took.
fn get(address: &str, host: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(
        stream,
        "GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    (answer, started.elapsed())
}

/// Seconds from a pod's creation to its Ready condition (the API's
/// one-second timestamps).
fn created_to_ready(plane: &ControlPlane, app: &str) -> i64 {
    let times = plane.must(&[
        "get",
        "pods",
        "-n",
        DEMO,
        "-l",
        &format!("app={app}"),
        "-o",
        r#"jsonpath={.items[0].metadata.creationTimestamp} {.items[0].status.conditions[?(@.type=="Ready")].lastTransitionTime}"#,
    ]);
    let parse = |text: &str| {
        let time = text.trim_end_matches('Z');
        let (date, clock) = time.split_once('T').unwrap();
        let [h, m, s]: [i64; 3] = clock
            .split(':')
            .map(|part| part.parse().unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        (date.to_string(), h * 3600 + m * 60 + s)
    };
    let mut parts = times.split_whitespace();
    let (created_day, created) = parse(parts.next().expect("created"));
    let (ready_day, ready) = parse(parts.next().expect("Ready"));
    assert_eq!(created_day, ready_day, "no midnight in between: {times}");
    ready - created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoist_keda_and_workloads_run_as_pods_on_a_real_node() {
    let before = MachineState::read();
    let plane = control_plane_with_node();
    let client = plane.client().await;
    let demo_deployments: Api<Deployment> = Api::namespaced(client.clone(), DEMO);

    the_node_is_ready_and_keda_runs_as_pods(plane);
    a_redis_pod_answers_by_name_logs_and_exec(plane);
    page_walk::the_getting_started_page_runs_on_the_node(plane, &client).await;
    // The scenarios install hoist again, by the README's command.
    plane.helm(&["uninstall", "hoist", "-n", "keda", "--wait"]);
    hoist_installs_by_its_chart(plane);
    plane.namespace(DEMO);
    plane.apply(&demo_workload());
    rollout(plane, DEMO, "redis");
    engine_mode_workers_drain_the_queue_and_go_back_to_zero(plane, &demo_deployments).await;
    keda_hpa_scales_the_same_workers_in_passthrough(plane, &demo_deployments).await;
    an_http_app_at_zero_is_woken_through_the_interceptor(plane, &demo_deployments).await;
    the_keda_http_addon_and_hoist_both_wake_an_app_at_zero(plane, &demo_deployments).await;
    a_hoist_pod_deleted_mid_climb_loses_no_capacity(plane, &demo_deployments).await;
    down_leaves_the_machine_as_it_was(plane, before);
}

fn the_node_is_ready_and_keda_runs_as_pods(plane: &ControlPlane) {
    let ready = plane.must(&[
        "get",
        "node",
        "hoist-node",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
    ]);
    assert_eq!(ready, "True", "the node is Ready");
    assert_run_as_pods(
        plane,
        &[
            "localhost/keda-operator:test",
            "localhost/keda-adapter:test",
        ],
    );
    // The aggregated API reaches the adapter's pod through its Service.
    plane.must(&["get", "--raw", "/apis/external.metrics.k8s.io/v1beta1"]);
}

/// Each image runs in a pod of the namespace `keda`, Running.
fn assert_run_as_pods(plane: &ControlPlane, images: &[&str]) {
    let pods = plane.must(&[
        "get",
        "pods",
        "-n",
        "keda",
        "-o",
        r#"jsonpath={range .items[*]}{.spec.containers[0].image} {.status.phase}{"\n"}{end}"#,
    ]);
    for image in images {
        assert!(
            pods.lines().any(|line| line == format!("{image} Running")),
            "{image} runs as a pod: {pods}"
        );
    }
}

fn a_redis_pod_answers_by_name_logs_and_exec(plane: &ControlPlane) {
    plane.namespace(SMOKE);
    plane.apply(&format!(
        "{}---\n{}---\n{}",
        redis_pod("redis"),
        redis_pod("client"),
        format_args!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: redis, namespace: {SMOKE}}}\nspec:\n  selector: {{app: redis}}\n  ports: [{{port: 6379, targetPort: 6379}}]\n"
        )
    ));
    wait_ready(plane, SMOKE, "pod/redis");
    wait_ready(plane, SMOKE, "pod/client");
    let phase = plane.must(&[
        "get",
        "pod",
        "-n",
        SMOKE,
        "redis",
        "-o",
        "jsonpath={.status.phase} {.status.podIP}",
    ]);
    assert!(
        phase.starts_with("Running 10.244.0."),
        "running on the pod bridge: {phase}"
    );
    // Logs and exec go API server → kubelet (certificates both ways) →
    // containerd's stream server.
    let logs = plane.must(&["logs", "-n", SMOKE, "redis"]);
    assert!(
        logs.contains("Ready to accept connections"),
        "redis-server's log: {logs}"
    );
    let pong = plane.must(&["exec", "-n", SMOKE, "redis", "--", "redis-cli", "ping"]);
    assert_eq!(pong.trim(), "PONG");
    // From the other pod: cluster DNS names the Service, kube-proxy's
    // rules take its ClusterIP to the Redis pod.
    let name = format!("redis.{SMOKE}.svc.cluster.local");
    plane.must(&[
        "exec",
        "-n",
        SMOKE,
        "client",
        "--",
        "redis-cli",
        "-h",
        &name,
        "set",
        "seen",
        "yes",
    ]);
    let seen = plane.must(&[
        "exec",
        "-n",
        SMOKE,
        "redis",
        "--",
        "redis-cli",
        "get",
        "seen",
    ]);
    assert_eq!(
        seen.trim(),
        "yes",
        "the write through {name} reached the Redis pod"
    );
    plane.must(&["delete", "namespace", SMOKE, "--wait=false"]);
}

/// The README's install, word for word but for the image built here.
fn hoist_installs_by_its_chart(plane: &ControlPlane) {
    let started = Instant::now();
    plane.helm(&[
        "install",
        "hoist",
        "deploy/helm/hoist",
        "-n",
        "keda",
        "--set",
        "image.repository=localhost/hoist",
        "--set",
        "image.tag=test",
        "--set",
        "image.pullPolicy=Never",
    ]);
    rollout(plane, "keda", "hoist");
    eprintln!(
        "node: hoist installed by its chart and Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // As the chart runs it: not root, a read-only root filesystem, every
    // capability dropped, the state volume mounted.
    let spec = plane.must(&[
        "get",
        "pods",
        "-n",
        "keda",
        "-l",
        "app.kubernetes.io/name=hoist",
        "-o",
        "jsonpath={.items[0].spec.securityContext.runAsNonRoot} {.items[0].spec.containers[0].securityContext.readOnlyRootFilesystem} {.items[0].spec.containers[0].securityContext.capabilities.drop} {.items[0].status.phase}",
    ]);
    assert_eq!(
        spec, r#"true true ["ALL"] Running"#,
        "hoist's pod as the chart runs it"
    );
    let logs = plane.must(&["logs", "-n", "keda", "deploy/hoist"]);
    assert!(logs.contains("hoist is serving"), "hoist's log: {logs}");
    // The walkthrough's `hoist status`, in the pod, with its projected
    // token for the admin port.
    let status = plane.must(&[
        "exec",
        "-n",
        "keda",
        "deploy/hoist",
        "--",
        "hoist",
        "status",
        "--token-file",
        "/var/run/secrets/hoist-admin-token/token",
    ]);
    assert!(!status.trim().is_empty(), "hoist status answers");
}

async fn engine_mode_workers_drain_the_queue_and_go_back_to_zero(
    plane: &ControlPlane,
    deployments: &Api<Deployment>,
) {
    const JOBS: usize = 200;
    plane.apply(&worker_scaled_object(true));
    wait_scaled_object_ready(plane, "worker");
    let (mut redis, watch, pushed, done_at) = drain(plane, deployments, JOBS).await;
    let drained = done_at - pushed;

    // The work, done by several pods, each job once.
    let logs = plane.must(&[
        "logs",
        "-n",
        DEMO,
        "-l",
        "app=worker",
        "--prefix",
        "--tail=-1",
        "--max-log-requests=10",
    ]);
    let pods_that_worked: std::collections::BTreeSet<&str> = logs
        .lines()
        .filter(|line| line.contains(" done ("))
        .filter_map(|line| line.split(']').next())
        .collect();
    assert!(
        pods_that_worked.len() >= 2,
        "several workers' logs show jobs done: {pods_that_worked:?}"
    );
    watch
        .wait(
            Duration::from_secs(180),
            "the worker back to zero",
            |samples| {
                samples
                    .last()
                    .is_some_and(|last| last.replicas == 0 && last.at > pushed + drained)
            },
        )
        .await;
    let trajectory = watch.trajectory();
    let first = watch
        .first(|sample| sample.ready >= 1)
        .expect("a worker was Ready");
    eprintln!(
        "node: engine mode: replicas {trajectory:?}; {JOBS} jobs of {JOB_MS} ms drained in {drained:.1}s (ideal at 8 replicas from the start: {:.1}s); first worker Ready {:.1}s after the push; zero at {:.1}s",
        JOBS as f64 * JOB_MS as f64 / 1000.0 / 8.0,
        first.at - pushed,
        watch.samples().last().unwrap().at - pushed,
    );
    assert!(
        controlplane::visits(&trajectory, &[0, 1, 4, 8]),
        "ACA's step-up 0 → 1 → 4 → 8: {trajectory:?}"
    );
    assert!(
        trajectory.iter().all(|&replicas| replicas <= 8),
        "{trajectory:?}"
    );
    assert!(
        rises_then_falls(&trajectory),
        "no oscillation: {trajectory:?}"
    );
    assert_each_job_done_once(&mut redis, JOBS);
    plane.must(&["delete", "scaledobject", "-n", DEMO, "worker"]);
}

/// Pushes `jobs` jobs with the worker's replicas watched from just
/// before, and waits until the workers have done them all: the Redis
/// connection, the watch, and when (in the watch's seconds) the jobs were
/// pushed and the last one done.
async fn drain(
    plane: &ControlPlane,
    deployments: &Api<Deployment>,
    jobs: usize,
) -> (redis::Connection, ReplicaWatch, f64, f64) {
    let mut redis = demo_redis(plane);
    let watch = ReplicaWatch::start(deployments.clone(), "worker");
    push_jobs(&mut redis, jobs);
    let pushed = watch.elapsed();
    let done_at = wait_for_jobs(&mut redis, jobs, &watch, Duration::from_secs(240)).await;
    (redis, watch, pushed, done_at)
}

/// Every job pushed was counted, and each once (the finished set holds
/// each payload once).
fn assert_each_job_done_once(redis: &mut redis::Connection, jobs: usize) {
    assert_eq!(counter(redis, "jobs:done"), jobs as i64);
    let finished: i64 = redis::cmd("SCARD")
        .arg("jobs:finished")
        .query(redis)
        .unwrap();
    assert_eq!(finished, jobs as i64, "every job done exactly once");
}

/// Waits until the workers have recorded `jobs` jobs; the time it
/// happened, in the watch's seconds.
async fn wait_for_jobs(
    redis: &mut redis::Connection,
    jobs: usize,
    watch: &ReplicaWatch,
    limit: Duration,
) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let done = counter(redis, "jobs:done");
        if done >= jobs as i64 {
            return watch.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "workers finished {done} of {jobs} jobs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn keda_hpa_scales_the_same_workers_in_passthrough(
    plane: &ControlPlane,
    deployments: &Api<Deployment>,
) {
    const JOBS: usize = 200;
    plane.apply(&worker_scaled_object(false));
    wait_scaled_object_ready(plane, "worker");
    let (mut redis, watch, pushed, drained) = drain(plane, deployments, JOBS).await;
    watch
        .wait(
            Duration::from_secs(180),
            "the worker back to zero",
            |samples| {
                samples
                    .last()
                    .is_some_and(|last| last.replicas == 0 && last.at > drained)
            },
        )
        .await;
    let trajectory = watch.trajectory();
    eprintln!(
        "node: passthrough (KEDA's HPA decides): replicas {trajectory:?}; {JOBS} jobs drained in {:.1}s",
        drained - pushed
    );
    assert!(
        trajectory
            .iter()
            .max()
            .is_some_and(|&most| most > 1 && most <= 8),
        "the HPA scaled out within the maximum: {trajectory:?}"
    );
    assert_eq!(trajectory.first(), Some(&0));
    assert_eq!(trajectory.last(), Some(&0));
    assert_each_job_done_once(&mut redis, JOBS);
}

async fn an_http_app_at_zero_is_woken_through_the_interceptor(
    plane: &ControlPlane,
    deployments: &Api<Deployment>,
) {
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(values.path(), interceptor_values()).unwrap();
    plane.helm(&[
        "upgrade",
        "hoist",
        "deploy/helm/hoist",
        "-n",
        "keda",
        "--reuse-values",
        "--values",
        values.path().to_str().unwrap(),
    ]);
    rollout(plane, "keda", "hoist");
    let proxy = format!(
        "{}:8080",
        cluster_ip(plane, "keda", "hoist-interceptor-proxy")
    );

    for (app, ready_after) in [("web", 0), ("slow", 5)] {
        plane.apply(&web_app(app, ready_after));
        wait_scaled_object_ready(plane, app);
        let watch = ReplicaWatch::start(deployments.clone(), app);
        let (answer, took) = get(&proxy, &format!("{app}.{DEMO}.example.com"));
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with(&format!("hello from {app}")),
            "the first request to {app} at zero is held and answered: {answer}\n{}",
            plane.must(&["logs", "-n", "keda", "deploy/hoist", "--tail=20"])
        );
        let pod_ready = created_to_ready(plane, app);
        eprintln!(
            "node: cold start through the interceptor ({app}, readiness delay {ready_after}s): request → answer {:.2}s; pod created → Ready {pod_ready}s",
            took.as_secs_f64()
        );
        assert!(
            took.as_secs() >= ready_after as u64,
            "answered only once the pod was Ready ({took:?})"
        );
        watch
            .wait(
                Duration::from_secs(120),
                &format!("{app} back to zero"),
                |samples| {
                    samples.len() > 1 && samples.last().is_some_and(|last| last.replicas == 0)
                },
            )
            .await;
        let trajectory = watch.trajectory();
        assert_eq!(
            trajectory,
            [0, 1, 0],
            "one request: one pod, no overshoot, no oscillation"
        );
    }

    // `kubectl port-forward` to the interceptor, as the walkthrough has
    // a user reach it.
    let port = support::free_port();
    let mut forward = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&plane.admin_kubeconfig)
        .args(["port-forward", "-n", "keda", "svc/hoist-interceptor-proxy"])
        .arg(format!("{port}:8080"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first_line = [0u8; 10];
    forward
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first_line)
        .unwrap();
    let (answer, took) = get(
        &format!("127.0.0.1:{port}"),
        &format!("web.{DEMO}.example.com"),
    );
    let _ = forward.kill();
    let _ = forward.wait();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello from web"),
        "through kubectl port-forward: {answer}"
    );
    eprintln!(
        "node: through kubectl port-forward, web woken again: {:.2}s",
        took.as_secs_f64()
    );
    for app in ["web", "slow"] {
        plane.must(&["delete", "scaledobject", "-n", DEMO, app]);
    }
}

/// The KEDA HTTP add-on v0.15.0 installed from its own manifests
/// (`scripts/controlplane.sh addon`: its CRDs, interceptor, scaler and
/// operator as pods, the images built here), then two apps of the same
/// shape at zero, each woken by one request: one through the add-on's
/// interceptor Service (an HTTPScaledObject, from which the add-on's
/// operator makes the ScaledObject and KEDA asks the add-on's scaler), one
/// through hoist's, as the previous step left the chart (interceptor in
/// process, the scenarios' hosts allowed). Both must answer 200: the two
/// are compared only where both work.
async fn the_keda_http_addon_and_hoist_both_wake_an_app_at_zero(
    plane: &ControlPlane,
    deployments: &Api<Deployment>,
) {
    let started = Instant::now();
    let output =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/controlplane.sh"))
            .arg("addon")
            .env("CONTROLPLANE_DIR", &plane.dir)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
    assert!(output.status.success(), "scripts/controlplane.sh addon");
    eprintln!(
        "node: the KEDA HTTP add-on installed from its config/default, its three pods Available in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_run_as_pods(
        plane,
        &[
            "localhost/keda-http-interceptor:test",
            "localhost/keda-http-scaler:test",
            "localhost/keda-http-operator:test",
        ],
    );

    const ADDON_APP: &str = "addon-web";
    const HOIST_APP: &str = "hoist-web";
    plane.apply(&format!(
        "{}---\n{}",
        web_workload(ADDON_APP, 0),
        addon_http_scaled_object(ADDON_APP)
    ));
    plane.apply(&web_app(HOIST_APP, 0));
    // The add-on's operator makes the ScaledObject (same name); KEDA sets
    // it Ready once the add-on's scaler answered it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !plane
        .kubectl(&["get", "scaledobject", "-n", DEMO, ADDON_APP])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "the add-on's operator made no ScaledObject for {ADDON_APP}: {}\n{}",
            plane.must(&[
                "get",
                "httpscaledobject",
                "-n",
                DEMO,
                ADDON_APP,
                "-o",
                "yaml"
            ]),
            plane.must(&[
                "logs",
                "-n",
                "keda",
                "deploy/keda-add-ons-http-operator",
                "--tail=20"
            ])
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_scaled_object_ready(plane, ADDON_APP);
    wait_scaled_object_ready(plane, HOIST_APP);
    let trigger = plane.must(&[
        "get",
        "scaledobject",
        "-n",
        DEMO,
        ADDON_APP,
        "-o",
        "jsonpath={.spec.triggers[0].type} {.spec.triggers[0].metadata.scalerAddress}",
    ]);
    assert_eq!(
        trigger, "external-push keda-add-ons-http-external-scaler.keda:9090",
        "the add-on's operator points KEDA at the add-on's scaler"
    );

    for (via, service, app) in [
        (
            "the KEDA HTTP add-on's interceptor",
            "keda-add-ons-http-interceptor-proxy",
            ADDON_APP,
        ),
        ("hoist's interceptor", "hoist-interceptor-proxy", HOIST_APP),
    ] {
        let proxy = format!("{}:8080", cluster_ip(plane, "keda", service));
        let watch = ReplicaWatch::start(deployments.clone(), app);
        let (answer, took) = get(&proxy, &format!("{app}.{DEMO}.example.com"));
        let status_line = answer.lines().next().unwrap_or_default();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with(&format!("hello from {app}")),
            "{app} at zero, through {via} ({service}): the first request is held and answered: {answer}"
        );
        let pod_ready = created_to_ready(plane, app);
        eprintln!(
            "node: cold start through {via} ({app}): GET / → {status_line} in {:.2}s; pod created → Ready {pod_ready}s",
            took.as_secs_f64()
        );
        if app == ADDON_APP {
            // The add-on marks an answer it held for a cold start.
            assert!(
                answer
                    .lines()
                    .any(|line| line.eq_ignore_ascii_case("x-keda-http-cold-start: true")),
                "the add-on says it held the request for a cold start: {answer}"
            );
        }
        let trajectory = watch.trajectory();
        assert!(
            trajectory.first() == Some(&0) && trajectory.contains(&1),
            "{app} woken from zero by the request: {trajectory:?}"
        );
    }
    plane.must(&[
        "delete",
        "-n",
        DEMO,
        &format!("httpscaledobject/{ADDON_APP}"),
        &format!("scaledobject/{HOIST_APP}"),
        &format!("deployment/{ADDON_APP}"),
        &format!("deployment/{HOIST_APP}"),
        &format!("service/{ADDON_APP}"),
        &format!("service/{HOIST_APP}"),
        "--wait=false",
    ]);
    eprintln!(
        "node: the add-on's step, install included: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// Two hoist replicas behind the Service with the chart's PDB; KEDA
/// activates the worker on a passthrough trigger and one hoist pod is
/// deleted at once, so the HPA's climb happens while it is gone: the
/// other answers, the count never drops while work remains, and the
/// Deployment brings a new pod to Ready.
async fn a_hoist_pod_deleted_mid_climb_loses_no_capacity(
    plane: &ControlPlane,
    deployments: &Api<Deployment>,
) {
    const JOBS: usize = 300;
    plane.helm(&[
        "upgrade",
        "hoist",
        "deploy/helm/hoist",
        "-n",
        "keda",
        "--reuse-values",
        "--set",
        "replicas=2",
        "--set",
        "interceptor.mode=off",
    ]);
    rollout(plane, "keda", "hoist");
    plane.must(&["get", "poddisruptionbudget", "-n", "keda", "hoist"]);
    // hoist's pods that run and are not on their way out (a pod being
    // deleted stays Running through its grace period).
    let hoist_pods = || -> Vec<String> {
        plane
            .must(&[
                "get",
                "pods",
                "-n",
                "keda",
                "-l",
                "app.kubernetes.io/name=hoist",
                "--field-selector",
                "status.phase=Running",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#,
            ])
            .lines()
            .filter_map(|line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [name] => Some(name.to_string()),
                _ => None,
            })
            .collect()
    };
    let before = hoist_pods();
    assert_eq!(before.len(), 2, "two hoist replicas: {before:?}");

    let mut redis = demo_redis(plane);
    let watch = ReplicaWatch::start(deployments.clone(), "worker");
    push_jobs(&mut redis, JOBS);
    watch
        .wait(Duration::from_secs(120), "the climb to begin", |samples| {
            samples.iter().any(|sample| sample.replicas >= 1)
        })
        .await;
    let deleted = &before[0];
    // From when the deletion is asked: KEDA may take the worker from 1 to
    // 8 while `kubectl delete` runs.
    let deleted_at = watch.elapsed();
    let at_deletion = watch
        .samples()
        .iter()
        .rev()
        .find(|sample| sample.at <= deleted_at)
        .unwrap()
        .replicas;
    plane.must(&["delete", "pod", "-n", "keda", deleted, "--wait=false"]);
    // The HPA (no stabilization) rightly lowers the worker as the list
    // empties: the count must hold only while the list still asks for
    // it (more than `listLength` 5 per replica less one). The list only
    // shrinks, so every replica count seen up to the last poll that
    // found it that long was decided on a metric that asked for as many.
    let still_asking = (at_deletion.max(1) as i64 - 1) * 5;
    let mut asked_until = deleted_at;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let waiting: i64 = redis::cmd("LLEN").arg("jobs").query(&mut redis).unwrap();
        if waiting <= still_asking {
            break;
        }
        asked_until = watch.elapsed();
        assert!(
            Instant::now() < deadline,
            "{waiting} jobs still waiting after 240 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for_jobs(&mut redis, JOBS, &watch, Duration::from_secs(240)).await;
    let during: Vec<i32> = watch
        .samples()
        .iter()
        .filter(|sample| sample.at >= deleted_at && sample.at <= asked_until)
        .map(|sample| sample.replicas)
        .collect();
    eprintln!(
        "node: hoist pod {deleted} deleted at {at_deletion} replicas; while the list asked for as many the worker went {during:?}"
    );
    assert!(
        during.iter().all(|&replicas| replicas >= at_deletion),
        "the count held while a hoist pod was gone: {:?}",
        watch.samples()
    );
    rollout(plane, "keda", "hoist");
    let after = hoist_pods();
    assert!(
        !after.contains(deleted) && after.len() == 2,
        "the Deployment replaced {deleted}: {after:?}"
    );
    assert_eq!(counter(&mut redis, "jobs:done"), JOBS as i64);
    watch
        .wait(
            Duration::from_secs(180),
            "the worker back to zero",
            |samples| samples.last().is_some_and(|last| last.replicas == 0),
        )
        .await;
}

fn down_leaves_the_machine_as_it_was(plane: &ControlPlane, before: MachineState) {
    let status =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/controlplane.sh"))
            .arg("down")
            .env("CONTROLPLANE_DIR", &plane.dir)
            .status()
            .unwrap();
    assert!(status.success(), "scripts/controlplane.sh down");
    assert_eq!(
        mounts_under(&plane.dir),
        Vec::<String>::new(),
        "mounts left"
    );
    assert_eq!(kube_chains(), Vec::<String>::new(), "iptables chains left");
    assert_eq!(kubepods_cgroups(), Vec::<String>::new(), "cgroups left");
    assert_eq!(
        MachineState::read(),
        before,
        "netns, interfaces, ip_forward"
    );
}
