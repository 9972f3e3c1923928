//! The rule set of one ScaledObject: ACA's defaults, overridable from
//! trigger metadata with the KEDA ScaledObject / HPA names.

use serde::{Deserialize, Serialize};

use super::hpa::{Policy, PolicyType, ScalingRules, SelectPolicy};
use crate::config::MAX_POLLING_INTERVAL;
use crate::metadata::{Absent, Key, MetadataError, Origin, Params};

/// The longest cooldown hoist accepts: 30 days.
pub const MAX_COOLDOWN_PERIOD: u64 = 30 * 86_400;

/// The engine's rules, in the units and names of a ScaledObject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Rules {
    /// Replicas when inactive (0 lets the app scale to zero).
    pub min_replica_count: u32,
    pub max_replica_count: u32,
    /// Seconds between evaluations.
    pub polling_interval: u64,
    /// Seconds after the last active reading before scaling to zero (with
    /// `minReplicaCount` 0 only, as KEDA).
    pub cooldown_period: u64,
    pub scale_up_stabilization_window_seconds: u32,
    pub scale_down_stabilization_window_seconds: u32,
    /// No change while |1 − usage ratio| ≤ tolerance.
    pub tolerance: f64,
    /// The HPA `behavior` (Kubernetes field names). Without it the engine
    /// steps up ACA's way, `min(max, desired, max(4, 2 × current))`.
    pub behavior: Option<Behavior>,
    pub fallback: Option<Fallback>,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            min_replica_count: 0,
            max_replica_count: 10,
            polling_interval: 30,
            cooldown_period: 300,
            scale_up_stabilization_window_seconds: 0,
            scale_down_stabilization_window_seconds: 300,
            tolerance: 0.1,
            behavior: None,
            fallback: None,
        }
    }
}

/// An HPA `behavior` as written in a ScaledObject; absent fields take the
/// Kubernetes API defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Behavior {
    pub scale_up: Option<BehaviorRules>,
    pub scale_down: Option<BehaviorRules>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BehaviorRules {
    pub stabilization_window_seconds: Option<u32>,
    pub select_policy: Option<SelectPolicy>,
    pub policies: Option<Vec<Policy>>,
    pub tolerance: Option<f64>,
}

/// KEDA's `fallback`: after `failureThreshold` consecutive failures of a
/// trigger, run `replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fallback {
    pub failure_threshold: u32,
    pub replicas: u32,
}

impl Rules {
    /// The scale-up rules with the API defaults filled in.
    pub fn scale_up(&self) -> ScalingRules {
        let given = self
            .behavior
            .as_ref()
            .and_then(|b| b.scale_up.clone())
            .unwrap_or_default();
        ScalingRules {
            stabilization_window_seconds: given
                .stabilization_window_seconds
                .unwrap_or(self.scale_up_stabilization_window_seconds),
            select_policy: given.select_policy.unwrap_or_default(),
            policies: given.policies.unwrap_or_else(|| {
                vec![
                    Policy {
                        kind: PolicyType::Pods,
                        value: 4,
                        period_seconds: 15,
                    },
                    Policy {
                        kind: PolicyType::Percent,
                        value: 100,
                        period_seconds: 15,
                    },
                ]
            }),
            tolerance: given.tolerance.unwrap_or(self.tolerance),
        }
    }

    /// The scale-down rules with the API defaults filled in.
    pub fn scale_down(&self) -> ScalingRules {
        let given = self
            .behavior
            .as_ref()
            .and_then(|b| b.scale_down.clone())
            .unwrap_or_default();
        ScalingRules {
            stabilization_window_seconds: given
                .stabilization_window_seconds
                .unwrap_or(self.scale_down_stabilization_window_seconds),
            select_policy: given.select_policy.unwrap_or_default(),
            policies: given.policies.unwrap_or_else(|| {
                vec![Policy {
                    kind: PolicyType::Percent,
                    value: 100,
                    period_seconds: 15,
                }]
            }),
            tolerance: given.tolerance.unwrap_or(self.tolerance),
        }
    }

    /// Reads the rule keys from trigger metadata. Absent keys keep ACA's
    /// defaults; `pollingInterval` comes from the trigger's own setting.
    pub fn from_metadata(params: &Params, polling_interval: u64) -> Result<Self, MetadataError> {
        let params = &params.declaring(METADATA_KEYS);
        let defaults = Rules::default();
        let number =
            |key: &str, default: u64| params.number::<u64>(&[key], &[Origin::Metadata], default);
        let window = |key: &str, default: u32| -> Result<u32, MetadataError> {
            let seconds = params.number::<u32>(&[key], &[Origin::Metadata], default)?;
            if seconds > 3600 {
                return Err(MetadataError::invalid(
                    key,
                    "must be at most 3600 seconds, as in the HPA API",
                ));
            }
            Ok(seconds)
        };
        let rules = Rules {
            min_replica_count: params.number(&["minReplicaCount"], &[Origin::Metadata], defaults.min_replica_count)?,
            max_replica_count: params.number(&["maxReplicaCount"], &[Origin::Metadata], defaults.max_replica_count)?,
            polling_interval,
            cooldown_period: number("cooldownPeriod", defaults.cooldown_period)?,
            scale_up_stabilization_window_seconds: window(
                "scaleUpStabilizationWindowSeconds",
                defaults.scale_up_stabilization_window_seconds,
            )?,
            scale_down_stabilization_window_seconds: window(
                "scaleDownStabilizationWindowSeconds",
                defaults.scale_down_stabilization_window_seconds,
            )?,
            tolerance: params.number(&["tolerance"], &[Origin::Metadata], defaults.tolerance)?,
            behavior: match params.find(&["behavior"], &[Origin::Metadata]) {
                None => None,
                // `none`: ACA's step-up, whatever the ScaledObject's own
                // (pass-through) behavior says.
                Some(found) if found.value.trim() == "none" => None,
                Some(found) => Some(serde_json::from_str(found.value).map_err(|error| {
                    MetadataError::invalid(
                        "behavior",
                        format!("not an HPA behavior in JSON ({error}); e.g. {{\"scaleDown\":{{\"stabilizationWindowSeconds\":60}}}}"),
                    )
                })?),
            },
            fallback: {
                let threshold = params.find(&["fallbackFailureThreshold"], &[Origin::Metadata]);
                let replicas = params.find(&["fallbackReplicas"], &[Origin::Metadata]);
                match (threshold, replicas) {
                    (None, None) => None,
                    (Some(_), Some(_)) => Some(Fallback {
                        failure_threshold: params.number(&["fallbackFailureThreshold"], &[Origin::Metadata], 0)?,
                        replicas: params.number(&["fallbackReplicas"], &[Origin::Metadata], 0)?,
                    }),
                    (Some(_), None) => {
                        return Err(MetadataError::missing(
                            "fallbackReplicas",
                            "`fallbackFailureThreshold` needs `fallbackReplicas`",
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(MetadataError::missing(
                            "fallbackFailureThreshold",
                            "`fallbackReplicas` needs `fallbackFailureThreshold`",
                        ));
                    }
                }
            },
        };
        rules.validate()?;
        Ok(rules)
    }

    /// Checks the relations between keys; errors name the key to fix.
    pub fn validate(&self) -> Result<(), MetadataError> {
        if self.max_replica_count == 0 {
            return Err(MetadataError::invalid(
                "maxReplicaCount",
                "must be at least 1",
            ));
        }
        if self.min_replica_count > self.max_replica_count {
            return Err(MetadataError::invalid(
                "minReplicaCount",
                format!(
                    "{} is more than maxReplicaCount {}",
                    self.min_replica_count, self.max_replica_count
                ),
            ));
        }
        if self.max_replica_count > i32::MAX as u32 {
            return Err(MetadataError::invalid("maxReplicaCount", "is too large"));
        }
        if !(0.0..1.0).contains(&self.tolerance) {
            return Err(MetadataError::invalid(
                "tolerance",
                "must be at least 0 and below 1",
            ));
        }
        if !(1..=MAX_POLLING_INTERVAL).contains(&self.polling_interval) {
            return Err(MetadataError::invalid(
                "pollingInterval",
                format!("must be 1 to {MAX_POLLING_INTERVAL} seconds"),
            ));
        }
        if self.cooldown_period > MAX_COOLDOWN_PERIOD {
            return Err(MetadataError::invalid(
                "cooldownPeriod",
                format!("must be at most {MAX_COOLDOWN_PERIOD} seconds (30 days)"),
            ));
        }
        for (direction, rules) in [
            ("scaleUp", self.scale_up()),
            ("scaleDown", self.scale_down()),
        ] {
            let key = "behavior";
            if rules.policies.is_empty() && rules.select_policy != SelectPolicy::Disabled {
                return Err(MetadataError::invalid(
                    key,
                    format!("{direction}.policies must not be empty"),
                ));
            }
            for policy in &rules.policies {
                if policy.value <= 0 {
                    return Err(MetadataError::invalid(
                        key,
                        format!("{direction} policy value must be above 0"),
                    ));
                }
                if !(1..=1800).contains(&policy.period_seconds) {
                    return Err(MetadataError::invalid(
                        key,
                        format!("{direction} policy periodSeconds must be 1 to 1800"),
                    ));
                }
            }
            if rules.stabilization_window_seconds > 3600 {
                return Err(MetadataError::invalid(
                    key,
                    format!("{direction}.stabilizationWindowSeconds must be at most 3600"),
                ));
            }
            if !(0.0..1.0).contains(&rules.tolerance) {
                return Err(MetadataError::invalid(
                    key,
                    format!("{direction}.tolerance must be at least 0 and below 1"),
                ));
            }
        }
        Ok(())
    }
}

/// What a ScaledObject's own spec says, as defaults for its engine-mode
/// triggers (a key written in trigger metadata wins). `None`: not written
/// in the spec.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSettings {
    pub min_replica_count: Option<u32>,
    pub max_replica_count: Option<u32>,
    pub cooldown_period: Option<u64>,
    pub polling_interval: Option<u64>,
    pub fallback: Option<Fallback>,
    pub behavior: Option<Behavior>,
}

/// Where a rule's value came from, for `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// The trigger's metadata.
    Metadata,
    /// The ScaledObject's spec (read from the cluster).
    ScaledObject,
    /// hoist's default (ACA's).
    Default,
}

/// The engine's keys in trigger metadata, as docs/engine.md lists them.
/// Their defaults are described, not values: writing a key, even with
/// its default, makes it the trigger's own over the ScaledObject's.
pub const METADATA_KEYS: &[Key] = &[
    Key::optional("minReplicaCount", Described("the ScaledObject's, else `0`")),
    Key::optional(
        "maxReplicaCount",
        Described("the ScaledObject's, else `10`"),
    ),
    Key::optional(
        "pollingInterval",
        Described("the ScaledObject's, else `15` for `http` and `tcp`, else `30`"),
    ),
    Key::optional(
        "cooldownPeriod",
        Described("the ScaledObject's, else `300`"),
    ),
    Key::optional("scaleUpStabilizationWindowSeconds", Described("`0`")),
    Key::optional("scaleDownStabilizationWindowSeconds", Described("`300`")),
    Key::optional("tolerance", Described("`0.1`")),
    Key::optional("behavior", Described("the ScaledObject's, else none")),
    Key::optional(
        "fallbackFailureThreshold",
        Described("the ScaledObject's `fallback`, else none"),
    ),
    Key::optional(
        "fallbackReplicas",
        Described("the ScaledObject's `fallback`, else none"),
    ),
];
use Absent::Described;

/// The rule keys a trigger's metadata wrote, by their metadata names.
pub const RULE_KEYS: [&str; 6] = [
    "minReplicaCount",
    "maxReplicaCount",
    "cooldownPeriod",
    "pollingInterval",
    "fallback",
    "behavior",
];

/// Which of [`RULE_KEYS`] trigger metadata wrote: a bit each (every
/// tracked trigger holds one; a set of strings cost a tree node each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WrittenKeys(u8);

impl WrittenKeys {
    /// Notes `key`; a name not in [`RULE_KEYS`] is no rule key: ignored.
    pub fn insert(&mut self, key: &str) {
        if let Some(bit) = RULE_KEYS.iter().position(|k| *k == key) {
            self.0 |= 1 << bit;
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        RULE_KEYS
            .iter()
            .position(|k| *k == key)
            .is_some_and(|bit| self.0 & (1 << bit) != 0)
    }
}

impl<'a> FromIterator<&'a str> for WrittenKeys {
    fn from_iter<I: IntoIterator<Item = &'a str>>(keys: I) -> Self {
        let mut written = Self::default();
        for key in keys {
            written.insert(key);
        }
        written
    }
}

impl Rules {
    /// These rules (from trigger metadata, where `written` names the keys
    /// the metadata set) with the ScaledObject's settings filling the rest.
    /// Returns each setting's source, keyed as in [`RULE_KEYS`].
    pub fn with_object(
        &self,
        written: &WrittenKeys,
        object: Option<&ObjectSettings>,
    ) -> (Rules, std::collections::BTreeMap<&'static str, Source>) {
        let mut rules = self.clone();
        let mut sources = std::collections::BTreeMap::new();
        let empty = ObjectSettings::default();
        let object = object.unwrap_or(&empty);
        let mut pick = |key: &'static str, from_object: bool| {
            let source = if written.contains(key) {
                Source::Metadata
            } else if from_object {
                Source::ScaledObject
            } else {
                Source::Default
            };
            sources.insert(key, source);
            source == Source::ScaledObject
        };
        if pick("minReplicaCount", object.min_replica_count.is_some()) {
            rules.min_replica_count = object.min_replica_count.unwrap_or_default();
        }
        if pick("maxReplicaCount", object.max_replica_count.is_some()) {
            rules.max_replica_count = object.max_replica_count.unwrap_or_default();
        }
        if pick("cooldownPeriod", object.cooldown_period.is_some()) {
            rules.cooldown_period = object.cooldown_period.unwrap_or_default();
        }
        if pick("pollingInterval", object.polling_interval.is_some()) {
            rules.polling_interval = object.polling_interval.unwrap_or(rules.polling_interval);
        }
        if pick("fallback", object.fallback.is_some()) {
            rules.fallback = object.fallback;
        }
        if pick("behavior", object.behavior.is_some()) {
            rules.behavior = object.behavior.clone();
        }
        (rules, sources)
    }
}
