//! Arbitrary bytes as a client's request head: the direct path takes it
//! only with one host and one length, and writes the app a head that
//! parses with none of the client's hop-by-hop or forwarding fields.
//! Never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hoist::interceptor::http_fuzz::request_head(data));
