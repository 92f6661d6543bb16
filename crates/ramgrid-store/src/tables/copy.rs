//! Copying partitions between servers: the store's half of moves and repairs
//! (docs/membership.md).
//!
//! A partition that a server should hold but whose data it does not have yet is *pending* in
//! each version that lacks it: reads of it are refused ([`Error::Repairing`]) so clients read a
//! replica instead, and, in an open version, writes are taken (clients send every write to it
//! during the copy) and their keys remembered. The copy arrives as a flat image
//! (docs/partition-image.md) taken from a replica:
//!
//! - into a sealed version, the image replaces the partition whole (the version is rebuilt
//!   around it, sharing its other partitions);
//! - into an open version, every key of the image is stored unless a write here touched it since
//!   the copy began: those writes came later than the copy's, or with it (the image was taken
//!   after this server started taking writes for the partition, see the server's repair), so
//!   they stand. Deletes are remembered the same way, so the copy cannot bring a key back. A
//!   key here that the image lacks and no write here touched is removed: the replica deleted it
//!   (or never had it), and the image is newer than anything here that was not written since.
//!
//! Either way the partition stops being pending only when its whole copy is in.
//!
//! A log table's open version replayed from this server's own write-ahead log at a restart is
//! *pending with its content* ([`Tables::mark_replayed_pending`]): it may lack writes its
//! replicas took while this server was down, so a copy from a replica reconciles it (the rules
//! above: replayed keys the replica has are replaced, those it lacks are dropped, writes here
//! since the restart stand). If no replica can give a copy (all of them are down or
//! restarting too), [`Tables::serve_replayed`] serves the replayed content as it is.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::partition::{Meter, PartData};
use super::{KeyStatus, PartSlot, Table, TableSpec, TableState, TableVersion, Tables, Version};
use crate::{Error, Result};

/// Whether a version is sealed, and which of its partitions are pending here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingVersion {
    /// The version number.
    pub version: u32,
    /// Whether it is sealed.
    pub sealed: bool,
    /// Its held partitions whose data is not here yet, ascending.
    pub partitions: Vec<u32>,
}

impl TableVersion {
    /// The image of one partition for a copy, and whether it is of a sealed version. A sealed
    /// partition's image is its frozen data's; an open one's is a point-in-time copy, taken
    /// under the partition's read lock (writers wait for the copy, readers do not). A pending
    /// partition is refused ([`Error::Repairing`]): it has nothing whole to give.
    pub fn export_image(&self, partition: u32) -> Result<(Vec<u8>, bool)> {
        let slot = self.slot_any(partition)?;
        if slot.pending.load(Ordering::Acquire) {
            return Err(Error::Repairing(partition));
        }
        if slot.frozen.get().is_some() {
            return Ok((self.partition_image(partition)?, true));
        }
        let copy = slot.read(|data| {
            // Unlimited meter: the copy is transient and not table data here.
            let mut copy = PartData::new(self.value_type(), Arc::new(Meter::new(usize::MAX)));
            copy.put_many(
                (0..data.len()).map(|i| (data.key(i), data.value(i))),
                usize::MAX,
                usize::MAX,
                |_| {},
            );
            copy
        });
        let mut copy = copy;
        copy.freeze();
        let img = crate::image::image_bytes(&copy).map_err(|e| Error::Invalid(e.to_string()))?;
        Ok((img, false))
    }

    /// The slot of `partition`, held or not (a leaving partition can still be copied).
    fn slot_any(&self, partition: u32) -> Result<&PartSlot> {
        self.version
            .parts
            .get(partition as usize)
            .ok_or_else(|| Error::Invalid(format!("partition {partition} out of range")))
    }
}

impl Version {
    /// A sealed version like `old` whose partitions in `replace` hold the given data instead
    /// (`None`: pending, empty). The other partitions are shared with `old`.
    fn rebuilt(
        old: &Version,
        spec: &TableSpec,
        meter: &Arc<Meter>,
        mut replace: Vec<(u32, Option<PartData>)>,
    ) -> Result<Version> {
        let mut v = Version::new(old.number, spec, meter)?;
        for (i, (slot, prev)) in v.parts.iter_mut().zip(old.parts.iter()).enumerate() {
            *slot.open.get_mut() = None;
            let (data, pending) = match replace.iter().position(|(p, _)| *p as usize == i) {
                Some(at) => {
                    let data = replace.swap_remove(at).1;
                    let pending = data.is_none();
                    (data.map(Arc::new), pending)
                }
                None => (
                    prev.frozen.get().cloned(),
                    prev.pending.load(Ordering::Acquire),
                ),
            };
            let data =
                data.unwrap_or_else(|| Arc::new(PartData::new(spec.value_type, meter.clone())));
            let _ = slot.frozen.set(data);
            *slot.pending.get_mut() = pending;
        }
        *v.sealed.get_mut() = true;
        Ok(v)
    }
}

impl Tables {
    /// Creates a table copied from a replica's description: no version yet (they are added by
    /// [`Tables::adopt_version`]), holding `held`, with the replica's high-water mark.
    pub fn adopt_table(&self, spec: TableSpec, held: &[u32], high_water: u32) -> Result<()> {
        let mask = Self::held_mask(&spec, held)?;
        let mut tables = self.tables.write();
        if tables.contains_key(&spec.name) {
            return Err(Error::TableExists(spec.name));
        }
        let state = TableState {
            versions: Default::default(),
            current: 0,
            high_water,
            held: mask.into(),
        };
        tables.insert(
            spec.name.clone(),
            Arc::new(Table {
                spec,
                state: parking_lot::RwLock::new(state),
            }),
        );
        Ok(())
    }

    /// Adds version `version` as a replica has it (the same number names the same contents, so
    /// the high-water mark does not stop it), with every held partition pending until its copy
    /// is imported. A sealed one is empty and sealed; an open one takes writes at once.
    pub fn adopt_version(&self, name: &str, version: u32, sealed: bool) -> Result<()> {
        let table = self.table(name)?;
        let mut st = table.state.write();
        if st.versions.contains_key(&version) {
            return Err(Error::VersionExists(version));
        }
        let v = Version::new(version, &table.spec, &self.meter)?;
        for (p, slot) in v.parts.iter().enumerate() {
            if !st.held[p] {
                continue;
            }
            slot.pending.store(true, Ordering::Release);
            if !sealed {
                *slot.touched.lock() = Some(HashSet::new());
            }
        }
        if sealed {
            for slot in v.parts.iter() {
                if let Some(mut data) = slot.open.write().take() {
                    data.freeze();
                    let _ = slot.frozen.set(Arc::new(data));
                }
            }
            v.sealed.store(true, Ordering::Release);
        }
        st.high_water = st.high_water.max(version);
        st.versions.insert(version, Arc::new(v));
        Ok(())
    }

    /// Points a copied table at `version` as its replicas do. Unlike [`Tables::set_current`] an
    /// open version is accepted: the mutable head (version 1) is current while open.
    pub fn adopt_current(&self, name: &str, version: u32) -> Result<()> {
        let table = self.table(name)?;
        let mut st = table.state.write();
        if version != 0 && !st.versions.contains_key(&version) {
            return Err(Error::NoSuchVersion(version));
        }
        st.current = version;
        Ok(())
    }

    /// Marks `partitions` pending in every version of table `name` (this server starts holding
    /// them and must copy them in). An open partition is emptied (anything there is from an
    /// earlier time it was held, and stale) and starts remembering the keys written to it.
    /// Call before the server starts taking writes for them.
    pub fn mark_pending(&self, name: &str, partitions: &[u32]) -> Result<()> {
        let table = self.table(name)?;
        let st = table.state.read();
        for v in st.versions.values() {
            for &p in partitions {
                let Some(slot) = v.parts.get(p as usize) else {
                    continue;
                };
                let mut open = slot.open.write();
                if let Some(data) = open.as_mut() {
                    *data = PartData::new(table.spec.value_type, self.meter.clone());
                    *slot.touched.lock() = Some(HashSet::new());
                }
                slot.local.store(false, Ordering::Release);
                slot.pending.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Marks `partitions` of OPEN version `version` pending *without emptying them*: their data
    /// was replayed from this server's own write-ahead log at a restart and must be reconciled
    /// with a replica's (module docs). With `servable`, [`Tables::serve_replayed`] may later end
    /// the pending state without a copy (no replica can give one); without it (the log was
    /// damaged and what is here is known to be incomplete) only a copy ends it. Writes are taken
    /// and remembered from now on, as for any pending partition. A sealed version is refused.
    pub fn mark_replayed_pending(
        &self,
        name: &str,
        version: u32,
        partitions: &[u32],
        servable: bool,
    ) -> Result<()> {
        let table = self.table(name)?;
        let v = table.state.read().lookup(version)?;
        for &p in partitions {
            let slot = v.parts.get(p as usize).ok_or_else(|| {
                Error::Invalid(format!(
                    "partition {p} out of range 0..{}",
                    table.spec.partitions
                ))
            })?;
            let open = slot.open.write();
            if open.is_none() {
                return Err(Error::VersionSealed(version));
            }
            if !slot.pending.load(Ordering::Acquire) {
                *slot.touched.lock() = Some(HashSet::new());
                slot.local.store(servable, Ordering::Release);
                slot.pending.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Serves partition `partition` of OPEN version `version` as it is: ends its pending state
    /// if it was marked by [`Tables::mark_replayed_pending`] as servable (its data is this
    /// server's replay of its log), and says whether it did. A partition emptied for a copy is
    /// never served this way.
    pub fn serve_replayed(&self, name: &str, version: u32, partition: u32) -> Result<bool> {
        let table = self.table(name)?;
        let v = table.state.read().lookup(version)?;
        let Some(slot) = v.parts.get(partition as usize) else {
            return Ok(false);
        };
        let open = slot.open.write();
        if open.is_none()
            || !slot.pending.load(Ordering::Acquire)
            || !slot.local.load(Ordering::Acquire)
        {
            return Ok(false);
        }
        *slot.touched.lock() = None;
        slot.local.store(false, Ordering::Release);
        slot.pending.store(false, Ordering::Release);
        Ok(true)
    }

    /// Ends every pending state of table `name` without a copy: its creator's CREATE_TABLE has
    /// reached this server after the server learned the table from a peer (a table created while
    /// this server was joining), so there is nothing older to copy.
    pub fn clear_pending(&self, name: &str) -> Result<()> {
        let table = self.table(name)?;
        let st = table.state.read();
        for v in st.versions.values() {
            for slot in v.parts.iter() {
                let _open = slot.open.write();
                *slot.touched.lock() = None;
                slot.local.store(false, Ordering::Release);
                slot.pending.store(false, Ordering::Release);
            }
        }
        Ok(())
    }

    /// CREATE_VERSION of a version this server learned from a peer while its creator was still
    /// creating it (open, nothing copied yet): ends its pending state and says true, as if this
    /// server had created it. False if the version is not such a one.
    pub fn claim_learned_version(&self, name: &str, version: u32) -> Result<bool> {
        let table = self.table(name)?;
        let st = table.state.read();
        let Some(v) = st.versions.get(&version) else {
            return Ok(false);
        };
        if v.sealed.load(Ordering::Acquire)
            || !v.parts.iter().any(|s| s.pending.load(Ordering::Acquire))
        {
            return Ok(false);
        }
        for slot in v.parts.iter() {
            let _open = slot.open.write();
            *slot.touched.lock() = None;
            slot.local.store(false, Ordering::Release);
            slot.pending.store(false, Ordering::Release);
        }
        Ok(true)
    }

    /// The versions of table `name` with held partitions still pending here.
    pub fn pending(&self, name: &str) -> Result<Vec<PendingVersion>> {
        let table = self.table(name)?;
        let st = table.state.read();
        let mut out = Vec::new();
        for v in st.versions.values() {
            let partitions: Vec<u32> = (0..table.spec.partitions)
                .filter(|&p| {
                    st.held[p as usize] && v.parts[p as usize].pending.load(Ordering::Acquire)
                })
                .collect();
            if !partitions.is_empty() {
                out.push(PendingVersion {
                    version: v.number,
                    sealed: v.sealed.load(Ordering::Acquire),
                    partitions,
                });
            }
        }
        Ok(out)
    }

    /// Brings a copy of `partition` of `version` in from `image` (taken from a replica) and
    /// ends its pending state; returns the items copied. Into a sealed version the image
    /// replaces the partition; into an open one its keys are stored except those written here
    /// since the copy began, and keys here that the image lacks are removed unless written here
    /// since (module docs). On error (a corrupt image, memory) nothing changed for a sealed
    /// version, and an open one stays pending (a retry stores the same keys again).
    pub fn import_image(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        image: &[u8],
    ) -> Result<usize> {
        let (items, _) = self.import_image_then(name, version, partition, image, |_, _| ())?;
        self.finish_import(name, version, partition)?;
        Ok(items)
    }

    /// [`Tables::import_image`] in two steps, for a copy that must be made durable before it is
    /// served. Into an open partition: once the copy is merged, `then(view, dropped)` runs under
    /// the partition's write lock with the partition's content and the keys the copy removed
    /// (there before, absent from the image, not written here since), so a write-ahead log can
    /// append the copy ahead of every later write; the partition *stays pending* (reads refused,
    /// writes taken and remembered, a retry merges again without overwriting them) until
    /// [`Tables::finish_import`]. Returns the items stored and what `then` returned (`None`: the
    /// version is sealed, its partition replaced and no longer pending; or the partition was no
    /// longer pending, so nothing was imported).
    pub fn import_image_then<R>(
        &self,
        name: &str,
        version: u32,
        partition: u32,
        image: &[u8],
        then: impl FnOnce(super::PartitionView<'_>, &[Box<[u8]>]) -> R,
    ) -> Result<(usize, Option<R>)> {
        let table = self.table(name)?;
        let spec = &table.spec;
        if partition >= spec.partitions {
            return Err(Error::Invalid(format!(
                "partition {partition} out of range"
            )));
        }
        let v = table.state.read().lookup(version)?;
        let slot = &v.parts[partition as usize];
        if slot.frozen.get().is_some() {
            let data = crate::image::read_image(image, Some(spec.value_type), &self.meter)?;
            let items = data.len();
            self.replace_sealed(&table, &v, vec![(partition, Some(data))])?;
            return Ok((items, None));
        }
        // Open here. Validate the image apart (uncharged: only what is stored counts), then
        // merge under the partition's write lock so no write can slip between check and store.
        let copy = crate::image::read_image(
            image,
            Some(spec.value_type),
            &Arc::new(Meter::new(usize::MAX)),
        )?;
        let mut open = slot.open.write();
        let Some(data) = open.as_mut() else {
            // Sealed since we looked: try again as a sealed import.
            drop(open);
            return self.import_image_then(name, version, partition, image, then);
        };
        if !slot.pending.load(Ordering::Acquire) {
            // No longer waiting for a copy (its creator claimed it, or another copy came first):
            // the writes since are not remembered, so the image must not overwrite or remove them.
            return Ok((0, None));
        }
        let mut touched = slot.touched.lock();
        let skip = touched.take().unwrap_or_default();
        let mut refused = None;
        let mut stored = 0usize;
        data.put_many(
            (0..copy.len())
                .map(|i| (copy.key(i), copy.value(i)))
                .filter(|(k, _)| !skip.contains(*k)),
            super::MAX_KEY_LEN,
            usize::MAX,
            |st| {
                if st == KeyStatus::Ok {
                    stored += 1;
                } else if refused.is_none() {
                    refused = Some(st);
                }
            },
        );
        if let Some(st) = refused {
            *touched = Some(skip);
            return Err(match st {
                KeyStatus::OutOfMemory => Error::OutOfMemory,
                other => Error::Invalid(format!("copy of partition {partition}: {other:?}")),
            });
        }
        // What the replica no longer has (deleted while this server was away) goes too, unless
        // written here since the copy began.
        let dropped: Vec<Box<[u8]>> = (0..data.len())
            .map(|i| data.key(i))
            .filter(|k| copy.find(k, super::partition::key_hash(k)).is_none() && !skip.contains(*k))
            .map(Box::from)
            .collect();
        for k in &dropped {
            data.delete(k, super::MAX_KEY_LEN);
        }
        // Still pending until finished: later writes stay remembered, in case this merge is
        // retried (its caller could not make it durable).
        *touched = Some(skip);
        let view = super::PartitionView {
            data,
            version,
            value_type: spec.value_type,
        };
        Ok((stored, Some(then(view, &dropped))))
    }

    /// Ends the pending state of `partition` of open version `version` after
    /// [`Tables::import_image_then`] (its copy is in, and durable where it must be): reads are
    /// served from now on. Nothing for a partition that is not pending or a sealed version.
    pub fn finish_import(&self, name: &str, version: u32, partition: u32) -> Result<()> {
        let table = self.table(name)?;
        let v = table.state.read().lookup(version)?;
        let Some(slot) = v.parts.get(partition as usize) else {
            return Err(Error::Invalid(format!(
                "partition {partition} out of range"
            )));
        };
        let _open = slot.open.write();
        *slot.touched.lock() = None;
        slot.local.store(false, Ordering::Release);
        slot.pending.store(false, Ordering::Release);
        Ok(())
    }

    /// Empties `partitions` in every version of table `name`: this server no longer holds them
    /// (they moved away), so their memory goes back to the budget.
    pub fn release_partitions(&self, name: &str, partitions: &[u32]) -> Result<()> {
        if partitions.is_empty() {
            return Ok(());
        }
        let table = self.table(name)?;
        let versions: Vec<Arc<Version>> = table.state.read().versions.values().cloned().collect();
        for v in versions {
            if v.sealed.load(Ordering::Acquire) {
                let replace: Vec<(u32, Option<PartData>)> = partitions
                    .iter()
                    .map(|&p| {
                        let empty = PartData::new(table.spec.value_type, self.meter.clone());
                        (p, Some(empty))
                    })
                    .collect();
                // A version dropped meanwhile has nothing left to release.
                let _ = self.replace_sealed(&table, &v, replace);
                continue;
            }
            for &p in partitions {
                if let Some(slot) = v.parts.get(p as usize) {
                    let mut open = slot.open.write();
                    if let Some(data) = open.as_mut() {
                        *data = PartData::new(table.spec.value_type, self.meter.clone());
                    }
                    *slot.touched.lock() = None;
                    slot.local.store(false, Ordering::Release);
                    slot.pending.store(false, Ordering::Release);
                }
            }
        }
        Ok(())
    }

    /// Replaces sealed version `old` of `table` by one whose `replace` partitions hold the given
    /// data; readers holding `old` keep reading it.
    fn replace_sealed(
        &self,
        table: &Arc<Table>,
        old: &Arc<Version>,
        replace: Vec<(u32, Option<PartData>)>,
    ) -> Result<()> {
        let new = Version::rebuilt(old, &table.spec, &self.meter, replace)?;
        let mut st = table.state.write();
        match st.versions.get(&old.number) {
            Some(cur) if Arc::ptr_eq(cur, old) => {
                st.versions.insert(old.number, Arc::new(new));
                Ok(())
            }
            _ => Err(Error::NoSuchVersion(old.number)),
        }
    }
}
