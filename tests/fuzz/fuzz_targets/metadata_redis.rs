//! Arbitrary metadata for `scaler: redis` (one `key=value` a line) must
//! parse or be refused with an error, never panic.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut metadata: HashMap<String, String> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    metadata.insert("scaler".into(), "redis".into());
    let defaults = hoist::trigger::Defaults {
        polling_interval: std::time::Duration::from_secs(30),
        timeout: std::time::Duration::from_secs(3),
    };
    let _ = hoist::trigger::parse(&metadata, &Default::default(), defaults);
});
