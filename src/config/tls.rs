//! TLS settings: hoist's own listeners (`[grpc.tls]`, `[admin.tls]`) and
//! the channel between a scaler and its interceptors (`[interceptor.tls]`).
//! What they mean at run time (certificates read, reloaded, verified) is
//! `crate::tls`'s business.

use std::path::PathBuf;
use std::time::Duration;

use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};

/// `[grpc.tls]` / `[admin.tls]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate
    /// signed by one of them (mTLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are checked for a change.
    #[serde(default = "default_reload_every", with = "humantime_serde")]
    pub reload_every: Duration,
}

fn default_reload_every() -> Duration {
    Duration::from_secs(10)
}

/// `[interceptor.tls]`: how one hoist process dials another's admin port
/// (the scaler reading interceptors, interceptors reading the scaler).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsSettings {
    /// PEM CA certificates the server's certificate must chain to; the
    /// system's roots are not used.
    pub ca_file: PathBuf,
    /// PEM certificate chain presented to the server (mTLS); with
    /// `key_file`, or neither.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, whatever address is
    /// dialled (pod IPs from a headless Service); unset, the dialled host.
    #[serde(default)]
    pub server_name: Option<String>,
    /// How often the client certificate files are checked for a change.
    #[serde(default = "default_reload_every", with = "humantime_serde")]
    pub reload_every: Duration,
}

/// A `ClientTlsSettings` field that cannot work, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct ClientTlsInvalid {
    pub field: &'static str,
    pub reason: String,
}

impl ClientTlsSettings {
    /// What can be checked without reading the files.
    pub fn validate(&self) -> Result<(), ClientTlsInvalid> {
        let invalid = |field, reason: &str| {
            Err(ClientTlsInvalid {
                field,
                reason: reason.to_string(),
            })
        };
        let files = [
            ("ca_file", Some(&self.ca_file)),
            ("cert_file", self.cert_file.as_ref()),
            ("key_file", self.key_file.as_ref()),
        ];
        for (field, path) in files {
            if path.is_some_and(|path| path.as_os_str().is_empty()) {
                return invalid(field, "must be a file path, not empty");
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => return invalid("key_file", "must be set when `cert_file` is"),
            (None, Some(_)) => return invalid("cert_file", "must be set when `key_file` is"),
            _ => {}
        }
        if let Some(name) = &self.server_name
            && ServerName::try_from(name.as_str()).is_err()
        {
            return Err(ClientTlsInvalid {
                field: "server_name",
                reason: format!("`{name}` is not a DNS name or an IP address"),
            });
        }
        if self.reload_every.is_zero() {
            return invalid("reload_every", "must be more than zero");
        }
        Ok(())
    }
}
