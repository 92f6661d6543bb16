//! A handle on one mapped pinned version, resolved once, for reads at memory speed
//! (docs/shared-memory.md, "The fast path").
//!
//! [`Client::get_into`] finds a mapped version by name on every call (two locks, two lookups by
//! string, an `Arc` clone). A [`ShmReader`] holds the mapped set itself, so a read is: a few
//! checks (each one load), hash, partition, lookup in the mapping, output. No lock, no
//! allocation, no string hashing; counters are the handle's own.
//!
//! The handle answers only while its answers are the general path's: while the version is
//! attached, outside [`crate::shm::tcp_only`], in the process that made it (not a forked child,
//! whose connections belong to the parent), and while the client knows the table as the
//! incarnation pinned. Otherwise [`ShmReader::try_get_into`] and [`ShmReader::get_wire`] say
//! so (`None`) and [`ShmReader::get_into`] reads through [`Client::get_into_of`], over TCP
//! where nothing is mapped any more. The handle holds the mappings while it lives, so a read
//! through it never touches unmapped memory, whatever was detached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};

use ramgrid_proto::native::ValueType;

use crate::client::Client;
use crate::error::Result;
use crate::keys::Keys;
use crate::shm::{tcp_only_here, Attached, Counters};
use crate::values::ValuesMut;

/// Forks of this process since the first reader was made (bumped in the child).
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The fork count now, with the hook that counts forks installed first.
fn forks() -> u64 {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a plain function that only bumps an atomic; no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    FORKS.load(Ordering::Relaxed)
}

/// A pinned version's mapped partitions, resolved once ([`Client::shm_reader`]). `Send + Sync`;
/// cheap to share behind an `Arc`, though each thread doing many reads does best with its own
/// (its counters are its own cache line).
pub struct ShmReader {
    client: Client,
    pub(crate) set: Arc<Attached>,
    table: String,
    incarnation: u64,
    version: u32,
    counters: Arc<Counters>,
    /// The client's table-cache generation at which the table was last seen as `incarnation`.
    checked: AtomicU64,
    /// [`forks`] when the handle was made: a child process does not read through it.
    forks: u64,
}

impl std::fmt::Debug for ShmReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmReader")
            .field("table", &self.table)
            .field("incarnation", &self.incarnation)
            .field("version", &self.version)
            .finish()
    }
}

impl Client {
    /// A reader handle on `table`'s `version` (of `incarnation`; 0: the table as the client
    /// knows it now) if this client has it attached ([`Client::shm_attach`]) with at least one
    /// partition mapped; `None` otherwise. The handle does not count as an attach: when the
    /// last attach is undone it reads over TCP.
    pub fn shm_reader(&self, table: &str, incarnation: u64, version: u32) -> Option<ShmReader> {
        if version == 0 {
            return None;
        }
        let forks = forks();
        let generation = self.inner.tables.generation();
        let meta = self.table_meta(table).ok()?;
        if incarnation != 0 && incarnation != meta.incarnation {
            return None;
        }
        let set = self.inner.shm.get(table, meta.incarnation, version)?;
        Some(ShmReader {
            client: self.clone(),
            set,
            table: table.to_string(),
            incarnation: meta.incarnation,
            version,
            counters: self.inner.shm.new_counters(),
            checked: AtomicU64::new(generation),
            forks,
        })
    }
}

impl ShmReader {
    /// The table read.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The pinned version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The incarnation of the table the version belongs to.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The table's value type.
    pub fn value_type(&self) -> ValueType {
        self.set.value_type
    }

    /// Whether reads through the handle are answered from the mappings now (see the module's
    /// doc): each check is one load, except after the client's table cache changed.
    #[inline]
    pub(crate) fn usable(&self) -> bool {
        self.set.live.load(Ordering::Acquire)
            && !tcp_only_here()
            && FORKS.load(Ordering::Relaxed) == self.forks
            && self.same_table()
    }

    /// The client still knows the table as the incarnation pinned (a table dropped and created
    /// again under the name is refused by the general path, never read from the old mapping).
    #[inline]
    fn same_table(&self) -> bool {
        let tables = &self.client.inner.tables;
        let generation = tables.generation();
        if generation == self.checked.load(Ordering::Relaxed) {
            return true;
        }
        let same = tables
            .read()
            .get(&self.table)
            .is_some_and(|m| m.incarnation == self.incarnation);
        if same {
            self.checked.store(generation, Ordering::Relaxed);
        }
        same
    }

    /// One key's value in wire form (8 LE bytes for i64 and f64, `dim * 4` LE bytes for f32
    /// vectors, the bytes of a bytes value), borrowed from the mapping: `Some(Some(wire))` if
    /// found, `Some(None)` if missing (a key longer than the wire allows is missing), `None` if
    /// the handle cannot answer now (read through [`ShmReader::get_into`] or the client).
    #[inline]
    pub fn get_wire(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        if !self.usable() {
            return None;
        }
        let got = self.set.get_one(key)?;
        self.counters.add(u64::from(got.is_some()), 1);
        Some(got)
    }

    /// [`Client::get_into_of`] of the pinned version, answered from the mappings if the handle
    /// can answer now and every key's partition is mapped (then returns the version); `None`,
    /// with nothing written, otherwise, and also for keys or outputs the general path would
    /// refuse (so that it is the one to say why).
    #[inline]
    pub fn try_get_into(
        &self,
        keys: Keys<'_>,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Option<u32> {
        let n = keys.len();
        if out.len() != n
            || found.len() != n
            || !out.fits(self.set.value_type)
            || keys.validate().is_err()
            || !self.usable()
        {
            return None;
        }
        let hits = self.set.read_whole(keys, out, found)?;
        self.counters.add(hits, n as u64);
        Some(self.version)
    }

    /// Reads `keys` of the pinned version into `out` and `found`, as [`Client::get_into_of`]
    /// does (same answers, same errors): from the mappings where [`ShmReader::try_get_into`]
    /// can, else through the client (the mapped partitions still answered in place, the rest
    /// over TCP).
    pub fn get_into(
        &self,
        keys: Keys<'_>,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Result<u32> {
        if let Some(v) = self.try_get_into(keys, out, found) {
            return Ok(v);
        }
        self.client.get_into_of(
            &self.table,
            self.incarnation,
            keys,
            self.version,
            out,
            found,
        )
    }
}
