//! What a trigger seen for the first time costs to parse, and what one
//! Service Bus response costs to read. `cargo bench --bench parsers`.

use std::collections::HashMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use hoist::trigger::{Defaults, parse};

fn metadata(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn triggers(c: &mut Criterion) {
    let defaults = Defaults {
        polling_interval: std::time::Duration::from_secs(30),
        timeout: std::time::Duration::from_secs(3),
    };
    let profiles = Default::default();
    let cases = [
        (
            "redis",
            metadata(&[
                ("scaler", "redis"),
                ("address", "redis.orders.svc.cluster.local:6379"),
                ("listName", "jobs"),
                ("listLength", "5"),
                ("scalerAddress", "hoist.keda:9090"),
            ]),
        ),
        (
            "kafka",
            metadata(&[
                ("scaler", "kafka"),
                ("bootstrapServers", "kafka-0:9092,kafka-1:9092,kafka-2:9092"),
                ("consumerGroup", "orders"),
                ("topic", "orders"),
                ("partitionLimitation", "0-63"),
                ("lagThreshold", "50"),
            ]),
        ),
        (
            "azure-servicebus",
            metadata(&[
                ("scaler", "azure-servicebus"),
                ("queueName", "invoices-.*"),
                ("useRegex", "true"),
                (
                    "connectionFromEnv",
                    "Endpoint=sb://n.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v",
                ),
            ]),
        ),
        (
            "redis, engine mode with behavior",
            metadata(&[
                ("scaler", "redis"),
                ("address", "redis:6379"),
                ("listName", "jobs"),
                ("scalingMode", "engine"),
                (
                    "behavior",
                    r#"{"scaleDown":{"stabilizationWindowSeconds":60,"policies":[{"type":"Pods","value":2,"periodSeconds":60}]}}"#,
                ),
            ]),
        ),
    ];
    for (name, metadata) in &cases {
        c.bench_function(&format!("parse trigger metadata: {name}"), |b| {
            b.iter(|| {
                parse(
                    black_box(metadata),
                    &profiles,
                    defaults,
                    &Default::default(),
                )
                .map(|config| config.trigger.metric_name)
            })
        });
    }
}

fn atom(c: &mut Criterion) {
    let body = include_str!(
        "../tests/data/servicebus/queue-runtime-properties.active1-dlq1-sched1.api2017-04.dotnet.xml"
    );
    c.bench_function("read a Service Bus queue entry (Atom)", |b| {
        b.iter(|| hoist::azure::atom::entity(black_box(body)))
    });
}

criterion_group!(benches, triggers, atom);
criterion_main!(benches);
