//! An interceptor in its own Deployment follows the scaler's route table
//! (routes ScaledObjects declare) with a long poll on the scaler's admin
//! port, so a new route is served here within a second of its declaration.
//! While the scaler cannot be reached the last table stays in force, and
//! while a restarted scaler is still settling (it lost the routes of its
//! run before and not every trigger has declared its own again) the routes
//! it lacks stay in force too.

use std::sync::LazyLock;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::table::RouteControl;
use crate::logging::Summary;
use crate::routing::api::{MAX_WAIT, PATH};
use crate::routing::{RouteRules, RouteSpec, RouteTable};
use crate::token_file::TokenFile;

/// How long to wait before asking again after a failure.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Failures to reach the scaler are logged once per this interval.
static UNREACHABLE: LazyLock<Summary> = LazyLock::new(|| {
    Summary::new(Duration::from_secs(30), |count| {
        warn!(
            count,
            "still cannot read the scaler's route table; keeping the last one"
        );
    })
});

/// Where the follower stands, for the interceptor's admin report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Following {
    /// The scaler run and table version in force here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    pub routes: usize,
    /// The scaler restarted without its earlier routes and may lack some
    /// (see `carried`).
    pub settling: bool,
    /// Routes kept from the scaler's run before while it settles: ones
    /// its table lacks and nothing in it clashes with.
    pub carried: usize,
    /// The last failure to read the table, cleared by the next success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Follows `{base}/routes/table` (`base`: `http://scaler:9091`, or https)
/// until `shutdown`, presenting `token` (this pod's ServiceAccount token,
/// read again for every request so kubelet's rotation applies).
pub async fn follow(
    base: String,
    client: reqwest::Client,
    token: TokenFile,
    control: RouteControl,
    rules: RouteRules,
    status: watch::Sender<Following>,
    shutdown: CancellationToken,
) {
    let mut seen: Option<RouteTable> = None;
    // What is in force here: the table's routes, then the carried ones.
    let mut applied: Vec<RouteSpec> = Vec::new();
    let mut carried: Vec<RouteSpec> = Vec::new();
    // Routes refused by the rules, warned about once each.
    let mut refused = std::collections::BTreeSet::new();
    loop {
        let mut url = format!("{base}{PATH}?wait={}", MAX_WAIT.as_secs());
        if let Some(seen) = &seen {
            url.push_str(&format!(
                "&instance={}&version={}",
                seen.instance, seen.version
            ));
        }
        let answer = tokio::select! {
            _ = shutdown.cancelled() => return,
            answer = read(token.authorize(client.get(&url))) => answer,
        };
        match answer {
            Ok(table) => {
                if seen.as_ref() == Some(&table) {
                    status.send_modify(|following| following.error = None);
                    continue;
                }
                let restarted = seen
                    .as_ref()
                    .is_some_and(|seen| seen.instance != table.instance);
                carried = carry(&applied, carried, restarted, &table);
                if restarted && !carried.is_empty() {
                    info!(
                        carried = carried.len(),
                        "the scaler restarted without its routes; keeping ours until its triggers declare theirs again"
                    );
                }
                // The table is the scaler's word, not this interceptor's:
                // its own rules are checked again (a scaler configured
                // otherwise, or whoever answers at its address).
                let in_force: Vec<RouteSpec> = table
                    .routes
                    .iter()
                    .chain(&carried)
                    .filter(|spec| match follower_allows(&rules, spec) {
                        Ok(()) => true,
                        Err(error) => {
                            if refused.insert(spec.name.clone()) {
                                warn!(route = %spec.name, %error, "a route of the scaler's table breaks this interceptor's rules: not served");
                            }
                            false
                        }
                    })
                    .cloned()
                    .collect();
                if in_force != applied {
                    info!(
                        version = table.version,
                        routes = table.routes.len(),
                        carried = carried.len(),
                        "route table from the scaler"
                    );
                    control.apply_declared(in_force.clone());
                    applied = in_force;
                }
                status.send_replace(Following {
                    instance: Some(table.instance.clone()),
                    version: Some(table.version),
                    routes: table.routes.len(),
                    settling: table.settling,
                    carried: carried.len(),
                    error: None,
                });
                seen = Some(table);
            }
            Err(error) => {
                if let Some(count) = UNREACHABLE.note() {
                    warn!(%error, count, "cannot read the scaler's route table; keeping the last one");
                }
                status.send_modify(|following| following.error = Some(error));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(RETRY_AFTER) => {}
                }
            }
        }
    }
}

/// Whether a route of the scaler's table may be served here. The table
/// holds only routes ScaledObjects declare: one without an owner (which
/// the rules would take for the operator's own, exempt from them) or whose
/// owner has a name no Kubernetes object can have is not the scaler's.
fn follower_allows(rules: &RouteRules, spec: &RouteSpec) -> Result<(), String> {
    let Some(owner) = &spec.owner else {
        return Err(
            "the scaler's table carries only declared routes, and this one has no owner".into(),
        );
    };
    crate::callers::check_names(&owner.namespace, &owner.name).map_err(|e| e.to_string())?;
    rules.allows(spec).map_err(|e| e.to_string())
}

/// The routes a follower keeps beside `table`'s: while the scaler settles,
/// what was in force when it restarted (`in_force`; the carried ones
/// stay carried across restarts), less what its table now has; nothing
/// once it has settled.
fn carry(
    in_force: &[RouteSpec],
    carried: Vec<RouteSpec>,
    restarted: bool,
    table: &RouteTable,
) -> Vec<RouteSpec> {
    let mut carried = match (table.settling, restarted) {
        (false, _) => return Vec::new(),
        (true, true) => in_force.to_vec(),
        (true, false) => carried,
    };
    carried.retain(|spec| !in_table(spec, &table.routes));
    carried
}

/// Whether the table has this route, or another that claims what it does
/// (which then wins: the carried route is the stale one). A host is one
/// owner's, so any route on a carried route's host wins over it.
fn in_table(spec: &RouteSpec, routes: &[RouteSpec]) -> bool {
    let claims = spec.exclusive_claims();
    routes.iter().any(|route| {
        route.name == spec.name
            || route
                .exclusive_claims()
                .iter()
                .any(|claim| claims.contains(claim))
    })
}

async fn read(request: reqwest::RequestBuilder) -> Result<RouteTable, String> {
    let response = request
        .send()
        .await
        .map_err(|error| super::describe(&error))?;
    if !response.status().is_success() {
        return Err(format!("the scaler answered {}", response.status()));
    }
    response
        .json()
        .await
        .map_err(|error| super::describe(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(name: &str, host: &str, prefix: Option<&str>) -> RouteSpec {
        serde_json::from_value(serde_json::json!({
            "name": format!("http/default/{name}"),
            "protocol": "http",
            "owner": { "namespace": "default", "name": name },
            "hosts": [host],
            "pathPrefix": prefix,
            "upstream": format!("{name}.default.svc.cluster.local:80"),
        }))
        .unwrap()
    }

    fn table(instance: &str, settling: bool, routes: Vec<RouteSpec>) -> RouteTable {
        RouteTable {
            instance: instance.into(),
            version: 1,
            routes,
            settling,
        }
    }

    fn names(routes: &[RouteSpec]) -> Vec<&str> {
        routes.iter().map(|route| route.name.as_str()).collect()
    }

    #[test]
    fn a_settling_restart_carries_what_its_table_lacks() {
        let in_force = [
            http("shop", "shop.test", None),
            http("cart", "cart.test", None),
        ];
        let new_run = table("b", true, vec![http("cart", "cart.test", Some("/v2"))]);
        let carried = carry(&in_force, Vec::new(), true, &new_run);
        assert_eq!(
            names(&carried),
            ["http/default/shop"],
            "cart is the table's now"
        );
    }

    #[test]
    fn a_settled_table_is_whole_and_nothing_is_carried() {
        let in_force = [http("shop", "shop.test", None)];
        let restarted_settled = table("b", false, Vec::new());
        assert!(carry(&in_force, Vec::new(), true, &restarted_settled).is_empty());
        let settled_later = table("b", false, Vec::new());
        let carried = vec![http("shop", "shop.test", None)];
        assert!(carry(&in_force, carried, false, &settled_later).is_empty());
    }

    #[test]
    fn a_route_on_the_same_host_or_port_wins_over_a_carried_one() {
        let in_force = [
            http("shop", "shop.test", Some("/api")),
            serde_json::from_value(serde_json::json!({
                "name": "tcp/default/db", "protocol": "tcp",
                "listen": { "port": 5432 }, "upstream": "db.default.svc.cluster.local:5432",
            }))
            .unwrap(),
        ];
        let other_owner_same_host = http("web", "shop.test", Some("/web"));
        let other_owner_same_port: RouteSpec = serde_json::from_value(serde_json::json!({
            "name": "tcp/default/pg", "protocol": "tcp",
            "listen": { "port": 5432 }, "upstream": "pg.default.svc.cluster.local:5432",
        }))
        .unwrap();
        let new_run = table(
            "b",
            true,
            vec![other_owner_same_host, other_owner_same_port],
        );
        assert!(carry(&in_force, Vec::new(), true, &new_run).is_empty());
    }

    #[test]
    fn carried_routes_stay_carried_until_declared_or_settled() {
        let shop = http("shop", "shop.test", None);
        let cart = http("cart", "cart.test", None);
        // The same run, a new version: the carried routes stay, less the
        // one declared again.
        let next = table("b", true, vec![cart.clone()]);
        let carried = carry(
            &[cart.clone(), shop.clone()],
            vec![shop.clone(), cart.clone()],
            false,
            &next,
        );
        assert_eq!(names(&carried), ["http/default/shop"]);
        // A second restart while settling: what was in force, carried
        // routes included, is carried again.
        let again = table("c", true, Vec::new());
        let carried = carry(&[cart.clone(), shop.clone()], carried, true, &again);
        assert_eq!(names(&carried), ["http/default/cart", "http/default/shop"]);
    }

    #[test]
    fn a_follower_serves_only_declared_routes_its_own_rules_allow() {
        let rules = RouteRules {
            interceptor: crate::config::InterceptorSettings {
                allowed_hosts: [("default".to_string(), vec!["*.test".to_string()])].into(),
                ..Default::default()
            },
            config_routes: Vec::new(),
        };
        assert_eq!(
            follower_allows(&rules, &http("shop", "shop.test", None)),
            Ok(())
        );
        let mut ownerless = http("shop", "shop.test", None);
        ownerless.owner = None;
        assert!(
            follower_allows(&rules, &ownerless)
                .unwrap_err()
                .contains("no owner")
        );
        let mut wildcard = http("shop", "shop.test", None);
        wildcard.owner.as_mut().unwrap().namespace = "*".into();
        assert!(
            follower_allows(&rules, &wildcard)
                .unwrap_err()
                .contains("DNS-1123")
        );
        let elsewhere = http("shop", "shop.example.com", None);
        assert!(
            follower_allows(&rules, &elsewhere)
                .unwrap_err()
                .contains("interceptor.allowed_hosts")
        );
    }
}
