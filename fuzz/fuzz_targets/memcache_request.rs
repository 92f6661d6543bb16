//! Fuzzes the memcached request parser: arbitrary bytes, parsed as a connection would parse them,
//! must never panic and must keep the invariants of `ramgrid_proto::memcache::invariants`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_proto::memcache::invariants::{check_parse, check_stream};
use ramgrid_proto::memcache::Limits;

fuzz_target!(|data: &[u8]| {
    // Small limits so that the length checks are reached by short inputs too.
    let small = Limits {
        max_key_len: 250,
        max_value_len: 64,
        max_line_len: 512,
        max_keys_per_get: 16,
    };
    check_stream(data, &small);
    check_parse(data, &Limits::default());
});
