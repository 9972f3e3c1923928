//! TLS for hoist's listeners: certificates read from files and re-read
//! when they change (cert-manager rotation) without touching open
//! connections, and an optional client CA that makes mTLS required. The
//! client side of one hoist dialling another's admin port (split setup),
//! with the same rotation for its client certificate. Also the client keys
//! hoist presents to sources (encrypted PKCS#8 decrypted).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, SystemTime};

use rustls::client::ResolvesClientCert;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{ClientTlsInvalid, ClientTlsSettings, TlsSettings};
use crate::secret::Secret;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} holds no usable {what}")]
    Empty { path: String, what: &'static str },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("CA certificates in {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error(transparent)]
    Invalid(#[from] ClientTlsInvalid),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// A certificate chain and its key on disk, checked for a change every
/// `reload_every`.
#[derive(Debug, Clone)]
struct KeyFiles {
    cert: PathBuf,
    key: PathBuf,
    reload_every: Duration,
}

impl KeyFiles {
    fn load(&self) -> Result<CertifiedKey, TlsError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&read(&self.cert)?)
                .filter_map(Result::ok)
                .collect();
        if chain.is_empty() {
            return Err(TlsError::Empty {
                path: self.cert.display().to_string(),
                what: "certificate",
            });
        }
        // The parser's own error could quote the file: name the path only.
        let key =
            PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|_| TlsError::Empty {
                path: self.key.display().to_string(),
                what: "private key",
            })?;
        let provider = rustls::crypto::ring::default_provider();
        Ok(CertifiedKey::from_der(chain, key, &provider)?)
    }

    fn modified(&self) -> Option<(SystemTime, SystemTime)> {
        let time = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
        Some((time(&self.cert)?, time(&self.key)?))
    }
}

/// The current certificate, for either end of a handshake; swapped in
/// place on rotation, so new handshakes get the new one and open
/// connections are left alone.
#[derive(Debug)]
struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    /// Loads the files and watches them until `cancel`, or until nothing
    /// uses the certificate any more.
    fn start(files: KeyFiles, cancel: CancellationToken) -> Result<Arc<Self>, TlsError> {
        let resolver = Arc::new(Self {
            current: RwLock::new(Arc::new(files.load()?)),
        });
        tokio::spawn(watch(files, Arc::downgrade(&resolver), cancel));
        Ok(resolver)
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The CA certificates in a PEM file.
fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&read(path)?).filter_map(Result::ok) {
        roots.add(certificate).map_err(|e| TlsError::Ca {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::Empty {
            path: path.display().to_string(),
            what: "CA certificate",
        });
    }
    Ok(roots)
}

fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the acceptor and starts watching the files. With a client CA,
/// a client certificate is required to finish the handshake.
pub fn acceptor(
    settings: &TlsSettings,
    cancel: CancellationToken,
) -> Result<TlsAcceptor, TlsError> {
    build_acceptor(settings, cancel, true)
}

/// The admin port's acceptor: with a client CA, a certificate that does
/// not chain to it still ends the handshake, but one may be left out, so
/// kubelet's probes and Prometheus reach the open endpoints; the admin
/// port then asks the reports' callers for a certificate or a token.
pub fn admin_acceptor(
    settings: &TlsSettings,
    cancel: CancellationToken,
) -> Result<TlsAcceptor, TlsError> {
    build_acceptor(settings, cancel, false)
}

fn build_acceptor(
    settings: &TlsSettings,
    cancel: CancellationToken,
    require_client_certificate: bool,
) -> Result<TlsAcceptor, TlsError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let files = KeyFiles {
        cert: settings.cert_file.clone(),
        key: settings.key_file.clone(),
        reload_every: settings.reload_every,
    };
    let resolver = ReloadingCert::start(files, cancel)?;
    let builder = rustls::ServerConfig::builder_with_provider(ring())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match &settings.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(path)?), ring());
            if !require_client_certificate {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier.build().map_err(|e| TlsError::Ca {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn watch(files: KeyFiles, resolver: Weak<ReloadingCert>, cancel: CancellationToken) {
    let mut seen = files.modified();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(files.reload_every) => {}
        }
        let Some(resolver) = resolver.upgrade() else {
            return;
        };
        let now = files.modified();
        if now == seen {
            continue;
        }
        match files.load() {
            Ok(key) => {
                *resolver.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
                seen = now;
                info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            // A half-written rotation: keep presenting the old one and retry.
            Err(error) => warn!(%error, "TLS certificate changed but cannot be loaded yet"),
        }
    }
}

/// Checks the server's certificate for one fixed name, whatever address
/// was dialled: pod IPs are not in a Service's certificate.
#[derive(Debug)]
struct FixedName {
    webpki: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for FixedName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.webpki
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A client TLS setup built from [`ClientTlsSettings`]: every reqwest
/// client made from it shares one CA, one server name check and one
/// watched client certificate.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: rustls::ClientConfig,
}

impl ClientTls {
    /// Reads the files; with a client certificate, starts watching it
    /// (needs a Tokio runtime) until every client made from this is gone.
    pub fn new(settings: &ClientTlsSettings) -> Result<Self, TlsError> {
        settings.validate()?;
        let webpki = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots(&settings.ca_file)?),
            ring(),
        )
        .build()
        .map_err(|e| TlsError::Ca {
            path: settings.ca_file.display().to_string(),
            reason: e.to_string(),
        })?;
        let verifier: Arc<dyn ServerCertVerifier> = match &settings.server_name {
            Some(name) => Arc::new(FixedName {
                webpki,
                // Checked by `validate`.
                name: ServerName::try_from(name.clone()).map_err(|_| ClientTlsInvalid {
                    field: "server_name",
                    reason: format!("`{name}` is not a DNS name or an IP address"),
                })?,
            }),
            None => webpki,
        };
        let builder = rustls::ClientConfig::builder_with_provider(ring())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&settings.cert_file, &settings.key_file) {
            (Some(cert), Some(key)) => {
                let files = KeyFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    reload_every: settings.reload_every,
                };
                builder.with_client_cert_resolver(ReloadingCert::start(
                    files,
                    CancellationToken::new(),
                )?)
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Self { config })
    }

    /// A reqwest client builder that speaks this TLS (use `https://` URLs).
    pub fn builder(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder().tls_backend_preconfigured(self.config.clone())
    }
}

/// A reqwest builder for dialling another hoist's admin port, and the URL
/// scheme that goes with it: TLS when `tls` is given, plain HTTP otherwise.
pub fn client_builder(tls: Option<&ClientTls>) -> (reqwest::ClientBuilder, &'static str) {
    match tls {
        Some(tls) => (tls.builder(), "https"),
        None => (reqwest::Client::builder(), "http"),
    }
}

/// Accepts TCP connections and completes TLS handshakes off the accept
/// loop, so one slow or failing client holds up nobody.
pub struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor, cancel: CancellationToken) -> Self {
        let local = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (sender, connections) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    accepted = crate::listen::accept(&listener, "TLS") => accepted,
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => debug!(%peer, %error, "TLS handshake refused"),
                        Err(_) => debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Self { connections, local }
    }

    /// The connections as a stream, for tonic.
    pub fn into_stream(self) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
        tokio_stream::wrappers::ReceiverStream::new(self.connections).map(|(stream, _)| Ok(stream))
    }
}

use tokio_stream::StreamExt as _;

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept loop ended (shutdown): wait for the server to stop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Why a source's client key (`key`, `keyPassword`) cannot be used. The
/// messages name the key and never show its material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientKeyError {
    #[error("`key` is not a PEM private key")]
    NotPem,
    #[error(
        "`keyPassword` is set but `key` is a legacy OpenSSL-encrypted PEM (Proc-Type: 4,ENCRYPTED); give an encrypted PKCS#8 key (`openssl pkcs8 -topk8`), as KEDA needs too"
    )]
    LegacyEncryption,
    #[error(
        "`keyPassword` is set but `key` is not an encrypted PKCS#8 key (BEGIN ENCRYPTED PRIVATE KEY)"
    )]
    NotEncrypted,
    #[error(
        "`keyPassword` does not decrypt `key` (wrong password, or a cipher hoist does not know): {0}"
    )]
    Decrypt(String),
}

/// The client key to present, in clear PEM: `key` itself without a
/// password; with one, `key` is an encrypted PKCS#8 key, decrypted as
/// KEDA's `decryptClientKey` does (kedacore/keda pkg/util/tls_config.go,
/// `NewTLSConfigWithPassword`: PKCS#8 with PBES2, or an error).
pub fn client_key(key: &Secret, password: &Secret) -> Result<Secret, ClientKeyError> {
    use pkcs8::der::pem::LineEnding;

    if password.is_empty() {
        return Ok(key.clone());
    }
    let text = key.expose();
    if text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(ClientKeyError::LegacyEncryption);
    }
    let (label, document) =
        pkcs8::der::SecretDocument::from_pem(text).map_err(|_| ClientKeyError::NotPem)?;
    if label != "ENCRYPTED PRIVATE KEY" {
        return Err(ClientKeyError::NotEncrypted);
    }
    let encrypted = pkcs8::EncryptedPrivateKeyInfo::try_from(document.as_bytes())
        .map_err(|e| ClientKeyError::Decrypt(e.to_string()))?;
    let clear = encrypted
        .decrypt(password.expose())
        .map_err(|e| ClientKeyError::Decrypt(e.to_string()))?;
    let pem = clear
        .to_pem("PRIVATE KEY", LineEnding::LF)
        .map_err(|e| ClientKeyError::Decrypt(e.to_string()))?;
    Ok(Secret::new(pem.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<ClientTlsSettings, toml::de::Error> {
        toml::from_str(text)
    }

    fn refused(settings: &ClientTlsSettings) -> (&'static str, String) {
        let error = settings.validate().expect_err("refused");
        (error.field, error.reason)
    }

    #[test]
    fn client_settings_default_to_ten_seconds_and_refuse_unknown_keys() {
        let plain = settings(r#"ca_file = "/etc/hoist/ca.crt""#).unwrap();
        assert_eq!(plain.reload_every, Duration::from_secs(10));
        assert_eq!(plain.cert_file, None);
        assert!(plain.validate().is_ok());
        let typo = settings("ca_file = \"ca.crt\"\nservername = \"x\"").unwrap_err();
        assert!(typo.to_string().contains("servername"), "{typo}");
        assert!(
            settings(r#"cert_file = "c.crt""#).is_err(),
            "ca_file is required"
        );
    }

    #[test]
    fn client_settings_need_the_cert_and_key_together() {
        let full = settings(
            r#"
            ca_file = "ca.crt"
            cert_file = "tls.crt"
            key_file = "tls.key"
            server_name = "hoist-interceptor.hoist.svc"
            reload_every = "2s"
            "#,
        )
        .unwrap();
        assert!(full.validate().is_ok());

        let mut no_key = full.clone();
        no_key.key_file = None;
        let (field, reason) = refused(&no_key);
        assert_eq!(field, "key_file");
        assert!(reason.contains("cert_file"), "{reason}");
        let mut no_cert = full.clone();
        no_cert.cert_file = None;
        assert_eq!(refused(&no_cert).0, "cert_file");
    }

    #[test]
    fn client_settings_refuse_empty_paths_bad_names_and_a_zero_reload() {
        let good = settings(r#"ca_file = "ca.crt""#).unwrap();
        let mut empty_ca = good.clone();
        empty_ca.ca_file = PathBuf::new();
        assert_eq!(refused(&empty_ca).0, "ca_file");
        let mut empty_key = good.clone();
        empty_key.cert_file = Some("tls.crt".into());
        empty_key.key_file = Some(PathBuf::new());
        assert_eq!(refused(&empty_key).0, "key_file");

        for bad in ["", "https://hoist.svc", "hoist svc", "hoist.svc:9091"] {
            let mut named = good.clone();
            named.server_name = Some(bad.into());
            assert_eq!(refused(&named).0, "server_name", "{bad:?}");
        }
        let mut by_ip = good.clone();
        by_ip.server_name = Some("10.0.0.7".into());
        assert!(by_ip.validate().is_ok(), "a certificate may name an IP");

        let mut zero = good;
        zero.reload_every = Duration::ZERO;
        assert_eq!(refused(&zero).0, "reload_every");
    }

    #[tokio::test]
    async fn client_setup_errors_name_the_file_and_never_show_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = ClientTlsSettings {
            ca_file: dir.path().join("absent.crt"),
            cert_file: None,
            key_file: None,
            server_name: None,
            reload_every: Duration::from_secs(10),
        };
        let error = ClientTls::new(&missing).unwrap_err().to_string();
        assert!(error.contains("absent.crt"), "{error}");

        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "not a certificate").unwrap();
        let error = ClientTls::new(&ClientTlsSettings {
            ca_file: ca.clone(),
            ..missing.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("ca.crt") && error.contains("no usable"),
            "{error}"
        );

        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(&ca, cert.pem()).unwrap();
        let cert_file = dir.path().join("tls.crt");
        std::fs::write(&cert_file, cert.pem()).unwrap();
        let key_file = dir.path().join("tls.key");
        // A key whose PEM body is damaged: refused, its text never shown.
        let damaged = key.serialize_pem().replace('M', "!");
        std::fs::write(&key_file, &damaged).unwrap();
        let error = ClientTls::new(&ClientTlsSettings {
            ca_file: ca,
            cert_file: Some(cert_file),
            key_file: Some(key_file),
            ..missing
        })
        .unwrap_err()
        .to_string();
        assert!(error.contains("tls.key"), "{error}");
        let body = damaged.lines().nth(1).unwrap();
        assert!(!error.contains(body), "{error}");
    }

    fn self_signed(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_certificate_is_swapped_once_both_files_are_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let files = KeyFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            reload_every: Duration::from_secs(10),
        };
        let (old_cert, old_key) = self_signed("old");
        std::fs::write(&files.cert, &old_cert).unwrap();
        std::fs::write(&files.key, &old_key).unwrap();
        let resolver = ReloadingCert::start(files.clone(), CancellationToken::new()).unwrap();
        let presented = |resolver: &ReloadingCert| {
            let key = ResolvesClientCert::resolve(resolver, &[], &[]).expect("a certificate");
            key.cert[0].clone()
        };
        let old = presented(&resolver);

        // Half-way through a rotation the new certificate sits beside the
        // old key: the pair does not match, the old one stays.
        let (new_cert, new_key) = self_signed("new");
        std::fs::write(&files.cert, &new_cert).unwrap();
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(presented(&resolver), old, "a mismatched pair is not used");

        std::fs::write(&files.key, &new_key).unwrap();
        tokio::time::sleep(Duration::from_secs(11)).await;
        let new = presented(&resolver);
        assert_ne!(new, old, "the rotated certificate is presented");
        let expected = CertificateDer::from_pem_slice(new_cert.as_bytes()).unwrap();
        assert_eq!(new, expected);
    }
}
