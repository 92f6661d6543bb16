//! File formats of the durable directory: checksummed records and atomic replacement.
//!
//! A record is `len: u32 LE | !len: u32 LE | xxh3_64(payload): u64 LE | payload`. The complement
//! of the length guards the length itself: a flipped bit there is seen as corruption, not taken
//! for a record that runs past the end of the file (which would look like a torn tail and be
//! cut, losing the records after it).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

/// Bytes before a record's payload.
pub(crate) const HEADER: usize = 16;

/// Append one record holding `payload` to `out`.
pub(crate) fn encode_record(payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("a metadata record under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The records of a log file's bytes.
pub(crate) struct Scanned<'a> {
    /// The payloads of the whole records, in order.
    pub records: Vec<&'a [u8]>,
    /// Where the whole records end; less than the file's length when its tail was torn.
    pub valid_len: usize,
}

/// Read the records of `bytes` (the contents of `path`, named in errors).
///
/// The end of the file may hold a record cut short by a crash during its append (its header or
/// payload incomplete, a payload that does not match its checksum, or zeros from an extension
/// that never got its data): that tail is reported by `valid_len` for the caller to cut. Anything
/// else that does not check out is corruption, an error naming the file and offset: records
/// after it would otherwise be lost silently.
pub(crate) fn scan_records<'a>(bytes: &'a [u8], path: &Path) -> Result<Scanned<'a>, String> {
    let mut records = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.iter().all(|&b| b == 0) || rest.len() < HEADER {
            break; // torn: an incomplete header, or space allocated but never written
        }
        let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes"));
        let check = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if check != !len {
            return Err(format!(
                "{}: corrupt record header at offset {at} (length check fails)",
                path.display()
            ));
        }
        let end = HEADER + len as usize;
        if rest.len() < end {
            break; // torn: the payload was not all written
        }
        let payload = &rest[HEADER..end];
        let sum = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        if xxh3_64(payload) != sum {
            if rest.len() == end {
                break; // torn: the last record's payload only partly reached the disk
            }
            return Err(format!(
                "{}: corrupt record at offset {at} (checksum mismatch, {} bytes follow it)",
                path.display(),
                rest.len() - end
            ));
        }
        records.push(payload);
        at += end;
    }
    Ok(Scanned {
        records,
        valid_len: at,
    })
}

/// Replace `dir/name` with `bytes` so that a crash leaves either the old file or the new one:
/// write a temporary file, fsync it, rename it over the old one, fsync the directory.
pub(crate) fn atomic_write(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// fsync a directory, so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Write one value as a single checksummed record, atomically (see [`atomic_write`]).
pub(crate) fn write_value<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
) -> Result<(), String> {
    let bytes = value_file(name, value)?;
    atomic_write(dir, name, &bytes).map_err(|e| format!("{}: {e}", dir.join(name).display()))
}

/// The bytes of a value's file: one checksummed record of its JSON.
fn value_file<T: serde::Serialize>(name: &str, value: &T) -> Result<Vec<u8>, String> {
    let payload = serde_json::to_vec(value).map_err(|e| format!("encoding {name}: {e}"))?;
    let mut bytes = Vec::with_capacity(payload.len() + HEADER);
    encode_record(&payload, &mut bytes);
    Ok(bytes)
}

/// Write one value as [`write_value`] does, but without waiting for the disk: for hints whose loss
/// in a crash costs only time (a reader must take a missing or damaged file for none).
pub(crate) fn write_hint<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
) -> Result<(), String> {
    let bytes = value_file(name, value)?;
    let tmp = dir.join(format!("{name}.tmp"));
    fs::write(&tmp, &bytes)
        .and_then(|()| fs::rename(&tmp, dir.join(name)))
        .map_err(|e| format!("{}: {e}", dir.join(name).display()))
}

/// Read a value written by [`write_value`]; `None` when the file does not exist. Such files are
/// replaced atomically, so any damage is corruption (never a torn write) and an error.
pub(crate) fn read_value<T: serde::de::DeserializeOwned>(
    dir: &Path,
    name: &str,
) -> Result<Option<T>, String> {
    let path = dir.join(name);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    decode_value(&bytes, &path).map(Some)
}

/// The value in the bytes of a file written by [`write_value`] (`path` names it in errors): what
/// [`read_value`] decodes once the file is read.
pub(crate) fn decode_value<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
) -> Result<T, String> {
    let scanned = scan_records(bytes, path)?;
    if scanned.records.len() != 1 || scanned.valid_len != bytes.len() {
        return Err(format!(
            "{}: damaged (not one whole record)",
            path.display()
        ));
    }
    serde_json::from_slice(scanned.records[0])
        .map_err(|e| format!("{}: undecodable: {e}", path.display()))
}

/// Run `f`, which blocks on the disk (fsync), telling a multi-threaded tokio runtime first so
/// that it moves its other tasks off this worker meanwhile; on a current-thread runtime (which
/// cannot) it just runs.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// An I/O error carrying `msg`, for APIs that want an error value.
pub(crate) fn io(msg: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(msg.to_string())
}

/// Open `path` for appending, creating it (and making its name durable) if needed.
pub(crate) fn open_append(path: &Path) -> std::io::Result<File> {
    let existed = path.exists();
    let f = OpenOptions::new().create(true).append(true).open(path)?;
    if !existed {
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
    }
    Ok(f)
}

/// Cut `path` to `len` bytes, durably.
pub(crate) fn truncate_file(path: &PathBuf, len: u64) -> std::io::Result<()> {
    let f = OpenOptions::new().write(true).open(path)?;
    f.set_len(len)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            encode_record(p, &mut out);
        }
        out
    }

    #[test]
    fn whole_records_read_back() {
        let bytes = file_of(&[b"one", b"", b"three"]);
        let s = scan_records(&bytes, Path::new("f")).unwrap();
        assert_eq!(s.records, vec![&b"one"[..], b"", b"three"]);
        assert_eq!(s.valid_len, bytes.len());
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail() {
        let bytes = file_of(&[b"one", b"two", b"the last record"]);
        let last_start = 2 * HEADER + 6;
        for cut in last_start..bytes.len() {
            let s = scan_records(&bytes[..cut], Path::new("f")).unwrap();
            assert_eq!(s.records.len(), 2, "cut at {cut}");
            assert_eq!(s.valid_len, last_start);
        }
        // Zeros after the last record (an extension never written) are a tail too.
        let mut z = bytes.clone();
        z.extend_from_slice(&[0; 40]);
        assert_eq!(
            scan_records(&z, Path::new("f")).unwrap().valid_len,
            bytes.len()
        );
        // So is a last payload whose bytes did not all reach the disk.
        let mut g = bytes.clone();
        let n = g.len();
        g[n - 1] ^= 0x55;
        assert_eq!(
            scan_records(&g, Path::new("f")).unwrap().valid_len,
            last_start
        );
    }

    #[test]
    fn damage_before_the_last_record_is_an_error_naming_the_file() {
        let bytes = file_of(&[b"one", b"two", b"three"]);
        for at in 0..HEADER + 3 {
            let mut b = bytes.clone();
            b[at] ^= 0x01;
            let e = scan_records(&b, Path::new("/d/raft.log")).err();
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains("/d/raft.log") && e.contains("offset 0")),
                "flip at {at}: {e:?}"
            );
        }
    }
}
