//! Reloading hoist's configuration while it runs: on SIGHUP, and when the
//! config file's content changes. A new config is applied whole or not at
//! all; the settings a running process cannot take up (its listeners, its
//! log, its state file...) keep their value and are named, to wait for a
//! restart.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::auth_profiles::AuthProfiles;
use crate::config::{ConfigError, Overrides, Settings};
use crate::driver::Driver;
use crate::interceptor::table::{RouteControl, RouteDefaults, config_routes};
use crate::interceptor::traffic::Traffic;
use crate::interceptor::{ClientLimits, InterceptorError};
use crate::routing::RouteError;

/// How often the config file is read again.
///
/// Its content is compared, rather than watched with inotify: a
/// Kubernetes ConfigMap volume changes by renaming a new `..data` symlink
/// over the old one, so the file hoist opens (`config.toml ->
/// ..data/config.toml`) is never written, and a watch on it sees nothing
/// (or a deleted inode). Reading a small file every 2 s through the
/// symlinks sees every kind of update, on every filesystem.
const POLL_EVERY: Duration = Duration::from_secs(2);

/// A changed file is read once more after this pause and taken only when
/// both reads agree, so a file being written in place (an editor, `cp`)
/// is not loaded half-written.
const SETTLE: Duration = Duration::from_millis(200);

/// Settings a running process cannot take up, by key: listeners and their
/// TLS and keepalives (`grpc`, `admin`, `interceptor.http_listen`), the
/// log, the state file, shutdown timing, the Kubernetes client, which
/// parts run (`interceptor.enabled`, `endpoints`, `scaler`) and the
/// clients built at start (`interceptor.read_timeout`, `interceptor.tls`:
/// the scaler's reads of interceptors and an interceptor's reads of the
/// scaler keep the client they started with). A reload keeps
/// their value in force and names those that changed.
pub const RESTART_ONLY: &[&str] = &[
    "grpc",
    "admin",
    "log",
    "state_file",
    "shutdown_grace",
    "shutdown",
    "kubernetes",
    "interceptor.http_listen",
    "interceptor.enabled",
    "interceptor.endpoints",
    "interceptor.scaler",
    "interceptor.read_timeout",
    "interceptor.tls",
];

/// Why a new config was refused; the one in force stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The config does not load (the whole cause chain, without the
    /// quoted lines of the file: they may hold a credential).
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error("interceptor.tcp_routes: {0}")]
    Interceptor(#[from] InterceptorError),
    #[error("cannot keep the settings that need a restart: {0}")]
    Carry(#[from] serde_json::Error),
}

impl From<ConfigError> for ReloadError {
    fn from(error: ConfigError) -> Self {
        ReloadError::Config(describe(&error))
    }
}

/// What made a reload happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// SIGHUP.
    Signal,
    /// The config file's content changed.
    File,
}

impl Cause {
    fn name(self) -> &'static str {
        match self {
            Cause::Signal => "signal",
            Cause::File => "file",
        }
    }
}

/// The `config` section of `/status`. Holds no setting's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// The config file watched; none when settings come from the
    /// environment only.
    pub file: Option<String>,
    pub last_reload: Option<LastReload>,
    /// Reloads applied and refused since start.
    pub applied: u64,
    pub refused: u64,
    /// Keys whose new value waits for a restart (see [`RESTART_ONLY`]).
    pub restart_needed: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastReload {
    /// RFC 3339, UTC.
    pub at: String,
    /// `applied` or `refused`.
    pub result: String,
    /// `signal` (SIGHUP) or `file` (its content changed).
    pub cause: String,
    /// Why it was refused.
    pub error: Option<String>,
}

/// Where the settings come from, kept to read them again.
pub struct ConfigSource {
    file: Option<PathBuf>,
    env: Vec<(String, String)>,
    overrides: Overrides,
    /// The file's content as last loaded (none: unreadable).
    seen: Mutex<Option<Vec<u8>>>,
    /// A new content read at the end of a settle pause that had not
    /// settled: if the next poll reads it again, it stood for a whole poll
    /// interval and is complete. A file rewritten on the poll's own cadence
    /// never agrees with itself 200 ms later, and would never be taken.
    unsettled: Mutex<Option<Option<Vec<u8>>>>,
}

impl ConfigSource {
    /// Reads the file's content now, before the first load: a change made
    /// after this is seen as one.
    pub fn new(
        file: Option<PathBuf>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: Overrides,
    ) -> Self {
        let seen = Mutex::new(file.as_deref().and_then(|file| std::fs::read(file).ok()));
        Self {
            file,
            env: env.into_iter().collect(),
            overrides,
            seen,
            unsettled: Mutex::new(None),
        }
    }

    pub fn load(&self) -> Result<Settings, ConfigError> {
        Settings::load(self.file.as_deref(), self.env.clone(), &self.overrides)
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Notes the content a load is about to read.
    fn remember(&self) {
        let content = self
            .file
            .as_deref()
            .and_then(|file| std::fs::read(file).ok());
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = content;
    }

    /// Whether the file's content differs from the last loaded, and has
    /// settled: the same after the settle pause, or the same as the
    /// unsettled content the last poll ended on.
    async fn changed(&self) -> bool {
        let Some(file) = &self.file else {
            return false;
        };
        let now = tokio::fs::read(file).await.ok();
        if now == *self.seen.lock().unwrap_or_else(|e| e.into_inner()) {
            *self.unsettled.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return false;
        }
        let unsettled = self
            .unsettled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if unsettled.as_ref() == Some(&now) {
            return true;
        }
        tokio::time::sleep(SETTLE).await;
        let again = tokio::fs::read(file).await.ok();
        if again == now {
            return true;
        }
        *self.unsettled.lock().unwrap_or_else(|e| e.into_inner()) = Some(again);
        false
    }
}

/// The parts of a running hoist a reload changes.
pub struct Targets {
    /// This process's interceptor.
    pub interceptor: Option<RouteControl>,
    /// The scaler (`hoist serve`).
    pub driver: Option<Driver>,
    /// Where the scaler reads the interceptor, as set up at start.
    pub traffic: Option<Traffic>,
}

impl Targets {
    /// Everything that can refuse comes before anything changes: the
    /// route registry's check (a config route taking a declared route's
    /// claim), then the interceptor's routes, which are all or nothing
    /// (new TCP listeners are bound before any route moves); both under
    /// the registry's lock, so no claim slips in between. What follows
    /// cannot refuse: nothing is ever rolled back.
    fn apply(&self, settings: &Settings) -> Result<(), ReloadError> {
        let interceptor = &settings.interceptor;
        let routes = || match &self.interceptor {
            Some(control) => control
                .apply_config(config_routes(interceptor), RouteDefaults::from(interceptor))
                .map_err(ReloadError::from),
            None => Ok(()),
        };
        match &self.driver {
            Some(driver) => driver.reconfigure(
                crate::driver::DriverSettings::from_config(settings, self.traffic.clone()),
                AuthProfiles::from_settings(settings),
                routes,
            )?,
            None => routes()?,
        }
        if let Some(control) = &self.interceptor {
            control.set_client_limits(ClientLimits::from(interceptor));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Re-reads the config and applies it; one reload at a time.
pub struct Reloader {
    source: ConfigSource,
    targets: Targets,
    /// `limits.max_metadata_bytes` at start, which sized the gRPC decoder
    /// (`hoist serve`, whose targets include the driver).
    started_max_metadata_bytes: usize,
    state: Mutex<State>,
    reloads: Family<ResultLabels, Counter>,
    last_success: Gauge,
}

struct State {
    /// The settings in force; restart-only ones as at start.
    running: Settings,
    status: ConfigStatus,
}

impl Reloader {
    pub fn new(source: ConfigSource, running: Settings, targets: Targets) -> Self {
        let reloads = Family::<ResultLabels, Counter>::default();
        // Both series exist from the start, at zero.
        for result in ["applied", "refused"] {
            let _ = reloads.get_or_create(&ResultLabels { result });
        }
        let last_success = Gauge::default();
        last_success.set(1);
        let status = ConfigStatus {
            file: source.file().map(|file| file.display().to_string()),
            ..ConfigStatus::default()
        };
        Self {
            source,
            targets,
            started_max_metadata_bytes: running.limits.max_metadata_bytes,
            state: Mutex::new(State { running, status }),
            reloads,
            last_success,
        }
    }

    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "hoist_config_reloads",
            "Reloads of hoist's config (SIGHUP or a changed file), by result: applied, or refused (the config in force stays)",
            self.reloads.clone(),
        );
        registry.register(
            "hoist_config_last_reload_success",
            "1 when the latest config reload was applied (or none was tried), 0 when it was refused",
            self.last_success.clone(),
        );
    }

    pub fn status(&self) -> ConfigStatus {
        self.lock().status.clone()
    }

    /// Reads the config again and applies it whole, or refuses it whole.
    pub fn reload(&self, cause: Cause) -> Result<(), ReloadError> {
        let mut state = self.lock();
        self.source.remember();
        let outcome = self.try_reload(&state.running);
        let at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let cause_name = cause.name();
        let (result, error) = match outcome {
            Ok((settings, restart_needed)) => {
                if restart_needed.is_empty() {
                    info!(cause = cause_name, "configuration reloaded");
                } else {
                    warn!(
                        cause = cause_name,
                        restart_needed = %restart_needed.join(", "),
                        "configuration reloaded; these settings changed and take a restart to apply"
                    );
                }
                let profiles = AuthProfiles::from_settings(&settings);
                for problem in profiles.problems() {
                    warn!(%problem, "auth profile cannot be resolved yet");
                }
                profiles.warn_open_to_all();
                state.running = settings;
                state.status.applied += 1;
                state.status.restart_needed = restart_needed;
                self.last_success.set(1);
                ("applied", Ok(()))
            }
            Err(error) => {
                warn!(cause = cause_name, %error, "configuration reload refused: the configuration in force stays");
                state.status.refused += 1;
                self.last_success.set(0);
                ("refused", Err(error))
            }
        };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
        state.status.last_reload = Some(LastReload {
            at,
            result: result.to_string(),
            cause: cause_name.to_string(),
            error: error.as_ref().err().map(ToString::to_string),
        });
        error
    }

    fn try_reload(&self, running: &Settings) -> Result<(Settings, Vec<String>), ReloadError> {
        let loaded = self.source.load()?;
        let mut restart_needed = restart_needed(running, &loaded)?;
        // The check of each trigger takes the new value at once; the gRPC
        // decoder, sized at start, still refuses messages past the old one.
        if self.targets.driver.is_some()
            && loaded.limits.max_metadata_bytes > self.started_max_metadata_bytes
        {
            restart_needed.push("limits.max_metadata_bytes".to_string());
        }
        let settings = keep_restart_only(running, loaded)?;
        self.targets.apply(&settings)?;
        Ok((settings, restart_needed))
    }

    /// Reloads on SIGHUP, and when the config file's content changes, until
    /// `cancel`. The signal is taken over now, before this returns.
    pub fn watch(self: &Arc<Self>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let mut hangups = Hangups::new();
        let reloader = self.clone();
        tokio::spawn(async move {
            let mut poll = tokio::time::interval(POLL_EVERY);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let watching = reloader.source.file().is_some();
            loop {
                let cause = tokio::select! {
                    _ = cancel.cancelled() => return,
                    () = hangups.next() => Cause::Signal,
                    _ = poll.tick(), if watching => {
                        if !reloader.source.changed().await {
                            continue;
                        }
                        Cause::File
                    }
                };
                info!(cause = cause.name(), "reloading the configuration");
                // The outcome is logged, counted and shown in /status.
                let _ = reloader.reload(cause);
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// SIGHUP, where there is one.
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn new() -> Self {
        #[cfg(unix)]
        let signal = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(error) => {
                warn!(%error, "cannot listen for SIGHUP: the config reloads only when its file changes");
                None
            }
        };
        Self {
            #[cfg(unix)]
            signal,
        }
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal
            && signal.recv().await.is_some()
        {
            return;
        }
        std::future::pending::<()>().await
    }
}

/// The restart-only keys whose value differs, each leaf named
/// (`grpc.listen`, not `grpc`).
pub fn restart_needed(
    running: &Settings,
    loaded: &Settings,
) -> Result<Vec<String>, serde_json::Error> {
    let (old, new) = (
        serde_json::to_value(running)?,
        serde_json::to_value(loaded)?,
    );
    let mut keys = Vec::new();
    for key in RESTART_ONLY {
        differences(key, at(&old, key), at(&new, key), &mut keys);
    }
    Ok(keys)
}

/// `loaded`, with every restart-only key as `running` has it.
pub fn keep_restart_only(
    running: &Settings,
    loaded: Settings,
) -> Result<Settings, serde_json::Error> {
    let old = serde_json::to_value(running)?;
    let mut new = serde_json::to_value(loaded)?;
    for key in RESTART_ONLY {
        let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
        let kept = at(&old, parent)
            .and_then(|section| section.get(last))
            .cloned();
        let Some(Value::Object(section)) = at_mut(&mut new, parent) else {
            continue;
        };
        match kept {
            Some(value) => section.insert(last.to_string(), value),
            None => section.remove(last),
        };
    }
    serde_json::from_value(new)
}

fn pointer(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("/{}", key.replace('.', "/"))
    }
}

fn at<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.pointer(&pointer(key))
}

fn at_mut<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    value.pointer_mut(&pointer(key))
}

fn differences(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<String>) {
    match (old, new) {
        (Some(Value::Object(old)), Some(Value::Object(new))) => {
            let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for key in keys {
                differences(&format!("{path}.{key}"), old.get(key), new.get(key), out);
            }
        }
        (old, new) if old != new => out.push(path.to_string()),
        _ => {}
    }
}

/// An error and its causes on one line, without the lines of the file a
/// TOML parse error quotes (`4 | password = "..."`): they may hold a
/// credential, and this text goes to the log and to `/status`.
fn describe(error: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut next = Some(error);
    while let Some(error) = next {
        let text = error.to_string();
        let kept: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !quotes_the_file(line))
            .collect();
        parts.push(kept.join(" "));
        next = error.source();
    }
    parts.join(": ")
}

/// A line of a parse error's excerpt: `  |`, `4 | text`, `  |   ^`.
fn quotes_the_file(line: &str) -> bool {
    line.trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start()
        .starts_with('|')
}

#[cfg(test)]
mod tests;
