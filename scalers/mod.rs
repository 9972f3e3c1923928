//! Triggers: one file per scaler.
//!
//! A trigger parses its metadata into a typed config and measures one value
//! from its source. It never decides, sleeps, caches or retries: the driver
//! does that. Adding a trigger is one new file here plus one word in the
//! `registry!` line below.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::metadata::{Key, MetadataError, Params};
pub use crate::observe_error::ObserveError;

registry!(redis, kafka, azure_servicebus, traffic);

/// What one ScaledObject trigger measures, and what it compares it with.
#[derive(Clone)]
pub struct Trigger {
    /// The `scaler` value that chose this trigger.
    pub scaler: &'static str,
    /// The metric name reported to KEDA (KEDA adds its own `sN-` prefix).
    pub metric_name: String,
    /// Target value per replica (`listLength`, `lagThreshold`, ...).
    pub target: f64,
    /// The metadata key that sets `target`, for error messages.
    pub target_key: &'static str,
    /// Active when the value is strictly above this.
    pub activation_target: f64,
    /// The polling interval the trigger's measurement is defined for, used
    /// when the metadata sets none (ACA evaluates HTTP rules every 15 s).
    pub polling_interval: Option<Duration>,
    pub query: Query,
    /// The interceptor route this trigger declares (`http`/`tcp` with
    /// `upstream`), which exists while the trigger is tracked. Boxed: most
    /// triggers declare none, and every tracked trigger holds this struct.
    pub route: Option<Box<crate::routing::RouteSpec>>,
}

/// hoist's own parts a trigger may measure, besides outside sources, and
/// who is asking.
#[derive(Clone)]
pub struct Context {
    /// The interceptor's traffic counts (`http` and `tcp` triggers).
    pub traffic: Option<crate::interceptor::traffic::Traffic>,
    /// The ScaledObject the trigger belongs to (a declared route is its).
    pub owner: Option<crate::routing::Owner>,
    /// Completes a declared route's `upstream` (`interceptor.cluster_domain`).
    pub cluster_domain: String,
    /// The auth params of the ScaledObject trigger's own
    /// `authenticationRef` (a TriggerAuthentication), resolved from the
    /// cluster by the caller; the trigger uses them as it would an auth
    /// profile's. `None`: the trigger has none, or it was not looked up.
    pub authentication: Option<crate::metadata::AuthParams>,
    /// The scale target each of hoist's config routes sets, by route name
    /// (`interceptor.http_routes[].concurrent_requests`,
    /// `tcp_routes[].concurrent_connections`): an `http`/`tcp` trigger
    /// naming the route takes it when it sets none itself.
    pub route_targets: std::sync::Arc<std::collections::BTreeMap<String, f64>>,
    /// The Kafka clients triggers share (one per cluster and credentials,
    /// whatever the group); clones share the pool.
    pub kafka: kafka::ClientPool,
}

impl Default for Context {
    fn default() -> Self {
        Self {
            traffic: None,
            owner: None,
            cluster_domain: "cluster.local".to_string(),
            authentication: None,
            route_targets: Default::default(),
            kafka: Default::default(),
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::interceptor::traffic::Traffic;
        let traffic = match &self.traffic {
            None => "none",
            Some(Traffic::Local(_)) => "in-process interceptor",
            Some(Traffic::Remote(_)) => "interceptor fleet",
        };
        f.debug_struct("Context")
            .field("traffic", &traffic)
            .finish()
    }
}

/// A question asked of a source. Triggers whose queries have equal keys
/// share one poller and one source call per interval.
#[derive(Clone)]
pub struct Query {
    /// Identity of the question. May carry fingerprints of credentials (two
    /// passwords are two questions) but never a secret in clear. Shared,
    /// as the description: the trigger, its poller, the poller map and the
    /// poller's metric labels all hold them.
    pub key: Arc<str>,
    /// For logs, errors and status: names the source, never a secret.
    pub description: Arc<str>,
    /// The `host:port` addresses hoist will contact, checked against
    /// `limits.allowed_sources` when the trigger is parsed (and then
    /// dropped: a tracked trigger does not keep them).
    pub endpoints: Vec<String>,
    pub source: Arc<dyn Source>,
}

/// TLS to a source, as KEDA's scalers take it: on or off, whether to skip
/// verification, and PEM material (from the auth profile).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SourceTls {
    pub enabled: bool,
    pub unsafe_ssl: bool,
    pub ca: String,
    pub cert: String,
    pub key: crate::secret::Secret,
    pub key_password: crate::secret::Secret,
}

impl SourceTls {
    /// TLS as both of KEDA's scalers hoist mirrors read it: whether it is
    /// on and verification is skipped decided by the caller (each scaler
    /// has its own keys for that), PEM material and `keyPassword` from the
    /// auth profile (TriggerAuthentication params in KEDA).
    pub fn from_auth(params: &Params, enabled: bool, unsafe_ssl: bool) -> Self {
        use crate::metadata::Origin::Auth;
        use crate::secret::Secret;
        let auth = |name: &str| params.string(&[name], &[Auth]).unwrap_or_default();
        Self {
            enabled,
            unsafe_ssl,
            ca: auth("ca"),
            cert: auth("cert"),
            key: Secret::new(auth("key")),
            key_password: Secret::new(auth("keyPassword")),
        }
    }

    /// The client key in clear PEM (decrypted when `keyPassword` is set).
    /// Done when connecting, as KEDA does when it builds its client, so a
    /// key that cannot be used fails the measurement, naming the key.
    pub fn client_key(&self) -> Result<crate::secret::Secret, ObserveError> {
        crate::tls::client_key(&self.key, &self.key_password)
            .map_err(|e| ObserveError::Config(e.to_string()))
    }
}

/// Something that can be measured.
pub trait Source: Send + Sync + 'static {
    /// Measures the current value once. The caller bounds it with a timeout
    /// and may drop the future at any point.
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>>;

    /// Ticks when the source knows its value just changed in a way that
    /// cannot wait for the next poll (a request held for an app at zero).
    fn wakeups(&self) -> Option<watch::Receiver<u64>> {
        None
    }
}

/// One measurement: the value reported to KEDA, and the value compared
/// with the activation threshold. They differ only where KEDA's scaler
/// makes them differ (Kafka's excluded persistent lag still counts as
/// activity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub value: f64,
    pub activity: f64,
}

impl Measurement {
    /// A measurement whose value also decides activity.
    pub fn of(value: f64) -> Self {
        Self {
            value,
            activity: value,
        }
    }
}

/// One entry of the registry: the `scaler` values a trigger file handles
/// and its parser.
pub struct Kind {
    pub scalers: &'static [&'static str],
    /// Every key the parser reads (its page's parameter list).
    pub keys: &'static [Key],
    pub parse: fn(
        scaler: &'static str,
        params: &Params,
        context: &Context,
    ) -> Result<Trigger, MetadataError>,
}

macro_rules! registry {
    ($($module:ident),* $(,)?) => {
        $(pub mod $module;)*
        /// Every trigger hoist knows.
        pub static REGISTRY: &[&Kind] = &[$(&$module::KIND),*];
    };
}
use registry;

/// Every valid `scaler` value, in registry order.
pub fn scaler_names() -> Vec<&'static str> {
    REGISTRY
        .iter()
        .flat_map(|kind| kind.scalers.iter().copied())
        .collect()
}

/// Parses the trigger selected by `scaler`.
pub fn parse(scaler: &str, params: &Params, context: &Context) -> Result<Trigger, MetadataError> {
    for kind in REGISTRY {
        if let Some(name) = kind.scalers.iter().find(|name| **name == scaler) {
            return (kind.parse)(name, &params.declaring(kind.keys), context);
        }
    }
    Err(MetadataError::invalid(
        "scaler",
        format!(
            "unknown scaler `{scaler}`; valid scalers are: {}",
            scaler_names().join(", ")
        ),
    ))
}

/// A metric name KEDA and the HPA accept: every character outside
/// `[A-Za-z0-9_-]` becomes `-` (a superset of KEDA's `NormalizeString`).
pub fn metric_name(raw: &str) -> String {
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_lose_characters_keda_rejects() {
        assert_eq!(metric_name("redis-mylist"), "redis-mylist");
        assert_eq!(metric_name("redis-a/b.c:d%e(f)"), "redis-a-b-c-d-e-f-");
        assert_eq!(metric_name("redis-jobs queue"), "redis-jobs-queue");
    }

    #[test]
    fn unknown_scaler_lists_the_valid_ones() {
        let md = Default::default();
        let auth = Default::default();
        let err = parse("rabbitmq", &Params::new(&md, &auth), &Context::default())
            .err()
            .unwrap();
        let message = err.to_string();
        assert!(message.contains("`scaler`"), "{message}");
        assert!(message.contains("rabbitmq"), "{message}");
        for name in scaler_names() {
            assert!(message.contains(name), "{message} lacks {name}");
        }
    }
}
