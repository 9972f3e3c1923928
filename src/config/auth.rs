//! `[auth.<name>]`: credentials hoist holds itself, and the namespaces
//! whose ScaledObjects may use them.
//!
//! Who sends what: the operator writes these (hoist's config file, its
//! environment, the chart's values); a ScaledObject only names a profile
//! with `authRef`. Any tenant who can create a ScaledObject can write any
//! name there, so a profile is bound to the namespaces its owner lists,
//! and a profile without that list is refused at load rather than left
//! open to every namespace.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, KubernetesAccess, KubernetesSettings};

/// `namespaces = ["*"]`: the profile is open to every namespace.
pub const ANY_NAMESPACE: &str = "*";

/// One auth profile: the namespaces that may use it, and KEDA auth param
/// names (`password`, `username`, `sentinelPassword`, `ca`, `cert`, `key`,
/// ...) to where their values are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuthProfile {
    /// Namespaces whose ScaledObjects may name this profile; `"*"` for
    /// any. Required: `None` (not written) is refused at load. A string
    /// is split at commas, so `HOIST_AUTH__ORDERS__NAMESPACES=a,b` works.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "namespace_list"
    )]
    pub namespaces: Option<Vec<String>>,
    /// Every other key is a credential param.
    #[serde(flatten)]
    pub params: BTreeMap<String, AuthValue>,
}

impl AuthProfile {
    /// A profile for ScaledObjects in `namespaces` (`"*"`: any).
    pub fn new<K: Into<String>>(
        namespaces: &[&str],
        params: impl IntoIterator<Item = (K, AuthValue)>,
    ) -> Self {
        Self {
            namespaces: Some(namespaces.iter().map(|n| n.to_string()).collect()),
            params: params
                .into_iter()
                .map(|(name, value)| (name.into(), value))
                .collect(),
        }
    }

    /// Whether a ScaledObject in `namespace` may use the profile.
    pub fn allows(&self, namespace: &str) -> bool {
        self.namespaces
            .iter()
            .flatten()
            .any(|allowed| allowed == ANY_NAMESPACE || allowed == namespace)
    }

    /// Whether the profile is open to every namespace (worth a warning).
    pub fn open_to_all(&self) -> bool {
        self.namespaces
            .iter()
            .flatten()
            .any(|allowed| allowed == ANY_NAMESPACE)
    }
}

/// Where a credential lives. A plain string is the value itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AuthValue {
    Env { env: String },
    File { file: PathBuf },
    Literal(String),
}

fn namespace_list<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        List(Vec<String>),
        Joined(String),
    }
    Ok(Some(match Given::deserialize(deserializer)? {
        Given::List(list) => list,
        Given::Joined(joined) => joined
            .split(',')
            .map(|item| item.trim().to_string())
            .filter(|item| !item.is_empty())
            .collect(),
    }))
}

/// Every profile names its namespaces, each a DNS-1123 label or `*`.
pub(super) fn validate(profiles: &BTreeMap<String, AuthProfile>) -> Result<(), ConfigError> {
    for (name, profile) in profiles {
        let key = format!("auth.{name}.namespaces");
        let invalid = |reason: String| ConfigError::Invalid {
            key: key.clone(),
            reason,
        };
        let Some(namespaces) = &profile.namespaces else {
            return Err(invalid(format!(
                "missing: a profile is bound to the namespaces whose ScaledObjects may use it; \
                 add `namespaces = [\"<namespace>\"]` to [auth.{name}] (e.g. `namespaces = [\"orders\"]`; \
                 `[\"*\"]` lets every namespace use it)"
            )));
        };
        if namespaces.is_empty() {
            return Err(invalid(format!(
                "is empty, so no ScaledObject could use [auth.{name}]: list the namespaces that may, or remove the profile"
            )));
        }
        for namespace in namespaces {
            if namespace != ANY_NAMESPACE && !is_dns_label(namespace) {
                return Err(invalid(format!(
                    "`{namespace}` is not a namespace name (lower-case letters, digits and `-`, at most 63) nor \"*\""
                )));
            }
        }
    }
    Ok(())
}

/// `kubernetes.trigger_authentication` and where its cluster-scoped
/// Secrets live.
pub(super) fn validate_trigger_authentication(
    kubernetes: &KubernetesSettings,
) -> Result<(), ConfigError> {
    if !is_dns_label(&kubernetes.cluster_object_namespace) {
        return Err(ConfigError::Invalid {
            key: "kubernetes.cluster_object_namespace".to_string(),
            reason: format!(
                "`{}` is not a namespace name (lower-case letters, digits and `-`, at most 63)",
                kubernetes.cluster_object_namespace
            ),
        });
    }
    if kubernetes.trigger_authentication && kubernetes.enabled == KubernetesAccess::Off {
        return Err(ConfigError::Invalid {
            key: "kubernetes.trigger_authentication".to_string(),
            reason:
                "reads TriggerAuthentications from the cluster, but kubernetes.enabled is false"
                    .to_string(),
        });
    }
    Ok(())
}

/// A Kubernetes namespace name: an RFC 1123 label.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::super::{Overrides, Settings};
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(&file, text).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Settings::load(Some(&file), env, &Overrides::default())
    }

    #[test]
    fn a_profile_without_namespaces_is_refused_with_how_to_migrate() {
        let error = load("[auth.orders-redis]\npassword = \"x\"\n", &[]).unwrap_err();
        let ConfigError::Invalid { key, reason } = &error else {
            panic!("{error}")
        };
        assert_eq!(key, "auth.orders-redis.namespaces");
        assert!(
            reason.contains("add `namespaces = [\"<namespace>\"]` to [auth.orders-redis]"),
            "{reason}"
        );
        assert!(reason.contains("[\"*\"]"), "{reason}");
    }

    #[test]
    fn namespaces_are_not_a_param_and_are_checked() {
        let settings = load(
            "[auth.orders-redis]\nnamespaces = [\"orders\", \"orders-canary\"]\npassword = \"x\"\n",
            &[],
        )
        .unwrap();
        let profile = &settings.auth["orders-redis"];
        assert_eq!(
            profile.namespaces.as_deref(),
            Some(&["orders".to_string(), "orders-canary".to_string()][..])
        );
        assert_eq!(profile.params.keys().collect::<Vec<_>>(), ["password"]);
        assert!(profile.allows("orders") && !profile.allows("shop"));
        assert!(!profile.open_to_all());

        for (namespaces, named) in [
            ("[]", "is empty"),
            ("[\"Orders\"]", "`Orders`"),
            ("[\"a/b\"]", "`a/b`"),
            ("[\"\"]", "``"),
        ] {
            let error = load(
                &format!("[auth.p]\nnamespaces = {namespaces}\npassword = \"x\"\n"),
                &[],
            )
            .unwrap_err();
            let ConfigError::Invalid { key, reason } = &error else {
                panic!("{error}")
            };
            assert_eq!(key, "auth.p.namespaces");
            assert!(reason.contains(named), "{namespaces}: {reason}");
        }
    }

    #[test]
    fn namespaces_come_from_the_environment_too() {
        let settings = load(
            "",
            &[
                ("HOIST_AUTH__ORDERS__PASSWORD", "x"),
                ("HOIST_AUTH__ORDERS__NAMESPACES", "orders, shop"),
            ],
        )
        .unwrap();
        let profile = &settings.auth["orders"];
        assert!(profile.allows("orders") && profile.allows("shop"));
        assert!(!profile.params.contains_key("namespaces"));

        let open = load("[auth.any]\nnamespaces = [\"*\"]\n", &[]).unwrap();
        assert!(open.auth["any"].open_to_all() && open.auth["any"].allows("anything"));
    }

    #[test]
    fn trigger_authentication_settings_are_checked() {
        let settings = load("[kubernetes]\ntrigger_authentication = true\n", &[]).unwrap();
        assert!(settings.kubernetes.trigger_authentication);
        assert_eq!(settings.kubernetes.cluster_object_namespace, "keda");
        for (text, key) in [
            (
                "[kubernetes]\nenabled = false\ntrigger_authentication = true\n",
                "kubernetes.trigger_authentication",
            ),
            (
                "[kubernetes]\ncluster_object_namespace = \"KEDA\"\n",
                "kubernetes.cluster_object_namespace",
            ),
        ] {
            let error = load(text, &[]).unwrap_err();
            let ConfigError::Invalid { key: got, .. } = &error else {
                panic!("{error}")
            };
            assert_eq!(got, key, "{text}");
        }
    }
}
