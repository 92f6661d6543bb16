//! Fuzzes the partition image reader (docs/partition-image.md: snapshot files, partition copies):
//! arbitrary bytes must never panic, and an image that validates must be canonical: rebuilding
//! the partition and writing it again gives the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_store::image;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = image::reencode(data) {
        assert_eq!(again, data, "a valid image did not write back to the same bytes");
    }
});
