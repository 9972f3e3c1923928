//! Address lists of `[interceptor]`: `denied_networks` (where a declared
//! route's upstream may not connect) and `trusted_proxies` (whose
//! forwarded headers are believed), and the code-only name table the
//! interceptor resolves upstreams with before asking the system.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

/// The entry of `denied_networks` that stands for hoist's own addresses.
pub const OWN_ADDRESSES: &str = "self";

/// `interceptor.denied_networks` by default: loopback, link-local (cloud
/// metadata at 169.254.169.254 included), unspecified (which Linux
/// connects to the host itself), the IPv6 metadata endpoints clouds use
/// outside link-local, and hoist's own addresses.
pub fn default_denied_networks() -> Vec<String> {
    [
        "127.0.0.0/8",
        "::1/128",
        "169.254.0.0/16",
        "fe80::/10",
        "0.0.0.0/8",
        "::/128",
        "fd00:ec2::254/128",
        OWN_ADDRESSES,
    ]
    .map(String::from)
    .to_vec()
}

/// One entry of a network list: `10.0.0.0/8`, `fd00::/8`, or a single
/// address (`192.0.2.7`, a /32 or /128).
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{text}` is not an address or a CIDR network (`10.0.0.0/8`)"))
}

/// Whether `address` is in one of `networks`. An IPv4 address is also
/// looked up in its IPv4-mapped IPv6 form and the other way round, so
/// `::ffff:127.0.0.1` is loopback like `127.0.0.1`.
pub fn contains(networks: &[IpNet], address: IpAddr) -> bool {
    let other = match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
        IpAddr::V4(v4) => Some(IpAddr::V6(v4.to_ipv6_mapped())),
    };
    networks
        .iter()
        .any(|net| net.contains(&address) || other.is_some_and(|other| net.contains(&other)))
}

type Lookup = dyn Fn(&str) -> Option<Vec<IpAddr>> + Send + Sync;

/// Names the interceptor resolves without asking the system: a lookup
/// that answers `Some(addresses)` for the names it knows. Set from code
/// only (tests, embedding), never from a file or the environment; each
/// new upstream connection asks it again, so a test can change an answer
/// between connections as a rebinding DNS server would.
#[derive(Clone, Default)]
pub struct HostOverrides(Option<Arc<Lookup>>);

impl HostOverrides {
    pub fn new(lookup: impl Fn(&str) -> Option<Vec<IpAddr>> + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(lookup)))
    }

    /// The addresses of `host`, when the table knows it.
    pub fn lookup(&self, host: &str) -> Option<Vec<IpAddr>> {
        self.0.as_ref().and_then(|lookup| lookup(host))
    }
}

impl PartialEq for HostOverrides {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl fmt::Debug for HostOverrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "HostOverrides(set)"
        } else {
            "HostOverrides(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_match_their_ipv4_networks_and_back() {
        let nets: Vec<IpNet> = ["127.0.0.0/8", "::ffff:10.0.0.0/104"]
            .iter()
            .map(|n| parse_network(n).unwrap())
            .collect();
        let yes = [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "10.1.2.3",
            "::ffff:10.1.2.3",
        ];
        for address in yes {
            assert!(contains(&nets, address.parse().unwrap()), "{address}");
        }
        for address in ["192.0.2.1", "::ffff:192.0.2.1", "::2"] {
            assert!(!contains(&nets, address.parse().unwrap()), "{address}");
        }
    }

    #[test]
    fn single_addresses_and_bad_entries() {
        assert_eq!(
            parse_network("192.0.2.7").unwrap(),
            "192.0.2.7/32".parse::<IpNet>().unwrap()
        );
        let error = parse_network("10.0.0.0/33").unwrap_err();
        assert!(error.contains("`10.0.0.0/33`"), "{error}");
        assert!(parse_network("self").is_err(), "a keyword, not a network");
        for entry in default_denied_networks() {
            assert!(entry == OWN_ADDRESSES || parse_network(&entry).is_ok());
        }
    }
}
