//! AWS MSK IAM tokens for `sasl: oauthbearer` with `saslTokenProvider:
//! aws_msk_iam`, made as KEDA makes them (kedacore/keda
//! pkg/scalers/kafka/kafka_scaler_oauth_token_provider.go,
//! `mskTokenProvider.Token`, through aws-msk-iam-sasl-signer-go's
//! `GenerateAuthTokenFromCredentialsProvider`): a SigV4-presigned
//! `GET https://kafka.<region>.amazonaws.com/?Action=kafka-cluster:Connect`,
//! valid 900 s, with a `User-Agent` parameter added after signing, the
//! whole URL base64url-encoded without padding.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign};
use aws_sigv4::sign::v4;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::secret::Secret;

/// aws-msk-iam-sasl-signer-go's `DefaultExpiryDuration`.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);
const SIGNING_NAME: &str = "kafka-cluster";
const USER_AGENT: &str = concat!("hoist/", env!("CARGO_PKG_VERSION"));

/// Static AWS credentials (an access key, and a session token when they
/// are temporary). `Debug` masks the secrets (`Secret`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

/// A token and when it stops being valid.
pub struct Token {
    pub value: Secret,
    pub expires_at: SystemTime,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot sign the AWS MSK IAM token: {0}")]
pub struct SignError(String);

/// Signs a token at `now` for `region`.
pub fn token(region: &str, credentials: &AwsCredentials, now: SystemTime, lifetime: Duration) -> Result<Token, SignError> {
    let fail = |e: &dyn std::fmt::Display| SignError(e.to_string());
    let identity = Credentials::new(
        &credentials.access_key_id,
        credentials.secret_access_key.expose(),
        credentials.session_token.as_ref().map(|t| t.expose().to_string()),
        None,
        "hoist",
    )
    .into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(lifetime);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SIGNING_NAME)
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| fail(&e))?
        .into();
    let host = format!("kafka.{region}.amazonaws.com");
    let unsigned = format!("https://{host}/?Action=kafka-cluster%3AConnect");
    // The Go signer hashes an empty payload, and signs the host header.
    let request = SignableRequest::new("GET", unsigned.as_str(), [("host", host.as_str())].into_iter(), SignableBody::Bytes(&[]))
        .map_err(|e| fail(&e))?;
    let (instructions, _) = sign(request, &params).map_err(|e| fail(&e))?.into_parts();
    let mut url = unsigned;
    for (name, value) in instructions.params() {
        url.push('&');
        url.push_str(name);
        url.push('=');
        url.extend(percent_encoding::utf8_percent_encode(value, QUERY_VALUE));
    }
    url.push_str("&User-Agent=");
    url.extend(percent_encoding::utf8_percent_encode(USER_AGENT, QUERY_VALUE));
    Ok(Token {
        value: Secret::new(URL_SAFE_NO_PAD.encode(url)),
        expires_at: now + lifetime,
    })
}

/// RFC 3986 unreserved characters stay; everything else is encoded.
const QUERY_VALUE: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Milliseconds since the Unix epoch, as librdkafka takes a token's end.
pub fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(token: &Token) -> String {
        String::from_utf8(URL_SAFE_NO_PAD.decode(token.value.expose()).unwrap()).unwrap()
    }

    fn query(url: &str) -> Vec<(String, String)> {
        let (_, query) = url.split_once('?').unwrap();
        query
            .split('&')
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap();
                (k.to_string(), percent_encoding::percent_decode_str(v).decode_utf8().unwrap().into_owned())
            })
            .collect()
    }

    #[test]
    fn a_token_is_a_presigned_connect_url_valid_900_seconds() {
        let credentials = AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
            session_token: Some(Secret::new("session/token+value")),
        };
        // 2024-01-02T03:04:05Z
        let now = UNIX_EPOCH + Duration::from_secs(1_704_164_645);
        let signed = token("eu-west-1", &credentials, now, TOKEN_LIFETIME).unwrap();
        assert_eq!(signed.expires_at, now + Duration::from_secs(900));
        assert!(!signed.value.expose().contains('='), "no padding");
        let url = decode(&signed);
        assert!(url.starts_with("https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"), "{url}");
        let params = query(&url);
        let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("Action"), Some("kafka-cluster:Connect"));
        assert_eq!(get("X-Amz-Algorithm"), Some("AWS4-HMAC-SHA256"));
        assert_eq!(get("X-Amz-Credential"), Some("AKIDEXAMPLE/20240102/eu-west-1/kafka-cluster/aws4_request"));
        assert_eq!(get("X-Amz-Date"), Some("20240102T030405Z"));
        assert_eq!(get("X-Amz-Expires"), Some("900"));
        assert_eq!(get("X-Amz-SignedHeaders"), Some("host"));
        assert_eq!(get("X-Amz-Security-Token"), Some("session/token+value"));
        assert_eq!(get("User-Agent"), Some(USER_AGENT));
        let signature = get("X-Amz-Signature").unwrap();
        assert_eq!(signature.len(), 64);
        assert!(signature.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(!url.contains("wJalrXUtnFEMI"), "the secret key never travels");

        // Deterministic for one instant; another instant, another signature.
        assert_eq!(token("eu-west-1", &credentials, now, TOKEN_LIFETIME).unwrap().value, signed.value);
        let later = token("eu-west-1", &credentials, now + Duration::from_secs(1), TOKEN_LIFETIME).unwrap();
        assert_ne!(later.value, signed.value);
    }
}
