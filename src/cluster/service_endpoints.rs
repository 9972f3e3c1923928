//! Where a Service's ready pods are, for the interceptor to dial them
//! itself (`interceptor.direct_to_pods`) instead of the Service's address.
//!
//! Why: a pod becomes Ready, the EndpointSlice controller marks it ready
//! within milliseconds, and the watch here sees that at once; kube-proxy
//! rewrites its rules at most once per `--iptables-min-sync-period` (1 s by
//! default), so a request held through a cold start reached the app up to
//! a second after it was Ready.
//!
//! Each Service is followed on first use (two watches: its EndpointSlices,
//! by the `kubernetes.io/service-name` label, and the Service itself, for
//! which port a name's port is) and let go after [`IDLE`] without a dial.
//! Anything short of a known answer (the watches not listed yet or
//! failing, no such Service, an ExternalName one, a port it does not
//! have) is `None`, and the caller dials the name as before.
//!
//! Who writes what is read: EndpointSlices come from the EndpointSlice
//! controller, or from anyone who may write them in that namespace (for a
//! Service without a selector, by design). Those are the people who could
//! already point the Service's name anywhere, and the addresses read here
//! go through the same `interceptor.denied_networks` check on every
//! connection as addresses from DNS do.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::api::Api;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::watched::Watched;

/// A Service nothing dialled for this long is no longer followed.
const IDLE: Duration = Duration::from_secs(600);

/// Idle Services are looked for at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One followed Service as `GET /interceptor/services` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FollowedService {
    pub namespace: String,
    pub name: String,
    /// Both watches have listed: what they show is the API's answer.
    pub listed: bool,
    /// Why a watch fails, while it does (the Service's name is dialled
    /// meanwhile): a missing grant names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Ready endpoints over all the Service's EndpointSlices.
    pub ready_endpoints: usize,
    /// Not ready but still serving while they terminate: dialled only
    /// when none is ready.
    pub serving_endpoints: usize,
    /// Since the last dial; the Service is let go after ten minutes.
    pub idle_seconds: f64,
}

/// The Services the interceptor dials, followed. Cheap to share.
pub struct ServiceEndpoints {
    client: kube::Client,
    cluster_domain: String,
    cancel: CancellationToken,
    followed: Mutex<Followed>,
}

struct Followed {
    services: HashMap<ServiceKey, Arc<OneService>>,
    last_sweep: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ServiceKey {
    namespace: String,
    name: String,
}

struct OneService {
    slices: Watched<EndpointSlice>,
    service: Watched<Service>,
    /// Counts the watches' events: a dialler waiting for the app wakes on
    /// each.
    changed: watch::Sender<u64>,
    /// Where the next dial starts in the list of ready pods: connections
    /// are spread over them as kube-proxy would.
    next: AtomicUsize,
    last_used: Mutex<Instant>,
    stop: CancellationToken,
}

impl ServiceEndpoints {
    /// Follows Services through `client` until `cancel`; `cluster_domain`
    /// completes the Service names it recognises.
    pub fn new(client: kube::Client, cluster_domain: &str, cancel: CancellationToken) -> Self {
        Self {
            client,
            cluster_domain: cluster_domain.to_ascii_lowercase(),
            cancel,
            followed: Mutex::new(Followed {
                services: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }

    /// The ready pods' addresses behind `host`:`port` (port being the
    /// Service's port, as in the Service's address), in the order to try
    /// them; an empty list when none is ready. `None` when `host` names no
    /// Service this can answer for: dial the name.
    pub fn lookup(&self, host: &str, port: u16) -> Option<Vec<SocketAddr>> {
        let key = service_key(host, &self.cluster_domain)?;
        let service = self.follow(&key);
        let mut addresses = service.addresses(port)?;
        if !addresses.is_empty() {
            let start = service.next.fetch_add(1, Ordering::Relaxed) % addresses.len();
            addresses.rotate_left(start);
        }
        Some(addresses)
    }

    /// Changes whenever what `host`'s Service shows may have: `None` when
    /// `host` names no Service.
    pub fn changes(&self, host: &str) -> Option<watch::Receiver<u64>> {
        let key = service_key(host, &self.cluster_domain)?;
        Some(self.follow(&key).changed.subscribe())
    }

    /// Every Service followed now, by namespace and name.
    pub fn report(&self) -> Vec<FollowedService> {
        let now = Instant::now();
        let followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        let mut report: Vec<FollowedService> = followed
            .services
            .iter()
            .map(|(key, service)| service.report(key, now))
            .collect();
        report.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        report
    }

    fn follow(&self, key: &ServiceKey) -> Arc<OneService> {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now.duration_since(followed.last_sweep) >= SWEEP_EVERY {
            followed.last_sweep = now;
            followed.services.retain(|key, service| {
                let idle = service.idle_for(now) >= IDLE;
                if idle {
                    service.stop.cancel();
                    debug!(namespace = %key.namespace, service = %key.name, "no longer following the Service's pods: not dialled for a while");
                }
                !idle
            });
        }
        let service = followed
            .services
            .entry(key.clone())
            .or_insert_with(|| {
                info!(namespace = %key.namespace, service = %key.name, "dialling the Service's ready pods directly (interceptor.direct_to_pods)");
                Arc::new(OneService::start(&self.client, key, self.cancel.child_token()))
            })
            .clone();
        *service.last_used.lock().unwrap_or_else(|e| e.into_inner()) = now;
        service
    }
}

impl OneService {
    fn start(client: &kube::Client, key: &ServiceKey, stop: CancellationToken) -> Self {
        let changed = watch::Sender::new(0u64);
        let slices = Watched::start_with(
            (Api::namespaced(client.clone(), &key.namespace), ()),
            super::watch_config().labels(&format!("kubernetes.io/service-name={}", key.name)),
            ("endpointslices.discovery.k8s.io", ""),
            super::drop_bookkeeping,
            &stop,
            count_changes(changed.clone()),
        );
        let service = Watched::start_with(
            (Api::namespaced(client.clone(), &key.namespace), ()),
            super::watch_config().fields(&format!("metadata.name={}", key.name)),
            ("services", " (core API group)"),
            super::drop_bookkeeping,
            &stop,
            count_changes(changed.clone()),
        );
        Self {
            slices,
            service,
            changed,
            next: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            stop,
        }
    }

    fn report(&self, key: &ServiceKey, now: Instant) -> FollowedService {
        let (ready_endpoints, serving_endpoints) = endpoint_counts(
            self.slices
                .store()
                .state()
                .iter()
                .map(|slice| slice.as_ref()),
        );
        FollowedService {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            listed: self.slices.listed() && self.service.listed(),
            error: self.slices.error().or_else(|| self.service.error()),
            ready_endpoints,
            serving_endpoints,
            idle_seconds: self.idle_for(now).as_secs_f64(),
        }
    }

    fn idle_for(&self, now: Instant) -> Duration {
        now.duration_since(*self.last_used.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What the watches show for the Service's `port`; `None` while they
    /// cannot tell (see the module's notes).
    fn addresses(&self, port: u16) -> Option<Vec<SocketAddr>> {
        if self.slices.unreadable().is_some() || self.service.unreadable().is_some() {
            return None;
        }
        let service = self.service.store().state().into_iter().next()?;
        let spec = service.spec.as_ref()?;
        if spec.type_.as_deref() == Some("ExternalName") {
            return None;
        }
        let port_name = spec
            .ports
            .iter()
            .flatten()
            .find(|p| i32::from(port) == p.port && is_tcp(p.protocol.as_deref()))?
            .name
            .clone()
            .unwrap_or_default();
        let slices = self.slices.store().state();
        Some(ready_addresses(
            slices.iter().map(|slice| slice.as_ref()),
            &port_name,
        ))
    }
}

/// `name.namespace.svc.<cluster_domain>` or `name.namespace.svc` (a
/// trailing dot allowed); anything else is not read as a Service.
fn service_key(host: &str, cluster_domain: &str) -> Option<ServiceKey> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let rest = host
        .strip_suffix(&format!(".svc.{cluster_domain}"))
        .or_else(|| host.strip_suffix(".svc"))?;
    let (name, namespace) = rest.split_once('.')?;
    let label = |text: &str| {
        !text.is_empty()
            && text.len() <= 63
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    (label(name) && label(namespace)).then(|| ServiceKey {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// Bumps `changed` on each event that shows what the API holds.
fn count_changes<K>(changed: watch::Sender<u64>) -> impl Fn(&watcher::Event<K>) + Send + 'static {
    move |event| {
        if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
            changed.send_modify(|count| *count += 1);
        }
    }
}

fn is_tcp(protocol: Option<&str>) -> bool {
    protocol.is_none_or(|protocol| protocol == "TCP")
}

#[derive(Clone, Copy)]
enum Standing {
    Ready,
    /// Not ready, still serving while it terminates.
    ServingOnly,
}

/// What an endpoint's conditions say; `None`: not to be dialled.
fn standing(endpoint: &Endpoint) -> Option<Standing> {
    let conditions = endpoint.conditions.as_ref();
    // The API: an unset `ready` or `serving` is to be read as true.
    let is_ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let is_serving = conditions.and_then(|c| c.serving).unwrap_or(is_ready);
    if is_ready {
        Some(Standing::Ready)
    } else if is_serving {
        Some(Standing::ServingOnly)
    } else {
        None
    }
}

/// Every address of `slice`'s endpoints that may be dialled, with what
/// its conditions say. FQDN slices are not dialled.
fn dialable(slice: &EndpointSlice) -> impl Iterator<Item = (Standing, &str)> {
    let endpoints: &[Endpoint] = match slice.address_type.as_str() {
        "IPv4" | "IPv6" => &slice.endpoints,
        _ => &[],
    };
    endpoints
        .iter()
        .filter_map(|endpoint| standing(endpoint).map(|standing| (standing, endpoint)))
        .flat_map(|(standing, endpoint)| {
            endpoint
                .addresses
                .iter()
                .map(move |address| (standing, address.as_str()))
        })
}

/// The port `slice` gives the Service port named `port_name` (`""`: the
/// unnamed one), if it is TCP.
fn slice_port(slice: &EndpointSlice, port_name: &str) -> Option<u16> {
    slice.ports.iter().flatten().find_map(|p| {
        let named = p.name.as_deref().unwrap_or_default() == port_name;
        (named && is_tcp(p.protocol.as_deref()))
            .then_some(p.port)
            .flatten()
            .and_then(|port| u16::try_from(port).ok())
    })
}

/// The addresses of the endpoints in `slices` for the Service port named
/// `port_name` (`""`: the unnamed one), sorted: the ready ones; when none
/// is ready, the ones still serving while they terminate (as kube-proxy
/// does, so that a rollout's last pods keep answering).
fn ready_addresses<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    port_name: &str,
) -> Vec<SocketAddr> {
    let mut ready = Vec::new();
    let mut serving = Vec::new();
    for slice in slices {
        let Some(port) = slice_port(slice, port_name) else {
            continue;
        };
        for (standing, address) in dialable(slice) {
            let Ok(ip) = address.parse::<IpAddr>() else {
                continue;
            };
            match standing {
                Standing::Ready => ready.push(SocketAddr::new(ip, port)),
                Standing::ServingOnly => serving.push(SocketAddr::new(ip, port)),
            }
        }
    }
    let mut found = if ready.is_empty() { serving } else { ready };
    found.sort();
    found.dedup();
    found
}

/// Ready endpoints, and not-ready ones still serving, in `slices`: each
/// address with its slice's ports once (an address listed in two slices
/// with other ports is two places to dial).
fn endpoint_counts<'a>(slices: impl Iterator<Item = &'a EndpointSlice>) -> (usize, usize) {
    let mut ready = std::collections::BTreeSet::new();
    let mut serving = std::collections::BTreeSet::new();
    for slice in slices {
        let ports: Vec<Option<i32>> = slice.ports.iter().flatten().map(|p| p.port).collect();
        for (standing, address) in dialable(slice) {
            match standing {
                Standing::Ready => ready.insert((address, ports.clone())),
                Standing::ServingOnly => serving.insert((address, ports.clone())),
            };
        }
    }
    (ready.len(), serving.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(json: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn only_names_of_a_service_in_the_cluster_domain_are_read_as_services() {
        let key = |host| service_key(host, "cluster.local").map(|k| (k.namespace, k.name));
        let web = Some(("shop".to_string(), "web".to_string()));
        assert_eq!(key("web.shop.svc.cluster.local"), web);
        assert_eq!(key("Web.Shop.svc.cluster.local."), web);
        assert_eq!(key("web.shop.svc"), web);
        for other in [
            "web",
            "web.shop",
            "example.com",
            "web.shop.svc.example.org",
            "a.web.shop.svc.cluster.local",
            "web_1.shop.svc",
            ".shop.svc",
        ] {
            assert_eq!(key(other), None, "{other}");
        }
    }

    #[test]
    fn the_ready_endpoints_of_the_named_port_and_serving_ones_only_when_none_is_ready() {
        let web = slice(serde_json::json!({
            "metadata": {"name": "web-abc"},
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9100}, {"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": false, "serving": false}},
                {"addresses": ["10.0.0.1"]},
            ],
        }));
        let fqdn = slice(serde_json::json!({
            "metadata": {"name": "web-fqdn"},
            "addressType": "FQDN",
            "ports": [{"name": "http", "port": 80}],
            "endpoints": [{"addresses": ["example.com"]}],
        }));
        let found = ready_addresses([&web, &fqdn].into_iter(), "http");
        assert_eq!(
            found,
            [
                "10.0.0.1:8080".parse().unwrap(),
                "10.0.0.2:8080".parse().unwrap()
            ]
        );
        assert!(ready_addresses([&web].into_iter(), "grpc").is_empty());
        assert_eq!(endpoint_counts([&web, &fqdn].into_iter()), (2, 1));

        let draining = slice(serde_json::json!({
            "metadata": {"name": "web-def"},
            "addressType": "IPv6",
            "ports": [{"port": 8080}],
            "endpoints": [
                {"addresses": ["fd00::3"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["fd00::4"], "conditions": {"ready": false, "serving": false, "terminating": true}},
            ],
        }));
        assert_eq!(
            ready_addresses([&draining].into_iter(), ""),
            ["[fd00::3]:8080".parse::<SocketAddr>().unwrap()]
        );
    }

    /// An API server that refuses every connection: the watches fail.
    fn unreachable_cluster() -> ServiceEndpoints {
        // As `connect_client` does: two TLS providers are linked.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        ServiceEndpoints::new(client, "cluster.local", CancellationToken::new())
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_is_shown_and_the_name_dialled() {
        let pods = unreachable_cluster();
        assert_eq!(pods.lookup("web.shop.svc.cluster.local", 80), None);
        assert_eq!(pods.lookup("example.com", 80), None, "not a Service");
        for _ in 0..120 {
            if pods.report().first().is_some_and(|web| web.error.is_some()) {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let report = pods.report();
        assert_eq!(report.len(), 1, "{report:?}");
        let web = &report[0];
        assert_eq!((web.namespace.as_str(), web.name.as_str()), ("shop", "web"));
        assert!(!web.listed);
        let error = web.error.as_deref().unwrap();
        assert!(error.contains("endpointslices"), "{error}");
        assert_eq!((web.ready_endpoints, web.serving_endpoints), (0, 0));
        assert_eq!(pods.lookup("web.shop.svc", 80), None, "still unknown");
    }

    /// An API server that answers every request as one without RBAC for
    /// it does: 403 and a Status.
    async fn forbidding_cluster() -> ServiceEndpoints {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let forbid = || async {
            (
                axum::http::StatusCode::FORBIDDEN,
                axum::Json(serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Forbidden", "code": 403,
                    "message": "User \"system:serviceaccount:keda:hoist\" cannot list resource",
                })),
            )
        };
        tokio::spawn(axum::serve(listener, axum::Router::new().fallback(forbid)).into_future());
        let config = kube::Config::new(format!("http://{address}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        ServiceEndpoints::new(client, "cluster.local", CancellationToken::new())
    }

    #[tokio::test]
    async fn a_forbidden_watch_names_the_grant_it_needs() {
        let pods = forbidding_cluster().await;
        assert_eq!(pods.lookup("web.shop.svc", 80), None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while pods.report()[0].error.is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let web = &pods.report()[0];
        let error = web.error.as_deref().expect("the refusal is shown");
        assert!(
            error.contains("forbidden (403): grant hoist's ServiceAccount list/watch on endpointslices.discovery.k8s.io")
                || error.contains("forbidden (403): grant hoist's ServiceAccount list/watch on services (core API group)"),
            "{error}"
        );
        assert!(!web.listed);
        assert_eq!(pods.lookup("web.shop.svc", 80), None, "the name is dialled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_not_dialled_for_ten_minutes_is_let_go() {
        let pods = unreachable_cluster();
        let followed = |pods: &ServiceEndpoints| -> Vec<String> {
            pods.report().into_iter().map(|s| s.name).collect()
        };
        pods.lookup("web.shop.svc", 80);
        tokio::time::sleep(Duration::from_secs(6 * 60)).await;
        pods.lookup("api.shop.svc", 80);
        assert_eq!(followed(&pods), ["api", "web"]);
        tokio::time::sleep(IDLE - Duration::from_secs(6 * 60) + Duration::from_secs(1)).await;
        // The sweep runs on the next dial: web, idle for ten minutes, goes.
        pods.lookup("api.shop.svc", 80);
        assert_eq!(followed(&pods), ["api"]);
        let api = &pods.report()[0];
        assert_eq!(api.idle_seconds, 0.0);
        // Dialled again, it is followed again.
        pods.lookup("web.shop.svc", 80);
        assert_eq!(followed(&pods), ["api", "web"]);
    }
}
