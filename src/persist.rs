//! Engine state on disk (`state_file`), so that a restart neither resets a
//! stabilization window nor cuts a cooldown short. Writes are atomic
//! (write a sibling file, then rename); a corrupt or foreign file is
//! reported and ignored, never a crash.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::engine::State;

/// The format's version; a file with another one is ignored.
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub version: u32,
    /// Engine state by `namespace/name`.
    pub scaled_objects: BTreeMap<String, State>,
    /// Routes ScaledObjects declared, in the order they were claimed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<crate::routing::RouteSpec>,
    /// Saved while the run was still settling (it had started without
    /// the routes of the run before): `routes` may lack some, so the next
    /// run settles too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub routes_settling: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a hoist state file: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("{path} has state format {found}; this hoist reads format {VERSION}")]
    Version { path: String, found: u32 },
}

pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reads a snapshot; `Ok(None)` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<Snapshot>, PersistError> {
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Read {
                path: shown,
                source,
            });
        }
    };
    #[derive(Deserialize)]
    struct Header {
        version: u32,
    }
    let header: Header = serde_json::from_str(&text).map_err(|e| PersistError::Corrupt {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    if header.version != VERSION {
        return Err(PersistError::Version {
            path: shown,
            found: header.version,
        });
    }
    let snapshot = serde_json::from_str(&text).map_err(|e| PersistError::Corrupt {
        path: shown,
        reason: e.to_string(),
    })?;
    Ok(Some(snapshot))
}

/// Writes a snapshot atomically: a reader sees the old file or the new one.
pub fn save(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(snapshot).map_err(std::io::Error::other)?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&text)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)
}

/// Saves `state_file` for a run: a failure is counted every time and
/// logged once until a save succeeds again (a read-only root or a full
/// disk must not log every 10 s).
pub struct StateSaver {
    path: std::path::PathBuf,
    failures: prometheus_client::metrics::counter::Counter,
    failing: std::sync::atomic::AtomicBool,
}

/// What a save came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    Saved,
    /// Failed; `logged`: the first of a run of failures, which is logged.
    Failed {
        logged: bool,
    },
}

impl StateSaver {
    pub fn new(
        path: std::path::PathBuf,
        failures: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        Self {
            path,
            failures,
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn save(&self, snapshot: &Snapshot) -> Saved {
        use std::sync::atomic::Ordering;
        match save(&self.path, snapshot) {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.path.display(), "engine state saved again");
                }
                Saved::Saved
            }
            Err(error) => {
                self.failures.inc();
                let logged = !self.failing.swap(true, Ordering::Relaxed);
                if logged {
                    tracing::warn!(path = %self.path.display(), %error, "cannot save engine state (logged once until a save succeeds; hoist_state_save_failures_total counts them)");
                }
                Saved::Failed { logged }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert!(
            load(&path).unwrap().is_none(),
            "no file yet is not an error"
        );

        let mut snapshot = Snapshot {
            version: VERSION,
            ..Default::default()
        };
        snapshot.scaled_objects.insert(
            key("orders", "worker"),
            State {
                current_replicas: 8,
                last_active: Some(1_700_000_000_000),
                ..Default::default()
            },
        );
        save(&path, &snapshot).unwrap();
        assert_eq!(load(&path).unwrap(), Some(snapshot));
        assert!(!dir.path().join("state.json.tmp").exists());

        std::fs::write(&path, "{ not json").unwrap();
        assert!(matches!(load(&path), Err(PersistError::Corrupt { .. })));
        std::fs::write(&path, r#"{"version": 99, "scaledObjects": {}}"#).unwrap();
        assert!(matches!(
            load(&path),
            Err(PersistError::Version { found: 99, .. })
        ));
    }

    #[test]
    fn a_failing_save_is_counted_every_time_and_logged_once_per_run_of_failures() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: every save fails.
        let path = dir.path().join("state.json");
        std::fs::create_dir(path.with_extension("json.tmp")).unwrap();
        let failures = prometheus_client::metrics::counter::Counter::default();
        let saver = StateSaver::new(path.clone(), failures.clone());
        let snapshot = Snapshot {
            version: VERSION,
            ..Default::default()
        };
        assert_eq!(saver.save(&snapshot), Saved::Failed { logged: true });
        assert_eq!(saver.save(&snapshot), Saved::Failed { logged: false });
        assert_eq!(failures.get(), 2);
        std::fs::remove_dir(path.with_extension("json.tmp")).unwrap();
        assert_eq!(saver.save(&snapshot), Saved::Saved);
        assert!(load(&path).unwrap().is_some());
        std::fs::create_dir(path.with_extension("json.tmp")).unwrap();
        assert_eq!(
            saver.save(&snapshot),
            Saved::Failed { logged: true },
            "a new run of failures is logged again"
        );
    }
}
