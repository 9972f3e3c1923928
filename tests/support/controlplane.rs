//! The real control plane for tests/controlplane.rs: etcd, kube-apiserver,
//! kube-controller-manager (the HPA among its controllers) and KEDA's
//! operator and metrics adapter, built from their Go modules and started on
//! loopback by `scripts/controlplane.sh`. One per test binary, started by
//! the first test that asks and stopped by the script's watcher when the
//! binary exits. hoist talks to it as the ServiceAccount the Helm chart
//! renders, with exactly the chart's RBAC.

#![allow(dead_code)] // tests/controlplane.rs and tests/walkthrough.rs use different parts

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The namespace the chart is installed into, and its release name.
pub const HOIST_NAMESPACE: &str = "hoist-system";
pub const RELEASE: &str = "hoist";
/// The user the API server sees for hoist: the chart's ServiceAccount.
pub const HOIST_USER: &str = "system:serviceaccount:hoist-system:hoist";

pub struct ControlPlane {
    pub dir: PathBuf,
    pub admin_kubeconfig: PathBuf,
    /// A kubeconfig holding a token of the chart's ServiceAccount.
    pub hoist_kubeconfig: PathBuf,
    /// Refusals while a component restarted (the audit IDs): a freshly
    /// started API server answers 403 for a moment before its RBAC
    /// caches are filled, which says nothing about the chart's grants.
    excused: std::sync::Mutex<BTreeSet<String>>,
}

static PLANE: OnceLock<ControlPlane> = OnceLock::new();
static PLANE_WITH_NODE: OnceLock<ControlPlane> = OnceLock::new();

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The control plane of this test binary, started on first use.
pub fn control_plane() -> &'static ControlPlane {
    PLANE.get_or_init(|| ControlPlane::start(false))
}

/// The control plane of this test binary with a node (containerd,
/// kubelet, kube-proxy, kube-scheduler, CoreDNS: `CONTROLPLANE_NODE=1`),
/// started on first use; pods run.
pub fn control_plane_with_node() -> &'static ControlPlane {
    PLANE_WITH_NODE.get_or_init(|| ControlPlane::start(true))
}

impl ControlPlane {
    fn start(node: bool) -> Self {
        let dir = root()
            .join("target/controlplane")
            // Its own directory per kind: a binary that started both
            // would otherwise give two planes one directory.
            .join(format!(
                "run-{}{}",
                std::process::id(),
                if node { "-node" } else { "" }
            ));
        let started = Instant::now();
        let output = Command::new(root().join("scripts/controlplane.sh"))
            .arg("up")
            .env("CONTROLPLANE_DIR", &dir)
            .env("CONTROLPLANE_NODE", if node { "1" } else { "0" })
            // hoist's image (localhost/hoist:test) from the binaries Cargo
            // built for this test run.
            .env("HOIST_IMAGE_BINARY", env!("CARGO_BIN_EXE_hoist"))
            .env("CONTROLPLANE_PARENT", std::process::id().to_string())
            .env("HPA_SYNC_PERIOD", "1s")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/controlplane.sh runs");
        assert!(
            output.status.success(),
            "scripts/controlplane.sh up failed (logs in {})",
            dir.join("logs").display()
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let admin_kubeconfig = PathBuf::from(
            stdout
                .lines()
                .last()
                .expect("`up` prints the kubeconfig's path last"),
        );
        eprintln!(
            "control plane up in {:.1}s: {}",
            started.elapsed().as_secs_f64(),
            admin_kubeconfig.display()
        );
        let mut plane = Self {
            hoist_kubeconfig: PathBuf::new(),
            dir,
            admin_kubeconfig,
            excused: Default::default(),
        };
        // With a node, hoist is installed by its chart as a pod (tests/node.rs);
        // without one, it runs in the test process as the chart's
        // ServiceAccount.
        if !node {
            plane.install_chart_rbac();
            plane.hoist_kubeconfig = plane.hoist_credential("hoist.kubeconfig").0;
        }
        plane
    }

    /// kubectl as the cluster's admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with_input(args, None)
    }

    /// `helm` against this cluster as its admin, which must succeed; its
    /// standard output.
    pub fn helm(&self, args: &[&str]) -> String {
        let output = Command::new("helm")
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .current_dir(root())
            .stdin(Stdio::null())
            .output()
            .expect("helm runs (scripts/layer-tool.sh helm)");
        assert!(
            output.status.success(),
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    pub fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Output {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs (scripts/layer-tool.sh kubectl)");
        if let Some(input) = input {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed; its standard output.
    pub fn must(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// `kubectl apply` of YAML or JSON documents, which must succeed.
    pub fn apply(&self, documents: &str) {
        let output = self.kubectl_with_input(&["apply", "-f", "-"], Some(documents));
        assert!(
            output.status.success(),
            "kubectl apply: {}\n{documents}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// An admin client of the API server.
    pub async fn client(&self) -> kube::Client {
        client_from(&self.admin_kubeconfig).await
    }

    /// The ServiceAccount, ClusterRoles, Roles and their bindings that
    /// `helm template` renders for a release with every feature that needs
    /// the API on (engine mode is always on; trigger authentication and
    /// the admin port's TokenReview are switches; the interceptor in
    /// hoist's pods reads Services' pods), applied as they are.
    fn install_chart_rbac(&self) {
        self.must(&["create", "namespace", HOIST_NAMESPACE]);
        let rendered = Command::new("helm")
            .args([
                "template",
                RELEASE,
                root().join("deploy/helm/hoist").to_str().unwrap(),
                "--namespace",
                HOIST_NAMESPACE,
                "--set",
                "kubernetes.triggerAuthentication=true",
                "--set",
                "adminAuth.enabled=true",
                "--set",
                "interceptor.mode=inProcess",
            ])
            .output()
            .expect("helm runs (scripts/layer-tool.sh helm)");
        assert!(
            rendered.status.success(),
            "helm template: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        let rendered = String::from_utf8(rendered.stdout).unwrap();
        let wanted = [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ];
        let rbac: Vec<&str> = rendered
            .split("\n---")
            .filter(|document| {
                document
                    .lines()
                    .filter_map(|line| line.strip_prefix("kind: "))
                    .any(|kind| wanted.contains(&kind))
            })
            .collect();
        assert!(
            rbac.iter()
                .any(|document| document.contains("kind: ClusterRole\n")),
            "the chart renders hoist's ClusterRole"
        );
        self.apply(&rbac.join("\n---\n"));
    }

    /// A kubeconfig named `file` with a new token of the chart's
    /// ServiceAccount (TokenRequest, as a pod's projected token is made), and the token's ID, which the audit log keeps with
    /// each request made with it (`authentication.kubernetes.io/credential-id`).
    pub fn hoist_credential(&self, file: &str) -> (PathBuf, String) {
        use base64::Engine;
        let token = self.must(&[
            "create",
            "token",
            RELEASE,
            "--namespace",
            HOIST_NAMESPACE,
            "--duration",
            "24h",
        ]);
        let token = token.trim();
        let claims = token.split('.').nth(1).expect("a JWT");
        let claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(claims)
                .unwrap(),
        )
        .unwrap();
        let id = claims["jti"].as_str().expect("the token's jti").to_string();
        let server = self.must(&[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ]);
        let path = self.dir.join(file);
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: hoist\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: hoist\ncurrent-context: c\n",
                self.dir.join("pki/ca.crt").display(),
            ),
        )
        .unwrap();
        (path, id)
    }

    /// Every request hoist's ServiceAccount made so far, from the API
    /// server's audit log.
    pub fn hoist_requests(&self) -> Vec<AuditedRequest> {
        let log = std::fs::read_to_string(self.dir.join("logs/audit.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["user"]["username"] == HOIST_USER)
            .map(|event| AuditedRequest {
                audit_id: event["auditID"].as_str().unwrap_or_default().to_string(),
                credential: event["user"]["extra"]["authentication.kubernetes.io/credential-id"][0]
                    .as_str()
                    .and_then(|id| id.strip_prefix("JTI="))
                    .unwrap_or_default()
                    .to_string(),
                verb: event["verb"].as_str().unwrap_or_default().to_string(),
                group: event["objectRef"]["apiGroup"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                resource: match (
                    event["objectRef"]["resource"].as_str(),
                    event["objectRef"]["subresource"].as_str(),
                ) {
                    (Some(resource), Some(sub)) => format!("{resource}/{sub}"),
                    (Some(resource), None) => resource.to_string(),
                    _ => event["requestURI"].as_str().unwrap_or_default().to_string(),
                },
                code: event["responseStatus"]["code"].as_i64().unwrap_or(0),
            })
            .collect()
    }

    /// The API calls hoist made that RBAC refused.
    pub fn hoist_forbidden(&self) -> BTreeSet<String> {
        let excused = self.excused.lock().unwrap();
        self.hoist_requests()
            .into_iter()
            .filter(|request| request.code == 403 && !excused.contains(&request.audit_id))
            .map(|request| request.to_string())
            .collect()
    }

    /// Every refusal so far was a restarted component's (see `excused`);
    /// returns them.
    pub fn excuse_refusals_so_far(&self) -> BTreeSet<String> {
        let mut excused = self.excused.lock().unwrap();
        self.hoist_requests()
            .into_iter()
            .filter(|request| request.code == 403 && excused.insert(request.audit_id.clone()))
            .map(|request| request.to_string())
            .collect()
    }

    /// The latest lines of a component's log (for failure messages).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join("logs").join(format!("{component}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops one component and starts it again as `up` did, waiting until
    /// it answers (`scripts/controlplane.sh restart`).
    pub fn restart(&self, component: &str) {
        let status = Command::new(root().join("scripts/controlplane.sh"))
            .args(["restart", component])
            .env("CONTROLPLANE_DIR", &self.dir)
            .stdin(Stdio::null())
            .status()
            .expect("scripts/controlplane.sh runs");
        assert!(status.success(), "restarting {component}");
    }

    /// Compacts etcd's history up to its current revision (through etcd's
    /// JSON gateway): a watch resuming from any older resourceVersion then
    /// gets `410 Gone` and must list again.
    pub fn compact_etcd(&self) -> i64 {
        let ports = std::fs::read_to_string(self.dir.join("ports.env")).unwrap();
        let etcd = ports
            .lines()
            .find_map(|line| line.strip_prefix("ETCD="))
            .expect("etcd's address in ports.env")
            .to_string();
        let post = |path: &str, body: &str| -> Value {
            let output = Command::new("curl")
                .args(["-sf", "-X", "POST", &format!("{etcd}{path}"), "-d", body])
                .output()
                .unwrap();
            assert!(output.status.success(), "etcd {path}");
            serde_json::from_slice(&output.stdout).unwrap()
        };
        // Any key: the answer's header carries the store's revision.
        let revision: i64 = post("/v3/kv/range", r#"{"key":"AA=="}"#)["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("etcd's revision");
        post(
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        );
        revision
    }

    /// hoist with `settings` as the chart's ServiceAccount (unless they
    /// name a kubeconfig of their own, e.g. another token of it), its gRPC
    /// on `grpc` (a port KEDA is told), its admin port on a free one.
    pub async fn start_hoist(
        &self,
        mut settings: hoist::config::Settings,
        grpc: u16,
    ) -> crate::support::Hoist {
        settings.grpc.listen = format!("127.0.0.1:{grpc}").parse().unwrap();
        settings
            .kubernetes
            .kubeconfig
            .get_or_insert_with(|| self.hoist_kubeconfig.clone());
        crate::support::Hoist::start_with(settings).await
    }

    /// A namespace of the test's own (each test its own: they run at once).
    pub fn namespace(&self, name: &str) -> String {
        self.must(&["create", "namespace", name]);
        name.to_string()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditedRequest {
    pub audit_id: String,
    /// The ID of the token the request was made with.
    pub credential: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub code: i64,
}

impl std::fmt::Display for AuditedRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)
    }
}

pub async fn client_from(kubeconfig: &Path) -> kube::Client {
    // As hoist does: rustls needs its provider chosen before a first client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The replicas a Deployment asks for (`spec.replicas`, what KEDA and the
/// HPA write).
pub async fn replicas(
    deployments: &kube::Api<k8s_openapi::api::apps::v1::Deployment>,
    name: &str,
) -> Option<i32> {
    deployments
        .get(name)
        .await
        .ok()
        .and_then(|deployment| deployment.spec?.replicas)
}

/// Records every value `read` returns, in order, until `done` holds for
/// the record or `limit` passes (then fails with the record so far).
pub async fn trajectory<F, Fut>(
    limit: Duration,
    what: &str,
    mut read: F,
    done: impl Fn(&[i32]) -> bool,
) -> Vec<i32>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<i32>>,
{
    let deadline = Instant::now() + limit;
    let mut seen: Vec<i32> = Vec::new();
    loop {
        if let Some(value) = read().await
            && seen.last() != Some(&value)
        {
            seen.push(value);
        }
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: replicas went {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// True when `wanted` appears in `seen` in order (other values between).
pub fn visits(seen: &[i32], wanted: &[i32]) -> bool {
    let mut wanted = wanted.iter().peekable();
    for value in seen {
        if wanted.peek() == Some(&value) {
            wanted.next();
        }
    }
    wanted.peek().is_none()
}
