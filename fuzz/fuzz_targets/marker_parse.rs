//! Bytes → `Marker::parse` never panics; any accepted marker re-serialises and re-parses equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use planned_stop_protocol::marker::Marker;

fuzz_target!(|data: &[u8]| {
    if let Ok(marker) = Marker::parse(data) {
        let bytes = marker.to_json().expect("an accepted marker serialises");
        assert_eq!(Marker::parse(&bytes).expect("and parses again"), marker);
    }
});
