//! The manifests in `deploy/` agree with each other and with hoist: names,
//! ports, labels and selectors, probes, the config they mount, and the
//! ScaledObject examples' addresses and metadata.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use hoist::config::{Overrides, Settings};
use yaml_rust2::{Yaml, YamlLoader};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn documents(dir: &str) -> Vec<(String, Yaml)> {
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
            let name = path.display().to_string();
            YamlLoader::load_from_str(&text)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .into_iter()
                .filter(|doc| !doc.is_null())
                .map(move |doc| (name.clone(), doc))
        })
        .collect()
}

fn kind<'a>(docs: &'a [(String, Yaml)], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|(_, d)| d["kind"].as_str() == Some(kind))
        .map(|(_, d)| d)
        .collect()
}

fn labels(yaml: &Yaml) -> BTreeMap<String, String> {
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

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn kubernetes_manifests_agree_with_each_other_and_with_hoist() {
    let docs = documents("deploy/kubernetes");
    let deployment = kind(&docs, "Deployment")[0];
    let pod = &deployment["spec"]["template"];
    let pod_labels = labels(&pod["metadata"]["labels"]);
    assert!(selects(
        &labels(&deployment["spec"]["selector"]["matchLabels"]),
        &pod_labels
    ));

    let container = &pod["spec"]["containers"][0];
    let ports: HashMap<String, i64> = container["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect();

    // The config the pod mounts is valid and listens where the pod says.
    let config_map = kind(&docs, "ConfigMap")[0];
    assert_eq!(
        config_map["metadata"]["name"],
        pod["spec"]["volumes"][0]["configMap"]["name"]
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    std::fs::write(&file, config_map["data"]["hoist.toml"].as_str().unwrap()).unwrap();
    let settings = Settings::load(Some(&file), Vec::new(), &Overrides::default()).unwrap();
    assert_eq!(i64::from(settings.grpc.listen.port()), ports["grpc"]);
    assert_eq!(i64::from(settings.admin.listen.port()), ports["admin"]);
    let defaults = Settings::default();
    assert_eq!(
        i64::from(defaults.grpc.listen.port()),
        ports["grpc"],
        "the image's defaults match too"
    );
    assert_eq!(i64::from(defaults.admin.listen.port()), ports["admin"]);
    let args: Vec<&str> = container["args"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mount = container["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .unwrap();
    assert_eq!(
        args,
        [
            "serve",
            "--config",
            &format!("{}/hoist.toml", mount["mountPath"].as_str().unwrap())
        ]
    );
    let state_dir = container["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("state"))
        .unwrap();
    assert!(
        settings
            .state_file
            .unwrap()
            .starts_with(state_dir["mountPath"].as_str().unwrap()),
        "the state file is on a writable volume"
    );

    // Probes use ports that exist and endpoints hoist serves.
    for probe in ["readinessProbe", "startupProbe"] {
        let get = &container[probe]["httpGet"];
        assert!(ports.contains_key(get["port"].as_str().unwrap()), "{probe}");
        assert!(
            ["/healthz", "/readyz"].contains(&get["path"].as_str().unwrap()),
            "{probe}"
        );
    }
    assert_eq!(
        container["livenessProbe"]["grpc"]["port"].as_i64().unwrap(),
        ports["grpc"]
    );
    assert_eq!(
        container["livenessProbe"]["grpc"]["service"].as_str(),
        Some("externalscaler.ExternalScaler")
    );
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    assert_eq!(
        pod["spec"]["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true)
    );

    // The headless Service and the PodDisruptionBudget select these pods.
    let service = kind(&docs, "Service")[0];
    assert_eq!(
        service["spec"]["clusterIP"].as_str(),
        Some("None"),
        "KEDA round-robins over pod addresses"
    );
    assert!(selects(&labels(&service["spec"]["selector"]), &pod_labels));
    for port in service["spec"]["ports"].as_vec().unwrap() {
        let target = port["targetPort"].as_str().unwrap();
        assert_eq!(port["port"].as_i64(), Some(ports[target]), "{target}");
    }
    let budget = kind(&docs, "PodDisruptionBudget")[0];
    assert!(selects(
        &labels(&budget["spec"]["selector"]["matchLabels"]),
        &pod_labels
    ));
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        kind(&docs, "ServiceAccount")[0]["metadata"]["name"]
    );
}

#[test]
fn scaled_object_examples_point_at_the_service_with_metadata_hoist_accepts() {
    let service = kind(&documents("deploy/kubernetes"), "Service")[0].clone();
    let expected_address = format!(
        "{}.{}.svc.cluster.local:9090",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap()
    );
    let examples = documents("deploy/examples");
    let profiles = std::fs::read_to_string(root().join("deploy/examples/hoist.toml")).unwrap();
    let scaled_objects = kind(&examples, "ScaledObject");
    assert!(scaled_objects.len() >= 3);
    for scaled_object in scaled_objects {
        for trigger in scaled_object["spec"]["triggers"].as_vec().unwrap() {
            let mut metadata: HashMap<String, String> = trigger["metadata"]
                .as_hash()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().unwrap().to_string(),
                        v.as_str().unwrap().to_string(),
                    )
                })
                .collect();
            assert_eq!(metadata["scalerAddress"], expected_address);
            if let Some(profile) = metadata.remove("authRef") {
                assert!(
                    profiles.contains(&format!("[auth.{profile}]")),
                    "auth profile `{profile}` is defined"
                );
            }
            // KEDA resolves connectionFromEnv before hoist sees it.
            if metadata.contains_key("connectionFromEnv") {
                metadata.insert(
                    "connectionFromEnv".into(),
                    "Endpoint=sb://n.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v".into(),
                );
            }
            hoist::trigger::parse(
                &metadata,
                &Default::default(),
                hoist::trigger::Defaults {
                    polling_interval: std::time::Duration::from_secs(30),
                    timeout: std::time::Duration::from_secs(3),
                },
            )
            .unwrap_or_else(|e| panic!("{:?}: {e}", scaled_object["metadata"]["name"]));
        }
    }
}

#[test]
fn the_tls_trigger_authentication_gives_keda_the_parameters_it_reads() {
    let examples = documents("deploy/examples");
    let auth = kind(&examples, "TriggerAuthentication")[0];
    let parameters: Vec<&str> = auth["spec"]["secretTargetRef"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| p["parameter"].as_str().unwrap())
        .collect();
    // KEDA's external scaler reads exactly these for its gRPC connection.
    assert_eq!(parameters, ["caCert", "tlsClientCert", "tlsClientKey"]);
}

#[test]
fn the_image_exposes_hoists_ports_and_runs_as_non_root() {
    let dockerfile = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let defaults = Settings::default();
    let expose = format!(
        "EXPOSE {} {}",
        defaults.grpc.listen.port(),
        defaults.admin.listen.port()
    );
    assert!(dockerfile.contains(&expose), "{expose}");
    assert!(dockerfile.contains("USER 65532:65532"));
    assert!(dockerfile.contains("--locked"));
}
