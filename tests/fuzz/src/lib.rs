//! What the metadata fuzz targets share.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Reads `key=value` lines as trigger metadata for `scaler` and parses it:
/// any outcome but a panic is fine.
pub fn parse_metadata(scaler: &str, data: &[u8]) {
    parse_with(scaler, data, &Default::default());
}

/// The same for `http` and `tcp`, with interceptors to read (never
/// contacted while parsing).
pub fn parse_traffic_metadata(scaler: &str, data: &[u8]) {
    static SPLIT_SETUP: OnceLock<hoist::scalers::Context> = OnceLock::new();
    let context = SPLIT_SETUP.get_or_init(|| hoist::scalers::Context {
        traffic: Some(hoist::interceptor::traffic::Traffic::Remote(Arc::new(
            hoist::interceptor::fleet::Fleet::new(
                vec!["interceptor.invalid:9091".into()],
                std::time::Duration::from_secs(1),
                None,
            )
            .expect("an HTTP client"),
        ))),
        // Declared routes are parsed too: they belong to a ScaledObject.
        owner: Some(hoist::routing::Owner {
            namespace: "fuzz".into(),
            name: "app".into(),
        }),
        ..Default::default()
    });
    parse_with(scaler, data, context);
}

fn parse_with(scaler: &str, data: &[u8], context: &hoist::scalers::Context) {
    let text = String::from_utf8_lossy(data);
    let mut metadata: HashMap<String, String> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    metadata.insert("scaler".into(), scaler.into());
    let defaults = hoist::trigger::Defaults {
        polling_interval: std::time::Duration::from_secs(30),
        timeout: std::time::Duration::from_secs(3),
    };
    let _ = hoist::trigger::parse(&metadata, &Default::default(), defaults, context);
}
