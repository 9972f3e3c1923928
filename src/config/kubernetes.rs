//! `[kubernetes]`: how hoist reaches the cluster's API.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[kubernetes]`: where engine mode reads replica counts and ScaledObjects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSettings {
    /// `auto` (on when a kubeconfig or in-cluster service account is
    /// found), `true` (fail at start without one) or `false`.
    pub enabled: KubernetesAccess,
    /// A kubeconfig to use instead of `KUBECONFIG`, `~/.kube/config` or the
    /// in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// How long one API call may take.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Post Events on ScaledObjects: each engine rescale, and warnings.
    pub events: bool,
    /// How long a call about a ScaledObject the watch has not seen waits
    /// for it (a newly created one) before it is refused.
    #[serde(with = "humantime_serde")]
    pub new_object_wait: Duration,
    /// Resolve a trigger's `authenticationRef` as KEDA does for its
    /// built-in scalers: watch TriggerAuthentications,
    /// ClusterTriggerAuthentications and the Secrets they read (RBAC:
    /// list/watch on all three, cluster-wide). Off by default: it
    /// lets hoist read every Secret in the cluster.
    pub trigger_authentication: bool,
    /// Where a ClusterTriggerAuthentication's `secretTargetRef` Secrets
    /// live (KEDA's `clusterObjectNamespace`, its own namespace).
    pub cluster_object_namespace: String,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            enabled: KubernetesAccess::Auto,
            kubeconfig: None,
            timeout: Duration::from_secs(5),
            events: true,
            new_object_wait: Duration::from_secs(3),
            trigger_authentication: false,
            cluster_object_namespace: "keda".to_string(),
        }
    }
}

/// `kubernetes.enabled`: `"auto"`, `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubernetesAccess {
    Auto,
    On,
    Off,
}

impl Serialize for KubernetesAccess {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            KubernetesAccess::Auto => "auto",
            KubernetesAccess::On => "true",
            KubernetesAccess::Off => "false",
        })
    }
}

impl<'de> Deserialize<'de> for KubernetesAccess {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Bool(bool),
            Word(String),
        }
        match Given::deserialize(deserializer)? {
            Given::Bool(true) => Ok(KubernetesAccess::On),
            Given::Bool(false) => Ok(KubernetesAccess::Off),
            Given::Word(word) => match word.to_ascii_lowercase().as_str() {
                "auto" => Ok(KubernetesAccess::Auto),
                "true" => Ok(KubernetesAccess::On),
                "false" => Ok(KubernetesAccess::Off),
                _ => Err(serde::de::Error::custom(format!(
                    "`{word}` is not \"auto\", true or false"
                ))),
            },
        }
    }
}
