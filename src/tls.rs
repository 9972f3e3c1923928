//! TLS for hoist's listeners: certificates read from files and re-read
//! when they change (cert-manager rotation) without touching open
//! connections, and an optional client CA that makes mTLS required. Also
//! the client keys hoist presents to sources (encrypted PKCS#8 decrypted).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::secret::Secret;

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

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} holds no usable {what}")]
    Empty { path: String, what: &'static str },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn load_certified_key(settings: &TlsSettings) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(&settings.cert_file)?)
            .filter_map(Result::ok)
            .collect();
    if chain.is_empty() {
        return Err(TlsError::Empty {
            path: settings.cert_file.display().to_string(),
            what: "certificate",
        });
    }
    let key =
        PrivateKeyDer::from_pem_slice(&read(&settings.key_file)?).map_err(|_| TlsError::Empty {
            path: settings.key_file.display().to_string(),
            what: "private key",
        })?;
    let provider = rustls::crypto::ring::default_provider();
    Ok(CertifiedKey::from_der(chain, key, &provider)?)
}

/// Serves the current certificate; swapped in place on rotation, so new
/// handshakes get the new one and open connections are left alone.
#[derive(Debug)]
struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn modified(settings: &TlsSettings) -> Option<(SystemTime, SystemTime)> {
    let time = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    Some((time(&settings.cert_file)?, time(&settings.key_file)?))
}

/// Builds the acceptor and starts watching the files.
pub fn acceptor(
    settings: &TlsSettings,
    cancel: CancellationToken,
) -> Result<TlsAcceptor, TlsError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let resolver = Arc::new(ReloadingCert {
        current: RwLock::new(Arc::new(load_certified_key(settings)?)),
    });
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match &settings.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in CertificateDer::pem_slice_iter(&read(path)?).filter_map(Result::ok) {
                roots
                    .add(certificate)
                    .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(TlsError::Empty {
                    path: path.display().to_string(),
                    what: "CA certificate",
                });
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio::spawn(watch(settings.clone(), resolver, cancel));
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn watch(settings: TlsSettings, resolver: Arc<ReloadingCert>, cancel: CancellationToken) {
    let mut seen = modified(&settings);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(settings.reload_every) => {}
        }
        let now = modified(&settings);
        if now == seen {
            continue;
        }
        match load_certified_key(&settings) {
            Ok(key) => {
                *resolver.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
                seen = now;
                info!(cert = %settings.cert_file.display(), "TLS certificate reloaded");
            }
            // A half-written rotation: keep serving the old one and retry.
            Err(error) => warn!(%error, "TLS certificate changed but cannot be loaded yet"),
        }
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
