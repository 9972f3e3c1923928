//! hoist's own Prometheus metrics. Per-trigger values are not stored here:
//! the driver's `TriggerValues` collector reads them from
//! the cache at scrape time.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub method: &'static str,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub scaler: &'static str,
    /// The source's description, which never holds a secret.
    pub source: std::sync::Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScalerLabels {
    pub scaler: &'static str,
}

/// What every hoist process exports, whatever its mode: dashboards list
/// pods from it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    /// `scaler` (gRPC, no interceptor), `in-process` (gRPC and the
    /// interceptor in one process) or `interceptor` (`hoist interceptor`).
    pub mode: &'static str,
}

/// Registers `hoist_build_info{version, mode} 1`. Its labels are the only
/// ones every process has, so none collides with a target label.
pub fn register_build_info(registry: &mut Registry, mode: &'static str) {
    let info: Family<BuildLabels, Gauge> = Family::default();
    info.get_or_create(&BuildLabels {
        version: env!("CARGO_PKG_VERSION"),
        mode,
    })
    .set(1);
    registry.register(
        "hoist_build_info",
        "1, labelled with hoist's version and how the process runs (mode: scaler, in-process, interceptor)",
        info,
    );
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Debug)]
pub struct Metrics {
    pub rpc_requests: Family<RpcLabels, Counter>,
    pub rpc_latency: HistogramFamily<MethodLabels>,
    pub poll_errors: Family<SourceLabels, Counter>,
    pub poll_duration: HistogramFamily<ScalerLabels>,
    pub pollers: Gauge,
    pub tracked_triggers: Gauge,
    pub open_streams: Gauge,
    /// Engine evaluations by the reason of their answer.
    pub engine_decisions: Family<ReasonLabels, Counter>,
    /// Tracked triggers stopped because they are no longer allowed, by
    /// why (`cluster`: their ScaledObject no longer has them; `reload`:
    /// the reloaded config forbids them).
    pub revoked_triggers: Family<ReasonLabels, Counter>,
    /// Saves of `state_file` that failed.
    pub state_save_failures: Counter,
    /// ScaledObjects calling hoist that KEDA has not set up (no HPA).
    pub keda_unreconciled: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

fn rpc_histogram() -> Histogram {
    // 5 µs to ~5 s: cache answers sit at the bottom, first reads at the top.
    Histogram::new(exponential_buckets(0.000_005, 4.0, 11))
}

fn poll_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 4.0, 10))
}

impl Metrics {
    /// Counts a tracked trigger stopped for `reason`.
    pub fn revoked(&self, reason: &str) {
        self.revoked_triggers
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn new() -> Self {
        Self {
            rpc_requests: Family::default(),
            rpc_latency: Family::new_with_constructor(rpc_histogram),
            poll_errors: Family::default(),
            poll_duration: Family::new_with_constructor(poll_histogram),
            pollers: Gauge::default(),
            tracked_triggers: Gauge::default(),
            open_streams: Gauge::default(),
            engine_decisions: Family::default(),
            revoked_triggers: Family::default(),
            state_save_failures: Counter::default(),
            keda_unreconciled: Gauge::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "hoist_grpc_requests",
            "ExternalScaler requests by method and gRPC status code",
            self.rpc_requests.clone(),
        );
        registry.register(
            "hoist_grpc_request_duration_seconds",
            "ExternalScaler request latency by method (for StreamIsActive: time to open the stream)",
            self.rpc_latency.clone(),
        );
        registry.register(
            "hoist_poll_errors",
            "Failed source polls (errors and timeouts) by source",
            self.poll_errors.clone(),
        );
        registry.register(
            "hoist_poll_duration_seconds",
            "Time taken by one source poll, by scaler",
            self.poll_duration.clone(),
        );
        registry.register(
            "hoist_pollers",
            "Background pollers running (one per distinct source query)",
            self.pollers.clone(),
        );
        registry.register(
            "hoist_tracked_triggers",
            "ScaledObject triggers hoist is tracking",
            self.tracked_triggers.clone(),
        );
        registry.register(
            "hoist_engine_decisions",
            "Engine evaluations by the reason of their answer (CountUnknown: answered Unavailable)",
            self.engine_decisions.clone(),
        );
        registry.register(
            "hoist_state_save_failures",
            "Saves of the engine state file (state_file) that failed; the first of a run of failures is logged",
            self.state_save_failures.clone(),
        );
        registry.register(
            "hoist_revoked_triggers",
            "Tracked triggers stopped because they are no longer allowed (reason: cluster, reload)",
            self.revoked_triggers.clone(),
        );
        registry.register(
            "hoist_keda_unreconciled_scaledobjects",
            "ScaledObjects calling hoist that KEDA marks Ready=False/ScaledObjectCheckFailed and has made no HPA for (kedacore/keda#5787)",
            self.keda_unreconciled.clone(),
        );
        registry.register(
            "hoist_open_streams",
            "StreamIsActive and StreamMetricSpec streams open now",
            self.open_streams.clone(),
        );
    }

    /// One method's request metrics, resolved once, so that recording a
    /// successful call takes no lock on a family and no label formatting.
    pub fn rpc(&self, method: &'static str) -> RpcMetrics {
        RpcMetrics {
            method,
            ok: self
                .rpc_requests
                .get_or_create(&RpcLabels {
                    method,
                    code: format!("{:?}", tonic::Code::Ok),
                })
                .clone(),
            latency: self
                .rpc_latency
                .get_or_create(&MethodLabels { method })
                .clone(),
            requests: self.rpc_requests.clone(),
        }
    }
}

/// The metrics of one ExternalScaler method (see [`Metrics::rpc`]).
#[derive(Clone, Debug)]
pub struct RpcMetrics {
    method: &'static str,
    ok: Counter,
    latency: Histogram,
    requests: Family<RpcLabels, Counter>,
}

impl RpcMetrics {
    pub fn method(&self) -> &'static str {
        self.method
    }

    pub fn record(&self, code: tonic::Code, elapsed: Duration) {
        if code == tonic::Code::Ok {
            self.ok.inc();
        } else {
            self.requests
                .get_or_create(&RpcLabels {
                    method: self.method,
                    code: format!("{code:?}"),
                })
                .inc();
        }
        self.latency.observe(elapsed.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
