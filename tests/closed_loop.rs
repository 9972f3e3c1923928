//! Engine mode in the closed loop, as a cluster runs it: a real hoist
//! (`scalingMode: engine`, counting from the cluster), a model of KEDA's
//! scale loop (activation 0 ↔ 1, `lastActiveTime` + `cooldownPeriod`) and a
//! model of the HPA controller (`support/hpa_model.rs`, held to the HPA's own
//! test vectors in `tests/hpa_conformance.rs`) writing the Deployment's `/scale` on the
//! Kubernetes API served from loopback (`support/kube_api.rs`), and a
//! Service Bus queue whose `ActiveMessageCount` follows a trace (Azure's
//! recorded response body, the count replaced). Everything runs in this
//! process on tokio's paused clock, so twenty minutes of cluster time take
//! a second or two; every scenario asserts the replica trajectory, not
//! just where it ends.

#[path = "support/hpa_model.rs"]
mod hpa_model;
#[path = "support/kube_api.rs"]
mod kube_api;
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hoist::config::Settings;
use hoist::proto::{GetMetricsRequest, ScaledObjectRef};
use hpa_model::{Behavior, Hpa, per_pod_proposal};
use kube_api::{FakeApi, with_triggers};
use serde_json::{Value, json};
use support::Hoist;
use tokio::time::{Instant, sleep_until, timeout};

const NAMESPACE: &str = "orders";
const NAME: &str = "worker";
/// Messages per replica (`messageCount`).
const TARGET: i64 = 5;
/// The HPA controller's `--horizontal-pod-autoscaler-sync-period`.
const HPA_SYNC_SECONDS: u64 = 15;
/// How long KEDA and the HPA wait for one call to hoist.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// docs/engine.md's recommended ScaledObject for engine mode: KEDA's cooldown
/// and the HPA's windows and rate limits out of the engine's way.
fn recommended(polling_seconds: u64) -> Value {
    json!({
        "scaleTargetRef": {"name": NAME},
        "pollingInterval": polling_seconds,
        "minReplicaCount": 0,
        "maxReplicaCount": 30,
        "cooldownPeriod": 0,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 15}]},
            "scaleDown": {"stabilizationWindowSeconds": 0,
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
        }}},
    })
}

/// A Service Bus namespace with one queue whose active message count the
/// test sets; the body is Azure's recorded answer with that count.
async fn service_bus(messages: Arc<AtomicI64>) -> SocketAddr {
    let recorded = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/servicebus/queue-runtime-properties.zero.api2021-05.java.xml"
    ))
    .unwrap();
    let zero = "<d2p1:ActiveMessageCount>0</d2p1:ActiveMessageCount>";
    assert!(recorded.contains(zero));
    let app = axum::Router::new().fallback(move || {
        let body = recorded.replace(
            zero,
            &format!(
                "<d2p1:ActiveMessageCount>{}</d2p1:ActiveMessageCount>",
                messages.load(Ordering::SeqCst)
            ),
        );
        async move {
            let mut response: Response = (StatusCode::OK, body).into_response();
            response.headers_mut().insert(
                "content-type",
                "application/atom+xml; type=entry; charset=utf-8"
                    .parse()
                    .unwrap(),
            );
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// KEDA's scale loop for one ScaledObject (`scale_executor`'s
/// `RequestScale`, without fallback or idle replicas).
struct Keda {
    min: i32,
    cooldown: Duration,
    last_active: Option<Instant>,
}

/// One change of the Deployment's `spec.replicas`.
#[derive(Debug, Clone, Copy)]
struct Write {
    second: u64,
    replicas: i32,
    by: &'static str,
}

/// What the HPA read from hoist at one sync: replicas (value ÷ target),
/// or `None` when the call failed.
#[derive(Debug, Clone, Copy)]
struct Answer {
    second: u64,
    replicas: Option<f64>,
}

/// How a scenario's world is set up.
struct Setup {
    scaled_object: Value,
    /// Trigger metadata beyond the source's.
    metadata: Vec<(&'static str, &'static str)>,
    /// Seconds after KEDA's first poll that the HPA syncs first.
    hpa_phase: u64,
    /// The HPA controller's sync period, in seconds.
    hpa_sync: u64,
    /// Seconds before a new pod shows in `status.replicas`.
    pod_start: u64,
    /// Keep engine state in a file across restarts.
    state_file: bool,
}

impl Setup {
    fn recommended(polling_seconds: u64) -> Self {
        Self {
            scaled_object: recommended(polling_seconds),
            metadata: vec![("cooldownPeriod", "300"), ("behavior", "none")],
            hpa_phase: 7,
            hpa_sync: HPA_SYNC_SECONDS,
            pod_start: 0,
            state_file: true,
        }
    }
}

struct Loop {
    api: FakeApi,
    messages: Arc<AtomicI64>,
    hoist: Option<Hoist>,
    settings: Settings,
    _state_dir: tempfile::TempDir,
    trigger: ScaledObjectRef,
    polling: u64,
    hpa_phase: u64,
    hpa_sync: u64,
    pod_start: u64,
    keda: Keda,
    hpa: Hpa,
    start: Instant,
    second: u64,
    /// Every `spec.replicas` written, in order.
    writes: Vec<Write>,
    answers: Vec<Answer>,
}

impl Loop {
    async fn start(setup: Setup) -> Self {
        let messages = Arc::new(AtomicI64::new(0));
        let bus = service_bus(messages.clone()).await;
        let api = FakeApi::start().await;
        let connection = format!(
            "Endpoint=sb://{bus}/;SharedAccessKeyName=reader;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"
        );
        let mut metadata = vec![
            ("scalerAddress", "hoist.keda:9090"),
            ("scaler", "azure-servicebus"),
            ("queueName", "jobs"),
            ("connectionFromEnv", connection.as_str()),
            ("messageCount", "5"),
            ("scalingMode", "engine"),
        ];
        metadata.extend(setup.metadata.iter().copied());
        let trigger = ScaledObjectRef {
            name: NAME.into(),
            namespace: NAMESPACE.into(),
            scaler_metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let so = &setup.scaled_object;
        api.put_scaled_object(NAMESPACE, NAME, with_triggers(so.clone(), &[&trigger]));
        api.set_scale("deployments", NAMESPACE, NAME, 0, 0);

        // What KEDA makes of the ScaledObject: its own loop, and the HPA.
        let min = so["minReplicaCount"].as_i64().unwrap_or(0) as i32;
        let keda = Keda {
            min,
            cooldown: Duration::from_secs(so["cooldownPeriod"].as_u64().unwrap_or(300)),
            last_active: None,
        };
        let behavior = &so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
        let hpa = Hpa::new(
            min.max(1),
            so["maxReplicaCount"].as_i64().unwrap_or(100) as i32,
            (!behavior.is_null()).then(|| Behavior::from_json(behavior)),
        );

        let state_dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::default();
        settings.kubernetes.kubeconfig = Some(api.kubeconfig());
        settings.kubernetes.timeout = Duration::from_secs(2);
        settings.state_file = Some(if setup.state_file {
            state_dir.path().join("state.json")
        } else {
            Default::default()
        });
        let mut world = Self {
            api,
            messages,
            hoist: None,
            settings,
            _state_dir: state_dir,
            trigger,
            polling: so["pollingInterval"].as_u64().unwrap_or(30),
            hpa_phase: setup.hpa_phase,
            hpa_sync: setup.hpa_sync,
            pod_start: setup.pod_start,
            keda,
            hpa,
            start: Instant::now(),
            second: 0,
            writes: vec![Write {
                second: 0,
                replicas: 0,
                by: "start",
            }],
            answers: Vec::new(),
        };
        world.start_hoist().await;
        world
    }

    async fn start_hoist(&mut self) {
        let hoist = Hoist::start_with(self.settings.clone()).await;
        // KEDA asks for the metric spec when it creates the HPA.
        let spec = hoist.spec(&self.trigger).await;
        assert_eq!(spec.target_size, TARGET);
        self.hoist = Some(hoist);
    }

    async fn stop_hoist(&mut self) {
        if let Some(hoist) = self.hoist.take() {
            hoist.stop().await.unwrap();
        }
    }

    fn set_messages(&self, messages: i64) {
        self.messages.store(messages, Ordering::SeqCst);
    }

    fn scale(&self) -> (i32, i32) {
        let (spec, status) = self.api.scale("deployments", NAMESPACE, NAME).unwrap();
        (spec as i32, status as i32)
    }

    fn now(&self) -> Instant {
        self.start + Duration::from_secs(self.second)
    }

    /// A write of `spec.replicas` (KEDA, the HPA, or a person).
    fn write(&mut self, replicas: i32, by: &'static str) {
        let (_, status) = self.scale();
        // Fewer pods show at once; more only once they have started.
        let status = if self.pod_start == 0 {
            replicas
        } else {
            status.min(replicas)
        };
        self.api.set_scale(
            "deployments",
            NAMESPACE,
            NAME,
            replicas as i64,
            status as i64,
        );
        self.writes.push(Write {
            second: self.second,
            replicas,
            by,
        });
    }

    /// `status.replicas` catches up with pods started `pod_start` ago.
    fn pods(&mut self) {
        let (spec, status) = self.scale();
        let started_before = self.second.saturating_sub(self.pod_start);
        let started = self
            .writes
            .iter()
            .rev()
            .find(|w| w.second <= started_before)
            .map_or(0, |w| w.replicas);
        let shown = spec.min(started.max(status.min(spec)));
        if shown != status {
            self.api
                .set_scale("deployments", NAMESPACE, NAME, spec as i64, shown as i64);
        }
    }

    /// KEDA's poll: `IsActive`, then `RequestScale`.
    async fn keda_poll(&mut self) {
        let active = match &self.hoist {
            Some(hoist) => match timeout(CALL_TIMEOUT, hoist.active(&self.trigger)).await {
                Ok(Ok(active)) => Some(active),
                _ => None,
            },
            None => None,
        };
        let (spec, _) = self.scale();
        let now = self.now();
        match active {
            Some(true) => {
                self.keda.last_active = Some(now);
                if spec == 0 {
                    self.write(self.keda.min.max(1), "keda");
                }
            }
            Some(false) => {
                let cooled = self
                    .keda
                    .last_active
                    .is_none_or(|last| last + self.keda.cooldown < now);
                if spec > 0 && self.keda.min == 0 && cooled {
                    self.write(0, "keda");
                } else if spec < self.keda.min {
                    self.write(self.keda.min, "keda");
                }
            }
            // An error without a `fallback`: KEDA changes nothing.
            None => {}
        }
    }

    /// The HPA's sync: the metric through KEDA's metrics adapter (the
    /// value as a milli-quantity), then `reconcileAutoscaler`.
    async fn hpa_sync(&mut self) {
        let value = match &self.hoist {
            Some(hoist) => {
                let request = GetMetricsRequest {
                    scaled_object_ref: Some(self.trigger.clone()),
                    // KEDA strips its `s0-` prefix before asking.
                    metric_name: "azure-servicebus-jobs".into(),
                };
                let mut client = hoist.client().await;
                match timeout(CALL_TIMEOUT, client.get_metrics(request)).await {
                    Ok(Ok(response)) => {
                        Some(response.into_inner().metric_values[0].metric_value_float)
                    }
                    _ => None,
                }
            }
            None => None,
        };
        self.answers.push(Answer {
            second: self.second,
            replicas: value.map(|v| v / TARGET as f64),
        });
        let (spec, status) = self.scale();
        let proposal = value.map(|value| {
            per_pod_proposal(
                (value * 1000.0) as i64,
                TARGET * 1000,
                status,
                self.hpa.tolerances(),
            )
        });
        let now = self.second * 1000;
        if let Some(replicas) = self.hpa.reconcile(now, spec, &[proposal]) {
            self.write(replicas, "hpa");
        }
    }

    /// Waits, without moving the cluster's clock, until hoist's answer is
    /// `replicas` (or ten real seconds pass): what hoist does "at once" is
    /// done before the next second. A task that is always ready keeps the
    /// paused clock from jumping ahead while hoist's watch event is still
    /// on its way over loopback (on a loaded machine the HPA's next sync
    /// came first, and read the answer from before the change).
    async fn until_answer(&self, replicas: f64) {
        let busy = tokio::spawn(async {
            loop {
                tokio::task::yield_now().await;
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let request = GetMetricsRequest {
                scaled_object_ref: Some(self.trigger.clone()),
                metric_name: "azure-servicebus-jobs".into(),
            };
            let answer = match &self.hoist {
                Some(hoist) => hoist.client().await.get_metrics(request).await.ok(),
                None => None,
            };
            let seen = answer.map(|a| a.into_inner().metric_values[0].metric_value_float);
            if seen == Some(replicas * TARGET as f64) {
                break;
            }
        }
        busy.abort();
    }

    /// One second of the cluster: pods, KEDA's poll and the HPA's sync
    /// when due, then the clock moves on (hoist runs meanwhile).
    async fn tick(&mut self) {
        self.pods();
        if self.second.is_multiple_of(self.polling) {
            self.keda_poll().await;
        }
        if self.second >= self.hpa_phase
            && (self.second - self.hpa_phase).is_multiple_of(self.hpa_sync)
        {
            self.hpa_sync().await;
        }
        self.second += 1;
        sleep_until(self.now()).await;
    }

    async fn run_until(&mut self, second: u64) {
        while self.second < second {
            self.tick().await;
        }
    }

    /// The distinct `spec.replicas` in order, from 0.
    fn trajectory(&self) -> Vec<i32> {
        let mut values: Vec<i32> = Vec::new();
        for write in &self.writes {
            if values.last() != Some(&write.replicas) {
                values.push(write.replicas);
            }
        }
        values
    }

    /// When `spec.replicas` first became `replicas` at or after `from`.
    fn reached(&self, replicas: i32, from: u64) -> u64 {
        self.writes
            .iter()
            .find(|w| w.second >= from && w.replicas == replicas)
            .unwrap_or_else(|| panic!("{replicas} never written after {from} s: {}", self.log()))
            .second
    }

    /// `spec.replicas` at `second`.
    fn replicas_at(&self, second: u64) -> i32 {
        self.writes
            .iter()
            .rev()
            .find(|w| w.second <= second)
            .map_or(0, |w| w.replicas)
    }

    /// The writes, then what the HPA read, for failure messages.
    fn log(&self) -> String {
        let writes: Vec<String> = self
            .writes
            .iter()
            .map(|w| format!("{}s:{}({})", w.second, w.replicas, w.by))
            .collect();
        let answers: Vec<String> = self
            .answers
            .iter()
            .map(|a| match a.replicas {
                Some(replicas) => format!("{}s:{replicas}", a.second),
                None => format!("{}s:-", a.second),
            })
            .collect();
        format!(
            "writes {}; HPA read {}",
            writes.join(" "),
            answers.join(" ")
        )
    }

    fn events(&self, reason: &str) -> Vec<Value> {
        self.api
            .events()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }
}

/// ACA's trajectory: 0 → 1 → 4 → 8 → 10 for 50 messages, 10 → 20 → 30 for
/// 150, and 0 once the queue has been empty for the engine's cooldown.
#[tokio::test(start_paused = true)]
async fn the_aca_trace_steps_0_1_4_8_10_20_30_0() {
    let mut world = Loop::start(Setup::recommended(30)).await;
    world.run_until(30).await;
    world.set_messages(50);
    world.run_until(300).await;
    world.set_messages(150);
    world.run_until(600).await;
    world.set_messages(0);
    world.run_until(1000).await;
    println!("ACA trace: {}", world.log());

    assert_eq!(
        world.trajectory(),
        [0, 1, 4, 8, 10, 20, 30, 0],
        "{}",
        world.log()
    );
    // One step per engine evaluation (30 s), not one per HPA sync (15 s):
    // the HPA applying a step is not an outside change to step from again.
    // Events at the same instant (an evaluation and a sync) may land in
    // either order, which moves a step by one sync: hence the ranges.
    let (one, four, ten) = (
        world.reached(1, 30),
        world.reached(4, 30),
        world.reached(10, 30),
    );
    assert!(one <= 60, "activated at the first poll with messages");
    assert!(four - one <= 45, "{}", world.log());
    assert!(
        (45..=75).contains(&(ten - four)),
        "4 → 8 → 10 in two evaluations: {}",
        world.log()
    );
    let (twenty, thirty) = (world.reached(20, 300), world.reached(30, 300));
    assert!(twenty <= 345 && thirty - twenty >= 15, "{}", world.log());
    // Zero only after the queue has been empty for the cooldown (300 s),
    // and nothing in between: the count holds while cooling down.
    let zero = world.reached(0, 600);
    assert!((900..=960).contains(&zero), "{}", world.log());
    assert_eq!(world.replicas_at(zero - 1), 30, "{}", world.log());
}

/// Pods that take 45 s to show in `status.replicas`: the engine steps
/// from `spec.replicas` and the HPA divides by `status.replicas`; the
/// count climbs to 10 without overshoot or a step back.
#[tokio::test(start_paused = true)]
async fn slow_pods_neither_overshoot_nor_oscillate() {
    let mut world = Loop::start(Setup {
        pod_start: 45,
        ..Setup::recommended(30)
    })
    .await;
    world.set_messages(50);
    world.run_until(400).await;
    println!("slow pods: {}", world.log());
    let trajectory = world.trajectory();
    assert_eq!(trajectory.last(), Some(&10), "{}", world.log());
    assert!(
        trajectory.windows(2).all(|w| w[0] < w[1]),
        "only increases while the load holds: {}",
        world.log()
    );
    assert_eq!(trajectory, [0, 1, 4, 8, 10], "{}", world.log());
}

/// `kubectl scale --replicas=3` while the queue wants 10: hoist sees the
/// change at once, so the HPA's next sync reads 6, then 10 (ACA's 3 → 6 →
/// 10), never the 10 computed before the change.
#[tokio::test(start_paused = true)]
async fn a_manual_scale_mid_run_steps_up_again_from_what_runs() {
    let mut world = Loop::start(Setup::recommended(30)).await;
    world.set_messages(50);
    world.run_until(200).await;
    assert_eq!(world.scale().0, 10, "{}", world.log());
    world.write(3, "kubectl");
    world.until_answer(6.0).await;
    world.run_until(400).await;
    println!("manual scale: {}", world.log());
    let after: Vec<i32> = world
        .writes
        .iter()
        .filter(|w| w.second >= 200)
        .map(|w| w.replicas)
        .collect();
    assert_eq!(after, [3, 6, 10], "{}", world.log());
    // The HPA never read the old answer after the change.
    assert!(
        world
            .answers
            .iter()
            .filter(|a| a.second > 200)
            .take_while(|a| a.replicas != Some(10.0))
            .all(|a| a.replicas == Some(6.0)),
        "{:?}",
        world.answers
    );
}

/// The API server refusing (503) for 30 s, then hanging for 30 s: the
/// count holds, hoist answers `Unavailable` once the last count read is an
/// interval old, and says once the API answers again how long it could not
/// count.
#[tokio::test(start_paused = true)]
async fn an_api_refusing_or_hanging_holds_the_count() {
    let mut world = Loop::start(Setup::recommended(10)).await;
    world.set_messages(50);
    world.run_until(120).await;
    assert_eq!(world.scale().0, 10, "{}", world.log());

    for (outage, from) in [("refusing", 120), ("hanging", 240)] {
        match outage {
            "refusing" => world.api.set_down(true),
            _ => world.api.set_hung(true),
        }
        world.run_until(from + 30).await;
        world.api.set_down(false);
        world.api.set_hung(false);
        world.run_until(from + 120).await;
        let during: Vec<&Answer> = world
            .answers
            .iter()
            .filter(|a| a.second >= from && a.second < from + 30)
            .collect();
        let first_unavailable = during
            .iter()
            .find(|a| a.replicas.is_none())
            .unwrap_or_else(|| panic!("{outage}: Unavailable within the outage: {:?}", during))
            .second;
        // The last read succeeded at most one interval (10 s) before the
        // outage, the count serves one interval from the first failed read
        // (a hung read counts from its start), and the HPA syncs every 15 s.
        assert!(
            first_unavailable - from <= 10 + 10 + 2 + HPA_SYNC_SECONDS,
            "{outage}: first Unavailable {first_unavailable} s"
        );
        assert!(
            during
                .iter()
                .all(|a| matches!(a.replicas, None | Some(10.0))),
            "{outage}: {during:?}"
        );
        // Answers again after the outage.
        let last = world.answers.last().unwrap();
        assert_eq!(last.replicas, Some(10.0), "{outage}: {:?}", world.answers);
    }
    assert_eq!(world.trajectory(), [0, 1, 4, 8, 10], "{}", world.log());
    let unknown = world.events("ReplicaCountUnknown");
    assert!(
        unknown.iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("known again"))),
        "{unknown:#?}"
    );
}

/// hoist restarted while the queue wants 10, with and without its state
/// file: the count is read from the cluster, never collapses, and the
/// cooldown still runs its full length afterwards.
#[tokio::test(start_paused = true)]
async fn a_restart_with_or_without_state_never_collapses_the_count() {
    for state_file in [true, false] {
        let mut world = Loop::start(Setup {
            state_file,
            ..Setup::recommended(30)
        })
        .await;
        world.set_messages(50);
        world.run_until(200).await;
        assert_eq!(world.scale().0, 10, "{}", world.log());
        world.stop_hoist().await;
        world.run_until(220).await;
        world.start_hoist().await;
        world.run_until(400).await;
        world.set_messages(0);
        world.run_until(800).await;
        println!("restart (state file: {state_file}): {}", world.log());
        assert_eq!(world.trajectory(), [0, 1, 4, 8, 10, 0], "{}", world.log());
        // The last reading with messages came at most one poll (30 s)
        // before the queue emptied at 400 s; the cooldown is 300 s.
        let zero = world.reached(0, 400);
        assert!(
            (670..=760).contains(&zero),
            "a full cooldown after the restart: {}",
            world.log()
        );
        assert!(
            world
                .answers
                .iter()
                .filter(|a| a.second >= 220 && a.second < 400)
                .all(|a| matches!(a.replicas, None | Some(10.0))),
            "{:?}",
            world.answers
        );
    }
}

/// An HPA allowing one pod per 15 s while the engine steps 1 → 4 → 8: the
/// HPA's limit wins, the count climbs one pod per sync to 10, the engine's
/// answer never falls back, and hoist posts `EngineLimitedByScaledObject`.
#[tokio::test(start_paused = true)]
async fn an_hpa_policy_stricter_than_the_engine_converges_one_pod_per_period() {
    let mut scaled_object = recommended(30);
    scaled_object["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"] = json!({
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}],
    });
    let mut world = Loop::start(Setup {
        scaled_object,
        ..Setup::recommended(30)
    })
    .await;
    world.set_messages(50);
    world.run_until(300).await;
    println!("strict HPA: {}", world.log());
    assert_eq!(
        world.trajectory(),
        (0..=10).collect::<Vec<_>>(),
        "{}",
        world.log()
    );
    let hpa_steps: Vec<u64> = world
        .writes
        .iter()
        .filter(|w| w.by == "hpa")
        .map(|w| w.second)
        .collect();
    assert!(
        hpa_steps
            .windows(2)
            .all(|w| w[1] - w[0] >= HPA_SYNC_SECONDS),
        "{}",
        world.log()
    );
    let answers: Vec<f64> = world.answers.iter().filter_map(|a| a.replicas).collect();
    assert!(
        answers.windows(2).all(|w| w[1] >= w[0]),
        "the engine's answer never falls under load: {answers:?}"
    );
    assert!(
        !world.events("EngineLimitedByScaledObject").is_empty(),
        "{:#?}",
        world.api.events()
    );
}

/// A rate policy adopted from the ScaledObject's `behavior` (1 pod per
/// 4 s), KEDA polling every 2 s and the HPA syncing every 2 s: the count
/// climbs at the policy's pace, one pod every 4 s, no slower. The engine
/// dates each step from its decision, as the HPA dates its own from the
/// sync that applies it; dated from when the engine saw it applied (a few
/// milliseconds later), the evaluation one period on was still inside the
/// period and every step waited one more poll (10 replicas at 62–64 s).
#[tokio::test(start_paused = true)]
async fn an_adopted_rate_policy_is_met_at_its_own_pace() {
    let mut scaled_object = recommended(2);
    scaled_object["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"] = json!({
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 4}],
    });
    let mut world = Loop::start(Setup {
        scaled_object,
        metadata: vec![("cooldownPeriod", "300")],
        hpa_phase: 1,
        hpa_sync: 2,
        ..Setup::recommended(2)
    })
    .await;
    world.set_messages(50);
    world.run_until(90).await;
    println!("adopted 1 pod per 4 s: {}", world.log());
    assert_eq!(
        world.trajectory(),
        (0..=10).collect::<Vec<_>>(),
        "{}",
        world.log()
    );
    let steps: Vec<u64> = (1..=10).map(|r| world.reached(r, 0)).collect();
    // The HPA's own steps (from 2 on; 0 → 1 is KEDA's, which the HPA's
    // policy does not count) are a period apart at least.
    assert!(
        steps[1..].windows(2).all(|w| w[1] - w[0] >= 4),
        "never faster than the policy: {}",
        world.log()
    );
    // 0 → 1 at KEDA's first poll with messages, then nine steps of 4 s
    // (and one sync's slack).
    assert!(
        steps[9] - steps[0] <= 9 * 4 + 2,
        "at the policy's pace, no slower: 1 at {} s, 10 at {} s: {}",
        steps[0],
        steps[9],
        world.log()
    );
}

/// A ScaledObject `behavior` with only a scale-down window (60 s): the
/// engine takes it as its own, and KEDA gives it to the HPA too. Both scale
/// up by the HPA's default policy (4 pods or 100 % per 15 s: 1 → 5 → 10 →
/// 20); a decrease is held by the engine's window and then by the HPA's, one
/// after the other (what `EngineLimitedByScaledObject` warns of); with the
/// queue empty, the count falls to 1 (the HPA's minimum) while the engine's
/// cooldown (120 s) runs, then KEDA takes it to zero.
#[tokio::test(start_paused = true)]
async fn a_behavior_with_only_a_scale_down_window() {
    let scaled_object = json!({
        "scaleTargetRef": {"name": NAME},
        "pollingInterval": 15,
        "minReplicaCount": 0,
        "maxReplicaCount": 30,
        "cooldownPeriod": 0,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleDown": {"stabilizationWindowSeconds": 60},
        }}},
    });
    let mut world = Loop::start(Setup {
        scaled_object,
        metadata: vec![("cooldownPeriod", "120")],
        ..Setup::recommended(15)
    })
    .await;
    world.set_messages(100);
    world.run_until(200).await;
    world.set_messages(25);
    world.run_until(400).await;
    world.set_messages(0);
    world.run_until(700).await;
    println!("scale-down window only: {}", world.log());
    assert_eq!(
        world.trajectory(),
        [0, 1, 5, 10, 20, 5, 1, 0],
        "{}",
        world.log()
    );
    let (five, one, zero) = (
        world.reached(5, 200),
        world.reached(1, 400),
        world.reached(0, 400),
    );
    // Two 60 s windows in a row, each from a reading up to one interval old.
    // (± one sync where an evaluation and a sync share an instant)
    assert!((295..=350).contains(&five), "{}", world.log());
    assert!(one > 460 && one < zero, "{}", world.log());
    assert!(
        (505..=575).contains(&zero),
        "after the cooldown: {}",
        world.log()
    );
    assert!(
        !world.events("EngineLimitedByScaledObject").is_empty(),
        "{:#?}",
        world.api.events()
    );
}

/// An engine `behavior` with a rate policy (2 pods per 60 s), evaluated
/// every 5 s (shorter than the HPA's 15 s sync) and every 15 s (the same
/// period, on the same instants): the answer never falls while the load
/// holds, and the count climbs 2 pods per minute to 10 — a decision the
/// HPA has not applied yet is never counted against the next one.
#[tokio::test(start_paused = true)]
async fn rate_policies_hold_whatever_the_engine_interval() {
    for (polling, phase) in [(5, 7), (15, 0)] {
        let mut world = Loop::start(Setup {
            metadata: vec![(
                "behavior",
                r#"{"scaleUp":{"stabilizationWindowSeconds":0,"policies":[{"type":"Pods","value":2,"periodSeconds":60}]},"scaleDown":{"stabilizationWindowSeconds":300}}"#,
            )],
            hpa_phase: phase,
            ..Setup::recommended(polling)
        })
        .await;
        world.set_messages(50);
        world.run_until(400).await;
        println!("rate policy every {polling} s: {}", world.log());
        assert_eq!(
            world.trajectory(),
            [0, 1, 3, 5, 7, 9, 10],
            "every {polling} s: {}",
            world.log()
        );
        let answers: Vec<f64> = world.answers.iter().filter_map(|a| a.replicas).collect();
        assert!(
            answers.windows(2).all(|w| w[1] >= w[0]),
            "every {polling} s, the answer never falls under load: {answers:?}"
        );
        // Two pods per minute: each step at least a minute after the last.
        let steps: Vec<u64> = [3, 5, 7, 9].iter().map(|&r| world.reached(r, 0)).collect();
        assert!(
            steps.windows(2).all(|w| w[1] - w[0] >= 55),
            "every {polling} s: {}",
            world.log()
        );
    }
}
