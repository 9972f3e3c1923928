//! Arbitrary bytes as an app's chunked body (the first byte picks the
//! size of the pieces it arrives in): framed the same in any pieces, into
//! canonical chunked framing. Never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hoist::interceptor::http_fuzz::rechunk(data));
