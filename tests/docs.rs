//! The docs say what ships, and stay so:
//! - every config key hoist accepts is in docs/configuration.md's
//!   reference table and in deploy/examples/hoist.toml (which says it shows
//!   every setting), and neither names a key hoist refuses. The key list is
//!   derived from the config types themselves, by asking hoist's own
//!   deserializer: a struct answers an unknown key with the list of its
//!   fields (`deny_unknown_fields`), a list or a map says so by what it
//!   expects instead, anything else is a leaf. A new field is therefore a
//!   new key here without anyone listing it;
//! - deploy/README.md names every panel of the dashboard and every alert
//!   of the PrometheusRule, and docs/operating.md every alert. (That
//!   docs/operating.md lists every metric a live hoist exports is checked
//!   where a live hoist runs: tests/validate.rs.)
//! - every address a YAML snippet of the docs names is one the shipped
//!   config allows, and every KEDA object they show (trigger lists taken
//!   as ScaledObjects) is valid against KEDA's CRDs (that hoist accepts
//!   each is checked where a hoist runs: tests/validate.rs);
//! - every relative link and `#anchor` of the docs resolves (`links.rs`);
//! - docs/troubleshooting.md has an entry for every error type a user
//!   meets, and every message it quotes is one the code can produce
//!   (`errors.rs`);
//! - every trigger page lists every key its parser reads, with the
//!   parser's default (`keys.rs`);
//! - every number a README link quotes is in the section it links
//!   (`numbers.rs`); README's five-minute try runs in tests/readme_try.rs;
//! - docs/interceptor.md's Ingress and Gateway reach the proxy Service the
//!   manifests and the chart make, by its name, namespace and port.

#[path = "docs/errors.rs"]
mod errors;
#[path = "docs/keys.rs"]
mod keys;
#[path = "docs/links.rs"]
mod links;
mod manifests;
#[path = "docs/numbers.rs"]
mod numbers;

use std::collections::BTreeSet;

use hoist::config::{Overrides, Settings, SourcePattern};
use manifests::{crds, root, snippets};
use serde::Deserialize;
use toml::{Table, Value};

/// One step of a path into the config.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Key(String),
    /// An element of a list (`[[interceptor.http_routes]]`): not named.
    Element,
    /// Any key of a map whose keys are the user's (`auth.<profile>`).
    AnyKey,
}

const PROBE: &str = "hoist_probe";

/// `value` placed at `path` in an otherwise empty config, as hoist reads
/// it: the error message, if any.
fn try_at(path: &[Step], value: Value) -> Result<(), String> {
    let mut value = value;
    for step in path.iter().rev() {
        value = match step {
            Step::Key(key) => Value::Table(Table::from_iter([(key.clone(), value)])),
            Step::Element => Value::Array(vec![value]),
            Step::AnyKey => Value::Table(Table::from_iter([(PROBE.to_string(), value)])),
        };
    }
    Settings::deserialize(value)
        .map(drop)
        .map_err(|e| e.message().to_string())
}

/// A table with one unknown key.
fn probe_table(value: Value) -> Value {
    Value::Table(Table::from_iter([(PROBE.to_string(), value)]))
}

/// The fields a struct lists when it refuses an unknown key, without the
/// aliases (`stateFile` beside `state_file`).
fn struct_fields(message: &str) -> Option<Vec<String>> {
    let rest = message.strip_prefix(&format!("unknown field `{PROBE}`"))?;
    let fields: Vec<String> = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    let snake = |name: &str| {
        name.chars().fold(String::new(), |mut out, c| {
            if c.is_ascii_uppercase() {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            out
        })
    };
    Some(
        fields
            .iter()
            .filter(|f| !(f.chars().any(|c| c.is_ascii_uppercase()) && fields.contains(&snake(f))))
            .cloned()
            .collect(),
    )
}

/// A key as the docs write it: `auth.<*>.namespaces`.
fn key_name(path: &[Step]) -> String {
    path.iter()
        .filter_map(|step| match step {
            Step::Key(key) => Some(key.clone()),
            Step::Element => None,
            Step::AnyKey => Some("<*>".to_string()),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Every leaf key at or below `path`.
fn walk(path: Vec<Step>, keys: &mut BTreeSet<String>) {
    assert!(path.len() < 10, "no end below {}", key_name(&path));
    let with = |step: Step| {
        let mut longer = path.clone();
        longer.push(step);
        longer
    };
    match try_at(&path, probe_table(Value::Boolean(true))) {
        Err(message) if struct_fields(&message).is_some() => {
            for field in struct_fields(&message).unwrap_or_default() {
                walk(with(Step::Key(field)), keys);
            }
        }
        Err(message) if message.contains("invalid type: map, expected a sequence") => {
            walk(with(Step::Element), keys);
        }
        // The map took the key, then refused the value: a map.
        Err(message) if message.starts_with("invalid type: boolean `true`") => {
            walk(with(Step::AnyKey), keys);
        }
        // A map whose values are strings, or other leaves, takes a string.
        _ if try_at(&path, probe_table(Value::String("x".into()))).is_ok() => {
            keys.insert(key_name(&with(Step::AnyKey)));
        }
        _ => {
            keys.insert(key_name(&path));
        }
    }
}

/// Every key hoist's config accepts, derived from its types.
fn config_keys() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    walk(Vec::new(), &mut keys);
    // A struct with a flattened map (an auth profile's params beside
    // `namespaces`) lists no fields: its one named field, checked here.
    let profile: Settings =
        toml::from_str("[auth.p]\nnamespaces = [\"a\"]\nparam = \"x\"\n").unwrap();
    assert!(profile.auth["p"].namespaces.is_some());
    keys.insert("auth.<*>.namespaces".to_string());
    keys
}

/// Whether documented key `doc` (placeholders `<...>`, a trailing `*`)
/// names derived key `key`. A map of plain values is one key in the docs:
/// `interceptor.allowed_hosts` for `interceptor.allowed_hosts.<*>`.
fn names(doc: &str, key: &str) -> bool {
    let doc: Vec<&str> = doc.split('.').collect();
    let mut key: Vec<&str> = key.split('.').collect();
    if doc.last() == Some(&"*") {
        return key.len() >= doc.len()
            && segments_match(&doc[..doc.len() - 1], &key[..doc.len() - 1]);
    }
    if segments_match(&doc, &key) {
        return true;
    }
    while key.last() == Some(&"<*>") {
        key.pop();
    }
    segments_match(&doc, &key)
}

/// Same length, and each segment equal or a placeholder (`<profile>`,
/// `<*>`) on either side: a map key matches a map key.
fn segments_match(doc: &[&str], key: &[&str]) -> bool {
    let placeholder = |s: &str| s.starts_with('<') && s.ends_with('>');
    doc.len() == key.len()
        && doc
            .iter()
            .zip(key)
            .all(|(d, k)| d == k || placeholder(d) || placeholder(k))
}

/// The keys of docs/configuration.md's reference table: the backticked
/// names of each row's first cell; `.key_file` after `grpc.tls.cert_file`
/// is `grpc.tls.key_file`; an alias is not a key.
fn reference_keys() -> BTreeSet<String> {
    let page = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let section = page
        .split("\n## Every key\n")
        .nth(1)
        .expect("docs/configuration.md has its table under `## Every key`")
        .split("\n## ")
        .next()
        .unwrap();
    let alias = regex::Regex::new(r"\(alias `[^`]*`\)").unwrap();
    let mut keys = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cell = alias.replace_all(row.split('|').nth(1).unwrap(), "");
        let mut previous = String::new();
        for name in cell.split('`').skip(1).step_by(2) {
            let full = match name.strip_prefix('.') {
                Some(last) => match previous.rsplit_once('.') {
                    Some((parent, _)) => format!("{parent}.{last}"),
                    None => panic!("`{name}` follows no key in: {row}"),
                },
                None => name.to_string(),
            };
            previous = full.clone();
            keys.insert(full);
        }
    }
    assert!(keys.len() > 40, "{keys:?}");
    keys
}

/// The keys deploy/examples/hoist.toml sets or shows commented out
/// (`# key = value` under a header, itself set or commented out): every
/// path to a table or a value, map keys as written.
fn example_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("deploy/examples/hoist.toml")).unwrap();
    let mut keys = BTreeSet::new();
    let table: Table = toml::from_str(&text).unwrap();
    collect(&mut String::new(), &Value::Table(table), &mut keys);
    let header = regex::Regex::new(r"^#?\s*\[\[?([^\]]+)\]\]?\s*$").unwrap();
    let commented = regex::Regex::new(r"^#\s*([A-Za-z_]+)\s*=").unwrap();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(found) = header.captures(line) {
            section = found[1].trim().to_string();
        } else if let Some(found) = commented.captures(line) {
            let key = &found[1];
            keys.insert(if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            });
        }
    }
    keys
}

fn collect(path: &mut String, value: &Value, keys: &mut BTreeSet<String>) {
    let children: Vec<(&str, &Value)> = match value {
        Value::Table(table) => table.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        Value::Array(items) => {
            for item in items.iter().filter(|i| i.is_table()) {
                collect(path, item, keys);
            }
            return;
        }
        _ => return,
    };
    for (key, child) in children {
        let longer = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        keys.insert(longer.clone());
        collect(&mut longer.clone(), child, keys);
    }
}

#[test]
fn every_config_key_is_in_the_reference_table_and_the_example_config() {
    let keys = config_keys();
    // The derivation finds what it must: nested structs, options, lists of
    // tables, maps.
    for expected in [
        "grpc.tls.client_ca_file",
        "interceptor.tls.server_name",
        "interceptor.http_routes.path_prefix",
        "interceptor.allowed_hosts.<*>",
        "auth.<*>.<*>",
        "shutdown.grace",
        "state_file",
    ] {
        assert!(keys.contains(expected), "{expected} not in {keys:?}");
    }
    assert!(!keys.contains("stateFile"), "aliases are not keys");

    let reference = reference_keys();
    let missing = unmatched(&keys, &reference, |key, doc| names(doc, key));
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md's reference: {missing:?}"
    );
    let stale = unmatched(&reference, &keys, names);
    assert!(
        stale.is_empty(),
        "docs/configuration.md documents keys hoist refuses: {stale:?}"
    );

    let example = example_keys();
    let missing = unmatched(&keys, &example, |key, shown| {
        segments_match(&split(key), &split(shown)) || names(shown, key)
    });
    assert!(
        missing.is_empty(),
        "not in deploy/examples/hoist.toml: {missing:?}"
    );
    // What it shows is hoist's: set keys load, and a commented-out key is
    // one hoist has (or a table on the way to one, or a value inside one).
    let file = root().join("deploy/examples/hoist.toml");
    Settings::load(Some(&file), Vec::new(), &Overrides::default()).unwrap();
    let unknown: Vec<&String> = example
        .iter()
        .filter(|shown| {
            !keys.iter().any(|key| {
                let (key, shown) = (split(key), split(shown));
                let common = key.len().min(shown.len());
                segments_match(&key[..common], &shown[..common])
            })
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "hoist.toml shows keys hoist refuses: {unknown:?}"
    );
}

/// The keys of `from` that `matches` no key of `to`.
fn unmatched<'a>(
    from: &'a BTreeSet<String>,
    to: &BTreeSet<String>,
    matches: impl Fn(&str, &str) -> bool,
) -> Vec<&'a String> {
    from.iter()
        .filter(|a| !to.iter().any(|b| matches(a, b)))
        .collect()
}

fn split(key: &str) -> Vec<&str> {
    key.split('.').collect()
}

/// `text` with every run of whitespace one space (Markdown wraps lines).
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_deploy_readme_names_every_panel_and_alert_and_the_operating_page_every_alert() {
    let read = |file: &str| std::fs::read_to_string(root().join(file)).unwrap();
    let deploy_readme = flat(&read("deploy/README.md"));
    let operating = flat(&read("docs/operating.md"));
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/monitoring/grafana-dashboard.json")).unwrap();
    let panels: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|panel| panel["title"].as_str().unwrap())
        .collect();
    assert!(panels.len() >= 10, "{panels:?}");
    for title in panels {
        assert!(
            deploy_readme.contains(&format!("\"{}\"", flat(title))),
            "deploy/README.md does not name the panel \"{title}\""
        );
    }
    let rules = manifests::parse(
        "prometheusrule.yaml",
        &read("deploy/monitoring/prometheusrule.yaml"),
    );
    let alerts: Vec<&str> = manifests::list(&rules[0]["spec"]["groups"][0]["rules"])
        .iter()
        .filter_map(|rule| rule["alert"].as_str())
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    let count = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    ];
    assert!(
        deploy_readme.contains(&format!("with {} alerts", count[alerts.len().min(10)])),
        "deploy/README.md gives the number of alerts"
    );
    for alert in alerts {
        let named = format!("`{alert}`");
        assert!(
            deploy_readme.contains(&named),
            "deploy/README.md lacks {alert}"
        );
        assert!(
            operating.contains(&named),
            "docs/operating.md lacks {alert}"
        );
    }
}

#[test]
fn the_docs_yaml_snippets_point_at_sources_the_shipped_config_allows() {
    let docs = manifests::documents("deploy/kubernetes");
    let config = manifests::config_text(&docs, manifests::named(&docs, "Deployment", "hoist"));
    let settings = manifests::load_ok("hoist.yaml", config);
    let patterns: Vec<SourcePattern> = settings
        .limits
        .allowed_sources
        .iter()
        .map(|p| SourcePattern::new(p).unwrap())
        .collect();
    assert!(!patterns.is_empty(), "hoist.yaml limits its sources");
    let source = regex::Regex::new(r"^\s+(address|addresses|bootstrapServers):\s*(\S+)").unwrap();
    let mut checked = 0;
    for block in snippets::yaml_blocks() {
        for line in block.text.lines() {
            let Some(found) = source.captures(line) else {
                continue;
            };
            for address in found[2].split(',') {
                checked += 1;
                assert!(
                    patterns.iter().any(|p| p.allows(address)),
                    "{}: `{}: {address}` is refused by hoist.yaml's allowed_sources {:?}",
                    block.at,
                    &found[1],
                    settings.limits.allowed_sources
                );
            }
        }
    }
    assert!(checked >= 8, "{checked} addresses");
}

#[test]
fn every_keda_object_the_docs_show_is_valid_against_kedas_crds() {
    let keda = crds::Keda::load();
    let mut kinds = BTreeSet::new();
    for (at, object) in snippets::keda_objects() {
        let object = manifests::json(&object);
        let errors = keda.errors(&object);
        assert!(errors.is_empty(), "{at}: {errors:#?}");
        kinds.insert(object["kind"].as_str().unwrap().to_string());
    }
    assert_eq!(kinds, crds::kinds_shown());
}

#[test]
fn the_ingress_in_front_reaches_the_proxy_service_the_manifests_and_chart_make() {
    let docs = manifests::documents("deploy/kubernetes");
    let proxy = manifests::named(&docs, "Service", "hoist-interceptor-proxy");
    let namespace = proxy["metadata"]["namespace"].as_str().unwrap();
    let http = manifests::service_ports(proxy)["http"].0;
    // The chart's: `<release>-interceptor-proxy` on `interceptor.httpPort`.
    let values = manifests::parse(
        "values.yaml",
        &std::fs::read_to_string(root().join("deploy/helm/hoist/values.yaml")).unwrap(),
    );
    assert_eq!(values[0]["interceptor"]["httpPort"].as_i64(), Some(http));
    let helpers =
        std::fs::read_to_string(root().join("deploy/helm/hoist/templates/_helpers.tpl")).unwrap();
    assert!(helpers.contains(r#"printf "%s-interceptor-proxy" (include "hoist.fullname" .)"#));

    let page = std::fs::read_to_string(root().join("docs/interceptor.md")).unwrap();
    let heading = page
        .lines()
        .position(|l| l == "## Ingress in front")
        .expect("docs/interceptor.md: ## Ingress in front")
        + 1;
    let shown: Vec<yaml_rust2::Yaml> = snippets::blocks("docs/interceptor.md".as_ref())
        .into_iter()
        .filter(|block| {
            block.lang == "yaml"
                && block
                    .at
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .parse::<usize>()
                    .unwrap()
                    > heading
        })
        .flat_map(|block| manifests::parse(&block.at, &block.text))
        .collect();
    let of_kind = |kind: &str| {
        let found = manifests::kind(&shown, kind);
        assert_eq!(found.len(), 1, "one {kind} in Ingress in front");
        found[0].clone()
    };
    let (bridge, ingress) = (of_kind("Service"), of_kind("Ingress"));
    let (route, grant) = (of_kind("HTTPRoute"), of_kind("ReferenceGrant"));

    // An Ingress and the ExternalName Service it names, in the app's
    // namespace, naming the proxy Service in `keda` on its HTTP port.
    let app = ingress["metadata"]["namespace"].as_str().unwrap();
    assert_ne!(app, namespace, "the Ingress is in the app's namespace");
    assert_eq!(bridge["metadata"]["namespace"].as_str(), Some(app));
    assert_eq!(bridge["spec"]["type"].as_str(), Some("ExternalName"));
    assert_eq!(
        bridge["spec"]["externalName"].as_str().unwrap(),
        format!("hoist-interceptor-proxy.{namespace}.svc.cluster.local")
    );
    let bridge_port = manifests::list(&bridge["spec"]["ports"])[0]["port"].as_i64();
    assert_eq!(bridge_port, Some(http));
    let backend = &manifests::list(&manifests::list(&ingress["spec"]["rules"])[0]["http"]["paths"])
        [0]["backend"]["service"];
    assert_eq!(backend["name"].as_str(), Some(manifests::name(&bridge)));
    assert_eq!(backend["port"]["number"].as_i64(), Some(http));

    // An HTTPRoute naming the proxy Service across namespaces, and the
    // ReferenceGrant in `keda` that lets exactly it.
    assert_eq!(route["metadata"]["namespace"].as_str(), Some(app));
    let target = &manifests::list(&manifests::list(&route["spec"]["rules"])[0]["backendRefs"])[0];
    assert_eq!(target["name"].as_str(), Some("hoist-interceptor-proxy"));
    assert_eq!(target["namespace"].as_str(), Some(namespace));
    assert_eq!(target["port"].as_i64(), Some(http));
    assert_eq!(grant["metadata"]["namespace"].as_str(), Some(namespace));
    let from = &manifests::list(&grant["spec"]["from"])[0];
    assert_eq!(
        (from["kind"].as_str(), from["namespace"].as_str()),
        (Some("HTTPRoute"), Some(app))
    );
    let to = &manifests::list(&grant["spec"]["to"])[0];
    assert_eq!(
        (to["kind"].as_str(), to["name"].as_str()),
        (Some("Service"), Some("hoist-interceptor-proxy"))
    );
    // Both send the same host, which is what the proxy routes by.
    let host = manifests::list(&ingress["spec"]["rules"])[0]["host"].as_str();
    assert_eq!(
        manifests::list(&route["spec"]["hostnames"])[0].as_str(),
        host
    );
}
