//! Routes: what they are (`spec`), and on the scaler's side, which
//! ScaledObject declared which one (`registry`) and what it may declare
//! (`policy`).

pub mod api;
pub mod declared;
pub mod registry;
pub mod spec;

pub use declared::DeclaredRoutes;
pub use registry::{DeclaredReport, Registry, RegistryReport, RouteError, RouteRules, RouteTable};
pub use spec::{Claim, Listen, Owner, Protocol, RouteSpec, normalized_prefix};
