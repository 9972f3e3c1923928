//! The Helm chart in `deploy/helm/hoist`, rendered by a real `helm`
//! (`helm template`, and `helm lint --strict`): with its defaults it holds
//! what deploy/kubernetes/hoist.yaml holds; with the values files in its
//! `ci/` folder (TLS, auth profiles from Secrets, the interceptor in split
//! and in-process mode) every name, port, label, selector, mount and
//! environment variable agrees with the config it renders, and that config
//! loads with hoist's own loader.
//!
//! `helm` is `$HELM_BIN` or the one on PATH; scripts/test.sh installs it
//! when missing (scripts/helm.sh). Without it these tests fail: they never
//! skip.

mod manifests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};

use hoist::config::{AuthValue, Settings};
use hoist::routing::{Listen, Owner, Protocol, RouteRules, RouteSpec};
use manifests::*;
use yaml_rust2::Yaml;

const CHART: &str = "deploy/helm/hoist";

fn helm_binary() -> PathBuf {
    let helm = std::env::var_os("HELM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| "helm".into());
    match Command::new(&helm).arg("version").output() {
        Ok(output) if output.status.success() => helm,
        _ => panic!(
            "no working `{}`: run scripts/helm.sh (scripts/test.sh does) or set HELM_BIN",
            helm.display()
        ),
    }
}

fn helm(args: &[&str]) -> Output {
    Command::new(helm_binary())
        .args(args)
        .current_dir(root())
        .output()
        .unwrap()
}

/// `helm template` of the chart; `values` are files relative to the crate.
fn render(release: &str, namespace: &str, values: &[&str]) -> Vec<Yaml> {
    render_args(release, namespace, values, &[])
}

/// `render` with more arguments for `helm template` (`--api-versions`).
fn render_args(release: &str, namespace: &str, values: &[&str], extra: &[&str]) -> Vec<Yaml> {
    let mut args = vec!["template", release, CHART, "--namespace", namespace];
    for file in values {
        args.extend(["--values", file]);
    }
    args.extend(extra);
    let output = helm(&args);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "helm {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    let docs = parse(&format!("helm template {values:?}"), &stdout);
    for doc in docs.iter().filter(|d| !cluster_scoped(d)) {
        assert_eq!(
            doc["metadata"]["namespace"].as_str(),
            Some(namespace),
            "{}",
            name(doc)
        );
    }
    docs
}

/// A values file of the chart's `ci/` folder: its path and its content.
fn values_file(file: &str) -> (String, Yaml) {
    let path = format!("{CHART}/ci/{file}");
    let text = std::fs::read_to_string(root().join(&path)).unwrap();
    let mut docs = parse(&path, &text);
    (path, docs.remove(0))
}

/// The pod template's `checksum/config` annotation, when it has one.
fn config_checksum(deployment: &Yaml) -> Option<&str> {
    deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"].as_str()
}

/// The pod template's `checksum/restart-config` annotation.
fn restart_checksum(deployment: &Yaml) -> String {
    deployment["spec"]["template"]["metadata"]["annotations"]["checksum/restart-config"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no checksum/restart-config", name(deployment)))
        .to_string()
}

fn probe_kinds(container: &Yaml) -> BTreeMap<&'static str, String> {
    ["readinessProbe", "livenessProbe", "startupProbe"]
        .into_iter()
        .map(|probe| {
            let p = &container[probe];
            let kind = if !p["httpGet"].is_badvalue() {
                format!(
                    "{} {} {}",
                    p["httpGet"]["scheme"].as_str().unwrap_or("HTTP"),
                    p["httpGet"]["port"].as_str().unwrap(),
                    p["httpGet"]["path"].as_str().unwrap()
                )
            } else if !p["grpc"].is_badvalue() {
                "grpc".to_string()
            } else {
                format!("tcp {}", p["tcpSocket"]["port"].as_str().unwrap())
            };
            (probe, kind)
        })
        .collect()
}

#[test]
fn the_chart_lints_clean_with_every_values_file() {
    let mut runs = vec![vec!["lint", "--strict", CHART]];
    let files: Vec<String> = std::fs::read_dir(root().join(CHART).join("ci"))
        .unwrap()
        .map(|e| format!("{CHART}/ci/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert!(files.len() >= 2);
    for file in &files {
        runs.push(vec!["lint", "--strict", CHART, "--values", file]);
    }
    for args in runs {
        let output = helm(&args);
        assert!(
            output.status.success(),
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn with_its_defaults_the_chart_renders_what_hoist_yaml_holds() {
    let chart = render("hoist", "keda", &[]);
    check_consistency("chart defaults", &chart);
    let plain = documents("deploy/kubernetes");
    let plain: Vec<Yaml> = plain
        .into_iter()
        .filter(|d| !name(d).starts_with("hoist-interceptor"))
        .collect();
    assert_eq!(objects(&chart), objects(&plain), "the same objects");

    let (a, b) = (
        named(&chart, "Deployment", "hoist"),
        named(&plain, "Deployment", "hoist"),
    );
    // A config change reloads in place: nothing rolls the pods.
    assert_eq!(config_checksum(a), None, "{a:?}");
    assert_eq!(a["spec"]["replicas"], b["spec"]["replicas"]);
    let (pod_a, pod_b) = (pod_spec(a), pod_spec(b));
    for key in [
        "serviceAccountName",
        "securityContext",
        "terminationGracePeriodSeconds",
        "automountServiceAccountToken",
    ] {
        assert_eq!(json(&pod_a[key]), json(&pod_b[key]), "pod {key}");
    }
    let (ca, cb) = (container(a), container(b));
    for key in ["image", "args", "ports", "resources", "securityContext"] {
        assert_eq!(json(&ca[key]), json(&cb[key]), "container {key}");
    }
    assert_eq!(probe_kinds(ca), probe_kinds(cb));
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        for key in ["periodSeconds", "failureThreshold"] {
            assert_eq!(ca[probe][key], cb[probe][key], "{probe} {key}");
        }
    }
    for volume_name in ["config", "state", "credentials"] {
        assert_eq!(mount_path(a, volume_name), mount_path(b, volume_name));
        assert_eq!(json(volume(a, volume_name)), json(volume(b, volume_name)));
    }

    let (sa, sb) = (
        named(&chart, "Service", "hoist"),
        named(&plain, "Service", "hoist"),
    );
    for key in ["clusterIP", "ports"] {
        assert_eq!(
            json(&sa["spec"][key]),
            json(&sb["spec"][key]),
            "Service {key}"
        );
    }
    for kind_ in ["ClusterRole", "ClusterRoleBinding"] {
        let (ra, rb) = (named(&chart, kind_, "hoist"), named(&plain, kind_, "hoist"));
        for key in ["rules", "roleRef", "subjects"] {
            assert_eq!(json(&ra[key]), json(&rb[key]), "{kind_} {key}");
        }
    }

    // The same settings, auth profiles included.
    let rendered = load_ok("chart hoist.toml", config_text(&chart, a));
    assert_eq!(rendered, load_ok("hoist.yaml", config_text(&plain, b)));
    let defaults = Settings::default();
    let ports = container_ports(ca);
    assert_eq!(ports["grpc"], i64::from(defaults.grpc.listen.port()));
    assert_eq!(ports["admin"], i64::from(defaults.admin.listen.port()));
    assert!(!chart.iter().any(|d| name(d).contains("interceptor")));
}

#[test]
fn split_mode_with_tls_and_auth_profiles_agrees_with_the_config_it_renders() {
    let (file, values) = values_file("split-tls-auth-values.yaml");
    let docs = render("hoist", "keda", &[&file]);
    check_consistency(&file, &docs);

    let scaler = named(&docs, "Deployment", "hoist");
    // restartOnConfigChange: each Deployment rolls with its own config.
    let checksums = [
        config_checksum(scaler),
        config_checksum(named(&docs, "Deployment", "hoist-interceptor")),
    ];
    for checksum in checksums {
        let checksum = checksum.expect("a checksum/config annotation");
        assert!(
            checksum.len() == 64 && checksum.chars().all(|c| c.is_ascii_hexdigit()),
            "{checksum}"
        );
    }
    assert_ne!(checksums[0], checksums[1]);
    let container_ = container(scaler);
    let text = config_text(&docs, scaler);
    let (rest, section) = split_interceptor("hoist.toml", text);
    let settings = load_ok("hoist.toml without [interceptor]", &rest);

    // Passthrough config, numbers staying integers.
    assert_eq!(settings.shutdown_grace.as_secs(), 15);
    assert_eq!(settings.polling.default_interval.as_secs(), 15);
    assert_eq!(settings.limits.max_tracked_triggers, 5000);
    assert_eq!(settings.limits.allowed_sources.len(), 2, "defaults merged");
    assert_eq!(scaler["spec"]["replicas"].as_i64(), Some(2));

    // TLS: each file hoist reads is a key of the Secret the values name,
    // mounted where the config says.
    let tls = |listener: &str| match listener {
        "grpc" => settings.grpc.tls.clone(),
        _ => settings.admin.tls.clone(),
    };
    for listener in ["grpc", "admin"] {
        let wanted = &values["tls"][listener];
        let tls = tls(listener).unwrap_or_else(|| panic!("{listener}: TLS on"));
        let mut files = vec![
            (
                tls.cert_file,
                wanted["secretName"].as_str().unwrap(),
                "tls.crt",
            ),
            (
                tls.key_file,
                wanted["secretName"].as_str().unwrap(),
                "tls.key",
            ),
        ];
        match (
            wanted["clientCA"]["secretName"].as_str(),
            tls.client_ca_file,
        ) {
            (Some(secret), Some(file)) => {
                files.push((file, secret, wanted["clientCA"]["key"].as_str().unwrap()))
            }
            (None, None) => {}
            other => panic!("{listener}: client CA {other:?}"),
        }
        for (file, secret, key) in files {
            let (volume, inside) = volume_holding(scaler, file.to_str().unwrap());
            assert_eq!(volume["secret"]["secretName"].as_str(), Some(secret));
            let items: Vec<(&str, &str)> = list(&volume["secret"]["items"])
                .iter()
                .map(|i| (i["key"].as_str().unwrap(), i["path"].as_str().unwrap()))
                .collect();
            assert!(
                items.contains(&(key, inside.as_str())),
                "{listener}: {file:?}"
            );
        }
    }
    // kubelet cannot do TLS to a gRPC probe: with gRPC TLS none is left,
    // and the HTTP probes speak HTTPS to the TLS admin port.
    for (probe, kind_) in probe_kinds(container_) {
        assert!(kind_.starts_with("HTTPS admin /"), "{probe}: {kind_}");
    }

    // Auth profiles: a literal stays a literal; a Secret key becomes an
    // environment variable (never HOIST_…, which hoist would read as a
    // config key) that the config reads and the pod fills from the Secret.
    let env: BTreeMap<&str, &Yaml> = list(&container_["env"])
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), &e["valueFrom"]["secretKeyRef"]))
        .collect();
    assert_eq!(env.len(), list(&container_["env"]).len(), "unique names");
    let mut used = BTreeSet::new();
    for (profile, params) in values["auth"].as_hash().unwrap() {
        let profile = profile.as_str().unwrap();
        let rendered = &settings.auth[profile];
        let namespaces: Vec<String> = list(&params["namespaces"])
            .iter()
            .map(|namespace| namespace.as_str().unwrap().to_string())
            .collect();
        assert_eq!(rendered.namespaces.as_ref(), Some(&namespaces), "{profile}");
        assert_eq!(
            rendered.params.len() + 1,
            params.as_hash().unwrap().len(),
            "{profile}: its params and namespaces"
        );
        for (param, value) in params.as_hash().unwrap() {
            let param = param.as_str().unwrap();
            if param == "namespaces" {
                continue;
            }
            match (&rendered.params[param], value.as_str()) {
                (AuthValue::Literal(literal), Some(wanted)) => assert_eq!(literal, wanted),
                (AuthValue::Env { env: variable }, None) => {
                    assert!(!variable.starts_with("HOIST_"), "{variable}");
                    assert_eq!(
                        *variable,
                        format!("AUTH_{profile}_{param}")
                            .to_uppercase()
                            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '_', "_")
                    );
                    let from = env
                        .get(variable.as_str())
                        .unwrap_or_else(|| panic!("{variable} is not set on the pod"));
                    assert_eq!(json(from), json(&value["secretKeyRef"]), "{variable}");
                    used.insert(variable.as_str());
                }
                (other, _) => panic!("{profile}.{param}: {other:?}"),
            }
        }
    }
    assert_eq!(used, env.keys().copied().collect(), "no stray variables");

    // The interceptor's own Deployment, config and Services.
    let interceptor = named(&docs, "Deployment", "hoist-interceptor");
    assert_eq!(
        interceptor["spec"]["replicas"],
        values["interceptor"]["replicas"]
    );
    assert_ne!(pod_labels(interceptor), pod_labels(scaler));
    let ic = container(interceptor);
    assert_eq!(strings(&ic["args"])[0], "interceptor");
    // Its admin port takes only hoist's client certificate (mTLS), which
    // kubelet does not have.
    for (probe, kind_) in probe_kinds(ic) {
        assert_eq!(kind_, "tcp admin", "{probe}");
    }
    let ports = container_ports(ic);
    let interceptor_text = config_text(&docs, interceptor);
    let (interceptor_rest, proxies) = split_interceptor("interceptor.toml", interceptor_text);
    let proxies = proxies.expect("interceptor.toml has [interceptor]");
    let interceptor_settings = load_ok("interceptor.toml without [interceptor]", &interceptor_rest);
    assert_eq!(
        i64::from(interceptor_settings.admin.listen.port()),
        ports["admin"]
    );
    assert_eq!(
        interceptor_settings.log.level, "debug",
        "its own passthrough"
    );
    assert!(interceptor_settings.auth.is_empty(), "no credentials there");
    assert!(ic["env"].is_badvalue(), "no credentials there");

    let http = port_of(proxies["http_listen"].as_str().unwrap());
    assert_eq!(http, ports["http"]);
    assert_eq!(
        Some(http),
        values["interceptor"]["httpPort"].as_i64().or(Some(8080))
    );
    assert_eq!(proxies["max_held_per_route"].as_integer(), Some(1000));
    let route_names = |routes: &toml::Value| -> Vec<String> {
        routes
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let wanted_names = |routes: &Yaml| -> Vec<String> {
        list(routes)
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        route_names(&proxies["http_routes"]),
        wanted_names(&values["interceptor"]["httpRoutes"])
    );
    assert_eq!(
        route_names(&proxies["tcp_routes"]),
        wanted_names(&values["interceptor"]["tcpRoutes"])
    );
    let proxy = named(&docs, "Service", "hoist-interceptor-proxy");
    assert!(!headless(proxy));
    let proxy_ports = service_ports(proxy);
    assert_eq!(proxy_ports["http"].0, http);
    for route in proxies["tcp_routes"].as_array().unwrap() {
        let port = port_of(route["listen"].as_str().unwrap());
        let port_name = format!("tcp-{port}");
        assert_eq!(ports.get(&port_name), Some(&port));
        assert_eq!(proxy_ports[&port_name].0, port);
    }
    assert_eq!(
        proxy_ports.len(),
        1 + proxies["tcp_routes"].as_array().unwrap().len()
    );

    // hoist reads every replica through the headless admin Service.
    let discovery = named(&docs, "Service", "hoist-interceptor");
    assert!(headless(discovery));
    let section = section.expect("hoist.toml has [interceptor] in split mode");
    assert_eq!(
        section["endpoints"],
        toml::Value::Array(vec![
            format!(
                "hoist-interceptor.keda.svc.cluster.local:{}",
                service_ports(discovery)["admin"].0
            )
            .into()
        ])
    );
    assert!(
        section.get("http_routes").is_none(),
        "the routes live in the interceptor"
    );

    // The channel is mTLS: hoist presents the client Secret's certificate
    // and checks the interceptors' for their Service's name; they serve
    // the server Secret's and take clients from its CA. Every file is a
    // key of the Secret the values name, mounted where the config says.
    let channel: hoist::config::ClientTlsSettings = section["tls"].clone().try_into().unwrap();
    channel.validate().unwrap();
    assert_eq!(
        channel.server_name.as_deref(),
        Some(format!("{}.keda.svc", name(discovery)).as_str())
    );
    let serving = interceptor_settings.admin.tls.clone().expect("admin TLS");
    let files = [
        (scaler, "clientSecretName", channel.ca_file, "ca.crt"),
        (
            scaler,
            "clientSecretName",
            channel.cert_file.unwrap(),
            "tls.crt",
        ),
        (
            scaler,
            "clientSecretName",
            channel.key_file.unwrap(),
            "tls.key",
        ),
        (
            interceptor,
            "serverSecretName",
            serving.cert_file,
            "tls.crt",
        ),
        (interceptor, "serverSecretName", serving.key_file, "tls.key"),
        (
            interceptor,
            "serverSecretName",
            serving.client_ca_file.unwrap(),
            "ca.crt",
        ),
    ];
    // They follow the route table on hoist's admin port, which has TLS
    // here: its certificate is checked against the admin Secret's CA
    // (mounted alone, without hoist's key) for the scaler Service's name.
    let scaler_service = named(&docs, "Service", "hoist");
    assert_eq!(
        proxies["scaler"].as_str(),
        Some(
            format!(
                "hoist.keda.svc.cluster.local:{}",
                service_ports(scaler_service)["admin"].0
            )
            .as_str()
        )
    );
    let follow: hoist::config::ClientTlsSettings = proxies["tls"].clone().try_into().unwrap();
    follow.validate().unwrap();
    assert_eq!(follow.server_name.as_deref(), Some("hoist.keda.svc"));
    assert_eq!(follow.cert_file, None, "no admin mTLS in these values");
    let (admin_ca, inside) = volume_holding(interceptor, follow.ca_file.to_str().unwrap());
    assert_eq!(
        admin_ca["secret"]["secretName"],
        values["tls"]["admin"]["secretName"]
    );
    assert_eq!(inside, "ca.crt");
    assert_eq!(
        list(&admin_ca["secret"]["items"]).len(),
        1,
        "ca.crt alone: {admin_ca:?}"
    );
    for (deployment, secret, file, key) in files {
        let (volume, inside) = volume_holding(deployment, file.to_str().unwrap());
        assert_eq!(
            volume["secret"]["secretName"], values["interceptor"]["tls"][secret],
            "{file:?}"
        );
        let items: Vec<(&str, &str)> = list(&volume["secret"]["items"])
            .iter()
            .map(|i| (i["key"].as_str().unwrap(), i["path"].as_str().unwrap()))
            .collect();
        assert!(items.contains(&(key, inside.as_str())), "{file:?}");
    }
    named(&docs, "PodDisruptionBudget", "hoist-interceptor");
    named(&docs, "ConfigMap", "hoist-interceptor");
}

#[test]
fn in_process_mode_opens_the_proxies_on_hoists_own_pods() {
    let (file, values) = values_file("in-process-values.yaml");
    let docs = render("edge", "apps", &[&file]);
    check_consistency(&file, &docs);
    let names: BTreeSet<&str> = docs.iter().map(name).collect();
    assert_eq!(
        names,
        BTreeSet::from(["edge-hoist", "edge-hoist-interceptor-proxy"]),
        "no interceptor Deployment, ConfigMap or headless Service; no RBAC"
    );
    // The claim: the old pod lets go before the new one starts; hoist
    // runs the proxies, so it waits out held requests at shutdown.
    let edge = named(&docs, "Deployment", "edge-hoist");
    assert_eq!(edge["spec"]["strategy"]["type"].as_str(), Some("Recreate"));
    assert_eq!(
        pod_spec(edge)["automountServiceAccountToken"].as_bool(),
        Some(false)
    );
    assert!(deployment_settings(&docs, edge).shutdown_grace.as_secs() > 60);

    let scaler = named(&docs, "Deployment", "edge-hoist");
    let container_ = container(scaler);
    let ports = container_ports(container_);
    let proxy = named(&docs, "Service", "edge-hoist-interceptor-proxy");
    assert!(selects(
        &labels(&proxy["spec"]["selector"]),
        &pod_labels(scaler)
    ));
    let (rest, section) = split_interceptor("hoist.toml", config_text(&docs, scaler));
    let section = section.expect("hoist.toml has [interceptor] in-process");
    assert!(section.get("endpoints").is_none());
    assert_eq!(
        port_of(section["http_listen"].as_str().unwrap()),
        ports["http"]
    );
    assert_eq!(service_ports(proxy)["http"].0, ports["http"]);
    for route in section["tcp_routes"].as_array().unwrap() {
        let port = port_of(route["listen"].as_str().unwrap());
        assert_eq!(ports[&format!("tcp-{port}")], port);
        assert_eq!(service_ports(proxy)[&format!("tcp-{port}")].0, port);
    }

    let settings = load_ok("hoist.toml without [interceptor]", &rest);
    // Admin mTLS: kubelet has no client certificate, so no HTTP probe.
    let admin = settings.admin.tls.clone().expect("admin TLS");
    let (ca_volume, ca_key) =
        volume_holding(scaler, admin.client_ca_file.unwrap().to_str().unwrap());
    assert_eq!(
        ca_volume["configMap"]["name"].as_str(),
        values["tls"]["admin"]["clientCA"]["configMapName"].as_str()
    );
    assert_eq!(
        Some(ca_key.as_str()),
        values["tls"]["admin"]["clientCA"]["key"].as_str()
    );
    for (probe, kind_) in probe_kinds(container_) {
        assert!(!kind_.contains("HTTP"), "{probe}: {kind_}");
    }
    // The state file on the claim; a file-based profile on an extra volume.
    let state = settings.state_file.unwrap();
    let (state_volume, _) = volume_holding(scaler, state.to_str().unwrap());
    assert_eq!(
        state_volume["persistentVolumeClaim"]["claimName"].as_str(),
        Some("hoist-state")
    );
    let AuthValue::File { file: secret } = &settings.auth["cache"].params["password"] else {
        panic!("a file reference stays one")
    };
    let (secret_volume, _) = volume_holding(scaler, secret.to_str().unwrap());
    assert_eq!(
        secret_volume["secret"]["secretName"].as_str(),
        Some("hoist-credentials")
    );
}

#[test]
fn every_rendered_config_loads_whole_with_hoists_loader() {
    let defaults = serde_json::to_value(Settings::default()).unwrap();
    let values_yaml = std::fs::read_to_string(root().join(CHART).join("values.yaml")).unwrap();
    let chart_values = parse("values.yaml", &values_yaml);
    assert_eq!(
        port_of(defaults["interceptor"]["http_listen"].as_str().unwrap()),
        chart_values[0]["interceptor"]["httpPort"].as_i64().unwrap(),
        "the chart's HTTP port is hoist's default"
    );
    for (release, file) in [
        ("hoist", "split-tls-auth-values.yaml"),
        ("edge", "in-process-values.yaml"),
    ] {
        let (path, _) = values_file(file);
        let docs = render(release, "keda", &[&path]);
        for deployment in kind(&docs, "Deployment") {
            let source = format!("{file}: {}", name(deployment));
            let settings = load_ok(&source, config_text(&docs, deployment));
            let json = serde_json::to_value(&settings).unwrap();
            let interceptor = &json["interceptor"];
            let split = file.starts_with("split");
            let serve = strings(&container(deployment)["args"])[0] == "serve";
            assert_eq!(
                interceptor["endpoints"].as_array().unwrap().is_empty(),
                !(split && serve),
                "{source}: endpoints only on split mode's scaler"
            );
            assert_eq!(
                interceptor["http_routes"].as_array().unwrap().is_empty(),
                split && serve,
                "{source}: routes where the proxies run"
            );
        }
    }
}

/// With admin mTLS, split interceptors present their channel certificate
/// to follow the route table.
#[test]
fn split_interceptors_follow_an_admin_port_that_wants_client_certificates() {
    let (file, _) = values_file("split-tls-auth-values.yaml");
    let dir = tempfile::tempdir().unwrap();
    let admin_mtls = dir.path().join("admin-mtls.yaml");
    std::fs::write(
        &admin_mtls,
        "tls:\n  admin:\n    clientCA: { secretName: hoist-clients }\n",
    )
    .unwrap();
    let docs = render("hoist", "keda", &[&file, admin_mtls.to_str().unwrap()]);
    check_consistency("admin mTLS", &docs);
    let interceptor = named(&docs, "Deployment", "hoist-interceptor");
    let (_, proxies) = split_interceptor("interceptor.toml", config_text(&docs, interceptor));
    let follow: hoist::config::ClientTlsSettings =
        proxies.unwrap()["tls"].clone().try_into().unwrap();
    follow.validate().unwrap();
    for (file, key) in [
        (follow.cert_file.unwrap(), "tls.crt"),
        (follow.key_file.unwrap(), "tls.key"),
    ] {
        let (volume, inside) = volume_holding(interceptor, file.to_str().unwrap());
        assert_eq!(
            volume["secret"]["secretName"].as_str(),
            Some("hoist-interceptor-tls"),
            "the interceptor's own channel certificate"
        );
        assert_eq!(inside, key);
    }
}

/// By default a config change is reloaded in place; one of a setting hoist
/// reads only at start rolls the pods, through the restart checksum.
#[test]
fn only_settings_read_at_start_roll_the_pods() {
    let dir = tempfile::tempdir().unwrap();
    let checksums = |extra: &str| {
        let file = dir.path().join("extra.yaml");
        std::fs::write(&file, format!("interceptor:\n  mode: split\n{extra}")).unwrap();
        let docs = render("hoist", "keda", &[file.to_str().unwrap()]);
        (
            restart_checksum(named(&docs, "Deployment", "hoist")),
            restart_checksum(named(&docs, "Deployment", "hoist-interceptor")),
        )
    };
    let base = checksums("");
    // Reloaded in place: limits, routes.
    let reloaded = checksums(
        "  httpRoutes:\n    - { name: web, host: web.test, upstream: web.apps.svc.cluster.local:80 }\nconfig:\n  limits:\n    max_tracked_triggers: 7\n",
    );
    assert_eq!(reloaded, base);
    // Read at start: the log (the scaler's), the channel's read timeout
    // (the scaler's), the interceptor's own log.
    let log = checksums("config:\n  log:\n    level: debug\n");
    assert_ne!(log.0, base.0);
    assert_eq!(log.1, base.1, "the interceptor's own config did not change");
    let read_timeout = checksums("  readTimeout: 3s\n");
    assert_ne!(read_timeout.0, base.0);
    let interceptor_log = checksums("  config:\n    log:\n      level: debug\n");
    assert_ne!(interceptor_log.1, base.1);
}

/// The chart's list of settings read at start is hoist's own.
#[test]
fn the_restart_checksum_covers_every_setting_hoist_reads_only_at_start() {
    let helpers =
        std::fs::read_to_string(root().join(CHART).join("templates/_helpers.tpl")).unwrap();
    let start = helpers
        .find("define \"hoist.restartConfigChecksum\"")
        .expect("the checksum template");
    let body = &helpers[start..start + helpers[start..].find("{{- end }}").unwrap()];
    let (top, interceptor) = body.split_once("with .interceptor").unwrap();
    for key in hoist::reload::RESTART_ONLY {
        let (list, leaf) = match key.split_once('.') {
            Some(("interceptor", leaf)) => (interceptor, leaf),
            _ => (top, *key),
        };
        assert!(
            list.contains(&format!("\"{leaf}\"")),
            "`{key}` is read only at start, but the chart's restart checksum leaves it out"
        );
    }
}

#[test]
fn bad_values_fail_the_render_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("interceptor:\n  mode: sideways\n", "interceptor"),
        (
            "auth:\n  a-b:\n    namespaces: [x]\n    c: { secretKeyRef: { name: s, key: k } }\n  a:\n    namespaces: [x]\n    b-c: { secretKeyRef: { name: s, key: k } }\n",
            "AUTH_A_B_C",
        ),
        // A profile is bound to namespaces (docs/credentials.md).
        (
            "auth:\n  orders:\n    password: { secretKeyRef: { name: s, key: k } }\n",
            "namespaces",
        ),
        (
            "auth:\n  orders:\n    namespaces: [Orders]\n    password: x\n",
            "namespaces",
        ),
        (
            "interceptor:\n  mode: split\n  tcpRoutes:\n    - { name: db, listen: nowhere, upstream: db:5432 }\n",
            "listen",
        ),
        // Listeners of one pod on one port crash-loop it.
        (
            "interceptor:\n  mode: inProcess\n  httpPort: 9091\n",
            "port 9091 is used twice",
        ),
        (
            "interceptor:\n  mode: split\n  tcpRoutes:\n    - { name: db, listen: \"0.0.0.0:9091\", upstream: db:5432 }\n",
            "port 9091 is used twice",
        ),
        (
            "interceptor:\n  mode: inProcess\n  declaredTcpPorts: [9090]\n",
            "port 9090 is used twice",
        ),
        // The chart renders allowed_listen_ports from declaredTcpPorts:
        // one given beside it could allow ports the Service does not have.
        (
            "interceptor:\n  mode: split\n  config:\n    interceptor:\n      allowed_listen_ports: { shop: [\"16000\"] }\n",
            "interceptor.config.interceptor.allowed_listen_ports: list the ports in interceptor.declaredTcpPorts",
        ),
        // mTLS needs a certificate on each side of the channel.
        (
            "interceptor:\n  mode: split\n  tls:\n    serverSecretName: interceptor-tls\n",
            "clientSecretName",
        ),
        // Interceptors following the table need a client certificate for
        // an admin port that wants one.
        (
            "tls:\n  admin:\n    secretName: admin-tls\n    clientCA: { secretName: clients }\ninterceptor:\n  mode: split\n",
            "tls.admin.clientCA with interceptor.mode split",
        ),
        // A gRPC rule with no namespace would let every namespace in.
        (
            "networkPolicy:\n  grpc:\n    from: []\n",
            "networkPolicy.grpc.from",
        ),
    ];
    for (i, (values, reason)) in cases.into_iter().enumerate() {
        let file = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&file, values).unwrap();
        let output = helm(&[
            "template",
            "hoist",
            CHART,
            "--values",
            file.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{values}");
        assert!(stderr.contains(reason), "{values}: {stderr}");
    }
    // A bare YAML `off` reads as false, and means off.
    let file = dir.path().join("off.yaml");
    std::fs::write(&file, "interceptor:\n  mode: off\n").unwrap();
    let output = helm(&[
        "template",
        "hoist",
        CHART,
        "--values",
        file.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // No interceptor object (hoist's config still lists the interceptors'
    // ServiceAccount among the admin port's callers: adminAuth).
    let docs = parse("mode off", &String::from_utf8_lossy(&output.stdout));
    assert!(!docs.iter().any(|doc| name(doc).contains("interceptor")));
}

#[test]
fn without_a_state_volume_engine_state_lives_in_memory_not_on_the_read_only_root() {
    let docs = render_with("state:\n  enabled: false\n");
    let scaler = named(&docs, "Deployment", "hoist");
    let settings = load_ok("state.enabled=false", config_text(&docs, scaler));
    assert_eq!(
        settings.state_path(),
        None,
        "state_file = \"\": memory only, no writes to the read-only root"
    );
    let docs = render_with("");
    let settings = load_ok(
        "defaults",
        config_text(&docs, named(&docs, "Deployment", "hoist")),
    );
    assert_eq!(
        settings.state_path().map(|p| p.display().to_string()),
        Some("/var/lib/hoist/state.json".to_string())
    );
}

#[test]
fn the_cluster_domain_is_a_value_not_a_constant() {
    let docs = render_with("clusterDomain: corp.internal\ninterceptor:\n  mode: split\n");
    let scaler = load_ok(
        "scaler",
        config_text(&docs, named(&docs, "Deployment", "hoist")),
    );
    assert_eq!(
        scaler.interceptor.endpoints,
        ["hoist-interceptor.keda.svc.corp.internal:9091"]
    );
    assert_eq!(scaler.interceptor.cluster_domain, "corp.internal");
    // The default sources are the cluster's Services, in its domain.
    assert!(
        scaler
            .limits
            .allowed_sources
            .contains(&"*.svc.corp.internal:*".to_string())
    );
    assert!(
        !scaler
            .limits
            .allowed_sources
            .iter()
            .any(|source| source.contains("cluster.local")),
        "{:?}",
        scaler.limits.allowed_sources
    );
    let interceptor = load_ok(
        "interceptor",
        config_text(&docs, named(&docs, "Deployment", "hoist-interceptor")),
    );
    assert_eq!(
        interceptor.interceptor.scaler.as_deref(),
        Some("hoist.keda.svc.corp.internal:9091")
    );
    assert_eq!(interceptor.interceptor.cluster_domain, "corp.internal");
    let in_process = render_with("clusterDomain: corp.internal\ninterceptor:\n  mode: inProcess\n");
    let settings = load_ok(
        "in-process",
        config_text(&in_process, named(&in_process, "Deployment", "hoist")),
    );
    assert_eq!(settings.interceptor.cluster_domain, "corp.internal");
}

/// Every schema node of values.schema.json that declares properties
/// refuses the others (`additionalProperties: false`), or types them (an
/// auth profile's params): the JSON paths of those that take anything.
fn open_objects(path: &str, schema: &serde_json::Value, out: &mut Vec<String>) {
    match schema {
        serde_json::Value::Object(node) => {
            let others = node.get("additionalProperties");
            let typed = others.is_some_and(|o| o.as_object().is_some_and(|o| !o.is_empty()));
            if node.contains_key("properties") && others != Some(&false.into()) && !typed {
                out.push(path.to_string());
            }
            for (key, child) in node {
                open_objects(&format!("{path}/{key}"), child, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                open_objects(&format!("{path}/{i}"), child, out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_values_schema_refuses_keys_it_does_not_declare() {
    let text = std::fs::read_to_string(root().join(CHART).join("values.schema.json")).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut open = Vec::new();
    open_objects("#", &schema, &mut open);
    assert!(open.is_empty(), "objects taking undeclared keys: {open:?}");

    let dir = tempfile::tempdir().unwrap();
    // A misspelt key at each level fails `helm template` and names the key;
    // spelt right, the same value renders.
    let cases = [
        ("podDisruptionBudget:\n  minAvaliable: 1\n", "minAvaliable"),
        ("replica: 2\n", "replica"),
        (
            "interceptor:\n  declaredTcpPort: [15000]\n",
            "declaredTcpPort",
        ),
        (
            "interceptor:\n  mode: split\n  httpRoutes:\n    - { name: web, host: web.example.com, upstream: web:80, pathPrefix: / }\n",
            "pathPrefix",
        ),
        (
            "tls:\n  admin:\n    clientCA:\n      secret: ca\n",
            "secret",
        ),
        ("monitoring:\n  enable: true\n", "enable"),
        (
            "securityContext:\n  readOnlyRootFileSystem: true\n",
            "readOnlyRootFileSystem",
        ),
        ("resources:\n  limit:\n    memory: 1Gi\n", "limit"),
        (
            "networkPolicy:\n  admin:\n    from:\n      - namespaceSelecter: {}\n",
            "namespaceSelecter",
        ),
    ];
    for (i, (values, key)) in cases.into_iter().enumerate() {
        let file = dir.path().join(format!("typo-{i}.yaml"));
        std::fs::write(&file, values).unwrap();
        let file = file.to_str().unwrap();
        for args in [
            vec!["template", "hoist", CHART, "--values", file],
            vec!["lint", "--strict", CHART, "--values", file],
        ] {
            let output = helm(&args);
            let report = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(!output.status.success(), "helm {args:?} took {values}");
            assert!(report.contains(key), "{values}: {report}");
        }
    }
    let docs = render_with("replicas: 2\npodDisruptionBudget:\n  maxUnavailable: 1\n");
    named(&docs, "PodDisruptionBudget", "hoist");
}

/// What `helm template` is told the cluster serves: the Prometheus
/// Operator's API.
const OPERATOR_API: [&str; 2] = ["--api-versions", "monitoring.coreos.com/v1"];

fn monitors(docs: &[Yaml]) -> Vec<&Yaml> {
    docs.iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Monitor")))
        .collect()
}

/// Each Deployment's pods are scraped by exactly one monitor, on the
/// container port its config's admin listener is, over TLS exactly when
/// that listener has it (checked against the serving Secret's CA, for the
/// name the chart requires the certificate to carry).
fn check_monitors(source: &str, docs: &[Yaml]) {
    let monitors = monitors(docs);
    let deployments = kind(docs, "Deployment");
    assert_eq!(monitors.len(), deployments.len(), "{source}");
    for deployment in deployments {
        let pods = pod_labels(deployment);
        let settings = deployment_settings(docs, deployment);
        let admin_port = i64::from(settings.admin.listen.port());
        let scraping: Vec<(&Yaml, &Yaml)> = monitors
            .iter()
            .filter_map(|monitor| {
                let selector = labels(&monitor["spec"]["selector"]["matchLabels"]);
                let service = monitor["kind"].as_str() == Some("ServiceMonitor");
                let endpoint = &monitor["spec"][if service {
                    "endpoints"
                } else {
                    "podMetricsEndpoints"
                }][0];
                let port = endpoint["port"].as_str().unwrap();
                let reaches = if service {
                    // Through a Service it selects that has the port.
                    kind(docs, "Service").into_iter().any(|svc| {
                        selects(&selector, &labels(&svc["metadata"]["labels"]))
                            && selects(&labels(&svc["spec"]["selector"]), &pods)
                            && service_ports(svc)
                                .get(port)
                                .is_some_and(|(number, target)| {
                                    *number == admin_port
                                        && container_ports(container(deployment)).get(target)
                                            == Some(&admin_port)
                                })
                    })
                } else {
                    selects(&selector, &pods)
                        && container_ports(container(deployment)).get(port) == Some(&admin_port)
                };
                reaches.then_some((*monitor, endpoint))
            })
            .collect();
        assert_eq!(scraping.len(), 1, "{source}: {}", name(deployment));
        let (monitor, endpoint) = scraping[0];
        assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
        // hoist's labels never collide with the target's (tests/validate.rs
        // checks every series): the target's `namespace` and `pod` stay.
        assert_eq!(endpoint["honorLabels"].as_bool(), Some(false));
        assert_eq!(
            strings(&monitor["spec"]["namespaceSelector"]["matchNames"]),
            [monitor["metadata"]["namespace"].as_str().unwrap()]
        );
        match &settings.admin.tls {
            None => assert_eq!(endpoint["scheme"].as_str(), Some("http"), "{source}"),
            Some(tls) => {
                assert_eq!(endpoint["scheme"].as_str(), Some("https"), "{source}");
                let (serving, _) = volume_holding(deployment, tls.cert_file.to_str().unwrap());
                let ca = &endpoint["tlsConfig"]["ca"]["secret"];
                assert_eq!(ca["name"], serving["secret"]["secretName"], "{source}");
                assert_eq!(ca["key"].as_str(), Some("ca.crt"));
                assert_eq!(
                    endpoint["tlsConfig"]["serverName"].as_str(),
                    Some(format!("{}.keda.svc", name(deployment)).as_str())
                );
            }
        }
    }
}

#[test]
fn monitors_scrape_every_hoist_process_where_the_prometheus_operator_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let split = file("split.yaml", "interceptor:\n  mode: split\n");
    let pods = file("pods.yaml", "monitoring:\n  kind: PodMonitor\n");
    let (tls, _) = values_file("split-tls-auth-values.yaml");
    let (in_process, _) = values_file("in-process-values.yaml");
    // `auto`: none where the cluster does not serve the API.
    assert!(monitors(&render("hoist", "keda", &[&split])).is_empty());
    for values in [
        vec![],
        vec![split.as_str()],
        vec![split.as_str(), pods.as_str()],
        vec![tls.as_str()],
        vec![tls.as_str(), pods.as_str()],
        vec![in_process.as_str()],
    ] {
        let release = if values.contains(&in_process.as_str()) {
            "edge"
        } else {
            "hoist"
        };
        let docs = render_args(release, "keda", &values, &OPERATOR_API);
        check_monitors(&format!("{values:?}"), &docs);
    }
    // Forced either way, and labelled for a Prometheus' selector.
    let off = file("off.yaml", "monitoring:\n  enabled: false\n");
    assert!(monitors(&render_args("hoist", "keda", &[&off], &OPERATOR_API)).is_empty());
    let on = file(
        "on.yaml",
        "monitoring:\n  enabled: true\n  labels: { release: kube-prometheus-stack }\n",
    );
    let docs = render("hoist", "keda", &[&on, &split]);
    check_monitors("enabled: true", &docs);
    for monitor in monitors(&docs) {
        assert_eq!(
            labels(&monitor["metadata"]["labels"])["release"],
            "kube-prometheus-stack"
        );
    }
}

/// A TCP route ScaledObject `shop/db` declares with `listenPort: port`.
fn declared_tcp_route(port: u16) -> RouteSpec {
    let owner = Owner {
        namespace: "shop".to_string(),
        name: "db".to_string(),
    };
    RouteSpec {
        name: RouteSpec::declared_name(Protocol::Tcp, &owner),
        protocol: Protocol::Tcp,
        owner: Some(owner),
        hosts: Vec::new(),
        path_prefix: None,
        listen: Some(Listen::Port(port)),
        upstream: "db.shop.svc.cluster.local:5432".to_string(),
        upstream_http2: false,
        cold_start_timeout: None,
        response_timeout: None,
    }
}

/// Whether hoist, with `settings`, takes a declared TCP route on `port`;
/// a refusal must name the setting that refuses it.
fn takes_declared_port(source: &str, settings: &Settings, port: u16) -> bool {
    let rules = RouteRules {
        interceptor: settings.interceptor.clone(),
        config_routes: Vec::new(),
    };
    match rules.allows(&declared_tcp_route(port)) {
        Ok(()) => true,
        Err(refused) => {
            assert!(
                refused
                    .to_string()
                    .contains("interceptor.allowed_listen_ports"),
                "{source}: port {port}: {refused}"
            );
            false
        }
    }
}

#[test]
fn declared_tcp_ports_are_on_the_proxy_service_and_are_the_only_ones_hoist_takes() {
    for mode in ["inProcess", "split"] {
        let docs = render_with(&format!(
            "interceptor:\n  mode: {mode}\n  declaredTcpPorts: [15000, 15010]\n  tcpRoutes:\n    - {{ name: db, listen: \"0.0.0.0:5432\", upstream: db.default.svc.cluster.local:5432 }}\n"
        ));
        // Service ports land on the proxies' container ports (and the
        // NetworkPolicy names them): checked for every port here.
        check_consistency(mode, &docs);
        let proxy = named(&docs, "Service", "hoist-interceptor-proxy");
        let proxies = named(
            &docs,
            "Deployment",
            if mode == "split" {
                "hoist-interceptor"
            } else {
                "hoist"
            },
        );
        let policy = named(&docs, "NetworkPolicy", name(proxies));
        for port in [5432, 15000, 15010] {
            let port_name = format!("tcp-{port}");
            assert_eq!(service_ports(proxy)[&port_name].0, port, "{mode}");
            assert_eq!(container_ports(container(proxies))[&port_name], port);
            assert_eq!(allowed_from(policy, &port_name), None, "anyone's traffic");
        }
        // Whoever decides on declared routes (the scaler, and a split
        // interceptor checking the scaler's table) takes those ports only.
        for deployment in kind(&docs, "Deployment") {
            let source = format!("{mode}: {}", name(deployment));
            let settings = deployment_settings(&docs, deployment);
            assert!(takes_declared_port(&source, &settings, 15000));
            assert!(takes_declared_port(&source, &settings, 15010));
            assert!(!takes_declared_port(&source, &settings, 15001), "{source}");
            assert!(!takes_declared_port(&source, &settings, 5433), "{source}");
        }
        // None listed: no declared TCP route at all (hoist's own default
        // would take any port from 1024, which no Service reaches).
        let docs = render_with(&format!("interceptor:\n  mode: {mode}\n"));
        for deployment in kind(&docs, "Deployment") {
            let source = format!("{mode} without declaredTcpPorts: {}", name(deployment));
            let settings = deployment_settings(&docs, deployment);
            assert!(!takes_declared_port(&source, &settings, 15000), "{source}");
        }
    }
}

/// `helm template hoist` in `keda` with these values (YAML text).
fn render_with(values: &str) -> Vec<Yaml> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    render("hoist", "keda", &[file.to_str().unwrap()])
}

/// The `from` of the policy's rule for `port`: None when the rule lets
/// every pod in, panics when no rule names the port.
fn allowed_from(policy: &Yaml, port: &str) -> Option<Vec<serde_json::Value>> {
    let rule = list(&policy["spec"]["ingress"])
        .iter()
        .find(|rule| {
            list(&rule["ports"])
                .iter()
                .any(|p| p["port"].as_str() == Some(port))
        })
        .unwrap_or_else(|| panic!("{}: no rule for {port}", name(policy)));
    rule["from"]
        .as_vec()
        .map(|from| from.iter().map(json).collect())
}

fn names_port(policy: &Yaml, port: &str) -> bool {
    list(&policy["spec"]["ingress"])
        .iter()
        .flat_map(|rule| list(&rule["ports"]))
        .any(|p| p["port"].as_str() == Some(port))
}

#[test]
fn network_policies_let_in_keda_the_interceptors_and_monitoring_by_default() {
    let keda = serde_json::json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
        "podSelector": {"matchLabels": {"app": "keda-operator"}},
    });
    let monitoring = serde_json::json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    });
    let chart = render("hoist", "keda", &[]);
    let policies = kind(&chart, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "hoist's only, no interceptors");
    let scaler = named(&chart, "NetworkPolicy", "hoist");
    assert_eq!(allowed_from(scaler, "grpc"), Some(vec![keda.clone()]));
    assert_eq!(
        allowed_from(scaler, "admin"),
        Some(vec![monitoring.clone()])
    );
    // The shipped manifests: the same gRPC rule; the admin port from the
    // split interceptors of interceptor.yaml too.
    let plain = documents("deploy/kubernetes");
    let shipped = named(&plain, "NetworkPolicy", "hoist");
    assert_eq!(allowed_from(shipped, "grpc"), Some(vec![keda.clone()]));
    assert_eq!(
        allowed_from(shipped, "admin").unwrap().last(),
        Some(&monitoring)
    );

    // Split: each side's admin port takes the other side's pods; the
    // proxies take anyone.
    let (file, _) = values_file("split-tls-auth-values.yaml");
    let split = render("hoist", "keda", &[&file]);
    check_consistency(&file, &split);
    let pods_of = |deployment: &str| serde_json::json!({"podSelector": {"matchLabels": json(&named(&split, "Deployment", deployment)["spec"]["selector"]["matchLabels"])}});
    let scaler = named(&split, "NetworkPolicy", "hoist");
    assert_eq!(
        allowed_from(scaler, "admin"),
        Some(vec![pods_of("hoist-interceptor"), monitoring.clone()])
    );
    let interceptor = named(&split, "NetworkPolicy", "hoist-interceptor");
    assert_eq!(
        allowed_from(interceptor, "admin"),
        Some(vec![pods_of("hoist"), monitoring.clone()])
    );
    let proxies = container_ports(container(named(&split, "Deployment", "hoist-interceptor")));
    for port in proxies.keys().filter(|p| *p != "admin") {
        assert_eq!(allowed_from(interceptor, port), None, "{port} is open");
    }
    assert!(!names_port(interceptor, "grpc"));

    // In process: hoist's own pods run the proxies, open to anyone.
    let (file, _) = values_file("in-process-values.yaml");
    let edge = render("edge", "apps", &[&file]);
    let policy = named(&edge, "NetworkPolicy", "edge-hoist");
    assert_eq!(allowed_from(policy, "http"), None);
    assert_eq!(allowed_from(policy, "tcp-1883"), None);
    assert_eq!(allowed_from(policy, "grpc"), Some(vec![keda]));
}

#[test]
fn network_policies_follow_their_values_and_go_when_turned_off() {
    let off = render_with("networkPolicy:\n  enabled: false\ninterceptor:\n  mode: split\n");
    assert!(kind(&off, "NetworkPolicy").is_empty());

    let open = render_with(
        "networkPolicy:\n  grpc:\n    restrict: false\n  admin:\n    restrict: false\ninterceptor:\n  mode: split\n",
    );
    check_consistency("restrict: false", &open);
    let scaler = named(&open, "NetworkPolicy", "hoist");
    assert_eq!(allowed_from(scaler, "grpc"), None, "gRPC open to every pod");
    assert_eq!(allowed_from(scaler, "admin"), None);
    assert_eq!(
        allowed_from(named(&open, "NetworkPolicy", "hoist-interceptor"), "admin"),
        None
    );

    let custom = render_with(
        "networkPolicy:\n  grpc:\n    from:\n      - namespaceSelector: { matchLabels: { team: platform } }\n        podSelector: { matchLabels: { app.kubernetes.io/name: keda-operator } }\n  admin:\n    from:\n      - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: observability } }\n        podSelector: { matchLabels: { app: prometheus } }\n",
    );
    check_consistency("custom peers", &custom);
    let scaler = named(&custom, "NetworkPolicy", "hoist");
    assert_eq!(
        allowed_from(scaler, "grpc"),
        Some(vec![serde_json::json!({
            "namespaceSelector": {"matchLabels": {"team": "platform"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}},
        })]),
        "a list given replaces the default whole"
    );
    assert_eq!(
        allowed_from(scaler, "admin"),
        Some(vec![serde_json::json!({
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}},
        })])
    );

    // Nobody to let in on the admin port: no rule, so the port is closed
    // (an empty `from` would open it to everyone).
    let closed = render_with("networkPolicy:\n  admin:\n    from: []\n");
    check_consistency("no monitoring", &closed);
    assert!(!names_port(
        named(&closed, "NetworkPolicy", "hoist"),
        "admin"
    ));
}

#[test]
fn admin_auth_is_on_by_default_and_off_leaves_no_tokens_or_rbac_for_it() {
    let chart = render("hoist", "keda", &[]);
    let settings = deployment_settings(&chart, named(&chart, "Deployment", "hoist"));
    let auth = &settings.admin.auth;
    assert_eq!(auth.require, hoist::config::Require::Always);
    assert_eq!(
        auth.allowed_callers,
        [
            "system:serviceaccount:keda:hoist",
            "system:serviceaccount:keda:hoist-interceptor"
        ]
    );
    assert_eq!(auth.audiences, ["hoist"]);

    // Split: the interceptors check the scaler's token, with a role for it.
    let split = render_with(
        "interceptor:\n  mode: split\nadminAuth:\n  allowedCallers: [\"system:serviceaccount:monitoring:*\"]\n",
    );
    check_consistency("split, adminAuth", &split);
    let interceptor = named(&split, "Deployment", "hoist-interceptor");
    let settings = deployment_settings(&split, interceptor);
    assert!(
        settings
            .admin
            .auth
            .allowed_callers
            .contains(&"system:serviceaccount:monitoring:*".to_string())
    );
    assert!(
        bound_service_accounts("split", &split)
            .contains(&("keda".to_string(), "hoist-interceptor".to_string()))
    );

    let off = render_with(
        "interceptor:\n  mode: split\n  directToPods: false\nadminAuth:\n  enabled: false\n",
    );
    check_consistency("adminAuth off", &off);
    for deployment in kind(&off, "Deployment") {
        let settings = deployment_settings(&off, deployment);
        assert_eq!(
            settings.admin.auth,
            Default::default(),
            "{}",
            name(deployment)
        );
        assert!(
            !list(&pod_spec(deployment)["volumes"])
                .iter()
                .any(|v| v["name"].as_str() == Some("admin-token"))
        );
    }
    assert_eq!(
        pod_spec(named(&off, "Deployment", "hoist-interceptor"))["automountServiceAccountToken"]
            .as_bool(),
        Some(false)
    );
    assert!(try_named(&off, "ClusterRole", "hoist-interceptor").is_none());
    let rules = json(&named(&off, "ClusterRole", "hoist")["rules"]).to_string();
    assert!(!rules.contains("tokenreviews"), "{rules}");
}

/// `interceptor.directToPods` (on by default): whichever pods run the
/// proxies may list and watch Services and EndpointSlices, get a token to
/// do it with, and their config turns `direct_to_pods` on; off, none of
/// that.
#[test]
fn direct_to_pods_grants_its_reads_to_whichever_pods_run_the_proxies() {
    let reads_pods = |docs: &[Yaml], role: &str| {
        let Some(role) = try_named(docs, "ClusterRole", role) else {
            return false;
        };
        let rules = list(&role["rules"]);
        let grants = |group: &str, resource: &str| {
            rules.iter().any(|rule| {
                strings(&rule["apiGroups"]).contains(&group)
                    && strings(&rule["resources"]).contains(&resource)
                    && strings(&rule["verbs"]) == ["list", "watch"]
            })
        };
        grants("", "services") && grants("discovery.k8s.io", "endpointslices")
    };
    let automounts = |docs: &[Yaml], deployment: &str| {
        pod_spec(named(docs, "Deployment", deployment))["automountServiceAccountToken"].as_bool()
    };
    for (mode, runs_proxies, bystander) in [
        ("inProcess", "hoist", None),
        ("split", "hoist-interceptor", Some("hoist")),
    ] {
        for direct in [true, false] {
            let docs = render_with(&format!(
                "interceptor:\n  mode: {mode}\n  directToPods: {direct}\nadminAuth:\n  enabled: false\n"
            ));
            check_consistency(mode, &docs);
            assert_eq!(reads_pods(&docs, runs_proxies), direct, "{mode}, {direct}");
            if let Some(bystander) = bystander {
                assert!(
                    !reads_pods(&docs, bystander),
                    "{mode}: only the proxies read pods"
                );
            }
            let settings = deployment_settings(&docs, named(&docs, "Deployment", runs_proxies));
            assert_eq!(settings.interceptor.direct_to_pods, direct, "{mode}");
            if direct {
                assert_eq!(automounts(&docs, runs_proxies), Some(true), "{mode}");
            }
        }
    }
    assert_eq!(
        automounts(
            &render_with(
                "interceptor:\n  mode: split\n  directToPods: false\nadminAuth:\n  enabled: false\n"
            ),
            "hoist-interceptor"
        ),
        Some(false)
    );
}

/// `kubernetes.triggerAuthentication`: off by default (hoist reads no
/// Secret); on, the ClusterRole grants what the resolver watches and the
/// config turns it on.
#[test]
fn trigger_authentication_grants_its_rbac_and_sets_the_config_key() {
    let secrets_rule = |docs: &[Yaml]| {
        list(&named(docs, "ClusterRole", "hoist")["rules"])
            .iter()
            .any(|rule| strings(&rule["resources"]).contains(&"secrets"))
    };
    let defaults = render("hoist", "keda", &[]);
    assert!(!secrets_rule(&defaults));
    let settings = load_ok(
        "defaults",
        config_text(&defaults, named(&defaults, "Deployment", "hoist")),
    );
    assert!(!settings.kubernetes.trigger_authentication);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trigger-auth.yaml");
    std::fs::write(
        &file,
        "kubernetes:\n  triggerAuthentication: true\n  clusterObjectNamespace: keda-system\n",
    )
    .unwrap();
    let docs = render("hoist", "keda", &[file.to_str().unwrap()]);
    let rules = list(&named(&docs, "ClusterRole", "hoist")["rules"]);
    let granted = |resource: &str| {
        rules.iter().any(|rule| {
            strings(&rule["resources"]).contains(&resource)
                && strings(&rule["verbs"]) == ["list", "watch"]
        })
    };
    for resource in [
        "triggerauthentications",
        "clustertriggerauthentications",
        "secrets",
    ] {
        assert!(granted(resource), "{resource}: {rules:?}");
    }
    let settings = load_ok(
        "triggerAuthentication",
        config_text(&docs, named(&docs, "Deployment", "hoist")),
    );
    assert!(settings.kubernetes.trigger_authentication);
    assert_eq!(settings.kubernetes.cluster_object_namespace, "keda-system");
}

/// `docs/BENCHMARKS.md`'s "Memory per tracked trigger" table: RSS at start
/// (MiB), KiB per tracked trigger in the larger shape (a poller each), and
/// bytes of memory per byte of tracked metadata.
fn documented_memory() -> (f64, f64, f64) {
    let doc = std::fs::read_to_string(root().join("docs/BENCHMARKS.md")).unwrap();
    let row = |label: &str| -> f64 {
        let line = doc
            .lines()
            .find(|line| line.starts_with(&format!("| {label} |")))
            .unwrap_or_else(|| panic!("docs/BENCHMARKS.md has no `{label}` row"));
        let cell = line.split('|').nth(2).unwrap().trim();
        let number = cell.split_whitespace().next().unwrap().replace(',', "");
        number
            .parse()
            .unwrap_or_else(|_| panic!("`{label}`: not a number: {cell}"))
    };
    (
        row("RSS at start"),
        row("per tracked trigger, a poller each"),
        row("per byte of tracked metadata"),
    )
}

/// A Kubernetes memory quantity (`256Mi`, `1Gi`) in MiB.
fn mebibytes(quantity: &str) -> f64 {
    let (number, unit) = quantity.split_at(quantity.find(|c: char| c.is_alphabetic()).unwrap());
    let number: f64 = number.parse().unwrap();
    match unit {
        "Mi" => number,
        "Gi" => number * 1024.0,
        other => panic!("unexpected memory unit {other} in {quantity}"),
    }
}

/// The container named `name` anywhere in `yaml`.
fn container_named<'a>(yaml: &'a Yaml, name: &str) -> Option<&'a Yaml> {
    match yaml {
        Yaml::Hash(map) => {
            if yaml["name"].as_str() == Some(name) && !yaml["resources"].is_badvalue() {
                return Some(yaml);
            }
            map.values().find_map(|value| container_named(value, name))
        }
        Yaml::Array(items) => items.iter().find_map(|item| container_named(item, name)),
        _ => None,
    }
}

/// Every deploy path's hoist admits no more triggers and metadata than its
/// memory limit holds, by the documented figures, with 20 % to spare
/// (arithmetic on documented numbers, not a measurement).
#[test]
fn memory_limits_hold_what_the_config_admits() {
    let (base, per_trigger_kib, per_metadata_byte) = documented_memory();
    let check = |what: &str, limit: &str, settings: &Settings| {
        let limits = &settings.limits;
        let triggers = limits.max_tracked_triggers as f64 * per_trigger_kib / 1024.0;
        let metadata = limits.max_tracked_metadata_bytes as f64 * per_metadata_byte / 1_048_576.0;
        let needed = base + triggers + metadata;
        let budget = 0.8 * mebibytes(limit);
        assert!(
            needed <= budget,
            "{what}: {base} MiB + {} triggers ({triggers:.0} MiB) + {} metadata bytes ({metadata:.0} MiB) = {needed:.0} MiB, over 80 % of {limit}",
            limits.max_tracked_triggers,
            limits.max_tracked_metadata_bytes,
        );
    };
    let memory_limit = |container: &Yaml| {
        container["resources"]["limits"]["memory"]
            .as_str()
            .expect("a memory limit")
            .to_string()
    };

    let chart = render("hoist", "keda", &[]);
    let deployment = named(&chart, "Deployment", "hoist");
    let settings = load_ok("chart", config_text(&chart, deployment));
    check(
        "chart defaults",
        &memory_limit(container(deployment)),
        &settings,
    );

    let plain = documents("deploy/kubernetes");
    let deployment = named(&plain, "Deployment", "hoist");
    let settings = load_ok("hoist.yaml", config_text(&plain, deployment));
    check(
        "deploy/kubernetes",
        &memory_limit(container(deployment)),
        &settings,
    );

    // The sidecar: its ConfigMap, and the container the patch adds (the
    // Helm values' copy is held to the patch by tests/validate.rs).
    let read = |file: &str| std::fs::read_to_string(root().join(file)).unwrap();
    let config_map = parse(
        "hoist-config.yaml",
        &read("deploy/keda-sidecar/hoist-config.yaml"),
    );
    let toml = config_map[0]["data"]["hoist.toml"].as_str().unwrap();
    let patch = parse(
        "keda-operator-patch.yaml",
        &read("deploy/keda-sidecar/keda-operator-patch.yaml"),
    );
    let sidecar = container_named(&patch[0], "hoist").expect("hoist's container");
    check(
        "keda-sidecar",
        &memory_limit(sidecar),
        &load_ok("sidecar", toml),
    );
    let values = parse(
        "keda-values.yaml",
        &read("deploy/keda-sidecar/keda-values.yaml"),
    );
    let in_values = values[0]["extraObjects"]
        .as_vec()
        .into_iter()
        .flatten()
        .find_map(|object| object["data"]["hoist.toml"].as_str())
        .expect("hoist's config in keda-values.yaml");
    check(
        "keda-values",
        &memory_limit(sidecar),
        &load_ok("keda-values", in_values),
    );
}

/// Split mode without tls.admin: the interceptors would take their route
/// table over plain HTTP from whoever answers as hoist's admin Service.
/// By default the chart makes the admin port a certificate of its own
/// (a CA and a certificate for <fullname>.<namespace>.svc) and the
/// interceptors check it; `routeTableTLS: none` is plain, by choice.
#[test]
fn split_interceptors_check_who_serves_the_route_table_by_default() {
    use base64::Engine;
    let docs = render_with("interceptor:\n  mode: split\n");
    check_consistency("split defaults", &docs);
    let secret = named(&docs, "Secret", "hoist-admin-tls");
    assert_eq!(secret["type"].as_str(), Some("kubernetes.io/tls"));
    let dir = tempfile::tempdir().unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        let encoded = secret["data"][key].as_str().expect(key);
        let pem = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        std::fs::write(dir.path().join(key), pem).unwrap();
    }
    let scaler = load_ok(
        "scaler",
        config_text(&docs, named(&docs, "Deployment", "hoist")),
    );
    let served = scaler.admin.tls.expect("hoist's admin port serves TLS");
    let (volume, inside) = volume_holding(
        named(&docs, "Deployment", "hoist"),
        served.cert_file.to_str().unwrap(),
    );
    assert_eq!(
        volume["secret"]["secretName"].as_str(),
        Some("hoist-admin-tls")
    );
    assert_eq!(inside, "tls.crt");
    let interceptor = named(&docs, "Deployment", "hoist-interceptor");
    let (_, proxies) = split_interceptor("interceptor.toml", config_text(&docs, interceptor));
    let follow: hoist::config::ClientTlsSettings =
        proxies.unwrap()["tls"].clone().try_into().unwrap();
    assert_eq!(follow.server_name.as_deref(), Some("hoist.keda.svc"));
    let (volume, inside) = volume_holding(interceptor, follow.ca_file.to_str().unwrap());
    assert_eq!(
        volume["secret"]["secretName"].as_str(),
        Some("hoist-admin-tls")
    );
    assert_eq!(inside, "ca.crt");
    // What the chart made loads as hoist loads it, on both ends.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let cancel = tokio_util::sync::CancellationToken::new();
        let files = hoist::config::TlsSettings {
            cert_file: dir.path().join("tls.crt"),
            key_file: dir.path().join("tls.key"),
            ..served.clone()
        };
        hoist::tls::admin_acceptor(&files, cancel.clone()).expect("hoist serves the certificate");
        let checking = hoist::config::ClientTlsSettings {
            ca_file: dir.path().join("ca.crt"),
            ..follow.clone()
        };
        hoist::tls::ClientTls::new(&checking).expect("the interceptors check against the CA");
        cancel.cancel();
    });

    let plain = render_with("interceptor:\n  mode: split\n  routeTableTLS: none\n");
    check_consistency("split, plain route table", &plain);
    assert!(
        !plain
            .iter()
            .any(|doc| doc["kind"].as_str() == Some("Secret")
                && doc["metadata"]["name"].as_str() == Some("hoist-admin-tls")),
        "no certificate made"
    );
    let interceptor = named(&plain, "Deployment", "hoist-interceptor");
    let (_, proxies) = split_interceptor("interceptor.toml", config_text(&plain, interceptor));
    assert!(proxies.unwrap().get("tls").is_none(), "plain by choice");
}
