//! Whether `sasl: gssapi` can work in this process's environment. It needs
//! three things from outside hoist's binary: `kinit` (librdkafka runs it to
//! fill the ticket cache), Cyrus SASL's GSSAPI plugin (loaded at run time
//! from SASL's plugin directory) and a writable temporary directory (for
//! the Kerberos files, kerberos.rs). The FROM-scratch image of
//! scripts/image.sh has none of them, and deploy/Dockerfile's Debian image
//! has the first two; without one, every poll would fail with an opaque
//! SASL error. So a gssapi trigger is refused when it is declared, with
//! the reason and the fix.

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where Cyrus SASL looks for plugins unless `SASL_PATH` says otherwise
/// (Debian and Ubuntu, Fedora and RHEL, others).
const DEFAULT_PLUGIN_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/sasl2",
    "/usr/lib/aarch64-linux-gnu/sasl2",
    "/usr/lib64/sasl2",
    "/usr/lib/sasl2",
];

/// What to do about it, in every refusal.
const FIX: &str = "Kafka's `sasl: gssapi` needs an image with kinit (Debian's krb5-user), Cyrus SASL's GSSAPI plugin (libsasl2-modules-gssapi-mit) and a writable temporary directory: deploy/Dockerfile's image with an emptyDir at /tmp, not the FROM-scratch image of scripts/image.sh";

/// The parts of the environment GSSAPI depends on.
pub struct Environment {
    /// `PATH`, where `kinit` is looked up (librdkafka runs it through
    /// `/bin/sh -c`).
    pub path: Option<OsString>,
    /// `SASL_PATH`, where Cyrus SASL looks for plugins instead of its
    /// default directories.
    pub sasl_path: Option<OsString>,
    /// Where kerberos.rs writes its files.
    pub temp_dir: PathBuf,
}

impl Environment {
    /// This process's.
    pub fn current() -> Self {
        Self {
            path: std::env::var_os("PATH"),
            sasl_path: std::env::var_os("SASL_PATH"),
            temp_dir: std::env::temp_dir(),
        }
    }

    /// Why GSSAPI cannot work here, or `None` when it can.
    pub fn gssapi_unsupported(&self) -> Option<String> {
        let kinit = self.path.as_ref().is_some_and(|path| {
            std::env::split_paths(path).any(|dir| executable(&dir.join("kinit")))
        });
        if !kinit {
            return Some(format!("no `kinit` on PATH. {FIX}"));
        }
        let plugin_dirs: Vec<PathBuf> = match &self.sasl_path {
            Some(dirs) => std::env::split_paths(dirs).collect(),
            None => DEFAULT_PLUGIN_DIRS.iter().map(PathBuf::from).collect(),
        };
        if !plugin_dirs.iter().any(|dir| has_gssapi_plugin(dir)) {
            let dirs: Vec<String> = plugin_dirs.iter().map(|d| d.display().to_string()).collect();
            return Some(format!(
                "Cyrus SASL's GSSAPI plugin (libgssapiv2.so) is in none of {}. {FIX}",
                dirs.join(", ")
            ));
        }
        // kerberos.rs makes this directory for its files: made now, a
        // read-only root shows at once.
        let dir = self.temp_dir.join("hoist-kerberos");
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
            return Some(format!(
                "the temporary directory {} cannot be written ({e}). {FIX}",
                self.temp_dir.display()
            ));
        }
        None
    }
}

fn executable(file: &Path) -> bool {
    std::fs::metadata(file).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn has_gssapi_plugin(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|entry| entry.file_name().to_string_lossy().starts_with("libgssapiv2.so"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory with an executable `kinit`, one with the plugin, and a
    /// writable temporary directory: what deploy/Dockerfile's image has.
    struct Fake {
        _root: tempfile::TempDir,
        bin: PathBuf,
        plugins: PathBuf,
        temp: PathBuf,
    }

    fn fake() -> Fake {
        let root = tempfile::tempdir().unwrap();
        let (bin, plugins, temp) = (root.path().join("bin"), root.path().join("sasl2"), root.path().join("tmp"));
        for dir in [&bin, &plugins, &temp] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(bin.join("kinit"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join("kinit"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(plugins.join("libgssapiv2.so.2"), b"").unwrap();
        Fake {
            _root: root,
            bin,
            plugins,
            temp,
        }
    }

    fn environment(fake: &Fake) -> Environment {
        Environment {
            path: Some(fake.bin.clone().into_os_string()),
            sasl_path: Some(fake.plugins.clone().into_os_string()),
            temp_dir: fake.temp.clone(),
        }
    }

    #[test]
    fn gssapi_is_refused_naming_what_the_environment_lacks() {
        let complete = fake();
        assert_eq!(environment(&complete).gssapi_unsupported(), None);

        // The FROM-scratch image: no PATH worth the name.
        let mut scratch = environment(&complete);
        scratch.path = None;
        let reason = scratch.gssapi_unsupported().unwrap();
        assert!(reason.contains("no `kinit` on PATH"), "{reason}");
        assert!(reason.contains("deploy/Dockerfile"), "{reason}");

        // A kinit that cannot run is none.
        let not_executable = fake();
        std::fs::set_permissions(not_executable.bin.join("kinit"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let reason = environment(&not_executable).gssapi_unsupported().unwrap();
        assert!(reason.contains("kinit"), "{reason}");

        let no_plugin = fake();
        std::fs::remove_file(no_plugin.plugins.join("libgssapiv2.so.2")).unwrap();
        let reason = environment(&no_plugin).gssapi_unsupported().unwrap();
        assert!(reason.contains("libgssapiv2.so"), "{reason}");
        assert!(reason.contains(&no_plugin.plugins.display().to_string()), "{reason}");

        // A read-only root with no /tmp mounted: the directory is missing
        // under a file, which nobody can make a directory in.
        let read_only = fake();
        let blocked = read_only.temp.join("file");
        std::fs::write(&blocked, b"").unwrap();
        let mut env = environment(&read_only);
        env.temp_dir = blocked.clone();
        let reason = env.gssapi_unsupported().unwrap();
        assert!(reason.contains("cannot be written"), "{reason}");
        assert!(reason.contains(&blocked.display().to_string()), "{reason}");
    }
}
