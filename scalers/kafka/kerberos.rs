//! Files for `sasl: gssapi`. KEDA's Go client logs in to Kerberos itself
//! from `kerberosConfig` and a keytab or password (kedacore/keda
//! pkg/scalers/kafka_scaler.go, `getKafkaClientConfig` and `saveToFile`);
//! librdkafka goes through Cyrus SASL, which takes its ticket from a
//! ticket cache that `kinit` fills. So hoist writes the configuration and
//! the keytab (or the password) to private files and gives librdkafka a
//! `kinit` command that uses them; librdkafka runs it at start and again
//! before the ticket runs out.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::scalers::ObserveError;
use crate::secret::{Secret, fingerprint};

pub struct KerberosFiles {
    pub config: PathBuf,
    pub keytab: Option<PathBuf>,
    pub password: Option<PathBuf>,
}

/// Writes the files for one set of credentials (the same credentials
/// always land in the same directory, readable by hoist's user only).
pub fn files(kerberos_config: &str, keytab: &Secret, password: &Secret) -> Result<KerberosFiles, ObserveError> {
    let config = Secret::new(kerberos_config);
    let dir = std::env::temp_dir()
        .join("hoist-kerberos")
        .join(format!("{:x}", fingerprint(&[&config, keytab, password])));
    let fail = |what: &str, e: std::io::Error| ObserveError::Config(format!("cannot write the Kerberos {what} file: {e}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| fail("directory", e))?;
    let config_path = dir.join("krb5.conf");
    write_private(&config_path, kerberos_config.as_bytes()).map_err(|e| fail("configuration", e))?;
    let keytab_path = (!keytab.is_empty()).then(|| dir.join("keytab"));
    if let Some(path) = &keytab_path {
        write_private(path, keytab.expose().as_bytes()).map_err(|e| fail("keytab", e))?;
    }
    let password_path = (!password.is_empty()).then(|| dir.join("password"));
    if let Some(path) = &password_path {
        write_private(path, format!("{}\n", password.expose()).as_bytes()).map_err(|e| fail("password", e))?;
    }
    Ok(KerberosFiles {
        config: config_path,
        keytab: keytab_path,
        password: password_path,
    })
}

fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(content)
}

impl KerberosFiles {
    /// The shell command librdkafka runs (`sasl.kerberos.kinit.cmd`). The
    /// password is read from its file, never put on the command line.
    pub fn kinit_command(&self, principal: &str) -> Result<String, ObserveError> {
        // The principal comes from metadata and goes into a shell command.
        if !principal.chars().all(|c| c.is_ascii_alphanumeric() || "._-@/".contains(c)) {
            return Err(ObserveError::Config(
                "`username`: a Kerberos principal may hold letters, digits and . _ - @ / only".into(),
            ));
        }
        let env = format!("KRB5_CONFIG='{}'", self.config.display());
        Ok(match (&self.keytab, &self.password) {
            (Some(keytab), _) => format!("env {env} kinit -k -t '{}' '{principal}'", keytab.display()),
            (None, Some(password)) => format!("env {env} kinit '{principal}' < '{}'", password.display()),
            (None, None) => format!("env {env} kinit -R '{principal}'"),
        })
    }
}
