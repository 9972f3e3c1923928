//! Which route a trigger measures: by its name, or by a host it serves.

/// Which route a trigger measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteSelector {
    Name(String),
    /// The HTTP route serving this host (lower case).
    Host(String),
}

impl RouteSelector {
    pub fn selects(&self, name: &str, hosts: &[String]) -> bool {
        match self {
            RouteSelector::Name(wanted) => wanted == name,
            RouteSelector::Host(wanted) => hosts.iter().any(|host| host == wanted),
        }
    }

    pub(crate) fn wake_key(&self) -> String {
        match self {
            RouteSelector::Name(name) => format!("route:{name}"),
            RouteSelector::Host(host) => format!("host:{host}"),
        }
    }
}
