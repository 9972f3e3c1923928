//! What the metadata fuzz targets share.

use std::collections::HashMap;

/// Reads `key=value` lines as trigger metadata for `scaler` and parses it:
/// any outcome but a panic is fine.
pub fn parse_metadata(scaler: &str, data: &[u8]) {
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
    let _ = hoist::trigger::parse(&metadata, &Default::default(), defaults, &Default::default());
}
