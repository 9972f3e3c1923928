//! `bare-server`: a tonic server answering the ExternalScaler contract
//! with constants: the stack's own limit, to compare hoist with.

use std::net::SocketAddr;
use std::pin::Pin;

use clap::Args;
use futures::Stream;
use hoist::proto::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use hoist::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

#[derive(Args)]
pub(super) struct BareServerArgs {
    #[arg(long, default_value = "127.0.0.1:9190")]
    listen: SocketAddr,
    /// The metric name answered, so responses are as large as hoist's.
    #[arg(long, default_value = "redis-bench")]
    metric_name: String,
    /// Accept connections as `hoist serve` does (a `TcpListenerStream`
    /// passed to `serve_with_incoming`, where tonic sets no TCP_NODELAY)
    /// instead of tonic's `serve` (TCP_NODELAY on).
    #[arg(long)]
    incoming: bool,
    /// With `--incoming`: accept through tonic's `TcpIncoming` with
    /// TCP_NODELAY set instead (the fix proposed for `hoist serve`).
    #[arg(long, requires = "incoming")]
    nodelay: bool,
}

struct Bare {
    metric_name: String,
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Bare {
    async fn is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        Ok(Response::new(IsActiveResponse { result: false }))
    }

    type StreamIsActiveStream = ActivityStream;

    async fn stream_is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        Ok(Response::new(Box::pin(futures::stream::pending())))
    }

    async fn get_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: self.metric_name.clone(),
                target_size: 5,
                target_size_float: 5.0,
            }],
        }))
    }

    type StreamMetricSpecStream =
        Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

    /// KEDA 2.21 falls back to pulling `GetMetricSpec` on Unimplemented.
    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        Err(Status::unimplemented("the bare server answers constants"))
    }

    async fn get_metrics(
        &self,
        _request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: self.metric_name.clone(),
                metric_value: 0,
                metric_value_float: 0.0,
            }],
        }))
    }
}

pub(super) async fn bare_server(args: BareServerArgs) -> anyhow::Result<()> {
    eprintln!("bare ExternalScaler server on {}", args.listen);
    let router = tonic::transport::Server::builder().add_service(ExternalScalerServer::new(Bare {
        metric_name: args.metric_name,
    }));
    if args.incoming && args.nodelay {
        let listener = TcpListener::bind(args.listen).await?;
        router
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await?;
    } else if args.incoming {
        let listener = TcpListener::bind(args.listen).await?;
        router
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await?;
    } else {
        // tonic's own defaults (`serve`: TCP_NODELAY on), nothing else.
        router.serve(args.listen).await?;
    }
    Ok(())
}
