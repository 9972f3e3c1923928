//! `[admin.auth]`: who may read the admin port's reports (`/status`,
//! `/routes/table`, `/interceptor/*`, ...), and the credential this hoist
//! presents when it reads another hoist's admin port. What it means at run
//! time (TokenReview, the cache, the 401/403/503 answers) is
//! `crate::admin_auth`'s business.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The projected ServiceAccount token every pod mounts by default.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The prefix of a ServiceAccount's user name in the Kubernetes API.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// When the reports need an authenticated caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Require {
    /// When the admin port is exposed (`admin.listen` is not a loopback
    /// address), or asks for client certificates
    /// (`admin.tls.client_ca_file`). A loopback listener is reachable only
    /// from the pod's own network namespace (its containers, `kubectl
    /// exec`/`port-forward`).
    #[default]
    Auto,
    Always,
    /// Anyone who reaches the port reads everything (single-tenant or dev).
    Never,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminAuthSettings {
    pub require: Require,
    /// Kubernetes users whose ServiceAccount token (checked with
    /// TokenReview) is accepted: exact names, or
    /// `system:serviceaccount:<namespace>:*` for every ServiceAccount of
    /// one namespace. Empty: bearer tokens are not accepted (mTLS only).
    pub allowed_callers: Vec<String>,
    /// The audiences a token must be issued for (TokenReview
    /// `spec.audiences`). Empty: the API server's own.
    pub audiences: Vec<String>,
    /// How long a TokenReview answer is reused for the same token.
    #[serde(with = "humantime_serde")]
    pub cache_ttl: Duration,
    /// The token this hoist sends (`Authorization: Bearer`) when it reads
    /// another hoist's admin port; read again for every request, so a
    /// rotated token is used at once. A missing file: no header.
    pub token_file: PathBuf,
}

impl Default for AdminAuthSettings {
    fn default() -> Self {
        Self {
            require: Require::Auto,
            allowed_callers: Vec::new(),
            audiences: Vec::new(),
            cache_ttl: Duration::from_secs(10),
            token_file: PathBuf::from(DEFAULT_TOKEN_FILE),
        }
    }
}

/// The longest `cache_ttl`: a deleted ServiceAccount or a token revoked is
/// believed at most this long.
const MAX_CACHE_TTL: Duration = Duration::from_secs(300);

impl AdminAuthSettings {
    /// Whether callers of the reports must authenticate, for a listener on
    /// `listen`, with or without a client CA (`mtls`).
    pub fn required(&self, listen: SocketAddr, mtls: bool) -> bool {
        match self.require {
            Require::Auto => mtls || !listen.ip().is_loopback(),
            Require::Always => true,
            Require::Never => false,
        }
    }

    /// The first setting that cannot work: (key, reason).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        for caller in &self.allowed_callers {
            if let Err(reason) = CallerPattern::new(caller) {
                return Some(("admin.auth.allowed_callers", reason));
            }
        }
        if self
            .audiences
            .iter()
            .any(|audience| audience.trim().is_empty())
        {
            return Some((
                "admin.auth.audiences",
                "an audience must not be empty".to_string(),
            ));
        }
        if self.cache_ttl > MAX_CACHE_TTL {
            return Some((
                "admin.auth.cache_ttl",
                "must be at most 5 minutes (a revoked token is believed that long)".to_string(),
            ));
        }
        if self.token_file.as_os_str().is_empty() {
            return Some(("admin.auth.token_file", "must not be empty".to_string()));
        }
        None
    }
}

/// One `admin.auth.allowed_callers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerPattern {
    User(String),
    /// Every ServiceAccount of this namespace.
    Namespace(String),
}

impl CallerPattern {
    pub fn new(pattern: &str) -> Result<Self, String> {
        if pattern.trim().is_empty() {
            return Err("an entry must not be empty".to_string());
        }
        if !pattern.contains('*') {
            return Ok(Self::User(pattern.to_string()));
        }
        let namespace = pattern
            .strip_prefix(SERVICE_ACCOUNT_PREFIX)
            .and_then(|rest| rest.strip_suffix(":*"))
            .filter(|namespace| {
                !namespace.is_empty() && !namespace.contains([':', '*']) && namespace.len() <= 63
            });
        match namespace {
            Some(namespace) => Ok(Self::Namespace(namespace.to_string())),
            None => Err(format!(
                "`{pattern}`: `*` is allowed only as `system:serviceaccount:<namespace>:*` (every ServiceAccount of one namespace)"
            )),
        }
    }

    pub fn matches(&self, user: &str) -> bool {
        match self {
            Self::User(name) => name == user,
            Self::Namespace(namespace) => user
                .strip_prefix(SERVICE_ACCOUNT_PREFIX)
                .and_then(|rest| rest.split_once(':'))
                .is_some_and(|(ns, name)| ns == namespace && !name.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_requires_authentication_off_loopback_only() {
        let settings = AdminAuthSettings::default();
        let at = |listen: &str| listen.parse::<SocketAddr>().unwrap();
        assert!(settings.required(at("0.0.0.0:9091"), false));
        assert!(settings.required(at("10.0.0.7:9091"), false));
        assert!(settings.required(at("[::]:9091"), false));
        assert!(!settings.required(at("127.0.0.1:9091"), false));
        assert!(!settings.required(at("[::1]:9091"), false));
        assert!(
            settings.required(at("127.0.0.1:9091"), true),
            "a client CA asks for callers' certificates"
        );
        let always = AdminAuthSettings {
            require: Require::Always,
            ..Default::default()
        };
        assert!(always.required(at("127.0.0.1:9091"), false));
        let never = AdminAuthSettings {
            require: Require::Never,
            ..Default::default()
        };
        assert!(!never.required(at("0.0.0.0:9091"), true));
    }

    #[test]
    fn caller_patterns_allow_one_namespace_wildcard_only() {
        let exact = CallerPattern::new("system:serviceaccount:hoist:hoist-interceptor").unwrap();
        assert!(exact.matches("system:serviceaccount:hoist:hoist-interceptor"));
        assert!(!exact.matches("system:serviceaccount:hoist:other"));
        let namespace = CallerPattern::new("system:serviceaccount:monitoring:*").unwrap();
        assert!(namespace.matches("system:serviceaccount:monitoring:prometheus"));
        assert!(!namespace.matches("system:serviceaccount:monitoring-x:prometheus"));
        assert!(!namespace.matches("system:serviceaccount:monitoring:"));
        assert!(!namespace.matches("monitoring:prometheus"));
        for bad in [
            "*",
            "system:serviceaccount:*",
            "system:serviceaccount:*:*",
            "system:serviceaccount:a:b*",
            "admin*",
            " ",
        ] {
            assert!(CallerPattern::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn problems_name_the_key() {
        let mut settings = AdminAuthSettings {
            allowed_callers: vec!["*".into()],
            ..Default::default()
        };
        assert_eq!(settings.problem().unwrap().0, "admin.auth.allowed_callers");
        settings.allowed_callers.clear();
        settings.cache_ttl = Duration::from_secs(3600);
        assert_eq!(settings.problem().unwrap().0, "admin.auth.cache_ttl");
        settings.cache_ttl = Duration::from_secs(10);
        settings.audiences = vec![String::new()];
        assert_eq!(settings.problem().unwrap().0, "admin.auth.audiences");
    }
}
