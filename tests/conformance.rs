//! KEDA's own metadata parsing cases (`tests/data/keda-metadata-cases.json`,
//! taken from KEDA's scaler unit tests) run against hoist's parsers.
//!
//! KEDA tests its parsers with three maps: trigger metadata, resolved env
//! and TriggerAuthentication params. hoist receives them as KEDA's external
//! scaler sends them: `<key>FromEnv` entries arrive with the resolved value
//! (and are dropped when the variable is unset or empty), and auth params
//! come from an auth profile named by `authRef`.

use std::collections::{BTreeMap, HashMap};

use hoist::auth_profiles::AuthProfiles;
use hoist::config::{AuthProfile, AuthValue};
use hoist::metadata::{AuthParams, Params};
use hoist::scalers::redis::{Mode, RedisConfig, parse_config};
use hoist::trigger::{self, Defaults};
use serde_json::{Value, json};

const PROFILE: &str = "keda-trigger-authentication";

struct Case {
    scaler: String,
    test: String,
    metadata: HashMap<String, String>,
    profiles: AuthProfiles,
    /// The profile's values, resolved, for calling a scaler's own parser.
    auth: AuthParams,
    /// The row itself, for fields only some scalers' rows carry.
    raw: Value,
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
    let mut auth = strings(&raw["authParams"]);
    // KEDA's TriggerAuthentication `podIdentity.provider`: in hoist, a
    // param of the auth profile.
    if let Some(provider) = raw.get("podIdentity").and_then(Value::as_str) {
        auth.insert("podIdentity".into(), provider.into());
    }
    let mut profiles = BTreeMap::new();
    if !auth.is_empty() {
        metadata.insert("authRef".into(), PROFILE.into());
        profiles.insert(
            PROFILE.to_string(),
            AuthProfile::new(
                &["*"],
                auth.into_iter().map(|(k, v)| (k, AuthValue::Literal(v))),
            ),
        );
    }
    let profiles = AuthProfiles::new(profiles);
    let auth = if metadata.contains_key("authRef") {
        profiles.resolve_for(PROFILE, None).unwrap()
    } else {
        AuthParams::new()
    };
    Case {
        scaler,
        test: raw["test"].as_str().unwrap().to_string(),
        metadata,
        profiles,
        auth,
        raw: raw.clone(),
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
        "enableTLS" => json!(config.tls.enabled),
        "unsafeSsl" => json!(config.tls.unsafe_ssl),
        "ca" => json!(config.tls.ca),
        "cert" => json!(config.tls.cert),
        "key" => json!(config.tls.key.expose()),
        "keyPassword" => json!(config.tls.key_password.expose()),
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
        let parsed = trigger::parse(
            &case.metadata,
            &case.profiles,
            DEFAULTS,
            &Default::default(),
        );
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
        let config = parse_config(mode, &Params::new(&case.metadata, &case.auth)).unwrap();
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

mod kafka {
    use std::collections::HashMap;

    use hoist::metadata::Params;
    use hoist::scalers::kafka::{self, KafkaConfig, OffsetResetPolicy, Sasl, parse_config};
    use serde_json::{Value, json};

    use super::{DEFAULTS, cases};

    fn sasl_name(sasl: &Sasl) -> &'static str {
        match sasl {
            Sasl::None => "none",
            Sasl::Plaintext(_) => "plaintext",
            Sasl::ScramSha256(_) => "scram_sha256",
            Sasl::ScramSha512(_) => "scram_sha512",
            Sasl::OAuthBearer { .. } | Sasl::AwsMskIam { .. } => "oauthbearer",
            Sasl::Gssapi { .. } => "gssapi",
        }
    }

    /// KEDA's field names for hoist's Kafka config.
    fn field(c: &KafkaConfig, name: &str) -> Value {
        match name {
            "bootstrapServers" => json!(c.bootstrap_servers),
            "consumerGroup" => json!(c.consumer_group),
            "topic" => json!(c.topic),
            "partitionLimitation" => json!(c.partition_limitation),
            "offsetResetPolicy" => json!(match c.offset_reset_policy {
                OffsetResetPolicy::Latest => "latest",
                OffsetResetPolicy::Earliest => "earliest",
            }),
            "allowIdleConsumers" => json!(c.allow_idle_consumers),
            "excludePersistentLag" => json!(c.exclude_persistent_lag),
            "limitToPartitionsWithLag" => json!(c.limit_to_partitions_with_lag),
            "ensureEvenDistributionOfPartitions" => json!(c.ensure_even_distribution_of_partitions),
            "fullMetadata" => json!(c.full_metadata),
            "lagThreshold" => json!(c.lag_threshold),
            "enableTLS" => json!(c.tls.enabled),
            "ca" => json!(c.tls.ca),
            "cert" => json!(c.tls.cert),
            "key" => json!(c.tls.key.expose()),
            "keyPassword" => json!(c.tls.key_password.expose()),
            "sasl" => json!(sasl_name(&c.sasl)),
            "tokenProvider" => json!(match c.sasl {
                Sasl::AwsMskIam { .. } => "aws_msk_iam",
                _ => "bearer",
            }),
            "scopes" => match &c.sasl {
                Sasl::OAuthBearer { scopes, .. } => json!(scopes),
                _ => Value::Null,
            },
            "oauthExtensionsCount" => match &c.sasl {
                Sasl::OAuthBearer { extensions, .. } => json!(extensions.len()),
                _ => Value::Null,
            },
            "kerberosServiceName" => match &c.sasl {
                Sasl::Gssapi { service_name, .. } => json!(service_name),
                _ => Value::Null,
            },
            "awsRegion" => match &c.sasl {
                Sasl::AwsMskIam { region, .. } => json!(region),
                _ => Value::Null,
            },
            other => panic!(
                "no Kafka field for KEDA's `{other}`: extend the mapping rather than skip it"
            ),
        }
    }

    /// KEDA's cases give the latest offsets only.
    fn ends(value: &Value) -> kafka::Ends {
        value
            .as_object()
            .unwrap()
            .iter()
            .map(|(topic, partitions)| {
                let partitions = partitions
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(p, o)| {
                        let latest = kafka::PartitionEnds::latest(o.as_i64().unwrap());
                        (p.parse().unwrap(), latest)
                    })
                    .collect();
                (topic.clone(), partitions)
            })
            .collect()
    }

    #[test]
    fn keda_kafka_cases() {
        let all = cases("kafka");
        assert_eq!(all.len(), 202, "every Kafka row runs");
        let mut compared = 0;
        for case in &all {
            let raw = &case.raw;
            let params = Params::new(&case.metadata, &case.auth);
            match raw["kind"].as_str() {
                Some("evenDistributionFactor") => {
                    let i = &raw["input"];
                    let factor = kafka::next_factor(
                        i["totalLag"].as_i64().unwrap(),
                        i["totalTopicPartitions"].as_i64().unwrap(),
                        i["lagThreshold"].as_i64().unwrap(),
                    );
                    assert_eq!(json!(factor), case.expect["factor"], "{}", case.test);
                    compared += 1;
                    continue;
                }
                Some("lagForPartition") => {
                    // These rows carry only the keys the function reads;
                    // the rest of a valid trigger is filled in.
                    let mut metadata = case.metadata.clone();
                    metadata.insert("bootstrapServers".into(), "b:9092".into());
                    metadata.insert("consumerGroup".into(), "g".into());
                    let config = parse_config(&Params::new(&metadata, &case.auth)).unwrap();
                    let i = &raw["input"];
                    let lag = kafka::lag_for_partition(
                        &config,
                        i["topic"].as_str().unwrap(),
                        i["partition"].as_i64().unwrap() as i32,
                        i["consumerOffset"].as_i64().unwrap(),
                        &ends(&i["latestOffsets"]),
                        &mut HashMap::new(),
                    );
                    assert_eq!(json!(lag.value), case.expect["lag"], "{}", case.test);
                    assert_eq!(
                        json!(lag.with_persistent),
                        case.expect["lagWithPersistent"],
                        "{}",
                        case.test
                    );
                    compared += 2;
                    continue;
                }
                Some("topicPartitions") => {
                    let config = parse_config(&params).unwrap();
                    let ids = raw["input"]["brokerPartitionIds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|id| id.as_i64().unwrap() as i32);
                    let active = kafka::active_partitions(&config, ids);
                    assert_eq!(
                        json!({config.topic.clone(): active}),
                        case.expect["topicPartitions"],
                        "{}",
                        case.test
                    );
                    compared += 1;
                    continue;
                }
                _ => {}
            }
            let parsed = hoist::trigger::parse(
                &case.metadata,
                &case.profiles,
                DEFAULTS,
                &Default::default(),
            );
            assert_eq!(
                parsed.is_err(),
                case.expect_error,
                "{}: {:?}",
                case.test,
                parsed.as_ref().err()
            );
            let Ok(parsed) = parsed else { continue };
            let config = parse_config(&params).unwrap();
            for (name, expected) in &case.expect {
                let actual = match name.as_str() {
                    "metricName" => json!(format!(
                        "s{}-{}",
                        case.trigger_index.unwrap_or(0),
                        parsed.trigger.metric_name
                    )),
                    "targetAverageValue" => json!(parsed.trigger.target as i64),
                    _ => field(&config, name),
                };
                assert_eq!(&actual, expected, "{}: `{name}`", case.test);
                compared += 1;
            }
        }
        assert!(compared > 500, "only {compared} fields compared");
    }
}

mod servicebus {
    use hoist::metadata::Params;
    use hoist::scalers::azure_servicebus::{Credential, Entity, Operation, parse_config};
    use serde_json::{Value, json};

    use super::{DEFAULTS, cases};

    #[test]
    fn keda_servicebus_cases() {
        let all = cases("azure-servicebus");
        assert_eq!(all.len(), 36, "every Service Bus row runs");
        let mut compared = 0;
        for case in &all {
            let raw = &case.raw;
            let parsed = hoist::trigger::parse(
                &case.metadata,
                &case.profiles,
                DEFAULTS,
                &Default::default(),
            );
            assert_eq!(
                parsed.is_err(),
                case.expect_error,
                "{}: {:?}",
                case.test,
                parsed.as_ref().err()
            );
            let Ok(parsed) = parsed else { continue };
            let config = parse_config(&Params::new(&case.metadata, &case.auth)).unwrap();
            let expected = case
                .expect
                .iter()
                .chain(raw["derivedExpect"].as_object().into_iter().flatten());
            for (name, expected) in expected {
                let actual = match name.as_str() {
                    "entityType" => json!(match config.entity {
                        Entity::Queue { .. } => "queue",
                        Entity::Subscription { .. } => "subscription",
                    }),
                    "fullyQualifiedNamespace" => json!(config.fully_qualified_namespace),
                    "messageCount" => json!(config.message_count),
                    "activationMessageCount" => json!(config.activation_message_count),
                    "useRegex" => json!(config.pattern.is_some()),
                    "operation" => json!(match config.operation {
                        Operation::Sum => "sum",
                        Operation::Max => "max",
                        Operation::Avg => "avg",
                    }),
                    "connection" => match &config.credential {
                        Credential::Connection(text) => json!(text.expose()),
                        Credential::WorkloadIdentity { .. }
                        | Credential::ManagedIdentity { .. } => Value::Null,
                    },
                    "metricName" => json!(format!(
                        "s{}-{}",
                        case.trigger_index.unwrap_or(0),
                        parsed.trigger.metric_name
                    )),
                    "targetAverageValue" => json!(parsed.trigger.target as i64),
                    other => panic!("no Service Bus field for KEDA's `{other}`"),
                };
                assert_eq!(&actual, expected, "{}: `{name}`", case.test);
                compared += 1;
            }
        }
        assert!(compared > 100, "only {compared} fields compared");
    }
}
