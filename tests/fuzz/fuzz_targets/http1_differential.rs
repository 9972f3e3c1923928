//! Differential: whatever request the direct path takes from arbitrary
//! bytes, hyper's HTTP/1.1 server reads from the same bytes as one
//! request with the same method, target, fields and body; anything they
//! disagree on must go to hyper (or be refused) instead.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hoist::interceptor::http_fuzz::differential_blocking(data));
