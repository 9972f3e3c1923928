//! The KEDA ExternalScaler service, answered from the driver's cache.

mod status;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};
use tracing::debug;

pub use status::RpcError;

use crate::driver::{Driver, Reading, Tracked, TriggerKey};
use crate::metrics::Metrics;
use crate::proto::external_scaler_server::ExternalScaler;
use crate::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};

pub struct ScalerService {
    driver: Driver,
    metrics: Arc<Metrics>,
}

impl ScalerService {
    pub fn new(driver: Driver, metrics: Arc<Metrics>) -> Self {
        Self { driver, metrics }
    }

    fn track(&self, object: ScaledObjectRef) -> Result<Arc<Tracked>, RpcError> {
        let key = TriggerKey::new(object.namespace, object.name, object.scaler_metadata);
        Ok(self.driver.track(key)?)
    }

    /// The current value, or why there is none.
    async fn value(&self, tracked: &Tracked) -> Result<f64, RpcError> {
        let reading = tracked.current().await;
        reading.value().ok_or_else(|| {
            RpcError::from_reading(
                &reading,
                &tracked.config.trigger.query.description,
                tracked.config.timeout,
            )
        })
    }

    fn finish<T>(
        &self,
        method: &'static str,
        started: Instant,
        result: Result<T, RpcError>,
    ) -> Result<Response<T>, Status> {
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(error) => error.code(),
        };
        self.metrics.record_rpc(method, code, started.elapsed());
        match result {
            Ok(answer) => Ok(Response::new(answer)),
            Err(error) => {
                debug!(method, %error, "request failed");
                Err(error.into())
            }
        }
    }
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for ScalerService {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let started = Instant::now();
        let result = async {
            let tracked = self.track(request.into_inner())?;
            let value = self.value(&tracked).await?;
            Ok(IsActiveResponse {
                result: tracked.is_active(value),
            })
        }
        .await;
        self.finish("IsActive", started, result)
    }

    type StreamIsActiveStream = ActivityStream;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let started = Instant::now();
        let result = self.track(request.into_inner()).map(|tracked| {
            let (sender, receiver) = mpsc::channel(4);
            tokio::spawn(push_activation_edges(tracked, self.driver.clone(), sender));
            Box::pin(ReceiverStream::new(receiver)) as ActivityStream
        });
        self.finish("StreamIsActive", started, result)
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let started = Instant::now();
        let result = self.track(request.into_inner()).map(|tracked| {
            let trigger = &tracked.config.trigger;
            GetMetricSpecResponse {
                metric_specs: vec![MetricSpec {
                    metric_name: trigger.metric_name.clone(),
                    target_size: round_up(trigger.target),
                    target_size_float: trigger.target,
                }],
            }
        });
        self.finish("GetMetricSpec", started, result)
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let started = Instant::now();
        let result = async {
            let request = request.into_inner();
            let tracked = self.track(request.scaled_object_ref.unwrap_or_default())?;
            let served = &tracked.config.trigger.metric_name;
            if !request.metric_name.is_empty() && request.metric_name != *served {
                return Err(RpcError::UnknownMetric {
                    asked: request.metric_name,
                    served: served.clone(),
                });
            }
            let value = self.value(&tracked).await?;
            Ok(GetMetricsResponse {
                metric_values: vec![MetricValue {
                    metric_name: served.clone(),
                    metric_value: round_up(value),
                    metric_value_float: value,
                }],
            })
        }
        .await;
        self.finish("GetMetrics", started, result)
    }
}

/// KEDA < 2.17 reads only the integer fields; rounding up keeps a
/// fractional value from reading as "nothing to do".
fn round_up(value: f64) -> i64 {
    value.ceil() as i64
}

/// Sends `true` on every inactive → active edge (and at once if already
/// active), never a repeated `true`: KEDA treats each one as fresh
/// activity and would postpone scale-to-zero forever. A failing source
/// changes nothing. Ends cleanly (status OK) when hoist shuts down.
async fn push_activation_edges(
    tracked: Arc<Tracked>,
    driver: Driver,
    sender: mpsc::Sender<Result<IsActiveResponse, Status>>,
) {
    let _guard = tracked.stream_guard();
    let mut readings = tracked.watch();
    let mut active = false;
    loop {
        let reading = readings.borrow_and_update().clone();
        if let Reading::Value { value, .. } = reading {
            let now_active = tracked.is_active(value);
            if now_active
                && !active
                && sender
                    .send(Ok(IsActiveResponse { result: true }))
                    .await
                    .is_err()
            {
                return;
            }
            active = now_active;
        }
        tracked.touch();
        tokio::select! {
            changed = readings.changed() => if changed.is_err() { return },
            _ = driver.shutting_down() => return,
            _ = sender.closed() => return,
        }
    }
}
