//! Fuzzes the cluster spec text parser (`--cluster-spec` files and SET_SPEC bodies): arbitrary bytes
//! must never panic, and a spec that parses must print to a text that parses to the same spec
//! (same servers, same epoch).

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_proto::cluster::ClusterSpec;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = ClusterSpec::parse_bytes(data) {
        let text = spec.to_text();
        let again = ClusterSpec::parse(&text).expect("a printed spec parses");
        assert_eq!(again.epoch(), spec.epoch(), "printing then parsing changed the spec");
        assert_eq!(again.to_text(), text);
    }
});
