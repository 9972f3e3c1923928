//! TLS and mTLS on hoist's listeners, with certificates made in the test:
//! plaintext refused, unknown client certificates refused under mTLS,
//! rotation picked up without dropping open connections.

mod support;

use std::path::Path;
use std::time::Duration;

use hoist::config::Settings;
use hoist::config::TlsSettings;
use support::Hoist;
use support::certs::{Authority, write};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

fn tls_settings(dir: &Path, server: &Authority, client_ca: Option<&Authority>) -> TlsSettings {
    let (cert, key) = server.issue("localhost");
    TlsSettings {
        cert_file: write(dir, "server.pem", &cert),
        key_file: write(dir, "server.key", &key),
        client_ca_file: client_ca.map(|ca| write(dir, "clients.pem", &ca.pem)),
        reload_every: Duration::from_millis(100),
    }
}

async fn channel(
    hoist: &Hoist,
    ca: &Authority,
    identity: Option<(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{}", hoist.grpc))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

async fn healthy(channel: Channel) -> bool {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .is_ok()
}

#[tokio::test]
async fn tls_refuses_plaintext_and_serves_a_client_that_trusts_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("hoist test CA");
    let mut settings = Settings::default();
    settings.grpc.tls = Some(tls_settings(dir.path(), &ca, None));
    settings.admin.tls = settings.grpc.tls.clone();
    let hoist = Hoist::start_with(settings).await;

    assert!(healthy(channel(&hoist, &ca, None).await.unwrap()).await);

    let plain = Channel::from_shared(format!("http://{}", hoist.grpc))
        .unwrap()
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(channel) => !healthy(channel).await,
    };
    assert!(refused, "a plaintext client must not be served");

    let stranger = Authority::new("someone else");
    let distrusted = match channel(&hoist, &stranger, None).await {
        Err(_) => true,
        Ok(channel) => !healthy(channel).await,
    };
    assert!(
        distrusted,
        "a client that does not trust hoist's CA cannot talk to it"
    );

    // The admin port speaks TLS too.
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .resolve("localhost", hoist.admin)
        .build()
        .unwrap();
    let answer = client
        .get(format!("https://localhost:{}/healthz", hoist.admin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("server CA");
    let clients = Authority::new("client CA");
    let mut settings = Settings::default();
    settings.grpc.tls = Some(tls_settings(dir.path(), &ca, Some(&clients)));
    let hoist = Hoist::start_with(settings).await;

    let keda = clients.issue("keda-operator");
    assert!(healthy(channel(&hoist, &ca, Some(keda)).await.unwrap()).await);

    let anonymous = match channel(&hoist, &ca, None).await {
        Err(_) => true,
        Ok(channel) => !healthy(channel).await,
    };
    assert!(anonymous, "no client certificate, no service");

    let impostor = Authority::new("impostor CA").issue("keda-operator");
    let refused = match channel(&hoist, &ca, Some(impostor)).await {
        Err(_) => true,
        Ok(channel) => !healthy(channel).await,
    };
    assert!(refused, "a certificate from an unknown CA is refused");
}

#[tokio::test]
async fn a_rotated_certificate_is_picked_up_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Authority::new("old CA");
    let tls = tls_settings(dir.path(), &old_ca, None);
    let mut settings = Settings::default();
    settings.grpc.tls = Some(tls.clone());
    let hoist = Hoist::start_with(settings).await;
    let open = channel(&hoist, &old_ca, None).await.unwrap();
    assert!(healthy(open.clone()).await);

    // cert-manager writes a certificate from a new CA.
    let new_ca = Authority::new("new CA");
    let (cert, key) = new_ca.issue("localhost");
    std::fs::write(&tls.key_file, key).unwrap();
    std::fs::write(&tls.cert_file, cert).unwrap();

    let mut picked_up = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(channel) = channel(&hoist, &new_ca, None).await
            && healthy(channel).await
        {
            picked_up = true;
            break;
        }
    }
    assert!(picked_up, "new handshakes get the new certificate");
    assert!(
        healthy(open).await,
        "the connection opened before the rotation still works"
    );
    let stale = match channel(&hoist, &old_ca, None).await {
        Err(_) => true,
        Ok(channel) => !healthy(channel).await,
    };
    assert!(stale, "the old certificate is no longer served");
}

/// Client keys for sources (`key`, `keyPassword`): encrypted PKCS#8 keys
/// made by OpenSSL are decrypted as KEDA's `decryptClientKey` does; what
/// cannot be used is refused naming the key, never showing it.
mod client_keys {
    use hoist::secret::Secret;
    use hoist::tls::{ClientKeyError, client_key};

    const PASSWORD: &str = "kafka&redis key";

    fn fixture(name: &str) -> Secret {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        Secret::new(std::fs::read_to_string(path).unwrap())
    }

    #[test]
    fn encrypted_pkcs8_keys_are_decrypted() {
        let clear = fixture("client-key.clear.pkcs8.pem");
        for encrypted in ["client-key.aes256.pkcs8.pem", "client-key.des3.pkcs8.pem"] {
            let key = client_key(&fixture(encrypted), &Secret::new(PASSWORD)).unwrap();
            assert_eq!(key.expose().trim(), clear.expose().trim(), "{encrypted}");
        }
        // Without a password the key is used as given.
        assert_eq!(client_key(&clear, &Secret::default()).unwrap(), clear);
    }

    #[test]
    fn keys_that_cannot_be_used_are_refused_naming_the_key() {
        let wrong = client_key(
            &fixture("client-key.aes256.pkcs8.pem"),
            &Secret::new("hunter2"),
        )
        .unwrap_err();
        assert!(matches!(wrong, ClientKeyError::Decrypt(_)), "{wrong:?}");
        assert!(wrong.to_string().contains("`keyPassword`"), "{wrong}");
        assert!(!wrong.to_string().contains("hunter2"), "{wrong}");

        let legacy = client_key(
            &fixture("client-key.legacy-aes256.pem"),
            &Secret::new(PASSWORD),
        )
        .unwrap_err();
        assert_eq!(legacy, ClientKeyError::LegacyEncryption);
        let clear = client_key(
            &fixture("client-key.clear.pkcs8.pem"),
            &Secret::new(PASSWORD),
        )
        .unwrap_err();
        assert_eq!(clear, ClientKeyError::NotEncrypted);
        let garbage = client_key(&Secret::new("not a key"), &Secret::new(PASSWORD)).unwrap_err();
        assert_eq!(garbage, ClientKeyError::NotPem);
        assert!(!garbage.to_string().contains("not a key"));
    }
}
