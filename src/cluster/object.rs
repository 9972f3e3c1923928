//! The parts of a KEDA ScaledObject hoist reads: its scale target and the
//! settings that are defaults for its engine-mode triggers.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use serde::Deserialize;

use super::ClusterError;
use crate::engine::rules::{Behavior, Fallback, ObjectSettings, Rules};

/// KEDA's defaults for fields a ScaledObject leaves out
/// (`apis/keda/v1alpha1/scaledobject_types.go`).
pub const KEDA_DEFAULT_MAX_REPLICAS: u32 = 100;
pub const KEDA_DEFAULT_COOLDOWN: u64 = 300;

/// The HPA's default scale-down stabilization window, when a ScaledObject
/// gives no `behavior` (or none for `scaleDown`).
pub const HPA_DEFAULT_SCALE_DOWN_WINDOW: u32 = 300;

/// What a ScaledObject scales: `spec.scaleTargetRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleTarget {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

impl ScaleTarget {
    /// (group, version); the core group is "".
    pub fn group_version(&self) -> (&str, &str) {
        match self.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", self.api_version.as_str()),
        }
    }
}

/// A reference to ScaledObject `namespace/name`, for an Event on it.
pub fn scaled_object_reference(
    namespace: &str,
    name: &str,
    uid: Option<String>,
    resource_version: Option<String>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some("keda.sh/v1alpha1".into()),
        kind: Some("ScaledObject".into()),
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        uid,
        resource_version,
        field_path: None,
    }
}

/// One ScaledObject, as far as engine mode needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledObjectView {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub target: ScaleTarget,
    /// The settings the spec writes (absent fields are `None`).
    pub settings: ObjectSettings,
    /// Why a field could not be read, if one could not (the rest is used).
    pub unreadable: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    scale_target_ref: Option<TargetRef>,
    min_replica_count: Option<serde_json::Value>,
    max_replica_count: Option<serde_json::Value>,
    cooldown_period: Option<serde_json::Value>,
    polling_interval: Option<serde_json::Value>,
    fallback: Option<serde_json::Value>,
    advanced: Option<Advanced>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TargetRef {
    api_version: Option<String>,
    kind: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Advanced {
    horizontal_pod_autoscaler_config: Option<HpaConfig>,
}

#[derive(Deserialize, Default)]
struct HpaConfig {
    behavior: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KedaFallback {
    failure_threshold: u32,
    replicas: u32,
}

impl ScaledObjectView {
    pub fn parse(object: &DynamicObject) -> Result<Self, ClusterError> {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let scaled_object = format!("{namespace}/{name}");
        let spec: Spec = match object.data.get("spec") {
            Some(spec) => {
                serde_json::from_value(spec.clone()).map_err(|e| ClusterError::BadScaledObject {
                    scaled_object: scaled_object.clone(),
                    reason: format!("spec: {e}"),
                })?
            }
            None => Spec::default(),
        };
        let target = spec
            .scale_target_ref
            .and_then(|t| {
                Some(ScaleTarget {
                    // KEDA's default target is an apps/v1 Deployment.
                    api_version: t
                        .api_version
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| "apps/v1".into()),
                    kind: t
                        .kind
                        .filter(|k| !k.is_empty())
                        .unwrap_or_else(|| "Deployment".into()),
                    name: t.name.filter(|n| !n.is_empty())?,
                })
            })
            .ok_or_else(|| ClusterError::BadScaledObject {
                scaled_object: scaled_object.clone(),
                reason: "spec.scaleTargetRef.name is missing".into(),
            })?;
        let mut unreadable = Vec::new();
        let mut field = |name: &str, value: Option<serde_json::Value>| -> Option<u64> {
            let value = value?;
            match value.as_u64() {
                Some(number) => Some(number),
                None => {
                    unreadable.push(format!(
                        "spec.{name}: `{value}` is not a non-negative integer"
                    ));
                    None
                }
            }
        };
        let min = field("minReplicaCount", spec.min_replica_count);
        let max = field("maxReplicaCount", spec.max_replica_count);
        let cooldown = field("cooldownPeriod", spec.cooldown_period);
        let polling = field("pollingInterval", spec.polling_interval).filter(|p| *p > 0);
        let as_u32 = |value: Option<u64>| value.map(|v| v.min(u64::from(u32::MAX)) as u32);
        let fallback = match spec.fallback {
            None => None,
            Some(value) => match serde_json::from_value::<KedaFallback>(value) {
                Ok(f) => Some(Fallback {
                    failure_threshold: f.failure_threshold,
                    replicas: f.replicas,
                }),
                Err(e) => {
                    unreadable.push(format!("spec.fallback: {e}"));
                    None
                }
            },
        };
        let behavior = match spec
            .advanced
            .and_then(|a| a.horizontal_pod_autoscaler_config)
            .and_then(|h| h.behavior)
        {
            None => None,
            Some(value) => match serde_json::from_value::<Behavior>(value) {
                Ok(behavior) => Some(behavior),
                Err(e) => {
                    unreadable.push(format!(
                        "spec.advanced.horizontalPodAutoscalerConfig.behavior: {e}"
                    ));
                    None
                }
            },
        };
        Ok(Self {
            namespace,
            name,
            uid: object.metadata.uid.clone(),
            resource_version: object.metadata.resource_version.clone(),
            target,
            settings: ObjectSettings {
                min_replica_count: as_u32(min),
                max_replica_count: as_u32(max),
                cooldown_period: cooldown,
                polling_interval: polling,
                fallback,
                behavior,
            },
            unreadable,
        })
    }

    /// The reference Events point at.
    pub fn reference(&self) -> ObjectReference {
        scaled_object_reference(
            &self.namespace,
            &self.name,
            self.uid.clone(),
            self.resource_version.clone(),
        )
    }

    /// The count KEDA caps the HPA at.
    pub fn keda_max_replicas(&self) -> u32 {
        self.settings
            .max_replica_count
            .unwrap_or(KEDA_DEFAULT_MAX_REPLICAS)
    }

    /// How long KEDA waits after the last activity before scaling to zero.
    pub fn keda_cooldown(&self) -> u64 {
        self.settings
            .cooldown_period
            .unwrap_or(KEDA_DEFAULT_COOLDOWN)
    }

    /// Where the ScaledObject's own settings make KEDA or the HPA limit the
    /// engine's counts a second time: each a sentence saying what happens
    /// and how to avoid it.
    pub fn relimits(&self, rules: &Rules) -> Vec<String> {
        let mut found = Vec::new();
        let keda_min = self.settings.min_replica_count.unwrap_or(0);
        let cooldown = self.keda_cooldown();
        if keda_min == 0 && rules.min_replica_count == 0 && cooldown > 0 {
            found.push(format!(
                "KEDA waits spec.cooldownPeriod ({cooldown} s{}) after the engine turns inactive before scaling to zero, on top of the engine's own cooldown ({} s): set spec.cooldownPeriod: 0 and give the engine its cooldown in trigger metadata (`cooldownPeriod`)",
                if self.settings.cooldown_period.is_none() { ", KEDA's default" } else { "" },
                rules.cooldown_period
            ));
        }
        let behavior = self.settings.behavior.clone().unwrap_or_default();
        let down_window = behavior
            .scale_down
            .as_ref()
            .and_then(|d| d.stabilization_window_seconds)
            .unwrap_or(HPA_DEFAULT_SCALE_DOWN_WINDOW);
        if down_window > 0 {
            found.push(format!(
                "the HPA holds each engine scale-down for its own scale-down stabilization window ({down_window} s{}): set spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds: 0 and give the engine its window in trigger metadata",
                if behavior.scale_down.is_none() { ", the HPA's default" } else { "" }
            ));
        }
        let up_window = behavior
            .scale_up
            .as_ref()
            .and_then(|u| u.stabilization_window_seconds)
            .unwrap_or(0);
        if up_window > 0 {
            found.push(format!(
                "the HPA holds each engine scale-up for its scale-up stabilization window ({up_window} s): set behavior.scaleUp.stabilizationWindowSeconds: 0 in the ScaledObject"
            ));
        }
        for (direction, rules) in [
            ("scaleUp", &behavior.scale_up),
            ("scaleDown", &behavior.scale_down),
        ] {
            let Some(rules) = rules else { continue };
            if limits_rate(rules) {
                found.push(format!(
                    "the HPA applies the ScaledObject's behavior.{direction} policies again to the engine's counts and they can hold a step back: allow at least 100 % per 15 s there (or leave {direction} out), and give the engine its policies in trigger metadata (`behavior`)"
                ));
            }
        }
        if let Some(fallback) = self.settings.fallback {
            found.push(format!(
                "KEDA applies spec.fallback itself when hoist answers an error (a replica count it cannot read): after {} errors in a row KEDA runs {} replicas, whatever the engine last decided; give the engine its fallback in trigger metadata and leave spec.fallback out",
                fallback.failure_threshold, fallback.replicas
            ));
        }
        let keda_max = self.keda_max_replicas();
        if keda_max < rules.max_replica_count {
            found.push(format!(
                "KEDA caps the HPA at spec.maxReplicaCount {keda_max}{}, below the engine's maxReplicaCount {}: the app never runs more than {keda_max}; the engine computes from the real count",
                if self.settings.max_replica_count.is_none() { " (KEDA's default)" } else { "" },
                rules.max_replica_count
            ));
        }
        found.extend(
            self.unreadable
                .iter()
                .map(|reason| format!("ignored {reason}")),
        );
        found
    }
}

/// Whether an HPA rate rule can hold back a step the engine took: it is
/// disabled, picks the smallest policy, or none of its policies allows
/// doubling within one HPA sync (100 % per 15 s).
fn limits_rate(rules: &crate::engine::rules::BehaviorRules) -> bool {
    use crate::engine::hpa::{PolicyType, SelectPolicy};
    if matches!(
        rules.select_policy,
        Some(SelectPolicy::Disabled | SelectPolicy::Min)
    ) {
        return true;
    }
    rules.policies.as_ref().is_some_and(|policies| {
        !policies.iter().any(|policy| {
            policy.kind == PolicyType::Percent && policy.value >= 100 && policy.period_seconds <= 15
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(spec: serde_json::Value) -> ScaledObjectView {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "worker", "namespace": "orders", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap();
        ScaledObjectView::parse(&object).unwrap()
    }

    #[test]
    fn the_spec_is_read_with_kedas_defaults_and_bad_fields_named() {
        let plain = view(json!({"scaleTargetRef": {"name": "worker"}}));
        assert_eq!(plain.target.api_version, "apps/v1");
        assert_eq!(plain.target.kind, "Deployment");
        assert_eq!(plain.settings, ObjectSettings::default());
        assert_eq!(plain.keda_max_replicas(), 100);
        assert_eq!(plain.keda_cooldown(), 300);

        let odd = view(json!({
            "scaleTargetRef": {"name": "worker"},
            "maxReplicaCount": "lots",
            "fallback": {"failureThreshold": 3, "replicas": 6},
        }));
        assert_eq!(odd.settings.max_replica_count, None);
        assert_eq!(
            odd.settings.fallback,
            Some(Fallback {
                failure_threshold: 3,
                replicas: 6
            })
        );
        assert!(
            odd.unreadable[0].contains("spec.maxReplicaCount"),
            "{:?}",
            odd.unreadable
        );

        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": "worker", "namespace": "orders"},
            "spec": {"scaleTargetRef": {}},
        }))
        .unwrap();
        let error = ScaledObjectView::parse(&object).unwrap_err().to_string();
        assert!(error.contains("spec.scaleTargetRef.name"), "{error}");
    }

    #[test]
    fn only_settings_that_limit_the_engine_again_are_warned_about() {
        let rules = Rules {
            max_replica_count: 20,
            ..Rules::default()
        };
        // KEDA's and the HPA's defaults: a second cooldown, a second
        // 300 s window, and KEDA's max of 100 above the engine's 20.
        let defaults = view(json!({"scaleTargetRef": {"name": "worker"}}));
        let warnings = defaults.relimits(&rules);
        assert_eq!(warnings.len(), 2, "{warnings:#?}");
        assert!(warnings[0].contains("cooldownPeriod (300 s, KEDA's default)"));
        assert!(warnings[1].contains("300 s, the HPA's default"));

        // The pass-through settings docs/engine.md recommends: nothing to say.
        let through = view(json!({
            "scaleTargetRef": {"name": "worker"},
            "maxReplicaCount": 20,
            "cooldownPeriod": 0,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 15}]},
                "scaleDown": {"stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
            }}},
        }));
        assert_eq!(through.relimits(&rules), Vec::<String>::new());

        let tight = view(json!({
            "scaleTargetRef": {"name": "worker"},
            "maxReplicaCount": 8,
            "cooldownPeriod": 0,
            "fallback": {"failureThreshold": 3, "replicas": 2},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
                "scaleDown": {"stabilizationWindowSeconds": 0, "selectPolicy": "Disabled"},
            }}},
        }));
        let warnings = tight.relimits(&rules);
        assert_eq!(warnings.len(), 4, "{warnings:#?}");
        assert!(warnings[0].contains("behavior.scaleUp policies"));
        assert!(warnings[1].contains("behavior.scaleDown policies"));
        assert!(warnings[2].contains("after 3 errors in a row KEDA runs 2 replicas"));
        assert!(
            warnings[3].contains("spec.maxReplicaCount 8, below the engine's maxReplicaCount 20")
        );
    }
}
