//! Arbitrary bytes as an app's response head (the first byte's bits: to
//! HEAD, client closing): a head passed on parses again with the same
//! status, one framing and no hop-by-hop field. Never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hoist::interceptor::http_fuzz::response_head(data));
