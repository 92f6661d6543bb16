//! [`TableVersion`]: one version of one table resolved once per request, and what a request does
//! with it: batched reads, writes and deletes by partition group, scans, partition images.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::partition::{self, PartData};
use super::{
    KeyStatus, OpenGuard, PartSlot, PartitionView, Table, TableSpec, ValueRef, ValueType, Version,
    MAX_KEY_LEN,
};
use crate::{Error, Result};

/// One version of one table, resolved once (version 0 = the current one at [`Tables::at`]).
/// The server takes one per request so that every partition group of a request reads the same
/// version, and pays the name and version lookups once, not per group. Holding it keeps the
/// version's data alive (and readable) even if the version is dropped meanwhile.
#[derive(Debug, Clone)]
pub struct TableVersion {
    pub(super) table: Arc<Table>,
    pub(super) version: Arc<Version>,
    pub(super) held: Arc<[bool]>,
    pub(super) max_value: usize,
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

    pub(super) fn slot(&self, partition: u32) -> Result<&PartSlot> {
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
    pub(super) fn write<R>(
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
