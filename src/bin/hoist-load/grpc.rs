//! The gRPC client side the benchmarks share: channels to the scaler,
//! ScaledObjects as KEDA sends them, single calls and the first reads that
//! make the server track every object.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use hoist::proto::external_scaler_client::ExternalScalerClient;
use hoist::proto::{GetMetricsRequest, ScaledObjectRef};
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Method {
    GetMetrics,
    IsActive,
}

impl Method {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Method::GetMetrics => "GetMetrics",
            Method::IsActive => "IsActive",
        }
    }
}

pub(crate) async fn channels(target: &str, count: usize) -> anyhow::Result<Vec<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        channels.push(
            endpoint
                .connect()
                .await
                .with_context(|| format!("cannot connect to {target}"))?,
        );
    }
    Ok(channels)
}

pub(crate) fn scaled_object(name: String, metadata: &[(&str, &str)]) -> ScaledObjectRef {
    let mut scaler_metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // KEDA passes its own keys through; hoist ignores them.
    scaler_metadata.insert("scalerAddress".into(), "hoist.keda.svc:9090".into());
    ScaledObjectRef {
        name,
        namespace: "bench".into(),
        scaler_metadata,
    }
}

/// One call; Ok(()) or the gRPC status.
pub(crate) async fn call(
    client: &mut ExternalScalerClient<Channel>,
    method: Method,
    object: &ScaledObjectRef,
    metric_name: &str,
) -> Result<(), Status> {
    match method {
        Method::GetMetrics => client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(object.clone()),
                metric_name: metric_name.to_string(),
            })
            .await
            .map(|_| ()),
        Method::IsActive => client.is_active(object.clone()).await.map(|_| ()),
    }
}

/// Asks about every object once (the first read, which starts tracking
/// it), `parallel` at a time. Returns (errors, first error, time taken).
pub(crate) async fn register(
    channels: &[Channel],
    objects: Arc<Vec<ScaledObjectRef>>,
    metric_name: Option<Arc<Vec<String>>>,
    parallel: usize,
) -> (u64, Option<String>, Duration) {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..parallel.max(1) {
        let mut client = ExternalScalerClient::new(channels[worker % channels.len()].clone());
        let objects = objects.clone();
        let next = next.clone();
        let metric_name = metric_name.clone();
        tasks.push(tokio::spawn(async move {
            let mut errors = 0u64;
            let mut first = None;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(object) = objects.get(index) else {
                    break;
                };
                let name = metric_name
                    .as_ref()
                    .map(|names| names[index].as_str())
                    .unwrap_or("");
                if let Err(status) = call(&mut client, Method::GetMetrics, object, name).await {
                    errors += 1;
                    first.get_or_insert_with(|| {
                        format!("{:?}: {}", status.code(), status.message())
                    });
                }
            }
            (errors, first)
        }));
    }
    let mut errors = 0;
    let mut first = None;
    for task in tasks {
        if let Ok((e, f)) = task.await {
            errors += e;
            if first.is_none() {
                first = f;
            }
        }
    }
    (errors, first, started.elapsed())
}
