//! Arbitrary metadata for `scaler: kafka` (one `key=value` a line) must
//! parse or be refused with an error, never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hoist_fuzz::parse_metadata("kafka", data));
