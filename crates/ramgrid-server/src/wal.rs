//! Write-ahead logs of `durability = log` tables (docs/durability.md): every
//! PUT and DELETE applied to an open version of such a table is appended to that version's log and
//! fsynced before the request is answered, and a restarting server replays the log.
//!
//! One log file per open version, `DIR/tables/<name>-<incarnation>/v<version>.log` (next to the
//! catalog, see persist.rs). Sealing the version writes its images and then removes the log, so a
//! log never holds garbage that needs compaction; dropping the version removes it too.
//!
//! # Format (version 1, little-endian)
//!
//! ```text
//! file header, 40 bytes:
//!   0  8  magic "RGWAL\0\0\0"
//!   8  4  format version (1)
//!  12  4  table version the log belongs to
//!  16  8  table incarnation
//!  24  8  reserved, zero
//!  32  8  xxh3-64 of bytes 0..32
//! records, back to back:
//!   0  4  body length L (RECORD_MIN_BODY..=RECORD_MAX_BODY)
//!   4  4  low 32 bits of xxh3-64 of bytes 0..4 (so a damaged length is told from a torn tail)
//!   8  8  xxh3-64 of the body
//!  16  L  body: u32 version, u32 partition, u32 op count, then per op:
//!            u8 1 (put), u32 key length, key, u32 value length, value (the wire's encoding)
//!            u8 2 (delete), u32 key length, key
//! ```
//!
//! # What a reader concludes ([`scan`])
//!
//! - A record whose header or body would end past the end of the file, or a remainder of only
//!   zero bytes, is a **torn tail**: the write that was cut short was never acknowledged (the
//!   log is fsynced before any write it holds is answered). The file is truncated to the last
//!   whole record and the truncation reported.
//! - Any other damage (a length whose check fails, a body whose checksum fails, a whole record
//!   that does not parse, a version that is not the file's) is **corruption**: the records after
//!   it cannot be trusted to be framed right, so none of it is replayed: it is reported with the
//!   path and offset, set aside as it is for inspection (`.log.corrupt`), and the version's held
//!   partitions are copied from a replica into a new log (persist.rs), refused until then.
//!
//! # Group commit
//!
//! A writer appends its records to the log's pending buffer *while it still holds the partition's
//! write lock* (`TableVersion::put_batch_then`), so the log's order is the order in which writes
//! were applied; the reply is composed, and the connection then awaits [`Log::commit_async`]
//! before anything of it is sent. The first committer with no fsync in flight leads: on the
//! runtime's blocking pool it takes the whole pending buffer (its own records and whatever other
//! connections, on this worker or others, appended meanwhile), writes it with one `write`, calls
//! `fdatasync` once, and wakes every committer it covered; committers that arrive while it syncs
//! wait (without blocking their worker thread, whose other connections go on and append to the
//! next group), and one of them leads the next group. There is no log thread of its own.
//! [`Log::commit`] is the same for a plain thread (blocking).
//!
//! A write or fsync that fails poisons the log: every request waiting on it and every later write
//! to the version is refused (`INTERNAL "data directory: ..."`) until the server restarts. After a
//! failed fsync the kernel may already have dropped the dirty pages, so retrying cannot prove
//! anything is on disk.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use xxhash_rust::xxh3::xxh3_64;

/// The file's first 8 bytes.
pub const MAGIC: [u8; 8] = *b"RGWAL\0\0\0";
/// The format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the file header.
pub const HEADER_LEN: usize = 40;
/// Bytes of a record's header (length, length check, body checksum).
pub const RECORD_HEADER_LEN: usize = 16;
/// The smallest body: version, partition, op count.
pub const RECORD_MIN_BODY: usize = 12;
/// The largest body: a request frame is at most 4 GiB, and so is what it logs.
pub const RECORD_MAX_BODY: usize = u32::MAX as usize;

/// Process-wide counters of every log, for `stats` (`log_commits / log_syncs` is how many writes
/// one fsync made durable: the group commit's effect).
#[derive(Debug, Default)]
pub struct LogStats {
    /// Writes that waited for their log records to be durable.
    pub commits: AtomicU64,
    /// `fdatasync` calls (each made one group durable).
    pub syncs: AtomicU64,
    /// Bytes written to logs (records; headers not counted).
    pub bytes: AtomicU64,
}

/// The counters of all logs of this process.
pub static STATS: LogStats = LogStats {
    commits: AtomicU64::new(0),
    syncs: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
};

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

/// One change a record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Set `key` to `value` (the value in the wire's encoding for the table's type).
    Put(&'a [u8], &'a [u8]),
    /// Remove `key`.
    Delete(&'a [u8]),
}

/// One record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// The partition its ops belong to.
    pub partition: u32,
    /// The ops, in the order they were applied.
    pub ops: Vec<Op<'a>>,
}

/// The file header for a log of `version` of the table incarnation `incarnation`.
pub fn header(version: u32, incarnation: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&version.to_le_bytes());
    h[16..24].copy_from_slice(&incarnation.to_le_bytes());
    let sum = xxh3_64(&h[0..32]);
    h[32..40].copy_from_slice(&sum.to_le_bytes());
    h
}

fn length_check(len: u32) -> u32 {
    xxh3_64(&len.to_le_bytes()) as u32
}

/// Append one record of `ops` (for `version`, `partition`) to `out`. Nothing is appended when
/// `ops` is empty. Returns the bytes appended.
pub fn encode_record<'a>(
    out: &mut Vec<u8>,
    version: u32,
    partition: u32,
    ops: impl Iterator<Item = Op<'a>>,
) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&partition.to_le_bytes());
    let count_at = out.len();
    out.extend_from_slice(&[0u8; 4]);
    let mut count = 0u32;
    for op in ops {
        count += 1;
        match op {
            Op::Put(k, v) => {
                out.push(OP_PUT);
                out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                out.extend_from_slice(k);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            Op::Delete(k) => {
                out.push(OP_DELETE);
                out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                out.extend_from_slice(k);
            }
        }
    }
    if count == 0 {
        out.truncate(start);
        return 0;
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    let body_len = out.len() - start - RECORD_HEADER_LEN;
    let len = u32::try_from(body_len).expect("a record is at most one request frame");
    let sum = xxh3_64(&out[start + RECORD_HEADER_LEN..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&length_check(len).to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&sum.to_le_bytes());
    out.len() - start
}

/// How a log file ends, as [`scan`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every byte belongs to a whole, valid record.
    Clean,
    /// A record cut short (or a zero-filled remainder) from `at` to the end: to be truncated.
    TornTail {
        /// Offset of the first byte that is not part of a whole record.
        at: u64,
        /// Bytes after it.
        bytes: u64,
    },
    /// Damage at `at` that a crash cannot explain.
    Corrupt {
        /// Offset of the record (or header) that failed.
        at: u64,
        /// What failed.
        what: String,
    },
}

/// A log file read back: its valid records, in order, and how it ends.
#[derive(Debug)]
pub struct Scan<'a> {
    /// The records before the first damage.
    pub records: Vec<Record<'a>>,
    /// Bytes of the header and those records (where a torn tail is cut).
    pub good_len: u64,
    /// How the file ends.
    pub end: End,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
}

fn parse_body(body: &[u8], version: u32) -> Result<Record<'_>, String> {
    let mut c = Cursor { b: body, at: 0 };
    let bad = || "record body does not parse".to_string();
    let v = c.u32().ok_or_else(bad)?;
    if v != version {
        return Err(format!(
            "record for version {v} in the log of version {version}"
        ));
    }
    let partition = c.u32().ok_or_else(bad)?;
    let count = c.u32().ok_or_else(bad)?;
    let mut ops = Vec::with_capacity((count as usize).min(body.len() / 5));
    for _ in 0..count {
        let kind = c.u8().ok_or_else(bad)?;
        let klen = c.u32().ok_or_else(bad)? as usize;
        let key = c.take(klen).ok_or_else(bad)?;
        ops.push(match kind {
            OP_PUT => {
                let vlen = c.u32().ok_or_else(bad)? as usize;
                Op::Put(key, c.take(vlen).ok_or_else(bad)?)
            }
            OP_DELETE => Op::Delete(key),
            k => return Err(format!("unknown op {k}")),
        });
    }
    if c.at != body.len() {
        return Err("trailing bytes in a record body".into());
    }
    Ok(Record { partition, ops })
}

/// The record at the start of `rest` and its length; `Err(None)` if it is cut short by the end
/// of the file, `Err(Some(what))` if it is damaged.
fn record_at(rest: &[u8], version: u32) -> Result<(Record<'_>, usize), Option<String>> {
    if rest.len() < RECORD_HEADER_LEN {
        return Err(None);
    }
    let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes"));
    let check = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    if check != length_check(len) || (len as usize) < RECORD_MIN_BODY {
        return Err(Some("record length check mismatch".into()));
    }
    let Some(body) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len as usize) else {
        return Err(None);
    };
    let sum = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
    if sum != xxh3_64(body) {
        return Err(Some("record checksum mismatch".into()));
    }
    let r = parse_body(body, version).map_err(Some)?;
    Ok((r, RECORD_HEADER_LEN + len as usize))
}

/// Read a whole log file: check its header against `version` and `incarnation`, then every
/// record (module docs for what counts as torn and what as corrupt).
pub fn scan(bytes: &[u8], version: u32, incarnation: u64) -> Scan<'_> {
    let corrupt = |at: usize, what: String| Scan {
        records: Vec::new(),
        good_len: 0,
        end: End::Corrupt {
            at: at as u64,
            what,
        },
    };
    if bytes.len() < HEADER_LEN {
        // A log appears under its name only once its header is on disk (Log::create), so a
        // short header is damage, not a crash.
        return corrupt(0, format!("file header cut short ({} bytes)", bytes.len()));
    }
    let h = &bytes[..HEADER_LEN];
    if h[0..8] != MAGIC {
        return corrupt(0, "not a ramgrid log (bad magic)".into());
    }
    if u64::from_le_bytes(h[32..40].try_into().expect("8 bytes")) != xxh3_64(&h[0..32]) {
        return corrupt(0, "file header checksum mismatch".into());
    }
    let format = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if format != FORMAT_VERSION {
        return corrupt(0, format!("unknown log format version {format}"));
    }
    if h != header(version, incarnation) {
        return corrupt(
            0,
            format!(
                "file header names version {} incarnation {:016x}, not version {version} \
                 incarnation {incarnation:016x}",
                u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")),
                u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
            ),
        );
    }
    let mut records = Vec::new();
    let mut at = HEADER_LEN;
    let end = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break End::Clean;
        }
        let verdict = record_at(rest, version);
        let damage = match verdict {
            Ok((r, used)) => {
                records.push(r);
                at += used;
                continue;
            }
            Err(damage) => damage,
        };
        // Looked at only once something is wrong, so a clean log costs one pass.
        let zeros = rest.iter().all(|&b| b == 0);
        break match damage {
            None => End::TornTail {
                at: at as u64,
                bytes: rest.len() as u64,
            },
            Some(_) if zeros => End::TornTail {
                at: at as u64,
                bytes: rest.len() as u64,
            },
            Some(what) => End::Corrupt {
                at: at as u64,
                what,
            },
        };
    };
    if let End::Corrupt { .. } = end {
        // Nothing of a corrupt log is used: records before the damage are fine, but a version
        // restored from a prefix would silently lack acknowledged writes.
        records.clear();
    }
    Scan {
        records,
        good_len: at as u64,
        end,
    }
}

/// The open log of one open version: where writers append and commit.
#[derive(Debug)]
pub struct Log {
    path: PathBuf,
    version: u32,
    pending: Mutex<Pending>,
    state: Mutex<SyncState>,
    /// Wakes blocked committers ([`Log::commit`]).
    synced: Condvar,
    /// Wakes committing tasks ([`Log::commit_async`]).
    notify: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    /// Bytes appended since the log was opened (a commit ticket is such an offset).
    appended: u64,
}

#[derive(Debug)]
struct SyncState {
    /// Taken by the leader while it writes and syncs.
    file: Option<File>,
    /// The leader's buffer between groups (swapped with the pending one, so neither reallocates).
    spare: Vec<u8>,
    /// Appended bytes known to be on disk.
    durable: u64,
    /// File length: header, torn-tail-free records, everything durable since.
    len: u64,
    syncing: bool,
    failed: Option<String>,
    syncs: u64,
}

impl Log {
    fn with_file(path: PathBuf, version: u32, file: File, len: u64) -> Log {
        Log {
            path,
            version,
            pending: Mutex::new(Pending::default()),
            state: Mutex::new(SyncState {
                file: Some(file),
                spare: Vec::new(),
                durable: 0,
                len,
                syncing: false,
                failed: None,
                syncs: 0,
            }),
            synced: Condvar::new(),
            notify: tokio::sync::Notify::new(),
        }
    }

    /// Create the log of a new open version. The header is written to `<path>.tmp` and fsynced,
    /// then linked to `path` (which must not exist: an existing log is never replaced) and the
    /// directory fsynced, so a log file always has its whole header.
    pub fn create(path: &Path, version: u32, incarnation: u64) -> io::Result<Log> {
        let tmp = path.with_extension("log.tmp");
        let mut f = File::create(&tmp)?;
        let done = f
            .write_all(&header(version, incarnation))
            .and_then(|()| f.sync_all())
            .and_then(|()| fs::hard_link(&tmp, path));
        let _ = fs::remove_file(&tmp);
        done?;
        File::open(path.parent().expect("a log lives in a dir"))?.sync_all()?;
        drop(f);
        let f = OpenOptions::new().append(true).open(path)?;
        Ok(Log::with_file(
            path.to_owned(),
            version,
            f,
            HEADER_LEN as u64,
        ))
    }

    /// Open a replayed log to append to it, cutting it to `good_len` first (a torn tail).
    pub fn reopen(path: &Path, version: u32, good_len: u64) -> io::Result<Log> {
        let f = OpenOptions::new().write(true).open(path)?;
        if f.metadata()?.len() != good_len {
            f.set_len(good_len)?;
            f.sync_all()?;
        }
        drop(f);
        let f = OpenOptions::new().append(true).open(path)?;
        Ok(Log::with_file(path.to_owned(), version, f, good_len))
    }

    /// The version this log belongs to.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Fsyncs done so far (each one made a whole group durable).
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// `Err` if the log has failed: a write must be refused before it is applied.
    pub fn check(&self) -> Result<(), String> {
        match &self.state.lock().failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Append a record of `ops` (nothing if empty); returns the ticket to [`Log::commit`]. Called
    /// under the partition's write lock, so it only copies into memory.
    pub fn append<'a>(&self, partition: u32, ops: impl Iterator<Item = Op<'a>>) -> u64 {
        let mut p = self.pending.lock();
        let n = encode_record(&mut p.buf, self.version, partition, ops);
        p.appended += n as u64;
        p.appended
    }

    /// Return once every byte appended up to `ticket` is on disk (group commit, module docs),
    /// or with the error that stopped it. Blocks the calling thread; a worker uses
    /// [`Log::commit_async`].
    pub fn commit(&self, ticket: u64) -> Result<(), String> {
        STATS.commits.fetch_add(1, Ordering::Relaxed);
        let mut s = self.state.lock();
        loop {
            if let Some(done) = Self::outcome(&s, ticket) {
                return done;
            }
            if !s.syncing {
                s.syncing = true;
                drop(s);
                self.lead();
                s = self.state.lock();
                continue;
            }
            self.synced.wait(&mut s);
        }
    }

    /// [`Log::commit`] for a worker's task: waiting does not block the worker thread (its other
    /// connections go on, and their writes join the next group), and the leader's write and
    /// fsync run on the runtime's blocking pool.
    pub async fn commit_async(self: &Arc<Self>, ticket: u64) -> Result<(), String> {
        STATS.commits.fetch_add(1, Ordering::Relaxed);
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the state is looked at, so a group that ends in between wakes it.
            notified.as_mut().enable();
            let lead = {
                let mut s = self.state.lock();
                if let Some(done) = Self::outcome(&s, ticket) {
                    return done;
                }
                !std::mem::replace(&mut s.syncing, true)
            };
            if lead {
                let me = self.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || me.lead()).await {
                    return Err(format!("log writer of {}: {e}", self.path.display()));
                }
            } else {
                notified.await;
            }
        }
    }

    /// `Some` once `ticket` is durable, or can never be.
    fn outcome(s: &SyncState, ticket: u64) -> Option<Result<(), String>> {
        if s.durable >= ticket {
            Some(Ok(()))
        } else {
            s.failed.clone().map(Err)
        }
    }

    /// Write and fsync one group: everything pending now, whoever appended it. The caller set
    /// `syncing`; every waiter is woken at the end.
    fn lead(&self) {
        let mut s = self.state.lock();
        debug_assert!(s.syncing);
        let mut file = s.file.take().expect("only the leader takes the file");
        let mut buf = std::mem::take(&mut s.spare);
        let len = s.len;
        drop(s);
        let end = {
            let mut p = self.pending.lock();
            std::mem::swap(&mut p.buf, &mut buf);
            p.appended
        };
        let r = file.write_all(&buf).and_then(|()| file.sync_data());
        STATS.syncs.fetch_add(1, Ordering::Relaxed);
        STATS.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        let mut s = self.state.lock();
        match r {
            Ok(()) => {
                s.durable = end;
                s.len = len + buf.len() as u64;
            }
            Err(e) => {
                // Best effort: leave no half group for the restart to find (it would be read
                // as a torn tail anyway).
                let _ = file.set_len(len);
                s.failed = Some(format!("cannot append to {}: {e}", self.path.display()));
            }
        }
        buf.clear();
        s.spare = buf;
        s.syncs += 1;
        s.file = Some(file);
        s.syncing = false;
        drop(s);
        self.synced.notify_all();
        self.notify.notify_waiters();
    }
}

/// Which log: (table name, incarnation, version).
type LogId = (String, u64, u32);

/// The open logs of a server, by table incarnation and version. A version whose log was refused
/// at restart (corrupt, kept for inspection) is listed without a log: it takes no writes, and no
/// new log is made over the old file.
#[derive(Debug, Default)]
pub struct Logs {
    open: Mutex<HashMap<LogId, Option<Arc<Log>>>>,
}

impl Logs {
    /// The log of `version` of `name`/`incarnation`, if one is open.
    pub fn get(&self, name: &str, incarnation: u64, version: u32) -> Option<Arc<Log>> {
        self.open
            .lock()
            .get(&(name.to_owned(), incarnation, version))
            .cloned()
            .flatten()
    }

    /// Whether the version is listed, with a log or as refused.
    pub fn known(&self, name: &str, incarnation: u64, version: u32) -> bool {
        self.open
            .lock()
            .contains_key(&(name.to_owned(), incarnation, version))
    }

    /// Register an open log.
    pub fn insert(&self, name: &str, incarnation: u64, log: Log) {
        self.open.lock().insert(
            (name.to_owned(), incarnation, log.version),
            Some(Arc::new(log)),
        );
    }

    /// List a version whose log was refused at restart: it gets no log.
    pub fn insert_refused(&self, name: &str, incarnation: u64, version: u32) {
        self.open
            .lock()
            .insert((name.to_owned(), incarnation, version), None);
    }

    /// Forget a version's log and delete its file (sealed: its images hold it now; or dropped).
    /// Writers still committing to it finish on the unlinked file.
    pub fn remove(
        &self,
        name: &str,
        incarnation: u64,
        version: u32,
        path: &Path,
    ) -> io::Result<()> {
        self.open
            .lock()
            .remove(&(name.to_owned(), incarnation, version));
        match fs::remove_file(path) {
            Ok(()) => File::open(path.parent().expect("a log lives in a dir"))?.sync_all(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Forget every log of a table incarnation (its directory is being removed).
    pub fn forget_table(&self, name: &str, incarnation: u64) {
        self.open
            .lock()
            .retain(|(n, i, _), _| !(n == name && *i == incarnation));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn temp_dir(tag: &str) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "ramgrid-wal-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn sample() -> Vec<u8> {
        let mut b = header(7, 0xabc).to_vec();
        encode_record(
            &mut b,
            7,
            3,
            [Op::Put(b"a", b"1"), Op::Put(b"bb", b""), Op::Delete(b"a")].into_iter(),
        );
        encode_record(&mut b, 7, 0, [Op::Delete(b"zz")].into_iter());
        encode_record(&mut b, 7, 1, std::iter::empty());
        b
    }

    #[test]
    fn records_round_trip() {
        let b = sample();
        let s = scan(&b, 7, 0xabc);
        assert_eq!(s.end, End::Clean);
        assert_eq!(s.good_len, b.len() as u64);
        assert_eq!(
            s.records,
            vec![
                Record {
                    partition: 3,
                    ops: vec![Op::Put(b"a", b"1"), Op::Put(b"bb", b""), Op::Delete(b"a")]
                },
                Record {
                    partition: 0,
                    ops: vec![Op::Delete(b"zz")]
                },
            ]
        );
        // A header alone is an empty, clean log.
        let h = header(7, 0xabc);
        assert_eq!(scan(&h, 7, 0xabc).end, End::Clean);
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail_keeping_the_rest() {
        let b = sample();
        let first_end = scan(&b[..], 7, 0xabc).good_len;
        let whole = {
            let mut one = header(7, 0xabc).to_vec();
            encode_record(
                &mut one,
                7,
                3,
                [Op::Put(b"a", b"1"), Op::Put(b"bb", b""), Op::Delete(b"a")].into_iter(),
            );
            one.len()
        };
        for cut in whole + 1..b.len() {
            let s = scan(&b[..cut], 7, 0xabc);
            assert_eq!(
                s.end,
                End::TornTail {
                    at: whole as u64,
                    bytes: (cut - whole) as u64
                },
                "cut at {cut}"
            );
            assert_eq!(s.records.len(), 1);
            assert_eq!(s.good_len, whole as u64);
        }
        assert_eq!(first_end, b.len() as u64);
        // A zero-filled remainder (a file extended but not written) is torn too.
        let mut z = b.clone();
        z.extend_from_slice(&[0u8; 100]);
        let s = scan(&z, 7, 0xabc);
        assert_eq!(
            s.end,
            End::TornTail {
                at: b.len() as u64,
                bytes: 100
            }
        );
        assert_eq!(s.records.len(), 2);
    }

    #[test]
    fn damage_anywhere_else_is_corruption_and_nothing_is_replayed() {
        let b = sample();
        let last_start = {
            let mut one = header(7, 0xabc).to_vec();
            encode_record(
                &mut one,
                7,
                3,
                [Op::Put(b"a", b"1"), Op::Put(b"bb", b""), Op::Delete(b"a")].into_iter(),
            );
            one.len()
        };
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            let s = scan(&d, 7, 0xabc);
            // A flipped bit in the last record's length may make it look longer than the file
            // (torn); only if its length check still passes, which it does not.
            match &s.end {
                End::Corrupt { at, .. } => {
                    assert!(s.records.is_empty(), "byte {i}");
                    assert!(*at == 0 || *at >= HEADER_LEN as u64);
                }
                other => panic!("byte {i} (last record at {last_start}): {other:?}"),
            }
        }
        assert!(matches!(scan(&b, 8, 0xabc).end, End::Corrupt { .. }));
        assert!(matches!(scan(&b, 7, 0xabd).end, End::Corrupt { .. }));
        assert!(matches!(scan(&b[..20], 7, 0xabc).end, End::Corrupt { .. }));
    }

    /// Writes the fuzz target's seeds: `cargo test -p ramgrid-server --lib write_fuzz_seeds --
    /// -- --ignored` (to fuzz/seeds/wal_log/). Logs of a few records each (the target reads the
    /// version and incarnation to expect from the header), and damaged ones.
    #[test]
    #[ignore = "writes files; run by hand to refresh the fuzz seeds"]
    fn write_fuzz_seeds() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/wal_log");
        fs::create_dir_all(dir).unwrap();
        let write = |name: &str, b: &[u8]| {
            assert!(b.len() <= 4096, "seeds stay under the fuzz runs' -max_len");
            fs::write(format!("{dir}/{name}"), b).unwrap();
        };
        let i64v = 42i64.to_le_bytes();
        let f32v: Vec<u8> = [1.5f32, -0.0, f32::NAN]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let long = vec![b'k'; 300];
        write("empty", &header(1, 1));
        write("sample", &sample());
        let mut logs = Vec::new();
        for (n, (version, incarnation)) in [(1u32, 0u64), (2, 0xdead_beef), (u32::MAX, u64::MAX)]
            .into_iter()
            .enumerate()
        {
            let mut b = header(version, incarnation).to_vec();
            encode_record(&mut b, version, 0, [Op::Put(b"k", &i64v)].into_iter());
            encode_record(
                &mut b,
                version,
                7,
                [Op::Put(b"vec", &f32v), Op::Delete(b"k"), Op::Put(b"", b"")].into_iter(),
            );
            if n > 0 {
                encode_record(
                    &mut b,
                    version,
                    u32::MAX,
                    [Op::Put(&long, &long), Op::Delete(&long)].into_iter(),
                );
            }
            write(&format!("log{n}"), &b);
            logs.push(b);
        }
        let b = &logs[1];
        let last = scan(&b[..b.len() - 1], 2, 0xdead_beef).good_len as usize;
        write("torn-header", &b[..last + 10]);
        write("torn-body", &b[..b.len() - 3]);
        let mut z = b.clone();
        z.extend_from_slice(&[0; 64]);
        write("zero-tail", &z);
        let mut flipped = b.clone();
        flipped[HEADER_LEN + 20] ^= 1;
        write("corrupt-body", &flipped);
        let mut len = b.clone();
        len[HEADER_LEN] ^= 1;
        write("corrupt-length", &len);
        write("short-header", &b[..30]);
        let mut other = header(5, 5).to_vec();
        encode_record(&mut other, 6, 0, [Op::Delete(b"x")].into_iter());
        write("wrong-version", &other);
    }

    #[test]
    fn commits_are_durable_and_concurrent_committers_share_fsyncs() {
        let dir = temp_dir("group");
        let path = dir.join("v2.log");
        let log = Arc::new(Log::create(&path, 2, 9).unwrap());
        assert!(
            Log::create(&path, 2, 9).is_err(),
            "never over an existing log"
        );
        let threads = 8;
        let per = 50;
        std::thread::scope(|s| {
            for t in 0..threads {
                let log = log.clone();
                s.spawn(move || {
                    for i in 0..per {
                        let k = format!("k{t}-{i}");
                        let ticket = log.append(t, [Op::Put(k.as_bytes(), b"v")].into_iter());
                        log.commit(ticket).unwrap();
                    }
                });
            }
        });
        let syncs = log.syncs();
        assert!(syncs <= (threads * per) as u64);
        let bytes = fs::read(&path).unwrap();
        let s = scan(&bytes, 2, 9);
        assert_eq!(s.end, End::Clean);
        assert_eq!(s.records.len(), (threads * per) as usize);
        // Each thread's records are in its own order.
        for t in 0..threads {
            let mine: Vec<_> = s
                .records
                .iter()
                .filter(|r| r.partition == t)
                .map(|r| r.ops[0])
                .collect();
            let want: Vec<String> = (0..per).map(|i| format!("k{t}-{i}")).collect();
            let got: Vec<&[u8]> = mine
                .iter()
                .map(|o| match o {
                    Op::Put(k, _) => *k,
                    Op::Delete(k) => *k,
                })
                .collect();
            let want: Vec<&[u8]> = want.iter().map(|w| w.as_bytes()).collect();
            assert_eq!(got, want);
        }
        eprintln!("{} commits, {syncs} fsyncs", threads * per);
        // A reopened log cut at a torn tail goes on appending after the good part.
        let mut torn = bytes.clone();
        torn.extend_from_slice(&bytes[HEADER_LEN..HEADER_LEN + 10]);
        fs::write(&path, &torn).unwrap();
        let s = scan(&torn, 2, 9);
        assert!(matches!(s.end, End::TornTail { bytes: 10, .. }));
        let log = Log::reopen(&path, 2, s.good_len).unwrap();
        let t = log.append(5, [Op::Delete(b"x")].into_iter());
        log.commit(t).unwrap();
        let again = fs::read(&path).unwrap();
        let s = scan(&again, 2, 9);
        assert_eq!(s.end, End::Clean);
        assert_eq!(s.records.len(), (threads * per) as usize + 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Tasks of one single-threaded runtime (one worker's connections) waiting for their commits
    /// do not block each other: their records join one group.
    #[test]
    fn async_committers_on_one_worker_thread_share_fsyncs() {
        let dir = temp_dir("async");
        let path = dir.join("v3.log");
        let log = Arc::new(Log::create(&path, 3, 4).unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tasks, per) = (16u32, 20u32);
        rt.block_on(async {
            let mut handles = Vec::new();
            for t in 0..tasks {
                let log = log.clone();
                handles.push(tokio::spawn(async move {
                    for i in 0..per {
                        let k = format!("{t}-{i}");
                        let ticket = log.append(t, [Op::Delete(k.as_bytes())].into_iter());
                        log.commit_async(ticket).await.unwrap();
                    }
                }));
            }
            for h in handles {
                h.await.unwrap();
            }
        });
        let commits = u64::from(tasks * per);
        let syncs = log.syncs();
        assert!(
            syncs * 4 <= commits,
            "{commits} commits took {syncs} fsyncs"
        );
        let bytes = fs::read(&path).unwrap();
        let s = scan(&bytes, 3, 4);
        assert_eq!((s.end, s.records.len() as u64), (End::Clean, commits));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_append_is_refused_and_poisons_the_log() {
        let dir = temp_dir("fail");
        let path = dir.join("v1.log");
        let log = Log::create(&path, 1, 1).unwrap();
        // Replace the open file with one that cannot be written (opened read-only).
        log.state.lock().file = Some(File::open(&path).unwrap());
        let t = log.append(0, [Op::Put(b"k", b"v")].into_iter());
        let e = log.commit(t).unwrap_err();
        assert!(
            e.contains("cannot append to") && e.contains("v1.log"),
            "{e}"
        );
        assert!(log.check().is_err());
        let t2 = log.append(0, [Op::Put(b"k2", b"v")].into_iter());
        assert!(log.commit(t2).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
