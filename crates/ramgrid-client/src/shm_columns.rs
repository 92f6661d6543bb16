//! A pinned version's columns read straight from its mapped partitions: what a `PinnedTable`'s
//! `to_arrow` is built from where servers on this host hold the version (docs/shared-memory.md,
//! "Columns out").
//!
//! Fixed-width values (i64, f64, f32 vectors) are not copied: a [`MappedValues`] borrows the
//! image's value section, which is the column in entry order, little-endian, and holds the
//! mappings while it lives. Keys, and the values of a bytes table, are gathered from their
//! records into Arrow's (offsets, data) layout in buffers the caller provides (Python hands
//! pyarrow's memory pool's), sized by [`ShmReader::column_sizes`], the partitions spread over
//! threads by [`ShmReader::write_columns`]. Entry order is the order a scan of the partition
//! visits, so a partition comes out as its TCP scan does.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::shm::Attached;
use crate::shm_reader::ShmReader;

/// One partition's fixed-width value column, borrowed from its mapping, which stays mapped while
/// this lives (whatever is detached meanwhile: the bytes are sealed and never change).
pub struct MappedValues {
    set: Arc<Attached>,
    partition: u32,
}

impl std::fmt::Debug for MappedValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedValues")
            .field("partition", &self.partition)
            .field("bytes", &self.as_ref().len())
            .finish()
    }
}

impl AsRef<[u8]> for MappedValues {
    /// Every value of the partition in entry order, back to back: 8 LE bytes per i64 or f64,
    /// `dim * 4` LE bytes per f32 vector.
    fn as_ref(&self) -> &[u8] {
        self.set
            .view(self.partition)
            .and_then(|v| v.fixed_values())
            .expect("made only for a mapped partition of fixed-width values")
    }
}

/// What one mapped partition's columns take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnSizes {
    /// Its items.
    pub items: usize,
    /// Room for its keys back to back (at most 3 bytes per key more than they take).
    pub key_bytes: usize,
    /// Its bytes values back to back, exactly (0 for the other value types).
    pub value_bytes: usize,
}

/// Where [`ShmReader::write_columns`] writes one partition's key column and, for a bytes table,
/// its value column: Arrow's `items + 1` offsets (from 0) and room for the bytes as
/// [`ColumnSizes`] says. `None` for a column not wanted.
#[derive(Debug)]
pub struct ColumnsOut<'a> {
    /// The partition.
    pub partition: u32,
    /// Key offsets and key bytes.
    pub keys: Option<(&'a mut [i64], &'a mut [u8])>,
    /// Value offsets and value bytes (bytes tables only).
    pub values: Option<(&'a mut [i64], &'a mut [u8])>,
    /// Set by the write: whether the partition was mapped (if not, nothing was written: scan
    /// it), and the key and value bytes written.
    pub done: Option<(usize, usize)>,
}

impl ShmReader {
    /// Whether reads through the handle are answered from the mappings now: the version is
    /// still attached, outside [`crate::shm::tcp_only`], in the process that made the handle,
    /// and the client knows the table as the pinned incarnation.
    pub fn answers(&self) -> bool {
        self.usable()
    }

    /// What `partition`'s columns take, if it is mapped.
    pub fn column_sizes(&self, partition: u32) -> Option<ColumnSizes> {
        let v = self.set.view(partition)?;
        Some(ColumnSizes {
            items: v.len(),
            key_bytes: v.key_bytes_bound(),
            value_bytes: v.bytes_values_len(),
        })
    }

    /// `partition`'s values in place, if it is mapped and of a fixed-width type.
    pub fn mapped_values(&self, partition: u32) -> Option<MappedValues> {
        self.set.view(partition)?.fixed_values()?;
        Some(MappedValues {
            set: self.set.clone(),
            partition,
        })
    }

    /// Write the columns each of `outs` asks for from the mappings, on up to `threads` threads
    /// (no more than the cores), each taking the next partition as it finishes one (partitions
    /// differ in size). A partition that is not mapped is left with `done` None.
    ///
    /// # Panics
    ///
    /// If a buffer is smaller than [`ShmReader::column_sizes`] says or the offsets are not
    /// `items + 1`.
    pub fn write_columns(&self, outs: &mut [ColumnsOut<'_>], threads: usize) {
        let one = |o: &mut ColumnsOut<'_>| {
            let Some(v) = self.set.view(o.partition) else {
                return;
            };
            let k = o.keys.as_mut().map_or(0, |(e, d)| v.write_keys(e, d));
            let b = o
                .values
                .as_mut()
                .map_or(0, |(e, d)| v.write_bytes_values(e, d));
            o.done = Some((k, b));
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = threads.min(cores).min(outs.len()).max(1);
        if threads == 1 {
            outs.iter_mut().for_each(one);
            return;
        }
        let queue = Mutex::new(outs.iter_mut());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let Some(o) = queue.lock().next() else {
                        return;
                    };
                    one(o);
                });
            }
        });
    }
}
