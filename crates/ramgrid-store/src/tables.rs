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
mod version;
pub use version::TableVersion;
mod view;
pub use view::{packed_values, PackedValues, PartitionView};
pub(crate) mod partition;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::{Error, Result};
use partition::{Meter, PartData};

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

    /// Make room in each partition for what `like`'s sealed partition of the same number holds
    /// (see [`PartData::reserve_like`]), as far as the budget takes it.
    fn reserve_like(&mut self, like: &Version) {
        for (slot, like) in self.parts.iter_mut().zip(like.parts.iter()) {
            if let (Some(data), Some(like)) = (slot.open.get_mut(), like.frozen.get()) {
                data.reserve_like(like);
            }
        }
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

/// The registry of native tables. `Send + Sync`; share it in an `Arc`.
#[derive(Debug)]
pub struct Tables {
    config: TablesConfig,
    meter: Arc<Meter>,
    /// foldhash rather than SipHash: names are looked up once per batch and come from our own
    /// clients' requests, so the lookup's cost matters more than flooding resistance.
    tables: RwLock<HashMap<String, Arc<Table>, foldhash::fast::RandomState>>,
    /// Threads a seal freezes partitions on (see [`Tables::with_seal_threads`]).
    seal_threads: usize,
}

/// Keys of a version below which its seal runs on the caller's thread alone: starting threads
/// costs more than freezing so few.
const PARALLEL_SEAL_KEYS: usize = 1 << 16;

impl Tables {
    /// An empty registry with these limits.
    pub fn new(config: TablesConfig) -> Tables {
        let mut config = config;
        config.max_value_size = config.max_value_size.min(u32::MAX as usize);
        Tables {
            meter: Arc::new(Meter::new(config.memory_limit)),
            config,
            tables: RwLock::new(HashMap::default()),
            seal_threads: 1,
        }
    }

    /// This registry, sealing versions on up to `threads` threads (a server passes its
    /// `--threads`). Sealing rebuilds each partition's index and trims its vectors, which for a
    /// version of millions of keys takes a while; partitions are independent, so the seal's
    /// caller waits for the slowest thread instead of the sum. Default 1.
    pub fn with_seal_threads(mut self, threads: usize) -> Tables {
        self.seal_threads = threads.max(1);
        self
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
    ///
    /// Its partitions are given room, charged to the budget, for what the current version's
    /// hold if the budget takes it (a load writes a new version that is usually about as large
    /// as the one it replaces; see `PartData::reserve_like`): the load's writes then rehash no
    /// keys to grow, and a seal of as many keys rebuilds no index. Unused room goes back at the
    /// seal, or with the version if it is dropped.
    pub fn create_version(&self, name: &str, version: u32) -> Result<()> {
        if version == 0 {
            return Err(Error::Invalid(
                "version 0 means current; versions start at 1".into(),
            ));
        }
        let table = self.table(name)?;
        let check = |st: &TableState| {
            if st.versions.contains_key(&version) {
                return Err(Error::VersionExists(version));
            }
            // A dropped version's number is never given to new contents: a reader (or near
            // cache) holding that number could otherwise mix the two.
            if version <= st.high_water {
                return Err(Error::VersionNumberUsed {
                    version,
                    high_water: st.high_water,
                });
            }
            Ok(())
        };
        // The room is made outside the table's lock (zeroing an index of millions of keys
        // takes milliseconds), and the checks are made again under it.
        let like = {
            let st = table.state.read();
            check(&st)?;
            st.versions
                .get(&st.current)
                .filter(|v| v.sealed.load(Ordering::Acquire))
                .cloned()
        };
        let mut v = Version::new(version, &table.spec, &self.meter)?;
        if let Some(like) = like {
            v.reserve_like(&like);
        }
        let mut st = table.state.write();
        check(&st)?;
        st.versions.insert(version, Arc::new(v));
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
        let parts = &tv.version.parts;
        let freeze = |slot: &PartSlot| {
            let mut open = slot.open.write();
            if let Some(mut data) = open.take() {
                data.freeze();
                // Publish before the write lock is released (see PartSlot's invariant).
                slot.frozen
                    .set(Arc::new(data))
                    .expect("a slot is frozen only once, under its write lock");
            }
        };
        let keys: usize = parts
            .iter()
            .map(|slot| slot.open.read().as_ref().map_or(0, PartData::len))
            .sum();
        let threads = self.seal_threads.min(parts.len());
        if threads <= 1 || keys < PARALLEL_SEAL_KEYS {
            parts.iter().for_each(freeze);
            return Ok(tv);
        }
        // Each thread takes the next partition not yet taken; the caller is one of them.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || {
            while let Some(slot) = parts.get(next.fetch_add(1, Ordering::Relaxed)) {
                freeze(slot);
            }
        };
        std::thread::scope(|s| {
            for _ in 1..threads {
                if std::thread::Builder::new()
                    .name("ramgrid-seal".into())
                    .spawn_scoped(s, work)
                    .is_err()
                {
                    break; // no more threads to be had: the others take its share
                }
            }
            work();
        });
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
