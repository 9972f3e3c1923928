//! The one place where hoist's errors become gRPC statuses.

use std::time::Duration;

use tonic::{Code, Status};

use crate::callers::CallerError;
use crate::cluster::TriggerAuthError;
use crate::driver::{PollError, Reading, TrackError};
use crate::metadata::MetadataError;
use crate::routing::RouteError;

/// Everything an ExternalScaler call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error(transparent)]
    Caller(#[from] CallerError),
    #[error(transparent)]
    Track(#[from] TrackError),
    #[error("{source_description}: {error}{last}")]
    SourceFailing {
        source_description: String,
        error: PollError,
        consecutive_failures: u32,
        /// " (last good value 4 at 12s ago)" or empty.
        last: String,
    },
    #[error(
        "{source_description}: no reading yet: the first measurement is still running after {timeout:?} (it goes on; ask again)"
    )]
    NoReadingYet {
        source_description: String,
        timeout: Duration,
    },
    #[error(
        "ScaledObject {scaled_object}: the engine has no decision yet: no trigger produced a reading within {timeout:?}"
    )]
    NoDecisionYet {
        scaled_object: String,
        timeout: Duration,
    },
    /// Engine mode without a known replica count: KEDA keeps its count.
    #[error("{0}")]
    CountUnknown(String),
    #[error("metric `{asked}` is not served by this trigger; it serves `{served}`")]
    UnknownMetric { asked: String, served: String },
    #[error("hoist is shutting down")]
    ShuttingDown,
}

impl RpcError {
    /// The error for a reading that holds no current value.
    pub fn from_reading(reading: &Reading, source_description: &str, timeout: Duration) -> Self {
        match reading {
            Reading::Failed {
                error,
                consecutive_failures,
                last_value,
                ..
            } => Self::SourceFailing {
                source_description: source_description.to_string(),
                error: error.clone(),
                consecutive_failures: *consecutive_failures,
                last: match last_value {
                    Some((value, at)) => format!(
                        " (last good value {value} read {}s ago)",
                        at.elapsed().as_secs()
                    ),
                    None => String::new(),
                },
            },
            _ => Self::NoReadingYet {
                source_description: source_description.to_string(),
                timeout,
            },
        }
    }

    pub fn code(&self) -> Code {
        match self {
            RpcError::Caller(
                CallerError::BadName { .. } | CallerError::BadAuthenticationRef { .. },
            ) => Code::InvalidArgument,
            RpcError::Track(TrackError::TriggerAuth(TriggerAuthError::NotSynced { .. })) => {
                Code::Unavailable
            }
            RpcError::Track(TrackError::TriggerAuth(_)) => Code::FailedPrecondition,
            RpcError::Track(TrackError::NotLent { .. }) => Code::PermissionDenied,
            RpcError::Caller(CallerError::NoScaledObject { .. } | CallerError::Mismatch { .. }) => {
                Code::PermissionDenied
            }
            RpcError::Caller(CallerError::Unchecked(_)) => Code::Unavailable,
            RpcError::Track(TrackError::Metadata(MetadataError::AuthProfile { .. })) => {
                Code::FailedPrecondition
            }
            RpcError::Track(TrackError::Metadata(MetadataError::AuthProfileDenied { .. })) => {
                Code::PermissionDenied
            }
            RpcError::Track(TrackError::Metadata(_)) => Code::InvalidArgument,
            RpcError::Track(
                TrackError::MetadataTooLarge { .. }
                | TrackError::TooManyTriggers { .. }
                | TrackError::TooManyInNamespace { .. }
                | TrackError::MetadataBudget { .. },
            ) => Code::ResourceExhausted,
            RpcError::Track(
                TrackError::SourceNotAllowed { .. } | TrackError::Route(RouteError::Denied { .. }),
            ) => Code::PermissionDenied,
            RpcError::Track(TrackError::Route(
                RouteError::Taken { .. } | RouteError::Unservable { .. },
            )) => Code::InvalidArgument,
            RpcError::Track(TrackError::Route(RouteError::Pending { .. }))
            | RpcError::Track(TrackError::TriggerHeld { .. })
            | RpcError::SourceFailing { .. }
            | RpcError::NoReadingYet { .. }
            | RpcError::NoDecisionYet { .. }
            | RpcError::CountUnknown(_) => Code::Unavailable,
            RpcError::UnknownMetric { .. } => Code::NotFound,
            RpcError::ShuttingDown => Code::Unavailable,
        }
    }
}

impl From<RpcError> for Status {
    fn from(error: RpcError) -> Self {
        Status::new(error.code(), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let invalid = RpcError::from(TrackError::from(MetadataError::invalid(
            "listLength",
            "`x` is not an integer",
        )));
        let status = Status::from(invalid);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "bad trigger metadata: invalid `listLength`: `x` is not an integer"
        );
        let profile = RpcError::from(TrackError::from(MetadataError::AuthProfile {
            profile: "p".into(),
            reason: "r".into(),
        }));
        assert_eq!(profile.code(), Code::FailedPrecondition);
        let borrowed = RpcError::from(TrackError::from(MetadataError::AuthProfileDenied {
            profile: "orders-redis".into(),
            namespace: "shop".into(),
        }));
        assert_eq!(borrowed.code(), Code::PermissionDenied);
        let crowded = RpcError::from(TrackError::TooManyTriggers {
            namespace: "ns".into(),
            name: "app".into(),
            limit: 3,
        });
        assert_eq!(crowded.code(), Code::ResourceExhausted);
        let namespace_full = RpcError::from(TrackError::TooManyInNamespace {
            namespace: "ns".into(),
            name: "app".into(),
            limit: 3,
        });
        assert_eq!(namespace_full.code(), Code::ResourceExhausted);
        // Transient: KEDA's next call with the new value may take over.
        let held = RpcError::from(TrackError::TriggerHeld {
            namespace: "ns".into(),
            name: "app".into(),
            asked_ago: std::time::Duration::from_secs(1),
            quiet: std::time::Duration::from_secs(75),
        });
        assert_eq!(held.code(), Code::Unavailable);
        let refused = RpcError::from(TrackError::SourceNotAllowed {
            endpoint: "evil:6379".into(),
        });
        assert_eq!(refused.code(), Code::PermissionDenied);
        let denied = RpcError::from(TrackError::from(RouteError::Denied {
            key: "upstream",
            setting: "interceptor.allowed_upstreams",
            reason: "`db.other.svc.cluster.local:5432` is not allowed".into(),
        }));
        assert_eq!(denied.code(), Code::PermissionDenied);
        assert!(
            denied
                .to_string()
                .contains("(interceptor.allowed_upstreams)")
        );
        let taken = RpcError::from(TrackError::from(RouteError::Taken {
            key: "host",
            claim: "host `a.example.com`".into(),
            holder: "ScaledObject shop/web".into(),
        }));
        assert_eq!(taken.code(), Code::InvalidArgument);
        assert!(taken.to_string().contains("ScaledObject shop/web"));
        let pending = RpcError::from_reading(
            &Reading::Pending,
            "redis list `a` on b:1 db 0",
            Duration::from_secs(3),
        );
        assert_eq!(pending.code(), Code::Unavailable);
        assert!(
            pending
                .to_string()
                .starts_with("redis list `a` on b:1 db 0: no reading yet")
        );
    }
}
