//! Reading Kubernetes manifests (files in `deploy/`, or what `helm
//! template` prints) and the checks every set of them must pass: each
//! Service and PodDisruptionBudget selects the pods of exactly one
//! Deployment, every Service port lands on a container port of the same
//! number, probes use ports the container has and endpoints hoist serves,
//! pods run as non-root on a read-only root file system, and the config
//! file a container is started with is a key of the ConfigMap it mounts.
//! Lifecycle: a pod's grace period outlasts its process's shutdown_grace,
//! which outlasts the longest cold start a held request may wait for; a
//! state claim comes with the Recreate strategy; a budget leaves at least
//! one pod standing. RBAC: a pod mounts its token exactly when a binding
//! gives its ServiceAccount a role that the manifests define.
//! NetworkPolicies: each selects the pods of exactly one Deployment and
//! names only ports those pods have; a peer in its own namespace selects
//! exactly one Deployment; the gRPC port is never open to every pod
//! unless the policy says so, and every `from` lists somebody. Admin
//! auth: a config that checks tokens is in a pod whose ServiceAccount may
//! create TokenReviews, and presents a token file from a projected
//! ServiceAccount token for one of its audiences.

#![allow(dead_code)] // tests/deploy.rs and tests/helm.rs use different parts

pub mod crds;
pub mod snippets;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hoist::config::{ConfigError, Overrides, Settings};
use yaml_rust2::{Yaml, YamlLoader};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every non-empty document of a multi-document YAML text.
pub fn parse(source: &str, text: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("{source}: {e}"))
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The documents of every `.yaml` file in `dir` (relative to the crate).
pub fn documents(dir: &str) -> Vec<Yaml> {
    let mut files: Vec<_> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            parse(&path.display().to_string(), &text)
        })
        .collect()
}

pub fn kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

pub fn name(doc: &Yaml) -> &str {
    doc["metadata"]["name"].as_str().unwrap()
}

pub fn try_named<'a>(docs: &'a [Yaml], kind_: &str, name_: &str) -> Option<&'a Yaml> {
    kind(docs, kind_).into_iter().find(|d| name(d) == name_)
}

pub fn named<'a>(docs: &'a [Yaml], kind_: &str, name_: &str) -> &'a Yaml {
    try_named(docs, kind_, name_).unwrap_or_else(|| {
        panic!(
            "no {kind_} `{name_}` among {:?}",
            kind(docs, kind_).into_iter().map(name).collect::<Vec<_>>()
        )
    })
}

/// (kind, namespace, name) of every object.
pub fn objects(docs: &[Yaml]) -> BTreeSet<(String, String, String)> {
    docs.iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_string(),
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name(d).to_string(),
            )
        })
        .collect()
}

pub fn labels(yaml: &Yaml) -> BTreeMap<String, String> {
    yaml.as_hash()
        .map(|h| {
            h.iter()
                .map(|(k, v)| {
                    (
                        k.as_str().unwrap().to_string(),
                        v.as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub fn list(yaml: &Yaml) -> &[Yaml] {
    yaml.as_vec().map(Vec::as_slice).unwrap_or_default()
}

pub fn strings(yaml: &Yaml) -> Vec<&str> {
    list(yaml).iter().map(|s| s.as_str().unwrap()).collect()
}

/// A YAML value as JSON, for comparisons that ignore key order.
pub fn json(yaml: &Yaml) -> serde_json::Value {
    match yaml {
        Yaml::Real(_) => serde_json::json!(yaml.as_f64().unwrap()),
        Yaml::Integer(i) => serde_json::json!(i),
        Yaml::String(s) => serde_json::json!(s),
        Yaml::Boolean(b) => serde_json::json!(b),
        Yaml::Array(items) => items.iter().map(json).collect(),
        Yaml::Hash(hash) => hash
            .iter()
            .map(|(k, v)| (k.as_str().unwrap().to_string(), json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => serde_json::Value::Null,
    }
}

pub fn pod_labels(deployment: &Yaml) -> BTreeMap<String, String> {
    labels(&deployment["spec"]["template"]["metadata"]["labels"])
}

pub fn pod_spec(deployment: &Yaml) -> &Yaml {
    &deployment["spec"]["template"]["spec"]
}

pub fn container(deployment: &Yaml) -> &Yaml {
    let containers = list(&pod_spec(deployment)["containers"]);
    assert_eq!(containers.len(), 1, "{}: one container", name(deployment));
    &containers[0]
}

/// Container port name → number.
pub fn container_ports(container: &Yaml) -> BTreeMap<String, i64> {
    list(&container["ports"])
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// Service port name → (port, targetPort name).
pub fn service_ports(service: &Yaml) -> BTreeMap<String, (i64, String)> {
    list(&service["spec"]["ports"])
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                (
                    p["port"].as_i64().unwrap(),
                    p["targetPort"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

pub fn headless(service: &Yaml) -> bool {
    service["spec"]["clusterIP"].as_str() == Some("None")
}

/// The port of a `host:port` address.
pub fn port_of(address: &str) -> i64 {
    address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("`{address}` is not host:port"))
}

pub fn volume<'a>(deployment: &'a Yaml, volume: &str) -> &'a Yaml {
    list(&pod_spec(deployment)["volumes"])
        .iter()
        .find(|v| v["name"].as_str() == Some(volume))
        .unwrap_or_else(|| panic!("{}: no volume `{volume}`", name(deployment)))
}

pub fn mount_path<'a>(deployment: &'a Yaml, volume: &str) -> &'a str {
    list(&container(deployment)["volumeMounts"])
        .iter()
        .find(|m| m["name"].as_str() == Some(volume))
        .unwrap_or_else(|| panic!("{}: no mount of `{volume}`", name(deployment)))["mountPath"]
        .as_str()
        .unwrap()
}

/// The volume mounted where `file` is, and the file's path inside it.
pub fn volume_holding<'a>(deployment: &'a Yaml, file: &str) -> (&'a Yaml, String) {
    let mount = list(&container(deployment)["volumeMounts"])
        .iter()
        .filter(|m| {
            let dir = m["mountPath"].as_str().unwrap().trim_end_matches('/');
            file.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
        })
        .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
        .unwrap_or_else(|| panic!("{}: nothing mounted at {file}", name(deployment)));
    let dir = mount["mountPath"].as_str().unwrap().trim_end_matches('/');
    (
        volume(deployment, mount["name"].as_str().unwrap()),
        file[dir.len() + 1..].to_string(),
    )
}

/// The config file a container is started with (`--config FILE`), as the
/// text of the ConfigMap key mounted there.
pub fn config_text<'a>(docs: &'a [Yaml], deployment: &Yaml) -> &'a str {
    let args = strings(&container(deployment)["args"]);
    let at = args
        .iter()
        .position(|a| *a == "--config")
        .unwrap_or_else(|| panic!("{}: no --config in {args:?}", name(deployment)));
    let file = args[at + 1];
    let (volume, key) = volume_holding(deployment, file);
    let config_map = named(
        docs,
        "ConfigMap",
        volume["configMap"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{file} is not on a ConfigMap volume")),
    );
    config_map["data"][key.as_str()]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {} has no key {key}", name(config_map)))
}

/// `helm template` of the chart as release `hoist` in namespace `keda`,
/// with these values files (`HELM_BIN`, or `helm` on the PATH).
pub fn helm_template(values: &[&str]) -> Vec<Yaml> {
    let helm = std::env::var("HELM_BIN").unwrap_or_else(|_| "helm".into());
    let mut args = vec![
        "template",
        "hoist",
        "deploy/helm/hoist",
        "--namespace",
        "keda",
    ];
    for file in values {
        args.extend(["--values", file]);
    }
    let output = std::process::Command::new(&helm)
        .args(&args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{helm}` ({e}): scripts/helm.sh installs it"));
    assert!(
        output.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse("helm template", &String::from_utf8(output.stdout).unwrap())
}

/// hoist's own loader on a config text (no environment, no flags).
pub fn load(text: &str) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(&file, text).unwrap();
    Settings::load(Some(&file), Vec::new(), &Overrides::default())
}

pub fn load_ok(source: &str, text: &str) -> Settings {
    load(text).unwrap_or_else(|e| {
        let cause = std::error::Error::source(&e)
            .map(ToString::to_string)
            .unwrap_or_default();
        panic!("{source}: {e}: {cause}\n{text}")
    })
}

/// A config text parsed as plain TOML (no hoist rules).
pub fn toml_table(source: &str, text: &str) -> toml::Table {
    text.parse()
        .unwrap_or_else(|e| panic!("{source} is not TOML: {e}\n{text}"))
}

/// The text without its top-level `[interceptor]` section, and that
/// section: hoist's loader checks the rest.
pub fn split_interceptor(source: &str, text: &str) -> (String, Option<toml::Table>) {
    let mut table = toml_table(source, text);
    let section = table
        .remove("interceptor")
        .map(|v| v.as_table().unwrap().clone());
    (toml::to_string(&table).unwrap(), section)
}

/// Cluster-scoped kinds, which carry no namespace.
pub fn cluster_scoped(doc: &Yaml) -> bool {
    matches!(
        doc["kind"].as_str(),
        Some("ClusterRole" | "ClusterRoleBinding" | "ClusterTriggerAuthentication")
    )
}

/// The ServiceAccounts (namespace, name) that a ClusterRoleBinding of
/// `docs` binds to a ClusterRole of `docs`.
pub fn bound_service_accounts(source: &str, docs: &[Yaml]) -> BTreeSet<(String, String)> {
    let mut bound = BTreeSet::new();
    for binding in kind(docs, "ClusterRoleBinding") {
        let role = &binding["roleRef"];
        assert_eq!(role["kind"].as_str(), Some("ClusterRole"), "{source}");
        let role = named(docs, "ClusterRole", role["name"].as_str().unwrap());
        assert!(!list(&role["rules"]).is_empty(), "{source}: an empty role");
        for subject in list(&binding["subjects"]) {
            assert_eq!(subject["kind"].as_str(), Some("ServiceAccount"), "{source}");
            let (namespace, account) = (
                subject["namespace"].as_str().unwrap().to_string(),
                subject["name"].as_str().unwrap().to_string(),
            );
            let defined = named(docs, "ServiceAccount", &account);
            assert_eq!(
                defined["metadata"]["namespace"].as_str(),
                Some(namespace.as_str()),
                "{source}: the binding's ServiceAccount"
            );
            bound.insert((namespace, account));
        }
    }
    bound
}

/// The settings a Deployment's config loads to (a `hoist interceptor`
/// config too: its [interceptor] section is checked like hoist's).
pub fn deployment_settings(docs: &[Yaml], deployment: &Yaml) -> Settings {
    load_ok(
        &format!("Deployment {}", name(deployment)),
        config_text(docs, deployment),
    )
}

/// The checks every set of manifests must pass (see the module doc).
pub fn check_consistency(source: &str, docs: &[Yaml]) {
    let bound = bound_service_accounts(source, docs);
    let all = objects(docs);
    assert_eq!(
        all.len(),
        docs.len(),
        "{source}: an object is defined twice"
    );
    let deployments = kind(docs, "Deployment");
    assert!(!deployments.is_empty(), "{source}: no Deployment");

    let selected = |what: &str, selector: &BTreeMap<String, String>| -> &Yaml {
        let matching: Vec<&Yaml> = deployments
            .iter()
            .copied()
            .filter(|d| selects(selector, &pod_labels(d)))
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{source}: {what} selects the pods of {:?}",
            matching.iter().map(|d| name(d)).collect::<Vec<_>>()
        );
        matching[0]
    };

    for deployment in &deployments {
        let what = format!("{source}: Deployment {}", name(deployment));
        assert!(
            selects(
                &labels(&deployment["spec"]["selector"]["matchLabels"]),
                &pod_labels(deployment)
            ),
            "{what}: selector"
        );
        let pod = pod_spec(deployment);
        let container = container(deployment);
        let ports = container_ports(container);
        for port in ports.keys() {
            assert!(port.len() <= 15, "{what}: port name {port} too long");
        }
        let numbers: BTreeSet<i64> = ports.values().copied().collect();
        assert_eq!(numbers.len(), ports.len(), "{what}: a port twice");

        for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
            let probe_ = &container[probe];
            assert!(!probe_.is_badvalue(), "{what}: no {probe}");
            if let Some(port) = probe_["httpGet"]["port"].as_str() {
                assert!(ports.contains_key(port), "{what}: {probe} port {port}");
                assert!(
                    ["/healthz", "/readyz"].contains(&probe_["httpGet"]["path"].as_str().unwrap()),
                    "{what}: {probe} path"
                );
            } else if let Some(port) = probe_["grpc"]["port"].as_i64() {
                assert_eq!(Some(port), ports.get("grpc").copied(), "{what}: {probe}");
                assert_eq!(
                    probe_["grpc"]["service"].as_str(),
                    Some("externalscaler.ExternalScaler"),
                    "{what}: {probe}"
                );
            } else {
                let port = probe_["tcpSocket"]["port"].as_str();
                assert!(
                    port.is_some_and(|p| ports.contains_key(p)),
                    "{what}: {probe} checks nothing hoist has"
                );
            }
        }

        assert_eq!(
            pod["securityContext"]["runAsNonRoot"].as_bool(),
            Some(true),
            "{what}"
        );
        let account = (
            deployment["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            pod["serviceAccountName"].as_str().unwrap().to_string(),
        );
        assert_eq!(
            pod["automountServiceAccountToken"].as_bool(),
            Some(bound.contains(&account)),
            "{what}: a token exactly when its ServiceAccount has a role"
        );

        // Shutdown: kubelet waits longer than hoist's own grace, which
        // covers the longest cold start a held request waits for.
        let settings = deployment_settings(docs, deployment);
        let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
        // The drain delay comes first: kubelet waits for both.
        let needed = settings.grace() + settings.shutdown.drain_delay;
        assert!(
            grace > needed.as_secs() as i64,
            "{what}: terminationGracePeriodSeconds {grace} <= drain_delay + shutdown grace {needed:?}"
        );
        let interceptor = &settings.interceptor;
        let runs_proxies =
            strings(&container["args"])[0] == "interceptor" || interceptor.in_process();
        if runs_proxies {
            let longest = interceptor
                .http_routes
                .iter()
                .filter_map(|r| r.cold_start_timeout)
                .chain(
                    interceptor
                        .tcp_routes
                        .iter()
                        .filter_map(|r| r.cold_start_timeout),
                )
                .fold(interceptor.cold_start_timeout, std::cmp::max);
            assert!(
                settings.grace() > longest,
                "{what}: shutdown grace {:?} cuts requests held up to {longest:?}",
                settings.grace()
            );
        }
        // A claim is ReadWriteOnce: the old pod must let go first.
        let claims = list(&pod["volumes"])
            .iter()
            .any(|v| !v["persistentVolumeClaim"].is_badvalue());
        if claims {
            assert_eq!(
                deployment["spec"]["strategy"]["type"].as_str(),
                Some("Recreate"),
                "{what}: a claim needs strategy Recreate"
            );
        }
        let security = &container["securityContext"];
        assert_eq!(
            security["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{what}"
        );
        assert_eq!(
            security["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{what}"
        );
        assert_eq!(
            strings(&security["capabilities"]["drop"]),
            ["ALL"],
            "{what}"
        );
        assert!(
            !container["resources"]["requests"].is_badvalue()
                && !container["resources"]["limits"]["memory"].is_badvalue(),
            "{what}: resources"
        );

        for mount in list(&container["volumeMounts"]) {
            volume(deployment, mount["name"].as_str().unwrap());
        }
        config_text(docs, deployment);
        named(
            docs,
            "ServiceAccount",
            pod["serviceAccountName"].as_str().unwrap(),
        );
    }

    for deployment in &deployments {
        check_admin_auth(source, docs, deployment);
    }
    for policy in kind(docs, "NetworkPolicy") {
        let what = format!("NetworkPolicy {}", name(policy));
        let spec = &policy["spec"];
        assert_eq!(
            strings(&spec["policyTypes"]),
            ["Ingress"],
            "{source}: {what}"
        );
        let target = selected(&what, &labels(&spec["podSelector"]["matchLabels"]));
        let ports = container_ports(container(target));
        let rules = list(&spec["ingress"]);
        assert!(!rules.is_empty(), "{source}: {what}: no rule");
        for rule in rules {
            for port in list(&rule["ports"]) {
                let port = port["port"].as_str().expect("ports by name");
                assert!(
                    ports.contains_key(port),
                    "{source}: {what}: port {port} is not a port of {}",
                    name(target)
                );
            }
            if let Some(from) = rule["from"].as_vec() {
                assert!(
                    !from.is_empty(),
                    "{source}: {what}: an empty `from` lets everyone in"
                );
                for peer in from {
                    let pods = labels(&peer["podSelector"]["matchLabels"]);
                    if peer["namespaceSelector"].is_badvalue() {
                        selected(&format!("{what}: a peer"), &pods);
                    } else {
                        assert!(
                            !labels(&peer["namespaceSelector"]["matchLabels"]).is_empty(),
                            "{source}: {what}: a peer in every namespace"
                        );
                    }
                }
            }
        }
    }

    for service in kind(docs, "Service") {
        let what = format!("Service {}", name(service));
        let target = selected(&what, &labels(&service["spec"]["selector"]));
        let ports = container_ports(container(target));
        let service_ports = service_ports(service);
        assert!(!service_ports.is_empty(), "{source}: {what}: no ports");
        for (port_name, (port, target_port)) in &service_ports {
            assert_eq!(
                ports.get(target_port),
                Some(port),
                "{source}: {what}: port {port_name} goes to container port {target_port} \
                 of {} with the same number",
                name(target)
            );
        }
    }
    for budget in kind(docs, "PodDisruptionBudget") {
        let what = format!("PodDisruptionBudget {}", name(budget));
        let target = selected(&what, &labels(&budget["spec"]["selector"]["matchLabels"]));
        let replicas = target["spec"]["replicas"].as_i64().unwrap_or(1);
        let unavailable = budget["spec"]["maxUnavailable"].as_i64().unwrap();
        assert!(
            replicas > unavailable,
            "{source}: {what} lets all {replicas} pods go: it protects nothing"
        );
    }
}

/// A deployment whose admin port checks tokens (`admin.auth.allowed_callers`)
/// may create TokenReviews, and one whose config names a token file
/// presents a projected ServiceAccount token for one of the audiences
/// the admin ports check.
fn check_admin_auth(source: &str, docs: &[Yaml], deployment: &Yaml) {
    let what = format!("{source}: Deployment {}", name(deployment));
    let settings = deployment_settings(docs, deployment);
    let auth = &settings.admin.auth;
    if auth.allowed_callers.is_empty() {
        return;
    }
    let pod = pod_spec(deployment);
    assert_eq!(
        pod["automountServiceAccountToken"].as_bool(),
        Some(true),
        "{what}: TokenReview needs the pod's own token"
    );
    let account = pod["serviceAccountName"].as_str().unwrap();
    let may_review = kind(docs, "ClusterRoleBinding").iter().any(|binding| {
        let bound = list(&binding["subjects"])
            .iter()
            .any(|subject| subject["name"].as_str() == Some(account));
        let role = named(
            docs,
            "ClusterRole",
            binding["roleRef"]["name"].as_str().unwrap(),
        );
        bound
            && list(&role["rules"]).iter().any(|rule| {
                strings(&rule["apiGroups"]) == ["authentication.k8s.io"]
                    && strings(&rule["resources"]).contains(&"tokenreviews")
                    && strings(&rule["verbs"]).contains(&"create")
            })
    });
    assert!(may_review, "{what}: {account} may not create TokenReviews");
    let (volume, path) = volume_holding(deployment, auth.token_file.to_str().unwrap());
    let token = list(&volume["projected"]["sources"])
        .iter()
        .map(|source| &source["serviceAccountToken"])
        .find(|token| token["path"].as_str() == Some(path.as_str()))
        .unwrap_or_else(|| panic!("{what}: admin.auth.token_file is no projected token"));
    let audience = token["audience"].as_str().unwrap().to_string();
    assert!(
        auth.audiences.contains(&audience),
        "{what}: its token is for {audience}, its admin port takes {:?}",
        auth.audiences
    );
    let user = format!(
        "system:serviceaccount:{}:{account}",
        deployment["metadata"]["namespace"].as_str().unwrap()
    );
    assert!(
        auth.allowed_callers.contains(&user),
        "{what}: its own {user} (`hoist status` in the pod) is not allowed"
    );
}
