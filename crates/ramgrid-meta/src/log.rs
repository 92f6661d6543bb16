//! The Raft log and vote: in memory, or durable under a directory.
//!
//! Durable layout: `raft.log` is append-only, one checksummed record per entry (see `disk`);
//! an append is fsynced (`sync_data`) before openraft is told it is flushed. Truncation (a
//! conflicting suffix, rare) and purging (after a snapshot) rewrite the file atomically with
//! what remains, led by a `Purged` record; the log stays short because it is purged after every
//! snapshot. `raft.vote` is replaced atomically on every vote change, and `raft.committed` each
//! time the commit index moves (a hint, not fsynced: an entry it names is committed, and a
//! crash costs only re-applying less): a restarted node re-applies its committed entries at
//! once, so it knows the spec and catalog it left with before any leader reaches it.
//!
//! The whole log is also kept in memory: metadata logs are small, and reads never touch disk.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io::Write;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogId, StorageError, StorageIOError, Vote};
use serde::{Deserialize, Serialize};

use crate::disk;
use crate::state::NodeId;
use crate::TypeConfig;

/// The log file's name in the directory.
pub const LOG_FILE: &str = "raft.log";
/// The vote file's name in the directory.
pub const VOTE_FILE: &str = "raft.vote";
/// The file holding the last committed log id this node learned.
pub const COMMITTED_FILE: &str = "raft.committed";

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum LogRecord {
    Entry(Entry<TypeConfig>),
    /// Every entry up to this one was purged (it leads a rewritten file).
    Purged(LogId<NodeId>),
}

/// The log storage handed to openraft; clones share one log.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

struct LogInner {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    disk: Option<LogDisk>,
}

struct LogDisk {
    dir: PathBuf,
    log: File,
}

type StorageResult<T> = Result<T, StorageError<NodeId>>;

impl LogStore {
    /// An empty log in memory.
    pub fn in_memory() -> LogStore {
        LogStore::from_inner(LogInner {
            entries: BTreeMap::new(),
            last_purged: None,
            vote: None,
            committed: None,
            disk: None,
        })
    }

    /// The log under `dir`, created if absent. A torn record at the end of the log file (a crash
    /// during its append, which was therefore never acknowledged) is cut off; any other damage
    /// is an error naming the file.
    pub fn open(dir: &Path) -> Result<LogStore, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(LOG_FILE);
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        match std::fs::read(&path) {
            Ok(bytes) => {
                let read = decode_log(&bytes, &path)?;
                (entries, last_purged) = (read.entries, read.last_purged);
                if read.valid_len < bytes.len() {
                    disk::truncate_file(&path, read.valid_len as u64)
                        .map_err(|e| format!("{}: cutting a torn tail: {e}", path.display()))?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        let vote = disk::read_value(dir, VOTE_FILE)?;
        // A hint, written without waiting for the disk: a crash may leave it damaged or old,
        // and then the node re-applies less at its start (openraft learns the rest from a leader).
        let committed = disk::read_value(dir, COMMITTED_FILE).unwrap_or(None);
        let log = disk::open_append(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(LogStore::from_inner(LogInner {
            entries,
            last_purged,
            vote,
            committed,
            disk: Some(LogDisk {
                dir: dir.to_owned(),
                log,
            }),
        }))
    }

    fn from_inner(inner: LogInner) -> LogStore {
        LogStore {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        // A panic while holding the lock leaves the log as consistent as the step it was at;
        // openraft treats storage errors as fatal anyway.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of entries held (after purging), for tests and status.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the log holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this log ever took part in a group: a vote, entries, or a purge behind a snapshot.
    pub fn holds_state(&self) -> bool {
        let g = self.lock();
        g.vote.is_some() || !g.entries.is_empty() || g.last_purged.is_some()
    }
}

/// A log file's contents as [`LogStore::open`] reads them.
pub(crate) struct DecodedLog {
    /// The entries by index, after the purges the file records.
    pub entries: BTreeMap<u64, Entry<TypeConfig>>,
    /// The last purge the file records.
    pub last_purged: Option<LogId<NodeId>>,
    /// Where its whole records end (the rest is a torn tail, to be cut).
    pub valid_len: usize,
}

/// Decode the bytes of a log file (`path` names it in errors): its records, each an entry or a
/// purge, applied in file order.
pub(crate) fn decode_log(bytes: &[u8], path: &Path) -> Result<DecodedLog, String> {
    let scanned = disk::scan_records(bytes, path)?;
    let mut entries = BTreeMap::new();
    let mut last_purged = None;
    for payload in &scanned.records {
        let rec: LogRecord = serde_json::from_slice(payload)
            .map_err(|e| format!("{}: undecodable record: {e}", path.display()))?;
        match rec {
            LogRecord::Entry(e) => {
                entries.insert(e.log_id.index, e);
            }
            LogRecord::Purged(id) => {
                entries.retain(|&i, _| i > id.index);
                last_purged = Some(id);
            }
        }
    }
    Ok(DecodedLog {
        entries,
        last_purged,
        valid_len: scanned.valid_len,
    })
}

/// The bytes of a rewritten log file holding `entries` after a purge up to `last_purged`.
pub(crate) fn encode_log<'a>(
    last_purged: Option<LogId<NodeId>>,
    entries: impl Iterator<Item = &'a Entry<TypeConfig>>,
) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut push = |rec: &LogRecord| {
        let payload = serde_json::to_vec(rec).expect("log records encode");
        disk::encode_record(&payload, &mut bytes);
    };
    if let Some(id) = last_purged {
        push(&LogRecord::Purged(id));
    }
    for e in entries {
        push(&LogRecord::Entry(e.clone()));
    }
    bytes
}

impl LogInner {
    /// Rewrite the log file with what remains, atomically.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let Some(d) = &mut self.disk else {
            return Ok(());
        };
        let bytes = encode_log(self.last_purged, self.entries.values());
        disk::atomic_write(&d.dir, LOG_FILE, &bytes)?;
        d.log = disk::open_append(&d.dir.join(LOG_FILE))?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let g = self.lock();
        let last = g.entries.values().next_back().map(|e| *e.get_log_id());
        Ok(LogState {
            last_purged_log_id: g.last_purged,
            last_log_id: last.or(g.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let mut g = self.lock();
        if let Some(d) = &g.disk {
            disk::blocking(|| disk::write_value(&d.dir, VOTE_FILE, vote))
                .map_err(|e| StorageIOError::write_vote(&disk::io(e)))?;
        }
        g.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let mut g = self.lock();
        if g.committed == committed {
            return Ok(());
        }
        if let Some(d) = &g.disk {
            disk::blocking(|| disk::write_hint(&d.dir, COMMITTED_FILE, &committed))
                .map_err(|e| StorageIOError::write(&disk::io(e)))?;
        }
        g.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        // Never past what the log holds (a log cut short by hand, say): re-applying starts
        // from the state machine and reads the log up to it.
        let g = self.lock();
        let last = g
            .entries
            .values()
            .next_back()
            .map(|e| *e.get_log_id())
            .or(g.last_purged);
        Ok(g.committed
            .filter(|c| Some(c.index) <= last.map(|l| l.index)))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut g = self.lock();
        let entries: Vec<_> = entries.into_iter().collect();
        if let Some(d) = &mut g.disk {
            let mut bytes = Vec::new();
            for e in &entries {
                let rec = LogRecord::Entry(e.clone());
                let payload =
                    serde_json::to_vec(&rec).map_err(|e| StorageIOError::write_logs(&e))?;
                disk::encode_record(&payload, &mut bytes);
            }
            // The entries are acknowledged (the callback below) only once on disk.
            let res = disk::blocking(|| d.log.write_all(&bytes).and_then(|()| d.log.sync_data()));
            if let Err(e) = res {
                let msg = format!("{}: {e}", d.dir.join(LOG_FILE).display());
                callback.log_io_completed(Err(std::io::Error::other(msg.clone())));
                return Err(StorageIOError::write_logs(&disk::io(msg)).into());
            }
        }
        for e in entries {
            g.entries.insert(e.log_id.index, e);
        }
        drop(g);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut g = self.lock();
        g.entries.retain(|&i, _| i < log_id.index);
        disk::blocking(|| g.rewrite()).map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut g = self.lock();
        g.entries.retain(|&i, _| i > log_id.index);
        g.last_purged = Some(log_id);
        disk::blocking(|| g.rewrite()).map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}
