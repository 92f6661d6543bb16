//! Fuzzes the write-ahead log reader of `durability = log` tables (crates/ramgrid-server/src/
//! wal.rs, `wal::scan`, what a restart runs on every `v<version>.log`): arbitrary bytes must never
//! panic, and the scan must keep to the module's rules:
//!
//! - `good_len <= len`; a clean end covers every byte; a torn tail starts at `good_len` and runs
//!   to the end; a corrupt log yields no records;
//! - the bytes up to `good_len` scan again to a clean end with the same records (for a corrupt
//!   log: the records before the damage), and are exactly those records encoded again after the
//!   header (the format is canonical);
//! - every cut of a clean log is a clean end at a record boundary or a torn tail from the last
//!   boundary before it, never corruption; a flipped byte past its header is corruption.
//!
//! The version and incarnation expected are the ones the header names (bytes 12..24), so that
//! mutations reach the records. Each input is read twice: as it is, and resealed (the header
//! rebuilt, every whole record's length check and checksum recomputed over its bytes as they are),
//! so that mutated bodies reach the body parser instead of stopping at a checksum.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_server::wal::{self, End, HEADER_LEN, RECORD_HEADER_LEN};
use xxhash_rust::xxh3::xxh3_64;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// A record around `body` with a valid length check and checksum (the module docs' framing).
fn frame(out: &mut Vec<u8>, body: &[u8]) {
    let len = body.len() as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(xxh3_64(&len.to_le_bytes()) as u32).to_le_bytes());
    out.extend_from_slice(&xxh3_64(body).to_le_bytes());
    out.extend_from_slice(body);
}

/// `data` with its header rebuilt and every record that fits framed again.
fn reseal(data: &[u8], version: u32, incarnation: u64) -> Vec<u8> {
    let mut out = wal::header(version, incarnation).to_vec();
    let mut at = HEADER_LEN;
    while data.len() - at >= RECORD_HEADER_LEN {
        let len = u32_at(data, at) as usize;
        if len > data.len() - at - RECORD_HEADER_LEN {
            break;
        }
        frame(
            &mut out,
            &data[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + len],
        );
        at += RECORD_HEADER_LEN + len;
    }
    out.extend_from_slice(&data[at..]);
    out
}

/// The records of a scan, encoded again after the header; and where each record ends.
fn encode(version: u32, incarnation: u64, records: &[wal::Record<'_>]) -> (Vec<u8>, Vec<usize>) {
    let mut out = wal::header(version, incarnation).to_vec();
    let mut ends = vec![out.len()];
    for r in records {
        if r.ops.is_empty() {
            // The writer never appends an empty record (`encode_record` skips it), but one is a
            // valid record: version, partition, op count 0.
            let mut body = version.to_le_bytes().to_vec();
            body.extend_from_slice(&r.partition.to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            frame(&mut out, &body);
        } else {
            wal::encode_record(&mut out, version, r.partition, r.ops.iter().copied());
        }
        ends.push(out.len());
    }
    (out, ends)
}

fn check(bytes: &[u8], version: u32, incarnation: u64) {
    let s = wal::scan(bytes, version, incarnation);
    let len = bytes.len() as u64;
    assert!(
        s.good_len <= len,
        "good_len {} past the end {len}",
        s.good_len
    );
    match &s.end {
        End::Clean => assert_eq!(s.good_len, len, "a clean end that leaves bytes"),
        End::TornTail { at, bytes: n } => {
            assert_eq!(*at, s.good_len);
            assert!(*n > 0 && at + n == len, "torn tail {at}+{n} of {len}");
            assert!(*at >= HEADER_LEN as u64);
        }
        End::Corrupt { at, .. } => {
            assert!(s.records.is_empty(), "records of a corrupt log");
            assert_eq!(*at, s.good_len);
            assert!(*at == 0 || (*at >= HEADER_LEN as u64 && *at < len));
        }
    }
    if s.good_len < HEADER_LEN as u64 {
        return;
    }
    let good = &bytes[..s.good_len as usize];
    let again = wal::scan(good, version, incarnation);
    assert_eq!(again.end, End::Clean, "the good part does not scan clean");
    assert_eq!(again.good_len, s.good_len);
    if !matches!(s.end, End::Corrupt { .. }) {
        assert_eq!(
            again.records, s.records,
            "the good part scans to other records"
        );
    }
    let (encoded, ends) = encode(version, incarnation, &again.records);
    assert_eq!(
        encoded, good,
        "records do not encode to the bytes they were read from"
    );

    if s.end != End::Clean || s.records.is_empty() {
        return;
    }
    // Cuts of a clean log: a few spread over it, and one byte into each record.
    let cuts = (1..8)
        .map(|i| HEADER_LEN + (bytes.len() - HEADER_LEN) * i / 8)
        .chain(ends.iter().map(|e| e + 1))
        .filter(|&k| k < bytes.len());
    for k in cuts {
        let c = wal::scan(&bytes[..k], version, incarnation);
        let boundary = *ends.iter().filter(|&&e| e <= k).next_back().unwrap();
        let want = if boundary == k {
            End::Clean
        } else {
            End::TornTail {
                at: boundary as u64,
                bytes: (k - boundary) as u64,
            }
        };
        assert_eq!(c.end, want, "cut at {k}");
        assert_eq!(
            c.records.len(),
            ends.iter().filter(|&&e| e <= k).count() - 1
        );
    }
    // A flipped byte past the header.
    let h = xxh3_64(bytes);
    let at = HEADER_LEN + (h as usize) % (bytes.len() - HEADER_LEN);
    let mut flipped = bytes.to_vec();
    flipped[at] ^= 1 << ((h >> 32) % 8);
    let f = wal::scan(&flipped, version, incarnation);
    assert!(
        matches!(f.end, End::Corrupt { .. }),
        "flipped byte {at} read as {:?}",
        f.end
    );
}

fuzz_target!(|data: &[u8]| {
    let (version, incarnation) = if data.len() >= 24 {
        (
            u32_at(data, 12),
            u64::from_le_bytes(data[16..24].try_into().unwrap()),
        )
    } else {
        (1, 1)
    };
    check(data, version, incarnation);
    if data.len() >= HEADER_LEN {
        let resealed = reseal(data, version, incarnation);
        if resealed != data {
            check(&resealed, version, incarnation);
        }
    }
});
