//! The manifests in `deploy/` agree with each other and with hoist: names,
//! ports, labels and selectors, probes, the config they mount (loaded by
//! hoist itself), and the ScaledObject examples' addresses and metadata.
//! The Helm chart's own checks are in tests/helm.rs.

mod manifests;

use std::collections::{BTreeMap, HashMap};

use hoist::config::Settings;
use manifests::*;

const NAMESPACE: &str = "keda";

#[test]
fn kubernetes_manifests_agree_with_each_other_and_with_hoist() {
    let docs = documents("deploy/kubernetes");
    check_consistency("deploy/kubernetes", &docs);
    for doc in docs.iter().filter(|d| !cluster_scoped(d)) {
        assert_eq!(
            doc["metadata"]["namespace"].as_str(),
            Some(NAMESPACE),
            "{}",
            name(doc)
        );
    }

    let deployment = named(&docs, "Deployment", "hoist");
    let container = container(deployment);
    let ports = container_ports(container);

    // The config the pod mounts is valid and listens where the pod says.
    let settings = load_ok("hoist.yaml", config_text(&docs, deployment));
    assert_eq!(i64::from(settings.grpc.listen.port()), ports["grpc"]);
    assert_eq!(i64::from(settings.admin.listen.port()), ports["admin"]);
    let defaults = Settings::default();
    assert_eq!(
        i64::from(defaults.grpc.listen.port()),
        ports["grpc"],
        "the image's defaults match too"
    );
    assert_eq!(i64::from(defaults.admin.listen.port()), ports["admin"]);
    assert_eq!(
        strings(&container["args"]),
        [
            "serve",
            "--config",
            &format!("{}/hoist.toml", mount_path(deployment, "config"))
        ]
    );
    assert!(
        settings
            .state_file
            .unwrap()
            .starts_with(mount_path(deployment, "state")),
        "the state file is on a writable volume"
    );

    // Probes: startup and readiness on the admin port, liveness through
    // the gRPC health service.
    for probe in ["readinessProbe", "startupProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"].as_str(), Some("admin"));
    }
    assert_eq!(
        container["livenessProbe"]["grpc"]["port"].as_i64(),
        Some(ports["grpc"])
    );

    // KEDA round-robins over pod addresses: the Service is headless and
    // carries gRPC and admin.
    let service = named(&docs, "Service", "hoist");
    assert!(headless(service), "KEDA round-robins over pod addresses");
    assert_eq!(
        service_ports(service).keys().collect::<Vec<_>>(),
        ["admin", "grpc"]
    );
    // One replica: no budget (maxUnavailable 1 would protect nothing).
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(1));
    assert!(try_named(&docs, "PodDisruptionBudget", "hoist").is_none());
}

#[test]
fn service_accounts_may_read_what_engine_mode_and_admin_auth_read() {
    let docs = documents("deploy/kubernetes");
    let bound = bound_service_accounts("deploy/kubernetes", &docs);
    assert_eq!(
        bound,
        std::collections::BTreeSet::from([
            ("keda".to_string(), "hoist".to_string()),
            ("keda".to_string(), "hoist-interceptor".to_string()),
        ]),
    );
    // The interceptor's admin port checks tokens, and may do nothing else.
    let interceptor: Vec<serde_json::Value> =
        list(&named(&docs, "ClusterRole", "hoist-interceptor")["rules"])
            .iter()
            .map(json)
            .collect();
    assert_eq!(
        interceptor,
        [
            serde_json::json!({"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]})
        ]
    );
    let rules: Vec<serde_json::Value> = list(&named(&docs, "ClusterRole", "hoist")["rules"])
        .iter()
        .map(json)
        .collect();
    assert_eq!(
        rules,
        [
            serde_json::json!({"apiGroups": ["keda.sh"], "resources": ["scaledobjects", "scaledjobs"], "verbs": ["list", "watch"]}),
            serde_json::json!({"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get"]}),
            serde_json::json!({"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": ["list", "watch"]}),
            serde_json::json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}),
            serde_json::json!({"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}),
        ]
    );
}

/// The commented-out `[interceptor]` lines in hoist.yaml's config, as TOML.
fn split_setup_snippet(config: &str) -> String {
    let lines: Vec<&str> = config.lines().map(str::trim).collect();
    let start = lines
        .iter()
        .position(|l| *l == "# [interceptor]")
        .expect("hoist.yaml shows the split setup's [interceptor] lines");
    lines[start..]
        .iter()
        .take_while(|l| l.starts_with("# ") && (l.contains(" = ") || l.starts_with("# [")))
        .map(|l| l.trim_start_matches("# "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_interceptor_manifest_agrees_with_its_services_and_hoists_config() {
    let docs = documents("deploy/kubernetes");
    let deployment = named(&docs, "Deployment", "hoist-interceptor");
    let container = container(deployment);
    let ports = container_ports(container);
    assert_eq!(
        strings(&container["args"]),
        [
            "interceptor",
            "--config",
            &format!("{}/interceptor.toml", mount_path(deployment, "config"))
        ]
    );
    assert!(deployment["spec"]["replicas"].as_i64().unwrap() >= 2);
    for (probe, path) in [
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ] {
        assert_eq!(container[probe]["httpGet"]["port"].as_str(), Some("admin"));
        assert_eq!(container[probe]["httpGet"]["path"].as_str(), Some(path));
    }

    // The interceptor's pods are not hoist's: hoist's Service and budget
    // leave them alone (check_consistency: one Deployment per selector).
    let scaler = named(&docs, "Deployment", "hoist");
    assert!(!selects(
        &labels(&named(&docs, "Service", "hoist")["spec"]["selector"]),
        &pod_labels(deployment)
    ));
    assert_ne!(pod_labels(scaler), pod_labels(deployment));

    // Its config: admin, HTTP and TCP listeners are the container's ports,
    // and hoist's defaults (admin 9091, HTTP 8080).
    let text = config_text(&docs, deployment);
    let (rest, section) = split_interceptor("interceptor.toml", text);
    let section = section.expect("interceptor.toml has [interceptor]");
    let settings = load_ok("interceptor.toml without [interceptor]", &rest);
    assert_eq!(i64::from(settings.admin.listen.port()), ports["admin"]);
    assert_eq!(
        settings.admin.listen.port(),
        Settings::default().admin.listen.port()
    );
    let http = port_of(section["http_listen"].as_str().unwrap());
    assert_eq!(http, ports["http"]);
    assert_eq!(http, 8080, "the interceptor's default HTTP port");
    let tcp: BTreeMap<String, i64> = section["tcp_routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let port = port_of(r["listen"].as_str().unwrap());
            (format!("tcp-{port}"), port)
        })
        .collect();
    assert!(!tcp.is_empty());
    let container_tcp: BTreeMap<String, i64> = ports
        .iter()
        .filter(|(name, _)| name.starts_with("tcp-"))
        .map(|(name, port)| (name.clone(), *port))
        .collect();
    assert_eq!(container_tcp, tcp, "every TCP route's port is open");
    assert!(!section["http_routes"].as_array().unwrap().is_empty());

    // The proxied traffic: HTTP and every TCP route, through one ClusterIP.
    let proxy = named(&docs, "Service", "hoist-interceptor-proxy");
    assert!(!headless(proxy));
    let proxy_ports = service_ports(proxy);
    assert_eq!(proxy_ports["http"].0, http);
    for (port_name, port) in &tcp {
        assert_eq!(proxy_ports[port_name].0, *port);
    }
    assert_eq!(proxy_ports.len(), 1 + tcp.len());
    // A declared TCP route's port must be one the proxy Service has: the
    // interceptors (checking the table) and hoist (deciding it) allow
    // only such ports.
    let scaler_config = config_text(&docs, scaler);
    let split = format!("{scaler_config}\n{}\n", split_setup_snippet(scaler_config));
    for (source, config) in [
        ("interceptor.yaml", load_ok("interceptor.yaml", text)),
        ("hoist.yaml, split setup", load_ok("hoist.yaml", &split)),
    ] {
        let ranges = config
            .interceptor
            .listen_ports_for("orders")
            .unwrap_or_else(|| panic!("{source}: any port from 1024 is allowed"));
        for (low, high) in ranges {
            for port in low..=high {
                assert!(
                    proxy_ports.values().any(|(p, _)| *p == i64::from(port)),
                    "{source}: declared port {port} is not on the proxy Service"
                );
            }
        }
    }

    // hoist finds every replica through the headless admin Service, whose
    // name is what hoist.yaml's split-setup lines point at.
    let discovery = named(&docs, "Service", "hoist-interceptor");
    assert!(headless(discovery), "its name resolves to every pod");
    let discovery_ports = service_ports(discovery);
    assert_eq!(
        discovery_ports.keys().collect::<Vec<_>>(),
        ["admin"],
        "only the admin port"
    );
    named(&docs, "PodDisruptionBudget", "hoist-interceptor");

    let snippet = toml_table(
        "hoist.yaml's split lines",
        &split_setup_snippet(scaler_config),
    );
    let endpoints: Vec<&str> = snippet["interceptor"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(
        endpoints,
        [format!(
            "{}.{NAMESPACE}.svc.cluster.local:{}",
            name(discovery),
            discovery_ports["admin"].0
        )]
    );
}

#[test]
fn the_interceptor_configs_load_with_hoists_loader() {
    let docs = documents("deploy/kubernetes");
    let defaults = serde_json::to_value(Settings::default()).unwrap();
    assert_eq!(
        defaults["interceptor"]["http_listen"], "0.0.0.0:8080",
        "the manifests' HTTP port is hoist's default"
    );

    let deployment = named(&docs, "Deployment", "hoist-interceptor");
    let settings = load_ok("interceptor.toml", config_text(&docs, deployment));
    let json = serde_json::to_value(&settings).unwrap();
    assert_eq!(
        port_of(json["interceptor"]["http_listen"].as_str().unwrap()),
        container_ports(container(deployment))["http"]
    );
    assert_eq!(json["interceptor"]["endpoints"], serde_json::json!([]));

    // hoist.yaml with its split-setup lines uncommented.
    let scaler = config_text(&docs, named(&docs, "Deployment", "hoist"));
    let split = format!("{scaler}\n{}\n", split_setup_snippet(scaler));
    let settings = load_ok("hoist.yaml, split setup", &split);
    let json = serde_json::to_value(&settings).unwrap();
    assert_eq!(
        json["interceptor"]["endpoints"],
        serde_json::json!(["hoist-interceptor.keda.svc.cluster.local:9091"])
    );
}

#[test]
fn scaled_object_examples_point_at_the_service_with_metadata_hoist_accepts() {
    let docs = documents("deploy/kubernetes");
    let service = named(&docs, "Service", "hoist");
    let expected_address = format!(
        "{}.{}.svc.cluster.local:{}",
        name(service),
        service["metadata"]["namespace"].as_str().unwrap(),
        service_ports(service)["grpc"].0
    );
    let examples = documents("deploy/examples");
    let profiles = std::fs::read_to_string(root().join("deploy/examples/hoist.toml")).unwrap();
    let scaled_objects = kind(&examples, "ScaledObject");
    assert!(scaled_objects.len() >= 5);
    // The scaler side of the split setup: routes are checked against the
    // interceptor's config here, and at every read by hoist.
    let split_setup = hoist::scalers::Context {
        traffic: Some(hoist::interceptor::traffic::Traffic::Remote(
            std::sync::Arc::new(
                hoist::interceptor::fleet::Fleet::new(
                    vec!["hoist-interceptor.keda.svc.cluster.local:9091".into()],
                    std::time::Duration::from_secs(1),
                    None,
                )
                .unwrap(),
            ),
        )),
        ..Default::default()
    };
    let interceptor_docs = documents("deploy/kubernetes");
    let interceptor_config: toml::Table =
        named(&interceptor_docs, "ConfigMap", "hoist-interceptor")["data"]["interceptor.toml"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    let interceptor_routes: Vec<String> = ["http_routes", "tcp_routes"]
        .iter()
        .flat_map(|list| {
            interceptor_config["interceptor"][list]
                .as_array()
                .unwrap()
                .iter()
                .map(|route| route["name"].as_str().unwrap().to_string())
        })
        .collect();
    for scaled_object in scaled_objects {
        for trigger in list(&scaled_object["spec"]["triggers"]) {
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
            // `http` and `tcp` name routes of the interceptor manifest.
            if let Some(route) = metadata.get("route") {
                assert!(
                    interceptor_routes.contains(route),
                    "route `{route}` is one of the interceptor's: {interceptor_routes:?}"
                );
            }
            hoist::trigger::parse(
                &metadata,
                &Default::default(),
                hoist::trigger::Defaults {
                    polling_interval: std::time::Duration::from_secs(30),
                    timeout: std::time::Duration::from_secs(3),
                },
                // A route the trigger declares belongs to its ScaledObject.
                &hoist::scalers::Context {
                    owner: Some(hoist::routing::Owner {
                        namespace: scaled_object["metadata"]["namespace"]
                            .as_str()
                            .unwrap_or("default")
                            .to_string(),
                        name: scaled_object["metadata"]["name"]
                            .as_str()
                            .unwrap()
                            .to_string(),
                    }),
                    ..split_setup.clone()
                },
            )
            .unwrap_or_else(|e| panic!("{:?}: {e}", scaled_object["metadata"]["name"]));
        }
    }
}

#[test]
fn the_tls_trigger_authentication_gives_keda_the_parameters_it_reads() {
    let examples = documents("deploy/examples");
    // One for every namespace (cluster-scoped), one for a namespace.
    let cluster = kind(&examples, "ClusterTriggerAuthentication");
    assert_eq!(cluster.len(), 1);
    assert!(cluster[0]["metadata"]["namespace"].is_badvalue());
    for auth in cluster
        .into_iter()
        .chain(kind(&examples, "TriggerAuthentication"))
    {
        let parameters: Vec<&str> = list(&auth["spec"]["secretTargetRef"])
            .iter()
            .map(|p| p["parameter"].as_str().unwrap())
            .collect();
        // KEDA's external scaler reads exactly these for its gRPC connection.
        assert_eq!(parameters, ["caCert", "tlsClientCert", "tlsClientKey"]);
    }
}

#[test]
fn the_image_exposes_hoists_ports_and_runs_as_non_root() {
    let dockerfile = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let defaults = Settings::default();
    let expose = format!(
        "EXPOSE {} {} {}",
        defaults.grpc.listen.port(),
        defaults.admin.listen.port(),
        defaults.interceptor.http_listen.port()
    );
    assert!(dockerfile.contains(&expose), "{expose}");
    assert!(dockerfile.contains("USER 65532:65532"));
    assert!(dockerfile.contains("--locked"));
}

#[test]
fn the_example_config_loads_with_every_section() {
    let settings = hoist::config::Settings::load(
        Some(&root().join("deploy/examples/hoist.toml")),
        Vec::<(String, String)>::new(),
        &Default::default(),
    )
    .expect("deploy/examples/hoist.toml loads");
    assert!(!settings.auth.is_empty());
    assert!(!settings.interceptor.endpoints.is_empty());
    assert!(settings.interceptor.has_routes());
    assert!(
        !settings.interceptor.in_process(),
        "with endpoints, serve reads remote interceptors"
    );
}
