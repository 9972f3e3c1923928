//! One ScaledObject trigger as hoist sees it: the `scaler`-specific part
//! (see `scalers/`) plus hoist's common keys.

use std::collections::HashMap;
use std::time::Duration;

use crate::auth_profiles::AuthProfiles;
use crate::config::{MAX_POLLING_INTERVAL, MAX_TIMEOUT_MS};
use crate::engine::Rules;
use crate::engine::rules::WrittenKeys;

use crate::metadata::{Absent, AuthParams, Key, MetadataError, Origin, Params};
use crate::scalers::{self, Trigger};

/// The keys every trigger takes, as docs/triggers/README.md lists them
/// (engine mode adds `engine::rules::METADATA_KEYS`).
pub const KEYS: &[Key] = &[
    Key::required("scaler"),
    Key::optional(
        "pollingInterval",
        Absent::Described(
            "the ScaledObject's `spec.pollingInterval`, else `15` for `http` and `tcp` (ACA's), else `30`",
        ),
    ),
    Key::optional(
        "timeout",
        Absent::Described("`3000` (config `polling.default_timeout`)"),
    ),
    Key::optional("scalingMode", Absent::Value("passthrough")),
    Key::optional("authRef", Absent::None),
];

/// Values used when the metadata leaves a common key out.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub polling_interval: Duration,
    pub timeout: Duration,
}

/// How hoist answers KEDA for this trigger.
#[derive(Debug, Clone, PartialEq)]
pub enum ScalingMode {
    /// Report the raw value; KEDA and the HPA decide, as with built-in scalers.
    Passthrough,
    /// hoist's engine decides for the whole ScaledObject with these rules:
    /// `IsActive` follows it and `GetMetrics` reports `replicas × target`.
    /// Boxed: passthrough triggers, the many, need no room for rules.
    Engine(Box<Rules>),
}

#[derive(Clone)]
pub struct TriggerConfig {
    pub trigger: Trigger,
    pub polling_interval: Duration,
    pub timeout: Duration,
    pub scaling_mode: ScalingMode,
    /// The engine rule keys the metadata wrote (names of
    /// `engine::rules::RULE_KEYS`): they win over the ScaledObject's own.
    pub written: WrittenKeys,
}

/// Parses a trigger's whole metadata map as KEDA sends it.
pub fn parse(
    metadata: &HashMap<String, String>,
    profiles: &AuthProfiles,
    defaults: Defaults,
    context: &scalers::Context,
) -> Result<TriggerConfig, MetadataError> {
    let no_auth = AuthParams::new();
    let bare = Params::new(metadata, &no_auth).declaring(KEYS);
    let scaler = bare.find(&["scaler"], &[Origin::Metadata]).ok_or_else(|| {
        MetadataError::missing(
            "scaler",
            format!(
                "say which trigger to use: one of {}",
                scalers::scaler_names().join(", ")
            ),
        )
    })?;
    // `authRef` is hoist's own profile; `context.authentication` the
    // ScaledObject's TriggerAuthentication, less the params KEDA itself
    // uses for its TLS connection to hoist. Both giving params would leave
    // it unclear whose credentials the trigger uses: refused.
    let authentication = context
        .authentication
        .as_ref()
        .map(for_the_trigger)
        .filter(|params| !params.is_empty());
    let auth = match (bare.find(&["authRef"], &[Origin::Metadata]), authentication) {
        (Some(_), Some(_)) => {
            return Err(MetadataError::invalid(
                "authRef",
                "the trigger's authenticationRef (a TriggerAuthentication) gives credentials too: use one of them",
            ));
        }
        (Some(name), None) => profiles.resolve_for(
            name.value,
            context.owner.as_ref().map(|owner| owner.namespace.as_str()),
        )?,
        (None, Some(authentication)) => authentication,
        (None, None) => AuthParams::new(),
    };
    let params = Params::new(metadata, &auth).declaring(KEYS);
    let trigger = scalers::parse(scaler.value, &params, context)?;

    let polling_interval = match params.find(&["pollingInterval"], &[Origin::Metadata]) {
        None => trigger
            .polling_interval
            .unwrap_or(defaults.polling_interval),
        Some(_) => {
            let seconds = params.number::<u64>(&["pollingInterval"], &[Origin::Metadata], 0)?;
            if !(1..=MAX_POLLING_INTERVAL).contains(&seconds) {
                return Err(MetadataError::invalid(
                    "pollingInterval",
                    format!("must be 1 to {MAX_POLLING_INTERVAL} seconds"),
                ));
            }
            Duration::from_secs(seconds)
        }
    };
    let timeout = match params.find(&["timeout"], &[Origin::Metadata]) {
        None => defaults.timeout,
        Some(_) => {
            let millis = params.number::<u64>(&["timeout"], &[Origin::Metadata], 0)?;
            if !(1..=MAX_TIMEOUT_MS).contains(&millis) {
                return Err(MetadataError::invalid(
                    "timeout",
                    format!("must be 1 to {MAX_TIMEOUT_MS} milliseconds"),
                ));
            }
            Duration::from_millis(millis)
        }
    };
    let scaling_mode = match params.find(&["scalingMode"], &[Origin::Metadata]) {
        None => ScalingMode::Passthrough,
        Some(found) if found.value == "passthrough" => ScalingMode::Passthrough,
        Some(found) if found.value == "engine" => ScalingMode::Engine(Box::new(
            Rules::from_metadata(&params, polling_interval.as_secs())?,
        )),
        Some(found) => {
            return Err(MetadataError::invalid(
                "scalingMode",
                format!("`{}` is not `passthrough` or `engine`", found.value),
            ));
        }
    };

    if matches!(scaling_mode, ScalingMode::Engine(_))
        && (trigger.target.is_nan() || trigger.target <= 0.0)
    {
        return Err(MetadataError::invalid(
            trigger.target_key,
            "must be above 0 in engine mode (the engine divides by it)",
        ));
    }
    let written = written_rule_keys(&params);
    Ok(TriggerConfig {
        trigger,
        polling_interval,
        timeout,
        scaling_mode,
        written,
    })
}

/// The params KEDA's external scaler reads from a TriggerAuthentication
/// for its own gRPC connection to hoist (lower-cased): the CA of hoist's
/// certificate and KEDA's client certificate. They are KEDA's, not the
/// trigger's, so a trigger may name such a TriggerAuthentication next to
/// an `authRef`.
pub const KEDA_CONNECTION_PARAMS: [&str; 3] = ["cacert", "tlsclientcert", "tlsclientkey"];

/// A TriggerAuthentication's params without KEDA's connection params.
fn for_the_trigger(params: &AuthParams) -> AuthParams {
    params
        .iter()
        .filter(|(name, _)| !KEDA_CONNECTION_PARAMS.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// Which of the ScaledObject-level settings the metadata writes itself.
fn written_rule_keys(params: &Params) -> WrittenKeys {
    let params = params.declaring(crate::engine::rules::METADATA_KEYS);
    let present = |keys: &[&str]| {
        keys.iter()
            .any(|key| params.find(&[key], &[Origin::Metadata]).is_some())
    };
    let groups: [(&str, &[&str]); 6] = [
        ("minReplicaCount", &["minReplicaCount"]),
        ("maxReplicaCount", &["maxReplicaCount"]),
        ("cooldownPeriod", &["cooldownPeriod"]),
        ("pollingInterval", &["pollingInterval"]),
        (
            "fallback",
            &["fallbackFailureThreshold", "fallbackReplicas"],
        ),
        (
            "behavior",
            &[
                "behavior",
                "scaleUpStabilizationWindowSeconds",
                "scaleDownStabilizationWindowSeconds",
            ],
        ),
    ];
    groups
        .iter()
        .filter(|(_, keys)| present(keys))
        .map(|(name, _)| *name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: Defaults = Defaults {
        polling_interval: Duration::from_secs(30),
        timeout: Duration::from_secs(3),
    };

    fn parse_pairs(pairs: &[(&str, &str)]) -> Result<TriggerConfig, MetadataError> {
        let metadata = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(
            &metadata,
            &AuthProfiles::default(),
            DEFAULTS,
            &Default::default(),
        )
    }

    const REDIS: [(&str, &str); 3] = [
        ("scaler", "redis"),
        ("address", "localhost:6379"),
        ("listName", "jobs"),
    ];

    #[test]
    fn common_keys_have_defaults() {
        let config = parse_pairs(&REDIS).unwrap();
        assert_eq!(config.polling_interval, Duration::from_secs(30));
        assert_eq!(config.timeout, Duration::from_secs(3));
        assert_eq!(config.scaling_mode, ScalingMode::Passthrough);
        assert_eq!(config.trigger.metric_name, "redis-jobs");
        assert_eq!(config.trigger.target, 5.0);
    }

    #[test]
    fn common_keys_are_validated() {
        let with = |key, value| {
            let mut pairs = REDIS.to_vec();
            pairs.push((key, value));
            parse_pairs(&pairs)
        };
        assert_eq!(
            with("pollingInterval", "7").unwrap().polling_interval,
            Duration::from_secs(7)
        );
        assert_eq!(
            with("timeout", "250").unwrap().timeout,
            Duration::from_millis(250)
        );
        for (key, value) in [
            ("pollingInterval", "0"),
            ("pollingInterval", "-1"),
            ("pollingInterval", "soon"),
            ("timeout", "0"),
            ("pollingInterval", "18446744073709551"),
            ("timeout", "99999999999"),
            ("scalingMode", "fast"),
        ] {
            let err = with(key, value).err().unwrap();
            assert!(
                err.to_string().contains(&format!("`{key}`")),
                "{key}={value}: {err}"
            );
        }
    }

    #[test]
    fn engine_mode_reads_the_rule_keys() {
        let mut pairs = REDIS.to_vec();
        pairs.extend([
            ("scalingMode", "engine"),
            ("maxReplicaCount", "20"),
            ("cooldownPeriod", "120"),
            ("pollingInterval", "15"),
            (
                "behavior",
                r#"{"scaleDown":{"stabilizationWindowSeconds":60}}"#,
            ),
        ]);
        let ScalingMode::Engine(rules) = parse_pairs(&pairs).unwrap().scaling_mode else {
            panic!("engine mode expected");
        };
        assert_eq!(rules.max_replica_count, 20);
        assert_eq!(rules.cooldown_period, 120);
        assert_eq!(rules.polling_interval, 15);
        assert_eq!(rules.scale_down().stabilization_window_seconds, 60);
        assert_eq!(rules.min_replica_count, 0);

        for (key, value) in [
            ("minReplicaCount", "30"),
            ("maxReplicaCount", "0"),
            ("tolerance", "1.5"),
            ("behavior", "{not json"),
            (
                "behavior",
                r#"{"scaleUp":{"policies":[{"type":"Pods","value":0,"periodSeconds":15}]}}"#,
            ),
            ("fallbackReplicas", "3"),
            ("scaleDownStabilizationWindowSeconds", "7200"),
        ] {
            let mut bad = pairs.clone();
            bad.push((key, value));
            let err = parse_pairs(&bad).err().unwrap();
            let named = if key == "fallbackReplicas" {
                "fallbackFailureThreshold"
            } else {
                key
            };
            assert!(
                err.to_string().contains(&format!("`{named}`")),
                "{key}={value}: {err}"
            );
        }
    }

    #[test]
    fn missing_scaler_lists_the_valid_ones() {
        let err = parse_pairs(&[("listName", "jobs")]).err().unwrap();
        let message = err.to_string();
        assert!(message.contains("`scaler`"), "{message}");
        assert!(message.contains("redis-sentinel"), "{message}");
    }

    fn redis_with_password(password: &str) -> Vec<(&str, &str)> {
        let mut pairs = REDIS.to_vec();
        pairs.push(("password", password));
        pairs
    }

    fn parse_in(
        pairs: &[(&str, &str)],
        profiles: &AuthProfiles,
        namespace: &str,
        authentication: Option<AuthParams>,
    ) -> Result<TriggerConfig, MetadataError> {
        let metadata = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let context = scalers::Context {
            owner: Some(crate::routing::Owner {
                namespace: namespace.into(),
                name: "orders".into(),
            }),
            authentication,
            ..Default::default()
        };
        parse(&metadata, profiles, DEFAULTS, &context)
    }

    fn orders_profile() -> AuthProfiles {
        use crate::config::{AuthProfile, AuthValue};
        AuthProfiles::new(
            [(
                "orders-redis".to_string(),
                AuthProfile::new(
                    &["orders"],
                    [("password", AuthValue::Literal("profile-pw".into()))],
                ),
            )]
            .into(),
        )
    }

    /// The source question a parse asks: it fingerprints the credentials,
    /// so equal questions mean the same credentials reached the trigger.
    fn question(
        pairs: &[(&str, &str)],
        profiles: &AuthProfiles,
        authentication: Option<AuthParams>,
    ) -> String {
        parse_in(pairs, profiles, "orders", authentication)
            .unwrap()
            .trigger
            .query
            .key
            .to_string()
    }

    #[test]
    fn a_profile_is_used_only_from_its_namespaces() {
        let mut pairs = REDIS.to_vec();
        pairs.push(("authRef", "orders-redis"));
        let profiles = orders_profile();
        let err = parse_in(&pairs, &profiles, "shop", None).err().unwrap();
        assert_eq!(
            err,
            MetadataError::AuthProfileDenied {
                profile: "orders-redis".into(),
                namespace: "shop".into()
            }
        );
        assert_eq!(
            question(&pairs, &profiles, None),
            question(&redis_with_password("profile-pw"), &profiles, None),
            "the profile's password reached the trigger in its own namespace"
        );
    }

    #[test]
    fn trigger_authentication_params_are_used_like_a_profiles() {
        let authentication: AuthParams = [("password".to_string(), "ta-pw".to_string())].into();
        let none = AuthProfiles::default();
        let with_ta = question(&REDIS, &none, Some(authentication.clone()));
        assert_eq!(
            with_ta,
            question(&redis_with_password("ta-pw"), &none, None)
        );
        assert_ne!(with_ta, question(&REDIS, &none, None));

        // Both an authRef and an authenticationRef giving params: refused,
        // naming both.
        let mut pairs = REDIS.to_vec();
        pairs.push(("authRef", "orders-redis"));
        let profiles = orders_profile();
        let err = parse_in(&pairs, &profiles, "orders", Some(authentication))
            .err()
            .unwrap();
        let message = err.to_string();
        assert!(
            message.contains("`authRef`") && message.contains("authenticationRef"),
            "{message}"
        );

        // A TriggerAuthentication holding only KEDA's TLS params for its
        // connection to hoist (deploy/examples/tls-triggerauthentication.yaml)
        // goes with an authRef, and gives the trigger nothing.
        let keda_tls: AuthParams = KEDA_CONNECTION_PARAMS
            .iter()
            .map(|name| (name.to_string(), "pem".to_string()))
            .collect();
        assert_eq!(
            question(&pairs, &profiles, Some(keda_tls.clone())),
            question(&pairs, &profiles, None)
        );
        assert_eq!(
            question(&REDIS, &profiles, Some(keda_tls)),
            question(&REDIS, &profiles, None)
        );
    }

    #[test]
    fn unknown_auth_profile_is_named() {
        let mut pairs = REDIS.to_vec();
        pairs.push(("authRef", "orders"));
        let err = parse_pairs(&pairs).err().unwrap();
        assert!(matches!(err, MetadataError::AuthProfile { .. }));
        assert!(err.to_string().contains("`orders`"), "{err}");
    }
}
