//! Who may make hoist track a trigger.
//!
//! Anyone who reaches the gRPC port can send a `ScaledObjectRef` naming any
//! namespace, any ScaledObject and any metadata. KEDA's operator is the
//! only rightful sender, and it sends only what a ScaledObject's trigger
//! says. So, with cluster access, a new trigger is tracked only when its
//! ScaledObject exists in the watch's store and one of its `external` /
//! `external-push` triggers carries exactly the metadata sent (see
//! [`matching_trigger`] for what KEDA itself changes on the way). Without
//! cluster access hoist cannot tell callers apart: it tracks their
//! triggers (reading a source is what any caller could do against the
//! source itself, within `limits.allowed_sources`), but refuses declared
//! routes, which change where other people's traffic goes, and credentials
//! it holds (auth profiles), unless the channel proves the caller (gRPC
//! mTLS) or the operator says every caller is trusted
//! (`grpc.trust_callers`, single-tenant or dev only).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use crate::cluster::{AuthenticationRef, Cluster};

/// What is known of who asked for a new trigger.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The caller is proven (by the cluster or mTLS) or trusted by the
    /// operator, so hoist may lend it what it holds: routes, credentials.
    pub proven: bool,
    /// Checked against its ScaledObject in the cluster: every value but
    /// those of `*FromEnv` keys (which KEDA reads from the scale target's
    /// environment) is the ScaledObject's own.
    pub checked_in_cluster: bool,
    /// The matching trigger's `authenticationRef`.
    pub authentication: Option<AuthenticationRef>,
}

impl Caller {
    /// Proven by the channel, or trusted by the operator.
    pub fn trusted() -> Self {
        Self {
            proven: true,
            ..Self::default()
        }
    }

    /// Anyone who reached the gRPC port.
    pub fn unproven() -> Self {
        Self::default()
    }

    /// Checked against its ScaledObject in the cluster.
    pub fn from_cluster(authentication: Option<AuthenticationRef>) -> Self {
        Self {
            proven: true,
            checked_in_cluster: true,
            authentication,
        }
    }
}

/// Calls that may wait for a new ScaledObject at once (KEDA asks about a
/// new one once per trigger; more than this waiting means strangers).
const MAX_WAITING: usize = 256;

/// Why a caller's trigger is not tracked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallerError {
    /// A name no Kubernetes object can have (checked before any pattern
    /// or route name sees it: `*` or `a/b` would act as wildcards there).
    #[error("`{field}`: `{value}` is not a Kubernetes {what}")]
    BadName {
        field: &'static str,
        value: String,
        what: &'static str,
    },
    #[error(
        "ScaledObject {namespace}/{name} is not in the cluster (no ScaledObject or ScaledJob of that name seen by hoist's watch within {waited:?}): hoist serves the triggers of existing ScaledObjects and ScaledJobs only"
    )]
    NoScaledObject {
        namespace: String,
        name: String,
        waited: Duration,
    },
    #[error("ScaledObject {namespace}/{name} has no trigger with the metadata sent: {difference}")]
    Mismatch {
        namespace: String,
        name: String,
        difference: String,
    },
    #[error("ScaledObject {namespace}/{name}: the trigger's authenticationRef: {reason}")]
    BadAuthenticationRef {
        namespace: String,
        name: String,
        reason: String,
    },
    /// The store cannot answer yet: the caller is neither let in nor
    /// turned away (KEDA asks again).
    #[error("cannot check the caller against the cluster's ScaledObjects: {0}")]
    Unchecked(String),
}

/// How callers are proven, from hoist's settings and cluster access.
#[derive(Clone)]
pub enum CallerPolicy {
    /// Every new trigger is checked against the ScaledObject store,
    /// waiting at most `wait` for a ScaledObject the watch has not seen.
    Cluster {
        cluster: Arc<Cluster>,
        wait: Duration,
        /// Calls waiting for a ScaledObject the watch has not seen: a
        /// stranger naming ones that do not exist cannot park unbounded
        /// calls (each woken by every watch event); past it, no wait.
        waiting: Arc<tokio::sync::Semaphore>,
    },
    /// The channel proves the caller (gRPC mTLS), or the operator trusts
    /// every caller (`grpc.trust_callers`).
    Trusted,
    /// Anyone may call: triggers are tracked, declared routes refused.
    Unproven,
}

impl CallerPolicy {
    /// The policy for these settings: cluster access wins; then mTLS on
    /// the gRPC port or `grpc.trust_callers`.
    pub fn new(
        cluster: Option<Arc<Cluster>>,
        wait: Duration,
        mutual_tls: bool,
        trust_callers: bool,
    ) -> Self {
        match cluster {
            Some(cluster) => CallerPolicy::Cluster {
                cluster,
                wait,
                waiting: Arc::new(tokio::sync::Semaphore::new(MAX_WAITING)),
            },
            None if mutual_tls || trust_callers => CallerPolicy::Trusted,
            None => CallerPolicy::Unproven,
        }
    }

    /// How long a caller checked against the cluster may wait for it.
    pub fn wait(&self) -> std::time::Duration {
        match self {
            CallerPolicy::Cluster { wait, .. } => *wait,
            _ => std::time::Duration::ZERO,
        }
    }

    /// What is known of the caller of a new trigger, or why it may not
    /// have one.
    pub async fn check(
        &self,
        namespace: &str,
        name: &str,
        metadata: &HashMap<String, String>,
    ) -> Result<Caller, CallerError> {
        check_names(namespace, name)?;
        match self {
            CallerPolicy::Trusted => Ok(Caller::trusted()),
            CallerPolicy::Unproven => Ok(Caller::unproven()),
            CallerPolicy::Cluster {
                cluster,
                wait,
                waiting,
            } => {
                let object = find_object(cluster, namespace, name, *wait, waiting).await?;
                let trigger =
                    matching_trigger(triggers_of(&object), metadata).map_err(|difference| {
                        CallerError::Mismatch {
                            namespace: namespace.to_string(),
                            name: name.to_string(),
                            difference,
                        }
                    })?;
                let authentication =
                    AuthenticationRef::from_trigger(trigger).map_err(|reason| {
                        CallerError::BadAuthenticationRef {
                            namespace: namespace.to_string(),
                            name: name.to_string(),
                            reason,
                        }
                    })?;
                Ok(Caller::from_cluster(authentication))
            }
        }
    }
}

/// The ScaledObject from the store, waiting up to `wait` for one the watch
/// has not seen yet (KEDA asks about a new ScaledObject as soon as it is
/// created, and hoist's watch may be a moment behind).
async fn find_object(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    wait: Duration,
    waiting: &tokio::sync::Semaphore,
) -> Result<Arc<kube::api::DynamicObject>, CallerError> {
    let mut changes = cluster.changes();
    if !cluster.has_listed() {
        cluster.wait_synced().await;
        if !cluster.has_listed() {
            let reason = cluster
                .watch_error()
                .unwrap_or_else(|| "the ScaledObject watch has not listed them yet".to_string());
            return Err(CallerError::Unchecked(reason));
        }
    }
    // The permit to wait and the deadline, from the first miss on (the
    // usual call finds its object at once and takes no permit).
    let mut waiting_since_miss = None;
    loop {
        let found = cluster.raw_trigger_owner(namespace, name);
        if let Ok(Some(object)) = found {
            return Ok(object);
        }
        let (_permit, wait, deadline) = waiting_since_miss.get_or_insert_with(|| {
            let (permit, wait) = match waiting.try_acquire() {
                Ok(permit) => (Some(permit), wait),
                Err(_) => (None, Duration::ZERO),
            };
            (permit, wait, tokio::time::Instant::now() + wait)
        });
        let (wait, deadline) = (*wait, *deadline);
        match tokio::time::timeout_at(deadline, changes.recv()).await {
            Err(_) | Ok(Err(RecvError::Closed)) => {
                return Err(match found {
                    Err(reason) => CallerError::Unchecked(format!(
                        "no ScaledObject {namespace}/{name}, and ScaledJobs cannot be read: {reason}"
                    )),
                    Ok(_) => CallerError::NoScaledObject {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        waited: wait,
                    },
                });
            }
            Ok(Ok(_) | Err(RecvError::Lagged(_))) => {}
        }
    }
}

/// A ScaledObject's (or ScaledJob's) `spec.triggers`.
pub fn triggers_of(object: &kube::api::DynamicObject) -> &[Value] {
    object
        .data
        .pointer("/spec/triggers")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Namespace and ScaledObject name as Kubernetes allows them: a namespace
/// is a DNS-1123 label, a ScaledObject's name a DNS-1123 subdomain.
pub fn check_names(namespace: &str, name: &str) -> Result<(), CallerError> {
    if !dns1123_label(namespace) {
        return Err(CallerError::BadName {
            field: "namespace",
            value: shown(namespace),
            what: "namespace name (a DNS-1123 label: at most 63 of a-z, 0-9 and `-`, starting and ending with a letter or digit)",
        });
    }
    let subdomain = name.len() <= 253 && name.split('.').all(dns1123_label);
    if !subdomain {
        return Err(CallerError::BadName {
            field: "name",
            value: shown(name),
            what: "object name (a DNS-1123 subdomain: at most 253 of a-z, 0-9, `-` and `.`)",
        });
    }
    Ok(())
}

fn dns1123_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// A stranger's text in an error message: bounded, printable.
fn shown(text: &str) -> String {
    text.chars()
        .take(80)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The trigger of a ScaledObject (`spec.triggers`) that KEDA sends
/// `sent` for, or what differs from the closest one. The rule, from
/// KEDA's external scaler (`pkg/scalers/external_scaler.go`): KEDA sends
/// the trigger's `metadata` map as written, except that a key ending in
/// `FromEnv` carries the value of the environment variable it names, read
/// from the scale target's containers, and is left out when that variable
/// is unset or empty. So every other key must be sent with exactly its
/// value, a `FromEnv` key may be sent with any value or not at all, and
/// the call may carry no key the trigger lacks. Only `external` and
/// `external-push` triggers call external scalers.
///
/// Messages name keys, never values: a resolved `FromEnv` value may be a
/// secret.
pub fn matching_trigger<'a>(
    triggers: &'a [Value],
    sent: &HashMap<String, String>,
) -> Result<&'a Value, String> {
    let mut closest: Option<(usize, String)> = None;
    let mut externals = 0;
    for trigger in triggers {
        let kind = trigger.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "external" && kind != "external-push" {
            continue;
        }
        externals += 1;
        let written: HashMap<&str, &str> = trigger
            .get("metadata")
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(key, value)| Some((key.as_str(), value.as_str()?)))
                    .collect()
            })
            .unwrap_or_default();
        let differences = differences(&written, sent);
        if differences.is_empty() {
            return Ok(trigger);
        }
        let count = differences.len();
        if closest.as_ref().is_none_or(|(best, _)| count < *best) {
            closest = Some((count, differences.join("; ")));
        }
    }
    Err(match closest {
        Some((_, difference)) if externals == 1 => difference,
        Some((_, difference)) => {
            format!("of its {externals} external triggers the closest differs: {difference}")
        }
        None => "it has no `external` or `external-push` trigger".to_string(),
    })
}

/// What keeps `sent` from being what KEDA sends for `written`.
fn differences(written: &HashMap<&str, &str>, sent: &HashMap<String, String>) -> Vec<String> {
    let mut differs = Vec::new();
    let mut missing = Vec::new();
    let mut extra = Vec::new();
    for (key, value) in written {
        let from_env = key.ends_with("FromEnv");
        match sent.get(*key) {
            Some(_) if from_env => {}
            Some(sent) if sent == value => {}
            Some(_) => differs.push(*key),
            None if from_env => {}
            None => missing.push(*key),
        }
    }
    for key in sent.keys() {
        if !written.contains_key(key.as_str()) {
            extra.push(key.as_str());
        }
    }
    let list = |keys: &mut Vec<&str>| {
        keys.sort_unstable();
        keys.iter()
            .map(|key| format!("`{}`", shown(key)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut found = Vec::new();
    if !differs.is_empty() {
        found.push(format!("the value of {} differs", list(&mut differs)));
    }
    if !missing.is_empty() {
        found.push(format!("{} not sent", list(&mut missing)));
    }
    if !extra.is_empty() {
        found.push(format!("{} not in the trigger", list(&mut extra)));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sent(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn triggers() -> Vec<Value> {
        vec![
            json!({"type": "cpu", "metadata": {"value": "50"}}),
            json!({"type": "external-push", "metadata": {
                "scalerAddress": "hoist.keda:9090", "scaler": "redis",
                "address": "redis:6379", "listName": "jobs",
                "passwordFromEnv": "REDIS_PASSWORD"},
                "authenticationRef": {"name": "redis-auth"}}),
        ]
    }

    #[test]
    fn exact_metadata_matches_and_from_env_keys_may_carry_any_value_or_be_dropped() {
        let triggers = triggers();
        let base = [
            ("scalerAddress", "hoist.keda:9090"),
            ("scaler", "redis"),
            ("address", "redis:6379"),
            ("listName", "jobs"),
        ];
        let resolved = [base.as_slice(), &[("passwordFromEnv", "s3cret")]].concat();
        let found = matching_trigger(&triggers, &sent(&resolved)).unwrap();
        assert_eq!(found["authenticationRef"]["name"], "redis-auth");
        // The variable unset or empty: KEDA drops the key.
        assert!(matching_trigger(&triggers, &sent(&base)).is_ok());
    }

    #[test]
    fn a_changed_missing_or_added_key_is_named_without_its_value() {
        let triggers = triggers();
        let forged = sent(&[
            ("scalerAddress", "hoist.keda:9090"),
            ("scaler", "redis"),
            ("address", "attacker:6379"),
            ("upstream", "admin:9091"),
        ]);
        let difference = matching_trigger(&triggers, &forged).unwrap_err();
        assert!(difference.contains("`address` differs"), "{difference}");
        assert!(difference.contains("`listName` not sent"), "{difference}");
        assert!(
            difference.contains("`upstream` not in the trigger"),
            "{difference}"
        );
        assert!(!difference.contains("attacker"), "{difference}");
    }

    #[test]
    fn only_external_triggers_call_hoist() {
        let cpu = sent(&[("value", "50")]);
        // A cpu trigger's metadata is compared with the external one only.
        assert_eq!(
            matching_trigger(&triggers(), &cpu).unwrap_err(),
            "`address`, `listName`, `scaler`, `scalerAddress` not sent; `value` not in the trigger"
        );
        assert_eq!(
            matching_trigger(&[], &cpu).unwrap_err(),
            "it has no `external` or `external-push` trigger"
        );
    }

    #[test]
    fn names_are_dns_1123() {
        assert!(check_names("team-a", "web.v2").is_ok());
        for (namespace, name) in [
            ("*", "web"),
            ("a/b", "web"),
            ("Team", "web"),
            ("-a", "web"),
            ("", "web"),
            ("team", "a/b"),
            ("team", "*"),
            ("team", ""),
            ("team", "web..v2"),
        ] {
            let error = check_names(namespace, name).unwrap_err();
            assert!(matches!(error, CallerError::BadName { .. }), "{error}");
        }
        assert!(check_names(&"a".repeat(64), "web").is_err());
        assert!(check_names("a", &format!("{}.b", "a".repeat(63))).is_ok());
    }
}
