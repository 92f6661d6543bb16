//! Native tables: named, partitioned, versioned, typed key -> value data that jobs use as side
//! resources (language-model probabilities, model parameters, join tables).
//!
//! Tables are authoritative data, not a cache: nothing is ever evicted. Every allocation is charged
//! to one memory budget ([`TablesConfig::memory_limit`]) before it is made; a write that does not
//! fit fails with [`KeyStatus::OutOfMemory`] and leaves that key exactly as it was.
//!
//! # Versions
//!
//! A table is a set of numbered versions and a pointer to the current one. A version is OPEN
//! (writable) until [`Tables::seal_version`], then immutable forever; only a sealed version can be
//! made current ([`Tables::set_current`], one pointer switch under the table's lock). Readers pass
//! version 0 for "current" or a number to pin one; a pinned version stays readable until
//! [`Tables::drop_version`]. [`Tables::at`] resolves the version once and returns a
//! [`TableVersion`] handle: every batch made through it (a request's partition groups) reads that
//! one version, even if the current pointer moves or the version is dropped meanwhile.
//!
//! **Mutable head.** [`Tables::create_table`] also creates version 1, OPEN and current, so simple
//! use (put, then get with version 0) needs no version ceremony. A loader that wants an atomic
//! switch writes version 2+ instead, seals it and makes it current; sealing version 1 in place is
//! allowed too.
//!
//! # Concurrency
//!
//! Each (version, partition) has its own lock. Writes take it exclusively; reads of an OPEN version
//! take it shared for the whole batch. Sealing moves the partition's data into a write-once cell,
//! after which reads take no lock at all: sealed data never changes. The registry and each table's
//! version map are behind short read-mostly locks taken once per [`Tables::at`], never per key.
//!
//! # Cost per key
//!
//! Batch lookups go through the keys in windows and prefetch each step of the lookup for the whole
//! window (see `partition.rs`), so a batch into a table far larger than the CPU caches pays for
//! overlapping cache misses, not one miss after another; nothing allocates per key. A window may
//! mix partitions: [`TableVersion::get_groups`] runs a whole request, spread over any number of
//! partitions, through one pipeline. A request of 100 keys over 64 partitions is 1-2 keys per
//! partition, too few for a per-partition pipeline to overlap anything.
//!
//! # Partitions
//!
//! The server says which partitions it holds under the current cluster map
//! ([`Tables::create_table`], [`Tables::set_held_partitions`]); a request for any other partition
//! fails with [`Error::NotHeld`]. Data of a partition that stops being held is kept (so a migration
//! could still copy it) until its version or table is dropped. A scan visits one partition of one
//! version, so its cost is proportional to that partition's items, not to the server's.

mod copy;
pub use copy::PendingVersion;
mod merge;
pub use merge::MergeOp;
pub(crate) mod partition;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::{Error, Result};
use partition::{key_hash, Meter, PartData};

/// Longest key accepted, in bytes (64 KiB).
pub const MAX_KEY_LEN: usize = 64 << 10;

/// Longest table name accepted, in bytes.
pub const MAX_TABLE_NAME: usize = 255;

/// Most partitions a table may have.
pub const MAX_PARTITIONS: u32 = 1 << 16;

/// Most floats in an f32 vector value (as the native protocol allows).
pub const MAX_F32_DIM: u32 = 1 << 16;

/// Type of every value in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// Opaque byte strings up to [`TablesConfig::max_value_size`].
    Bytes,
    /// Signed 64-bit integers.
    I64,
    /// 64-bit floats.
    F64,
    /// Vectors of exactly `dim` 32-bit floats.
    F32Vec {
        /// Number of floats per value (at least 1).
        dim: u32,
    },
}

impl ValueType {
    /// Bytes one value takes in the packed batch layout, or `None` for variable-length bytes.
    pub fn packed_width(self) -> Option<usize> {
        match self {
            ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::F32Vec { dim } => Some(dim as usize * 4),
            ValueType::Bytes => None,
        }
    }
}

/// What a table is: its name, partition count, replication factor (kept for the cluster layer;
/// the store holds whatever partitions it is told to) and value type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Unique name, 1..=[`MAX_TABLE_NAME`] bytes.
    pub name: String,
    /// Number of partitions, 1..=[`MAX_PARTITIONS`]; fixed for the table's life.
    pub partitions: u32,
    /// Replicas per partition (at least 1).
    pub replication: u32,
    /// Type of the values.
    pub value_type: ValueType,
    /// Whether a server with a data directory keeps the table across a restart.
    pub durability: Durability,
    /// The table's identity, chosen by whoever created it (the same on every server): a table
    /// dropped and created again under the same name has another one.
    pub incarnation: u64,
}

/// How a table is kept across a restart of a server that has a data directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// In memory only: a restart loses it.
    #[default]
    Memory,
    /// Each sealed version is written as snapshot files and loaded at restart.
    Snapshot,
    /// As [`Durability::Snapshot`] for sealed versions, and every write to an open version is
    /// appended to a write-ahead log (fsynced before it is acknowledged) replayed at restart.
    Log,
}

/// Limits of a [`Tables`] registry.
#[derive(Debug, Clone)]
pub struct TablesConfig {
    /// Budget for everything tables allocate (key arenas, indexes, columns), in bytes.
    pub memory_limit: usize,
    /// Largest value of a bytes table, in bytes (at most `u32::MAX`).
    pub max_value_size: usize,
}

impl Default for TablesConfig {
    fn default() -> Self {
        TablesConfig {
            memory_limit: 64 << 20,
            max_value_size: 1 << 20,
        }
    }
}

/// One version as [`Tables::describe`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    /// Version number (> 0).
    pub number: u32,
    /// Whether the version is sealed (immutable).
    pub sealed: bool,
    /// Live keys over the held partitions.
    pub items: u64,
    /// Bytes charged to this version (allocations of its partitions plus bookkeeping).
    pub bytes: u64,
}

/// A table as [`Tables::describe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// The spec it was created with.
    pub spec: TableSpec,
    /// Current version, 0 if none (after a forced drop of the current one).
    pub current: u32,
    /// The highest version number ever created in this table (dropped ones included): a new
    /// version must be numbered above it, so a number never names two different contents.
    pub high_water: u32,
    /// Partitions this store holds, ascending.
    pub held: Vec<u32>,
    /// Every version, ascending by number.
    pub versions: Vec<VersionInfo>,
}

/// A value, borrowed: what reads yield and what writes take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    /// For [`ValueType::I64`].
    I64(i64),
    /// For [`ValueType::F64`].
    F64(f64),
    /// For [`ValueType::F32Vec`]; exactly `dim` floats.
    F32Vec(&'a [f32]),
    /// For [`ValueType::F32Vec`] as `dim * 4` little-endian bytes (straight from a wire buffer,
    /// which need not be aligned for `f32`). Accepted by writes; reads never yield it.
    F32VecLe(&'a [u8]),
    /// For [`ValueType::Bytes`].
    Bytes(&'a [u8]),
}

/// Outcome of one key in a batch, one byte each in the status buffers the batch calls fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum KeyStatus {
    /// Found (reads), stored (puts) or removed (deletes).
    Ok = 0,
    /// No such key (reads, deletes).
    NotFound = 1,
    /// Key longer than [`MAX_KEY_LEN`]; the key was not looked at.
    KeyTooLarge = 2,
    /// Bytes value longer than [`TablesConfig::max_value_size`].
    ValueTooLarge = 3,
    /// The value is not of the table's type (or an f32 vector of the wrong length).
    WrongType = 4,
    /// The memory budget cannot take this key; nothing about it changed.
    OutOfMemory = 5,
}

impl KeyStatus {
    /// The status whose byte is `b`, if any.
    pub fn from_u8(b: u8) -> Option<KeyStatus> {
        Some(match b {
            0 => KeyStatus::Ok,
            1 => KeyStatus::NotFound,
            2 => KeyStatus::KeyTooLarge,
            3 => KeyStatus::ValueTooLarge,
            4 => KeyStatus::WrongType,
            5 => KeyStatus::OutOfMemory,
            _ => return None,
        })
    }
}

/// One (version, partition)'s data: writable behind `open` until sealed, then published once
/// in `frozen` and read without a lock.
#[derive(Debug)]
struct PartSlot {
    /// `None` once the data moved to `frozen`. Invariant: `frozen` is set before `open` becomes
    /// `None`, and both happen under `open`'s write lock.
    open: RwLock<Option<PartData>>,
    /// Shared so that a sealed version can be rebuilt around one partition copied in (a
    /// repair) while its other partitions stay where they are.
    frozen: OnceLock<Arc<PartData>>,
    /// This partition's data should be here but is not yet: it is being copied from a replica
    /// (see `copy.rs`). Reads are refused ([`Error::Repairing`]); an open one takes writes.
    pending: AtomicBool,
    /// While an open partition is pending: the keys written or deleted here since the copy
    /// began, which the copy must not overwrite. Changed only under `open`'s write lock.
    touched: parking_lot::Mutex<Option<std::collections::HashSet<Box<[u8]>>>>,
    /// While an open partition is pending: its data is this server's own replay of its
    /// write-ahead log, which may be served as it is if no replica can give a copy (a whole
    /// cluster restarted; see `copy.rs`). False for a partition emptied for a copy.
    local: AtomicBool,
}

/// A read lock on an open partition, held by [`TableVersion::get_groups`].
type OpenGuard<'a> = RwLockReadGuard<'a, Option<PartData>>;

impl PartSlot {
    fn read<R>(&self, f: impl FnOnce(&PartData) -> R) -> R {
        if let Some(d) = self.frozen.get() {
            return f(d);
        }
        let guard = self.open.read();
        match guard.as_ref() {
            Some(d) => f(d),
            None => {
                drop(guard);
                f(self
                    .frozen
                    .get()
                    .expect("sealed data is published before the open slot empties"))
            }
        }
    }
}

#[derive(Debug)]
struct Version {
    number: u32,
    sealed: AtomicBool,
    parts: Box<[PartSlot]>,
    /// Bytes charged for the slot array itself.
    overhead: usize,
    meter: Arc<Meter>,
}

impl Drop for Version {
    fn drop(&mut self) {
        self.meter.release(self.overhead);
    }
}

impl Version {
    fn new(number: u32, spec: &TableSpec, meter: &Arc<Meter>) -> Result<Version> {
        let overhead = spec.partitions as usize * std::mem::size_of::<PartSlot>();
        if !meter.try_charge(overhead) {
            return Err(Error::OutOfMemory);
        }
        let parts = (0..spec.partitions)
            .map(|_| PartSlot {
                open: RwLock::new(Some(PartData::new(spec.value_type, meter.clone()))),
                frozen: OnceLock::new(),
                pending: AtomicBool::new(false),
                touched: parking_lot::Mutex::new(None),
                local: AtomicBool::new(false),
            })
            .collect();
        Ok(Version {
            number,
            sealed: AtomicBool::new(false),
            parts,
            overhead,
            meter: meter.clone(),
        })
    }

    fn info(&self) -> VersionInfo {
        let (mut items, mut bytes) = (0u64, self.overhead as u64);
        for slot in self.parts.iter() {
            slot.read(|d| {
                items += d.len() as u64;
                bytes += d.charged() as u64;
            });
        }
        VersionInfo {
            number: self.number,
            sealed: self.sealed.load(Ordering::Acquire),
            items,
            bytes,
        }
    }
}

#[derive(Debug)]
struct TableState {
    versions: BTreeMap<u32, Arc<Version>>,
    /// 0 = no current version.
    current: u32,
    /// Highest version number ever created (see [`TableInfo::high_water`]).
    high_water: u32,
    /// Indexed by partition. Replaced whole on a map change, so a [`TableVersion`] keeps the
    /// mask it started with without copying it.
    held: Arc<[bool]>,
}

#[derive(Debug)]
struct Table {
    spec: TableSpec,
    state: RwLock<TableState>,
}

impl TableState {
    fn lookup(&self, version: u32) -> Result<Arc<Version>> {
        let v = if version == 0 { self.current } else { version };
        self.versions
            .get(&v)
            .cloned()
            .ok_or(Error::NoSuchVersion(v))
    }
}

/// One version of one table, resolved once (version 0 = the current one at [`Tables::at`]).
/// The server takes one per request so that every partition group of a request reads the same
/// version, and pays the name and version lookups once, not per group. Holding it keeps the
/// version's data alive (and readable) even if the version is dropped meanwhile.
#[derive(Debug, Clone)]
pub struct TableVersion {
    table: Arc<Table>,
    version: Arc<Version>,
    held: Arc<[bool]>,
    max_value: usize,
}

impl TableVersion {
    /// The version number (never 0: version 0 is resolved).
    pub fn version(&self) -> u32 {
        self.version.number
    }

    /// The table's spec.
    pub fn spec(&self) -> &TableSpec {
        &self.table.spec
    }

    /// The table's value type.
    pub fn value_type(&self) -> ValueType {
        self.table.spec.value_type
    }

    /// Whether this version was sealed (it may be sealed since, if it was open at [`Tables::at`]).
    pub fn is_sealed(&self) -> bool {
        self.version.sealed.load(Ordering::Acquire)
    }

    /// Whether this store held `partition` when the handle was taken.
    pub fn is_held(&self, partition: u32) -> bool {
        self.held.get(partition as usize).copied().unwrap_or(false)
    }

    fn slot(&self, partition: u32) -> Result<&PartSlot> {
        let spec = &self.table.spec;
        if partition >= spec.partitions {
            return Err(Error::Invalid(format!(
                "partition {partition} out of range: table {} has {} partitions",
                spec.name, spec.partitions
            )));
        }
        if !self.held[partition as usize] {
            return Err(Error::NotHeld(partition));
        }
        if self.is_missing(partition) {
            return Err(Error::Repairing(partition));
        }
        Ok(&self.version.parts[partition as usize])
    }

    /// Whether this version's data of `partition` is not here yet: its image failed to load, or
    /// it is being copied from a replica (a repair or a move). Reads of it are refused with
    /// [`Error::Repairing`]; an open one still takes writes.
    pub fn is_missing(&self, partition: u32) -> bool {
        self.version
            .parts
            .get(partition as usize)
            .is_some_and(|s| s.pending.load(Ordering::Acquire))
    }

    /// The flat image (docs/partition-image.md) of one partition of this version, held or not
    /// (a partition that is leaving can still be copied). Only a sealed version has images:
    /// [`Error::VersionOpen`] otherwise.
    pub fn partition_image(&self, partition: u32) -> Result<Vec<u8>> {
        let spec = &self.table.spec;
        if partition >= spec.partitions {
            return Err(Error::Invalid(format!(
                "partition {partition} out of range: table {} has {} partitions",
                spec.name, spec.partitions
            )));
        }
        if self.is_missing(partition) {
            return Err(Error::Repairing(partition));
        }
        let Some(data) = self.version.parts[partition as usize].frozen.get() else {
            return Err(Error::VersionOpen(self.version.number));
        };
        let mut out = Vec::new();
        crate::image::write_image(data, &mut out).map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(out)
    }

    /// Run `f` over one partition. Reads of an OPEN version hold the partition's read lock during
    /// `f` (writers of that partition wait); sealed ones hold nothing.
    pub fn with_partition<R>(
        &self,
        partition: u32,
        f: impl FnOnce(PartitionView<'_>) -> R,
    ) -> Result<R> {
        let value_type = self.value_type();
        let version = self.version();
        Ok(self.slot(partition)?.read(|data| {
            f(PartitionView {
                data,
                version,
                value_type,
            })
        }))
    }

    /// Visit every (key, value) of one partition, in entry order.
    pub fn scan(&self, partition: u32, mut f: impl FnMut(&[u8], ValueRef<'_>)) -> Result<()> {
        self.with_partition(partition, |view| {
            for (k, v) in view.iter() {
                f(k, v);
            }
        })
    }

    /// Look up `keys` in one partition, appending one [`KeyStatus`] byte per key to `status` and
    /// the packed values to `values`: 8 LE bytes per key for i64/f64 (zeros unless Ok),
    /// `dim * 4` LE bytes per key for f32 vectors (zeros unless Ok), `u32 LE length + bytes` per
    /// Ok key only for bytes tables (docs/protocol-native.md, 7.2). On `Err` nothing was appended.
    ///
    /// Unbounded: for in-process callers that know their batch. What serves a remote request
    /// (a reply, a scan's chunk) uses [`TableVersion::get_batch_bounded`].
    pub fn get_batch<'k>(
        &self,
        partition: u32,
        keys: impl IntoIterator<Item = &'k [u8]>,
        status: &mut Vec<u8>,
        values: &mut Vec<u8>,
    ) -> Result<()> {
        self.get_batch_bounded(partition, keys, status, values, usize::MAX)
    }

    /// [`TableVersion::get_batch`], refused with [`Error::ReplyTooLarge`] (nothing appended) once
    /// the values would pass `max_values` bytes: a read never holds more than its caller's budget.
    pub fn get_batch_bounded<'k>(
        &self,
        partition: u32,
        keys: impl IntoIterator<Item = &'k [u8]>,
        status: &mut Vec<u8>,
        values: &mut Vec<u8>,
        max_values: usize,
    ) -> Result<()> {
        let value_type = self.value_type();
        let (status_len, values_len) = (status.len(), values.len());
        let fits = self.slot(partition)?.read(|data| {
            let keys = keys.into_iter();
            let expected = keys.size_hint().0;
            partition::get_packed(
                keys.map(|k| (data, k)),
                value_type,
                expected,
                MAX_KEY_LEN,
                max_values,
                status,
                values,
            )
        });
        if fits {
            Ok(())
        } else {
            status.truncate(status_len);
            values.truncate(values_len);
            Err(Error::ReplyTooLarge(max_values))
        }
    }

    /// Look up a whole request's keys, given as `(partition, keys)` groups, appending exactly
    /// what [`TableVersion::get_batch`] on each group in turn would append (one status byte per
    /// key in request order, values packed as described there). Every partition is checked
    /// first: on `Err` (out of range, not held) nothing was appended.
    ///
    /// Unlike a `get_batch` per group, the lookups of all groups go through one prefetching
    /// pipeline, so a request spread over many partitions with a key or two each overlaps its
    /// cache misses as well as one big group does. The groups are walked twice (check, then
    /// read), hence `Clone`: pass views (as the wire codec's groups are), not owned vectors.
    /// Partitions of an OPEN version are read-locked for the whole call, all at once, in
    /// ascending partition order (writers take one partition lock at a time, so this cannot
    /// deadlock); sealed partitions need no lock. Nothing allocates per key; an open version
    /// costs one allocation per call for its lock guards.
    pub fn get_groups<'k, G, K>(
        &self,
        groups: G,
        status: &mut Vec<u8>,
        values: &mut Vec<u8>,
    ) -> Result<()>
    where
        G: IntoIterator<Item = (u32, K)> + Clone,
        K: IntoIterator<Item = &'k [u8]>,
    {
        self.get_groups_bounded(groups, status, values, usize::MAX)
    }

    /// [`TableVersion::get_groups`] that refuses, with [`Error::ReplyTooLarge`] and nothing
    /// appended, a request whose values would take more than `max_values` bytes: a server
    /// composing a reply never holds more than that, whatever a request asks for.
    pub fn get_groups_bounded<'k, G, K>(
        &self,
        groups: G,
        status: &mut Vec<u8>,
        values: &mut Vec<u8>,
        max_values: usize,
    ) -> Result<()>
    where
        G: IntoIterator<Item = (u32, K)> + Clone,
        K: IntoIterator<Item = &'k [u8]>,
    {
        // One walk over the groups checks them, counts the keys and lists the partitions to
        // lock (none for a version already sealed: sealing sets the flag only after every
        // partition is frozen).
        let sealed = self.is_sealed();
        let parts = &self.version.parts;
        let mut expected = 0usize;
        let mut locked: Vec<(u32, Option<OpenGuard<'_>>)> = Vec::new();
        for (partition, keys) in groups.clone() {
            self.slot(partition)?;
            expected = expected.saturating_add(keys.into_iter().size_hint().0);
            if !sealed && parts[partition as usize].frozen.get().is_none() {
                locked.push((partition, None));
            }
        }
        locked.sort_unstable_by_key(|&(p, _)| p);
        locked.dedup_by_key(|&mut (p, _)| p);
        for (p, guard) in &mut locked {
            let g = parts[*p as usize].open.read();
            // Sealed since we looked: its data is frozen and needs no lock.
            if g.is_some() {
                *guard = Some(g);
            }
        }
        let part = |partition: u32| -> &PartData {
            let slot = &parts[partition as usize];
            if let Some(d) = slot.frozen.get() {
                return d;
            }
            // Not frozen now, so it was not when we looked either, and it cannot be frozen while
            // we hold its read lock: it is among the guards, holding data.
            let at = locked
                .binary_search_by_key(&partition, |&(p, _)| p)
                .expect("every partition open at lock time is locked");
            locked[at]
                .1
                .as_deref()
                .and_then(Option::as_ref)
                .expect("a held read lock keeps the partition open")
        };
        let items = groups.into_iter().flat_map(|(partition, keys)| {
            let data = part(partition);
            keys.into_iter().map(move |k| (data, k))
        });
        let (status_len, values_len) = (status.len(), values.len());
        if partition::get_packed(
            items,
            self.value_type(),
            expected,
            MAX_KEY_LEN,
            max_values,
            status,
            values,
        ) {
            Ok(())
        } else {
            status.truncate(status_len);
            values.truncate(values_len);
            Err(Error::ReplyTooLarge(max_values))
        }
    }

    /// Run `f` with exclusive access to one partition of an OPEN version, and the set of keys
    /// to record as written if the partition is being copied in (see `copy.rs`). A pending
    /// partition takes writes: the copy will not overwrite them.
    fn write<R>(
        &self,
        partition: u32,
        f: impl FnOnce(&mut PartData, Option<&mut std::collections::HashSet<Box<[u8]>>>) -> R,
    ) -> Result<R> {
        let slot = match self.slot(partition) {
            Err(Error::Repairing(_)) => &self.version.parts[partition as usize],
            other => other?,
        };
        let mut open = slot.open.write();
        match open.as_mut() {
            Some(data) => {
                if slot.pending.load(Ordering::Acquire) {
                    let mut touched = slot.touched.lock();
                    Ok(f(data, touched.as_mut()))
                } else {
                    Ok(f(data, None))
                }
            }
            None => Err(Error::VersionSealed(self.version())),
        }
    }

    /// Insert or overwrite `(key, value)` pairs in one partition of this OPEN version, appending
    /// one [`KeyStatus`] byte per pair to `status`. A key that fails (too large, wrong type, out
    /// of memory) is left unchanged and the rest of the batch proceeds. On `Err` (sealed, not
    /// held) nothing was written or appended.
    pub fn put_batch<'k, 'v>(
        &self,
        partition: u32,
        items: impl IntoIterator<Item = (&'k [u8], ValueRef<'v>)>,
        status: &mut Vec<u8>,
    ) -> Result<()> {
        self.put_batch_then(partition, items, status, |_| ())
    }

    /// [`TableVersion::put_batch`], then `then(statuses)` with this batch's status bytes while
    /// the partition's write lock is still held: a write-ahead log appends the accepted pairs
    /// there, so that its order of records is the order in which writes were applied (two
    /// writers of one key cannot be logged in the other order). Not called on `Err`.
    pub fn put_batch_then<'k, 'v>(
        &self,
        partition: u32,
        items: impl IntoIterator<Item = (&'k [u8], ValueRef<'v>)>,
        status: &mut Vec<u8>,
        then: impl FnOnce(&[u8]),
    ) -> Result<()> {
        let max_value = self.max_value;
        let start = status.len();
        self.write(partition, |data, touched| {
            match touched {
                None => data.put_many(items.into_iter(), MAX_KEY_LEN, max_value, |st| {
                    status.push(st as u8)
                }),
                Some(touched) => {
                    // Copying in: remember the keys stored here, so the copy keeps them.
                    let items: Vec<_> = items.into_iter().collect();
                    data.put_many(items.iter().copied(), MAX_KEY_LEN, max_value, |st| {
                        status.push(st as u8)
                    });
                    for ((k, _), &st) in items.iter().zip(&status[start..]) {
                        if st == KeyStatus::Ok as u8 {
                            touched.insert((*k).into());
                        }
                    }
                }
            }
            then(&status[start..]);
        })
    }

    /// Remove `keys` from one partition of this OPEN version, appending one [`KeyStatus`] byte per
    /// key (Ok, NotFound or KeyTooLarge).
    pub fn delete_batch<'k>(
        &self,
        partition: u32,
        keys: impl IntoIterator<Item = &'k [u8]>,
        status: &mut Vec<u8>,
    ) -> Result<()> {
        self.delete_batch_then(partition, keys, status, |_| ())
    }

    /// [`TableVersion::delete_batch`], then `then(statuses)` under the partition's write lock
    /// (see [`TableVersion::put_batch_then`]).
    pub fn delete_batch_then<'k>(
        &self,
        partition: u32,
        keys: impl IntoIterator<Item = &'k [u8]>,
        status: &mut Vec<u8>,
        then: impl FnOnce(&[u8]),
    ) -> Result<()> {
        let start = status.len();
        self.write(partition, |data, mut touched| {
            for key in keys {
                let st = data.delete(key, MAX_KEY_LEN);
                if let (Some(t), KeyStatus::Ok | KeyStatus::NotFound) = (touched.as_mut(), st) {
                    // Copying in: a key deleted here must not come back with the copy.
                    t.insert(key.into());
                }
                status.push(st as u8);
            }
            then(&status[start..]);
        })
    }
}

/// Read access to one partition of one version, handed to [`Tables::with_partition`]'s closure.
/// Entries are numbered `0..len()` in column order, so `key(i)` belongs to `column_f64()[i]`.
#[derive(Debug, Clone, Copy)]
pub struct PartitionView<'a> {
    data: &'a PartData,
    version: u32,
    value_type: ValueType,
}

impl<'a> PartitionView<'a> {
    /// The version this view reads (version 0 already resolved).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The table's value type.
    pub fn value_type(&self) -> ValueType {
        self.value_type
    }

    /// Number of keys in this partition.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The partition's write generation: changes with every write to it (insert, overwrite,
    /// delete) and when its version is sealed, and never otherwise; never 0. Two views with the
    /// same generation saw the same entries in the same order, so a scan can page through a
    /// partition across several locks and still read one moment of it.
    pub fn generation(&self) -> u64 {
        self.data.generation()
    }

    /// Whether the partition holds no keys.
    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }

    /// Value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Option<ValueRef<'a>> {
        self.data
            .find(key, key_hash(key))
            .map(|i| self.data.value(i))
    }

    /// Key of entry `i` (`i < len()`).
    pub fn key(&self, i: usize) -> &'a [u8] {
        self.data.key(i)
    }

    /// Value of entry `i` (`i < len()`).
    pub fn value(&self, i: usize) -> ValueRef<'a> {
        self.data.value(i)
    }

    /// Every (key, value), in entry order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], ValueRef<'a>)> + 'a {
        let data = self.data;
        (0..data.len()).map(move |i| (data.key(i), data.value(i)))
    }

    /// The i64 column (entry order), or `None` if the table is not i64.
    pub fn column_i64(&self) -> Option<&'a [i64]> {
        self.data.column_i64()
    }

    /// The f64 column (entry order), or `None` if the table is not f64.
    pub fn column_f64(&self) -> Option<&'a [f64]> {
        self.data.column_f64()
    }

    /// The f32 vectors, `dim` floats per entry back to back, or `None` if the table is not f32vec.
    pub fn column_f32(&self) -> Option<&'a [f32]> {
        self.data.column_f32()
    }
}

/// Iterator over values in the packed batch layout (see [`packed_values`]).
#[derive(Debug, Clone)]
pub struct PackedValues<'a> {
    value_type: ValueType,
    data: &'a [u8],
    left: usize,
}

impl<'a> Iterator for PackedValues<'a> {
    type Item = ValueRef<'a>;

    fn next(&mut self) -> Option<ValueRef<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let take = |data: &mut &'a [u8], n: usize| {
            let (head, tail) = data.split_at(n);
            *data = tail;
            head
        };
        Some(match self.value_type {
            ValueType::I64 => {
                ValueRef::I64(i64::from_le_bytes(take(&mut self.data, 8).try_into().ok()?))
            }
            ValueType::F64 => {
                ValueRef::F64(f64::from_le_bytes(take(&mut self.data, 8).try_into().ok()?))
            }
            ValueType::F32Vec { dim } => ValueRef::F32VecLe(take(&mut self.data, dim as usize * 4)),
            ValueType::Bytes => {
                let len = u32::from_le_bytes(take(&mut self.data, 4).try_into().ok()?) as usize;
                ValueRef::Bytes(take(&mut self.data, len))
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for PackedValues<'_> {}

/// Decode `count` values of `value_type` in the packed batch layout: 8 LE bytes per i64/f64,
/// `dim * 4` LE bytes per f32 vector, `u32 LE length + bytes` per bytes value. The whole buffer is
/// checked first (it must hold exactly `count` values), so a malformed buffer writes nothing.
pub fn packed_values(value_type: ValueType, data: &[u8], count: usize) -> Result<PackedValues<'_>> {
    let ok = match value_type.packed_width() {
        Some(w) => count.checked_mul(w) == Some(data.len()),
        None => {
            let mut at = 0usize;
            let mut n = 0usize;
            while n < count && at + 4 <= data.len() {
                let len =
                    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
                at = at.saturating_add(4).saturating_add(len);
                n += 1;
            }
            n == count && at == data.len()
        }
    };
    if !ok {
        return Err(Error::Invalid(format!(
            "packed values: buffer of {} bytes does not hold exactly {count} values",
            data.len()
        )));
    }
    Ok(PackedValues {
        value_type,
        data,
        left: count,
    })
}

/// The registry of native tables. `Send + Sync`; share it in an `Arc`.
#[derive(Debug)]
pub struct Tables {
    config: TablesConfig,
    meter: Arc<Meter>,
    /// foldhash rather than SipHash: names are looked up once per batch and come from our own
    /// clients' requests, so the lookup's cost matters more than flooding resistance.
    tables: RwLock<HashMap<String, Arc<Table>, foldhash::fast::RandomState>>,
}

impl Tables {
    /// An empty registry with these limits.
    pub fn new(config: TablesConfig) -> Tables {
        let mut config = config;
        config.max_value_size = config.max_value_size.min(u32::MAX as usize);
        Tables {
            meter: Arc::new(Meter::new(config.memory_limit)),
            config,
            tables: RwLock::new(HashMap::default()),
        }
    }

    /// The limits this registry was made with.
    pub fn config(&self) -> &TablesConfig {
        &self.config
    }

    /// Bytes charged to all tables now.
    pub fn memory_used(&self) -> usize {
        self.meter.used()
    }

    /// The memory budget of all tables.
    pub fn memory_limit(&self) -> usize {
        self.meter.limit()
    }

    /// Charges `n` bytes that hold table data outside the tables (a sealed partition's image
    /// shared with readers on this host) to the tables' budget, if it has room; false (nothing
    /// charged) otherwise. Give them back with [`Tables::release_outside`].
    pub fn try_charge_outside(&self, n: usize) -> bool {
        self.meter.try_charge(n)
    }

    /// Gives back `n` bytes taken by [`Tables::try_charge_outside`].
    pub fn release_outside(&self, n: usize) {
        self.meter.release(n)
    }

    fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.tables
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NoSuchTable(name.to_owned()))
    }

    fn held_mask(spec: &TableSpec, held: &[u32]) -> Result<Vec<bool>> {
        let mut mask = vec![false; spec.partitions as usize];
        for &p in held {
            if p >= spec.partitions {
                return Err(Error::Invalid(format!(
                    "held partition {p} out of range 0..{}",
                    spec.partitions
                )));
            }
            mask[p as usize] = true;
        }
        Ok(mask)
    }

    /// Create a table holding partitions `held`, with version 1 OPEN and current (the mutable
    /// head, see the module docs).
    pub fn create_table(&self, spec: TableSpec, held: &[u32]) -> Result<()> {
        if spec.name.is_empty() || spec.name.len() > MAX_TABLE_NAME {
            return Err(Error::Invalid(format!(
                "table name must be 1..={MAX_TABLE_NAME} bytes"
            )));
        }
        if spec.partitions == 0 || spec.partitions > MAX_PARTITIONS {
            return Err(Error::Invalid(format!(
                "partitions must be 1..={MAX_PARTITIONS}"
            )));
        }
        if spec.replication == 0 {
            return Err(Error::Invalid("replication must be at least 1".into()));
        }
        if let ValueType::F32Vec { dim } = spec.value_type {
            if dim == 0 || dim > MAX_F32_DIM {
                return Err(Error::Invalid(format!(
                    "f32 vector dim {dim} must be 1..={MAX_F32_DIM}"
                )));
            }
        }
        let held = Self::held_mask(&spec, held)?;
        let mut tables = self.tables.write();
        if tables.contains_key(&spec.name) {
            return Err(Error::TableExists(spec.name));
        }
        let head = Arc::new(Version::new(1, &spec, &self.meter)?);
        let state = TableState {
            versions: BTreeMap::from([(1, head)]),
            current: 1,
            high_water: 1,
            held: held.into(),
        };
        tables.insert(
            spec.name.clone(),
            Arc::new(Table {
                spec,
                state: RwLock::new(state),
            }),
        );
        Ok(())
    }

    /// Drop a table and all its versions. Batches already running on it finish; its memory goes
    /// back to the budget when the last of them does.
    pub fn drop_table(&self, name: &str) -> Result<()> {
        self.tables
            .write()
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| Error::NoSuchTable(name.to_owned()))
    }

    /// Names of all tables, sorted.
    pub fn list(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tables.read().keys().cloned().collect();
        names.sort();
        names
    }

    /// Spec, current version, held partitions and per-version counters of a table.
    pub fn describe(&self, name: &str) -> Result<TableInfo> {
        let table = self.table(name)?;
        let (current, high_water, held, versions) = {
            let st = table.state.read();
            let held = (0..table.spec.partitions)
                .filter(|&p| st.held[p as usize])
                .collect();
            (
                st.current,
                st.high_water,
                held,
                st.versions.values().cloned().collect::<Vec<_>>(),
            )
        };
        Ok(TableInfo {
            spec: table.spec.clone(),
            current,
            high_water,
            held,
            versions: versions.iter().map(|v| v.info()).collect(),
        })
    }

    /// The value type of a table (what the server checks a request's declared type against).
    pub fn value_type(&self, name: &str) -> Result<ValueType> {
        Ok(self.table(name)?.spec.value_type)
    }

    /// Check that a table's values are of `value_type` ([`Error::WrongType`] if not), for a
    /// request that declares the type it carries.
    pub fn expect_type(&self, name: &str, value_type: ValueType) -> Result<()> {
        if self.table(name)?.spec.value_type == value_type {
            Ok(())
        } else {
            Err(Error::WrongType)
        }
    }

    /// Replace the set of partitions this store holds (after a cluster-map change).
    pub fn set_held_partitions(&self, name: &str, held: &[u32]) -> Result<()> {
        let table = self.table(name)?;
        let mask = Self::held_mask(&table.spec, held)?;
        table.state.write().held = mask.into();
        Ok(())
    }

    /// Create version `version` (> 0, not existing), OPEN and empty.
    pub fn create_version(&self, name: &str, version: u32) -> Result<()> {
        if version == 0 {
            return Err(Error::Invalid(
                "version 0 means current; versions start at 1".into(),
            ));
        }
        let table = self.table(name)?;
        let mut st = table.state.write();
        if st.versions.contains_key(&version) {
            return Err(Error::VersionExists(version));
        }
        // A dropped version's number is never given to new contents: a reader (or near cache)
        // holding that number could otherwise mix the two.
        if version <= st.high_water {
            return Err(Error::VersionNumberUsed {
                version,
                high_water: st.high_water,
            });
        }
        let v = Arc::new(Version::new(version, &table.spec, &self.meter)?);
        st.versions.insert(version, v);
        st.high_water = version;
        Ok(())
    }

    /// Re-create OPEN version `version` (> 0, not existing) as a restarting server replays it
    /// from its write-ahead log: like [`Tables::create_version`], but the number may be at or
    /// below the high-water mark (it names the same contents it named before the restart; the
    /// mark only rises), and the partitions in `missing` are pending (their log could not be
    /// read back): refused as [`Error::Repairing`], never read as empty, until a copy from a
    /// replica comes in.
    pub fn restore_open_version(&self, name: &str, version: u32, missing: &[u32]) -> Result<()> {
        if version == 0 {
            return Err(Error::Invalid(
                "version 0 means current; versions start at 1".into(),
            ));
        }
        let table = self.table(name)?;
        let mut v = Version::new(version, &table.spec, &self.meter)?;
        for &p in missing {
            let slot = v.parts.get_mut(p as usize).ok_or_else(|| {
                Error::Invalid(format!(
                    "partition {p} out of range 0..{}",
                    table.spec.partitions
                ))
            })?;
            // Pending: refused to readers, copied from a replica by the repair thread.
            *slot.pending.get_mut() = true;
            *slot.touched.get_mut() = Some(Default::default());
        }
        let mut st = table.state.write();
        if st.versions.contains_key(&version) {
            return Err(Error::VersionExists(version));
        }
        st.high_water = st.high_water.max(version);
        st.versions.insert(version, Arc::new(v));
        Ok(())
    }

    /// Make a version immutable (idempotent). Its data is compacted and trimmed to what it uses;
    /// later reads take no lock. A put racing with the seal lands before it or gets
    /// [`Error::VersionSealed`], per partition.
    pub fn seal_version(&self, name: &str, version: u32) -> Result<()> {
        let v = self.freeze_version(name, version)?;
        v.version.sealed.store(true, Ordering::Release);
        Ok(())
    }

    /// The first half of [`Tables::seal_version`]: compact every partition and stop taking
    /// writes (they get [`Error::VersionSealed`]), but do not mark the version sealed yet, so it
    /// cannot be made current and describes as open. A server that must make the version durable
    /// before acknowledging the seal writes its images from the returned handle
    /// ([`TableVersion::partition_image`]) in between; if that fails the version stays unsealed
    /// (and frozen: a later seal retries, or the version is dropped).
    pub fn freeze_version(&self, name: &str, version: u32) -> Result<TableVersion> {
        let tv = self.at(name, version)?;
        for slot in tv.version.parts.iter() {
            let mut open = slot.open.write();
            if let Some(mut data) = open.take() {
                data.freeze();
                // Publish before the write lock is released (see PartSlot's invariant).
                slot.frozen
                    .set(Arc::new(data))
                    .expect("a slot is frozen only once, under its write lock");
            }
        }
        Ok(tv)
    }

    /// Add version `version` (> 0, not existing), already sealed, built from partition images
    /// (docs/partition-image.md): `images` gives (partition, image) pairs, `missing` the
    /// partitions whose data should be here but could not be had (reads of them are refused as
    /// [`Error::NotHeld`]); every other partition is empty. Each image is validated completely
    /// and charged to the tables' budget; on any error ([`Error::CorruptImage`] naming the
    /// partition, [`Error::OutOfMemory`]) nothing is added.
    pub fn install_version(
        &self,
        name: &str,
        version: u32,
        images: &[(u32, &[u8])],
        missing: &[u32],
    ) -> Result<()> {
        self.install_version_with(name, version, images, missing, |_, _| false)
    }

    /// [`Tables::install_version`], asking `on_bad(partition, error)` about each image that
    /// cannot be installed (corrupt, or over the budget): `true` installs the version with that
    /// partition missing (as a restarting server does, after reporting the file), `false`
    /// refuses the whole version with that error.
    pub fn install_version_with(
        &self,
        name: &str,
        version: u32,
        images: &[(u32, &[u8])],
        missing: &[u32],
        mut on_bad: impl FnMut(u32, &Error) -> bool,
    ) -> Result<()> {
        if version == 0 {
            return Err(Error::Invalid(
                "version 0 means current; versions start at 1".into(),
            ));
        }
        let table = self.table(name)?;
        let spec = &table.spec;
        if table.state.read().versions.contains_key(&version) {
            return Err(Error::VersionExists(version));
        }
        let mut v = Version::new(version, spec, &self.meter)?;
        let mut lost: Vec<u32> = missing.to_vec();
        for &(p, img) in images {
            let slot = v.parts.get_mut(p as usize).ok_or_else(|| {
                Error::Invalid(format!("partition {p} out of range 0..{}", spec.partitions))
            })?;
            let data =
                crate::image::read_image(img, Some(spec.value_type), &self.meter).map_err(|e| {
                    match e {
                        Error::CorruptImage(what) => {
                            Error::CorruptImage(format!("partition {p}: {what}"))
                        }
                        e => e,
                    }
                });
            match data {
                Ok(data) => *slot.open.get_mut() = Some(data),
                Err(e) if on_bad(p, &e) => lost.push(p),
                Err(e) => return Err(e),
            }
        }
        let mut lost_mask = vec![false; spec.partitions as usize];
        for &p in &lost {
            *lost_mask.get_mut(p as usize).ok_or_else(|| {
                Error::Invalid(format!("partition {p} out of range 0..{}", spec.partitions))
            })? = true;
        }
        for (slot, lost) in v.parts.iter_mut().zip(lost_mask) {
            *slot.pending.get_mut() = lost;
            if let Some(mut data) = slot.open.get_mut().take() {
                // Images are frozen already; empty partitions become so here.
                data.freeze();
                slot.frozen
                    .set(Arc::new(data))
                    .expect("a new version's slots are empty");
            }
        }
        v.sealed.store(true, Ordering::Release);
        let mut st = table.state.write();
        if st.versions.contains_key(&version) {
            return Err(Error::VersionExists(version));
        }
        // The same contents under the same number (a copy of a sealed version), so the number
        // may be at or below the mark; the mark only rises.
        st.high_water = st.high_water.max(version);
        st.versions.insert(version, Arc::new(v));
        Ok(())
    }

    /// Raise a table's version high-water mark to at least `high_water` (a restarted server
    /// restoring the mark its catalog kept, so dropped numbers stay unused).
    pub fn raise_high_water(&self, name: &str, high_water: u32) -> Result<()> {
        let table = self.table(name)?;
        let mut st = table.state.write();
        st.high_water = st.high_water.max(high_water);
        Ok(())
    }

    /// Make a sealed version current: readers of version 0 see it from their next batch on.
    pub fn set_current(&self, name: &str, version: u32) -> Result<()> {
        let table = self.table(name)?;
        let mut st = table.state.write();
        let v = st
            .versions
            .get(&version)
            .ok_or(Error::NoSuchVersion(version))?;
        if !v.sealed.load(Ordering::Acquire) {
            return Err(Error::VersionOpen(version));
        }
        st.current = version;
        Ok(())
    }

    /// Drop a version. The current one only with `force` (the table then has no current
    /// version and reads of version 0 fail with [`Error::NoSuchVersion`]).
    pub fn drop_version(&self, name: &str, version: u32, force: bool) -> Result<()> {
        let table = self.table(name)?;
        let mut st = table.state.write();
        if !st.versions.contains_key(&version) {
            return Err(Error::NoSuchVersion(version));
        }
        if st.current == version {
            if !force {
                return Err(Error::VersionCurrent(version));
            }
            st.current = 0;
        }
        st.versions.remove(&version);
        Ok(())
    }

    /// Resolve one version of a table (0 = current) for a request's partition groups.
    pub fn at(&self, name: &str, version: u32) -> Result<TableVersion> {
        let table = self.table(name)?;
        let (version, held) = {
            let st = table.state.read();
            (st.lookup(version)?, st.held.clone())
        };
        Ok(TableVersion {
            table,
            version,
            held,
            max_value: self.config.max_value_size,
        })
    }

    /// [`TableVersion::with_partition`] on [`Tables::at`]`(name, version)`.
    pub fn with_partition<R>(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        f: impl FnOnce(PartitionView<'_>) -> R,
    ) -> Result<R> {
        self.at(name, version)?.with_partition(partition, f)
    }

    /// [`TableVersion::scan`] on [`Tables::at`]`(name, version)`; returns the version read.
    pub fn scan(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        f: impl FnMut(&[u8], ValueRef<'_>),
    ) -> Result<u32> {
        let at = self.at(name, version)?;
        at.scan(partition, f)?;
        Ok(at.version())
    }

    /// [`TableVersion::get_batch`] on [`Tables::at`]`(name, version)`; returns the version read
    /// (the whole batch reads that one version).
    pub fn get_batch<'k>(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        keys: impl IntoIterator<Item = &'k [u8]>,
        status: &mut Vec<u8>,
        values: &mut Vec<u8>,
    ) -> Result<u32> {
        let at = self.at(name, version)?;
        at.get_batch(partition, keys, status, values)?;
        Ok(at.version())
    }

    /// [`TableVersion::put_batch`] on [`Tables::at`]`(name, version)` (version 0 = current, which
    /// must then be the open head); returns the version written.
    pub fn put_batch<'k, 'v>(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        items: impl IntoIterator<Item = (&'k [u8], ValueRef<'v>)>,
        status: &mut Vec<u8>,
    ) -> Result<u32> {
        let at = self.at(name, version)?;
        at.put_batch(partition, items, status)?;
        Ok(at.version())
    }

    /// [`TableVersion::delete_batch`] on [`Tables::at`]`(name, version)`; returns the version
    /// written.
    pub fn delete_batch<'k>(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        keys: impl IntoIterator<Item = &'k [u8]>,
        status: &mut Vec<u8>,
    ) -> Result<u32> {
        let at = self.at(name, version)?;
        at.delete_batch(partition, keys, status)?;
        Ok(at.version())
    }
}
