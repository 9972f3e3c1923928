//! hoist's own configuration: built-in defaults < optional TOML file <
//! `HOIST_`-prefixed environment variables < command-line flags.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod networks;
mod tls;

pub use networks::{HostOverrides, OWN_ADDRESSES, contains as network_contains, parse_network};

mod auth;

pub use auth::{ANY_NAMESPACE, AuthProfile, AuthValue};

mod admin_auth;
mod interceptor;
mod kubernetes;
mod patterns;

pub use interceptor::{HttpRouteSettings, InterceptorSettings, TcpRouteSettings, port_range};
use interceptor::{TIMEOUT_RANGE, in_range};
pub use kubernetes::{KubernetesAccess, KubernetesSettings};
pub use patterns::{HostPattern, SourcePattern};

pub use admin_auth::{AdminAuthSettings, CallerPattern, DEFAULT_TOKEN_FILE, Require};
pub use tls::{ClientTlsInvalid, ClientTlsSettings, TlsSettings};

/// The longest polling interval hoist accepts, in seconds: one day (a
/// ScaledObject's `pollingInterval` and `polling.default_interval`).
pub const MAX_POLLING_INTERVAL: u64 = 86_400;

/// The longest per-call timeout hoist accepts, in milliseconds: one hour
/// (a trigger's `timeout` and `polling.default_timeout`).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Why an address was refused without showing it: a URL-shaped value may
/// carry a password.
pub const NOT_PLAIN_ADDRESS: &str = "must be host:port, without a scheme, credentials or path (the value is not shown: it may hold a secret)";

/// Whether an address is a bare `host:port` (no `user:pass@`, no
/// `scheme://`, no path, no spaces), so that it can be shown in logs.
pub fn plain_address(address: &str) -> bool {
    !address.contains(['@', '/']) && !address.chars().any(char::is_whitespace)
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cause follows in the error chain.
    #[error("cannot load configuration")]
    Load(#[from] config::ConfigError),
    #[error("invalid configuration: `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub grpc: GrpcSettings,
    pub admin: AdminSettings,
    pub log: LogSettings,
    pub polling: PollingSettings,
    pub limits: LimitSettings,
    /// Where engine state is saved (on every change of decision, every
    /// 10 s and at shutdown) and restored from at start. Default
    /// `/var/lib/hoist/state.json`; an empty path keeps state in memory only.
    #[serde(alias = "stateFile")]
    pub state_file: Option<PathBuf>,
    /// How long shutdown may take before hoist exits anyway
    /// (`shutdown.grace`, when set, wins).
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    pub shutdown: ShutdownSettings,
    /// Named credentials a ScaledObject in one of the profile's
    /// `namespaces` can use with `authRef: <name>`.
    pub auth: BTreeMap<String, AuthProfile>,
    /// The HTTP and TCP proxies behind the `http` and `tcp` triggers.
    pub interceptor: InterceptorSettings,
    /// Access to the Kubernetes API, for engine mode.
    pub kubernetes: KubernetesSettings,
    pub engine: EngineSettings,
}

/// The default `state_file`.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/hoist/state.json";

/// `[engine]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    /// Without a known replica count (no cluster access and no saved
    /// state), compute from the engine's own last decision as if it had
    /// been applied, instead of answering `Unavailable`. A restart then
    /// starts every engine-mode ScaledObject from zero.
    pub assume_applied: bool,
}

/// Why an address is refused; a URL-shaped one is not shown: it may carry
/// a password.
pub(crate) fn not_host_port(address: &str) -> String {
    if plain_address(address) {
        format!("`{address}` is not host:port")
    } else {
        NOT_PLAIN_ADDRESS.to_string()
    }
}

/// A `host:port` with a numeric port and nothing else.
pub(crate) fn host_port(address: &str) -> bool {
    address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && port.parse::<u16>().is_ok() && plain_address(address)
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcSettings {
    pub listen: SocketAddr,
    /// TLS for the gRPC port (KEDA: `enableTLS`, `caCert`, client certs).
    pub tls: Option<TlsSettings>,
    /// How often each connection is pinged (HTTP/2); a peer that does not
    /// answer within `keepalive_timeout` is dropped with its streams.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// Without cluster access hoist cannot check who calls: declared
    /// routes are refused unless callers are proven by mTLS
    /// (`tls.client_ca_file`) or this says every caller is trusted.
    /// Single-tenant clusters and development only.
    pub trust_callers: bool,
}

/// What happens on SIGTERM: keep serving for `drain_delay` (while
/// Kubernetes removes the pod from its endpoints), then stop taking work
/// and give what is open `grace` to finish.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownSettings {
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// Wins over the top-level `shutdown_grace` when set.
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub grace: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    pub tls: Option<TlsSettings>,
    /// Who may read the reports (everything but `/healthz`, `/readyz`,
    /// `/metrics`), and this hoist's own credential for other admin ports.
    pub auth: AdminAuthSettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A `tracing` filter: `info`, `hoist=debug,info`, ...
    pub level: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PollingSettings {
    /// Used when a trigger sets no `pollingInterval`.
    #[serde(with = "humantime_serde")]
    pub default_interval: Duration,
    /// Bound on one source call when a trigger sets no `timeout`.
    #[serde(with = "humantime_serde")]
    pub default_timeout: Duration,
    /// A trigger nobody asked about for this long is dropped with its poller.
    #[serde(with = "humantime_serde")]
    pub idle_after: Duration,
}

/// Bounds on what ScaledObjects can ask of hoist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// Largest trigger (name, namespace and metadata keys and values), in bytes.
    pub max_metadata_bytes: usize,
    /// Most triggers tracked at once; more get `ResourceExhausted`.
    pub max_tracked_triggers: usize,
    /// Most triggers tracked at once for the ScaledObjects of one
    /// namespace: one namespace cannot take every place.
    pub max_tracked_triggers_per_namespace: usize,
    /// Most metadata bytes (as `max_metadata_bytes` counts them) of every
    /// tracked trigger together; a new trigger past it gets
    /// `ResourceExhausted`.
    pub max_tracked_metadata_bytes: usize,
    /// `host:port` patterns (`*` matches any run of characters, in host or
    /// port) a trigger may point hoist at; empty allows every source.
    pub allowed_sources: Vec<String>,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            max_metadata_bytes: 64 * 1024,
            max_tracked_triggers: 100_000,
            // A tenth: ten busy namespaces fill hoist, one does not.
            max_tracked_triggers_per_namespace: 10_000,
            // Each tracked byte costs about three in memory: ~200 MiB.
            max_tracked_metadata_bytes: 64 * 1024 * 1024,
            allowed_sources: Vec::new(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            grpc: GrpcSettings::default(),
            admin: AdminSettings::default(),
            log: LogSettings::default(),
            polling: PollingSettings::default(),
            limits: LimitSettings::default(),
            state_file: Some(PathBuf::from(DEFAULT_STATE_FILE)),
            shutdown_grace: Duration::from_secs(10),
            shutdown: ShutdownSettings::default(),
            auth: BTreeMap::new(),
            interceptor: InterceptorSettings::default(),
            kubernetes: KubernetesSettings::default(),
            engine: EngineSettings::default(),
        }
    }
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            tls: None,
            keepalive_interval: Duration::from_secs(20),
            keepalive_timeout: Duration::from_secs(20),
            trust_callers: false,
        }
    }
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 9091)),
            tls: None,
            auth: AdminAuthSettings::default(),
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

impl Default for PollingSettings {
    fn default() -> Self {
        Self {
            default_interval: Duration::from_secs(30),
            default_timeout: Duration::from_secs(3),
            idle_after: Duration::from_secs(600),
        }
    }
}

/// Command-line values that override everything else; `None` leaves the
/// lower layers' value.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub grpc_listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
}

/// Whether `name` is one of the variables the kubelet gives every pod for
/// each Service of its namespace (`enableServiceLinks`, on unless a pod
/// says otherwise): a Service named `hoist-interceptor-proxy` becomes
/// `HOIST_INTERCEPTOR_PROXY_SERVICE_HOST`, `HOIST_INTERCEPTOR_PROXY_PORT`,
/// `HOIST_INTERCEPTOR_PROXY_PORT_8080_TCP_ADDR` and so on, which are not
/// hoist's settings and must not be refused as unknown ones. hoist's own
/// variables for nested keys use `__`, which a Service name cannot hold.
fn is_service_link(name: &str) -> bool {
    static SERVICE_LINK: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            "^HOIST(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(ADDR|PORT|PROTO))?)?)$",
        )
        .expect("the pattern compiles")
    });
    !name.contains("__") && SERVICE_LINK.is_match(name)
}

impl Settings {
    /// Loads the layers: defaults, `file`, `HOIST_*` variables from `env`,
    /// then `overrides`. Nested keys in variables use `__`:
    /// `HOIST_GRPC__LISTEN=0.0.0.0:9090`, `HOIST_POLLING__DEFAULT_INTERVAL=15s`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        let env: config::Map<String, String> = env
            .into_iter()
            .filter(|(key, _)| key.starts_with("HOIST_") && !is_service_link(key))
            .collect();
        let mut builder =
            config::Config::builder().add_source(config::Config::try_from(&Settings::default())?);
        if let Some(file) = file {
            builder = builder.add_source(
                config::File::from(file)
                    .format(config::FileFormat::Toml)
                    .required(true),
            );
        }
        builder = builder.add_source(
            config::Environment::with_prefix("HOIST")
                .prefix_separator("_")
                .separator("__")
                // Only these keys are lists (comma-separated); every other
                // value stays one string, commas and all.
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("limits.allowed_sources")
                .with_list_parse_key("interceptor.endpoints")
                .with_list_parse_key("interceptor.denied_networks")
                .with_list_parse_key("interceptor.trusted_proxies")
                .source(Some(env)),
        );
        if let Some(listen) = overrides.grpc_listen {
            builder = builder.set_override("grpc.listen", listen.to_string())?;
        }
        if let Some(listen) = overrides.admin_listen {
            builder = builder.set_override("admin.listen", listen.to_string())?;
        }
        if let Some(format) = overrides.log_format {
            let name = match format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            };
            builder = builder.set_override("log.format", name)?;
        }
        if let Some(level) = &overrides.log_level {
            builder = builder.set_override("log.level", level.as_str())?;
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("polling.default_interval", self.polling.default_interval),
            ("polling.default_timeout", self.polling.default_timeout),
            ("polling.idle_after", self.polling.idle_after),
        ];
        for (key, value) in positive {
            if value.is_zero() {
                return Err(ConfigError::Invalid {
                    key: key.to_string(),
                    reason: "must be more than zero".to_string(),
                });
            }
        }
        let bounded = [
            ("grpc.keepalive_interval", self.grpc.keepalive_interval),
            ("grpc.keepalive_timeout", self.grpc.keepalive_timeout),
        ];
        for (key, value) in bounded {
            if !in_range(value) {
                return Err(ConfigError::Invalid {
                    key: key.to_string(),
                    reason: TIMEOUT_RANGE.to_string(),
                });
            }
        }
        if self.shutdown.drain_delay > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                key: "shutdown.drain_delay".to_string(),
                reason: "must be at most one hour".to_string(),
            });
        }
        if self.grace() > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                key: if self.shutdown.grace.is_some() {
                    "shutdown.grace"
                } else {
                    "shutdown_grace"
                }
                .to_string(),
                reason: "must be at most one hour".to_string(),
            });
        }
        if self.limits.max_tracked_triggers_per_namespace == 0 {
            return Err(ConfigError::Invalid {
                key: "limits.max_tracked_triggers_per_namespace".to_string(),
                reason: "must be at least 1".to_string(),
            });
        }
        if self.limits.max_tracked_metadata_bytes < self.limits.max_metadata_bytes {
            return Err(ConfigError::Invalid {
                key: "limits.max_tracked_metadata_bytes".to_string(),
                reason: "must be at least limits.max_metadata_bytes".to_string(),
            });
        }
        for pattern in &self.limits.allowed_sources {
            SourcePattern::new(pattern).map_err(|reason| ConfigError::Invalid {
                key: "limits.allowed_sources".to_string(),
                reason,
            })?;
        }
        let day = Duration::from_secs(MAX_POLLING_INTERVAL);
        if self.polling.default_interval > day {
            return Err(ConfigError::Invalid {
                key: "polling.default_interval".to_string(),
                reason: "must be at most one day".to_string(),
            });
        }
        if self.polling.default_timeout > Duration::from_millis(MAX_TIMEOUT_MS) {
            return Err(ConfigError::Invalid {
                key: "polling.default_timeout".to_string(),
                reason: "must be at most one hour".to_string(),
            });
        }
        self.interceptor.validate()?;
        auth::validate(&self.auth)?;
        auth::validate_trigger_authentication(&self.kubernetes)?;
        if self.interceptor.direct_to_pods && self.kubernetes.enabled == KubernetesAccess::Off {
            return Err(ConfigError::Invalid {
                key: "interceptor.direct_to_pods".to_string(),
                reason: "reads Services' EndpointSlices from the cluster, but kubernetes.enabled is false".to_string(),
            });
        }
        if self.kubernetes.timeout.is_zero() || self.kubernetes.timeout > Duration::from_secs(60) {
            return Err(ConfigError::Invalid {
                key: "kubernetes.timeout".to_string(),
                reason: "must be more than zero and at most 60 s".to_string(),
            });
        }
        // KEDA's HPA-path calls carry a 3 s deadline; a longer wait only
        // holds its poll loop.
        if self.kubernetes.new_object_wait > Duration::from_secs(30) {
            return Err(ConfigError::Invalid {
                key: "kubernetes.new_object_wait".to_string(),
                reason: "must be at most 30 s".to_string(),
            });
        }
        self.check_listener_collisions()?;
        if let Some((key, reason)) = self.admin.auth.problem() {
            return Err(ConfigError::Invalid {
                key: key.to_string(),
                reason,
            });
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(ConfigError::Invalid {
                key: "log.level".to_string(),
                reason: format!("`{}` is not a tracing filter (try `info`)", self.log.level),
            });
        }
        Ok(())
    }

    /// How long open work gets at shutdown: `shutdown.grace`, else
    /// `shutdown_grace`.
    pub fn grace(&self) -> Duration {
        self.shutdown.grace.unwrap_or(self.shutdown_grace)
    }

    /// Two listeners `hoist serve` would bind on one port (the same address,
    /// or one of them on every address) would crash-loop it on `Address
    /// already in use`: refuse them here, where check-config sees it too.
    fn check_listener_collisions(&self) -> Result<(), ConfigError> {
        let mut listeners = vec![
            ("grpc.listen".to_string(), self.grpc.listen),
            ("admin.listen".to_string(), self.admin.listen),
        ];
        if self.interceptor.in_process() {
            listeners.push((
                "interceptor.http_listen".to_string(),
                self.interceptor.http_listen,
            ));
            for route in &self.interceptor.tcp_routes {
                let key = format!("interceptor.tcp_routes[{}].listen", route.name);
                listeners.push((key, route.listen));
            }
        }
        for (at, (key, address)) in listeners.iter().enumerate() {
            let clash = listeners[..at].iter().find(|(_, earlier)| {
                earlier.port() == address.port()
                    && address.port() != 0
                    && (earlier.ip() == address.ip()
                        || earlier.ip().is_unspecified()
                        || address.ip().is_unspecified())
            });
            if let Some((other, earlier)) = clash {
                return Err(ConfigError::Invalid {
                    key: key.clone(),
                    reason: format!(
                        "{address} collides with {other} ({earlier}): one port, one listener"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The settings with every literal credential replaced by `***`, for
    /// printing. Env var names and file paths stay: they are not secrets.
    pub fn masked(&self) -> Settings {
        let mut masked = self.clone();
        for profile in masked.auth.values_mut() {
            for value in profile.params.values_mut() {
                if let AuthValue::Literal(literal) = value {
                    *literal = "***".to_string();
                }
            }
        }
        masked
    }

    /// The state file in force: `None` when set to an empty path.
    pub fn state_path(&self) -> Option<&Path> {
        self.state_file
            .as_deref()
            .filter(|path| !path.as_os_str().is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn interceptor_address_lists_load_from_a_file_and_the_environment() {
        let defaults = Settings::load(None, env(&[]), &Overrides::default()).unwrap();
        assert!(
            defaults
                .interceptor
                .denied_networks
                .contains(&"127.0.0.0/8".to_string())
        );
        assert!(
            defaults
                .interceptor
                .denied_networks
                .contains(&OWN_ADDRESSES.to_string())
        );
        assert!(defaults.interceptor.trusted_proxies.is_empty());
        assert!(!defaults.interceptor.allow_encoded_slashes);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(&file, "[interceptor]\ndenied_networks = []\n").unwrap();
        let emptied = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
        assert!(
            emptied.interceptor.denied_networks.is_empty(),
            "[] turns it off"
        );

        let vars = env(&[
            ("HOIST_INTERCEPTOR__TRUSTED_PROXIES", "10.0.0.0/8,192.0.2.7"),
            ("HOIST_INTERCEPTOR__DENIED_NETWORKS", "169.254.0.0/16,self"),
        ]);
        let listed = Settings::load(None, vars, &Overrides::default()).unwrap();
        assert_eq!(
            listed.interceptor.trusted_proxies,
            ["10.0.0.0/8", "192.0.2.7"]
        );
        assert_eq!(
            listed.interceptor.denied_networks,
            ["169.254.0.0/16", "self"]
        );
    }

    /// What the kubelet set in a hoist pod beside the Services `hoist`
    /// (headless) and `hoist-interceptor-proxy` (found on the test node:
    /// hoist refused to start with "unknown field
    /// `interceptor_proxy_port_8080_tcp_addr`").
    #[test]
    fn kubernetes_service_links_are_not_settings_but_misspelt_settings_still_fail() {
        let links = env(&[
            ("HOIST_INTERCEPTOR_PROXY_SERVICE_HOST", "10.0.0.250"),
            ("HOIST_INTERCEPTOR_PROXY_SERVICE_PORT", "8080"),
            ("HOIST_INTERCEPTOR_PROXY_SERVICE_PORT_HTTP", "8080"),
            ("HOIST_INTERCEPTOR_PROXY_PORT", "tcp://10.0.0.250:8080"),
            (
                "HOIST_INTERCEPTOR_PROXY_PORT_8080_TCP",
                "tcp://10.0.0.250:8080",
            ),
            ("HOIST_INTERCEPTOR_PROXY_PORT_8080_TCP_ADDR", "10.0.0.250"),
            ("HOIST_INTERCEPTOR_PROXY_PORT_8080_TCP_PORT", "8080"),
            ("HOIST_INTERCEPTOR_PROXY_PORT_8080_TCP_PROTO", "tcp"),
            ("HOIST_SERVICE_HOST", "10.0.0.9"),
            ("HOIST_PORT_9090_TCP_ADDR", "10.0.0.9"),
            ("HOIST_GRPC__LISTEN", "0.0.0.0:7070"),
        ]);
        let settings = Settings::load(None, links, &Overrides::default()).unwrap();
        assert_eq!(settings.grpc.listen.port(), 7070, "hoist's own still read");

        for misspelt in ["HOIST_GRPC_LISTEN", "HOIST_GRPC__PORT", "HOIST_PORT__GRPC"] {
            let refused = Settings::load(None, env(&[(misspelt, "9")]), &Overrides::default());
            assert!(refused.is_err(), "{misspelt} is refused");
        }
    }

    #[test]
    fn listeners_on_one_port_are_refused_with_both_keys() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        let cases = [
            (
                "[admin]\nlisten = \"0.0.0.0:9090\"\n",
                "admin.listen",
                "grpc.listen",
            ),
            (
                "[interceptor]\nhttp_listen = \"127.0.0.1:9091\"\n[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.example.com\"\nupstream = \"web:80\"\n",
                "interceptor.http_listen",
                "admin.listen",
            ),
            (
                "[[interceptor.tcp_routes]]\nname = \"db\"\nlisten = \"[::]:9090\"\nupstream = \"db:5432\"\n",
                "interceptor.tcp_routes[db].listen",
                "grpc.listen",
            ),
        ];
        for (text, key, other) in cases {
            std::fs::write(&file, text).unwrap();
            let error = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
            let ConfigError::Invalid { key: got, reason } = &error else {
                panic!("{text}: {error}")
            };
            assert_eq!(got, key, "{text}");
            assert!(reason.contains(other), "{text}: {reason}");
        }
        // Distinct addresses on one port, and remote interceptors whose
        // routes this process never binds, are fine.
        for text in [
            "[grpc]\nlisten = \"127.0.0.1:7000\"\n[admin]\nlisten = \"127.0.0.2:7000\"\n",
            "[interceptor]\nendpoints = [\"i:9091\"]\nhttp_listen = \"0.0.0.0:9091\"\n[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.example.com\"\nupstream = \"web:80\"\n",
        ] {
            std::fs::write(&file, text).unwrap();
            Settings::load(Some(&file), env(&[]), &Overrides::default())
                .unwrap_or_else(|e| panic!("{text}: {e}"));
        }
    }

    #[test]
    fn defaults_match_the_documentation() {
        let settings = Settings::load(None, env(&[]), &Overrides::default()).unwrap();
        assert_eq!(settings, Settings::default());
        assert_eq!(settings.grpc.listen.to_string(), "0.0.0.0:9090");
        assert_eq!(settings.admin.listen.to_string(), "0.0.0.0:9091");
        assert_eq!(settings.polling.default_interval, Duration::from_secs(30));
    }

    #[test]
    fn interceptor_tls_is_checked_at_load_naming_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        let head = "[interceptor.tls]\nca_file = \"/etc/hoist/channel/ca.crt\"\n";
        for (rest, key) in [
            ("cert_file = \"tls.crt\"\n", "interceptor.tls.key_file"),
            (
                "server_name = \"not a name\"\n",
                "interceptor.tls.server_name",
            ),
            (
                "key_file = \"\"\ncert_file = \"tls.crt\"\n",
                "interceptor.tls.key_file",
            ),
        ] {
            std::fs::write(&file, format!("{head}{rest}")).unwrap();
            let error = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
            let ConfigError::Invalid { key: got, .. } = &error else {
                panic!("{rest}: {error}")
            };
            assert_eq!(got, key, "{rest}");
        }
        std::fs::write(
            &file,
            format!("{head}cert_file = \"tls.crt\"\nkey_file = \"tls.key\"\nserver_name = \"hoist-interceptor.hoist.svc\"\n"),
        )
        .unwrap();
        let settings = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
        let tls = settings.interceptor.tls.expect("[interceptor.tls] is read");
        assert_eq!(
            tls.server_name.as_deref(),
            Some("hoist-interceptor.hoist.svc")
        );
        assert_eq!(tls.reload_every, Duration::from_secs(10));
    }

    #[test]
    fn kubernetes_access_and_the_state_file() {
        let defaults = Settings::default();
        assert_eq!(defaults.kubernetes.enabled, KubernetesAccess::Auto);
        assert_eq!(defaults.state_path(), Some(Path::new(DEFAULT_STATE_FILE)));
        assert!(!defaults.engine.assume_applied);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        for (text, enabled) in [
            ("[kubernetes]\nenabled = \"auto\"\n", KubernetesAccess::Auto),
            ("[kubernetes]\nenabled = true\n", KubernetesAccess::On),
            ("[kubernetes]\nenabled = false\n", KubernetesAccess::Off),
        ] {
            std::fs::write(&file, text).unwrap();
            let settings = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
            assert_eq!(settings.kubernetes.enabled, enabled, "{text}");
        }
        let from_env = Settings::load(
            None,
            env(&[
                ("HOIST_KUBERNETES__ENABLED", "false"),
                ("HOIST_ENGINE__ASSUME_APPLIED", "true"),
                ("HOIST_STATE_FILE", ""),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(from_env.kubernetes.enabled, KubernetesAccess::Off);
        assert!(from_env.engine.assume_applied);
        assert_eq!(from_env.state_path(), None, "an empty path: memory only");
        std::fs::write(&file, "[kubernetes]\nenabled = \"sometimes\"\n").unwrap();
        let refused = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
        let message = format!("{refused:#}");
        let chain = std::iter::successors(Some(&refused as &dyn std::error::Error), |e| e.source())
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(": ");
        assert!(chain.contains("sometimes"), "{message} / {chain}");
        std::fs::write(&file, "[kubernetes]\ntimeout = \"0s\"\n").unwrap();
        let refused = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
        assert!(
            refused.to_string().contains("kubernetes.timeout"),
            "{refused}"
        );
    }

    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(
            &file,
            r#"
shutdown_grace = "3s"
[grpc]
listen = "127.0.0.1:1000"
[admin]
listen = "127.0.0.1:2000"
[log]
level = "debug"
[polling]
default_interval = "15s"
"#,
        )
        .unwrap();
        let variables = env(&[
            ("HOIST_ADMIN__LISTEN", "127.0.0.1:3000"),
            ("HOIST_POLLING__DEFAULT_INTERVAL", "5s"),
            ("HOIST_LOG__LEVEL", "warn"),
            ("OTHER_THING", "ignored"),
        ]);
        let overrides = Overrides {
            log_level: Some("error".into()),
            ..Default::default()
        };
        let settings = Settings::load(Some(&file), variables, &overrides).unwrap();
        assert_eq!(settings.grpc.listen.to_string(), "127.0.0.1:1000"); // file
        assert_eq!(settings.admin.listen.to_string(), "127.0.0.1:3000"); // env beats file
        assert_eq!(settings.polling.default_interval, Duration::from_secs(5));
        assert_eq!(settings.log.level, "error"); // flag beats env

        assert_eq!(settings.shutdown_grace, Duration::from_secs(3));
        let lists = env(&[
            ("HOIST_INTERCEPTOR__ENDPOINTS", "a.svc:9091,b.svc:9091"),
            ("HOIST_LIMITS__ALLOWED_SOURCES", "*.svc:*"),
            ("HOIST_LOG__LEVEL", "hoist=debug,info"),
        ]);
        let settings = Settings::load(None, lists, &Overrides::default()).unwrap();
        assert_eq!(settings.interceptor.endpoints, ["a.svc:9091", "b.svc:9091"]);
        assert_eq!(settings.limits.allowed_sources, ["*.svc:*"]);
        assert_eq!(settings.log.level, "hoist=debug,info");
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = Settings::load(
            None,
            env(&[("HOIST_POLLING__DEFAULT_TIMEOUT", "0s")]),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("polling.default_timeout"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(&file, "[grpc]\nlisten = \"nowhere\"\n").unwrap();
        let err = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
        let cause = std::error::Error::source(&err)
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(cause.contains("listen"), "{err}: {cause}");
    }

    #[test]
    fn masked_settings_hide_literal_credentials_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(
            &file,
            r#"
[auth.orders-redis]
namespaces = ["orders"]
username = "app"
password = { file = "/var/run/secrets/redis/password" }
"#,
        )
        .unwrap();
        let settings = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
        let masked = toml::to_string(&settings.masked()).unwrap();
        assert!(!masked.contains("\"app\""), "{masked}");
        assert!(masked.contains("***"), "{masked}");
        assert!(
            masked.contains("/var/run/secrets/redis/password"),
            "a file path is not a secret: {masked}"
        );
    }

    #[test]
    fn interceptor_routes_are_checked_with_the_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        let route = |extra: &str| {
            format!(
                "[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.test\"\nupstream = \"web:80\"\n{extra}"
            )
        };
        let cases = [
            (route("path_prefix = \"api\""), "http_routes[web].path_prefix"),
            (format!("{}{}", route(""), route("")), "http_routes[web].name"),
            (route("cold_start_timeout = \"0s\""), "http_routes[web].cold_start_timeout"),
            (route("response_timeout = \"2h\""), "http_routes[web].response_timeout"),
            ("[interceptor]\nresponse_timeout = \"0s\"\n".to_string(), "interceptor.response_timeout"),
            (
                "[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web.test:80\"\nupstream = \"web:80\"\n".to_string(),
                "http_routes[web].host",
            ),
            (
                "[[interceptor.http_routes]]\nname = \"web\"\nhost = \"web?.test\"\nupstream = \"web:80\"\n".to_string(),
                "http_routes[web].host",
            ),
            (
                "[[interceptor.tcp_routes]]\nname = \"db\"\nlisten = \"0.0.0.0:5432\"\nupstream = \"postgres://u:p@db\"\n".to_string(),
                "tcp_routes[db].upstream",
            ),
            (
                "[[interceptor.tcp_routes]]\nname = \"a b\"\nlisten = \"0.0.0.0:1\"\nupstream = \"db:1\"\n".to_string(),
                "tcp_routes.name",
            ),
            ("[interceptor]\nendpoints = [\"http://x:9091\"]\n".to_string(), "interceptor.endpoints"),
            ("[interceptor]\nmax_held_per_route = 0\n".to_string(), "interceptor.max_held_per_route"),
            (
                "[interceptor]\ndirect_to_pods = true\n[kubernetes]\nenabled = false\n".to_string(),
                "interceptor.direct_to_pods",
            ),
            ("[interceptor]\nmax_connections = 0\n".to_string(), "interceptor.max_connections"),
            ("[interceptor]\nidle_timeout = \"0s\"\n".to_string(), "interceptor.idle_timeout"),
            ("[interceptor]\nsend_timeout = \"0s\"\n".to_string(), "interceptor.send_timeout"),
            ("[interceptor]\nfirst_byte_timeout = \"2h\"\n".to_string(), "interceptor.first_byte_timeout"),
            ("[interceptor]\nmax_header_bytes = 100\n".to_string(), "interceptor.max_header_bytes"),
            ("[interceptor]\nhttp2_max_concurrent_streams = 0\n".to_string(), "interceptor.http2_max_concurrent_streams"),
            ("[interceptor]\nhttp2_keepalive_timeout = \"0s\"\n".to_string(), "interceptor.http2_keepalive_timeout"),
            ("[grpc]\nkeepalive_interval = \"0s\"\n".to_string(), "grpc.keepalive_interval"),
            ("[shutdown]\ndrain_delay = \"2h\"\n".to_string(), "shutdown.drain_delay"),
            ("[shutdown]\ngrace = \"2h\"\n".to_string(), "shutdown.grace"),
            ("[limits]\nmax_tracked_metadata_bytes = 10\n".to_string(), "limits.max_tracked_metadata_bytes"),
            ("[limits]\nmax_tracked_triggers_per_namespace = 0\n".to_string(), "limits.max_tracked_triggers_per_namespace"),
            ("[interceptor]\ndenied_networks = [\"10.0.0.0/33\"]\n".to_string(), "interceptor.denied_networks"),
            ("[interceptor]\ntrusted_proxies = [\"self\"]\n".to_string(), "interceptor.trusted_proxies"),
        ];
        for (text, key) in cases {
            std::fs::write(&file, &text).unwrap();
            let err = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains(key), "{text}\n→ {err}");
        }
        // The upstream's password, if one was pasted in, is not echoed.
        std::fs::write(&file, cases_secret()).unwrap();
        let err = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");

        std::fs::write(
            &file,
            route("path_prefix = \"/api\"\nupstream_http2 = true\nresponse_timeout = \"15m\""),
        )
        .unwrap();
        let settings = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
        assert!(settings.interceptor.in_process());
        assert_eq!(
            settings.interceptor.http_routes[0].path_prefix.as_deref(),
            Some("/api")
        );
        assert_eq!(
            settings.interceptor.http_routes[0].response_timeout,
            Some(Duration::from_secs(900))
        );
        assert_eq!(
            settings.interceptor.response_timeout,
            Duration::from_secs(240),
            "the default"
        );
    }

    #[test]
    fn shutdown_grace_is_kept_and_shutdown_grace_in_its_section_wins() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(&file, "shutdown_grace = \"7s\"\n").unwrap();
        let settings = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
        assert_eq!(settings.grace(), Duration::from_secs(7));
        assert_eq!(settings.shutdown.drain_delay, Duration::ZERO);
        std::fs::write(
            &file,
            "shutdown_grace = \"7s\"\n[shutdown]\ngrace = \"20s\"\ndrain_delay = \"5s\"\n",
        )
        .unwrap();
        let settings = Settings::load(Some(&file), env(&[]), &Overrides::default()).unwrap();
        assert_eq!(settings.grace(), Duration::from_secs(20));
        assert_eq!(settings.shutdown.drain_delay, Duration::from_secs(5));
        let variables = env(&[
            ("HOIST_SHUTDOWN__DRAIN_DELAY", "15s"),
            ("HOIST_INTERCEPTOR__IDLE_TIMEOUT", "5s"),
        ]);
        let settings = Settings::load(Some(&file), variables, &Overrides::default()).unwrap();
        assert_eq!(settings.shutdown.drain_delay, Duration::from_secs(15));
        assert_eq!(settings.interceptor.idle_timeout, Duration::from_secs(5));
    }

    fn cases_secret() -> String {
        "[[interceptor.tcp_routes]]\nname = \"db\"\nlisten = \"0.0.0.0:1\"\nupstream = \"user:hunter2@db:5432\"\n".to_string()
    }
}
