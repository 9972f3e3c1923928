//! Why a measurement failed: what every source hoist reads returns (the
//! triggers in `scalers/`, and the parts they read through: the
//! interceptor's traffic counts, Azure's management API). It sits below
//! all of them, so none needs another's module for it.

/// Why a measurement failed. Messages never contain secrets.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObserveError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("credentials refused: {0}")]
    Auth(String),
    #[error("query failed: {0}")]
    Query(String),
    #[error("unusable configuration: {0}")]
    Config(String),
}
