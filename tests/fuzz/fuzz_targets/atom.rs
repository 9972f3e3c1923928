//! Arbitrary Service Bus response bodies must give a count or an error,
//! never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = hoist::azure::atom::entity(&text);
    let _ = hoist::azure::atom::feed(&text);
    let _ = hoist::azure::atom::error_detail(&text);
    let _ = hoist::azure::sas::ConnectionString::parse(&text);
});
