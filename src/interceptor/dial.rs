//! How an upstream is dialled: its name resolved (hoist's code-only host
//! table first; then, with `interceptor.direct_to_pods`, a Service's ready
//! pods as its EndpointSlices show them; then the system), the addresses
//! a declared route may not reach dropped (`interceptor.denied_networks`),
//! and the rest tried in turn.
//!
//! Who sends what: a declared route's upstream comes from trigger
//! metadata, i.e. from whoever may create a ScaledObject (or, without the
//! cluster checks, whoever reaches the gRPC port), and the name resolves
//! to whatever that namespace's DNS says (an ExternalName Service,
//! hand-written Endpoints). The name rules (`allowed_upstreams`) cannot
//! see where it points, so the addresses are checked here, on every new
//! connection: a name that resolves to an allowed address once and to
//! loopback the next time (DNS rebinding) is refused that next time.
//! Config-file routes are the operator's own and are not fenced.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use ipnet::IpNet;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::cluster::ServiceEndpoints;

use crate::config::{
    HostOverrides, InterceptorSettings, OWN_ADDRESSES, network_contains, parse_network,
};

/// The addresses a declared route's upstream may not connect to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fence {
    denied: Vec<IpNet>,
    /// `self` is listed: hoist's own addresses are denied too.
    own: bool,
}

impl From<&InterceptorSettings> for Fence {
    fn from(settings: &InterceptorSettings) -> Self {
        let own = settings
            .denied_networks
            .iter()
            .any(|entry| entry == OWN_ADDRESSES);
        // Entries were checked when the settings were loaded.
        let mut denied: Vec<IpNet> = settings
            .denied_networks
            .iter()
            .filter_map(|entry| parse_network(entry).ok())
            .collect();
        if own {
            // The pod's addresses as the downward API gives them: refused
            // before any connection is made. Any other address of this
            // network namespace is caught once connected (see `is_own`).
            denied.extend(pod_addresses().into_iter().map(IpNet::from));
        }
        Self { denied, own }
    }
}

/// `POD_IP` and `POD_IPS` (comma-separated), when set.
fn pod_addresses() -> Vec<IpAddr> {
    ["POD_IP", "POD_IPS"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .flat_map(|value| {
            value
                .split(',')
                .filter_map(|text| text.trim().parse().ok())
                .collect::<Vec<IpAddr>>()
        })
        .collect()
}

/// Why an address was not connected to (for the log).
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    pub address: IpAddr,
    pub why: &'static str,
}

const IN_DENIED_NETWORKS: &str = "it is in interceptor.denied_networks";
const OWN_ADDRESS: &str = "it is hoist's own address (`self` in interceptor.denied_networks)";

/// What a dial came to when it connected nowhere.
#[derive(Debug)]
pub enum DialError {
    /// Nothing usable: a lookup or every connection failed.
    Failed(String),
    /// Every address the name resolved to is denied.
    Denied(Denial),
}

/// How upstreams that name a Service are dialled: at its ready pods once
/// they are followed (`interceptor.direct_to_pods`), else at its address.
/// One per interceptor, read by every dialer and by
/// `GET /interceptor/services`.
#[derive(Default)]
pub struct PodDialling {
    endpoints: ArcSwapOption<ServiceEndpoints>,
    /// Asked for and not possible: why (the Services are dialled).
    unavailable: ArcSwapOption<String>,
}

impl PodDialling {
    /// From now on, upstreams naming a Service dial its ready pods as
    /// `endpoints` shows them.
    pub fn follow(&self, endpoints: ServiceEndpoints) {
        self.endpoints.store(Some(Arc::new(endpoints)));
        self.unavailable.store(None);
    }

    /// `interceptor.direct_to_pods` is on and cannot be honoured.
    pub fn unavailable(&self, why: &str) {
        self.unavailable.store(Some(Arc::new(why.to_string())));
    }

    pub fn endpoints(&self) -> Option<Arc<ServiceEndpoints>> {
        self.endpoints.load_full()
    }

    pub fn why_unavailable(&self) -> Option<String> {
        self.unavailable.load_full().map(|why| why.to_string())
    }
}

/// Resolves and connects one upstream. Cheap to clone.
#[derive(Clone, Default)]
pub struct Dialer {
    hosts: HostOverrides,
    /// `None`: a config-file route, not fenced.
    fence: Option<Arc<ArcSwap<Fence>>>,
    /// Where Services' ready pods are, once the interceptor follows them
    /// (`interceptor.direct_to_pods`); set after the routes are made.
    pods: Arc<PodDialling>,
}

impl Dialer {
    pub fn new(hosts: HostOverrides, fence: Option<Arc<ArcSwap<Fence>>>) -> Self {
        Self {
            hosts,
            fence,
            pods: Arc::default(),
        }
    }

    /// Dials a Service's ready pods once `pods` holds where they are.
    pub fn with_pods(mut self, pods: Arc<PodDialling>) -> Self {
        self.pods = pods;
        self
    }

    /// Changes whenever the pods behind `address` may have: `None` when
    /// it is not a Service whose pods are followed.
    pub fn pod_changes(&self, address: &str) -> Option<watch::Receiver<u64>> {
        let pods = self.pods.endpoints()?;
        let (host, _) = address.rsplit_once(':')?;
        pods.changes(host)
    }

    pub fn fenced(&self) -> bool {
        self.fence.is_some()
    }

    /// The addresses of `address` (`host:port`).
    pub async fn resolve(&self, address: &str) -> io::Result<Vec<SocketAddr>> {
        if let Ok(literal) = address.parse::<SocketAddr>() {
            return Ok(vec![literal]);
        }
        if let Some((host, port)) = address.rsplit_once(':')
            && let Ok(port) = port.parse::<u16>()
        {
            if let Some(found) = self.hosts.lookup(host) {
                return Ok(found
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect());
            }
            if let Some(pods) = self.pods.endpoints()
                && let Some(found) = pods.lookup(host, port)
            {
                return Ok(found);
            }
        }
        Ok(tokio::net::lookup_host(address).await?.collect())
    }

    /// Connects to the first of `addresses` that is allowed and accepts.
    pub async fn connect(&self, addresses: &[SocketAddr]) -> Result<TcpStream, DialError> {
        let fence = self.fence.as_ref().map(|fence| fence.load_full());
        let mut denied = None;
        let mut failed = None;
        for &address in addresses {
            if let Some(fence) = &fence
                && network_contains(&fence.denied, address.ip())
            {
                denied.get_or_insert(Denial {
                    address: address.ip(),
                    why: IN_DENIED_NETWORKS,
                });
                continue;
            }
            match TcpStream::connect(address)
                .await
                .and_then(refuse_self_connection)
            {
                // Dropped unused: nothing was written on it.
                Ok(stream) if fence.as_ref().is_some_and(|f| f.own) && is_own(&stream) => {
                    denied.get_or_insert(Denial {
                        address: address.ip(),
                        why: OWN_ADDRESS,
                    });
                }
                Ok(stream) => return Ok(stream),
                Err(error) => failed = Some(error.to_string()),
            }
        }
        // An upstream with a reachable-but-down address is starting, not
        // refused: it is held like any cold start.
        match (failed, denied) {
            (Some(error), _) => Err(DialError::Failed(error)),
            (None, Some(denial)) => Err(DialError::Denied(denial)),
            (None, None) => Err(DialError::Failed(
                "no address to connect to (no ready pod, or the name resolves to nothing)"
                    .to_string(),
            )),
        }
    }
}

/// Whether a connection reached this network namespace's own address:
/// the kernel then picks that very address as the source (any address of
/// a local interface, not only the pod IP the environment names).
fn is_own(stream: &TcpStream) -> bool {
    let canonical = |ip: IpAddr| ip.to_canonical();
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => canonical(local.ip()) == canonical(peer.ip()),
        _ => false,
    }
}

/// A local upstream whose port is in the ephemeral range and has nothing
/// listening can be "reached" by the kernel picking that very port as the
/// source (a TCP simultaneous open with itself): the gate would open and
/// the proxy would read its own requests back as the app's answers. Such
/// a connection counts as refused, and the next address is tried, as for
/// any refusal.
pub fn refuse_self_connection(stream: TcpStream) -> io::Result<TcpStream> {
    if stream.local_addr()? == stream.peer_addr()? {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "nothing listens on the port (the connection reached itself)",
        ));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn fence(entries: &[&str]) -> Option<Arc<ArcSwap<Fence>>> {
        let settings = InterceptorSettings {
            denied_networks: entries.iter().map(|e| e.to_string()).collect(),
            ..InterceptorSettings::default()
        };
        Some(Arc::new(ArcSwap::from_pointee(Fence::from(&settings))))
    }

    #[tokio::test]
    async fn own_addresses_are_caught_once_connected() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = listener.local_addr().unwrap();
        // Connecting to 127.0.0.1 from 127.0.0.1: an address of our own.
        let dialer = Dialer::new(HostOverrides::default(), fence(&[OWN_ADDRESSES]));
        match dialer.connect(&[app]).await {
            Err(DialError::Denied(denial)) => assert_eq!(denial.why, OWN_ADDRESS),
            other => panic!("{other:?}"),
        }
        // Not fenced (a config route): connected.
        let open = Dialer::default().connect(&[app]).await;
        assert!(open.is_ok(), "{open:?}");
    }

    #[tokio::test]
    async fn a_denied_address_is_skipped_for_the_next() {
        let listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let allowed = listener.local_addr().unwrap();
        let denied = SocketAddr::new([127, 0, 0, 1].into(), allowed.port());
        let dialer = Dialer::new(HostOverrides::default(), fence(&["127.0.0.1"]));
        let stream = dialer.connect(&[denied, allowed]).await.unwrap();
        assert_eq!(stream.peer_addr().unwrap(), allowed);
        match dialer.connect(&[denied]).await {
            Err(DialError::Denied(denial)) => {
                assert_eq!(denial.address, denied.ip());
                assert_eq!(denial.why, IN_DENIED_NETWORKS);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_host_table_answers_before_the_system() {
        let hosts = HostOverrides::new(|host| {
            (host == "app.test").then(|| vec!["192.0.2.1".parse().unwrap()])
        });
        let dialer = Dialer::new(hosts, None);
        let found = dialer.resolve("app.test:8080").await.unwrap();
        assert_eq!(found, ["192.0.2.1:8080".parse().unwrap()]);
        let literal = dialer.resolve("[::1]:80").await.unwrap();
        assert_eq!(literal, ["[::1]:80".parse().unwrap()]);
    }
}
