//! The shipped manifests against schemas nobody here wrote, and the image
//! and monitoring files against real tools:
//! - every manifest, chart render and the KEDA sidecar kustomization's
//!   build (`kubectl kustomize` over KEDA's own install, offline)
//!   with `kubernetes-validate --strict` (PyPI) at the oldest and newest
//!   Kubernetes version it bundles;
//! - every ScaledObject / ScaledJob / (Cluster)TriggerAuthentication
//!   against KEDA's CRDs (tests/data/keda-crds), a field the structural
//!   schema does not declare counted as an error (the API server drops it);
//! - the PrometheusRule with `promtool check rules` (Debian's
//!   `prometheus`) and `promtool test rules` (tests/data/
//!   prometheusrule.test.yaml: every alert fires and stays silent), and
//!   every metric the rules and the Grafana dashboard use present on a
//!   live hoist's /metrics, the variables' on every mode's;
//! - scripts/image.sh's OCI image with `buildah` (Debian): its config, and
//!   `hoist --version` and `hoist check-config` chrooted into its root.
//!
//! scripts/test.sh installs kubernetes-validate, kubectl, buildah and promtool;
//! without them these tests fail, they never skip.

#[path = "support/kube_api.rs"]
mod kube_api;
mod manifests;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hoist::config::Overrides;
use hoist::reload::ConfigSource;
use manifests::*;
use serde_json::Value;
use yaml_rust2::Yaml;

const OLDEST: &str = "1.25.0";
const NEWEST: &str = "1.37.0";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `{program}` ({e}): scripts/test.sh installs it (see its header)")
        })
}

fn succeeded(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn is_custom(doc: &Yaml) -> bool {
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    api.starts_with("keda.sh/") || api.starts_with("monitoring.coreos.com/")
}

/// KEDA's own install (tests/data/keda-install: its `config/default`
/// rendered) with hoist's sidecar kustomization on top, built by a real
/// `kubectl kustomize`, offline: the kustomization's pinned release URL is
/// replaced by a local base holding that manifest. Every object it
/// outputs, as JSON; built once per test binary.
fn sidecar_build() -> &'static [Value] {
    static BUILT: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let keda = dir.path().join("keda");
        let sidecar = dir.path().join("sidecar");
        std::fs::create_dir_all(&keda).unwrap();
        std::fs::create_dir_all(&sidecar).unwrap();
        std::fs::copy(
            root().join("tests/data/keda-install/keda-operator-install.yaml"),
            keda.join("keda.yaml"),
        )
        .unwrap();
        std::fs::write(keda.join("kustomization.yaml"), "resources:\n  - keda.yaml\n").unwrap();
        for entry in std::fs::read_dir(root().join("deploy/keda-sidecar")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), sidecar.join(entry.file_name())).unwrap();
        }
        let kustomization = sidecar.join("kustomization.yaml");
        let text = std::fs::read_to_string(&kustomization).unwrap();
        let remote = regex::Regex::new(r"(?m)^  - https://github\.com/kedacore/keda/releases/download/v[0-9.]+/keda-[0-9.]+\.yaml$").unwrap();
        assert_eq!(remote.find_iter(&text).count(), 1, "one pinned KEDA release: {text}");
        std::fs::write(&kustomization, remote.replace(&text, "  - ../keda").as_ref()).unwrap();
        let kubectl = std::env::var("KUBECTL_BIN").unwrap_or_else(|_| "kubectl".into());
        let output = run(&kubectl, &["kustomize", sidecar.to_str().unwrap()]);
        succeeded("kubectl kustomize deploy/keda-sidecar (scripts/layer-tool.sh kubectl installs kubectl)", &output);
        parse("kubectl kustomize", &String::from_utf8(output.stdout).unwrap())
            .iter()
            .map(json)
            .collect()
    })
}

/// KEDA's keda-operator Deployment with hoist's sidecar patch applied.
fn sidecar_result() -> Value {
    sidecar_build()
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "keda-operator")
        .expect("the build holds keda-operator")
        .clone()
}

/// A container of a Deployment, by name.
fn container_named<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container `{name}`"))
}

fn documents_of(file: &str) -> Vec<Yaml> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    parse(file, &text)
}

/// Every object hoist ships, by where it comes from, as JSON.
fn everything() -> Vec<(String, Value)> {
    let mut all = Vec::new();
    for dir in ["deploy/kubernetes", "deploy/examples", "deploy/monitoring"] {
        for doc in documents(dir) {
            all.push((format!("{dir}: {}", name(&doc)), json(&doc)));
        }
    }
    for file in [
        "deploy/keda-sidecar/hoist-config.yaml",
        "deploy/keda-sidecar/rbac.yaml",
    ] {
        for doc in documents_of(file) {
            all.push((format!("{file}: {}", name(&doc)), json(&doc)));
        }
    }
    let mut renders = vec![("chart defaults".to_string(), helm_template(&[]))];
    for entry in std::fs::read_dir(root().join("deploy/helm/hoist/ci")).unwrap() {
        let file = format!(
            "deploy/helm/hoist/ci/{}",
            entry.unwrap().file_name().to_string_lossy()
        );
        renders.push((file.clone(), helm_template(&[&file])));
    }
    for (source, docs) in renders {
        for doc in docs {
            all.push((format!("{source}: {}", name(&doc)), json(&doc)));
        }
    }
    // KEDA's whole install with the sidecar kustomization, as built.
    for object in sidecar_build() {
        let source = format!(
            "kubectl kustomize deploy/keda-sidecar: {} {}",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        all.push((source, object.clone()));
    }
    // The KEDA chart values' container and volumes are the patch's.
    let values = json(&documents_of("deploy/keda-sidecar/keda-values.yaml")[0]);
    let patched = sidecar_result();
    let pod = &patched["spec"]["template"]["spec"];
    let sidecar: Vec<&Value> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "hoist")
        .collect();
    // One network namespace: no port of KEDA's container is hoist's, and
    // hoist's listeners (gRPC on loopback, admin) are where the pod says;
    // its state file is on the writable volume.
    let mut numbers = BTreeSet::new();
    for container in pod["containers"].as_array().unwrap() {
        for port in container["ports"].as_array().into_iter().flatten() {
            assert!(
                numbers.insert(port["containerPort"].as_i64().unwrap()),
                "sidecar: port {port} twice in KEDA's pod"
            );
        }
    }
    let sidecar_config = documents_of("deploy/keda-sidecar/hoist-config.yaml");
    let settings = load_ok(
        "keda-sidecar/hoist-config.yaml",
        sidecar_config[0]["data"]["hoist.toml"].as_str().unwrap(),
    );
    assert!(
        settings.grpc.listen.ip().is_loopback(),
        "gRPC for KEDA only"
    );
    let admin = sidecar[0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "hoist-admin")
        .unwrap();
    assert_eq!(
        admin["containerPort"].as_i64(),
        Some(i64::from(settings.admin.listen.port()))
    );
    assert!(
        pod["terminationGracePeriodSeconds"].as_i64().unwrap()
            > settings.shutdown_grace.as_secs() as i64
    );
    let mounts: BTreeMap<&str, &str> = sidecar[0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["mountPath"].as_str().unwrap(),
                m["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(mounts["/var/lib/hoist"], "hoist-state");
    assert!(
        settings
            .state_file
            .as_ref()
            .is_some_and(|f| f.starts_with("/var/lib/hoist"))
    );
    assert_eq!(
        values["operator"]["extraContainers"],
        Value::Array(vec![sidecar[0].clone()]),
        "keda-values.yaml's container is the patch's"
    );
    let patch_volumes =
        json(&documents_of("deploy/keda-sidecar/keda-operator-patch.yaml")[0])["spec"]["template"]
            ["spec"]["volumes"]
            .clone();
    assert_eq!(values["volumes"]["keda"]["extraVolumes"], patch_volumes);
    for object in values["extraObjects"].as_array().unwrap() {
        all.push((
            format!("keda-values.yaml extraObjects: {}", object["kind"]),
            object.clone(),
        ));
    }
    all
}

#[test]
fn every_manifest_passes_kubernetes_validate_strict_at_the_oldest_and_newest_version() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut sources = BTreeMap::new();
    for (i, (source, object)) in everything().into_iter().enumerate() {
        if is_custom(&yaml_of(&object)) {
            continue;
        }
        let file = dir.path().join(format!("{i:03}.json"));
        std::fs::write(&file, serde_json::to_string_pretty(&object).unwrap()).unwrap();
        sources.insert(file.display().to_string(), source);
        files.push(file.display().to_string());
    }
    assert!(files.len() >= 30, "{} objects", files.len());
    for version in [OLDEST, NEWEST] {
        let mut args = vec!["--strict", "--quiet", "-k", version];
        args.extend(files.iter().map(String::as_str));
        let output = run("kubernetes-validate", &args);
        let mut report = String::from_utf8_lossy(&output.stdout).to_string();
        report += &String::from_utf8_lossy(&output.stderr);
        for (file, source) in &sources {
            report = report.replace(file.as_str(), source);
        }
        assert!(
            output.status.success() && !report.contains("ERROR"),
            "kubernetes {version}:\n{report}"
        );
    }
    // A field no schema declares is refused: the check can fail.
    let bad = dir.path().join("bad.json");
    let mut deployment = sidecar_result();
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap();
    let hoist = containers
        .iter_mut()
        .find(|c| c["name"] == "hoist")
        .unwrap();
    hoist["probes"] = Value::Bool(true);
    std::fs::write(&bad, deployment.to_string()).unwrap();
    let output = run(
        "kubernetes-validate",
        &["--strict", "--quiet", "-k", NEWEST, bad.to_str().unwrap()],
    );
    assert!(!output.status.success(), "an unknown field fails");
}

#[test]
fn the_sidecar_kustomization_builds_on_kedas_own_install() {
    let build = sidecar_build();
    let base = parse(
        "keda-operator-install.yaml",
        &std::fs::read_to_string(root().join("tests/data/keda-install/keda-operator-install.yaml"))
            .unwrap(),
    );
    let base_operator = base
        .iter()
        .map(json)
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "keda-operator")
        .unwrap();
    // Everything KEDA installs is still there, plus hoist's ConfigMap and
    // RBAC rule.
    let names = |objects: &mut dyn Iterator<Item = &Value>| -> BTreeSet<String> {
        objects
            .map(|o| {
                format!(
                    "{} {}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let built = names(&mut build.iter());
    let kedas = base.iter().map(json).collect::<Vec<_>>();
    let missing: Vec<_> = names(&mut kedas.iter())
        .difference(&built)
        .cloned()
        .collect();
    assert!(missing.is_empty(), "KEDA's objects lost: {missing:?}");
    assert_eq!(built.len(), kedas.len() + 3, "{built:?}");

    let operator = sidecar_result();
    let template = &operator["spec"]["template"];
    // `kubectl logs deploy/keda-operator` shows KEDA's logs, whatever the
    // merge's container order.
    assert_eq!(
        template["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
        "keda-operator"
    );
    // KEDA's container is untouched; hoist's is the patch's, with the
    // image the kustomization names.
    assert_eq!(
        container_named(&operator, "keda-operator"),
        container_named(&base_operator, "keda-operator")
    );
    let patch = json(&documents_of("deploy/keda-sidecar/keda-operator-patch.yaml")[0]);
    let hoist = container_named(&operator, "hoist");
    assert_eq!(hoist, container_named(&patch, "hoist"));
    let names_of = |list: &Value| -> BTreeSet<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    };
    let volumes = names_of(&template["spec"]["volumes"]);
    assert!(names_of(&base_operator["spec"]["template"]["spec"]["volumes"]).is_subset(&volumes));
    assert!(names_of(&patch["spec"]["template"]["spec"]["volumes"]).is_subset(&volumes));
    for mount in hoist["volumeMounts"].as_array().unwrap() {
        assert!(volumes.contains(mount["name"].as_str().unwrap()), "{mount}");
    }
    assert_eq!(
        operator["spec"]["template"]["spec"]["serviceAccountName"], "keda-operator",
        "hoist runs as KEDA's ServiceAccount (rbac.yaml adds one rule)"
    );
}

fn yaml_of(value: &Value) -> Yaml {
    yaml_rust2::YamlLoader::load_from_str(&value.to_string())
        .unwrap()
        .remove(0)
}

#[test]
fn every_keda_object_is_valid_against_kedas_crds_with_no_undeclared_field() {
    let keda = crds::Keda::load();
    let mut seen = BTreeSet::new();
    for (source, object) in everything() {
        let Some(kind_) = object["kind"].as_str() else {
            continue;
        };
        if !keda.serves(kind_) {
            assert!(
                !object["apiVersion"]
                    .as_str()
                    .unwrap()
                    .starts_with("keda.sh"),
                "{source}: a KEDA kind with no CRD here"
            );
            continue;
        }
        let errors = keda.errors(&object);
        assert!(errors.is_empty(), "{source}: {errors:#?}");
        seen.insert(kind_.to_string());
    }
    assert_eq!(seen, crds::kinds_shown());
    // The check finds what the API server would drop or refuse.
    let mut object = json(&kind(&documents("deploy/examples"), "ScaledObject")[0].clone());
    object["spec"]["triggers"][0]["authRef"] = Value::String("x".into());
    object["spec"]["minReplicaCount"] = Value::String("0".into());
    let errors = keda.errors(&object);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("triggers[0].authRef: not in the schema"))
            && errors.iter().any(|e| e.contains("minReplicaCount"))
            && errors.iter().any(|e| e.starts_with("(KEDA 2.16)")),
        "{errors:#?}"
    );
}

/// `path` with every `/var/run/secrets/hoist/...` file a profile reads
/// created under `dir` (what kubelet mounts from the Secret), and the
/// state file there too.
fn with_local_files(config: &str, dir: &Path) -> String {
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let re = regex::Regex::new(r#""/var/run/secrets/hoist/([^"]+)""#).unwrap();
    for capture in re.captures_iter(config) {
        std::fs::write(secrets.join(&capture[1]), "secret").unwrap();
    }
    re.replace_all(config, format!("\"{}/$1\"", secrets.display()).as_str())
        .replace(
            "/var/lib/hoist/state.json",
            &dir.join("state.json").display().to_string(),
        )
}

/// The configs ScaledObjects meet: hoist.yaml's, the chart's defaults
/// and the KEDA sidecar's.
fn shipped_configs() -> Vec<(String, String)> {
    let docs = documents("deploy/kubernetes");
    let chart = helm_template(&[]);
    let sidecar = documents_of("deploy/keda-sidecar/hoist-config.yaml");
    vec![
        (
            "hoist.yaml".into(),
            config_text(&docs, named(&docs, "Deployment", "hoist")).to_string(),
        ),
        (
            "chart defaults".into(),
            config_text(&chart, named(&chart, "Deployment", "hoist")).to_string(),
        ),
        (
            "keda-sidecar".into(),
            sidecar[0]["data"]["hoist.toml"]
                .as_str()
                .unwrap()
                .to_string(),
        ),
    ]
}

/// What KEDA resolves `connectionFromEnv` to, and a Secret's
/// `connection` credential.
const SERVICE_BUS_CONNECTION: &str =
    "Endpoint=sb://billing.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v";

/// A ScaledObject hoist must accept: where it is shown, and the name the
/// fake cluster holds it under (pages reuse names such as `worker`).
struct Shown {
    source: String,
    namespace: String,
    name: String,
    object: Yaml,
}

/// deploy/examples' ScaledObjects and every one the docs show.
fn scaled_objects_shown() -> Vec<Shown> {
    let examples = documents("deploy/examples");
    let mut objects: Vec<(String, Yaml)> = kind(&examples, "ScaledObject")
        .into_iter()
        .map(|object| (format!("deploy/examples: {}", name(object)), object.clone()))
        .collect();
    objects.extend(
        snippets::keda_objects()
            .into_iter()
            .filter(|(_, object)| object["kind"].as_str() == Some("ScaledObject")),
    );
    let mut taken = BTreeSet::new();
    objects
        .into_iter()
        .map(|(source, object)| {
            // kubectl's namespace when it names none.
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            let name = (1..)
                .map(|n| match n {
                    1 => name(&object).to_string(),
                    n => format!("{}-{n}", name(&object)),
                })
                .find(|candidate| taken.insert((namespace.clone(), candidate.clone())))
                .unwrap();
            Shown {
                source,
                namespace,
                name,
                object,
            }
        })
        .collect()
}

/// KEDA's own params for its TLS connection to hoist, which hoist never
/// gives a trigger.
const KEDA_TLS_PARAMS: [&str; 3] = ["caCert", "tlsClientCert", "tlsClientKey"];

/// Every (Cluster)TriggerAuthentication of deploy/examples and the docs
/// into the fake cluster, with the Secrets they read (placeholder values
/// of the right shape); the (kind, namespace, name) of those that give a
/// trigger credentials, which hoist reads only with
/// `kubernetes.trigger_authentication`.
fn put_trigger_authentications(api: &kube_api::FakeApi) -> BTreeSet<(String, String, String)> {
    let mut lending = BTreeSet::new();
    let examples = documents("deploy/examples");
    let shown = snippets::keda_objects()
        .into_iter()
        .map(|(_, object)| object);
    let mut secrets: BTreeMap<(String, String), Vec<(String, &str)>> = BTreeMap::new();
    for auth in examples.into_iter().chain(shown) {
        let (namespace, cluster) = match auth["kind"].as_str() {
            Some("TriggerAuthentication") => {
                (auth["metadata"]["namespace"].as_str().unwrap(), false)
            }
            Some("ClusterTriggerAuthentication") => ("keda", true),
            _ => continue,
        };
        let spec = json(&auth["spec"]);
        if cluster {
            api.put_cluster_trigger_authentication(name(&auth), spec);
        } else {
            api.put_trigger_authentication(namespace, name(&auth), spec);
        }
        for reference in list(&auth["spec"]["secretTargetRef"]) {
            let parameter = reference["parameter"].as_str().unwrap();
            if !KEDA_TLS_PARAMS.contains(&parameter) {
                let kind = auth["kind"].as_str().unwrap().to_string();
                let at = if cluster { "" } else { namespace };
                lending.insert((kind, at.to_string(), name(&auth).to_string()));
            }
            let value = match parameter {
                "connection" => SERVICE_BUS_CONNECTION,
                // An enumeration: TLS to the source, as the docs' examples
                // turn it on from a TriggerAuthentication.
                "tls" => "enable",
                _ => "secret",
            };
            secrets
                .entry((
                    namespace.to_string(),
                    reference["name"].as_str().unwrap().to_string(),
                ))
                .or_default()
                .push((reference["key"].as_str().unwrap().to_string(), value));
        }
    }
    for ((namespace, secret), data) in &secrets {
        let data: Vec<(&str, &str)> = data.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        api.put_secret(namespace, secret, &data);
    }
    lending
}

/// The (kind, namespace, name) of the TriggerAuthentication a trigger's
/// `authenticationRef` names, if any.
fn authentication_of(shown: &Shown, trigger: &Yaml) -> Option<(String, String, String)> {
    let reference = &trigger["authenticationRef"];
    let name = reference["name"].as_str()?.to_string();
    Some(match reference["kind"].as_str() {
        Some("ClusterTriggerAuthentication") => {
            ("ClusterTriggerAuthentication".into(), String::new(), name)
        }
        _ => (
            "TriggerAuthentication".into(),
            shown.namespace.clone(),
            name,
        ),
    })
}

/// One trigger as KEDA sends it: the metadata as written, `FromEnv`
/// values resolved.
fn reference_of(shown: &Shown, trigger: &Yaml) -> hoist::proto::ScaledObjectRef {
    let metadata: Vec<(String, String)> = trigger["metadata"]
        .as_hash()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let key = k.as_str().unwrap();
            let value = match key {
                // KEDA resolves it from the target's environment first.
                "connectionFromEnv" => SERVICE_BUS_CONNECTION,
                _ => v.as_str().unwrap(),
            };
            (key.to_string(), value.to_string())
        })
        .collect();
    hoist::proto::ScaledObjectRef {
        name: shown.name.clone(),
        namespace: shown.namespace.clone(),
        scaler_metadata: metadata.into_iter().collect(),
    }
}

#[tokio::test]
async fn every_example_and_docs_snippet_is_accepted_by_hoist_serving_the_config_shipped_with_it() {
    let docs = documents("deploy/kubernetes");
    // The split setup's interceptor: interceptor.yaml's config, on loopback.
    let interceptor_config = config_text(&docs, named(&docs, "Deployment", "hoist-interceptor"))
        .replace("0.0.0.0:", "127.0.0.1:")
        .replace(":8080\"", ":0\"")
        .replace(":5432\"", ":0\"")
        .replace(":9091\"", ":0\"");
    let interceptor =
        support::Hoist::start_interceptor(load_ok("interceptor.yaml", &interceptor_config)).await;
    // The cluster holds the examples and the docs' objects: hoist checks
    // every call against its ScaledObject, decides declared routes from
    // them, and reads TriggerAuthentications when told to.
    let api = kube_api::FakeApi::start().await;
    let shown = scaled_objects_shown();
    for object in &shown {
        api.put_scaled_object(
            &object.namespace,
            &object.name,
            json(&object.object["spec"]),
        );
    }
    let lending = put_trigger_authentications(&api);
    for (source, config) in shipped_configs() {
        // As shipped, and with the teams' own TriggerAuthentications read.
        for trigger_authentication in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            // With the split setup's lines, endpoints on loopback.
            let split = format!(
                "{config}\n[interceptor]\nendpoints = [\"{}\"]\n",
                interceptor.admin
            );
            let mut settings = load_ok(&source, &with_local_files(&split, dir.path()));
            settings.kubernetes.kubeconfig = Some(api.kubeconfig());
            settings.kubernetes.trigger_authentication = trigger_authentication;
            // Hosts are the platform team's to hand out: the declared-route
            // example's comment says which line it needs, and
            // docs/getting-started.md's values give `demo` its own.
            settings.interceptor.allowed_hosts.insert(
                "orders".into(),
                vec!["shop.example.com".into(), "*.shop.example.com".into()],
            );
            settings
                .interceptor
                .allowed_hosts
                .insert("demo".into(), vec!["*.demo.example.com".into()]);
            let hoist = support::Hoist::start_with(settings).await;
            let mut checked = 0;
            for object in &shown {
                for trigger in list(&object.object["spec"]["triggers"]) {
                    // Shown with kubernetes.trigger_authentication on.
                    let lent = authentication_of(object, trigger)
                        .is_some_and(|auth| lending.contains(&auth));
                    if lent && !trigger_authentication {
                        continue;
                    }
                    let response = hoist
                        .client()
                        .await
                        .get_metric_spec(reference_of(object, trigger))
                        .await
                        .unwrap_or_else(|status| {
                            panic!(
                                "{source} (trigger_authentication = {trigger_authentication}): {}: {status:?}",
                                object.source
                            )
                        });
                    assert_eq!(response.into_inner().metric_specs.len(), 1);
                    checked += 1;
                }
            }
            assert!(checked >= 20, "{checked} triggers");
            hoist.stop().await.unwrap();
        }
    }
}

fn metric_names_on_live_metrics(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (name, kind_) = (fields.next().unwrap(), fields.next().unwrap());
        match kind_ {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The metrics of a /metrics page as one queries them: a counter with its
/// `_total`, a histogram by its own name.
fn metric_families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| {
            let mut fields = rest.split_whitespace();
            let (name, kind_) = (fields.next().unwrap(), fields.next().unwrap_or_default());
            if kind_ == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            }
        })
        .collect()
}

/// The label sets of `metric`'s samples on a /metrics page.
fn series_of(text: &str, metric: &str) -> Vec<BTreeMap<String, String>> {
    let label = regex::Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)""#).unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix(metric)?.strip_prefix('{'))
        .map(|labels| {
            label
                .captures_iter(labels)
                .map(|c| (c[1].to_string(), c[2].to_string()))
                .collect()
        })
        .collect()
}

/// Labels Prometheus attaches to every scraped sample: a hoist label of
/// the same name would be renamed `exported_*` (`honor_labels: false`).
/// The chart's ServiceMonitor adds `service`, `endpoint` and `container`
/// (a PodMonitor all but `service`).
const TARGET_LABELS: [&str; 7] = [
    "namespace",
    "pod",
    "job",
    "instance",
    "service",
    "endpoint",
    "container",
];

/// Every hoist sample on `page` keeps its labels through a scrape.
fn assert_no_target_labels(mode: &str, page: &str) {
    let name = regex::Regex::new(r"^(hoist_[a-z_]+)\{").unwrap();
    for line in page.lines() {
        let Some(metric) = name.captures(line) else {
            continue;
        };
        let series = series_of(line, &metric[1]);
        for label in TARGET_LABELS {
            assert!(
                !series[0].contains_key(label),
                "{mode}: `{label}` on {line} collides with Prometheus' target label"
            );
        }
    }
}

/// The metrics the dashboard's variables list pods from.
fn variable_metrics() -> BTreeSet<String> {
    let metric = regex::Regex::new(r"\bhoist_[a-z_]+\b").unwrap();
    queries()
        .into_iter()
        .filter(|(source, _)| source.starts_with("dashboard variable"))
        .flat_map(|(_, query)| {
            metric
                .find_iter(&query)
                .map(|m| m.as_str().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn prometheus_rule() -> Value {
    json(&documents("deploy/monitoring")[0])
}

fn queries() -> Vec<(String, String)> {
    let mut all = Vec::new();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/monitoring/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            all.push((
                format!("dashboard panel {}", panel["title"]),
                target["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            all.push((
                format!("dashboard variable {}", variable["name"]),
                variable["query"].as_str().unwrap().to_string(),
            ));
        }
    }
    for group in prometheus_rule()["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            all.push((
                format!("alert {}", rule["alert"]),
                rule["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    all
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_use_is_on_a_live_metrics_page() {
    // In-process interceptor routes, so its families are on the page too.
    let text = "[engine]\nassume_applied = true\n[interceptor]\nhttp_listen = \"127.0.0.1:0\"\n[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.example.com\"\nupstream = \"127.0.0.1:9\"\n";
    // From a config file it reloads, so the reload metrics are there too.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(&file, text).unwrap();
    let source = ConfigSource::new(Some(file), Vec::new(), Overrides::default());
    let hoist = support::Hoist::start_reloading(load_ok("in-process", text), source).await;
    // A trigger whose source refuses connections: polls, failures and
    // their durations get series (an empty family has no lines at all).
    let refused = support::free_port().to_string();
    let object = support::object(
        "worker",
        &[
            ("scaler", "redis"),
            ("address", &format!("127.0.0.1:{refused}")),
            ("listName", "jobs"),
            ("listLength", "5"),
        ],
    );
    let _ = hoist.metric(&object).await;
    // An engine-mode trigger on the same failing source: its decisions
    // (TriggerError) get a series too.
    let mut engine = object.clone();
    engine.name = "engine-worker".into();
    engine
        .scaler_metadata
        .insert("scalingMode".into(), "engine".into());
    let _ = hoist.metric(&engine).await;
    // Two triggers of one ScaledObject on one route: both `http-web`.
    for measure in ["requestRate", "concurrency"] {
        let web = support::object(
            "web",
            &[("scaler", "http"), ("route", "web"), ("metric", measure)],
        );
        hoist
            .metric(&web)
            .await
            .expect("an http trigger on route web");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (live, page) = loop {
        let (status, page) = hoist.get("/metrics").await;
        assert_eq!(status, 200);
        let live = metric_names_on_live_metrics(&page);
        if live.contains("hoist_poll_errors_total")
            && live.contains("hoist_poll_duration_seconds_count")
            && live.contains("hoist_engine_decisions_total")
        {
            break (live, page);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed poll on /metrics: {live:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let metric = regex::Regex::new(r"\bhoist_[a-z_]+\b").unwrap();
    let mut used = BTreeSet::new();
    for (source, query) in queries() {
        let names: Vec<&str> = metric.find_iter(&query).map(|m| m.as_str()).collect();
        assert!(!names.is_empty(), "{source}: uses no hoist metric");
        for name in names {
            assert!(
                live.contains(name),
                "{source}: `{name}` is not on /metrics ({live:?})"
            );
            used.insert(name.to_string());
        }
    }
    assert!(used.len() >= 8, "{used:?}");

    // Each trigger its own series, told apart by `source`, with labels a
    // scrape keeps.
    let web: Vec<_> = series_of(&page, "hoist_trigger_value")
        .into_iter()
        .filter(|labels| labels["scaled_object"] == "web")
        .collect();
    assert_eq!(web.len(), 2, "{page}");
    for labels in &web {
        assert_eq!(labels["scaled_object_namespace"], "default");
        assert_eq!(labels["metric"], "http-web");
    }
    assert_ne!(web[0]["source"], web[1]["source"]);
    assert_no_target_labels("in-process", &page);
    let info = series_of(&page, "hoist_build_info");
    assert_eq!(info.len(), 1, "{page}");
    assert_eq!(info[0]["mode"], "in-process");

    // The dashboard's variables list every process: the gRPC scaler alone
    // and `hoist interceptor` export what they come from too.
    let variables = variable_metrics();
    assert!(variables.contains("hoist_build_info"), "{variables:?}");
    let scaler = support::Hoist::start().await;
    let (_, scaler_page) = scaler.get("/metrics").await;
    let split = support::Hoist::start_interceptor(load_ok("split", text)).await;
    let (_, split_page) = split.get("/metrics").await;
    for (mode, page) in [("scaler", &scaler_page), ("interceptor", &split_page)] {
        let live = metric_names_on_live_metrics(page);
        for name in &variables {
            assert!(
                live.contains(name),
                "{mode}: `{name}` is not on /metrics:\n{page}"
            );
        }
        assert_eq!(series_of(page, "hoist_build_info")[0]["mode"], mode);
        assert_no_target_labels(mode, page);
    }
    // docs/operating.md's list of metrics names every metric any mode
    // exports.
    let page_text = std::fs::read_to_string(root().join("docs/operating.md")).unwrap();
    let operating = page_text
        .split("\n## Metrics\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/operating.md has a Metrics section");
    for (mode, text) in [
        ("in-process", &page),
        ("scaler", &scaler_page),
        ("interceptor", &split_page),
    ] {
        for family in metric_families(text) {
            let named = regex::Regex::new(&format!(r"\b{family}\b")).unwrap();
            assert!(
                named.is_match(operating),
                "{mode}: `{family}` is on /metrics but not in docs/operating.md's Metrics"
            );
        }
    }
    // The interceptor panels and alerts work on a split interceptor.
    let split_live = metric_names_on_live_metrics(&split_page);
    for (source, query) in queries() {
        if query.contains("hoist_interceptor_") {
            for name in metric.find_iter(&query).map(|m| m.as_str()) {
                assert!(
                    split_live.contains(name),
                    "{source}: `{name}` is not on a split interceptor's /metrics"
                );
            }
        }
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let rule = prometheus_rule();
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let file = dir.path().join("rules.json");
    std::fs::write(&file, rule["spec"].to_string()).unwrap();
    let output = run("promtool", &["check", "rules", file.to_str().unwrap()]);
    succeeded("promtool check rules", &output);
    let alerts: BTreeSet<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    assert!(
        alerts.contains("HoistEngineCountUnknown")
            && alerts.contains("HoistColdStartsTimingOut")
            && alerts.contains("HoistConfigReloadRefused")
    );
    // The Prometheus Operator's schema for the whole object.
    let object = dir.path().join("rule.json");
    std::fs::write(&object, rule.to_string()).unwrap();
    succeeded("the PrometheusRule schema", &operator_schema(&[&object]));
    let mut wrong = rule.clone();
    wrong["spec"]["groups"][0]["rules"][0]["for"] = serde_json::json!(600);
    std::fs::write(&object, wrong.to_string()).unwrap();
    assert!(
        !operator_schema(&[&object]).status.success(),
        "`for` must be a string"
    );
    // promtool refuses a broken expression: the check can fail.
    let mut broken = rule["spec"].clone();
    broken["groups"][0]["rules"][0]["expr"] =
        Value::String("rate(hoist_poll_errors_total[5m]".into());
    std::fs::write(&file, broken.to_string()).unwrap();
    let output = run("promtool", &["check", "rules", file.to_str().unwrap()]);
    assert!(!output.status.success());
}

/// scripts/prometheus-operator-schema.mjs on these JSON files: the
/// Prometheus Operator's schema (npm's @kubernetes-models/prometheus-operator,
/// which scripts/test.sh installs) and its declared field names.
fn operator_schema(files: &[&Path]) -> Output {
    let modules = std::env::var("HOIST_TEST_NODE_MODULES").unwrap_or_else(|_| {
        root()
            .join("target/test-tools/node_modules")
            .display()
            .to_string()
    });
    assert!(
        Path::new(&modules)
            .join("@kubernetes-models/prometheus-operator")
            .is_dir(),
        "no @kubernetes-models/prometheus-operator in {modules}: scripts/test.sh installs it"
    );
    let mut args = vec!["scripts/prometheus-operator-schema.mjs", modules.as_str()];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    run("node", &args)
}

/// The chart's ServiceMonitors and PodMonitors (`monitoring.enabled:
/// true`), of each kind, with the defaults, in split mode and with each
/// `ci/` values file (admin TLS, the interceptors' mTLS channel).
fn chart_monitors() -> Vec<(String, Value)> {
    let dir = tempfile::tempdir().unwrap();
    let values = |file: &str, text: &str| {
        let path = dir.path().join(file);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let kinds = [
        values("service.yaml", "monitoring:\n  enabled: true\n"),
        values(
            "pod.yaml",
            "monitoring:\n  enabled: true\n  kind: PodMonitor\n",
        ),
    ];
    let mut modes = vec![
        None,
        Some(values("split.yaml", "interceptor:\n  mode: split\n")),
    ];
    for entry in std::fs::read_dir(root().join("deploy/helm/hoist/ci")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        modes.push(Some(format!("deploy/helm/hoist/ci/{name}")));
    }
    let mut monitors = Vec::new();
    for kind_file in &kinds {
        for mode in &modes {
            let mut files = vec![kind_file.as_str()];
            files.extend(mode.as_deref());
            for doc in helm_template(&files) {
                let kind = doc["kind"].as_str().unwrap_or_default();
                if kind.ends_with("Monitor") {
                    let source = format!("{files:?}: {kind} {}", name(&doc));
                    monitors.push((source, json(&doc)));
                }
            }
        }
    }
    monitors
}

#[test]
fn the_charts_monitors_pass_the_prometheus_operator_schema() {
    let monitors = chart_monitors();
    let seen: BTreeSet<(&str, &str)> = monitors
        .iter()
        .map(|(_, m)| {
            (
                m["kind"].as_str().unwrap(),
                m["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    for kind in ["ServiceMonitor", "PodMonitor"] {
        for name in ["hoist", "hoist-interceptor"] {
            assert!(seen.contains(&(kind, name)), "{kind} {name}: {seen:?}");
        }
    }
    assert!(
        monitors
            .iter()
            .any(|(_, m)| m.to_string().contains("\"https\"")),
        "a render with admin TLS scrapes over HTTPS"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut sources = Vec::new();
    for (i, (source, monitor)) in monitors.iter().enumerate() {
        let file = dir.path().join(format!("{i:02}.json"));
        std::fs::write(&file, monitor.to_string()).unwrap();
        sources.push(format!("{}: {source}", file.display()));
        files.push(file);
    }
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    succeeded(
        &format!("the monitors' schema ({})", sources.join("; ")),
        &operator_schema(&paths),
    );
    // The checks can fail: a wrong type, and a misspelt field.
    let (_, monitor) = &monitors[0];
    let endpoints = if monitor["kind"] == "ServiceMonitor" {
        "endpoints"
    } else {
        "podMetricsEndpoints"
    };
    let bad = dir.path().join("bad.json");
    let mut wrong = monitor.clone();
    wrong["spec"][endpoints][0]["honorLabels"] = Value::String("no".into());
    std::fs::write(&bad, wrong.to_string()).unwrap();
    assert!(
        !operator_schema(&[&bad]).status.success(),
        "a string honorLabels"
    );
    let mut misspelt = monitor.clone();
    misspelt["spec"][endpoints][0]["honorLabel"] = Value::Bool(false);
    std::fs::write(&bad, misspelt.to_string()).unwrap();
    let output = operator_schema(&[&bad]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("honorLabel"));
}

/// The alerts' `promtool test rules` cases (tests/data), against the
/// shipped rules.
fn promtool_unit_tests(spec: &Value) -> Output {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.json"), spec.to_string()).unwrap();
    let cases = dir.path().join("prometheusrule.test.yaml");
    std::fs::copy(root().join("tests/data/prometheusrule.test.yaml"), &cases).unwrap();
    run("promtool", &["test", "rules", cases.to_str().unwrap()])
}

#[test]
fn every_alert_fires_when_it_must_and_stays_silent_on_healthy_series() {
    let rule = prometheus_rule();
    let output = promtool_unit_tests(&rule["spec"]);
    succeeded(
        "promtool test rules tests/data/prometheusrule.test.yaml",
        &output,
    );
    // Every alert has both kinds of case.
    let cases: Value = json(
        &yaml_rust2::YamlLoader::load_from_str(
            &std::fs::read_to_string(root().join("tests/data/prometheusrule.test.yaml")).unwrap(),
        )
        .unwrap()[0],
    );
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for test in cases["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let alert = case["alertname"].as_str().unwrap().to_string();
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            if fires { &mut firing } else { &mut silent }.insert(alert);
        }
    }
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for alert in group["rules"].as_array().unwrap() {
            let name = alert["alert"].as_str().unwrap();
            assert!(firing.contains(name), "{name}: no case where it fires");
            assert!(
                silent.contains(name),
                "{name}: no case where it stays silent"
            );
            assert!(
                alert["annotations"]["description"]
                    .as_str()
                    .is_some_and(|d| d.len() > 40),
                "{name}: its description does not say what it means"
            );
        }
    }
    // The cases can fail: the push-stream alert as it was (streams opened
    // lately, not streams open now) fires on streams open for hours.
    let mut was = rule["spec"].clone();
    for alert in was["groups"][0]["rules"].as_array_mut().unwrap() {
        if alert["alert"] == "HoistPushStreamsDown" {
            alert["expr"] = Value::String(
                "sum by (namespace, job) (hoist_tracked_triggers) > 0 and sum by (namespace, job) (rate(hoist_grpc_requests_total{method=\"StreamIsActive\"}[15m])) == 0".into(),
            );
        }
    }
    let output = promtool_unit_tests(&was);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{report}");
    assert!(
        report.contains("push streams open for hours stay silent"),
        "{report}"
    );
}

/// `buildah` with storage of its own under `dir`.
fn buildah(dir: &Path, args: &[&str]) -> Output {
    let root_dir = dir.join("root").display().to_string();
    let run_dir = dir.join("run").display().to_string();
    let mut all = vec![
        "--root",
        root_dir.as_str(),
        "--runroot",
        run_dir.as_str(),
        "--storage-driver",
        "vfs",
    ];
    all.extend(args);
    let output = run("buildah", &all);
    succeeded(&format!("buildah {args:?}"), &output);
    output
}

#[test]
fn the_image_built_here_runs_hoist_as_uid_65532() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("hoist.oci.tar");
    // The test binary Cargo built (debug): the release build is the same
    // script's default, too slow for every test run.
    let binary = env!("CARGO_BIN_EXE_hoist");
    let output = run(
        "scripts/image.sh",
        &["--binary", binary, "--output", archive.to_str().unwrap()],
    );
    succeeded("scripts/image.sh", &output);

    let storage = dir.path().join("storage");
    let from = buildah(
        &storage,
        &[
            "from",
            "--quiet",
            &format!("oci-archive:{}", archive.display()),
        ],
    );
    let container = String::from_utf8(from.stdout).unwrap().trim().to_string();
    let inspect: Value =
        serde_json::from_slice(&buildah(&storage, &["inspect", &container]).stdout).unwrap();
    let config = &inspect["OCIv1"]["config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/hoist"])
    );
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["serve", "--config", "/etc/hoist/hoist.toml"])
    );
    let ports: BTreeSet<&str> = config["ExposedPorts"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(ports, BTreeSet::from(["8080/tcp", "9090/tcp", "9091/tcp"]));
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(revision.len() >= 40, "a commit: {revision}");

    let mount = buildah(&storage, &["mount", &container]);
    let rootfs = PathBuf::from(String::from_utf8(mount.stdout).unwrap().trim());
    let chrooted = |args: &[&str]| -> Output {
        let mut all = vec!["--userspec=65532:65532", rootfs.to_str().unwrap()];
        all.extend(args);
        run("chroot", &all)
    };
    let version = chrooted(&["/usr/local/bin/hoist", "--version"]);
    succeeded("hoist --version in the image", &version);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("hoist {}", env!("CARGO_PKG_VERSION"))
    );
    // hoist.yaml's config, where the pod mounts it, with its Secret's files.
    let docs = documents("deploy/kubernetes");
    let config_text = config_text(&docs, named(&docs, "Deployment", "hoist"));
    std::fs::create_dir_all(rootfs.join("etc/hoist")).unwrap();
    std::fs::write(rootfs.join("etc/hoist/hoist.toml"), config_text).unwrap();
    let secrets = rootfs.join("var/run/secrets/hoist");
    std::fs::create_dir_all(&secrets).unwrap();
    for file in regex::Regex::new(r#"/var/run/secrets/hoist/([^"]+)"#)
        .unwrap()
        .captures_iter(config_text)
    {
        std::fs::write(secrets.join(&file[1]), "secret").unwrap();
    }
    let check = chrooted(&[
        "/usr/local/bin/hoist",
        "check-config",
        "--config",
        "/etc/hoist/hoist.toml",
    ]);
    succeeded("hoist check-config in the image", &check);
    assert!(String::from_utf8_lossy(&check.stderr).contains("configuration is valid"));
    // Its CA bundle and the user the pods run as are there.
    assert!(rootfs.join("etc/ssl/certs/ca-certificates.crt").is_file());
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("hoist:x:65532:65532:"))
    );
    buildah(&storage, &["umount", &container]);
    buildah(&storage, &["rm", &container]);
    buildah(&storage, &["rmi", "--all", "--force"]);
}
