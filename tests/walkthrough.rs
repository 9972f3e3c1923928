//! docs/getting-started.md, run from the page itself in the real control
//! plane (`support/controlplane.rs`): every block the page marks with an
//! HTML comment `<!-- walkthrough: VERB [NAME] [(why)] -->` is a step,
//! taken in the page's order:
//!
//! - `run`: a `sh` block's lines run in `sh` as the cluster's admin, a
//!   `yaml` block is applied;
//! - `values NAME`: the chart values the page saves as NAME;
//! - `stand-in WHAT`: what the control plane cannot do, done here instead
//!   (`keda`: the plane runs it; `hoist`: hoist started in this process
//!   as the chart's ServiceAccount, with the config `helm template`
//!   renders from the page's values; `proxy`: requests go to that hoist's
//!   proxy on loopback);
//! - `request NAME`: the `sh` block's request, sent in the background
//!   once the next watch has read where the app stands; its answer must
//!   be the page's next `text` block;
//! - `watch NAME`: the Deployment NAME's `spec.replicas` must go through
//!   exactly the numbers of the page's next `text` block, in order.
//!
//! No kubelet runs pods here, so Redis and the HTTP app run on loopback
//! and the page's addresses for them are pointed there (`STAND_INS`);
//! the app starts when its Deployment asks for a replica, as the kubelet
//! would start the pod.

#[path = "support/controlplane.rs"]
mod controlplane;
mod manifests;
#[path = "walkthrough/page.rs"]
mod page;
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use controlplane::{ControlPlane, control_plane, replicas};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use page::{
    PAGE, StandIns, Step, must_shell, namespace_of, replicas_as_shown, shell, steps, values_file,
};
use support::web::{Upstream, full};
use support::{Hoist, RedisServer, free_port};

/// The text the page's http-echo container answers with (`-text=...`).
fn app_text(page: &str) -> String {
    let found = regex::Regex::new(r#""-text=([^"]+)""#).unwrap();
    found
        .captures(page)
        .expect("the page's app says what it answers (-text=)")[1]
        .to_string()
}

/// hoist's config as the chart renders it from the page's values, with
/// what running on loopback needs: listeners there, and the loopback
/// stand-ins allowed as sources and upstreams (which hoist refuses by
/// default).
fn chart_settings(values: &str) -> hoist::config::Settings {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist-values.yaml");
    std::fs::write(&file, values).unwrap();
    let docs = manifests::helm_template(&[file.to_str().unwrap()]);
    let config = manifests::config_text(&docs, manifests::named(&docs, "Deployment", "hoist"));
    let mut settings = manifests::load_ok("the page's chart values", config);
    assert!(
        settings.interceptor.enabled,
        "the page's values run the interceptor in hoist's pods"
    );
    settings.admin.listen = "127.0.0.1:0".parse().unwrap();
    settings.interceptor.http_listen = "127.0.0.1:0".parse().unwrap();
    settings.limits.allowed_sources.push("127.0.0.1:*".into());
    settings.interceptor.allowed_upstreams = vec!["127.0.0.1:*".into()];
    settings.interceptor.denied_networks = Vec::new();
    settings
}

/// A request of the page's, sent when the watch that follows it has read
/// where the app stands, and the answer the page shows.
struct Pending {
    line: String,
    shown: String,
}

impl Pending {
    /// The request on its way (in the background: it waits for the app).
    fn send(&self, admin: &std::path::Path) -> tokio::task::JoinHandle<String> {
        let (line, admin) = (self.line.clone(), admin.to_path_buf());
        tokio::task::spawn_blocking(move || String::from_utf8(shell(&admin, &line).stdout).unwrap())
    }
}

/// The kubelet's part for the page's app: once its Deployment asks for a
/// replica, the app listens at `addr` and answers `text` (as http-echo
/// does, with a newline); the running app, which counts its requests.
fn start_app_when_scheduled(
    deployments: Api<Deployment>,
    name: String,
    addr: SocketAddr,
    text: String,
) -> tokio::task::JoinHandle<Upstream> {
    tokio::spawn(async move {
        while replicas(&deployments, &name).await.unwrap_or(0) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let text = format!("{text}\n");
        Upstream::serve(listener, move |_| {
            let text = text.clone();
            async move { http::Response::new(full(text)) }
        })
    })
}

/// The walk through the page: what its steps have set up so far.
struct Walk {
    page: String,
    plane: &'static ControlPlane,
    client: kube::Client,
    redis: RedisServer,
    /// Where hoist's gRPC listens (KEDA is told through the page's
    /// `scalerAddress`).
    grpc: u16,
    /// Where the HTTP app will listen.
    app: SocketAddr,
    values: BTreeMap<String, String>,
    hoist: Option<Hoist>,
    pending: Option<Pending>,
    app_served: Option<Upstream>,
    stand_ins: StandIns,
}

impl Walk {
    async fn take(&mut self, step: &Step) {
        match (step.verb.as_str(), step.lang.as_str()) {
            ("values", "yaml") => {
                self.values.insert(step.name.clone(), step.body.clone());
            }
            ("stand-in", _) => match step.name.as_str() {
                "keda" => {}
                "hoist" => self.install_hoist(&step.body).await,
                "proxy" => assert!(self.hoist.is_some(), "hoist runs before its proxy is used"),
                other => panic!("{PAGE}: no stand-in for `{other}`"),
            },
            ("run", "yaml") => self.plane.apply(&self.stand_ins.apply(&step.body)),
            ("run", "sh") => {
                for line in step.body.lines().filter(|l| !l.trim().is_empty()) {
                    must_shell(self.plane, &self.stand_ins.apply(line));
                }
            }
            ("request", "sh") => self.request(step),
            ("watch", "sh") => self.watch(step).await,
            (verb, lang) => panic!("{PAGE}: `{verb}` on a `{lang}` block"),
        }
    }

    /// hoist as the chart would run it from the page's values, and the
    /// page's addresses pointed at what stands in on loopback.
    async fn install_hoist(&mut self, helm: &str) {
        let settings = chart_settings(&self.values[values_file(helm)]);
        let hoist = self.plane.start_hoist(settings, self.grpc).await;
        let proxy = hoist.http_proxy.expect("the in-process proxy");
        let redis = self.redis.address();
        self.stand_ins.replacements = vec![
            // Redis runs on loopback already.
            (
                "kubectl rollout status deployment/redis -n demo".into(),
                "true".into(),
            ),
            (
                "hoist.keda.svc.cluster.local:9090".into(),
                format!("127.0.0.1:{}", self.grpc),
            ),
            ("redis.demo.svc.cluster.local:6379".into(), redis.clone()),
            (
                "kubectl exec -n demo deploy/redis -- redis-cli".into(),
                format!("redis-cli -h {}", redis.replace(':', " -p ")),
            ),
            (
                "upstream: web:8080".into(),
                format!("upstream: \"{}\"", self.app),
            ),
            ("http://localhost:8080/".into(), format!("http://{proxy}/")),
        ];
        self.hoist = Some(hoist);
    }

    /// The page's request, to be sent once the next watch has begun.
    fn request(&mut self, step: &Step) {
        self.pending = Some(Pending {
            line: self.stand_ins.apply(step.body.trim()),
            shown: step.shown.clone().expect("the page shows the answer"),
        });
    }

    /// The Deployment's replicas go exactly as the page shows; with a
    /// request waiting, its app starts when scheduled and answers it.
    async fn watch(&mut self, step: &Step) {
        let deployments: Api<Deployment> =
            Api::namespaced(self.client.clone(), &namespace_of(&step.body));
        let pending = self.pending.take();
        let mut sent = None;
        replicas_as_shown(&self.client, step, || {
            sent = pending.map(|request| {
                let kubelet = start_app_when_scheduled(
                    deployments.clone(),
                    step.name.clone(),
                    self.app,
                    app_text(&self.page),
                );
                (
                    request.send(&self.plane.admin_kubeconfig),
                    request.shown,
                    kubelet,
                )
            });
        })
        .await;
        if let Some((answer, shown, kubelet)) = sent {
            let served = kubelet.await.unwrap();
            let answer = answer.await.unwrap();
            assert_eq!(answer.trim(), shown.trim(), "the page's request");
            assert_eq!(
                served.requests(),
                1,
                "the held request reached the app once"
            );
            self.app_served = Some(served);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_getting_started_page_runs_as_written() {
    let started = Instant::now();
    let page = std::fs::read_to_string(manifests::root().join(PAGE)).unwrap();
    let steps = steps(&page);
    let plane = control_plane();
    let mut walk = Walk {
        page,
        plane,
        client: plane.client().await,
        redis: RedisServer::start(),
        grpc: free_port(),
        app: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        values: BTreeMap::new(),
        hoist: None,
        pending: None,
        app_served: None,
        stand_ins: StandIns {
            replacements: Vec::new(),
            used: BTreeMap::new(),
        },
    };
    for step in &steps {
        eprintln!(
            "walkthrough ({:.0}s): {} {}",
            started.elapsed().as_secs_f64(),
            step.verb,
            step.name
        );
        walk.take(step).await;
    }
    walk.stand_ins.assert_all_used();
    assert!(walk.app_served.is_some(), "the HTTP app was woken");
    eprintln!(
        "walkthrough: {} steps in {:.0}s",
        steps.len(),
        started.elapsed().as_secs_f64()
    );
    let hoist = walk.hoist.expect("the page installs hoist");
    hoist.stop().await.unwrap();
}
