//! The cached outcome of a source's latest poll.

use std::time::Duration;

use tokio::time::Instant;

use crate::scalers::ObserveError;

/// What the latest poll of a source found.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// The first measurement has not finished yet.
    Pending,
    /// The latest poll succeeded: the value reported, and the value that
    /// decides activity (the same for most triggers).
    Value {
        value: f64,
        activity: f64,
        at: Instant,
    },
    /// The latest poll failed. The last good value is kept for `/status`
    /// and error messages, never reported as current: a stale value could
    /// be lower than the truth and scale an app down.
    Failed {
        error: PollError,
        at: Instant,
        consecutive_failures: u32,
        last_value: Option<(f64, Instant)>,
    },
}

impl Reading {
    pub fn value(&self) -> Option<f64> {
        match self {
            Reading::Value { value, .. } => Some(*value),
            _ => None,
        }
    }

    /// The value that decides activity, when the latest poll succeeded.
    pub fn activity(&self) -> Option<f64> {
        match self {
            Reading::Value { activity, .. } => Some(*activity),
            _ => None,
        }
    }

    /// The most recent good value, even if a later poll failed.
    pub fn last_value(&self) -> Option<(f64, Instant)> {
        match self {
            Reading::Value { value, at, .. } => Some((*value, *at)),
            Reading::Failed { last_value, .. } => *last_value,
            Reading::Pending => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PollError {
    #[error(transparent)]
    Observe(#[from] ObserveError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("no longer polled (hoist is shutting down)")]
    Stopped,
}
