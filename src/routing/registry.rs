//! The scaler's record of the routes ScaledObjects declare: who holds
//! which claim (a host and path prefix, a TCP port), checked against what
//! hoist's config allows, and published as a versioned table to the
//! interceptors (the in-process one at once; split replicas long-poll it).
//!
//! A route lives while a tracked trigger declares it. The first claim wins
//! and, saved in the state file, keeps winning across restarts; the same
//! ScaledObject declaring its route anew (an edit) replaces it in one step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Claim, Protocol, RouteSpec};
use crate::config::InterceptorSettings;

/// Why a declared route is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("`{key}`: {reason} ({setting})")]
    Denied {
        key: &'static str,
        setting: &'static str,
        reason: String,
    },
    #[error("`{key}`: {claim} is already routed by {holder}; the first claim keeps it")]
    Taken {
        key: &'static str,
        claim: String,
        holder: String,
    },
    #[error("`{key}`: the interceptor cannot serve this route: {reason}")]
    Unservable { key: &'static str, reason: String },
    /// The route is not in the table made from the cluster's
    /// ScaledObjects (yet): the watch is behind the caller.
    #[error(
        "`upstream`: route {name} is not in the route table yet (hoist's ScaledObject watch is behind); ask again"
    )]
    Pending { name: String },
}

/// What the scaler serves to interceptors: every declared route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteTable {
    /// Changes at every start of the scaler, so a follower knows a
    /// version number from another run means nothing.
    pub instance: String,
    pub version: u64,
    pub routes: Vec<RouteSpec>,
    /// This run started without the whole table of the run before (no
    /// state file, none saved yet, or one saved while that run was itself
    /// settling) and has not yet waited `polling.idle_after` for triggers
    /// to declare theirs again: the table may lack routes that still exist. A follower keeps what an earlier
    /// run gave it meanwhile, so a restart of the scaler does not take
    /// routes away from running interceptors.
    #[serde(default)]
    pub settling: bool,
}

/// The registry as `/status` shows it.
#[derive(Debug, Clone)]
pub struct RegistryReport {
    pub version: u64,
    pub settling: bool,
    /// In claim order.
    pub routes: Vec<DeclaredReport>,
}

#[derive(Debug, Clone)]
pub struct DeclaredReport {
    pub spec: RouteSpec,
    /// How many tracked triggers declare it.
    pub triggers: usize,
    /// Restored from the state file and not declared again for this long.
    pub unclaimed_for: Option<Duration>,
}

/// What declared routes may be, from hoist's config; a reload replaces it.
#[derive(Debug, Clone)]
pub struct RouteRules {
    pub interceptor: InterceptorSettings,
    /// Routes of hoist's config: they hold their claims first.
    pub config_routes: Vec<RouteSpec>,
}

impl RouteRules {
    /// Whether a declared route may be what it is. Errors name the
    /// metadata key and the setting that refuses it.
    pub fn allows(&self, spec: &RouteSpec) -> Result<(), RouteError> {
        let Some(owner) = &spec.owner else {
            return Ok(());
        };
        let namespace = owner.namespace.as_str();
        if !self.interceptor.declared_routes {
            return Err(RouteError::Denied {
                key: "upstream",
                setting: "interceptor.declared_routes",
                reason: "this hoist takes no routes from ScaledObjects".to_string(),
            });
        }
        let upstreams = self.interceptor.upstream_patterns_for(namespace);
        if !upstreams.iter().any(|p| p.allows(&spec.upstream)) {
            let which = if self.interceptor.allowed_upstreams.is_empty() {
                format!("only Services of namespace `{namespace}` by default")
            } else {
                format!("not among the upstreams namespace `{namespace}` may use")
            };
            return Err(RouteError::Denied {
                key: "upstream",
                setting: "interceptor.allowed_upstreams",
                reason: format!("`{}` is {which}", spec.upstream),
            });
        }
        if spec.protocol == Protocol::Http {
            let patterns = self.interceptor.host_patterns_for(namespace);
            if let Some(host) = spec
                .hosts
                .iter()
                .find(|host| !patterns.iter().any(|p| p.allows(host)))
            {
                let reason = if patterns.is_empty() {
                    format!(
                        "namespace `{namespace}` may route no host: no pattern is given for it (nor for `*`)"
                    )
                } else {
                    format!("namespace `{namespace}` may not route host `{host}`")
                };
                return Err(RouteError::Denied {
                    key: "host",
                    setting: "interceptor.allowed_hosts",
                    reason,
                });
            }
        }
        if let Some(listen) = spec.listen {
            let port = listen.port();
            let allowed = match self.interceptor.listen_ports_for(namespace) {
                Some(ranges) => ranges
                    .iter()
                    .any(|(low, high)| (*low..=*high).contains(&port)),
                None => port >= 1024,
            };
            if !allowed {
                return Err(RouteError::Denied {
                    key: "listenPort",
                    setting: "interceptor.allowed_listen_ports",
                    reason: format!("namespace `{namespace}` may not listen on port {port}"),
                });
            }
        }
        Ok(())
    }
}

/// Serves the declared routes to the interceptor of this process; returns
/// the routes it could not serve, with the reason.
pub type LocalApply = Box<dyn Fn(&[RouteSpec]) -> BTreeMap<String, String> + Send + Sync>;

pub struct Registry {
    instance: String,
    state: Mutex<State>,
    table: watch::Sender<Arc<RouteTable>>,
    local: Mutex<Option<LocalApply>>,
    /// Notified when the routes change: state worth saving.
    changed: Arc<Notify>,
    /// Counts the cluster's decisions ([`Registry::set_declared`]), even
    /// those that change no route (a refusal): for callers waiting on one.
    decided: watch::Sender<u64>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

struct State {
    rules: RouteRules,
    /// Ports hoist listens on itself, with the setting that says so: its
    /// listeners are bound once, so a reload leaves these alone.
    reserved: Vec<(u16, String)>,
    declared: BTreeMap<String, Declared>,
    version: u64,
    /// Gives each new route its place in claim order.
    next_order: u64,
    /// Set from the start until saved routes are restored or
    /// `polling.idle_after` has passed (see [`RouteTable::settling`]), or
    /// until the cluster's ScaledObjects were first read.
    settling_since: Option<Instant>,
    /// Declared routes come from the cluster's ScaledObjects
    /// ([`Registry::set_declared`]), not from callers' claims.
    from_cluster: bool,
    /// From the cluster: every route its ScaledObjects declare, oldest
    /// ScaledObject first (kept to decide again on a reload).
    candidates: Vec<RouteSpec>,
    /// From the cluster: why a candidate is not in the table, by name.
    refused: BTreeMap<String, RouteError>,
}

struct Declared {
    spec: RouteSpec,
    order: u64,
    /// The tracked triggers (by identity) that declare this route.
    holders: BTreeSet<Box<[u8]>>,
    /// Restored from the state file and not declared again since then.
    unclaimed_since: Option<Instant>,
}

impl Registry {
    pub fn new(rules: RouteRules, changed: Arc<Notify>) -> Self {
        let instance = format!("{:016x}", rand_seed());
        Self {
            table: watch::Sender::new(Arc::new(RouteTable {
                instance: instance.clone(),
                version: 0,
                routes: Vec::new(),
                settling: true,
            })),
            instance,
            state: Mutex::new(State {
                rules,
                reserved: Vec::new(),
                declared: BTreeMap::new(),
                version: 0,
                next_order: 0,
                settling_since: Some(Instant::now()),
                from_cluster: false,
                candidates: Vec::new(),
                refused: BTreeMap::new(),
            }),
            local: Mutex::new(None),
            changed,
            decided: watch::Sender::new(0),
        }
    }

    /// The ports hoist's own listeners are bound to (`setting`: the key
    /// that names each), which no route may take. Set once at start.
    pub fn reserve(&self, ports: Vec<(u16, String)>) {
        self.lock().reserved = ports;
    }

    /// Hands every change to this process's interceptor, starting now.
    pub fn serve_locally(&self, apply: LocalApply) {
        let state = self.lock();
        apply(&routes_in_order(&state.declared));
        *self.local.lock().unwrap_or_else(|e| e.into_inner()) = Some(apply);
    }

    /// The table as interceptors see it, and its changes.
    pub fn table(&self) -> watch::Receiver<Arc<RouteTable>> {
        self.table.subscribe()
    }

    /// Every declared route with who declares it, for `/status`.
    pub fn report(&self) -> RegistryReport {
        let state = self.lock();
        RegistryReport {
            version: state.version,
            settling: state.settling_since.is_some(),
            routes: declared_in_order(&state.declared)
                .into_iter()
                .map(|declared| DeclaredReport {
                    spec: declared.spec.clone(),
                    triggers: declared.holders.len(),
                    unclaimed_for: declared.unclaimed_since.map(|since| since.elapsed()),
                })
                .collect(),
        }
    }

    /// Every declared route, in claim order, and whether this run is still
    /// settling (for the state file).
    pub fn snapshot(&self) -> (Vec<RouteSpec>, bool) {
        let state = self.lock();
        (
            routes_in_order(&state.declared),
            state.settling_since.is_some(),
        )
    }

    /// The route `holder` (a trigger's identity) declares. Refused when
    /// the rules forbid it, another route holds one of its claims, or the
    /// in-process interceptor cannot serve it.
    pub fn claim(&self, holder: &[u8], spec: &RouteSpec) -> Result<(), RouteError> {
        let mut state = self.lock();
        if state.from_cluster {
            // The cluster decided; a caller only learns the answer.
            return match state.declared.get(&spec.name) {
                Some(declared) if declared.spec == *spec => Ok(()),
                _ => Err(state.refused.get(&spec.name).cloned().unwrap_or_else(|| {
                    RouteError::Pending {
                        name: spec.name.clone(),
                    }
                })),
            };
        }
        // The usual case, every call of a tracked trigger: nothing changes.
        // (A reload re-checks every route against the new rules.)
        if let Some(existing) = state.declared.get_mut(&spec.name)
            && existing.spec == *spec
        {
            existing.unclaimed_since = None;
            if !existing.holders.contains(holder) {
                existing.holders.insert(holder.into());
            }
            return Ok(());
        }
        state.rules.allows(spec)?;
        check_quota(
            &state.rules,
            spec,
            state.declared.values().map(|declared| &declared.spec),
        )?;
        check_claims(&state, spec)?;
        let spec = spec.clone();
        let previous = state.declared.remove(&spec.name);
        let order = previous.as_ref().map_or_else(
            || {
                state.next_order += 1;
                state.next_order
            },
            |previous| previous.order,
        );
        let mut holders = previous
            .as_ref()
            .map(|previous| previous.holders.clone())
            .unwrap_or_default();
        holders.insert(holder.into());
        let name = spec.name.clone();
        let changed = previous.is_some();
        state.declared.insert(
            name.clone(),
            Declared {
                spec: spec.clone(),
                order,
                holders,
                unclaimed_since: None,
            },
        );
        let skipped = self.publish(&mut state);
        if let Some(reason) = skipped.get(&name) {
            // Put back what was there: the refusal changes nothing.
            state.declared.remove(&name);
            if let Some(previous) = previous {
                state.declared.insert(name.clone(), previous);
            }
            self.publish(&mut state);
            return Err(RouteError::Unservable {
                key: claim_key(spec.protocol),
                reason: reason.clone(),
            });
        }
        let owner = spec.origin();
        if changed {
            info!(route = %name, %owner, upstream = %spec.upstream, "declared route changed");
        } else {
            info!(route = %name, %owner, upstream = %spec.upstream, "route declared");
        }
        Ok(())
    }

    /// `holder` no longer declares the route `name` (its trigger was
    /// dropped); the route goes with its last holder.
    pub fn release(&self, holder: &[u8], name: &str) {
        let mut state = self.lock();
        if state.from_cluster {
            return;
        }
        let Some(declared) = state.declared.get_mut(name) else {
            return;
        };
        declared.holders.remove(holder);
        if declared.holders.is_empty() {
            state.declared.remove(name);
            info!(route = %name, "declared route removed: no trigger declares it any more");
            self.publish(&mut state);
        }
    }

    /// Routes saved by an earlier run: served at once, and kept for
    /// `idle_after` for their triggers to declare them again. One that
    /// hoist's config no longer allows, or that clashes with a config
    /// route, is dropped with a warning. `whole`: that run had settled, so
    /// these are all its routes and this run does not settle.
    pub fn restore(&self, routes: Vec<RouteSpec>, whole: bool) {
        let mut state = self.lock();
        let now = Instant::now();
        if whole {
            state.settling_since = None;
        }
        for spec in routes {
            if let Err(error) = state
                .rules
                .allows(&spec)
                .and_then(|()| check_claims(&state, &spec))
            {
                warn!(route = %spec.name, %error, "not restoring a saved route");
                continue;
            }
            state.next_order += 1;
            let order = state.next_order;
            state.declared.insert(
                spec.name.clone(),
                Declared {
                    spec,
                    order,
                    holders: BTreeSet::new(),
                    unclaimed_since: Some(now),
                },
            );
        }
        let skipped = self.publish(&mut state);
        for (name, reason) in skipped {
            warn!(route = %name, %reason, "a saved route cannot be served");
        }
    }

    /// Drops restored routes no trigger declared within `idle_after`, and
    /// ends a start's settling after as long: every trigger still in use
    /// has been asked about by then.
    pub fn drop_unclaimed(&self, idle_after: Duration) {
        let mut state = self.lock();
        if state.from_cluster {
            // Routes live as long as their ScaledObjects: a saved route
            // waits for the cluster's answer, however long the API is away.
            return;
        }
        let settled = state
            .settling_since
            .is_some_and(|since| since.elapsed() >= idle_after);
        if settled {
            state.settling_since = None;
            info!("route table settled: followers drop routes no trigger declared since the start");
        }
        let before = state.declared.len();
        state.declared.retain(|name, declared| {
            let keep = declared
                .unclaimed_since
                .is_none_or(|since| since.elapsed() < idle_after);
            if !keep {
                info!(route = %name, "saved route dropped: no trigger declared it again");
            }
            keep
        });
        if settled || state.declared.len() != before {
            self.publish(&mut state);
        }
    }

    /// New rules and config routes (a reload). A config route is the
    /// operator's: it takes its claims from any declared route, which is
    /// released (and its ScaledObject's calls told why). Declared routes
    /// the new rules forbid are removed.
    ///
    /// `first` (the interceptor's own change, which may refuse) runs
    /// before the change, under the registry's lock: no claim slips in
    /// between, and when `first` refuses nothing here has changed.
    pub fn reconfigure<E: From<RouteError>>(
        &self,
        rules: RouteRules,
        first: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut state = self.lock();
        first()?;
        state.rules = rules;
        if state.from_cluster {
            self.assign(&mut state);
            return Ok(());
        }
        let rules = state.rules.clone();
        let before = state.declared.len();
        state.declared.retain(|name, declared| {
            let refused = rules.allows(&declared.spec).err().or_else(|| {
                config_holder(&rules.config_routes, &declared.spec).map(|(claim, holder)| {
                    RouteError::Taken {
                        key: claim_key(declared.spec.protocol),
                        claim,
                        holder,
                    }
                })
            });
            match refused {
                None => true,
                Some(error) => {
                    warn!(route = %name, owner = %declared.spec.origin(), %error, "declared route released: the reloaded config takes it");
                    false
                }
            }
        });
        if state.declared.len() != before {
            self.publish(&mut state);
        }
        Ok(())
    }

    /// Takes declared routes from the cluster's ScaledObjects: every route
    /// they declare, oldest ScaledObject first (creationTimestamp, then
    /// namespace/name). The oldest wins a claim, so every scaler replica
    /// reading the same API decides the same, with no leader and no state.
    pub fn set_declared(&self, candidates: Vec<RouteSpec>) {
        let mut state = self.lock();
        state.from_cluster = true;
        state.candidates = candidates;
        self.assign(&mut state);
        self.decided.send_modify(|count| *count += 1);
    }

    /// Changes with every decision the cluster's ScaledObjects make.
    pub fn decisions(&self) -> watch::Receiver<u64> {
        self.decided.subscribe()
    }

    /// Whether declared routes come from the cluster (from now on).
    pub fn follow_cluster(&self) {
        self.lock().from_cluster = true;
    }

    /// Decides the table from the cluster's candidates and the rules.
    fn assign(&self, state: &mut State) {
        let mut declared: BTreeMap<String, Declared> = BTreeMap::new();
        let mut refused: BTreeMap<String, RouteError> = BTreeMap::new();
        for (order, spec) in state.candidates.iter().enumerate() {
            if declared.contains_key(&spec.name) || refused.contains_key(&spec.name) {
                // A second trigger of one ScaledObject declaring a route:
                // its first trigger's stands.
                continue;
            }
            let decided = state
                .rules
                .allows(spec)
                .and_then(|()| check_quota(&state.rules, spec, declared.values().map(|d| &d.spec)))
                .and_then(|()| {
                    claims_free(
                        &state.reserved,
                        &state.rules.config_routes,
                        declared.values().map(|d| &d.spec),
                        spec,
                    )
                });
            match decided {
                Ok(()) => {
                    declared.insert(
                        spec.name.clone(),
                        Declared {
                            spec: spec.clone(),
                            order: order as u64,
                            holders: BTreeSet::new(),
                            unclaimed_since: None,
                        },
                    );
                }
                Err(error) => {
                    refused.insert(spec.name.clone(), error);
                }
            }
        }
        for (name, error) in &refused {
            if state.refused.get(name) != Some(error) {
                warn!(route = %name, %error, "declared route refused");
            }
        }
        let same = state.settling_since.is_none()
            && routes_in_order(&state.declared) == routes_in_order(&declared);
        state.declared = declared;
        state.refused = refused;
        state.settling_since = None;
        if same {
            return;
        }
        let skipped = self.publish(state);
        if skipped.is_empty() {
            return;
        }
        for (name, reason) in skipped {
            if let Some(gone) = state.declared.remove(&name) {
                let key = claim_key(gone.spec.protocol);
                state
                    .refused
                    .insert(name, RouteError::Unservable { key, reason });
            }
        }
        self.publish(state);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new version of the table: to the local interceptor (whose
    /// refusals are returned), to followers, and to the state file.
    fn publish(&self, state: &mut State) -> BTreeMap<String, String> {
        state.version += 1;
        let routes = routes_in_order(&state.declared);
        let skipped = match &*self.local.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(apply) => apply(&routes),
            None => BTreeMap::new(),
        };
        self.table.send_replace(Arc::new(RouteTable {
            instance: self.instance.clone(),
            version: state.version,
            routes,
            settling: state.settling_since.is_some(),
        }));
        self.changed.notify_one();
        skipped
    }
}

fn declared_in_order(declared: &BTreeMap<String, Declared>) -> Vec<&Declared> {
    let mut in_order: Vec<&Declared> = declared.values().collect();
    in_order.sort_by_key(|declared| declared.order);
    in_order
}

fn routes_in_order(declared: &BTreeMap<String, Declared>) -> Vec<RouteSpec> {
    declared_in_order(declared)
        .into_iter()
        .map(|d| d.spec.clone())
        .collect()
}

/// Whether another route (config or declared), or hoist itself, holds one
/// of the route's claims.
fn check_claims(state: &State, spec: &RouteSpec) -> Result<(), RouteError> {
    claims_free(
        &state.reserved,
        &state.rules.config_routes,
        state.declared.values().map(|declared| &declared.spec),
        spec,
    )
}

/// Whether hoist's own ports (`reserved`), a config route or one of
/// `declared` holds one of the route's claims.
fn claims_free<'a>(
    reserved: &[(u16, String)],
    config_routes: &'a [RouteSpec],
    declared: impl Iterator<Item = &'a RouteSpec>,
    spec: &RouteSpec,
) -> Result<(), RouteError> {
    let key = claim_key(spec.protocol);
    let mut held: HashMap<Claim, String> = HashMap::new();
    for (port, setting) in reserved {
        held.insert(
            Claim::Tcp { port: *port },
            format!("hoist itself ({setting})"),
        );
    }
    let others = config_routes
        .iter()
        .chain(declared)
        .filter(|other| other.name != spec.name);
    for other in others {
        for claim in other.exclusive_claims() {
            held.entry(claim).or_insert_with(|| other.origin());
        }
    }
    match spec.exclusive_claims().into_iter().find_map(|claim| {
        let holder = held.get(&claim)?.clone();
        Some((claim, holder))
    }) {
        Some((claim, holder)) => Err(RouteError::Taken {
            key,
            claim: claim.to_string(),
            holder,
        }),
        None => Ok(()),
    }
}

/// The config route holding one of `spec`'s claims, if any.
fn config_holder(config_routes: &[RouteSpec], spec: &RouteSpec) -> Option<(String, String)> {
    let claims = spec.exclusive_claims();
    config_routes.iter().find_map(|config| {
        config
            .exclusive_claims()
            .into_iter()
            .find(|claim| claims.contains(claim))
            .map(|claim| (claim.to_string(), config.origin()))
    })
}

/// Whether `spec`'s namespace may hold it besides what it holds in
/// `declared` (`interceptor.max_routes_per_namespace`,
/// `max_listen_ports_per_namespace`): one namespace cannot fill the
/// interceptor with routes or listeners.
fn check_quota<'a>(
    rules: &RouteRules,
    spec: &RouteSpec,
    declared: impl Iterator<Item = &'a RouteSpec>,
) -> Result<(), RouteError> {
    let Some(owner) = &spec.owner else {
        return Ok(());
    };
    let (mut routes, mut ports) = (0, 0);
    for other in declared {
        let same_namespace = other
            .owner
            .as_ref()
            .is_some_and(|o| o.namespace == owner.namespace);
        if same_namespace && other.name != spec.name {
            routes += 1;
            ports += usize::from(other.listen.is_some());
        }
    }
    let settings = &rules.interceptor;
    if routes >= settings.max_routes_per_namespace {
        return Err(RouteError::Denied {
            key: "upstream",
            setting: "interceptor.max_routes_per_namespace",
            reason: format!(
                "namespace `{}` already declares {routes} routes",
                owner.namespace
            ),
        });
    }
    if spec.listen.is_some() && ports >= settings.max_listen_ports_per_namespace {
        return Err(RouteError::Denied {
            key: "listenPort",
            setting: "interceptor.max_listen_ports_per_namespace",
            reason: format!(
                "namespace `{}` already listens on {ports} ports",
                owner.namespace
            ),
        });
    }
    Ok(())
}

/// The metadata key that makes a route's claims.
fn claim_key(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Http => "host",
        Protocol::Tcp => "listenPort",
    }
}

fn rand_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry::new(rules_with(|_| {}), Arc::new(Notify::new()))
    }

    fn shop_route() -> RouteSpec {
        serde_json::from_value(serde_json::json!({
            "name": "http/default/shop",
            "protocol": "http",
            "owner": { "namespace": "default", "name": "shop" },
            "hosts": ["shop.test"],
            "upstream": "shop.default.svc.cluster.local:80",
        }))
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_without_saved_routes_settles_after_idle_after() {
        let idle_after = Duration::from_secs(60);
        let registry = registry();
        let mut table = registry.table();
        assert!(table.borrow_and_update().settling);
        registry.claim(b"shop-trigger", &shop_route()).unwrap();
        assert!(
            table.borrow_and_update().settling,
            "one declaration says nothing of the others"
        );

        tokio::time::advance(idle_after - Duration::from_secs(1)).await;
        registry.drop_unclaimed(idle_after);
        assert!(!table.has_changed().unwrap(), "not settled yet");

        tokio::time::advance(Duration::from_secs(1)).await;
        registry.drop_unclaimed(idle_after);
        assert!(
            table.has_changed().unwrap(),
            "settling ends in a new version"
        );
        let settled = table.borrow_and_update().clone();
        assert!(!settled.settling);
        assert_eq!(settled.routes, vec![shop_route()], "declared routes stay");
    }

    #[tokio::test(start_paused = true)]
    async fn saved_routes_make_the_table_whole_at_once() {
        let registry = registry();
        registry.restore(vec![shop_route()], true);
        let table = registry.table().borrow().clone();
        assert!(!table.settling);
        assert_eq!(table.routes, vec![shop_route()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_run_that_saved_no_routes_makes_the_table_whole() {
        let registry = registry();
        registry.restore(Vec::new(), true);
        assert!(!registry.table().borrow().settling);
    }

    #[tokio::test(start_paused = true)]
    async fn routes_saved_while_settling_leave_the_next_run_settling() {
        // The run before crashed while it settled: what it saved may lack
        // routes its followers still serve.
        let before = registry();
        before.claim(b"shop-trigger", &shop_route()).unwrap();
        let (routes, settling) = before.snapshot();
        assert!(settling);

        let after = registry();
        after.restore(routes, !settling);
        let table = after.table().borrow().clone();
        assert!(table.settling);
        assert_eq!(
            table.routes,
            vec![shop_route()],
            "served at once all the same"
        );
    }

    fn rules_with(edit: impl FnOnce(&mut InterceptorSettings)) -> RouteRules {
        let mut interceptor = InterceptorSettings {
            allowed_hosts: [("*".to_string(), vec!["*".to_string()])].into(),
            allowed_upstreams: vec!["*:*".to_string()],
            ..Default::default()
        };
        edit(&mut interceptor);
        RouteRules {
            interceptor,
            config_routes: Vec::new(),
        }
    }

    fn route(namespace: &str, name: &str, host: &str) -> RouteSpec {
        serde_json::from_value(serde_json::json!({
            "name": format!("http/{namespace}/{name}"),
            "protocol": "http",
            "owner": { "namespace": namespace, "name": name },
            "hosts": [host],
            "upstream": format!("{name}.{namespace}.svc.cluster.local:80"),
        }))
        .unwrap()
    }

    fn tcp_route(namespace: &str, name: &str, port: u16) -> RouteSpec {
        serde_json::from_value(serde_json::json!({
            "name": format!("tcp/{namespace}/{name}"),
            "protocol": "tcp",
            "owner": { "namespace": namespace, "name": name },
            "listen": { "port": port },
            "upstream": format!("{name}.{namespace}.svc.cluster.local:5432"),
        }))
        .unwrap()
    }

    #[test]
    fn a_namespace_with_no_host_pattern_routes_no_host() {
        let registry = Registry::new(
            rules_with(|i| i.allowed_hosts.clear()),
            Arc::new(Notify::new()),
        );
        let refused = registry.claim(b"t", &shop_route()).unwrap_err();
        assert!(
            matches!(
                refused,
                RouteError::Denied {
                    setting: "interceptor.allowed_hosts",
                    ..
                }
            ),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("may route no host"),
            "{refused}"
        );
    }

    #[test]
    fn a_host_with_a_trailing_dot_or_other_case_is_the_same_claim() {
        let registry = Registry::new(rules_with(|_| {}), Arc::new(Notify::new()));
        registry
            .claim(b"a", &route("team-a", "shop", "shop.example.com."))
            .unwrap();
        let refused = registry
            .claim(b"b", &route("team-b", "shop", "SHOP.example.com"))
            .unwrap_err();
        assert!(matches!(refused, RouteError::Taken { .. }), "{refused}");
        assert!(refused.to_string().contains("team-a/shop"), "{refused}");
    }

    #[test]
    fn one_namespace_cannot_take_more_routes_or_listeners_than_its_quota() {
        let registry = Registry::new(
            rules_with(|i| {
                i.max_routes_per_namespace = 3;
                i.max_listen_ports_per_namespace = 1;
            }),
            Arc::new(Notify::new()),
        );
        registry
            .claim(b"1", &route("greedy", "a", "a.test"))
            .unwrap();
        registry
            .claim(b"2", &tcp_route("greedy", "b", 15000))
            .unwrap();
        let port = registry
            .claim(b"3", &tcp_route("greedy", "c", 15001))
            .unwrap_err();
        assert!(
            matches!(
                port,
                RouteError::Denied {
                    setting: "interceptor.max_listen_ports_per_namespace",
                    ..
                }
            ),
            "{port}"
        );
        registry
            .claim(b"3", &route("greedy", "c", "c.test"))
            .unwrap();
        let routes = registry
            .claim(b"4", &route("greedy", "d", "d.test"))
            .unwrap_err();
        assert!(
            matches!(
                routes,
                RouteError::Denied {
                    setting: "interceptor.max_routes_per_namespace",
                    ..
                }
            ),
            "{routes}"
        );
        // An edit of a route it holds is no new route; other namespaces
        // have quotas of their own.
        registry
            .claim(b"3", &route("greedy", "c", "c2.test"))
            .unwrap();
        registry
            .claim(b"5", &route("modest", "d", "d.test"))
            .unwrap();
    }

    #[test]
    fn from_the_cluster_the_oldest_scaledobject_wins_whoever_asks_first() {
        let registry = Registry::new(rules_with(|_| {}), Arc::new(Notify::new()));
        registry.follow_cluster();
        let older = route("team-b", "old", "shared.test");
        let newer = route("team-a", "new", "shared.test");
        // Before the cluster is read, no caller decides anything.
        assert!(matches!(
            registry.claim(b"new", &newer),
            Err(RouteError::Pending { .. })
        ));
        registry.set_declared(vec![older.clone(), newer.clone()]);
        let refused = registry.claim(b"new", &newer).unwrap_err();
        assert!(refused.to_string().contains("team-b/old"), "{refused}");
        registry.claim(b"old", &older).unwrap();
        let table = registry.table().borrow().clone();
        assert_eq!(table.routes, vec![older.clone()]);
        assert!(!table.settling);
        // The older one deleted: the next in age takes the host.
        registry.set_declared(vec![newer.clone()]);
        registry.claim(b"new", &newer).unwrap();
        // A release by a caller changes nothing: the cluster decides.
        registry.release(b"new", &newer.name);
        assert_eq!(registry.table().borrow().routes, vec![newer]);
    }

    #[test]
    fn a_reloaded_config_route_takes_a_declared_routes_host() {
        for from_cluster in [false, true] {
            let registry = Registry::new(rules_with(|_| {}), Arc::new(Notify::new()));
            let declared = route("team-a", "shop", "shop.test");
            if from_cluster {
                registry.set_declared(vec![declared.clone()]);
            } else {
                registry.claim(b"shop", &declared).unwrap();
            }
            let mut rules = rules_with(|_| {});
            let mut operator = route("x", "y", "shop.test");
            operator.name = "shop-config".to_string();
            operator.owner = None;
            rules.config_routes = vec![operator];
            registry
                .reconfigure::<RouteError>(rules, || Ok(()))
                .expect("the operator's route wins; the reload is not refused");
            assert!(
                registry.table().borrow().routes.is_empty(),
                "{from_cluster}"
            );
            let refused = registry.claim(b"shop", &declared).unwrap_err();
            assert!(
                refused
                    .to_string()
                    .contains("hoist's config (route `shop-config`)"),
                "{from_cluster}: {refused}"
            );
        }
    }
}
