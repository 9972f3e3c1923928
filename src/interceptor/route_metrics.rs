//! The interceptor's per-route counters on `/metrics`: a collector that
//! reads them at scrape time (in-flight, held, rate, started), so a scrape
//! costs nothing between scrapes.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, NoLabelSet};

use super::http::Handover;
use super::{Protocol, Routes};

/// The interceptor's per-route counters, read at scrape time.
pub struct RouteTraffic(pub Arc<Routes>);

impl std::fmt::Debug for RouteTraffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteTraffic")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    route: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeniedLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    upstream_namespace: String,
    upstream_service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    upstream_namespace: String,
    upstream_service: String,
    standing: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverLabels {
    reason: &'static str,
}

fn route_labels(name: &str, protocol: Protocol) -> RouteLabels {
    RouteLabels {
        route: name.to_owned(),
        protocol: match protocol {
            Protocol::Http => "http",
            Protocol::Tcp => "tcp",
        },
    }
}

impl prometheus_client::collector::Collector for RouteTraffic {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;

        let now = tokio::time::Instant::now();
        let loads: Vec<_> = self
            .0
            .current()
            .iter()
            .map(|(name, route)| {
                (
                    route_labels(name, route.protocol()),
                    route.counters.load(now),
                )
            })
            .collect();
        let mut started = encoder.encode_descriptor(
            "hoist_interceptor_started",
            "Requests (HTTP) or connections (TCP) the interceptor took per route",
            None,
            MetricType::Counter,
        )?;
        for (labels, load) in &loads {
            ConstCounter::new(load.started_total).encode(started.encode_family(labels)?)?;
        }
        type Read = fn(&super::counters::Load) -> f64;
        let gauges: [(&str, &str, Read); 3] = [
            (
                "hoist_interceptor_in_flight",
                "Requests or connections open now, held ones included",
                |l| l.in_flight as f64,
            ),
            (
                "hoist_interceptor_held",
                "Requests or connections waiting for an upstream at zero",
                |l| l.held as f64,
            ),
            (
                "hoist_interceptor_rate",
                "Requests or connections per second over the past 15 s",
                |l| l.rate,
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, load) in &loads {
                ConstGauge::new(value(load)).encode(family.encode_family(labels)?)?;
            }
        }
        let mut waited = encoder.encode_descriptor(
            "hoist_interceptor_cold_start_seconds",
            "How long requests (HTTP) or connections (TCP) were held for an upstream at zero or starting before it took them, per route (held ones that timed out, were refused or left are not in it)",
            None,
            MetricType::Histogram,
        )?;
        for (name, route) in self.0.current().iter() {
            let labels = route_labels(name, route.protocol());
            let times = route.counters.cold_start_times();
            waited
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    times.sum_seconds,
                    times.count,
                    &times.buckets,
                    None,
                )?;
        }
        let mut answered = encoder.encode_descriptor(
            "hoist_interceptor_refused",
            "Answers the interceptor gave itself instead of the app's, by route and status: 502 (the app's connection failed), 503 (too many held, shutting down, or the route removed or moved), 504 (cold start or response timeout)",
            None,
            MetricType::Counter,
        )?;
        for (name, route) in self.0.current().iter() {
            if route.protocol() != Protocol::Http {
                continue;
            }
            for (code, count) in route.counters.refusals() {
                let labels = RefusalLabels {
                    route: name.clone(),
                    code,
                };
                ConstCounter::new(count).encode(answered.encode_family(&labels)?)?;
            }
        }
        let mut denied = encoder.encode_descriptor(
            "hoist_interceptor_upstream_denied",
            "Requests (HTTP, answered 502) or connections (TCP, closed) of declared routes not forwarded because every address their upstream resolved to is in interceptor.denied_networks",
            None,
            MetricType::Counter,
        )?;
        for (name, route) in self.0.current().iter() {
            if route.spec.owner.is_none() {
                continue;
            }
            let labels = DeniedLabels {
                route: name.clone(),
            };
            ConstCounter::new(route.counters.upstream_denied_total())
                .encode(denied.encode_family(&labels)?)?;
        }
        let mut open = encoder.encode_descriptor(
            "hoist_interceptor_connections",
            "Client connections open now, by listener",
            None,
            MetricType::Gauge,
        )?;
        for limit in &self.0.listeners() {
            let labels = ListenerLabels {
                listener: limit.listener.clone(),
            };
            ConstGauge::new(limit.open() as i64).encode(open.encode_family(&labels)?)?;
        }
        let mut refused = encoder.encode_descriptor(
            "hoist_interceptor_connections_refused",
            "Client connections refused at accept (HTTP: 503): the listener's max_connections, a client address's max_connections_per_client, or the process's descriptors were used up",
            None,
            MetricType::Counter,
        )?;
        for limit in &self.0.listeners() {
            let labels = ListenerLabels {
                listener: limit.listener.clone(),
            };
            ConstCounter::new(limit.refused()).encode(refused.encode_family(&labels)?)?;
        }
        let mut handed = encoder.encode_descriptor(
            "hoist_interceptor_http_hyper_connections",
            "HTTP client connections served by hyper rather than the direct HTTP/1.1 path (from their first request, or from the first one the direct path did not take), by reason",
            None,
            MetricType::Counter,
        )?;
        for why in Handover::ALL {
            let labels = HandoverLabels {
                reason: why.label(),
            };
            ConstCounter::new(self.0.http_handovers.total(why))
                .encode(handed.encode_family(&labels)?)?;
        }
        let send_timeouts = encoder.encode_descriptor(
            "hoist_interceptor_http_send_timeouts",
            "HTTP client connections closed because the client read nothing of what hoist was sending for interceptor.send_timeout (their requests' places given back)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(
            self.0
                .send_timeouts
                .load(std::sync::atomic::Ordering::Relaxed),
        )
        .encode(send_timeouts)?;
        // The Services whose pods are dialled (`interceptor.direct_to_pods`;
        // not `namespace` and `service`, which a scrape gives the target),
        // so that a watch that fails (its Service's name dialled meanwhile)
        // or a Service left without ready pods can be alerted on.
        let followed = self
            .0
            .pods()
            .endpoints()
            .map(|endpoints| endpoints.report())
            .unwrap_or_default();
        let mut endpoints = encoder.encode_descriptor(
            "hoist_interceptor_service_endpoints",
            "Endpoints of each Service whose pods the interceptor dials (interceptor.direct_to_pods), by standing: ready, or serving_only (terminating, dialled only when none is ready)",
            None,
            MetricType::Gauge,
        )?;
        for service in &followed {
            for (standing, count) in [
                ("ready", service.ready_endpoints),
                ("serving_only", service.serving_endpoints),
            ] {
                let labels = EndpointLabels {
                    upstream_namespace: service.namespace.clone(),
                    upstream_service: service.name.clone(),
                    standing,
                };
                ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
                    .encode(endpoints.encode_family(&labels)?)?;
            }
        }
        let mut watched = encoder.encode_descriptor(
            "hoist_interceptor_service_watch_up",
            "1 while both watches (Service, EndpointSlices) of a Service whose pods the interceptor dials have listed and neither fails; 0 otherwise, when its name is dialled instead (GET /interceptor/services says why)",
            None,
            MetricType::Gauge,
        )?;
        for service in &followed {
            let labels = ServiceLabels {
                upstream_namespace: service.namespace.clone(),
                upstream_service: service.name.clone(),
            };
            ConstGauge::new(i64::from(service.listed && service.error.is_none()))
                .encode(watched.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
