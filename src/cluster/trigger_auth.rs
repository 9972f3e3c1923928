//! A trigger's `authenticationRef`, resolved as KEDA resolves it for its
//! built-in scalers: a `TriggerAuthentication` in the ScaledObject's
//! namespace or a `ClusterTriggerAuthentication`, whose `secretTargetRef`
//! entries read Secrets (the ScaledObject's namespace, or for a
//! ClusterTriggerAuthentication `kubernetes.cluster_object_namespace`).
//!
//! Who sends what: the reference comes from a ScaledObject, written by
//! whoever may create ScaledObjects in its namespace; the
//! TriggerAuthentication and its Secrets are read from that same
//! namespace, so RBAC on that namespace already decides who may use them.
//! A ClusterTriggerAuthentication is cluster-scoped: whoever may create
//! one (a cluster admin) lends its Secrets to every namespace, as in KEDA.
//! All three are read from watched stores (so a rotated Secret applies at
//! once), never on request, so a caller cannot make hoist hammer the API.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::watched::Watched;
use crate::config::KubernetesSettings;
use crate::metadata::AuthParams;

/// Which resource an `authenticationRef` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthenticationKind {
    /// `kind` absent or `TriggerAuthentication`: in the ScaledObject's namespace.
    TriggerAuthentication,
    /// `kind: ClusterTriggerAuthentication`: cluster-scoped.
    ClusterTriggerAuthentication,
}

impl AuthenticationKind {
    /// The resource's kind, as written in `authenticationRef.kind`.
    pub fn name(self) -> &'static str {
        match self {
            AuthenticationKind::TriggerAuthentication => "TriggerAuthentication",
            AuthenticationKind::ClusterTriggerAuthentication => "ClusterTriggerAuthentication",
        }
    }
}

/// A ScaledObject trigger's `authenticationRef`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AuthenticationRef {
    pub name: String,
    pub kind: AuthenticationKind,
}

impl AuthenticationRef {
    /// The `authenticationRef` of one entry of a ScaledObject's
    /// `spec.triggers` (`{type, metadata, authenticationRef}`); `None`
    /// when it has none.
    pub fn from_trigger(trigger: &Value) -> Result<Option<Self>, String> {
        let reference = match trigger.get("authenticationRef") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(reference)) => reference,
            Some(_) => return Err("authenticationRef: must be an object {name, kind}".into()),
        };
        let name = match reference.get("name") {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            _ => return Err("authenticationRef.name: missing or not a string".into()),
        };
        let kind = match reference.get("kind") {
            None | Some(Value::Null) => AuthenticationKind::TriggerAuthentication,
            Some(Value::String(kind)) if kind.is_empty() || kind == "TriggerAuthentication" => {
                AuthenticationKind::TriggerAuthentication
            }
            Some(Value::String(kind)) if kind == "ClusterTriggerAuthentication" => {
                AuthenticationKind::ClusterTriggerAuthentication
            }
            Some(other) => {
                return Err(format!(
                    "authenticationRef.kind: {other} is not TriggerAuthentication or ClusterTriggerAuthentication"
                ));
            }
        };
        Ok(Some(Self { name, kind }))
    }

    /// `TriggerAuthentication shop/orders` or `ClusterTriggerAuthentication orders`.
    pub fn describe(&self, namespace: &str) -> String {
        match self.kind {
            AuthenticationKind::TriggerAuthentication => {
                format!("TriggerAuthentication {namespace}/{}", self.name)
            }
            AuthenticationKind::ClusterTriggerAuthentication => {
                format!("ClusterTriggerAuthentication {}", self.name)
            }
        }
    }
}

/// The params an `authenticationRef` gives a trigger.
#[derive(Clone, PartialEq)]
pub struct ResolvedAuth {
    /// Keys lower-cased, as an auth profile's (see `metadata::AuthParams`).
    pub params: AuthParams,
    /// Changes whenever the TriggerAuthentication or a Secret it reads
    /// changes (their resourceVersions), so a trigger can be re-parsed
    /// when its credentials rotate.
    pub version: String,
}

impl std::fmt::Debug for ResolvedAuth {
    // Params are credentials: only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedAuth")
            .field("params", &self.params.keys().collect::<Vec<_>>())
            .field("version", &self.version)
            .finish()
    }
}

/// Why an `authenticationRef` gives no params. Names the
/// TriggerAuthentication, Secret and key; never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TriggerAuthError {
    #[error(
        "the trigger's authenticationRef names {auth}, but hoist does not read TriggerAuthentications (kubernetes.trigger_authentication = false, or no cluster access)"
    )]
    Disabled { auth: String },
    /// The watch has not listed the resource yet, or cannot.
    #[error("{auth}: {resource} are not readable yet: {reason}")]
    NotSynced {
        auth: String,
        resource: &'static str,
        reason: String,
    },
    #[error("{auth} does not exist (keda.sh/v1alpha1)")]
    NotFound { auth: String },
    #[error(
        "{auth}: secretTargetRef parameter `{parameter}` reads Secret {namespace}/{secret}, which does not exist"
    )]
    NoSecret {
        auth: String,
        parameter: String,
        namespace: String,
        secret: String,
    },
    #[error(
        "{auth}: secretTargetRef parameter `{parameter}` reads key `{key}` of Secret {namespace}/{secret}, which has no such key"
    )]
    NoKey {
        auth: String,
        parameter: String,
        namespace: String,
        secret: String,
        key: String,
    },
    #[error("{auth}: `spec.{field}` is not supported by hoist: {reason}")]
    Unsupported {
        auth: String,
        field: String,
        reason: String,
    },
    #[error("{auth}: {reason}")]
    Invalid { auth: String, reason: String },
}

fn keda_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("keda.sh", "v1alpha1", kind), plural)
}

fn trigger_authentications() -> ApiResource {
    keda_resource("TriggerAuthentication", "triggerauthentications")
}

fn cluster_trigger_authentications() -> ApiResource {
    keda_resource(
        "ClusterTriggerAuthentication",
        "clustertriggerauthentications",
    )
}

/// The 403 advice for these watches.
const GRANT: &str = " cluster-wide (the chart's kubernetes.triggerAuthentication value grants it)";

/// An error unless `watched` has listed and is not failing.
fn readable<K: kube::Resource + Clone + 'static>(
    watched: &Watched<K>,
    auth: &str,
) -> Result<(), TriggerAuthError>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match watched.unreadable() {
        None => Ok(()),
        Some(reason) => Err(TriggerAuthError::NotSynced {
            auth: auth.to_string(),
            resource: watched.resource(),
            reason,
        }),
    }
}

/// Watched TriggerAuthentications, ClusterTriggerAuthentications and
/// Secrets, cluster-wide.
pub(super) struct TriggerAuthStores {
    namespaced: Watched<DynamicObject>,
    cluster: Watched<DynamicObject>,
    secrets: Watched<Secret>,
    cluster_object_namespace: String,
}

impl TriggerAuthStores {
    /// Starts the three watches; they end with `cancel`.
    pub(super) fn start(
        client: &kube::Client,
        settings: &KubernetesSettings,
        cancel: &CancellationToken,
    ) -> Self {
        let namespaced = watch_dynamic(
            client,
            trigger_authentications(),
            "triggerauthentications.keda.sh",
            cancel,
        );
        let cluster = watch_dynamic(
            client,
            cluster_trigger_authentications(),
            "clustertriggerauthentications.keda.sh",
            cancel,
        );
        // Every Secret: a TriggerAuthentication may name any. No selector
        // would stay correct (Secrets carry no mark of being read by one).
        // What is kept is trimmed to what resolution reads.
        let secrets = Watched::start(
            (Api::<Secret>::all(client.clone()), ()),
            ("secrets", GRANT),
            |secret: &mut Secret| {
                secret.managed_fields_mut().clear();
                // kubectl apply keeps the whole Secret, data and all, here.
                secret.annotations_mut().clear();
                secret.string_data = None;
            },
            cancel,
            |_| {},
        );
        info!(
            "resolving authenticationRef from TriggerAuthentications, ClusterTriggerAuthentications and Secrets (kubernetes.trigger_authentication)"
        );
        Self {
            namespaced,
            cluster,
            secrets,
            cluster_object_namespace: settings.cluster_object_namespace.clone(),
        }
    }

    /// The params `reference` gives a trigger of a ScaledObject in `namespace`.
    pub(super) fn resolve(
        &self,
        namespace: &str,
        reference: &AuthenticationRef,
    ) -> Result<ResolvedAuth, TriggerAuthError> {
        let auth = reference.describe(namespace);
        let (watched, key, secrets_namespace) = match reference.kind {
            AuthenticationKind::TriggerAuthentication => (
                &self.namespaced,
                ObjectRef::new_with(&reference.name, trigger_authentications()).within(namespace),
                namespace,
            ),
            AuthenticationKind::ClusterTriggerAuthentication => (
                &self.cluster,
                ObjectRef::new_with(&reference.name, cluster_trigger_authentications()),
                self.cluster_object_namespace.as_str(),
            ),
        };
        readable(watched, &auth)?;
        let Some(object) = watched.store().get(&key) else {
            return Err(TriggerAuthError::NotFound { auth });
        };
        let spec = object.data.get("spec").cloned().unwrap_or(Value::Null);
        let targets = read_spec(&auth, &spec)?;
        let mut version = BTreeSet::new();
        version.insert(format!(
            "{}@{}",
            reference.kind.name(),
            object.resource_version().unwrap_or_default()
        ));
        let mut params = AuthParams::new();
        if !targets.is_empty() {
            readable(&self.secrets, &auth)?;
        }
        for target in targets {
            let secret_ref = ObjectRef::<Secret>::new(&target.name).within(secrets_namespace);
            let secret = self.secrets.store().get(&secret_ref).ok_or_else(|| {
                TriggerAuthError::NoSecret {
                    auth: auth.clone(),
                    parameter: target.parameter.clone(),
                    namespace: secrets_namespace.to_string(),
                    secret: target.name.clone(),
                }
            })?;
            version.insert(format!(
                "Secret {}@{}",
                target.name,
                secret.resource_version().unwrap_or_default()
            ));
            let bytes = secret
                .data
                .as_ref()
                .and_then(|data| data.get(&target.key))
                .ok_or_else(|| TriggerAuthError::NoKey {
                    auth: auth.clone(),
                    parameter: target.parameter.clone(),
                    namespace: secrets_namespace.to_string(),
                    secret: target.name.clone(),
                    key: target.key.clone(),
                })?;
            let value = String::from_utf8(bytes.0.clone()).map_err(|_| TriggerAuthError::Invalid {
                auth: auth.clone(),
                reason: format!(
                    "secretTargetRef parameter `{}`: key `{}` of Secret {secrets_namespace}/{} is not UTF-8 text",
                    target.parameter, target.key, target.name
                ),
            })?;
            params.insert(target.parameter.to_ascii_lowercase(), value);
        }
        Ok(ResolvedAuth {
            params,
            version: version.into_iter().collect::<Vec<_>>().join(","),
        })
    }
}

/// One `secretTargetRef` entry.
struct SecretTarget {
    parameter: String,
    name: String,
    key: String,
}

/// The `secretTargetRef` entries of a TriggerAuthentication's spec;
/// every other source is refused, naming it.
fn read_spec(auth: &str, spec: &Value) -> Result<Vec<SecretTarget>, TriggerAuthError> {
    let invalid = |reason: String| TriggerAuthError::Invalid {
        auth: auth.to_string(),
        reason,
    };
    let Some(fields) = spec.as_object() else {
        return Ok(Vec::new());
    };
    let mut targets = Vec::new();
    for (field, value) in fields {
        match field.as_str() {
            "secretTargetRef" => {
                let entries = match value {
                    Value::Null => continue,
                    Value::Array(entries) => entries,
                    _ => return Err(invalid("spec.secretTargetRef: must be a list".into())),
                };
                for (at, entry) in entries.iter().enumerate() {
                    let text = |name: &str| match entry.get(name) {
                        Some(Value::String(value)) if !value.is_empty() => Ok(value.clone()),
                        _ => Err(invalid(format!(
                            "spec.secretTargetRef[{at}].{name}: missing or not a string"
                        ))),
                    };
                    targets.push(SecretTarget {
                        parameter: text("parameter")?,
                        name: text("name")?,
                        key: text("key")?,
                    });
                }
            }
            // KEDA's "none" provider means no identity: harmless. Any real
            // one would lend hoist's own cloud identity to whoever writes
            // the TriggerAuthentication.
            "podIdentity" => {
                let provider = value.get("provider").and_then(Value::as_str).unwrap_or("");
                if !matches!(provider, "" | "none") {
                    return Err(TriggerAuthError::Unsupported {
                        auth: auth.to_string(),
                        field: "podIdentity".into(),
                        reason: format!(
                            "provider `{provider}` would lend hoist's own identity to every namespace; use an auth profile (authRef) bound to namespaces instead"
                        ),
                    });
                }
            }
            other => {
                return Err(TriggerAuthError::Unsupported {
                    auth: auth.to_string(),
                    field: other.to_string(),
                    reason: "hoist reads only secretTargetRef (and podIdentity provider none)"
                        .into(),
                });
            }
        }
    }
    Ok(targets)
}

fn watch_dynamic(
    client: &kube::Client,
    resource: ApiResource,
    name: &'static str,
    cancel: &CancellationToken,
) -> Watched<DynamicObject> {
    Watched::start(
        (Api::all_with(client.clone(), &resource), resource),
        (name, GRANT),
        super::keep_what_is_read,
        cancel,
        |_| {},
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_are_read_from_a_trigger() {
        let read = |trigger: Value| AuthenticationRef::from_trigger(&trigger);
        assert_eq!(read(json!({"type": "external"})), Ok(None));
        assert_eq!(
            read(json!({"authenticationRef": {"name": "orders"}})),
            Ok(Some(AuthenticationRef {
                name: "orders".into(),
                kind: AuthenticationKind::TriggerAuthentication
            }))
        );
        assert_eq!(
            read(json!({"authenticationRef": {"name": "shared", "kind": "ClusterTriggerAuthentication"}}))
                .unwrap()
                .unwrap()
                .kind,
            AuthenticationKind::ClusterTriggerAuthentication
        );
        for bad in [
            json!({"authenticationRef": "orders"}),
            json!({"authenticationRef": {"kind": "TriggerAuthentication"}}),
            json!({"authenticationRef": {"name": "x", "kind": "Secret"}}),
        ] {
            let error = read(bad.clone()).unwrap_err();
            assert!(error.starts_with("authenticationRef"), "{bad}: {error}");
        }
    }

    #[test]
    fn only_secret_target_refs_are_read_and_other_sources_are_named() {
        let auth = "TriggerAuthentication shop/orders";
        let targets = read_spec(
            auth,
            &json!({
                "podIdentity": {"provider": "none"},
                "secretTargetRef": [{"parameter": "password", "name": "redis", "key": "pw"}],
            }),
        )
        .unwrap();
        assert_eq!(targets.len(), 1);
        assert_eq!(
            (
                targets[0].parameter.as_str(),
                targets[0].name.as_str(),
                targets[0].key.as_str()
            ),
            ("password", "redis", "pw")
        );
        for (spec, field) in [
            (json!({"env": [{"parameter": "a", "name": "A"}]}), "env"),
            (json!({"hashiCorpVault": {}}), "hashiCorpVault"),
            (json!({"azureKeyVault": {}}), "azureKeyVault"),
            (
                json!({"podIdentity": {"provider": "azure-workload"}}),
                "podIdentity",
            ),
        ] {
            let error = read_spec(auth, &spec).err().unwrap();
            assert!(
                matches!(&error, TriggerAuthError::Unsupported { field: f, .. } if f == field),
                "{error}"
            );
            assert!(error.to_string().contains(auth), "{error}");
        }
        let error = read_spec(
            auth,
            &json!({"secretTargetRef": [{"parameter": "password", "name": "redis"}]}),
        )
        .err()
        .unwrap();
        assert!(
            error.to_string().contains("secretTargetRef[0].key"),
            "{error}"
        );
    }
}
