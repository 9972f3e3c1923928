//! Arbitrary metadata for `scaler: http` or `tcp` (the first byte picks;
//! then one `key=value` a line) must parse or be refused with an error,
//! never panic. Parsed as the scaler of a split setup sees it, so every
//! key is checked, not only the missing interceptor.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (scaler, rest) = match data.split_first() {
        Some((first, rest)) if first % 2 == 1 => ("tcp", rest),
        Some((_, rest)) => ("http", rest),
        None => ("http", data),
    };
    hoist_fuzz::parse_traffic_metadata(scaler, rest)
});
