//! Why a trigger is not tracked: the driver's one error type at its
//! boundary (mapped to gRPC codes in `grpc/status.rs`).

use std::time::Duration;

use crate::cluster::TriggerAuthError;
use crate::metadata::MetadataError;
use crate::routing::RouteError;

/// Why a trigger is not tracked.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    #[error("bad trigger metadata: {0}")]
    Metadata(#[from] MetadataError),
    #[error(
        "the trigger's metadata is {size} bytes; hoist accepts at most {limit} (limits.max_metadata_bytes)"
    )]
    MetadataTooLarge { size: usize, limit: usize },
    #[error(
        "ScaledObject {namespace}/{name}: hoist already tracks {limit} triggers (limits.max_tracked_triggers); idle ones are dropped after polling.idle_after"
    )]
    TooManyTriggers {
        namespace: String,
        name: String,
        limit: usize,
    },
    #[error(
        "ScaledObject {namespace}/{name}: hoist already tracks {limit} triggers in namespace {namespace} (limits.max_tracked_triggers_per_namespace); idle ones are dropped after polling.idle_after"
    )]
    TooManyInNamespace {
        namespace: String,
        name: String,
        limit: usize,
    },
    /// Values of `FromEnv` keys are the caller's word: a new one takes the
    /// trigger over only once the old one is no longer asked, which
    /// KEDA's own calls keep doing while they carry it.
    #[error(
        "ScaledObject {namespace}/{name}: this trigger is tracked already with other values of its `FromEnv` keys, asked {asked_ago:?} ago; one trigger of a ScaledObject is one tracked trigger (the limit), and new values replace the old only once those go unasked for {quiet:?}"
    )]
    TriggerHeld {
        namespace: String,
        name: String,
        asked_ago: Duration,
        quiet: Duration,
    },
    #[error(
        "the triggers hoist tracks already hold {limit} bytes of metadata (limits.max_tracked_metadata_bytes); idle ones are dropped after polling.idle_after"
    )]
    MetadataBudget { limit: usize },
    #[error("`{endpoint}` is not among hoist's allowed sources (limits.allowed_sources)")]
    SourceNotAllowed { endpoint: String },
    #[error("bad trigger metadata: {0}")]
    Route(#[from] RouteError),
    #[error("{0}")]
    TriggerAuth(#[from] TriggerAuthError),
    #[error("`{key}`: {reason} ({setting})")]
    NotLent {
        key: String,
        setting: &'static str,
        reason: String,
    },
}
