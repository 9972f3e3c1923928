//! `hoist_trigger_value` and the gauges counted with it, read from the
//! tracked triggers at scrape time.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use super::Driver;

/// Exposes each trigger's current value as `hoist_trigger_value`, read
/// from the cache at scrape time.
pub struct TriggerValues(pub Driver);

impl std::fmt::Debug for TriggerValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TriggerValues")
    }
}

/// The labels of one trigger's series. None is named like a label
/// Prometheus attaches to the scrape target (`namespace`, `pod`, `job`,
/// `instance`): under the default `honor_labels: false` it would be
/// renamed `exported_*`. `source` tells two triggers of one ScaledObject
/// apart where `metric` does not (`requestRate` and `concurrency` on one
/// route are both `http-<route>`); it is the poller's description, which
/// never holds a secret, and the `source` of `hoist_poll_errors_total`.
/// Borrowed from the tracked triggers: a scrape of 100,000 triggers
/// allocates no copy of their names (the derive takes no lifetime, hence
/// the hand-written encoding).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct TriggerLabels<'a> {
    scaled_object_namespace: &'a str,
    scaled_object: &'a str,
    scaler: &'static str,
    metric: &'a str,
    source: &'a str,
}

impl prometheus_client::encoding::EncodeLabelSet for TriggerLabels<'_> {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeLabel;
        ("scaled_object_namespace", self.scaled_object_namespace).encode(encoder.encode_label())?;
        ("scaled_object", self.scaled_object).encode(encoder.encode_label())?;
        ("scaler", self.scaler).encode(encoder.encode_label())?;
        ("metric", self.metric).encode(encoder.encode_label())?;
        ("source", self.source).encode(encoder.encode_label())
    }
}

impl Collector for TriggerValues {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Triggers with the same labels read the same source for the same
        // measure: one series, the most recently asked one's value (an
        // edited ScaledObject briefly has its old and new trigger).
        let tracked_now = self.0.tracked();
        let mut series: HashMap<TriggerLabels, (u64, f64)> = HashMap::new();
        let mut without_value: i64 = 0;
        let mut pushed: i64 = 0;
        for tracked in &tracked_now {
            pushed += i64::from(tracked.pushed_lately());
            let Some(value) = tracked.latest().value() else {
                without_value += 1;
                continue;
            };
            let trigger = &tracked.config.trigger;
            let labels = TriggerLabels {
                scaled_object_namespace: &tracked.key.namespace,
                scaled_object: &tracked.key.name,
                scaler: trigger.scaler,
                metric: &trigger.metric_name,
                source: &trigger.query.description,
            };
            let seen = tracked.last_seen_ms.load(Ordering::Relaxed);
            let slot = series.entry(labels).or_insert((seen, value));
            if seen > slot.0 {
                *slot = (seen, value);
            }
        }
        let mut values = encoder.encode_descriptor(
            "hoist_trigger_value",
            "Each trigger's latest value (absent while its source is failing)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (labels, (_, value)) in series {
            ConstGauge::new(value).encode(values.encode_family(&labels)?)?;
        }
        // Counted here, not from the series above: alerts compare no
        // series counts, which merged triggers would skew.
        let missing = encoder.encode_descriptor(
            "hoist_triggers_without_value",
            "Tracked triggers with no value now: their first poll has not ended, or their source's latest poll failed",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(without_value).encode(missing)?;
        let push = encoder.encode_descriptor(
            "hoist_push_triggers",
            "Tracked triggers KEDA pushes to (external-push): a StreamIsActive stream open now or within 6 hours",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(pushed).encode(push)?;
        Ok(())
    }
}
