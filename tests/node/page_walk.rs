//! docs/getting-started.md on the real node: its blocks, in order, as
//! written, but for what cannot be had here, each replaced in the page's
//! text before it runs (`STAND_INS`) and said on the page:
//!
//! - the images: no registry is reached, so the page's names become the
//!   images built here (`localhost/hoist:test`, `localhost/redis:test`);
//!   the page's worker, which stands for yours, is the pause image (it
//!   pops nothing, so the list stays until the page deletes it, as the
//!   page expects), and `hashicorp/http-echo` is `hoist-load upstream`
//!   answering the same text;
//! - KEDA from its own manifests (already running), not its chart
//!   repository;
//! - `kubectl port-forward` on a free port rather than 8080.
//!
//! Everything else is real: `helm install` of the chart with the page's
//! values, the Redis pod the page's `kubectl exec` pushes to, KEDA and the
//! HPA scaling, the interceptor holding the page's `curl` until the app's
//! pod is Ready.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::controlplane::ControlPlane;
use crate::page::{PAGE, StandIns, Step, must_shell, replicas_as_shown, shell, steps, values_file};

/// The page's text → what runs here, each of which the page must still
/// say (a page edited away from them fails the test).
fn stand_ins(port: u16) -> Vec<(String, String)> {
    [
        (
            "  repository: registry.example.com/hoist\n",
            "  repository: localhost/hoist\n  tag: test\n  pullPolicy: Never\n",
        ),
        ("image: redis:7", "image: localhost/redis:test"),
        (
            "image: registry.example.com/worker:1",
            "image: localhost/pause:test",
        ),
        (
            "image: hashicorp/http-echo:1.0\n          args: [\"-listen=:8080\", \"-text=hello from web\"]",
            "image: localhost/hoist:test\n          command: [hoist-load, upstream, --listen, \"0.0.0.0:8080\", --body, \"hello from web\"]",
        ),
    ]
    .into_iter()
    .map(|(from, to)| (from.to_string(), to.to_string()))
    .chain([
        (
            "svc/hoist-interceptor-proxy 8080:8080 &".to_string(),
            format!("svc/hoist-interceptor-proxy {port}:8080 >/dev/null 2>&1 &"),
        ),
        (
            "http://localhost:8080/".to_string(),
            format!("http://localhost:{port}/"),
        ),
    ])
    .collect()
}

pub async fn the_getting_started_page_runs_on_the_node(
    plane: &ControlPlane,
    client: &kube::Client,
) {
    let started = Instant::now();
    let page = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE))
        .unwrap();
    let port = crate::support::free_port();
    let mut stand_ins = StandIns {
        replacements: stand_ins(port),
        used: BTreeMap::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let mut values = BTreeMap::new();
    let mut pending: Option<(String, String)> = None;
    for step in &steps(&page) {
        eprintln!(
            "walkthrough on the node ({:.0}s): {} {}",
            started.elapsed().as_secs_f64(),
            step.verb,
            step.name
        );
        match (step.verb.as_str(), step.lang.as_str(), step.name.as_str()) {
            ("values", "yaml", name) => {
                let file = dir.path().join(name);
                std::fs::write(&file, stand_ins.apply(&step.body)).unwrap();
                values.insert(name.to_string(), file);
            }
            // KEDA runs already, from its own manifests.
            ("stand-in", _, "keda") => {}
            // The page's own install, run as written in the repository.
            ("stand-in", "sh", "hoist") => {
                let file = &values[values_file(&step.body)];
                for line in lines(step) {
                    let line = line.replace(values_file(&step.body), file.to_str().unwrap());
                    must_run(plane, &line);
                }
            }
            // The port-forward, run as written on a free port; the next
            // request waits until it listens.
            ("stand-in", "sh", "proxy") | ("run", "sh", _) => {
                for line in lines(step) {
                    must_run(plane, &stand_ins.apply(line));
                }
                if step.name == "proxy" {
                    wait_listening(port);
                }
            }
            ("run", "yaml", _) => plane.apply(&stand_ins.apply(&step.body)),
            ("request", "sh", _) => {
                pending = Some((
                    stand_ins.apply(step.body.trim()),
                    step.shown.clone().expect("the page shows the answer"),
                ));
            }
            ("watch", "sh", _) => watch(plane, client, step, pending.take()).await,
            (verb, lang, name) => panic!("{PAGE}: `{verb} {name}` on a `{lang}` block"),
        }
    }
    stand_ins.assert_all_used();
    let _ = std::process::Command::new("pkill")
        .args(["-f", &format!("svc/hoist-interceptor-proxy {port}:8080")])
        .status();
    eprintln!(
        "walkthrough on the node: the page ran in {:.0}s",
        started.elapsed().as_secs_f64()
    );
}

fn lines(step: &Step) -> impl Iterator<Item = &str> {
    step.body.lines().filter(|line| !line.trim().is_empty())
}

/// A line of the page in `sh`, from the repository's root (the page's
/// `deploy/helm/hoist`).
fn must_run(plane: &ControlPlane, line: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let in_root = format!("cd {} && {line}", root.display());
    must_shell(plane, &in_root);
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "kubectl port-forward never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The page's watch; a request waiting is sent once the watch has read
/// where the app stands, and must be answered as the page shows.
async fn watch(
    plane: &ControlPlane,
    client: &kube::Client,
    step: &Step,
    pending: Option<(String, String)>,
) {
    let admin = plane.admin_kubeconfig.clone();
    let mut sent = None;
    replicas_as_shown(client, step, || {
        sent = pending.map(|(line, shown)| {
            let answer = tokio::task::spawn_blocking(move || {
                String::from_utf8(shell(&admin, &line).stdout).unwrap()
            });
            (answer, shown)
        });
    })
    .await;
    if let Some((answer, shown)) = sent {
        let answer = answer.await.unwrap();
        assert_eq!(
            answer.trim(),
            shown.trim(),
            "the page's request, answered by the app's pod"
        );
    }
}
