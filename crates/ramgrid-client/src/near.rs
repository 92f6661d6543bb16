//! The near cache: values of sealed (immutable) versions kept in the client process, bounded in bytes.
//!
//! Only sealed versions are cached, and a sealed version never changes, so an entry is never stale and
//! nothing is ever invalidated: entries leave only to make room. Eviction is CLOCK (second chance) per
//! shard; the shards are independent mutexes so concurrent readers rarely meet.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

const SHARDS: usize = 16;
/// Bytes charged per entry beyond its key and value: the slot, the index entry, the allocation headers.
/// An estimate, so that a cache of tiny values does not hold far more entries than its budget suggests.
const ENTRY_OVERHEAD: usize = 64;

/// Hit and miss counters of a [`NearCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NearStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to go to the servers.
    pub misses: u64,
    /// Entries held now.
    pub entries: u64,
    /// Bytes charged now (keys, values and per-entry overhead).
    pub bytes: u64,
}

/// A byte-bounded cache keyed by (table, version, key). `Send + Sync`.
pub struct NearCache {
    shards: Box<[Mutex<Shard>]>,
    shard_budget: usize,
    hasher: foldhash::fast::FixedState,
    hits: AtomicU64,
    misses: AtomicU64,
}

struct Entry {
    hash: u64,
    /// `version (8 bytes LE) | table length (2 bytes LE) | table | key`: one allocation per entry.
    ident: Box<[u8]>,
    value: Box<[u8]>,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    index: HashTable<usize>,
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    hand: usize,
    bytes: usize,
    entries: usize,
}

impl std::fmt::Debug for NearCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NearCache")
            .field("budget", &(self.shard_budget * SHARDS))
            .field("stats", &self.stats())
            .finish()
    }
}

fn ident_matches(ident: &[u8], table: &str, version: u64, key: &[u8]) -> bool {
    let t = table.as_bytes();
    ident.len() == 10 + t.len() + key.len()
        && ident[..8] == version.to_le_bytes()
        && ident[8..10] == (t.len() as u16).to_le_bytes()
        && &ident[10..10 + t.len()] == t
        && &ident[10 + t.len()..] == key
}

impl NearCache {
    /// A cache holding at most about `max_bytes` (split evenly over its shards).
    pub fn new(max_bytes: usize) -> NearCache {
        NearCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_budget: max_bytes / SHARDS,
            hasher: foldhash::fast::FixedState::with_seed(0x6e65_6172),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn hash(&self, table: &str, version: u64, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u64(version);
        h.write(table.as_bytes());
        h.write_u8(0xff);
        h.write(key);
        h.finish()
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // The high bits pick the shard; hashbrown uses the low bits and the top 7 for its own purposes,
        // but sharing them only costs a little spread inside a shard.
        &self.shards[(hash >> 40) as usize % SHARDS]
    }

    /// Calls `f` with the cached value, if any, and counts a hit or a miss. No allocation.
    pub fn with<R>(
        &self,
        table: &str,
        version: u64,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let hash = self.hash(table, version, key);
        let mut shard = self.shard(hash).lock();
        let Shard { index, slots, .. } = &mut *shard;
        let found = index.find(hash, |&i| {
            slots[i]
                .as_ref()
                .is_some_and(|e| ident_matches(&e.ident, table, version, key))
        });
        match found {
            Some(&i) => {
                let e = slots[i].as_mut().expect("indexed slot is occupied");
                e.referenced = true;
                let r = f(&e.value);
                drop(shard);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(r)
            }
            None => {
                drop(shard);
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores a value (replacing an equal key's entry), evicting by CLOCK until the shard fits its budget.
    /// A value larger than a whole shard's budget is not cached.
    pub fn insert(&self, table: &str, version: u64, key: &[u8], value: &[u8]) {
        let Ok(tlen) = u16::try_from(table.len()) else {
            return;
        };
        let cost = 10 + table.len() + key.len() + value.len() + ENTRY_OVERHEAD;
        if cost > self.shard_budget {
            return;
        }
        let hash = self.hash(table, version, key);
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        let existing = {
            let slots = &shard.slots;
            shard
                .index
                .find(hash, |&i| {
                    slots[i]
                        .as_ref()
                        .is_some_and(|e| ident_matches(&e.ident, table, version, key))
                })
                .copied()
        };
        if let Some(i) = existing {
            // Sealed data cannot change, so an equal key already holds this value; only mark it used.
            if let Some(e) = shard.slots[i].as_mut() {
                e.referenced = true;
            }
            return;
        }
        while shard.bytes + cost > self.shard_budget && shard.entries > 0 {
            shard.evict_one();
        }
        let mut ident = Vec::with_capacity(10 + table.len() + key.len());
        ident.extend_from_slice(&version.to_le_bytes());
        ident.extend_from_slice(&tlen.to_le_bytes());
        ident.extend_from_slice(table.as_bytes());
        ident.extend_from_slice(key);
        let entry = Entry {
            hash,
            ident: ident.into_boxed_slice(),
            value: value.into(),
            referenced: false,
        };
        let slot = match shard.free.pop() {
            Some(i) => {
                shard.slots[i] = Some(entry);
                i
            }
            None => {
                shard.slots.push(Some(entry));
                shard.slots.len() - 1
            }
        };
        let slots = &shard.slots;
        shard
            .index
            .insert_unique(hash, slot, |&i| slots[i].as_ref().map_or(0, |e| e.hash));
        shard.bytes += cost;
        shard.entries += 1;
    }

    /// Removes every entry of `table` (all versions). Sealed data never needs this; a client calls it
    /// when it drops the table or a version itself, so that a later table or version of the same name
    /// and number cannot be answered from the old one's entries.
    pub fn purge_table(&self, table: &str) {
        for s in self.shards.iter() {
            let mut guard = s.lock();
            let shard = &mut *guard;
            for i in 0..shard.slots.len() {
                let matches = shard.slots[i].as_ref().is_some_and(|e| {
                    let t = table.as_bytes();
                    e.ident.len() >= 10 + t.len()
                        && e.ident[8..10] == (t.len() as u16).to_le_bytes()
                        && &e.ident[10..10 + t.len()] == t
                });
                if matches {
                    shard.remove(i);
                }
            }
        }
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> NearStats {
        let (mut entries, mut bytes) = (0u64, 0u64);
        for s in self.shards.iter() {
            let s = s.lock();
            entries += s.entries as u64;
            bytes += s.bytes as u64;
        }
        NearStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries,
            bytes,
        }
    }
}

impl Shard {
    fn evict_one(&mut self) {
        let n = self.slots.len();
        // Two full sweeps always find a victim: the first clears every reference bit.
        for _ in 0..2 * n + 1 {
            let i = self.hand % n;
            self.hand = (i + 1) % n;
            match self.slots[i].as_mut() {
                Some(e) if e.referenced => e.referenced = false,
                Some(_) => {
                    self.remove(i);
                    return;
                }
                None => {}
            }
        }
    }

    fn remove(&mut self, i: usize) {
        let Some(e) = self.slots[i].take() else {
            return;
        };
        if let Ok(entry) = self.index.find_entry(e.hash, |&j| j == i) {
            entry.remove();
        }
        self.bytes -= e.ident.len() + e.value.len() + ENTRY_OVERHEAD;
        self.entries -= 1;
        self.free.push(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(c: &NearCache, t: &str, v: u64, k: &[u8]) -> Option<Vec<u8>> {
        c.with(t, v, k, |b| b.to_vec())
    }

    #[test]
    fn keyed_by_table_version_and_key() {
        let c = NearCache::new(1 << 20);
        c.insert("t", 1, b"k", b"one");
        c.insert("t", 2, b"k", b"two");
        c.insert("u", 1, b"k", b"other");
        assert_eq!(get(&c, "t", 1, b"k").as_deref(), Some(&b"one"[..]));
        assert_eq!(get(&c, "t", 2, b"k").as_deref(), Some(&b"two"[..]));
        assert_eq!(get(&c, "u", 1, b"k").as_deref(), Some(&b"other"[..]));
        assert_eq!(get(&c, "t", 3, b"k"), None);
        // A table name that is a prefix of another plus key bytes must not collide.
        c.insert("ab", 1, b"c", b"x");
        assert_eq!(get(&c, "a", 1, b"bc"), None);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (3, 2, 4));
    }

    #[test]
    fn stays_within_budget_and_keeps_referenced_entries() {
        let budget = 16 * 4096;
        let c = NearCache::new(budget);
        for i in 0..10_000u64 {
            c.insert("t", 1, &i.to_le_bytes(), &[7u8; 100]);
            // Keep touching key 0: CLOCK gives it a second chance on every sweep.
            assert!(
                c.with("t", 1, &0u64.to_le_bytes(), |_| ()).is_some(),
                "hot key evicted at {i}"
            );
            assert!(c.stats().bytes as usize <= budget);
        }
        assert!(c.stats().entries < 10_000);
    }

    #[test]
    fn oversized_values_are_not_cached() {
        let c = NearCache::new(16 * 100);
        c.insert("t", 1, b"k", &[0u8; 200]);
        assert_eq!(c.stats().entries, 0);
        assert_eq!(get(&c, "t", 1, b"k"), None);
    }

    #[test]
    fn purge_table_removes_only_that_table() {
        let c = NearCache::new(1 << 20);
        for i in 0..100u64 {
            c.insert("t", 1 + i % 3, &i.to_le_bytes(), b"v");
            c.insert("tt", 1, &i.to_le_bytes(), b"w");
        }
        c.purge_table("t");
        assert_eq!(c.stats().entries, 100);
        assert_eq!(get(&c, "t", 1, &0u64.to_le_bytes()), None);
        assert_eq!(
            get(&c, "tt", 1, &0u64.to_le_bytes()).as_deref(),
            Some(&b"w"[..])
        );
        // Freed slots are reused.
        c.insert("t", 1, b"again", b"v");
        assert_eq!(get(&c, "t", 1, b"again").as_deref(), Some(&b"v"[..]));
    }
}
