//! Pods that run: the real control plane with a real node
//! (`CONTROLPLANE_NODE=1 scripts/controlplane.sh up`: containerd 2 with
//! runc and a bridge CNI, kubelet, kube-proxy in iptables mode,
//! kube-scheduler and CoreDNS; see `support/controlplane.rs` and
//! docs/CONTROLPLANE.md). A Redis pod from the image built here
//! (`localhost/redis:test`) is scheduled, started and Ready; `kubectl logs`
//! and `kubectl exec` reach it through the API server and kubelet with
//! certificates only; another pod reaches it through its Service by DNS
//! name. Then `down` must leave the machine as it found it.

#[path = "support/controlplane.rs"]
mod controlplane;
mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use controlplane::{ControlPlane, control_plane_with_node};

const NAMESPACE: &str = "smoke";

/// A Redis pod of the image built here, Ready when it answers PING.
fn redis_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NAMESPACE}, labels: {{app: {name}}}}}
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

/// A Service in front of the pods labelled `app: NAME`, on Redis' port.
fn service(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 6379, targetPort: 6379}}]
"#
    )
}

/// What the node may leave on the machine, to compare before and after.
#[derive(Debug, PartialEq, Eq)]
struct MachineState {
    netns: BTreeSet<String>,
    ip_forward: String,
    links: BTreeSet<String>,
}

impl MachineState {
    fn read() -> Self {
        Self {
            netns: lines(&run("ip", &["netns", "list"]))
                .map(|line| line.split_whitespace().next().unwrap_or("").to_string())
                .collect(),
            ip_forward: std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
                .unwrap()
                .trim()
                .to_string(),
            links: lines(&run("ip", &["-o", "link", "show"]))
                .filter_map(|line| {
                    let name = line.split(": ").nth(1)?;
                    Some(name.split('@').next().unwrap_or(name).to_string())
                })
                .collect(),
        }
    }
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_string)
}

/// Every mount at or below `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_str().unwrap();
    lines(&run("findmnt", &["-rn", "-o", "TARGET"]))
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// Every KUBE-* chain in iptables and ip6tables.
fn kube_chains() -> Vec<String> {
    ["iptables-save", "ip6tables-save"]
        .iter()
        .flat_map(|save| {
            lines(&run(save, &[]))
                .filter(|line| line.starts_with(":KUBE-"))
                .map(|line| format!("{save}: {line}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every directory named `kubepods` in any cgroup hierarchy.
fn kubepods_cgroups() -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![(Path::new("/sys/fs/cgroup").to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            if entry.file_name() == "kubepods" {
                found.push(path.display().to_string());
            } else if depth < 3 {
                stack.push((path, depth + 1));
            }
        }
    }
    found
}

fn wait_ready(plane: &ControlPlane, pod: &str) {
    let output = plane.kubectl(&[
        "wait",
        "-n",
        NAMESPACE,
        "--for=condition=Ready",
        "--timeout=180s",
        &format!("pod/{pod}"),
    ]);
    assert!(
        output.status.success(),
        "pod {pod} not Ready: {}\n{}\nkubelet: {}",
        String::from_utf8_lossy(&output.stderr),
        plane.must(&["describe", "pod", "-n", NAMESPACE, pod]),
        plane.log_tail("kubelet", 30)
    );
}

#[test]
fn a_redis_pod_runs_answers_through_its_service_by_name_and_down_leaves_nothing() {
    let before = MachineState::read();
    let plane = control_plane_with_node();

    let ready = plane.must(&[
        "get",
        "node",
        "hoist-node",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
    ]);
    assert_eq!(ready, "True", "the node is Ready");

    plane.namespace(NAMESPACE);
    plane.apply(&format!(
        "{}---\n{}---\n{}",
        redis_pod("redis"),
        redis_pod("client"),
        service("redis")
    ));
    wait_ready(plane, "redis");
    wait_ready(plane, "client");
    let phase = plane.must(&[
        "get",
        "pod",
        "-n",
        NAMESPACE,
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
    let logs = plane.must(&["logs", "-n", NAMESPACE, "redis"]);
    assert!(
        logs.contains("Ready to accept connections"),
        "redis-server's log: {logs}"
    );
    let pong = plane.must(&["exec", "-n", NAMESPACE, "redis", "--", "redis-cli", "ping"]);
    assert_eq!(pong.trim(), "PONG");

    // From the other pod: cluster DNS names the Service, kube-proxy's
    // rules take its ClusterIP to the Redis pod.
    let name = format!("redis.{NAMESPACE}.svc.cluster.local");
    plane.must(&[
        "exec",
        "-n",
        NAMESPACE,
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
        NAMESPACE,
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

    // `down` stops and removes everything, and the machine is as before.
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
