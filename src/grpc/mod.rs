//! The KEDA ExternalScaler service, answered from the driver's cache.

pub mod edge;
mod status;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};
use tracing::debug;

pub use status::RpcError;

use crate::callers::CallerPolicy;
use crate::driver::{Answer, Driver, Reading, TrackError, Tracked, TriggerKey};
use crate::metrics::{Metrics, RpcMetrics};
use crate::proto::external_scaler_server::ExternalScaler;
use crate::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use crate::routing::RouteError;

pub struct ScalerService {
    triggers: Triggers,
    open_streams: prometheus_client::metrics::gauge::Gauge,
    is_active: RpcMetrics,
    stream_is_active: RpcMetrics,
    get_metric_spec: RpcMetrics,
    stream_metric_spec: RpcMetrics,
    get_metrics: RpcMetrics,
}

/// Finds the tracked trigger a call is about; cloned into the streams,
/// which look their trigger up again when it moves.
#[derive(Clone)]
struct Triggers {
    driver: Driver,
    callers: CallerPolicy,
}

impl ScalerService {
    pub fn new(driver: Driver, callers: CallerPolicy, metrics: Arc<Metrics>) -> Self {
        Self {
            triggers: Triggers { driver, callers },
            open_streams: metrics.open_streams.clone(),
            is_active: metrics.rpc("IsActive"),
            stream_is_active: metrics.rpc("StreamIsActive"),
            get_metric_spec: metrics.rpc("GetMetricSpec"),
            stream_metric_spec: metrics.rpc("StreamMetricSpec"),
            get_metrics: metrics.rpc("GetMetrics"),
        }
    }

    async fn track(&self, object: ScaledObjectRef) -> Result<Arc<Tracked>, RpcError> {
        self.triggers.track(object).await
    }

    /// What hoist reports for the trigger: the raw value in passthrough
    /// mode; in engine mode `replicas × target`, so that the HPA's
    /// `ceil(value / target)` lands on the engine's count (on the way to
    /// zero, the count still running: zero is KEDA's step).
    async fn reported(&self, tracked: &Tracked) -> Result<(f64, bool), RpcError> {
        if tracked.scaling.is_some() {
            let decision = self.decision(tracked).await?;
            let value = decision.reported_replicas() as f64 * tracked.config.trigger.target;
            return Ok((value, decision.active));
        }
        let (value, activity) = self.value(tracked).await?;
        Ok((value, tracked.is_active(activity)))
    }

    async fn decision(&self, tracked: &Tracked) -> Result<crate::engine::Decision, RpcError> {
        match tracked.answer().await {
            Some(Answer::Decided(decision)) => Ok(decision),
            Some(Answer::CountUnknown(reason)) => Err(RpcError::CountUnknown(reason)),
            None => Err(RpcError::NoDecisionYet {
                scaled_object: format!("{}/{}", tracked.key.namespace, tracked.key.name),
                timeout: tracked.config.timeout,
            }),
        }
    }

    /// The current value, or why there is none.
    async fn value(&self, tracked: &Tracked) -> Result<(f64, f64), RpcError> {
        let reading = tracked.current().await;
        reading.value().zip(reading.activity()).ok_or_else(|| {
            RpcError::from_reading(
                &reading,
                &tracked.config.trigger.query.description,
                tracked.first_wait(),
            )
        })
    }

    fn finish<T>(
        metrics: &RpcMetrics,
        started: Instant,
        result: Result<T, RpcError>,
    ) -> Result<Response<T>, Status> {
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(error) => error.code(),
        };
        metrics.record(code, started.elapsed());
        match result {
            Ok(answer) => Ok(Response::new(answer)),
            Err(error) => {
                debug!(method = metrics.method(), %error, "request failed");
                Err(error.into())
            }
        }
    }
}

impl Triggers {
    /// The tracked trigger; a new one only for a caller that may have it
    /// (see [`crate::callers`]).
    async fn track(&self, object: ScaledObjectRef) -> Result<Arc<Tracked>, RpcError> {
        let key = TriggerKey::new(object.namespace, object.name, object.scaler_metadata);
        if let Some(tracked) = self.driver.lookup(&key)? {
            return Ok(tracked);
        }
        let caller = self
            .callers
            .check(&key.namespace, &key.name, &key.metadata_map())
            .await?;
        // A route of a ScaledObject the watch just brought is decided a
        // moment after the caller check sees it: wait for that decision.
        let deadline = tokio::time::Instant::now() + self.callers.wait();
        let mut decisions = self.driver.routes().map(|routes| routes.decisions());
        loop {
            if let Some(decisions) = &mut decisions {
                decisions.borrow_and_update();
            }
            match self.driver.track(key.clone(), &caller) {
                Err(TrackError::Route(RouteError::Pending { .. }))
                    if tokio::time::Instant::now() < deadline
                        && let Some(decisions) = &mut decisions =>
                {
                    let _ = tokio::time::timeout_at(deadline, decisions.changed()).await;
                }
                other => return Ok(other?),
            }
        }
    }
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;
type SpecStream = Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for ScalerService {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let started = Instant::now();
        let result = async {
            let tracked = self.track(request.into_inner()).await?;
            let (_, active) = self.reported(&tracked).await?;
            Ok(IsActiveResponse { result: active })
        }
        .await;
        Self::finish(&self.is_active, started, result)
    }

    type StreamIsActiveStream = ActivityStream;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let started = Instant::now();
        let result = self.track(request.into_inner()).await.map(|tracked| {
            let (sender, receiver) = mpsc::channel(4);
            let open = OpenStream::new(self.open_streams.clone());
            let driver = self.triggers.driver.clone();
            tokio::spawn(async move {
                push_activation_edges(tracked, driver, sender).await;
                drop(open);
            });
            Box::pin(ReceiverStream::new(receiver)) as ActivityStream
        });
        Self::finish(&self.stream_is_active, started, result)
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let started = Instant::now();
        let result = self
            .track(request.into_inner())
            .await
            .map(|tracked| metric_spec(&tracked));
        Self::finish(&self.get_metric_spec, started, result)
    }

    type StreamMetricSpecStream = SpecStream;

    async fn stream_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        let started = Instant::now();
        let object = request.into_inner();
        let result = self.track(object.clone()).await.map(|tracked| {
            let (sender, receiver) = mpsc::channel(2);
            let open = OpenStream::new(self.open_streams.clone());
            let triggers = self.triggers.clone();
            tokio::spawn(async move {
                push_metric_specs(triggers, object, tracked, sender).await;
                drop(open);
            });
            Box::pin(ReceiverStream::new(receiver)) as SpecStream
        });
        Self::finish(&self.stream_metric_spec, started, result)
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let started = Instant::now();
        let result = async {
            let request = request.into_inner();
            let tracked = self
                .track(request.scaled_object_ref.unwrap_or_default())
                .await?;
            let served = &tracked.config.trigger.metric_name;
            if !request.metric_name.is_empty() && request.metric_name != *served {
                return Err(RpcError::UnknownMetric {
                    asked: request.metric_name,
                    served: served.clone(),
                });
            }
            let (value, _) = self.reported(&tracked).await?;
            Ok(GetMetricsResponse {
                metric_values: vec![MetricValue {
                    metric_name: served.clone(),
                    metric_value: round_up(value),
                    metric_value_float: value,
                }],
            })
        }
        .await;
        Self::finish(&self.get_metrics, started, result)
    }
}

/// What `GetMetricSpec` and `StreamMetricSpec` answer for a trigger: its
/// one metric, never an empty list (KEDA 2.21 leaves a ScaledObject
/// `Ready=False` for good on an empty streamed spec, kedacore/keda#8115).
fn metric_spec(tracked: &Tracked) -> GetMetricSpecResponse {
    let trigger = &tracked.config.trigger;
    GetMetricSpecResponse {
        metric_specs: vec![MetricSpec {
            metric_name: trigger.metric_name.clone(),
            target_size: round_up(trigger.target),
            target_size_float: trigger.target,
        }],
    }
}

/// KEDA < 2.17 reads only the integer fields; rounding up keeps a
/// fractional value from reading as "nothing to do".
fn round_up(value: f64) -> i64 {
    value.ceil() as i64
}

/// Counts a `StreamIsActive` stream in `hoist_open_streams` while it lives.
struct OpenStream(prometheus_client::metrics::gauge::Gauge);

impl OpenStream {
    fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Where a stream's activity comes from: the trigger's own readings
/// (passthrough) or its ScaledObject's engine decisions (engine mode).
enum Activity {
    Readings(watch::Receiver<Reading>),
    Decisions(watch::Receiver<Option<Answer>>),
}

impl Activity {
    fn of(tracked: &Tracked) -> Self {
        match &tracked.scaling {
            Some(scaling) => Activity::Decisions(scaling.answers()),
            None => Activity::Readings(tracked.watch()),
        }
    }

    /// Whether it is active now; `None` while unknown (no reading yet, or
    /// the source failing: a failure is no evidence of inactivity).
    fn current(&mut self, tracked: &Tracked) -> Option<bool> {
        match self {
            Activity::Readings(readings) => readings
                .borrow_and_update()
                .activity()
                .map(|a| tracked.is_active(a)),
            Activity::Decisions(answers) => match answers.borrow_and_update().as_ref() {
                Some(Answer::Decided(decision)) => Some(decision.active),
                // An unknown count is no evidence either way.
                Some(Answer::CountUnknown(_)) | None => None,
            },
        }
    }

    async fn changed(&mut self) -> bool {
        match self {
            Activity::Readings(readings) => readings.changed().await.is_ok(),
            Activity::Decisions(decisions) => decisions.changed().await.is_ok(),
        }
    }
}

/// Sends `true` on every inactive → active edge (and at once if already
/// active), never a repeated `true`: KEDA treats each one as fresh
/// activity and would postpone scale-to-zero forever. An unknown state
/// changes nothing. Ends cleanly (status OK) when hoist shuts down.
async fn push_activation_edges(
    tracked: Arc<Tracked>,
    driver: Driver,
    sender: mpsc::Sender<Result<IsActiveResponse, Status>>,
) {
    let _guard = tracked.stream_guard();
    let mut activity = Activity::of(&tracked);
    let mut active = false;
    loop {
        if let Some(now_active) = activity.current(&tracked) {
            if now_active && !active {
                // A client that stopped reading must not hold up shutdown.
                tokio::select! {
                    sent = sender.send(Ok(IsActiveResponse { result: true })) => {
                        if sent.is_err() {
                            return;
                        }
                        // When each push left, to set beside when KEDA acted
                        // on it (scripts/bench-keda.sh, docs/push.md).
                        debug!(
                            namespace = %tracked.key.namespace,
                            name = %tracked.key.name,
                            "activation pushed"
                        );
                    }
                    _ = driver.shutting_down() => return,
                }
            }
            active = now_active;
        }
        tracked.touch();
        tokio::select! {
            changed = activity.changed() => if !changed { return },
            _ = driver.shutting_down() => return,
            _ = sender.closed() => return,
        }
    }
}

/// Sends the trigger's spec at once, then again whenever the trigger KEDA
/// would now find answers another one (a reload changed its route's
/// target: the driver forgets it and it is tracked anew), so that
/// `GetMetricSpec` and the stream always agree. A trigger that can no
/// longer be tracked ends the stream with the reason `GetMetricSpec` would
/// give (KEDA retries on its backoff); shutdown ends it with OK.
async fn push_metric_specs(
    triggers: Triggers,
    object: ScaledObjectRef,
    mut tracked: Arc<Tracked>,
    sender: mpsc::Sender<Result<GetMetricSpecResponse, Status>>,
) {
    let driver = triggers.driver.clone();
    let mut forgotten = driver.forgotten();
    let mut sent: Option<GetMetricSpecResponse> = None;
    loop {
        let spec = metric_spec(&tracked);
        if sent.as_ref() != Some(&spec) {
            // A client that stopped reading must not hold up shutdown.
            tokio::select! {
                delivered = sender.send(Ok(spec.clone())) => if delivered.is_err() { return },
                _ = driver.shutting_down() => return,
            }
            sent = Some(spec);
        }
        let guard = tracked.stream_guard();
        tokio::select! {
            changed = forgotten.changed() => if changed.is_err() { return },
            _ = driver.shutting_down() => return,
            _ = sender.closed() => return,
        }
        drop(guard);
        // Finds the same trigger when another one was forgotten (its spec
        // is then not sent again), or tracks this one anew.
        match triggers.track(object.clone()).await {
            Ok(now) => tracked = now,
            Err(error) => {
                tokio::select! {
                    _ = sender.send(Err(error.into())) => {}
                    _ = driver.shutting_down() => {}
                    _ = sender.closed() => {}
                }
                return;
            }
        }
    }
}
