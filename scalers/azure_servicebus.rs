//! `scaler: azure-servicebus`: the active message count of a queue or a
//! topic subscription, with the keys, defaults and validation of KEDA's
//! built-in scaler, read from the management REST API.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use regex::Regex;
use reqwest::StatusCode;
use tokio::sync::Mutex;

use super::{Kind, Measurement, ObserveError, Query, Source, Trigger, metric_name};
use crate::azure::atom::{self, AtomError};
use crate::azure::sas::{self, ConnectionString, SasAuth};
use crate::metadata::{Absent, Key, MetadataError, Origin, Params, Place};
use crate::secret::{Secret, fingerprint};

pub static KIND: Kind = Kind {
    scalers: &["azure-servicebus"],
    keys: KEYS,
    parse,
};

const API_VERSION: &str = "2021-05";
/// Entities per list page.
const PAGE: usize = 100;
/// The audience of Entra ID tokens for Service Bus.
const SCOPE: &str = "https://servicebus.azure.net//.default";
/// A token is renewed this long before it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entity {
    Queue { name: String },
    Subscription { topic: String, name: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Sum,
    Max,
    Avg,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A connection string (`connectionFromEnv` or the auth profile's
    /// `connection`). Checked when first used, as KEDA does.
    Connection(Secret),
    /// Entra workload identity for `namespace` (KEDA's `azure-workload`).
    WorkloadIdentity {
        client_id: Option<String>,
        tenant_id: Option<String>,
    },
    /// The managed identity of the node or VM hoist runs on
    /// (`azure-managed`, hoist's own): system-assigned, or the
    /// user-assigned one whose client ID is `identityId`.
    ManagedIdentity { client_id: Option<String> },
}

#[derive(Debug, Clone)]
pub struct ServiceBusConfig {
    pub entity: Entity,
    /// With `useRegex`: the pattern the queue or subscription name must match whole.
    pub pattern: Option<Regex>,
    pub operation: Operation,
    pub message_count: i64,
    pub activation_message_count: i64,
    pub namespace: String,
    /// With workload identity: `<namespace>.<endpointSuffix>`.
    pub fully_qualified_namespace: Option<String>,
    pub credential: Credential,
}

use Absent::Value;
use Origin::{Auth, Env, Metadata};

/// KEDA's Service Bus keys, with its defaults.
pub const KEYS: &[Key] = &[
    Key::optional("queueName", Absent::None),
    Key::optional("topicName", Absent::None),
    Key::optional("subscriptionName", Absent::None),
    Key::optional("messageCount", Value("5")),
    Key::optional("activationMessageCount", Value("0")),
    Key::optional("useRegex", Value("false")),
    Key::optional("operation", Value("sum")),
    Key::optional("connection", Absent::None).in_(Place::AuthOrEnv),
    Key::optional("podIdentity", Value("none")).in_(Place::Both),
    Key::optional("namespace", Absent::None),
    Key::optional("cloud", Value("AzurePublicCloud")),
    Key::optional("endpointSuffix", Absent::None),
    Key::optional("identityId", Absent::None).in_(Place::Both),
    Key::optional("identityTenantId", Absent::None).in_(Place::Both),
];

/// KEDA's `cloud` names and their Service Bus endpoint suffixes, compared
/// case-insensitively with every alias KEDA takes (kedacore/keda
/// pkg/scalers/azure/cloud_config.go, `environments` and
/// `EnvironmentFromName`; `Private` from azure_cloud_environment.go,
/// `ParseEnvironmentProperty`). An empty `cloud` is the public cloud there too.
fn endpoint_suffix(params: &Params) -> Result<String, MetadataError> {
    let cloud = params.string(&["cloud"], &[Metadata]).unwrap_or_default();
    let suffix = match cloud.to_ascii_uppercase().as_str() {
        "" | "AZUREPUBLICCLOUD" | "AZURECLOUD" => "servicebus.windows.net",
        "AZURECHINACLOUD" => "servicebus.chinacloudapi.cn",
        "AZUREUSGOVERNMENTCLOUD" | "AZUREUSGOVERNMENT" => "servicebus.usgovcloudapi.net",
        "AZUREGERMANCLOUD" => "servicebus.cloudapi.de",
        "PRIVATE" => {
            return params
                .string(&["endpointSuffix"], &[Metadata])
                .ok_or_else(|| MetadataError::missing("endpointSuffix", "cloud `Private` needs an endpointSuffix"));
        }
        _ => {
            return Err(MetadataError::invalid(
                "cloud",
                format!(
                    "`{cloud}` is not a cloud KEDA knows: AzurePublicCloud (AzureCloud), AzureUSGovernmentCloud (AzureUSGovernment), AzureChinaCloud, AzureGermanCloud or Private"
                ),
            ));
        }
    };
    Ok(suffix.to_string())
}

pub fn parse_config(params: &Params) -> Result<ServiceBusConfig, MetadataError> {
    let params = &params.declaring(KEYS);
    let message_count = params.number(&["messageCount"], &[Metadata], 5_i64)?;
    let activation_message_count = params.number(&["activationMessageCount"], &[Metadata], 0_i64)?;
    let string = |name: &str| params.string(&[name], &[Metadata]).unwrap_or_default();
    let (queue, topic, subscription) = (string("queueName"), string("topicName"), string("subscriptionName"));
    let namespace = string("namespace");
    let use_regex = params.boolean(&["useRegex"], &[Metadata], false)?;
    let operation = match params.find(&["operation"], &[Metadata]) {
        None => Operation::Sum,
        Some(found) => match found.value {
            "sum" => Operation::Sum,
            "max" => Operation::Max,
            "avg" => Operation::Avg,
            other => {
                return Err(MetadataError::invalid(
                    "operation",
                    format!("`{other}` must be one of sum, max, avg"),
                ));
            }
        },
    };

    let entity = match (queue.is_empty(), topic.is_empty(), subscription.is_empty()) {
        (false, _, false) => {
            return Err(MetadataError::invalid("subscriptionName", "given with queueName: use topicName for subscriptions"));
        }
        (false, false, _) => {
            return Err(MetadataError::invalid("topicName", "given with queueName: name either a queue or a topic"));
        }
        (false, true, true) => Entity::Queue { name: queue },
        (true, false, true) => {
            return Err(MetadataError::missing("subscriptionName", "no subscription name given with topicName"));
        }
        (true, false, false) => Entity::Subscription {
            topic,
            name: subscription,
        },
        (true, true, _) => {
            return Err(MetadataError::missing("queueName", "name a queue (queueName) or a subscription (topicName and subscriptionName)"));
        }
    };
    let pattern = if use_regex {
        let (key, text) = match &entity {
            Entity::Queue { name } => ("queueName", name),
            Entity::Subscription { name, .. } => ("subscriptionName", name),
        };
        let whole = format!("^(?:{text})$");
        Some(Regex::new(&whole).map_err(|_| MetadataError::invalid(key, "is not a valid regular expression"))?)
    } else {
        None
    };

    let provider = params.string(&["podIdentity"], &[Auth, Metadata]).unwrap_or_default();
    let (credential, fully_qualified_namespace) = match provider.as_str() {
        "" | "none" => {
            let connection = params.find(&["connection"], &[Auth, Env]).ok_or_else(|| {
                MetadataError::missing(
                    "connection",
                    "no connection setting given: set connectionFromEnv, `connection` in the auth profile, or use workload identity",
                )
            })?;
            (Credential::Connection(Secret::new(connection.value)), None)
        }
        "azure-workload" | "azure-managed" => {
            if namespace.is_empty() {
                return Err(MetadataError::missing("namespace", "namespace is required when using pod identity"));
            }
            let suffix = endpoint_suffix(params)?;
            let identity = |name: &str| params.string(&[name], &[Auth, Metadata]);
            let credential = if provider == "azure-workload" {
                Credential::WorkloadIdentity {
                    client_id: identity("identityId"),
                    tenant_id: identity("identityTenantId"),
                }
            } else {
                Credential::ManagedIdentity {
                    client_id: identity("identityId"),
                }
            };
            (credential, Some(format!("{namespace}.{suffix}")))
        }
        other => {
            return Err(MetadataError::invalid(
                "podIdentity",
                format!("azure service bus does not support pod identity `{other}`; use azure-workload or azure-managed"),
            ));
        }
    };
    Ok(ServiceBusConfig {
        entity,
        pattern,
        operation,
        message_count,
        activation_message_count,
        namespace,
        fully_qualified_namespace,
        credential,
    })
}

fn parse(
    scaler: &'static str,
    params: &Params,
    _context: &super::Context,
) -> Result<Trigger, MetadataError> {
    let config = parse_config(params)?;
    let name = match (&config.entity, config.pattern.is_some()) {
        (Entity::Queue { .. }, true) => "queue-regex".to_string(),
        (Entity::Subscription { .. }, true) => "topic-regex".to_string(),
        (Entity::Queue { name }, false) => name.clone(),
        (Entity::Subscription { topic, .. }, false) => topic.clone(),
    };
    let source = ServiceBusSource::new(config);
    Ok(Trigger {
        scaler,
        metric_name: metric_name(&format!("azure-servicebus-{name}")),
        target: source.config.message_count as f64,
        target_key: "messageCount",
        polling_interval: None,
        activation_target: source.config.activation_message_count as f64,
        query: Query {
            key: source.query_key().into(),
            description: source.describe().into(),
            endpoints: source.endpoints(),
            source: Arc::new(source),
        },
        route: None,
    })
}

/// Path segments keep `/` (topic paths may hold one) and little else.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub struct ServiceBusSource {
    config: ServiceBusConfig,
    /// The `Authorization` value and when it stops being usable (Unix s).
    token: Mutex<Option<(Secret, u64)>>,
    identity: OnceLock<Arc<dyn azure_core::credentials::TokenCredential>>,
}

impl ServiceBusSource {
    pub fn new(config: ServiceBusConfig) -> Self {
        Self {
            config,
            token: Mutex::new(None),
            identity: OnceLock::new(),
        }
    }

    /// The namespace host as far as it is known without failing.
    fn host_hint(&self) -> String {
        match (&self.config.credential, &self.config.fully_qualified_namespace) {
            (_, Some(host)) => host.clone(),
            (Credential::Connection(text), None) => ConnectionString::parse(text.expose())
                .map(|c| c.host)
                .unwrap_or_else(|_| "an unusable connection string".to_string()),
            (_, None) => self.config.namespace.clone(),
        }
    }

    /// The namespace host, when it is known before the first call.
    fn endpoints(&self) -> Vec<String> {
        let host = match (&self.config.credential, &self.config.fully_qualified_namespace) {
            (_, Some(host)) => host.clone(),
            (Credential::Connection(text), None) => match ConnectionString::parse(text.expose()) {
                Ok(parsed) => parsed.host,
                Err(_) => return Vec::new(),
            },
            _ => return Vec::new(),
        };
        if host.contains(':') { vec![host] } else { vec![format!("{host}:443")] }
    }

    fn query_key(&self) -> String {
        let credential = match &self.config.credential {
            Credential::Connection(text) => format!("connection:{:x}", fingerprint(&[text])),
            Credential::WorkloadIdentity { client_id, tenant_id } => format!("workload:{client_id:?}:{tenant_id:?}"),
            Credential::ManagedIdentity { client_id } => format!("managed:{client_id:?}"),
        };
        format!(
            "azure-servicebus|{}|{credential}|{:?}|regex={:?}|op={:?}",
            self.host_hint(),
            self.config.entity,
            self.config.pattern.as_ref().map(Regex::as_str),
            self.config.operation,
        )
    }

    fn describe(&self) -> String {
        let what = match (&self.config.entity, &self.config.pattern) {
            (Entity::Queue { name }, None) => format!("queue `{name}`"),
            (Entity::Queue { name }, Some(_)) => format!("queues matching `{name}`"),
            (Entity::Subscription { topic, name }, None) => format!("subscription `{name}` of topic `{topic}`"),
            (Entity::Subscription { topic, name }, Some(_)) => {
                format!("subscriptions matching `{name}` of topic `{topic}`")
            }
        };
        format!("azure-servicebus {what} in {}", self.host_hint())
    }

    /// `scheme://host` and the connection string's SAS, if any.
    fn endpoint(&self) -> Result<(String, Option<SasAuth>), ObserveError> {
        match &self.config.credential {
            Credential::Connection(text) => {
                let parsed = ConnectionString::parse(text.expose()).map_err(|e| ObserveError::Config(e.to_string()))?;
                let scheme = if parsed.emulator { "http" } else { "https" };
                Ok((format!("{scheme}://{}", parsed.host), Some(parsed.auth)))
            }
            Credential::WorkloadIdentity { .. } | Credential::ManagedIdentity { .. } => {
                let host = self.config.fully_qualified_namespace.clone().unwrap_or_default();
                Ok((format!("https://{host}"), None))
            }
        }
    }

    async fn authorization(&self, base: &str, sas: Option<&SasAuth>) -> Result<Secret, ObserveError> {
        let mut cached = self.token.lock().await;
        let now = unix_now();
        if let Some((token, usable_until)) = cached.as_ref()
            && now < *usable_until
        {
            return Ok(token.clone());
        }
        let (token, expires) = match sas {
            Some(SasAuth::Signature(signature)) => (signature.clone(), u64::MAX),
            Some(SasAuth::Key { name, key }) => {
                let expiry = now + 3600;
                (sas::token(&format!("{base}/"), name, key, expiry), expiry)
            }
            None => self.entra_token().await?,
        };
        let usable_until = expires.saturating_sub(RENEW_BEFORE.as_secs());
        *cached = Some((token.clone(), usable_until));
        Ok(token)
    }

    async fn entra_token(&self) -> Result<(Secret, u64), ObserveError> {
        let credential = match self.identity.get() {
            Some(credential) => credential.clone(),
            None => {
                let credential: Arc<dyn azure_core::credentials::TokenCredential> = match &self.config.credential {
                    Credential::WorkloadIdentity { client_id, tenant_id } => {
                        let options = azure_identity::WorkloadIdentityCredentialOptions {
                            client_id: client_id.clone(),
                            tenant_id: tenant_id.clone(),
                            ..Default::default()
                        };
                        azure_identity::WorkloadIdentityCredential::new(Some(options))
                            .map_err(|e| ObserveError::Config(format!("workload identity: {e}")))?
                    }
                    Credential::ManagedIdentity { client_id } => {
                        let options = azure_identity::ManagedIdentityCredentialOptions {
                            user_assigned_id: client_id.clone().map(azure_identity::UserAssignedId::ClientId),
                            ..Default::default()
                        };
                        azure_identity::ManagedIdentityCredential::new(Some(options))
                            .map_err(|e| ObserveError::Config(format!("managed identity: {e}")))?
                    }
                    Credential::Connection(_) => return Err(ObserveError::Config("no Entra identity configured".into())),
                };
                self.identity.get_or_init(|| credential).clone()
            }
        };
        let token = credential
            .get_token(&[SCOPE], None)
            .await
            .map_err(|e| ObserveError::Auth(format!("Entra token: {e}")))?;
        let expires = token.expires_on.unix_timestamp().max(0) as u64;
        Ok((Secret::new(format!("Bearer {}", token.token.secret())), expires))
    }

    /// Turns a non-200 answer into an error that says what happened.
    fn refused(&self, status: StatusCode, body: &str) -> ObserveError {
        let detail = atom::error_detail(body).unwrap_or_else(|| "no detail in the response".to_string());
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ObserveError::Auth(format!(
                "{status}: {detail} (the key or identity needs the Manage claim, or EntityRead, to read counts)"
            )),
            StatusCode::NOT_FOUND => ObserveError::Query(format!("does not exist ({status}): {detail}")),
            _ => ObserveError::Query(format!("{status}: {detail}")),
        }
    }

    async fn measure(&self) -> Result<Measurement, ObserveError> {
        let (base, sas) = self.endpoint()?;
        let auth = self.authorization(&base, sas.as_ref()).await?;
        let count = match (&self.config.entity, &self.config.pattern) {
            (entity, None) => {
                let path = match entity {
                    Entity::Queue { name } => encode(name),
                    Entity::Subscription { topic, name } => format!("{}/Subscriptions/{}", encode(topic), encode(name)),
                };
                let url = format!("{base}/{path}?api-version={API_VERSION}");
                let (status, body) = crate::azure::client::get(&url, &auth).await?;
                if status != StatusCode::OK {
                    return Err(self.refused(status, &body));
                }
                match atom::entity(&body) {
                    Ok(entity) => entity.active_message_count,
                    Err(AtomError::Empty) => return Err(ObserveError::Query("does not exist (an empty feed)".into())),
                    Err(error) => return Err(ObserveError::Query(error.to_string())),
                }
            }
            (entity, Some(pattern)) => {
                let list = match entity {
                    Entity::Queue { .. } => "$Resources/Queues".to_string(),
                    Entity::Subscription { topic, .. } => format!("{}/Subscriptions", encode(topic)),
                };
                let mut counts = Vec::new();
                for page in 0.. {
                    let url = format!(
                        "{base}/{list}?$skip={}&$top={PAGE}&api-version={API_VERSION}",
                        page * PAGE
                    );
                    let (status, body) = crate::azure::client::get(&url, &auth).await?;
                    if status != StatusCode::OK {
                        return Err(self.refused(status, &body));
                    }
                    let entities = atom::feed(&body).map_err(|e| ObserveError::Query(e.to_string()))?;
                    let full = entities.len() >= PAGE;
                    counts.extend(
                        entities
                            .into_iter()
                            .filter(|e| pattern.is_match(&e.name))
                            .map(|e| e.active_message_count),
                    );
                    if !full {
                        break;
                    }
                }
                combine(&counts, self.config.operation)
            }
        };
        Ok(Measurement::of(count as f64))
    }
}

fn encode(segment: &str) -> String {
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// KEDA's `performOperation`: sum, max, or the integer average.
pub fn combine(counts: &[i64], operation: Operation) -> i64 {
    match operation {
        Operation::Sum => counts.iter().sum(),
        Operation::Max => counts.iter().copied().max().unwrap_or(0).max(0),
        Operation::Avg if counts.is_empty() => 0,
        Operation::Avg => counts.iter().sum::<i64>() / counts.len() as i64,
    }
}

impl Source for ServiceBusSource {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        self.measure().boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::metadata::AuthParams;

    fn parse_pairs(metadata: &[(&str, &str)], auth: &[(&str, &str)]) -> Result<ServiceBusConfig, MetadataError> {
        let metadata: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let auth: AuthParams = auth.iter().map(|(k, v)| (k.to_lowercase(), v.to_string())).collect();
        parse_config(&Params::new(&metadata, &auth))
    }

    #[test]
    fn managed_identity_is_hoists_own_provider() {
        let config = parse_pairs(
            &[("queueName", "q"), ("namespace", "orders"), ("identityId", "client-1"), ("cloud", "AzureChinaCloud")],
            &[("podIdentity", "azure-managed")],
        )
        .unwrap();
        assert_eq!(
            config.credential,
            Credential::ManagedIdentity {
                client_id: Some("client-1".into())
            }
        );
        assert_eq!(config.fully_qualified_namespace.as_deref(), Some("orders.servicebus.chinacloudapi.cn"));
        let err = parse_pairs(&[("queueName", "q"), ("namespace", "n")], &[("podIdentity", "aad-pod-identity")])
            .err()
            .unwrap();
        assert!(err.to_string().contains("`podIdentity`"), "{err}");
    }

    #[test]
    fn cloud_takes_every_alias_keda_takes_in_any_case() {
        let suffix = |cloud: &str, extra: &[(&str, &str)]| {
            let mut metadata = vec![("queueName", "q"), ("namespace", "orders"), ("cloud", cloud)];
            metadata.extend_from_slice(extra);
            parse_pairs(&metadata, &[("podIdentity", "azure-workload")])
                .map(|config| config.fully_qualified_namespace.unwrap())
        };
        for (cloud, expected) in [
            ("AzurePublicCloud", "orders.servicebus.windows.net"),
            ("AzureCloud", "orders.servicebus.windows.net"),
            ("azurecloud", "orders.servicebus.windows.net"),
            ("", "orders.servicebus.windows.net"),
            ("AzureUSGovernmentCloud", "orders.servicebus.usgovcloudapi.net"),
            ("AzureUSGovernment", "orders.servicebus.usgovcloudapi.net"),
            ("AZUREUSGOVERNMENT", "orders.servicebus.usgovcloudapi.net"),
            ("AzureChinaCloud", "orders.servicebus.chinacloudapi.cn"),
            ("azurechinacloud", "orders.servicebus.chinacloudapi.cn"),
            ("AzureGermanCloud", "orders.servicebus.cloudapi.de"),
        ] {
            assert_eq!(suffix(cloud, &[]).unwrap(), expected, "cloud `{cloud}`");
        }
        for private in ["Private", "private", "PRIVATE"] {
            let fqdn = suffix(private, &[("endpointSuffix", "servicebus.example.net")]).unwrap();
            assert_eq!(fqdn, "orders.servicebus.example.net");
            let err = suffix(private, &[]).unwrap_err();
            assert!(err.to_string().contains("`endpointSuffix`"), "{err}");
        }
        let err = suffix("AzureMoonCloud", &[]).unwrap_err();
        assert!(err.to_string().contains("`cloud`") && err.to_string().contains("AzureMoonCloud"), "{err}");
    }

    #[test]
    fn operations_follow_keda() {
        assert_eq!(combine(&[3, 9, 4], Operation::Sum), 16);
        assert_eq!(combine(&[3, 9, 4], Operation::Max), 9);
        assert_eq!(combine(&[3, 9, 4], Operation::Avg), 5);
        assert_eq!(combine(&[], Operation::Avg), 0);
        assert_eq!(combine(&[], Operation::Max), 0);
    }
}
