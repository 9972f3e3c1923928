//! hoist: a KEDA external scaler with Azure Container Apps' scaling
//! behaviour. See docs/development.md for the map of the layers.

pub mod admin;
pub mod auth_profiles;
pub mod azure;
pub mod callers;
pub mod cluster;
pub mod config;
pub mod decide;
pub mod driver;
pub mod engine;
pub mod grpc;
pub mod interceptor;
pub mod listen;
pub mod logging;
pub mod metadata;
pub mod metrics;
pub mod observe_error;
pub mod persist;
pub mod probe;
pub mod reload;
pub mod routing;
#[path = "../scalers/mod.rs"]
pub mod scalers;
pub mod secret;
pub mod server;
pub mod simulate;
pub mod status;
pub mod tls;
pub mod token_file;
pub mod trigger;

/// The generated ExternalScaler contract (`proto/externalscaler.proto`).
pub mod proto {
    tonic::include_proto!("externalscaler");

    /// The encoded descriptors, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/externalscaler_descriptor.bin"));
}
