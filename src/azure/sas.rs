//! Shared Access Signature tokens and Service Bus connection strings.

use base64::Engine;
use hmac::{Hmac, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::Sha256;

use crate::secret::Secret;

/// Go's `url.QueryEscape` (what the Azure SDKs sign): everything but
/// `A-Z a-z 0-9 - _ . ~` is escaped; space becomes `+`.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub fn query_escape(text: &str) -> String {
    utf8_percent_encode(text, QUERY)
        .to_string()
        .replace("%20", "+")
}

/// A `SharedAccessSignature` authorization value for `resource`, valid
/// until `expiry` (Unix seconds), signed with the key's raw bytes.
pub fn token(resource: &str, key_name: &str, key: &Secret, expiry: u64) -> Secret {
    let resource = query_escape(resource);
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose().as_bytes())
        .expect("HMAC accepts any key length");
    mac.update(format!("{resource}\n{expiry}").as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    Secret::new(format!(
        "SharedAccessSignature sr={resource}&sig={}&se={expiry}&skn={key_name}",
        query_escape(&signature)
    ))
}

/// A parsed Service Bus connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionString {
    /// `host[:port]` of the namespace.
    pub host: String,
    pub auth: SasAuth,
    /// `UseDevelopmentEmulator=true`: plain HTTP, as the SDKs do.
    pub emulator: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SasAuth {
    Key {
        name: String,
        key: Secret,
    },
    /// A ready `SharedAccessSignature sr=...` value.
    Signature(Secret),
}

/// Why a connection string is unusable. Never quotes the string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Service Bus connection string {0}")]
pub struct ConnectionStringError(&'static str);

impl ConnectionString {
    pub fn parse(text: &str) -> Result<Self, ConnectionStringError> {
        let mut endpoint = None;
        let (mut key_name, mut key, mut signature, mut emulator) = (None, None, None, false);
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = part.split_once('=') else {
                return Err(ConnectionStringError("has a part that is not Key=Value"));
            };
            match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => endpoint = Some(value.trim().to_string()),
                "sharedaccesskeyname" => key_name = Some(value.trim().to_string()),
                "sharedaccesskey" => key = Some(Secret::new(value.trim())),
                "sharedaccesssignature" => signature = Some(Secret::new(value.trim())),
                "usedevelopmentemulator" => emulator = value.trim().eq_ignore_ascii_case("true"),
                _ => {} // EntityPath and others do not matter here
            }
        }
        let endpoint = endpoint.ok_or(ConnectionStringError("has no Endpoint"))?;
        let host = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, rest)| rest)
            .trim_end_matches('/')
            .to_string();
        if host.is_empty() || host.contains(['/', '@']) {
            return Err(ConnectionStringError(
                "has an Endpoint that is not sb://<namespace host>/",
            ));
        }
        let auth = match (key_name, key, signature) {
            (_, _, Some(signature)) => SasAuth::Signature(signature),
            (Some(name), Some(key), None) => SasAuth::Key { name, key },
            _ => {
                return Err(ConnectionStringError(
                    "needs SharedAccessKeyName and SharedAccessKey, or SharedAccessSignature",
                ));
            }
        };
        Ok(Self {
            host,
            auth,
            emulator,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_sdk_vector() {
        let token = token("audience", "keyName", &Secret::new("key"), 1_578_099_723);
        assert_eq!(
            token.expose(),
            "SharedAccessSignature sr=audience&sig=8UM0iIfFCfeBSqxSdBMW8pUbhAm7mnjSUaIZTZx8V0g%3D&se=1578099723&skn=keyName"
        );
    }

    #[test]
    fn query_escape_matches_go() {
        assert_eq!(
            query_escape("https://ns.servicebus.windows.net/"),
            "https%3A%2F%2Fns.servicebus.windows.net%2F"
        );
        assert_eq!(query_escape("a b+c~d"), "a+b%2Bc~d");
    }

    #[test]
    fn connection_strings() {
        let parsed = ConnectionString::parse(
            "Endpoint=sb://orders.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=abc=;EntityPath=q",
        )
        .unwrap();
        assert_eq!(parsed.host, "orders.servicebus.windows.net");
        assert_eq!(
            parsed.auth,
            SasAuth::Key {
                name: "listen".into(),
                key: Secret::new("abc=")
            }
        );
        assert!(!parsed.emulator);
        let ready = ConnectionString::parse(
            "Endpoint=sb://127.0.0.1:5300/;SharedAccessSignature=SharedAccessSignature sr=x&sig=y&se=1&skn=k;UseDevelopmentEmulator=true",
        )
        .unwrap();
        assert_eq!(ready.host, "127.0.0.1:5300");
        assert!(ready.emulator);
        assert!(matches!(ready.auth, SasAuth::Signature(_)));
        for bad in [
            "none",
            "Endpoint=sb://x/",
            "SharedAccessKeyName=a;SharedAccessKey=b",
        ] {
            let err = ConnectionString::parse(bad).unwrap_err().to_string();
            assert!(!err.contains(bad) || bad == "none", "{err}");
        }
    }
}
