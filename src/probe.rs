//! `hoist probe`: measure one trigger once and show what hoist would
//! report to KEDA, without starting a server.

use std::collections::HashMap;
use std::fmt;

use crate::auth_profiles::AuthProfiles;
use crate::config::Settings;
use crate::driver::PollError;
use crate::metadata::MetadataError;
use crate::trigger::{self, Defaults};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The cause follows in the error chain.
    #[error("bad trigger metadata")]
    Metadata(#[from] MetadataError),
    #[error("{source_description}: {error}")]
    Poll {
        source_description: String,
        error: PollError,
    },
    #[error("cannot build the client that reads interceptors")]
    Client(#[from] reqwest::Error),
    #[error("TLS for reading interceptors (interceptor.tls)")]
    Tls(#[from] crate::tls::TlsError),
}

/// What one measurement found, in KEDA's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeReport {
    pub scaler: &'static str,
    pub source: String,
    pub metric_name: String,
    pub target: f64,
    pub activation_target: f64,
    pub value: f64,
    pub active: bool,
}

pub async fn probe(
    metadata: &HashMap<String, String>,
    settings: &Settings,
) -> Result<ProbeReport, ProbeError> {
    let defaults = Defaults {
        polling_interval: settings.polling.default_interval,
        timeout: settings.polling.default_timeout,
    };
    // `http`/`tcp` triggers are probed through interceptors' admin ports
    // (`interceptor.endpoints`): the proxies run in another process.
    let traffic = if settings.interceptor.endpoints.is_empty() {
        None
    } else {
        let tls = settings.interceptor.tls.as_ref();
        let tls = tls.map(crate::tls::ClientTls::new).transpose()?;
        let fleet = crate::interceptor::fleet::Fleet::new(
            settings.interceptor.endpoints.clone(),
            settings.interceptor.read_timeout,
            tls.as_ref(),
        )?;
        Some(crate::interceptor::traffic::Traffic::Remote(
            std::sync::Arc::new(fleet),
        ))
    };
    let context = crate::scalers::Context {
        traffic,
        route_targets: std::sync::Arc::new(settings.interceptor.route_targets()),
        ..Default::default()
    };
    let config = trigger::parse(
        metadata,
        &AuthProfiles::from_settings(settings),
        defaults,
        &context,
    )?;
    let trigger = &config.trigger;
    let outcome = tokio::time::timeout(config.timeout, trigger.query.source.observe()).await;
    let value = match outcome {
        Ok(Ok(measurement)) => Ok(measurement),
        Ok(Err(error)) => Err(PollError::Observe(error)),
        Err(_) => Err(PollError::Timeout(config.timeout)),
    }
    .map_err(|error| ProbeError::Poll {
        source_description: trigger.query.description.to_string(),
        error,
    })?;
    Ok(ProbeReport {
        scaler: trigger.scaler,
        source: trigger.query.description.to_string(),
        metric_name: trigger.metric_name.clone(),
        target: trigger.target,
        activation_target: trigger.activation_target,
        value: value.value,
        active: value.activity > trigger.activation_target,
    })
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "scaler:          {}", self.scaler)?;
        writeln!(f, "source:          {}", self.source)?;
        writeln!(f, "value:           {}", self.value)?;
        writeln!(
            f,
            "IsActive:        {} (value > activation target {})",
            self.active, self.activation_target
        )?;
        writeln!(
            f,
            "GetMetricSpec:   metricName={} targetSize={} targetSizeFloat={}",
            self.metric_name,
            self.target.ceil() as i64,
            self.target
        )?;
        writeln!(
            f,
            "GetMetrics:      metricValue={} metricValueFloat={}",
            self.value.ceil() as i64,
            self.value
        )?;
        write!(
            f,
            "HPA would want:  {} replicas (ceil(value / target), before KEDA's and the HPA's limits)",
            if self.target > 0.0 {
                format!("{}", (self.value / self.target).ceil())
            } else {
                "n/a (target 0)".to_string()
            }
        )
    }
}
