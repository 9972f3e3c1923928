//! What a route is, as every part that handles routes sees it: hoist's
//! config file, a ScaledObject's trigger metadata, the state file and the
//! route table the scaler serves to interceptors all carry [`RouteSpec`]s.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http,
    Tcp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Http => "http",
            Protocol::Tcp => "tcp",
        })
    }
}

/// The ScaledObject that declared a route in its trigger metadata.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScaledObject {}/{}", self.namespace, self.name)
    }
}

/// One route: which traffic it takes and where that traffic goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// What `route:` names; a declared route is `http/<namespace>/<name>`
    /// (or `tcp/...`), which no config route can be (no `/` there).
    pub name: String,
    pub protocol: Protocol,
    /// None: hoist's config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// HTTP: the hosts served, lower case, without a port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// HTTP: only paths at or under this prefix (whole segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// TCP: where the route listens. A declared route names a port only
    /// and listens on the interceptor's `http_listen` address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Listen>,
    /// `host:port` the traffic goes to.
    pub upstream: String,
    #[serde(default)]
    pub upstream_http2: bool,
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub cold_start_timeout: Option<Duration>,
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub response_timeout: Option<Duration>,
}

/// Where a TCP route listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Listen {
    /// An address of its own (config routes).
    Address(SocketAddr),
    /// A port on the interceptor's listening address (declared routes).
    Port(u16),
}

impl Listen {
    /// The socket address to bind, given the interceptor's HTTP address.
    pub fn resolve(self, http_listen: SocketAddr) -> SocketAddr {
        match self {
            Listen::Address(address) => address,
            Listen::Port(port) => SocketAddr::new(http_listen.ip(), port),
        }
    }

    pub fn port(self) -> u16 {
        match self {
            Listen::Address(address) => address.port(),
            Listen::Port(port) => port,
        }
    }
}

/// What a route takes: an HTTP host and path prefix, or a TCP port. Two
/// routes may not make the same claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Claim {
    Http { host: String, path_prefix: String },
    Tcp { port: u16 },
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Http { host, path_prefix } if path_prefix.is_empty() => {
                write!(f, "host `{host}`")
            }
            Claim::Http { host, path_prefix } => {
                write!(f, "host `{host}` with path prefix `{path_prefix}`")
            }
            Claim::Tcp { port } => write!(f, "TCP port {port}"),
        }
    }
}

impl RouteSpec {
    /// The name of the route a ScaledObject declares for a protocol.
    pub fn declared_name(protocol: Protocol, owner: &Owner) -> String {
        format!("{protocol}/{}/{}", owner.namespace, owner.name)
    }

    /// The claims this route makes.
    pub fn claims(&self) -> Vec<Claim> {
        match self.protocol {
            Protocol::Http => {
                let prefix = normalized_prefix(self.path_prefix.as_deref());
                self.hosts
                    .iter()
                    .map(|host| Claim::Http {
                        host: fold_host(host),
                        path_prefix: prefix.to_string(),
                    })
                    .collect()
            }
            Protocol::Tcp => self
                .listen
                .map(|listen| Claim::Tcp {
                    port: listen.port(),
                })
                .into_iter()
                .collect(),
        }
    }

    /// What another owner may not share with this route: its hosts
    /// (whatever the path prefix: a ScaledObject must not carve a path out
    /// of a host another one serves) or its TCP port.
    pub fn exclusive_claims(&self) -> Vec<Claim> {
        self.claims()
            .into_iter()
            .map(|claim| match claim {
                Claim::Http { host, .. } => Claim::Http {
                    host,
                    path_prefix: String::new(),
                },
                tcp => tcp,
            })
            .collect()
    }

    /// Who made this route, for messages.
    pub fn origin(&self) -> String {
        match &self.owner {
            Some(owner) => owner.to_string(),
            None => format!("hoist's config (route `{}`)", self.name),
        }
    }
}

/// A host as claims compare it: lower case, without the trailing dot of
/// a fully qualified name (`Shop.Example.com.` is `shop.example.com`).
pub fn fold_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// A path prefix as routes compare them: no trailing `/`, so `/api` and
/// `/api/` are one claim and `/` is the whole host.
pub fn normalized_prefix(prefix: Option<&str>) -> &str {
    prefix.unwrap_or("").trim_end_matches('/')
}
