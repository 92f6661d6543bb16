//! The memcached-compatible keyspace: a sharded hash index of items with a hard memory limit,
//! CLOCK eviction and lazy + active expiry.
//!
//! CONTRACT (fixed; implementation in progress): the public signatures below are what the server's
//! dispatch is written against. Keep them; add, do not change.

use std::sync::Arc;

use crate::clock::Clock;
use crate::Result;

/// Configuration of a [`Cache`].
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Hard limit on memory charged to items, in bytes (what is really allocated, see ARCHITECTURE.md).
    pub memory_limit: usize,
    /// Evict to make room (true) or refuse with [`crate::Error::OutOfMemory`] (false).
    pub evict: bool,
    /// Largest item accepted (key + value + per-item overhead), like memcached's `-I`.
    pub max_item_size: usize,
    /// Number of lock shards; rounded up to a power of two.
    pub shards: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { memory_limit: 64 << 20, evict: true, max_item_size: 1 << 20, shards: 64 }
    }
}

/// A read-only view of a live item, valid while the shard lock is held (inside a closure).
#[derive(Debug, Clone, Copy)]
pub struct ItemView<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The value bytes.
    pub value: &'a [u8],
    /// Opaque client flags.
    pub flags: u32,
    /// Compare-and-swap token, unique per write.
    pub cas: u64,
    /// Absolute expiry in clock seconds; 0 = never.
    pub exptime: u32,
    /// Clock second of the last access (read or write).
    pub last_access: u32,
    /// Whether the item has been read since it was written.
    pub fetched: bool,
    /// Whether the item was marked stale (meta `I` invalidate).
    pub stale: bool,
    /// Whether a client already holds the "win" token to recache this item (meta `N` / stale).
    pub win_token_taken: bool,
    /// Whether the item was created empty by a vivifying miss (mg `N`) and not yet written.
    pub vivified: bool,
}

/// How a write treats an existing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Store unconditionally.
    Set,
    /// Store only if absent.
    Add,
    /// Store only if present.
    Replace,
    /// Append to an existing value (flags and exptime of the existing item are kept).
    Append,
    /// Prepend to an existing value (flags and exptime of the existing item are kept).
    Prepend,
    /// Store only if present and its CAS equals this token.
    Cas(u64),
}

/// Outcome of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Written; carries the new CAS token.
    Stored(u64),
    /// Condition failed (add on present, replace/append/prepend on absent).
    NotStored,
    /// CAS mismatch.
    Exists,
    /// CAS on an absent item.
    NotFound,
}

/// Outcome of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Removed (or marked stale when invalidating).
    Deleted,
    /// No such item.
    NotFound,
    /// CAS given and did not match.
    Exists,
}

/// Outcome of incr/decr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOutcome {
    /// New value and its CAS.
    Value(u64, u64),
    /// No such item.
    NotFound,
    /// Value is not a decimal unsigned 64-bit number.
    NonNumeric,
    /// CAS given and did not match.
    Exists,
}

/// Counters memcached users look at, summed over shards.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheStats {
    /// Live items (may include not-yet-reaped expired ones).
    pub curr_items: u64,
    /// Items ever stored.
    pub total_items: u64,
    /// Bytes charged to items.
    pub bytes: u64,
    /// The memory limit.
    pub limit_maxbytes: u64,
    /// Items evicted to make room.
    pub evictions: u64,
    /// Items removed because they expired (lazily or by the crawler).
    pub expired: u64,
    /// Expired items reclaimed by the active crawler.
    pub reclaimed: u64,
}

/// Options of [`Cache::get_with`], the lookup behind gets, gat and meta `mg`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GetOptions {
    /// Set this absolute exptime on a hit (gat, mg `T`).
    pub touch: Option<u32>,
    /// On a miss, create an empty item (flags 0) with this absolute exptime and hand this caller
    /// the win token (mg `N`).
    pub vivify: Option<u32>,
    /// Do not mark the item accessed/fetched and do not update last access (mg without bump, or `stats`-style peeks).
    pub no_bump: bool,
}

/// What [`Cache::get_with`] found.
#[derive(Debug, Clone, Copy)]
pub struct GetHit<'a> {
    /// The item (after any touch). For a vivified miss this is the new empty item.
    pub item: ItemView<'a>,
    /// This caller holds the win token: it vivified the item, or the item is stale and nobody held
    /// the token yet (memcached's `W` flag). Taking it is atomic with the lookup.
    pub won: bool,
    /// Another caller already holds the win token (memcached's `Z` flag).
    pub token_taken_by_other: bool,
    /// The item was vivified by this call (it was a miss).
    pub vivified: bool,
}

/// The memcached-compatible keyspace. `Send + Sync`; share it behind an `Arc`.
pub struct Cache {
    #[expect(dead_code, reason = "contract placeholder until the implementation lands")]
    clock: Arc<dyn Clock>,
}

impl Cache {
    /// A new empty cache.
    pub fn new(config: CacheConfig, clock: Arc<dyn Clock>) -> Cache {
        let _ = config;
        Cache { clock }
    }

    /// Converts a protocol exptime (0 never; <= 30 days relative seconds; larger: absolute unix
    /// time; negative: already expired) to an absolute clock second (0 = never).
    pub fn exptime_from_protocol(&self, exptime: i64) -> u32 {
        let _ = exptime;
        todo!()
    }

    /// Remaining TTL in seconds for meta `t` (-1 = never expires).
    pub fn ttl_remaining(&self, exptime: u32) -> i64 {
        let _ = exptime;
        todo!()
    }

    /// Looks up a live item, marks it accessed/fetched, and calls `f` with it under the lock.
    /// Returns `None` on miss (absent, expired or flushed).
    pub fn get<R>(&self, key: &[u8], f: impl FnOnce(&ItemView<'_>) -> R) -> Option<R> {
        let _ = (key, f);
        todo!()
    }

    /// Like [`Cache::get`] but also sets a new absolute exptime (gat/gats, meta `T`).
    pub fn get_and_touch<R>(&self, key: &[u8], exptime: u32, f: impl FnOnce(&ItemView<'_>) -> R) -> Option<R> {
        let _ = (key, exptime, f);
        todo!()
    }

    /// Sets a new absolute exptime on a live item. Returns whether it existed.
    pub fn touch(&self, key: &[u8], exptime: u32) -> bool {
        let _ = (key, exptime);
        todo!()
    }

    /// Stores `value` under `key` by `mode`. `cas_in` is an explicit CAS to assign (meta `E`), else
    /// a fresh one is drawn. Nothing is partially stored on error.
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas_in: Option<u64>,
    ) -> Result<StoreOutcome> {
        let _ = (mode, key, value, flags, exptime, cas_in);
        todo!()
    }

    /// Removes `key` (or, with `invalidate`, marks it stale and keeps it). `cas` must match if given.
    pub fn delete(&self, key: &[u8], cas: Option<u64>, invalidate: bool) -> DeleteOutcome {
        let _ = (key, cas, invalidate);
        todo!()
    }

    /// incr (`incr = true`) or decr (floors at 0; incr wraps at 2^64) a decimal value. With
    /// `autoviv = Some((initial, exptime))` a miss creates the item with `initial` (meta `N`/`J`).
    pub fn arith(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        cas: Option<u64>,
        autoviv: Option<(u64, u32)>,
    ) -> Result<ArithOutcome> {
        let _ = (key, incr, delta, cas, autoviv);
        todo!()
    }

    /// The general lookup: [`GetOptions`] say whether to touch, vivify on miss, or not bump; `f`
    /// sees the item under the shard lock. Returns `None` on a miss that was not vivified.
    pub fn get_with<R>(&self, key: &[u8], opts: GetOptions, f: impl FnOnce(&GetHit<'_>) -> R) -> Option<R> {
        let _ = (key, opts, f);
        todo!()
    }

    /// Invalidates every item written at or before clock second `at` (0 = now). flush_all [delay].
    pub fn flush_all(&self, at: u32) {
        let _ = at;
        todo!()
    }

    /// Reaps up to `budget` expired items; the server calls this periodically (active expiry).
    /// Returns how many were reclaimed.
    pub fn crawl_expired(&self, budget: usize) -> usize {
        let _ = budget;
        todo!()
    }

    /// Current counters.
    pub fn stats(&self) -> CacheStats {
        todo!()
    }

    /// The clock this cache reads.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }
}
