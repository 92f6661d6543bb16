//! The storage of one (table, version, partition): a key arena, a hash index of key records and
//! one typed value column, with every allocation charged to the tables' memory meter.
//!
//! Layout (entry `i` is the i-th live key; columns are dense, so aggregates run over plain slices):
//! - `keys`: arena of 4-byte aligned records `u32 LE length, u32 LE entry number, key bytes, pad`,
//!   addressed by "slot" = byte offset / 4 (so a u32 reaches 16 GiB); `key_offs[i]` is entry i's slot.
//! - `index`: key hash ([`key_hash`], fixed seed) -> key slot (see `index.rs`). It points at the
//!   key record rather than the entry so a lookup reads index -> record (key and entry number on
//!   one line) -> value: one cache miss fewer than index -> entry -> record -> value.
//! - `col`: `Vec<i64>` / `Vec<f64>` / `Vec<f32>` (`dim` floats per entry) / a byte arena of records
//!   `u32 LE length + value bytes` with `offs[i]`. The bytes record is exactly the packed batch
//!   layout of a hit, so a read copies one contiguous slice.
//!
//! Deletes swap-remove (the last entry takes the hole) so columns never hold tombstones. Overwrites
//! and deletes leave garbage in the arenas. Reclaim rule: an arena is compacted (in place if the
//! budget cannot take a copy) when garbage exceeds half of it, or when a write that would need it
//! to grow is refused by the budget and its garbage covers what the write needs; any vector, arena or index
//! whose live part falls below a quarter of its capacity is shrunk to twice the live part (never
//! below [`SMALL`]), so the meter drops after deletes without inserts and deletes thrashing.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use super::{KeyStatus, ValueRef, ValueType};
use crate::index::{prefetch, Candidate, Index, Probe};

/// Seed of the index hash. Fixed so a key hashes the same in every process (handy for debugging
/// and for reproducible benchmarks); it is not the partitioning function.
const SEED: u64 = 0x7261_6d67_7269_6421;

/// Keys looked up together by [`lookup_many`]: enough misses in flight to cover a
/// memory latency of ~200 ns (as on a virtual machine), few enough that the lines stay in L1.
const GROUP: usize = 64;

/// An entry number no partition reaches (entries are u32): "not read yet" in [`lookup_many`].
const LATE: usize = usize::MAX;

/// Arenas with less garbage than this are not compacted, and vectors, arenas and indexes are never
/// shrunk below it: moving so few bytes buys nothing.
const SMALL: usize = 4096;

/// Hash of a key for the partition index.
#[inline]
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(SEED).build_hasher();
    h.write(key);
    h.finish()
}

/// The shared memory budget of all tables. Charges are taken before memory is allocated, so the
/// sum of what is allocated never exceeds the limit (see [`PartData::charge_growth`]).
pub(crate) use crate::memory::Budget as Meter;

/// The typed value column.
#[derive(Debug)]
pub(crate) enum Column {
    I64(Vec<i64>),
    F64(Vec<f64>),
    F32 {
        dim: usize,
        data: Vec<f32>,
    },
    Bytes {
        arena: Vec<u8>,
        offs: Vec<u64>,
        garbage: usize,
    },
}

/// Capacities a growth step wants; `None` = that vector already has room.
#[derive(Debug, Default, Clone, Copy)]
struct Plan {
    keys: Option<usize>,
    key_offs: Option<usize>,
    index: bool,
    col: Option<usize>,
    col_offs: Option<usize>,
}

/// New capacity for a vector that must take `add` more elements, or `None` if it has room.
fn target(len: usize, cap: usize, add: usize, exact: bool) -> Option<usize> {
    let need = len.checked_add(add)?;
    if need <= cap {
        return None;
    }
    if exact {
        Some(need)
    } else {
        Some(need.max(cap.saturating_mul(2)).max(8))
    }
}

#[inline]
pub(crate) fn read_u32(buf: &[u8], at: usize) -> u32 {
    let b: [u8; 4] = buf[at..at + 4].try_into().expect("4-byte slice");
    u32::from_le_bytes(b)
}

/// Bytes of a key record: header (length, entry number), key, padding to 4.
#[inline]
pub(crate) fn key_record_len(key_len: usize) -> usize {
    (8 + key_len + 3) & !3
}

/// Most bytes a key arena may hold: its slots are u32 counts of 4 bytes.
const MAX_KEY_ARENA: usize = (u32::MAX as usize + 1) * 4;

/// The key of the record at `slot`.
#[inline]
pub(crate) fn key_at(keys: &[u8], slot: u32) -> &[u8] {
    let at = slot as usize * 4;
    let len = read_u32(keys, at) as usize;
    &keys[at + 8..at + 8 + len]
}

/// `a == b`, without a call into `memcmp` for the short keys most tables hold (a library call
/// per key showed up at ~7% of a server's profile): keys of up to 16 bytes compare as two
/// overlapping words.
#[inline]
pub(crate) fn key_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        _ => a == b,
    }
}

/// The entry number stored in the record at `slot`.
#[inline]
pub(crate) fn entry_at(keys: &[u8], slot: u32) -> usize {
    read_u32(keys, slot as usize * 4 + 4) as usize
}

fn set_entry(keys: &mut [u8], slot: u32, entry: usize) {
    let at = slot as usize * 4 + 4;
    keys[at..at + 4].copy_from_slice(&(entry as u32).to_le_bytes());
}

/// Append a key record; returns its slot. The caller has checked the arena limit.
fn push_key(keys: &mut Vec<u8>, key: &[u8], entry: usize) -> u32 {
    let slot = (keys.len() / 4) as u32;
    keys.extend_from_slice(&(key.len() as u32).to_le_bytes());
    keys.extend_from_slice(&(entry as u32).to_le_bytes());
    keys.extend_from_slice(key);
    keys.resize(slot as usize * 4 + key_record_len(key.len()), 0);
    slot
}

/// The whole record (length prefix included) at arena offset `off`.
#[inline]
pub(crate) fn record_at(arena: &[u8], off: u64) -> &[u8] {
    let off = off as usize;
    let len = read_u32(arena, off) as usize;
    &arena[off..off + 4 + len]
}

fn push_record(arena: &mut Vec<u8>, data: &[u8]) -> u64 {
    let off = arena.len() as u64;
    arena.extend_from_slice(&(data.len() as u32).to_le_bytes());
    arena.extend_from_slice(data);
    off
}

/// Sort entries by value offset in place, moving each entry's key slot along. Heapsort, because
/// it allocates nothing: it runs when the budget cannot take a copy of the arena. Entries that are
/// already in order (as after the last compaction, if only appends followed) are left alone.
fn sort_entries_by_offset(offs: &mut [u64], key_offs: &mut [u32]) {
    fn sift(offs: &mut [u64], key_offs: &mut [u32], mut root: usize, end: usize) {
        loop {
            let mut child = 2 * root + 1;
            if child >= end {
                return;
            }
            if child + 1 < end && offs[child] < offs[child + 1] {
                child += 1;
            }
            if offs[root] >= offs[child] {
                return;
            }
            offs.swap(root, child);
            key_offs.swap(root, child);
            root = child;
        }
    }
    if offs.windows(2).all(|w| w[0] < w[1]) {
        return;
    }
    let n = offs.len();
    for i in (0..n / 2).rev() {
        sift(offs, key_offs, i, n);
    }
    for end in (1..n).rev() {
        offs.swap(0, end);
        key_offs.swap(0, end);
        sift(offs, key_offs, 0, end);
    }
}

/// Capacity to shrink a vector of `len` of `cap` elements of `elem` bytes to, if it holds more
/// than [`SMALL`] bytes and less than a quarter of it is in use: twice the length, so the vector
/// must double before it grows again and alternating inserts and deletes do not thrash.
fn shrunk_capacity(len: usize, cap: usize, elem: usize) -> Option<usize> {
    (cap * elem > SMALL && len < cap / 4).then(|| (2 * len).max(SMALL / elem))
}

/// Shrink `v` if [`shrunk_capacity`] says so; returns whether it did.
fn shrink_vec<T>(v: &mut Vec<T>) -> bool {
    match shrunk_capacity(v.len(), v.capacity(), std::mem::size_of::<T>()) {
        Some(cap) => {
            v.shrink_to(cap);
            true
        }
        None => false,
    }
}

/// A generation no partition data of this process started at: each new data gets a base
/// 2^32 above the previous one, so two datas' generations meet only after 2^32 writes to one.
fn next_generation_base() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 32
}

/// Storage of one partition of one version. Never shared mutably without the slot's lock.
#[derive(Debug)]
pub(crate) struct PartData {
    // The fields are visible to `crate::image`, which writes and rebuilds them.
    pub(crate) keys: Vec<u8>,
    pub(crate) key_offs: Vec<u32>,
    pub(crate) key_garbage: usize,
    pub(crate) index: Index,
    pub(crate) col: Column,
    /// Write generation: changes with every insert, overwrite and delete (and when the data is
    /// frozen, which may renumber entries), never otherwise. A paged scan compares it between
    /// pages to know it still reads one moment. Starts at a value no other partition data of this
    /// process started at (see [`next_generation_base`]), so data replaced whole (a repair)
    /// never repeats a generation the old data had.
    generation: u64,
    /// Bytes charged to the meter for this partition; always equals `self.allocated()` between calls.
    charged: usize,
    meter: Arc<Meter>,
}

impl Drop for PartData {
    fn drop(&mut self) {
        self.meter.release(self.charged);
    }
}

impl PartData {
    pub(crate) fn new(value_type: ValueType, meter: Arc<Meter>) -> Self {
        let col = match value_type {
            ValueType::I64 => Column::I64(Vec::new()),
            ValueType::F64 => Column::F64(Vec::new()),
            ValueType::F32Vec { dim } => Column::F32 {
                dim: dim as usize,
                data: Vec::new(),
            },
            ValueType::Bytes => Column::Bytes {
                arena: Vec::new(),
                offs: Vec::new(),
                garbage: 0,
            },
        };
        PartData {
            keys: Vec::new(),
            key_offs: Vec::new(),
            key_garbage: 0,
            index: Index::new(),
            col,
            generation: next_generation_base(),
            charged: 0,
            meter,
        }
    }

    /// Make room, charged to the budget, for as many keys, key bytes and values as `like`
    /// holds, if this partition is empty and the budget takes it all (nothing happens
    /// otherwise). A load's new version is usually about as large as the version it replaces:
    /// room made up front saves the growth steps, each of which rehashes every key, and if the
    /// load writes as many keys the seal finds the index already at its sealed size and
    /// rebuilds nothing. Room a smaller load leaves unused is given back at the seal.
    pub(crate) fn reserve_like(&mut self, like: &PartData) {
        let n = like.len();
        if n == 0 || self.len() > 0 || self.charged > 0 {
            return;
        }
        let buckets = Index::fitted_for(n);
        let col = match &like.col {
            Column::I64(v) => v.len() * 8,
            Column::F64(v) => v.len() * 8,
            Column::F32 { data, .. } => data.len() * 4,
            Column::Bytes { arena, offs, .. } => arena.len() + offs.len() * 8,
        };
        let bytes = like.keys.len() + n * 4 + Index::bytes_of(buckets) + col;
        if !self.meter.try_charge(bytes) {
            return;
        }
        self.keys.reserve_exact(like.keys.len());
        self.key_offs.reserve_exact(n);
        match (&mut self.col, &like.col) {
            (Column::I64(v), Column::I64(l)) => v.reserve_exact(l.len()),
            (Column::F64(v), Column::F64(l)) => v.reserve_exact(l.len()),
            (Column::F32 { data, .. }, Column::F32 { data: l, .. }) => data.reserve_exact(l.len()),
            (
                Column::Bytes { arena, offs, .. },
                Column::Bytes {
                    arena: la,
                    offs: lo,
                    ..
                },
            ) => {
                arena.reserve_exact(la.len());
                offs.reserve_exact(lo.len());
            }
            _ => {} // partitions of one table share its value type
        }
        self.index = Index::with_buckets(buckets);
        self.settle(bytes);
    }

    /// A partition made of parts that `crate::image` validated, with `charged_ahead` bytes
    /// already taken from `meter` for them (settled against what they really allocated).
    pub(crate) fn from_parts(
        keys: Vec<u8>,
        key_offs: Vec<u32>,
        index: Index,
        col: Column,
        meter: Arc<Meter>,
        charged_ahead: usize,
    ) -> Self {
        let mut d = PartData {
            keys,
            key_offs,
            key_garbage: 0,
            index,
            col,
            generation: next_generation_base(),
            charged: 0,
            meter,
        };
        d.settle(charged_ahead);
        d
    }

    /// The write generation (see the field): equal between two reads iff nothing changed.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Number of live entries.
    pub(crate) fn len(&self) -> usize {
        self.key_offs.len()
    }

    /// Bytes charged for this partition (what its vectors and index have allocated).
    pub(crate) fn charged(&self) -> usize {
        self.charged
    }

    /// What the partition's vectors and index really hold allocated, in bytes.
    fn allocated(&self) -> usize {
        let col = match &self.col {
            Column::I64(v) => v.capacity() * 8,
            Column::F64(v) => v.capacity() * 8,
            Column::F32 { data, .. } => data.capacity() * 4,
            Column::Bytes { arena, offs, .. } => arena.capacity() + offs.capacity() * 8,
        };
        self.keys.capacity() + self.key_offs.capacity() * 4 + self.index.allocation_size() + col
    }

    /// Re-read the real allocation after a growth that was charged `charged_ahead` bytes in
    /// advance, and settle the difference with the meter.
    pub(crate) fn settle(&mut self, charged_ahead: usize) {
        let expected = self.charged + charged_ahead;
        let actual = self.allocated();
        if actual <= expected {
            self.meter.release(expected - actual);
        } else {
            self.meter.force_charge(actual - expected);
        }
        self.charged = actual;
    }

    /// Slot of `key`'s record, if present.
    #[inline]
    fn find_slot(&self, key: &[u8], hash: u64) -> Option<u32> {
        let keys = &self.keys;
        self.index.find(hash, |s| key_eq(key_at(keys, s), key))
    }

    /// Entry number of `key`, if present.
    #[inline]
    pub(crate) fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        self.find_slot(key, hash).map(|s| entry_at(&self.keys, s))
    }

    /// Key of entry `i` (entries are numbered `0..len`, in column order).
    #[inline]
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        key_at(&self.keys, self.key_offs[i])
    }

    /// Value of entry `i`.
    #[inline]
    pub(crate) fn value(&self, i: usize) -> ValueRef<'_> {
        match &self.col {
            Column::I64(v) => ValueRef::I64(v[i]),
            Column::F64(v) => ValueRef::F64(v[i]),
            Column::F32 { dim, data } => ValueRef::F32Vec(&data[i * dim..(i + 1) * dim]),
            Column::Bytes { arena, offs, .. } => ValueRef::Bytes(&record_at(arena, offs[i])[4..]),
        }
    }

    pub(crate) fn column_i64(&self) -> Option<&[i64]> {
        match &self.col {
            Column::I64(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn column_f64(&self) -> Option<&[f64]> {
        match &self.col {
            Column::F64(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn column_f32(&self) -> Option<&[f32]> {
        match &self.col {
            Column::F32 { data, .. } => Some(data),
            _ => None,
        }
    }

    /// The i64 column; every partition of a table has the table's column type.
    #[inline]
    fn i64s(&self) -> &[i64] {
        match &self.col {
            Column::I64(v) => v,
            _ => unreachable!("partitions of one table share its value type"),
        }
    }

    #[inline]
    fn f64s(&self) -> &[f64] {
        match &self.col {
            Column::F64(v) => v,
            _ => unreachable!("partitions of one table share its value type"),
        }
    }

    /// The f32 vector of entry `i`.
    #[inline]
    fn f32s(&self, i: usize) -> &[f32] {
        match &self.col {
            Column::F32 { dim, data } => &data[i * dim..(i + 1) * dim],
            _ => unreachable!("partitions of one table share its value type"),
        }
    }

    /// The bytes record (`u32 LE length + bytes`) of entry `i`.
    #[inline]
    fn bytes_record(&self, i: usize) -> &[u8] {
        match &self.col {
            Column::Bytes { arena, offs, .. } => record_at(arena, offs[i]),
            _ => unreachable!("partitions of one table share its value type"),
        }
    }

    #[inline]
    fn prefetch_value(&self, i: usize) {
        match &self.col {
            Column::I64(v) => prefetch(v.as_ptr().wrapping_add(i)),
            Column::F64(v) => prefetch(v.as_ptr().wrapping_add(i)),
            Column::F32 { dim, data } => prefetch(data.as_ptr().wrapping_add(i * dim)),
            Column::Bytes { offs, .. } => prefetch(offs.as_ptr().wrapping_add(i)),
        }
    }

    /// Check that `value` fits this column; returns the bytes its value record needs
    /// (0 for fixed-size types).
    fn check_value(&self, value: &ValueRef<'_>, max_value: usize) -> Result<usize, KeyStatus> {
        match (&self.col, value) {
            (Column::I64(_), ValueRef::I64(_)) | (Column::F64(_), ValueRef::F64(_)) => Ok(0),
            (Column::F32 { dim, .. }, ValueRef::F32Vec(v)) if v.len() == *dim => Ok(0),
            (Column::F32 { dim, .. }, ValueRef::F32VecLe(b)) if b.len() == *dim * 4 => Ok(0),
            (Column::Bytes { .. }, ValueRef::Bytes(b)) => {
                if b.len() > max_value {
                    Err(KeyStatus::ValueTooLarge)
                } else {
                    Ok(4 + b.len())
                }
            }
            _ => Err(KeyStatus::WrongType),
        }
    }

    /// [`PartData::put`] for each pair, in order, calling `emit` with each status. Like
    /// [`get_packed`], keys go in groups whose index buckets and key records are
    /// prefetched first, so the random reads of a group overlap.
    pub(crate) fn put_many<'k, 'v>(
        &mut self,
        items: impl Iterator<Item = (&'k [u8], ValueRef<'v>)>,
        max_key: usize,
        max_value: usize,
        mut emit: impl FnMut(KeyStatus),
    ) {
        let mut items = items.peekable();
        let mut group: [(&[u8], ValueRef<'_>); GROUP] = [(&[], ValueRef::I64(0)); GROUP];
        // Each key is hashed once, here; the passes below and the put reuse it.
        let mut hashes = [0u64; GROUP];
        while items.peek().is_some() {
            let mut len = 0;
            for item in items.by_ref().take(GROUP) {
                group[len] = item;
                len += 1;
            }
            for ((key, _), h) in group[..len].iter().zip(&mut hashes) {
                if key.len() <= max_key {
                    *h = key_hash(key);
                    self.index.prefetch(*h);
                }
            }
            for ((key, _), &h) in group[..len].iter().zip(&hashes) {
                if key.len() <= max_key {
                    if let Candidate::Slot(c) = self.index.first_candidate(h) {
                        prefetch(self.keys.as_ptr().wrapping_add(c as usize * 4));
                    }
                }
            }
            for (&(key, value), &h) in group[..len].iter().zip(&hashes) {
                emit(self.put_hashed(key, h, value, max_key, max_value));
            }
        }
    }

    /// Insert or overwrite one key. On any non-Ok status nothing about the key changed.
    pub(crate) fn put(
        &mut self,
        key: &[u8],
        value: ValueRef<'_>,
        max_key: usize,
        max_value: usize,
    ) -> KeyStatus {
        if key.len() > max_key {
            return KeyStatus::KeyTooLarge;
        }
        self.put_hashed(key, key_hash(key), value, max_key, max_value)
    }

    /// [`PartData::put`] of a key whose [`key_hash`] the caller computed (unless the key is
    /// longer than `max_key`: then `hash` is not looked at).
    #[inline]
    fn put_hashed(
        &mut self,
        key: &[u8],
        hash: u64,
        value: ValueRef<'_>,
        max_key: usize,
        max_value: usize,
    ) -> KeyStatus {
        if key.len() > max_key {
            return KeyStatus::KeyTooLarge;
        }
        let rec = match self.check_value(&value, max_value) {
            Ok(rec) => rec,
            Err(st) => return st,
        };
        let st = match self.find(key, hash) {
            Some(i) => self.overwrite(i, value, rec),
            None => self.insert(key, hash, value, rec),
        };
        if st == KeyStatus::Ok {
            self.generation = self.generation.wrapping_add(1);
        }
        self.debug_check();
        st
    }

    fn overwrite(&mut self, i: usize, value: ValueRef<'_>, rec: usize) -> KeyStatus {
        match (&mut self.col, value) {
            (Column::I64(v), ValueRef::I64(x)) => v[i] = x,
            (Column::F64(v), ValueRef::F64(x)) => v[i] = x,
            (Column::F32 { dim, data }, ValueRef::F32Vec(x)) => {
                data[i * *dim..(i + 1) * *dim].copy_from_slice(x)
            }
            (Column::F32 { dim, data }, ValueRef::F32VecLe(b)) => {
                for (d, s) in data[i * *dim..(i + 1) * *dim]
                    .iter_mut()
                    .zip(b.chunks_exact(4))
                {
                    *d = f32::from_le_bytes(s.try_into().expect("4-byte chunk"));
                }
            }
            (Column::Bytes { .. }, ValueRef::Bytes(b)) => return self.overwrite_bytes(i, b, rec),
            _ => return KeyStatus::WrongType,
        }
        KeyStatus::Ok
    }

    fn overwrite_bytes(&mut self, mut i: usize, b: &[u8], rec: usize) -> KeyStatus {
        let Column::Bytes { arena, offs, .. } = &self.col else {
            unreachable!("caller matched Bytes")
        };
        let old = read_u32(arena, offs[i] as usize) as usize;
        if b.len() > old {
            // Reclaiming renumbers entries; the key record says where this one went.
            let slot = self.key_offs[i];
            let room = self.grow_for(0, rec, |d, exact| match &d.col {
                Column::Bytes { arena, .. } => Plan {
                    col: target(arena.len(), arena.capacity(), rec, exact),
                    ..Plan::default()
                },
                _ => unreachable!("caller matched Bytes"),
            });
            if !room {
                return KeyStatus::OutOfMemory;
            }
            i = entry_at(&self.keys, slot);
        }
        let Column::Bytes {
            arena,
            offs,
            garbage,
        } = &mut self.col
        else {
            unreachable!("caller matched Bytes")
        };
        if b.len() <= old {
            // Shrinking in place keeps the record where it is; the tail becomes garbage.
            let off = offs[i] as usize;
            arena[off..off + 4].copy_from_slice(&(b.len() as u32).to_le_bytes());
            arena[off + 4..off + 4 + b.len()].copy_from_slice(b);
            *garbage += old - b.len();
        } else {
            offs[i] = push_record(arena, b);
            *garbage += 4 + old;
        }
        self.reclaim();
        KeyStatus::Ok
    }

    fn growth_plan(&self, key_len: usize, rec: usize, exact: bool) -> Plan {
        let (col, col_offs) = match &self.col {
            Column::I64(v) => (target(v.len(), v.capacity(), 1, exact), None),
            Column::F64(v) => (target(v.len(), v.capacity(), 1, exact), None),
            Column::F32 { dim, data } => (target(data.len(), data.capacity(), *dim, exact), None),
            Column::Bytes { arena, offs, .. } => (
                target(arena.len(), arena.capacity(), rec, exact),
                target(offs.len(), offs.capacity(), 1, exact),
            ),
        };
        Plan {
            keys: target(
                self.keys.len(),
                self.keys.capacity(),
                key_record_len(key_len),
                exact,
            ),
            key_offs: target(self.key_offs.len(), self.key_offs.capacity(), 1, exact),
            index: self.index.needs_growth(),
            col,
            col_offs,
        }
    }

    /// Bytes a plan allocates. The index's old buckets are freed only after the new ones are
    /// filled, so its whole new size is charged.
    fn plan_cost(&self, p: &Plan) -> usize {
        let grow =
            |new: Option<usize>, cap: usize, elem: usize| new.map_or(0, |n| (n - cap) * elem);
        let (col_elem, col_cap, offs_cap) = match &self.col {
            Column::I64(v) => (8, v.capacity(), 0),
            Column::F64(v) => (8, v.capacity(), 0),
            Column::F32 { data, .. } => (4, data.capacity(), 0),
            Column::Bytes { arena, offs, .. } => (1, arena.capacity(), offs.capacity()),
        };
        let index = if p.index {
            self.index.growth_bytes()
        } else {
            0
        };
        grow(p.keys, self.keys.capacity(), 1)
            + grow(p.key_offs, self.key_offs.capacity(), 4)
            + grow(p.col, col_cap, col_elem)
            + grow(p.col_offs, offs_cap, 8)
            + index
    }

    /// Charge and apply the growth `generous` (doubling) or, if the budget cannot take it,
    /// `exact` (just enough). Returns false, with nothing charged or grown, if neither fits.
    fn charge_growth(&mut self, generous: Plan, exact: Plan) -> bool {
        // Nearly every insert finds room: it must not touch the meter's shared atomics (two
        // contended read-modify-writes per key were ~5% of a load's server time).
        if self.plan_cost(&generous) == 0 {
            return true;
        }
        let mut chosen = None;
        for plan in [generous, exact] {
            let cost = self.plan_cost(&plan);
            if self.meter.try_charge(cost) {
                chosen = Some((plan, cost));
                break;
            }
        }
        let Some((plan, cost)) = chosen else {
            return false;
        };
        if cost == 0 {
            return true;
        }
        fn grow_to<T>(v: &mut Vec<T>, cap: Option<usize>) {
            if let Some(cap) = cap {
                v.reserve_exact(cap - v.len());
            }
        }
        grow_to(&mut self.keys, plan.keys);
        grow_to(&mut self.key_offs, plan.key_offs);
        match &mut self.col {
            Column::I64(v) => grow_to(v, plan.col),
            Column::F64(v) => grow_to(v, plan.col),
            Column::F32 { data, .. } => grow_to(data, plan.col),
            Column::Bytes { arena, offs, .. } => {
                grow_to(arena, plan.col);
                grow_to(offs, plan.col_offs);
            }
        }
        if plan.index {
            self.rebuild_index(self.index.grown_buckets());
        }
        self.settle(cost);
        true
    }

    fn insert(&mut self, key: &[u8], hash: u64, value: ValueRef<'_>, rec: usize) -> KeyStatus {
        if self.key_offs.len() >= u32::MAX as usize
            || self.keys.len() + key_record_len(key.len()) > MAX_KEY_ARENA
        {
            return KeyStatus::OutOfMemory;
        }
        let key_rec = key_record_len(key.len());
        if !self.grow_for(key_rec, rec, |d, exact| {
            d.growth_plan(key.len(), rec, exact)
        }) {
            return KeyStatus::OutOfMemory;
        }
        // From here on nothing allocates: every vector and the index have room.
        let slot = push_key(&mut self.keys, key, self.key_offs.len());
        self.key_offs.push(slot);
        self.index.insert_unique(hash, slot);
        match (&mut self.col, value) {
            (Column::I64(v), ValueRef::I64(x)) => v.push(x),
            (Column::F64(v), ValueRef::F64(x)) => v.push(x),
            (Column::F32 { data, .. }, ValueRef::F32Vec(x)) => data.extend_from_slice(x),
            (Column::F32 { data, .. }, ValueRef::F32VecLe(b)) => data.extend(
                b.chunks_exact(4)
                    .map(|s| f32::from_le_bytes(s.try_into().expect("4-byte chunk"))),
            ),
            (Column::Bytes { arena, offs, .. }, ValueRef::Bytes(b)) => {
                let off = push_record(arena, b);
                offs.push(off);
            }
            _ => unreachable!("value type checked before insert"),
        }
        KeyStatus::Ok
    }

    /// Remove one key (swap-remove: the last entry moves into the hole, the index is re-pointed).
    pub(crate) fn delete(&mut self, key: &[u8], max_key: usize) -> KeyStatus {
        if key.len() > max_key {
            return KeyStatus::KeyTooLarge;
        }
        let hash = key_hash(key);
        let Some(slot) = self.find_slot(key, hash) else {
            return KeyStatus::NotFound;
        };
        let i = entry_at(&self.keys, slot);
        let last = self.key_offs.len() - 1;
        self.index.remove(hash, slot);
        self.key_garbage += key_record_len(key.len());
        if i != last {
            // The last entry moves into the hole: its record learns its new number; the index
            // points at the record, so it needs no change.
            set_entry(&mut self.keys, self.key_offs[last], i);
        }
        self.key_offs.swap_remove(i);
        self.generation = self.generation.wrapping_add(1);
        match &mut self.col {
            Column::I64(v) => {
                v.swap_remove(i);
            }
            Column::F64(v) => {
                v.swap_remove(i);
            }
            Column::F32 { dim, data } => {
                let dim = *dim;
                if i != last {
                    data.copy_within(last * dim..(last + 1) * dim, i * dim);
                }
                data.truncate(last * dim);
            }
            Column::Bytes {
                arena,
                offs,
                garbage,
            } => {
                *garbage += record_at(arena, offs[i]).len();
                offs.swap_remove(i);
            }
        }
        self.reclaim();
        self.debug_check();
        KeyStatus::Ok
    }

    /// Invariants every mutation keeps (checked in debug builds only).
    fn debug_check(&self) {
        debug_assert_eq!(
            self.charged,
            self.allocated(),
            "charge drifted from the real allocation"
        );
        debug_assert_eq!(
            self.index.len(),
            self.key_offs.len(),
            "index and entries disagree"
        );
    }

    /// After a delete or an overwrite: compact an arena whose garbage exceeds half of it, then
    /// shrink what has become mostly empty (see the module's reclaim rule).
    fn reclaim(&mut self) {
        if self.key_garbage > SMALL && self.key_garbage * 2 > self.keys.len() {
            self.compact_keys();
        }
        if let Column::Bytes { arena, garbage, .. } = &self.col {
            if *garbage > SMALL && *garbage * 2 > arena.len() {
                self.compact_values();
            }
        }
        self.shrink();
    }

    /// Shrink every vector, arena (compacting it first) and the index whose live part is below a
    /// quarter of its capacity, and settle the meter.
    ///
    /// Vectors shrink by a shrinking `realloc`. Our binaries use the system allocator, and
    /// glibc shrinks a block in place (it splits the chunk, or remaps a mapped one), so the old
    /// and the new block never coexist and the shrink is settled afterwards, charging nothing
    /// ahead: a partition at its limit can always shrink. The index builds a smaller bucket
    /// array beside the old one, so that is charged first and skipped if the budget cannot take
    /// it (the vectors shrink first, so a later delete usually finds the room).
    fn shrink(&mut self) {
        let mut shrunk = false;
        let live_keys = self.keys.len() - self.key_garbage;
        if shrunk_capacity(live_keys, self.keys.capacity(), 1).is_some() {
            if self.key_garbage > 0 {
                self.compact_keys();
            }
            shrunk |= shrink_vec(&mut self.keys);
        }
        shrunk |= shrink_vec(&mut self.key_offs);
        if let Column::Bytes { arena, garbage, .. } = &self.col {
            let live = arena.len() - *garbage;
            if *garbage > 0 && shrunk_capacity(live, arena.capacity(), 1).is_some() {
                self.compact_values();
            }
        }
        shrunk |= match &mut self.col {
            Column::I64(v) => shrink_vec(v),
            Column::F64(v) => shrink_vec(v),
            Column::F32 { data, .. } => shrink_vec(data),
            Column::Bytes { arena, offs, .. } => shrink_vec(arena) | shrink_vec(offs),
        };
        let mut ahead = 0;
        if let Some(buckets) = self.index.shrunk_buckets(SMALL) {
            let bytes = Index::bytes_of(buckets);
            if self.meter.try_charge(bytes) {
                self.rebuild_index(buckets);
                ahead = bytes;
                shrunk = true;
            }
        }
        if shrunk {
            self.settle(ahead);
        }
    }

    /// Move the live key records to the front of the key arena, in arena order, and re-point
    /// the index (the slots moved). Allocates nothing: the arena keeps its capacity.
    ///
    /// A record is live iff its entry's slot is the record's own slot: a deleted record keeps
    /// a stale entry number, whose slot (if that entry exists) is another record's. Records only
    /// move down (to `w <= at`), and one moved record's new slot is below every record not yet
    /// visited, so the test stays sound while the walk rewrites `key_offs`.
    fn compact_keys(&mut self) {
        let end = self.keys.len();
        let (mut at, mut w) = (0, 0);
        while at < end {
            let rec = key_record_len(read_u32(&self.keys, at) as usize);
            let e = read_u32(&self.keys, at + 4) as usize;
            if self.key_offs.get(e) == Some(&((at / 4) as u32)) {
                self.keys.copy_within(at..at + rec, w);
                self.key_offs[e] = (w / 4) as u32;
                w += rec;
            }
            at += rec;
        }
        self.keys.truncate(w);
        self.key_garbage = 0;
        // Clearing keeps the index's buckets, so re-inserting allocates nothing.
        self.index.clear();
        let keys = &self.keys;
        self.index.insert_all(
            self.key_offs
                .iter()
                .map(|&slot| (key_hash(key_at(keys, slot)), slot)),
        );
    }

    /// Rebuild the index with `buckets` buckets from the key records in entry order. After
    /// appends only (a load) that is arena order, so the keys are read back sequentially rather
    /// than one cache miss each in bucket order (see [`Index::rebuild_from`]).
    fn rebuild_index(&mut self, buckets: usize) {
        let keys = &self.keys;
        self.index.rebuild_from(
            buckets,
            self.key_offs
                .iter()
                .map(|&slot| (key_hash(key_at(keys, slot)), slot)),
        );
    }

    /// Drop the garbage of a bytes column's arena. If the budget can take a copy of the live
    /// records, they are copied in entry order into a fresh arena of exactly their size (the old
    /// one goes back at once). Otherwise, as when a write was just refused, they are moved to
    /// the front of the arena in place, which allocates nothing; a value record does not say
    /// whose it is, so the entries are first renumbered into arena order (an in-place sort,
    /// several times slower than the copy). Either way callers holding an entry number must
    /// look it up again, e.g. through its key slot.
    fn compact_values(&mut self) {
        let Column::Bytes {
            arena,
            offs,
            garbage,
        } = &mut self.col
        else {
            return;
        };
        let live = arena.len() - *garbage;
        if self.meter.try_charge(live) {
            let mut fresh = Vec::with_capacity(live);
            for off in offs.iter_mut() {
                let rec = record_at(arena, *off);
                *off = fresh.len() as u64;
                fresh.extend_from_slice(rec);
            }
            *arena = fresh;
            *garbage = 0;
            self.settle(live);
            return;
        }
        sort_entries_by_offset(offs, &mut self.key_offs);
        for (i, &slot) in self.key_offs.iter().enumerate() {
            set_entry(&mut self.keys, slot, i);
        }
        // In offset order each record moves down (or stays), never over a live one not yet moved.
        let mut w = 0;
        for off in offs.iter_mut() {
            let at = *off as usize;
            let rec = 4 + read_u32(arena, at) as usize;
            arena.copy_within(at..at + rec, w);
            *off = w as u64;
            w += rec;
        }
        arena.truncate(w);
        *garbage = 0;
    }

    /// Charge and make the growth `plan(self, exact)` asks for (see [`PartData::charge_growth`]).
    /// If the budget refuses it, first reclaim the garbage of an arena that has to grow and
    /// holds at least what the write appends to it (`key_need`, `value_need` bytes), then try
    /// once more: deleted space is reused before a write is refused.
    fn grow_for(
        &mut self,
        key_need: usize,
        value_need: usize,
        plan: impl Fn(&Self, bool) -> Plan,
    ) -> bool {
        if self.charge_growth(plan(self, false), plan(self, true)) {
            return true;
        }
        let want = plan(self, true);
        let mut reclaimed = false;
        if want.keys.is_some() && key_need > 0 && self.key_garbage >= key_need {
            self.compact_keys();
            reclaimed = true;
        }
        if let Column::Bytes { garbage, .. } = &self.col {
            if want.col.is_some() && value_need > 0 && *garbage >= value_need {
                self.compact_values();
                reclaimed = true;
            }
        }
        reclaimed && self.charge_growth(plan(self, false), plan(self, true))
    }

    /// Make the data final: drop garbage and excess capacity so a sealed version holds only what
    /// it uses.
    pub(crate) fn freeze(&mut self) {
        // Compaction may renumber entries: a scan paging through the open data must start again.
        self.generation = self.generation.wrapping_add(1);
        if self.key_garbage > 0 {
            self.compact_keys();
        }
        if let Column::Bytes { garbage, .. } = &self.col {
            if *garbage > 0 {
                self.compact_values();
            }
        }
        self.keys.shrink_to_fit();
        self.key_offs.shrink_to_fit();
        match &mut self.col {
            Column::I64(v) => v.shrink_to_fit(),
            Column::F64(v) => v.shrink_to_fit(),
            Column::F32 { data, .. } => data.shrink_to_fit(),
            Column::Bytes { arena, offs, .. } => {
                arena.shrink_to_fit();
                offs.shrink_to_fit();
            }
        }
        if let Some(buckets) = self.index.fitted_buckets() {
            self.rebuild_index(buckets);
        }
        self.settle(0);
    }
}

/// Append the packed result of looking up each `(partition, key)`, in order: one status byte per
/// key to `status`, and to `values` 8 LE bytes per key for i64/f64 (zeros on a miss), `dim * 4` LE
/// bytes per key for f32 vectors (zeros on a miss), and `u32 LE length + bytes` per hit for bytes
/// tables. Every partition must be of `value_type`. The keys may come from any number of
/// partitions: the pipeline of [`lookup_many`] runs over all of them, so a request whose keys are
/// spread thinly over many partitions overlaps its cache misses as well as one that is not.
/// `expected` (the number of keys, if known) only sizes the buffers.
///
/// Returns false, having stopped appending values (statuses go on) once `values` would pass
/// `max_values` bytes: the caller then throws the partial result away.
pub(crate) fn get_packed<'d, 'k>(
    items: impl Iterator<Item = (&'d PartData, &'k [u8])>,
    value_type: ValueType,
    expected: usize,
    max_key: usize,
    max_values: usize,
    status: &mut Vec<u8>,
    values: &mut Vec<u8>,
) -> bool {
    status.reserve(expected);
    let limit = values.len().saturating_add(max_values);
    let mut fits = true;
    // The value type is matched once per batch; each arm is a tight per-key loop.
    match value_type {
        ValueType::I64 | ValueType::F64 => {
            values.reserve(expected.saturating_mul(8).min(max_values));
            let is_i64 = value_type == ValueType::I64;
            lookup_many(items, max_key, |d, found| {
                let bits = match found {
                    Ok(i) if is_i64 => {
                        status.push(KeyStatus::Ok as u8);
                        d.i64s()[i] as u64
                    }
                    Ok(i) => {
                        status.push(KeyStatus::Ok as u8);
                        d.f64s()[i].to_bits()
                    }
                    Err(st) => {
                        status.push(st as u8);
                        0
                    }
                };
                fits &= values.len() + 8 <= limit;
                if fits {
                    values.extend_from_slice(&bits.to_le_bytes());
                }
            });
        }
        ValueType::F32Vec { dim } => {
            let width = dim as usize * 4;
            values.reserve(expected.saturating_mul(width).min(max_values));
            lookup_many(items, max_key, |d, found| {
                let st = match found {
                    Ok(_) => KeyStatus::Ok,
                    Err(st) => st,
                };
                status.push(st as u8);
                fits &= values.len() + width <= limit;
                if !fits {
                    return;
                }
                let start = values.len();
                values.resize(start + width, 0);
                if let Ok(i) = found {
                    for (dst, x) in values[start..].chunks_exact_mut(4).zip(d.f32s(i)) {
                        dst.copy_from_slice(&x.to_le_bytes());
                    }
                }
            });
        }
        ValueType::Bytes => {
            lookup_many(items, max_key, |d, found| match found {
                Ok(i) => {
                    status.push(KeyStatus::Ok as u8);
                    let record = d.bytes_record(i);
                    fits &= values.len() + record.len() <= limit;
                    if fits {
                        values.extend_from_slice(record);
                    }
                }
                Err(st) => status.push(st as u8),
            });
        }
    }
    fits
}

/// What [`lookup_many`] reads: an index, a key arena, and a value column it can prefetch. A
/// partition in memory ([`PartData`]) and a mapped image (`crate::image_view::ImageView`) are
/// both, so both are read by the same pipeline.
pub(crate) trait Lookup {
    /// The index.
    fn probe(&self) -> Probe<'_>;
    /// The key arena the index's slots point into.
    fn key_arena(&self) -> &[u8];
    /// Start loading entry `i`'s value (or, for bytes, its offset).
    fn prefetch_value(&self, i: usize);
}

impl Lookup for PartData {
    #[inline]
    fn probe(&self) -> Probe<'_> {
        self.index.probe()
    }

    #[inline]
    fn key_arena(&self) -> &[u8] {
        &self.keys
    }

    #[inline]
    fn prefetch_value(&self, i: usize) {
        PartData::prefetch_value(self, i)
    }
}

/// Look up every `(partition, key)` and call `emit` with the partition and the key's entry number
/// in it (or why there is none), in order. Keys go through in windows of [`GROUP`] and four
/// passes, each prefetching what the next pass reads (bucket -> key record -> value), so the cache
/// misses of a whole window overlap instead of running one after another. That is what makes a
/// lookup in a table much larger than the CPU caches cost tens of ns, not hundreds. A window may
/// mix partitions freely: each key carries its own.
#[inline]
pub(crate) fn lookup_many<'d, D: Lookup + 'd, K: AsRef<[u8]> + Copy>(
    items: impl Iterator<Item = (&'d D, K)>,
    max_key: usize,
    mut emit: impl FnMut(&'d D, Result<usize, KeyStatus>),
) {
    let mut items = items.peekable();
    // The arrays need some partition to start from; any will do, every slot is overwritten
    // before it is read.
    let Some(&(first, first_key)) = items.peek() else {
        return;
    };
    let mut parts: [&D; GROUP] = [first; GROUP];
    let mut group: [K; GROUP] = [first_key; GROUP];
    let mut hashes = [0u64; GROUP];
    let mut cand = [Candidate::Absent; GROUP];
    let mut entry = [0usize; GROUP];
    loop {
        let mut len = 0;
        for (d, key) in items.by_ref().take(GROUP) {
            parts[len] = d;
            group[len] = key;
            len += 1;
        }
        if len == 0 {
            return;
        }
        // Pass 1: hash; prefetch the home buckets.
        for j in 0..len {
            let key = group[j].as_ref();
            if key.len() <= max_key {
                hashes[j] = key_hash(key);
                parts[j].probe().prefetch(hashes[j]);
            }
        }
        // Pass 2: the buckets have arrived; take the first place whose tag matches (no key
        // compare yet, so no dependent miss) and prefetch its key record.
        for j in 0..len {
            let d = parts[j];
            cand[j] = if group[j].as_ref().len() <= max_key {
                d.probe().first_candidate(hashes[j])
            } else {
                Candidate::Absent
            };
            match cand[j] {
                Candidate::Slot(c) => prefetch(d.key_arena().as_ptr().wrapping_add(c as usize * 4)),
                Candidate::Unsure => d.probe().prefetch_spill(hashes[j]),
                Candidate::Absent => {}
            }
        }
        // Pass 3: the records have arrived; prefetch the values of their entries. A key not in
        // its home bucket (~3%) takes its candidate from the next bucket, which has arrived too,
        // and prefetches that record; its entry is read in pass 4 (`LATE`).
        for j in 0..len {
            let d = parts[j];
            match cand[j] {
                Candidate::Slot(c) => {
                    entry[j] = entry_at(d.key_arena(), c);
                    d.prefetch_value(entry[j]);
                }
                Candidate::Unsure => {
                    cand[j] = d.probe().second_candidate(hashes[j]);
                    if let Candidate::Slot(c) = cand[j] {
                        prefetch(d.key_arena().as_ptr().wrapping_add(c as usize * 4));
                    }
                    entry[j] = LATE;
                }
                Candidate::Absent => {}
            }
        }
        // Pass 4: confirm. A wrong or unsure candidate (another key with the same 16-bit tag,
        // or a key that went past the bucket after its home) falls back to a full probe.
        for j in 0..len {
            let (d, key) = (parts[j], group[j].as_ref());
            let keys = d.key_arena();
            let found = if key.len() > max_key {
                Err(KeyStatus::KeyTooLarge)
            } else {
                match cand[j] {
                    Candidate::Absent => Err(KeyStatus::NotFound),
                    Candidate::Slot(c) if key_eq(key_at(keys, c), key) => Ok(match entry[j] {
                        LATE => entry_at(keys, c),
                        e => e,
                    }),
                    _ => d
                        .probe()
                        .find(hashes[j], |s| key_eq(key_at(keys, s), key))
                        .map(|s| entry_at(keys, s))
                        .ok_or(KeyStatus::NotFound),
                }
            };
            emit(d, found);
        }
        if len < GROUP {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::key_eq;

    #[test]
    fn key_eq_agrees_with_slice_equality_at_every_length_and_position() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37)).collect();
            assert!(key_eq(&a, &a.clone()));
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!key_eq(&a, &b), "length {n}, byte {at}");
            }
            if n > 0 {
                assert!(!key_eq(&a, &a[..n - 1]));
            }
            let mut longer = a.clone();
            longer.push(0);
            assert!(!key_eq(&a, &longer));
        }
    }
}
