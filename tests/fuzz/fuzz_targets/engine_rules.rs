//! Arbitrary `hoist decide` documents (rules, state, readings, now) must
//! give a decision or an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = hoist::decide::decide(&text);
});
