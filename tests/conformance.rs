//! KEDA's own metadata parsing cases (`tests/data/keda-metadata-cases.json`,
//! taken from KEDA's scaler unit tests) run against hoist's parsers.
//!
//! KEDA tests its parsers with three maps: trigger metadata, resolved env
//! and TriggerAuthentication params. hoist receives them as KEDA's external
//! scaler sends them: `<key>FromEnv` entries arrive with the resolved value
//! (and are dropped when the variable is unset or empty), and auth params
//! come from an auth profile named by `authRef`.

use std::collections::{BTreeMap, HashMap};

use hoist::config::{AuthProfiles, AuthValue};
use hoist::metadata::Params;
use hoist::scalers::redis::{Mode, RedisConfig, parse_config};
use hoist::trigger::{self, Defaults};
use serde_json::{Value, json};

const PROFILE: &str = "keda-trigger-authentication";

struct Case {
    scaler: String,
    test: String,
    metadata: HashMap<String, String>,
    profiles: AuthProfiles,
    expect_error: bool,
    expect: serde_json::Map<String, Value>,
    trigger_index: Option<u64>,
}

fn strings(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("string values").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// What KEDA's external scaler would send hoist for this case.
fn as_hoist_sees_it(raw: &Value) -> Case {
    let scaler = raw["scaler"].as_str().unwrap().to_string();
    let resolved_env = strings(&raw["resolvedEnv"]);
    let mut metadata = HashMap::new();
    for (key, value) in strings(&raw["metadata"]) {
        if key.ends_with("FromEnv") {
            match resolved_env.get(&value) {
                Some(resolved) if !resolved.is_empty() => {
                    metadata.insert(key, resolved.clone());
                }
                _ => {}
            }
        } else {
            metadata.insert(key, value);
        }
    }
    metadata.insert("scaler".into(), scaler.clone());
    let auth = strings(&raw["authParams"]);
    let mut profiles = BTreeMap::new();
    if !auth.is_empty() {
        metadata.insert("authRef".into(), PROFILE.into());
        profiles.insert(
            PROFILE.to_string(),
            auth.into_iter()
                .map(|(k, v)| (k, AuthValue::Literal(v)))
                .collect(),
        );
    }
    Case {
        scaler,
        test: raw["test"].as_str().unwrap().to_string(),
        metadata,
        profiles: AuthProfiles::new(profiles),
        expect_error: raw["expectError"].as_bool().unwrap(),
        expect: raw["expect"].as_object().cloned().unwrap_or_default(),
        trigger_index: raw.get("triggerIndex").and_then(Value::as_u64),
    }
}

fn cases(prefix: &str) -> Vec<Case> {
    let all: Vec<Value> =
        serde_json::from_str(include_str!("data/keda-metadata-cases.json")).unwrap();
    let cases: Vec<Case> = all
        .iter()
        .filter(|raw| raw["scaler"].as_str().unwrap().starts_with(prefix))
        .map(as_hoist_sees_it)
        .collect();
    assert!(!cases.is_empty(), "no `{prefix}` cases");
    cases
}

const DEFAULTS: Defaults = Defaults {
    polling_interval: std::time::Duration::from_secs(30),
    timeout: std::time::Duration::from_secs(3),
};

/// KEDA's field names for hoist's Redis config.
fn redis_field(config: &RedisConfig, field: &str) -> Value {
    let list =
        |items: &Option<Vec<String>>| items.as_ref().map_or(Value::Null, |items| json!(items));
    match field {
        "listLength" => json!(config.list_length),
        "activationListLength" => json!(config.activation_list_length),
        "listName" => json!(config.list_name),
        "databaseIndex" => json!(config.database_index),
        "addresses" => json!(config.addresses),
        "hosts" => list(&config.hosts),
        "ports" => list(&config.ports),
        "username" => json!(config.username),
        "password" => json!(config.password.expose()),
        "sentinelUsername" => json!(config.sentinel_username),
        "sentinelPassword" => json!(config.sentinel_password.expose()),
        "sentinelMaster" => json!(config.sentinel_master),
        "enableTLS" => json!(config.enable_tls),
        "unsafeSsl" => json!(config.unsafe_ssl),
        "ca" => json!(config.ca),
        "cert" => json!(config.cert),
        "key" => json!(config.key.expose()),
        "keyPassword" => json!(config.key_password.expose()),
        other => {
            panic!("no Redis field for KEDA's `{other}`: extend the mapping rather than skip it")
        }
    }
}

#[test]
fn keda_redis_cases() {
    let mut checked_fields = 0;
    let cases = cases("redis");
    for case in &cases {
        let parsed = trigger::parse(&case.metadata, &case.profiles, DEFAULTS);
        assert_eq!(
            parsed.is_err(),
            case.expect_error,
            "{} ({}): {:?}",
            case.test,
            case.scaler,
            parsed.as_ref().err()
        );
        let Ok(parsed) = parsed else { continue };

        let mode = match case.scaler.as_str() {
            "redis-cluster" => Mode::Cluster,
            "redis-sentinel" => Mode::Sentinel,
            _ => Mode::Standalone,
        };
        let auth = match case.metadata.get("authRef") {
            Some(profile) => case.profiles.resolve(profile).unwrap(),
            None => Default::default(),
        };
        let config = parse_config(mode, &Params::new(&case.metadata, &auth)).unwrap();
        for (field, expected) in &case.expect {
            let actual = match field.as_str() {
                // KEDA prefixes `s<triggerIndex>-` itself; hoist gives the rest.
                "metricName" => json!(format!(
                    "s{}-{}",
                    case.trigger_index.unwrap_or(0),
                    parsed.trigger.metric_name
                )),
                "targetAverageValue" => json!(parsed.trigger.target as i64),
                _ => redis_field(&config, field),
            };
            assert_eq!(
                &actual, expected,
                "{} ({}): `{field}`",
                case.test, case.scaler
            );
            checked_fields += 1;
        }
    }
    assert!(
        checked_fields > 200,
        "only {checked_fields} fields compared"
    );
    assert_eq!(cases.len(), 56, "every Redis row runs");
}
