//! [`Driver::track`] as one transaction. Each stage is built only from
//! the one before:
//!
//! 1. [`Admitted`]: the trigger's own size within
//!    `limits.max_metadata_bytes`, and the settings it is checked against
//!    throughout (a reload meanwhile never mixes two);
//! 2. [`Lent`]: the credentials hoist holds for it, when it may have them;
//! 3. [`Parsed`]: its metadata parsed and its sources allowed. Bad
//!    metadata is refused here, naming the key, before any slot or cap
//!    refusal;
//! 4. [`Claimed`]: the route it declares, claimed; dropped unfinished, the
//!    claim is released;
//! 5. [`Plan`]: what the cluster says of it (its ScaledObject's
//!    `pollingInterval`), read before the lock.
//!
//! Then, under the driver's one lock, [`Plan::check`] decides, changing
//! nothing: the slot (see [`TriggerKey::slot`]), the trigger caps and
//! the metadata budget, counted where the insert happens, so calls racing
//! each other never end above them; and [`Ready::apply`], which cannot
//! fail, replaces the triggers it supersedes, joins the poller and the
//! engine and inserts it. The tasks it needs (a new poller's wake-ups, a
//! new engine, the engine's forwarder of its readings) start once the
//! lock is released ([`Startups`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use tokio::time::Instant;
use tracing::info;

use super::engines::EnginePlan;
use super::poller::Wakeups;
use super::scaling::{Counting, MetadataRules, Scaling};
use super::state::State;
use super::{Driver, DriverSettings, Inner, Schedule, TrackError, Tracked, TriggerKey};
use crate::auth_profiles::AuthProfiles;
use crate::callers::Caller;
use crate::cluster::{AuthenticationRef, ResolvedAuth};
use crate::engine::Rules;
use crate::metadata::{AuthParams, MetadataError};
use crate::routing::{Owner, Registry, RouteError};
use crate::trigger::{self, ScalingMode, TriggerConfig};

/// Stage 1: a trigger within `limits.max_metadata_bytes`.
pub(super) struct Admitted {
    key: TriggerKey,
    size: usize,
    settings: Arc<DriverSettings>,
}

impl Admitted {
    pub(super) fn new(driver: &Driver, key: TriggerKey) -> Result<Self, TrackError> {
        let settings = driver.inner.settings.load_full();
        let size = key.size();
        if size > settings.max_metadata_bytes {
            return Err(TrackError::MetadataTooLarge {
                size,
                limit: settings.max_metadata_bytes,
            });
        }
        Ok(Self {
            key,
            size,
            settings,
        })
    }

    /// The credentials of the caller's TriggerAuthentication, when hoist
    /// resolves them and may lend them to this caller.
    pub(super) fn lend(self, driver: &Driver, caller: &Caller) -> Result<Lent, TrackError> {
        let credentials = driver.credentials(&self.key, caller)?;
        lendable(&self.key, caller, credentials.is_some())?;
        Ok(Lent {
            admitted: self,
            credentials,
        })
    }
}

/// Stage 2: the credentials it may have.
pub(super) struct Lent {
    admitted: Admitted,
    credentials: Option<(AuthenticationRef, ResolvedAuth)>,
}

impl Lent {
    pub(super) fn parse(self, driver: &Driver) -> Result<Parsed, TrackError> {
        let Admitted {
            key,
            size,
            settings,
        } = self.admitted;
        let authentication = self
            .credentials
            .as_ref()
            .map(|(_, resolved)| resolved.params.clone());
        let config = parse_allowed(
            &key,
            &settings,
            &driver.inner.profiles.load(),
            authentication,
        )?;
        let credentials = self
            .credentials
            .map(|(reference, resolved)| (reference, resolved.version));
        Ok(Parsed {
            key,
            size,
            settings,
            config,
            credentials,
        })
    }
}

/// Stage 3: the trigger's config, its metadata valid.
pub(super) struct Parsed {
    key: TriggerKey,
    size: usize,
    settings: Arc<DriverSettings>,
    config: TriggerConfig,
    /// The TriggerAuthentication its credentials came from, and their
    /// version.
    credentials: Option<(AuthenticationRef, String)>,
}

impl Parsed {
    /// A trigger parsed by a test (its own source), within the settings
    /// in force.
    #[cfg(test)]
    pub(super) fn for_test(driver: &Driver, key: TriggerKey, config: TriggerConfig) -> Self {
        Self {
            size: key.size(),
            key,
            settings: driver.inner.settings.load_full(),
            config,
            credentials: None,
        }
    }

    /// Claims the route the trigger declares. A first look at the slot and
    /// the caps comes before (read-locked, decided again under the lock):
    /// a trigger they refuse (a forged `FromEnv` value, one past a cap)
    /// never moves a route, not even for a moment.
    pub(super) fn claim(self, driver: &Driver, caller: &Caller) -> Result<Claimed, TrackError> {
        let declared = match &self.config.trigger.route {
            None => None,
            Some(spec) => {
                if !caller.proven {
                    return Err(RouteError::Denied {
                        key: "upstream",
                        setting: "grpc.trust_callers",
                        reason: "hoist cannot check who declares this route: it has no cluster access (kubernetes.enabled), and gRPC callers are not proven by mTLS (grpc.tls.client_ca_file) nor trusted by the operator".to_string(),
                    }
                    .into());
                }
                let routes = driver.inner.routes.as_ref().ok_or_else(|| {
                    MetadataError::invalid(
                        "upstream",
                        "this hoist runs no interceptor to route through",
                    )
                })?;
                Some((routes, spec))
            }
        };
        verdict(&driver.read_state(), &self)?;
        let claim = match declared {
            None => None,
            Some((routes, spec)) => {
                routes.claim(self.key.identity(), spec)?;
                Some(RouteClaim {
                    routes: routes.clone(),
                    holder: self.key.identity.clone(),
                    name: spec.name.clone(),
                    kept: false,
                })
            }
        };
        Ok(Claimed {
            parsed: self,
            claim,
        })
    }
}

/// A route claimed for a trigger not tracked yet: released when dropped
/// unkept (a later stage refused the trigger).
struct RouteClaim {
    routes: Arc<Registry>,
    holder: Arc<[u8]>,
    name: String,
    kept: bool,
}

impl RouteClaim {
    /// The trigger is tracked: the claim stays with it.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for RouteClaim {
    fn drop(&mut self) {
        if !self.kept {
            self.routes.release(&self.holder, &self.name);
        }
    }
}

/// Stage 4: its route claimed.
pub(super) struct Claimed {
    parsed: Parsed,
    claim: Option<RouteClaim>,
}

impl Claimed {
    /// Reads what the cluster says of the trigger, before the lock.
    pub(super) fn plan(self, driver: &Driver) -> Plan {
        let parsed = self.parsed;
        let interval = driver.interval_for(&parsed.key, &parsed.config);
        let engine = match &parsed.config.scaling_mode {
            ScalingMode::Passthrough => None,
            ScalingMode::Engine(rules) => Some(EnginePlan {
                rules: MetadataRules {
                    rules: Rules::clone(rules),
                    written: parsed.config.written,
                },
                counting: match driver.cluster() {
                    Some(cluster) => Counting::Cluster(cluster),
                    None => Counting::OwnDecisions,
                },
                assume_applied: parsed.settings.assume_applied,
            }),
        };
        Plan {
            schedule: Schedule {
                interval,
                timeout: parsed.config.timeout,
            },
            id: driver
                .inner
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            parsed,
            claim: self.claim,
            engine,
        }
    }
}

/// Stage 5: everything the lock's critical section needs, made.
pub(super) struct Plan {
    parsed: Parsed,
    claim: Option<RouteClaim>,
    id: u64,
    schedule: Schedule,
    engine: Option<EnginePlan>,
}

/// What the check under the lock found.
pub(super) enum Checked {
    /// Another call tracked the same trigger meanwhile.
    Tracked(Arc<Tracked>),
    /// Boxed: a plan is a parsed config and more, the other an `Arc`.
    Ready(Box<Ready>),
}

impl Plan {
    /// Decides under the lock, changing nothing.
    pub(super) fn check(mut self, state: &State) -> Result<Checked, TrackError> {
        match verdict(state, &self.parsed)? {
            Verdict::Tracked(tracked) => {
                tracked.touch();
                if let Some(claim) = self.claim.take() {
                    claim.keep();
                }
                Ok(Checked::Tracked(tracked))
            }
            Verdict::Replaces(replaced) => Ok(Checked::Ready(Box::new(Ready {
                plan: self,
                replaced,
            }))),
        }
    }
}

/// A trigger checked under the lock, and the triggers it replaces.
pub(super) struct Ready {
    plan: Plan,
    replaced: Vec<TriggerKey>,
}

impl Ready {
    /// Carries the check out; it cannot fail, so the state never stays
    /// half-changed.
    pub(super) fn apply(
        self: Box<Self>,
        state: &mut State,
        inner: &Inner,
    ) -> (Arc<Tracked>, Startups) {
        let Plan {
            parsed,
            claim,
            id,
            schedule,
            engine,
        } = self.plan;
        let Parsed {
            key,
            size,
            mut config,
            credentials,
            ..
        } = parsed;
        for old in &self.replaced {
            info!(namespace = %key.namespace, scaled_object = %key.name, "trigger metadata changed (or the values of its FromEnv keys, no longer asked): replacing the old trigger");
            state.forget(old, inner);
        }
        let mut startups = Startups::default();
        let scaling = engine.map(|plan| {
            let (scaling, new) = state.engines.join(&key, plan, inner);
            if new {
                startups.engine = Some(scaling.clone());
            }
            scaling
        });
        let joined = state.pollers.join(
            config.trigger.scaler,
            &config.trigger.query,
            (id, schedule),
            &inner.scheduler,
            &inner.metrics,
        );
        startups.wakeups = joined.wakeups;
        config.trigger.query = joined.query;
        info!(
            namespace = %key.namespace,
            scaled_object = %key.name,
            scaler = config.trigger.scaler,
            source = %config.trigger.query.description,
            "tracking trigger"
        );
        let interval_ms = Arc::new(AtomicU64::new(schedule.interval.as_millis() as u64));
        if let Some(scaling) = &scaling {
            let trigger = &config.trigger;
            scaling.join(
                id,
                &trigger.metric_name,
                (trigger.target, trigger.activation_target),
                interval_ms.clone(),
                joined.readings.clone(),
            );
            startups.forward = Some((scaling.clone(), id));
        }
        let tracked = Arc::new(Tracked {
            key,
            config,
            scaling,
            id,
            readings: joined.readings,
            interval_ms,
            last_seen_ms: AtomicU64::new(0),
            open_streams: AtomicUsize::new(0),
            last_streamed_ms: AtomicU64::new(0),
            epoch: inner.epoch,
            credentials: credentials.map(Box::new),
        });
        tracked.touch();
        state.tracked_metadata += size;
        state
            .triggers
            .insert(tracked.key.identity.clone(), tracked.clone());
        inner
            .metrics
            .tracked_triggers
            .set(state.triggers.len() as i64);
        if let Some(claim) = claim {
            claim.keep();
        }
        (tracked, startups)
    }
}

/// The tasks a newly tracked trigger needs, started once the driver's
/// lock is released.
#[must_use]
#[derive(Default)]
pub(super) struct Startups {
    wakeups: Option<Wakeups>,
    engine: Option<Arc<Scaling>>,
    forward: Option<(Arc<Scaling>, u64)>,
}

impl Startups {
    pub(super) fn start(self) {
        if let Some(wakeups) = self.wakeups {
            wakeups.listen();
        }
        if let Some(engine) = self.engine {
            engine.run_in_background();
        }
        if let Some((engine, id)) = self.forward {
            engine.forward(id);
        }
    }
}

enum Verdict {
    Tracked(Arc<Tracked>),
    /// Tracked anew, in place of these.
    Replaces(Vec<TriggerKey>),
}

/// Whether `parsed` may be tracked given `state`: what it replaces (its
/// own trigger with other `FromEnv` values, no longer asked; in engine
/// mode, its ScaledObject's trigger of the same metric, which an edit
/// leaves behind), and whether it stays within the caps once those go.
fn verdict(state: &State, parsed: &Parsed) -> Result<Verdict, TrackError> {
    let Parsed {
        key,
        size,
        settings,
        config,
        ..
    } = parsed;
    if let Some(tracked) = state.triggers.get(key.identity()) {
        return Ok(Verdict::Tracked(tracked.clone()));
    }
    let mut replaced: Vec<Arc<Tracked>> = Vec::new();
    if let Some(holder) = state.triggers.holder_of_slot(key) {
        if let Some(refusal) = holder.held_against(key, Instant::now()) {
            return Err(refusal);
        }
        replaced.push(holder.clone());
    }
    if matches!(config.scaling_mode, ScalingMode::Engine(_)) {
        for old in state.triggers.of_object(&key.namespace, &key.name) {
            if old.scaling.is_some()
                && old.config.trigger.metric_name == config.trigger.metric_name
                && !replaced.iter().any(|r| Arc::ptr_eq(r, &old))
            {
                replaced.push(old);
            }
        }
    }
    let freed = replaced.len();
    let freed_bytes: usize = replaced.iter().map(|old| old.key.size()).sum();
    if state.triggers.len().saturating_sub(freed) >= settings.max_tracked_triggers {
        return Err(TrackError::TooManyTriggers {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            limit: settings.max_tracked_triggers,
        });
    }
    let in_namespace = state.triggers.in_namespace(&key.namespace);
    if in_namespace.saturating_sub(freed) >= settings.max_tracked_triggers_per_namespace {
        return Err(TrackError::TooManyInNamespace {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            limit: settings.max_tracked_triggers_per_namespace,
        });
    }
    let bytes = state.tracked_metadata.saturating_sub(freed_bytes);
    if bytes.saturating_add(*size) > settings.max_tracked_metadata_bytes {
        return Err(TrackError::MetadataBudget {
            limit: settings.max_tracked_metadata_bytes,
        });
    }
    Ok(Verdict::Replaces(
        replaced.iter().map(|old| old.key.clone()).collect(),
    ))
}

/// Whether hoist may lend the caller of `key` the credentials it holds
/// (an `authRef` profile, or the TriggerAuthentication of an
/// `authenticationRef`): only a proven caller may have them (without
/// cluster access a namespace is the caller's word), and only for values
/// hoist could check: a `*FromEnv` value is whatever the caller sends
/// (KEDA reads it from the scale target's environment), so a stranger
/// naming the right ScaledObject could point the credentials at its own
/// server through one.
fn lendable(
    key: &TriggerKey,
    caller: &Caller,
    trigger_authentication: bool,
) -> Result<(), TrackError> {
    let profile = key.metadata().any(|(name, _)| name == "authRef");
    if !profile && !trigger_authentication {
        return Ok(());
    }
    let source = if profile {
        "authRef"
    } else {
        "authenticationRef"
    };
    if !caller.proven {
        return Err(TrackError::NotLent {
            key: source.to_string(),
            setting: "grpc.trust_callers",
            reason: "hoist cannot check who asks (no cluster access, no gRPC mTLS), so it lends no credentials it holds; without a cluster, trust callers explicitly (single-tenant only)".to_string(),
        });
    }
    if caller.checked_in_cluster
        && let Some((from_env, _)) = key.metadata().find(|(name, _)| name.ends_with("FromEnv"))
    {
        return Err(TrackError::NotLent {
            key: from_env.to_string(),
            setting: source_setting(profile),
            reason: format!(
                "hoist cannot check a value KEDA reads from the scale target's environment, so it lends no credentials ({source}) to a trigger with one: write the value in the trigger's metadata, or put it in the credentials"
            ),
        });
    }
    Ok(())
}

fn source_setting(profile: bool) -> &'static str {
    if profile {
        "auth profiles"
    } else {
        "kubernetes.trigger_authentication"
    }
}

/// A trigger's metadata parsed with the settings and auth profiles in
/// force, and checked against `limits.allowed_sources`.
pub(super) fn parse_allowed(
    key: &TriggerKey,
    settings: &DriverSettings,
    profiles: &AuthProfiles,
    authentication: Option<AuthParams>,
) -> Result<TriggerConfig, TrackError> {
    let context = crate::scalers::Context {
        owner: Some(Owner {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        }),
        authentication,
        ..settings.context.clone()
    };
    let mut config = trigger::parse(&key.metadata_map(), profiles, settings.defaults, &context)?;
    if !settings.allowed_sources.is_empty()
        && let Some(endpoint) = config
            .trigger
            .query
            .endpoints
            .iter()
            .find(|e| !settings.allowed_sources.iter().any(|p| p.allows(e)))
    {
        return Err(TrackError::SourceNotAllowed {
            endpoint: endpoint.clone(),
        });
    }
    // Checked: a tracked trigger need not hold them (a reload parses again).
    config.trigger.query.endpoints = Vec::new();
    Ok(config)
}
