//! Fuzzes the control plane's Raft disk state (crates/ramgrid-meta: `raft.log`, `raft.vote`,
//! `raft.snapshot`): arbitrary bytes go through every decoder a restart runs on those files
//! (`ramgrid_meta::fuzz::fuzz_decode`, `fuzzing` feature): the checksummed record scan, then the
//! JSON decode into log records (entries and purges), the vote, and the snapshot and the state
//! inside it; and, unframed, into each of those types, so that mutations reach the JSON decoders
//! without a checksum in the way. Nothing may panic; the scan keeps exactly its whole records and
//! cuts only a torn tail as `disk::scan_records` documents one; a log that opens opens again the
//! same once rewritten; every value that decodes re-encodes to JSON that decodes to the same
//! value (JSON is not canonical here: whitespace, escapes and field order vary, so values are
//! compared, not bytes).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ramgrid_meta::fuzz::fuzz_decode(data);
});
