//! Every trigger page's parameter list is its parser's (and the keys
//! every trigger takes, and engine mode's, are those `src/trigger.rs` and
//! `src/engine/rules.rs` read, on docs/triggers/README.md and
//! docs/engine.md). Each trigger
//! declares the keys it reads (`KEYS` in its file, `Kind::keys` in the
//! registry) and reads through `Params::declaring`, which refuses, in
//! debug builds, a key the list lacks: so the list is the parser's, and
//! here every page is held to it, in KEDA's form (`| key | required |
//! default | meaning |`): every key listed, `Required` exactly for the
//! required ones, the default the list gives, no key the parser does not
//! read. A default that is a value of the key is then checked against
//! the parser itself: the page's first example parsed without the key
//! and with the key set to that default must give the same trigger.

use std::collections::{BTreeMap, HashMap};

use hoist::metadata::{Absent, AuthParams, Key, Params, Place};
use hoist::scalers::{Context, Kind, REGISTRY, Trigger};
use yaml_rust2::Yaml;

use crate::manifests::{list, parse, root, snippets};

/// The page of every `scaler`, from docs/triggers/README.md's table.
fn pages() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("docs/triggers/README.md")).unwrap();
    let link = regex::Regex::new(r"\]\(([a-z-]+\.md)\)").unwrap();
    let mut pages = BTreeMap::new();
    for row in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').collect();
        let Some(page) = link.captures(cells[2]) else {
            continue;
        };
        for scaler in cells[1].split('`').skip(1).step_by(2) {
            pages.insert(scaler.to_string(), format!("docs/triggers/{}", &page[1]));
        }
    }
    pages
}

/// A row of a parameter list: its required and default cells.
#[derive(Debug)]
struct Row {
    required: String,
    default: String,
}

const HEADER: &str = "| key | required | default | meaning |";

/// Every key of the page's parameter lists (tables under `HEADER`; a row
/// may list several keys, each backticked, in its first cell).
fn parameter_rows(page: &str) -> BTreeMap<String, Row> {
    let text = std::fs::read_to_string(root().join(page)).unwrap();
    let mut rows = BTreeMap::new();
    let mut in_list = false;
    for line in text.lines() {
        if line.trim() == HEADER {
            in_list = true;
            continue;
        }
        if !line.starts_with('|') {
            in_list = false;
        }
        if !in_list || line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "{page}: a short row: {line}");
        for key in cells[1].split('`').skip(1).step_by(2) {
            let row = Row {
                required: cells[2].to_string(),
                default: cells[3].to_string(),
            };
            assert!(
                rows.insert(key.to_string(), row).is_none(),
                "{page}: `{key}` listed twice"
            );
        }
    }
    rows
}

/// Holds `page`'s parameter lists to `keys`: every key listed,
/// `Required` exactly for the required ones, the listed default, and no
/// other key. The number of keys checked.
fn check_list(page: &str, keys: &[Key]) -> usize {
    let rows = parameter_rows(page);
    assert!(!keys.is_empty());
    for key in keys {
        let Some(row) = rows.get(key.name) else {
            panic!(
                "{page}: `{}` is read by the parser and not listed",
                key.name
            );
        };
        let required = if key.required { "Required" } else { "Optional" };
        assert_eq!(row.required, required, "{page}: `{}`", key.name);
        match key.default {
            Absent::None => assert_eq!(row.default, "—", "{page}: `{}`", key.name),
            Absent::Value(value) => {
                assert_eq!(row.default, format!("`{value}`"), "{page}: `{}`", key.name)
            }
            Absent::Described(text) => assert!(
                row.default.contains(text),
                "{page}: `{}`'s default is {text}, the page says {}",
                key.name,
                row.default
            ),
        }
    }
    for listed in rows.keys() {
        assert!(
            keys.iter().any(|key| key.name == listed),
            "{page} lists `{listed}`, which the parser does not read"
        );
    }
    keys.len()
}

#[test]
fn every_trigger_page_lists_every_key_its_parser_reads_with_the_parsers_default() {
    let pages = pages();
    let mut checked = 0;
    for kind in REGISTRY {
        let page = &pages[kind.scalers[0]];
        for scaler in kind.scalers {
            assert_eq!(&pages[*scaler], page, "`{scaler}` and its kind on one page");
        }
        checked += check_list(page, kind.keys);
    }
    assert!(checked >= 60, "{checked} keys");
}

#[test]
fn the_keys_every_trigger_takes_and_the_engines_are_listed_as_read() {
    check_list("docs/triggers/README.md", hoist::trigger::KEYS);
    check_list("docs/engine.md", hoist::engine::rules::METADATA_KEYS);
}

/// The first trigger the page shows for one of `kind`'s scalers: its
/// metadata as KEDA would send it, a `FromEnv` value resolved.
fn first_example(page: &str, kind: &Kind) -> (String, HashMap<String, String>) {
    for block in snippets::blocks(page.as_ref()) {
        if block.lang != "yaml" {
            continue;
        }
        for doc in parse(&block.at, &block.text) {
            let triggers = match &doc["spec"]["triggers"] {
                Yaml::BadValue => &doc["triggers"],
                triggers => triggers,
            };
            for trigger in list(triggers) {
                let metadata: HashMap<String, String> = trigger["metadata"]
                    .as_hash()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| {
                        let key = k.as_str().unwrap().to_string();
                        let value = match key.as_str() {
                            "connectionFromEnv" => SERVICE_BUS_CONNECTION.to_string(),
                            _ => v.as_str().unwrap().to_string(),
                        };
                        (key, value)
                    })
                    .collect();
                if let Some(scaler) = metadata.get("scaler")
                    && kind.scalers.contains(&scaler.as_str())
                {
                    return (scaler.clone(), metadata);
                }
            }
        }
    }
    panic!("{page} shows no trigger of {:?}", kind.scalers)
}

/// What KEDA's `connectionFromEnv` resolves to: a connection string of
/// the right shape.
const SERVICE_BUS_CONNECTION: &str =
    "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=keda;SharedAccessKey=a2V5";

/// Everything a trigger tells the driver and KEDA.
fn fingerprint(trigger: &Trigger) -> String {
    format!(
        "{} {} {} {} {:?} {} {}",
        trigger.metric_name,
        trigger.target,
        trigger.target_key,
        trigger.activation_target,
        trigger.polling_interval,
        trigger.query.key,
        trigger.query.description,
    )
}

fn parse_trigger(
    scaler: &str,
    metadata: &HashMap<String, String>,
    auth: &AuthParams,
) -> Result<String, String> {
    hoist::scalers::parse(scaler, &Params::new(metadata, auth), &Context::default())
        .map(|trigger| fingerprint(&trigger))
        .map_err(|e| e.to_string())
}

/// `http` and `tcp` measure hoist's own interceptor, which their parser
/// needs in its context and a test outside the crate cannot make: their
/// defaults are compared here only with the page (`tests/routes.rs`
/// checks the target's against a live hoist).
const NEEDS_AN_INTERCEPTOR: &[&str] = &["http"];

#[test]
fn a_key_set_to_its_listed_default_parses_as_the_key_left_out() {
    let pages = pages();
    let mut compared = 0;
    for kind in REGISTRY {
        if kind
            .scalers
            .iter()
            .any(|s| NEEDS_AN_INTERCEPTOR.contains(s))
        {
            continue;
        }
        let page = &pages[kind.scalers[0]];
        let (scaler, metadata) = first_example(page, kind);
        for key in kind.keys {
            let Absent::Value(value) = key.default else {
                continue;
            };
            // The example without the key (it may set it: `listLength`).
            let mut without = metadata.clone();
            without.remove(key.name);
            let base = parse_trigger(&scaler, &without, &AuthParams::new()).unwrap_or_else(|e| {
                panic!(
                    "{page}'s first `{scaler}` example without `{}`: {e}",
                    key.name
                )
            });
            let (with, auth) = set(key, value, &without);
            let set = parse_trigger(&scaler, &with, &auth)
                .unwrap_or_else(|e| panic!("{page}: `{}: {value}`: {e}", key.name));
            assert_eq!(
                set, base,
                "{page}: `{}: {value}` is not what the parser does without it",
                key.name
            );
            compared += 1;
        }
    }
    assert!(compared >= 25, "{compared} defaults compared");
}

/// `metadata` with `key` set to `value` where the key may be written:
/// the metadata, else the auth params.
fn set(
    key: &Key,
    value: &str,
    metadata: &HashMap<String, String>,
) -> (HashMap<String, String>, AuthParams) {
    let mut metadata = metadata.clone();
    let mut auth = AuthParams::new();
    match key.place {
        Place::Metadata | Place::Both => {
            metadata.insert(key.name.to_string(), value.to_string());
        }
        Place::Auth | Place::AuthOrEnv => {
            auth.insert(key.name.to_ascii_lowercase(), value.to_string());
        }
    }
    (metadata, auth)
}
