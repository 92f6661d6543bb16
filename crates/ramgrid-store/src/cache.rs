//! The memcached-compatible keyspace: a sharded hash index of items with a hard memory limit,
//! CLOCK eviction and lazy + active expiry.
//!
//! # Index and locking
//!
//! Keys are hashed once with foldhash, seeded randomly per process so that clients cannot craft
//! colliding keys. Bits 32.. of the hash pick one of N shards (a power of two); the index uses the
//! top bits (its home bucket) and the low 16 (its tag), so the two choices do not correlate. Each
//! shard is a `parking_lot` mutex over a slab `Vec<Option<Item>>` and an index of slab slots in
//! buckets of one cache line (the tables' index, `crate::index`). A lookup hashes, locks one shard,
//! probes, compares the key in the item, and runs the caller's closure on the borrowed item: no
//! heap allocation and one uncontended lock per get. An operation never waits for a lock while
//! holding another one (not even `try_lock` is needed), so there is no lock order to get wrong.
//!
//! A multi-key get ([`Cache::get_each`], in `cache/pipeline.rs`) overlaps the cache misses of its
//! keys by prefetching each key's bucket, then slot, then item, a few keys ahead of its lookup (a
//! software pipeline); [`Cache::prefetch`] does the same for a pipeline of one-key requests. This
//! is why the index is not `hashbrown`, which offers no way to prefetch a bucket.
//!
//! # Items and memory accounting
//!
//! An item is a 48-byte header in the slab (CAS, write sequence, flags, exptime, last access,
//! key length, state bits) plus ONE heap allocation holding key then value. Each item is charged
//! `alloc_size(key + value) + header + index`, where `alloc_size` models glibc malloc (16-byte
//! size classes with an 8-byte chunk header and a 32-byte minimum; from 128 KiB, whole 4 KiB
//! pages) and the index costs its share of a 64-byte bucket at 8 keys per bucket (8 bytes).
//! Charges go to one global `AtomicU64`, so the limit is global: a single item as large as
//! `max_item_size` fits even when `memory_limit / shards` is smaller. Memory is reserved (a
//! compare-and-swap that refuses to pass the limit) BEFORE an item is linked and released after it
//! is unlinked, so the sum of stored items' charges never exceeds the limit. Not charged: the
//! doubling slack of the slab and of the hash table (bounded by the header + index part of the
//! peak item count) and the fixed per-shard structures.
//!
//! # Eviction: CLOCK per shard
//!
//! When a write does not fit, it frees memory in its own shard (it holds that lock already):
//! first dead items (expired or flushed; a per-shard lower bound on the earliest exptime makes this
//! free when there are none), then the CLOCK victim. A get sets the item's reference bit; the hand
//! walks the slab (not the hash table), clears set bits and evicts the first item whose bit is
//! clear. If the own shard has nothing left, the write drops its lock, frees items in other shards
//! one lock at a time (round robin), then retakes its lock and re-checks its condition.
//!
//! Why CLOCK rather than an LRU list: an LRU must relink the item on every get, which is a write
//! to two neighbours and the list head on the hot path; CLOCK's get only sets a bit in a header
//! that the lookup has just read. The eviction costs amortised O(1) per victim (each bit is
//! cleared once per turn), it needs no per-item list pointers (16 bytes saved per item) and it
//! approximates LRU well: an item read since the hand last passed survives one more turn. New items
//! start with a clear bit, so a burst of write-once keys is evicted before keys that are read (scan
//! resistance), and a freed slot is reused first, which puts the new item furthest from the hand.
//! Eviction is per shard, so the victim is the CLOCK choice of the writer's shard, not of the whole
//! cache; with keys spread uniformly by the hash this is a sample of the global order.
//! With `evict = false` only dead items are reclaimed, then the write fails with `OutOfMemory`
//! and nothing is changed.
//!
//! # Expiry and flush
//!
//! Lazy: a lookup that finds an expired item unlinks it and reports a miss. Active:
//! [`Cache::crawl_expired`] visits shards round robin, skips a shard in O(1) when its earliest
//! exptime is in the future and no flush happened since its last full sweep, and otherwise walks
//! the slab from a per-shard cursor. `flush_all` never walks anything: every write draws a global
//! sequence number (the same counter as CAS tokens) and a flush records the current one; items with
//! an older sequence are dead. This is exact within a second: an item written just after a flush
//! is visible. A delayed flush takes effect when a call first sees its second arrive.

mod pipeline;
mod shard;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use foldhash::fast::RandomState;
use parking_lot::Mutex;

use self::shard::{
    charge, Credit, Item, Memory, ShardInner, ACCESSED, FETCHED, NO_SLOT, STALE, VIVIFIED, WIN,
};
use crate::clock::Clock;
use crate::index::BucketHint;
use crate::{Error, Result};

/// Configuration of a [`Cache`].
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Hard limit on memory charged to items, in bytes (what is really allocated, see docs/cache-keyspace.md).
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
        CacheConfig {
            memory_limit: 64 << 20,
            evict: true,
            max_item_size: 1 << 20,
            shards: 64,
        }
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
    /// Meta `ms C<token> I`: like [`SetMode::Cas`], except that a token OLDER than the item's
    /// CAS still stores, and the item is then marked stale (its win token free), as memcached does.
    CasStale(u64),
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
    /// Gets (get, gets, gat, gats, mg) that found their key expired: misses.
    pub get_expired: u64,
    /// Gets that found their key invalidated by `flush_all`: misses.
    pub get_flushed: u64,
}

/// Options of [`Cache::get_with`], the lookup behind gets, gat and meta `mg`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GetOptions {
    /// Set this absolute exptime on a hit (gat, mg `T`).
    pub touch: Option<u32>,
    /// On a miss, create an empty item (flags 0) with this absolute exptime and hand this caller
    /// the win token (mg `N`).
    pub vivify: Option<u32>,
    /// The CAS a vivified item gets (mg `N` with `E<cas>`); `None` draws a fresh one.
    pub vivify_cas: Option<u64>,
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

/// Bytes of per-item header counted by `max_item_size` (key + value + this must fit).
pub const ITEM_HEADER_BYTES: usize = shard::HEADER_BYTES;

/// Longest key the store accepts; longer keys are refused with [`crate::Error::TooLarge`].
pub const MAX_KEY_LEN: usize = u16::MAX as usize;

/// memcached's limit between relative and absolute exptimes: 30 days.
const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// One shard lock, padded so that two shards never share a cache line.
#[repr(align(128))]
struct Shard(Mutex<ShardInner>, BucketHint);

/// Keeps a counter that every write updates off the cache lines that every read loads.
#[repr(align(128))]
#[derive(Debug)]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The memcached-compatible keyspace. `Send + Sync`; share it behind an `Arc`.
///
/// Closures passed to the lookups run under a shard lock: they must not call back into the cache.
pub struct Cache {
    clock: Arc<dyn Clock>,
    shards: Box<[Shard]>,
    shard_mask: usize,
    hasher: RandomState,
    mem: Padded<Memory>,
    evict: bool,
    max_item_size: usize,
    /// Last CAS / write sequence number handed out; every write draws a fresh one.
    seq: Padded<AtomicU64>,
    /// Items with `seq <= flush_seq` are flushed.
    flush_seq: AtomicU64,
    /// Clock second at which a delayed flush takes effect (0: none pending).
    flush_at: AtomicU32,
    /// Round-robin starting points of the crawler and of cross-shard eviction.
    cursors: Padded<Cursors>,
}

/// Where the next crawl and the next cross-shard eviction start.
#[derive(Debug, Default)]
struct Cursors {
    crawl: AtomicUsize,
    evict: AtomicUsize,
}

/// The clock second and flush sequence one call works under, read once at its start.
#[derive(Debug, Clone, Copy)]
struct At {
    now: u32,
    flush_seq: u64,
}

/// What a write does when memory is short inside its shard.
enum Step<T> {
    Done(T),
    /// Drop the lock, reserve this many more bytes (evicting anywhere), and retry.
    NeedMemory(u64),
}

impl Cache {
    /// A new empty cache.
    pub fn new(config: CacheConfig, clock: Arc<dyn Clock>) -> Cache {
        let n = config.shards.clamp(1, 1 << 16).next_power_of_two();
        let hasher = RandomState::default();
        let shards = (0..n)
            .map(|_| Shard(Mutex::new(ShardInner::new(hasher)), BucketHint::default()))
            .collect();
        Cache {
            clock,
            shards,
            shard_mask: n - 1,
            hasher,
            mem: Padded(Memory::new(config.memory_limit)),
            evict: config.evict,
            max_item_size: config.max_item_size,
            seq: Padded(AtomicU64::new(0)),
            flush_seq: AtomicU64::new(0),
            flush_at: AtomicU32::new(0),
            cursors: Padded(Cursors::default()),
        }
    }

    /// Converts a protocol exptime (0 never; <= 30 days relative seconds; larger: absolute unix
    /// time; negative: already expired) to an absolute clock second (0 = never).
    pub fn exptime_from_protocol(&self, exptime: i64) -> u32 {
        // Clock second 1 is never in the future (now() starts at 1), so it means "already expired".
        const EXPIRED: u32 = 1;
        match exptime {
            0 => 0,
            e if e < 0 => EXPIRED,
            e if e <= REALTIME_MAXDELTA => {
                let at = i64::from(self.clock.now()) + e;
                u32::try_from(at).unwrap_or(u32::MAX)
            }
            e => {
                let epoch = i64::try_from(self.clock.epoch_unix()).unwrap_or(i64::MAX);
                if e <= epoch {
                    EXPIRED
                } else {
                    u32::try_from(e - epoch).unwrap_or(u32::MAX)
                }
            }
        }
    }

    /// Remaining TTL in seconds for meta `t` (-1 = never expires).
    pub fn ttl_remaining(&self, exptime: u32) -> i64 {
        if exptime == 0 {
            -1
        } else {
            (i64::from(exptime) - i64::from(self.clock.now())).max(0)
        }
    }

    /// Looks up a live item, marks it accessed/fetched, and calls `f` with it under the lock.
    /// Returns `None` on miss (absent, expired or flushed).
    ///
    /// `f` sees `fetched` and `last_access` as they were before this access (meta `h` and `l`).
    pub fn get<R>(&self, key: &[u8], f: impl FnOnce(&ItemView<'_>) -> R) -> Option<R> {
        self.lookup(key, GetOptions::default(), None, |hit| f(&hit.item))
    }

    /// Like [`Cache::get`] but also sets a new absolute exptime (gat/gats, meta `T`).
    pub fn get_and_touch<R>(
        &self,
        key: &[u8],
        exptime: u32,
        f: impl FnOnce(&ItemView<'_>) -> R,
    ) -> Option<R> {
        let opts = GetOptions {
            touch: Some(exptime),
            ..GetOptions::default()
        };
        self.lookup(key, opts, None, |hit| f(&hit.item))
    }

    /// Sets a new absolute exptime on a live item. Returns whether it existed.
    pub fn touch(&self, key: &[u8], exptime: u32) -> bool {
        let opts = GetOptions {
            touch: Some(exptime),
            ..GetOptions::default()
        };
        self.lookup(key, opts, None, |_| ()).is_some()
    }

    /// Stores `value` under `key` by `mode`. `cas_in` is an explicit CAS to assign (meta `E`), else
    /// a fresh one is drawn. Nothing is partially stored on error.
    ///
    /// A successful store clears the stale, vivified and win-token state of the item.
    /// Errors: [`crate::Error::TooLarge`] when key + value (+ the old value for append/prepend) +
    /// [`ITEM_HEADER_BYTES`] exceeds `max_item_size`; [`crate::Error::OutOfMemory`] when no room
    /// can be made.
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas_in: Option<u64>,
    ) -> Result<StoreOutcome> {
        if key.len() > MAX_KEY_LEN || self.too_large(key.len() + value.len()) {
            return Err(Error::TooLarge);
        }
        self.write_loop(key, |this, sh, hash, at, credit| {
            let existing = sh.lookup_live(hash, key, at.now, at.flush_seq, &this.mem);
            let old_len = existing.map(|i| sh.item(i).value().len());
            match (mode, existing) {
                (SetMode::Add, Some(_)) => return Ok(Step::Done(StoreOutcome::NotStored)),
                (SetMode::Replace | SetMode::Append | SetMode::Prepend, None) => {
                    return Ok(Step::Done(StoreOutcome::NotStored))
                }
                (SetMode::Cas(_) | SetMode::CasStale(_), None) => {
                    return Ok(Step::Done(StoreOutcome::NotFound))
                }
                (SetMode::Cas(token), Some(i)) if sh.item(i).cas != token => {
                    return Ok(Step::Done(StoreOutcome::Exists))
                }
                (SetMode::CasStale(token), Some(i)) if sh.item(i).cas < token => {
                    return Ok(Step::Done(StoreOutcome::Exists))
                }
                _ => {}
            }
            // An older token under CasStale stores, but as a stale item.
            let mark_stale =
                matches!((mode, existing), (SetMode::CasStale(token), Some(i)) if token < sh.item(i).cas);
            let combined = matches!(mode, SetMode::Append | SetMode::Prepend);
            let new_len = key.len() + value.len() + if combined { old_len.unwrap_or(0) } else { 0 };
            if this.too_large(new_len) {
                return Err(Error::TooLarge);
            }
            let old_charge = existing.map_or(0, |i| charge(sh.item(i).data_len()));
            let new_charge = charge(new_len);
            if let Some(short) = this.acquire(sh, new_charge, old_charge, credit, existing, at)? {
                return Ok(Step::NeedMemory(short));
            }
            let seq = this.next_seq();
            let cas = cas_in.unwrap_or(seq);
            match existing {
                Some(i) => {
                    let item = sh.item_mut(i);
                    let old_data_len = item.data_len();
                    match mode {
                        SetMode::Append => item.extend(value, false),
                        SetMode::Prepend => item.extend(value, true),
                        _ => {
                            item.set_value(&[value]);
                            item.flags = flags;
                            item.exptime = exptime;
                        }
                    }
                    item.cas = cas;
                    item.seq = seq;
                    item.last_access = at.now;
                    // A rewrite of a known key counts as a use; the write also ends stale/vivified state
                    // (unless it is itself a stale write).
                    item.bits = if mark_stale { ACCESSED | STALE } else { ACCESSED };
                    let exptime = item.exptime;
                    sh.note_exptime(exptime);
                    sh.resized(old_data_len, new_len);
                }
                None => {
                    sh.insert(
                        hash,
                        Item::new(key, &[value], flags, exptime, cas, seq, at.now),
                    );
                }
            }
            sh.counters.total_items += 1;
            Ok(Step::Done(StoreOutcome::Stored(cas)))
        })
    }

    /// Removes `key` (or, with `invalidate`, marks it stale and keeps it). `cas` must match if given.
    ///
    /// Invalidating gives the item a new CAS and frees its win token, like memcached's `md I`.
    pub fn delete(&self, key: &[u8], cas: Option<u64>, invalidate: bool) -> DeleteOutcome {
        let hash = self.hash(key);
        let at = self.at();
        let mut sh = self.shard(hash).0.lock();
        let Some(i) = sh.lookup_live(hash, key, at.now, at.flush_seq, &self.mem) else {
            return DeleteOutcome::NotFound;
        };
        if cas.is_some_and(|c| c != sh.item(i).cas) {
            return DeleteOutcome::Exists;
        }
        if invalidate {
            let cas = self.next_seq();
            let item = sh.item_mut(i);
            item.bits = (item.bits | STALE) & !WIN;
            item.cas = cas;
        } else {
            sh.remove(i, &self.mem);
        }
        DeleteOutcome::Deleted
    }

    /// incr (`incr = true`) or decr (floors at 0; incr wraps at 2^64) a decimal value. With
    /// `autoviv = Some((initial, exptime))` a miss creates the item with `initial` (meta `N`/`J`).
    ///
    /// The value is parsed like memcached's `strtoull`: leading whitespace and a sign are allowed,
    /// digits must end at the end of the value, a whitespace or a NUL byte ("12 " is 12, "12a" is
    /// not a number, "-1" is not a number, more than 2^64 - 1 is not a number). The result
    /// replaces the value as plain decimal (memcached pads a shorter result with spaces instead).
    pub fn arith(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        cas: Option<u64>,
        autoviv: Option<(u64, u32)>,
    ) -> Result<ArithOutcome> {
        self.arith_with_cas(key, incr, delta, cas, autoviv, None)
    }

    /// [`Cache::arith`] with an explicit CAS for the written item (meta `ma E<cas>`); `None` draws
    /// a fresh one.
    pub fn arith_with_cas(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        cas: Option<u64>,
        autoviv: Option<(u64, u32)>,
        cas_in: Option<u64>,
    ) -> Result<ArithOutcome> {
        if key.len() > MAX_KEY_LEN {
            return Err(Error::TooLarge);
        }
        self.write_loop(key, |this, sh, hash, at, credit| {
            let Some(i) = sh.lookup_live(hash, key, at.now, at.flush_seq, &this.mem) else {
                let Some((initial, exptime)) = autoviv else {
                    return Ok(Step::Done(ArithOutcome::NotFound));
                };
                let mut buf = [0u8; 20];
                let digits = write_decimal(initial, &mut buf);
                let len = key.len() + digits.len();
                if this.too_large(len) {
                    return Err(Error::TooLarge);
                }
                if let Some(short) = this.acquire(sh, charge(len), 0, credit, None, at)? {
                    return Ok(Step::NeedMemory(short));
                }
                let seq = this.next_seq();
                let new_cas = cas_in.unwrap_or(seq);
                sh.insert(
                    hash,
                    Item::new(key, &[digits], 0, exptime, new_cas, seq, at.now),
                );
                sh.counters.total_items += 1;
                return Ok(Step::Done(ArithOutcome::Value(initial, new_cas)));
            };
            let item = sh.item(i);
            if item.value().is_empty() {
                return Ok(Step::Done(ArithOutcome::NonNumeric));
            }
            if cas.is_some_and(|c| c != item.cas) {
                return Ok(Step::Done(ArithOutcome::Exists));
            }
            let Some(old) = parse_decimal(item.value()) else {
                return Ok(Step::Done(ArithOutcome::NonNumeric));
            };
            let new = if incr {
                old.wrapping_add(delta)
            } else {
                old.saturating_sub(delta)
            };
            let mut buf = [0u8; 20];
            let digits = write_decimal(new, &mut buf);
            let old_len = item.data_len();
            let new_len = key.len() + digits.len();
            if this.too_large(new_len) {
                return Err(Error::TooLarge);
            }
            if let Some(short) =
                this.acquire(sh, charge(new_len), charge(old_len), credit, Some(i), at)?
            {
                return Ok(Step::NeedMemory(short));
            }
            let seq = this.next_seq();
            let new_cas = cas_in.unwrap_or(seq);
            let item = sh.item_mut(i);
            item.set_value(&[digits]);
            item.cas = new_cas;
            item.seq = seq;
            item.last_access = at.now;
            item.bits |= ACCESSED;
            sh.resized(old_len, new_len);
            Ok(Step::Done(ArithOutcome::Value(new, new_cas)))
        })
    }

    /// The general lookup: [`GetOptions`] say whether to touch, vivify on miss, or not bump; `f`
    /// sees the item under the shard lock. Returns `None` on a miss that was not vivified (also
    /// when vivifying finds no memory: the caller then sees a plain miss).
    ///
    /// Win token, as memcached's `mg`: a hit on an item whose token is out reports
    /// `token_taken_by_other` (`Z`); otherwise a hit on a stale or vivified item hands the token
    /// to this caller (`W`). The classic lookups ([`Cache::get`], [`Cache::touch`]) and
    /// [`Cache::peek`] leave the token alone.
    pub fn get_with<R>(
        &self,
        key: &[u8],
        opts: GetOptions,
        f: impl FnOnce(&GetHit<'_>) -> R,
    ) -> Option<R> {
        self.lookup(key, opts, Some(0), f)
    }

    /// [`Cache::get_with`] plus meta `mg R<secs>`: a hit whose remaining TTL is below
    /// `recache_below` seconds also hands out the win token if it is free (items that never
    /// expire never qualify).
    pub fn get_with_recache<R>(
        &self,
        key: &[u8],
        opts: GetOptions,
        recache_below: u32,
        f: impl FnOnce(&GetHit<'_>) -> R,
    ) -> Option<R> {
        self.lookup(key, opts, Some(recache_below), f)
    }

    /// Looks at a live item without side effects on it: no access bit, no fetched mark, no last
    /// access update, no win token (`won` and `token_taken_by_other` are false). An expired item
    /// found on the way is still reclaimed.
    pub fn peek<R>(&self, key: &[u8], f: impl FnOnce(&ItemView<'_>) -> R) -> Option<R> {
        let opts = GetOptions {
            no_bump: true,
            ..GetOptions::default()
        };
        self.lookup(key, opts, None, |hit| f(&hit.item))
    }

    fn lookup<R>(
        &self,
        key: &[u8],
        opts: GetOptions,
        // None: leave the win token alone; Some(r): meta semantics, recache when TTL left < r.
        token: Option<u32>,
        f: impl FnOnce(&GetHit<'_>) -> R,
    ) -> Option<R> {
        self.lookup_hashed(self.hash(key), key, opts, token, f)
    }

    fn lookup_hashed<R>(
        &self,
        hash: u64,
        key: &[u8],
        opts: GetOptions,
        token: Option<u32>,
        f: impl FnOnce(&GetHit<'_>) -> R,
    ) -> Option<R> {
        let shard = self.shard(hash);
        let at = self.at();
        let now = at.now;
        let mut credit = Credit {
            mem: &self.mem,
            amount: 0,
        };
        loop {
            let mut guard = shard.0.lock();
            let sh = &mut *guard;
            if let Some(i) = sh.lookup_get(hash, key, now, at.flush_seq, &self.mem) {
                if let Some(exptime) = opts.touch {
                    sh.item_mut(i).exptime = exptime;
                    sh.note_exptime(exptime);
                }
                let item = sh.item_mut(i);
                let (mut won, mut other) = (false, false);
                if let Some(recache_below) = token {
                    let recache =
                        item.exptime != 0 && item.exptime.saturating_sub(now) < recache_below;
                    if item.bits & WIN != 0 {
                        other = true;
                    } else if recache || item.bits & (STALE | VIVIFIED) != 0 {
                        item.bits |= WIN;
                        won = true;
                    }
                }
                let r = f(&GetHit {
                    item: item.view(),
                    won,
                    token_taken_by_other: other,
                    vivified: false,
                });
                if !opts.no_bump {
                    item.bits |= ACCESSED | FETCHED;
                    item.last_access = now;
                }
                return Some(r);
            }
            let exptime = opts.vivify?;
            if key.len() > MAX_KEY_LEN || self.too_large(key.len()) {
                return None;
            }
            let c = charge(key.len());
            match self.acquire(sh, c, 0, &mut credit, None, at) {
                Ok(None) => {}
                Ok(Some(short)) => {
                    drop(guard);
                    self.reserve_evicting(short, &mut credit, at).ok()?;
                    continue;
                }
                Err(_) => return None,
            }
            let seq = self.next_seq();
            let mut item = Item::new(
                key,
                &[],
                0,
                exptime,
                opts.vivify_cas.unwrap_or(seq),
                seq,
                now,
            );
            item.bits = VIVIFIED | WIN;
            let i = sh.insert(hash, item);
            sh.counters.total_items += 1;
            let hit = GetHit {
                item: sh.item(i).view(),
                won: true,
                token_taken_by_other: false,
                vivified: true,
            };
            return Some(f(&hit));
        }
    }

    /// Invalidates every item written before clock second `at` arrives (0 or a past second: now,
    /// exactly: an item stored right after the call is visible). A later call replaces a pending
    /// delayed flush, like memcached's `flush_all [delay]`.
    pub fn flush_all(&self, at: u32) {
        // A pending flush whose second has come is in force; apply it before replacing it.
        let now = self.at().now;
        if at == 0 || at <= now {
            self.flush_at.store(0, Ordering::SeqCst);
            self.flush_seq
                .fetch_max(self.seq.load(Ordering::SeqCst), Ordering::SeqCst);
        } else {
            self.flush_at.store(at, Ordering::SeqCst);
        }
    }

    /// Reaps up to `budget` expired items; the server calls this periodically (active expiry).
    /// Returns how many were reclaimed (flushed items are reaped too, and counted here).
    ///
    /// Each call visits every shard at most once and looks at no more than `64 * budget` slots
    /// in total, so it is bounded even on a large cache; a shard with nothing to reap costs one
    /// uncontended lock.
    pub fn crawl_expired(&self, budget: usize) -> usize {
        let at = self.at();
        let mut reclaimed = 0;
        let mut scan_left = budget.saturating_mul(64);
        for _ in 0..self.shards.len() {
            if reclaimed >= budget || scan_left == 0 {
                break;
            }
            let si = self.cursors.crawl.fetch_add(1, Ordering::Relaxed) & self.shard_mask;
            // A busy shard is skipped until the next round: the crawler never waits behind a
            // request, and a request never waits behind a crawler that the OS has descheduled.
            let Some(mut sh) = self.shards[si].0.try_lock() else {
                continue;
            };
            if !sh.may_have_dead(at.now, at.flush_seq) {
                continue;
            }
            let scan = scan_left.min(sh.slot_count());
            reclaimed += sh.reclaim_dead(
                &self.mem,
                at.now,
                at.flush_seq,
                budget - reclaimed,
                scan,
                NO_SLOT,
            );
            scan_left -= scan;
        }
        reclaimed
    }

    /// Current counters.
    pub fn stats(&self) -> CacheStats {
        let mut s = CacheStats {
            limit_maxbytes: self.mem.limit() as u64,
            ..CacheStats::default()
        };
        for shard in self.shards.iter() {
            let c = shard.0.lock().counters;
            s.curr_items += c.items;
            s.total_items += c.total_items;
            s.bytes += c.bytes;
            s.evictions += c.evictions;
            s.expired += c.expired;
            s.reclaimed += c.reclaimed;
            s.get_expired += c.get_expired;
            s.get_flushed += c.get_flushed;
        }
        s
    }

    /// The clock this cache reads.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// Bytes charged against the memory limit for an item with this key and value length (see the
    /// module documentation for the rule).
    pub fn item_charge(key_len: usize, value_len: usize) -> u64 {
        charge(key_len + value_len)
    }

    /// Checks the internal invariants (index vs slab, per-shard counters recomputed from the items,
    /// the global charge equal to their sum and within the limit). Call it while no operation is in
    /// flight; tests use it after every step.
    #[doc(hidden)]
    pub fn debug_check_invariants(&self) -> std::result::Result<(), String> {
        // Lock every shard at once (in index order) so the sum is a snapshot; writers hold at
        // most one shard lock and never wait for a second, so this cannot deadlock.
        let guards: Vec<_> = self.shards.iter().map(|s| s.0.lock()).collect();
        let mut bytes = 0;
        for (n, g) in guards.iter().enumerate() {
            g.check().map_err(|e| format!("shard {n}: {e}"))?;
            bytes += g.counters.bytes;
        }
        let used = self.mem.used() as u64;
        if used != bytes {
            return Err(format!(
                "global charge {used} != sum of item charges {bytes}"
            ));
        }
        if used > self.mem.limit() as u64 {
            return Err(format!(
                "charged {used} bytes over the limit {}",
                self.mem.limit() as u64
            ));
        }
        Ok(())
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> 32) as usize & self.shard_mask]
    }

    fn too_large(&self, data_len: usize) -> bool {
        data_len.saturating_add(ITEM_HEADER_BYTES) > self.max_item_size
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The current second and flush sequence.
    fn at(&self) -> At {
        let now = self.clock.now();
        At {
            now,
            flush_seq: self.flush_seq(now),
        }
    }

    /// The flush sequence in force at `now`, applying a delayed flush whose second has come.
    fn flush_seq(&self, now: u32) -> u64 {
        let at = self.flush_at.load(Ordering::Acquire);
        if at != 0 && at <= now {
            // Every caller that sees the deadline applies it before going on, so no call that
            // started after the deadline can read an item written before it.
            self.flush_seq
                .fetch_max(self.seq.load(Ordering::SeqCst), Ordering::SeqCst);
            let _ = self
                .flush_at
                .compare_exchange(at, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
        self.flush_seq.load(Ordering::Acquire)
    }

    /// Runs a write `op` under the key's shard lock. When the op reports that memory is short, the
    /// lock is dropped, room is made anywhere and reserved into the credit, and the op runs again
    /// (re-checking its condition, since the item may have changed meanwhile).
    fn write_loop<T>(
        &self,
        key: &[u8],
        mut op: impl FnMut(&Cache, &mut ShardInner, u64, At, &mut Credit<'_>) -> Result<Step<T>>,
    ) -> Result<T> {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let at = self.at();
        let mut credit = Credit {
            mem: &self.mem,
            amount: 0,
        };
        loop {
            let step = op(self, &mut shard.0.lock(), hash, at, &mut credit)?;
            match step {
                Step::Done(outcome) => return Ok(outcome),
                Step::NeedMemory(short) => self.reserve_evicting(short, &mut credit, at)?,
            }
        }
    }

    /// Makes the global charge go from `old_charge` to `new_charge` for a write into `sh` (whose
    /// lock the caller holds), spending the credit first, then reserving, then freeing items in
    /// this shard (never `keep`, the item being rewritten). `Ok(Some(n))`: `n` more bytes are needed
    /// and this shard has nothing left to free.
    fn acquire(
        &self,
        sh: &mut ShardInner,
        new_charge: u64,
        old_charge: u64,
        credit: &mut Credit<'_>,
        keep: Option<u32>,
        at: At,
    ) -> Result<Option<u64>> {
        if new_charge > self.mem.limit() as u64 {
            // Could not fit even in an empty cache: fail before evicting anything.
            return Err(Error::OutOfMemory);
        }
        if new_charge <= old_charge {
            self.mem.release((old_charge - new_charge) as usize);
            return Ok(None);
        }
        let need = new_charge - old_charge;
        if credit.amount >= need {
            credit.amount -= need;
            return Ok(None);
        }
        let extra = need - credit.amount;
        let keep = keep.unwrap_or(NO_SLOT);
        loop {
            if self.mem.try_charge(extra as usize) {
                credit.amount = 0;
                return Ok(None);
            }
            if !sh.free_one(&self.mem, at.now, at.flush_seq, keep, self.evict) {
                return Ok(Some(extra));
            }
        }
    }

    /// Reserves `n` bytes into `credit`, freeing items in any shard (one lock at a time, none held
    /// by the caller) until they fit. Fails when a whole round of shards freed nothing.
    fn reserve_evicting(&self, n: u64, credit: &mut Credit<'_>, at: At) -> Result<()> {
        loop {
            if self.mem.try_charge(n as usize) {
                credit.amount += n;
                return Ok(());
            }
            let start = self.cursors.evict.fetch_add(1, Ordering::Relaxed);
            let freed = (0..self.shards.len()).any(|k| {
                let shard = &self.shards[(start + k) & self.shard_mask];
                shard
                    .0
                    .lock()
                    .free_one(&self.mem, at.now, at.flush_seq, NO_SLOT, self.evict)
            });
            if !freed {
                return Err(Error::OutOfMemory);
            }
        }
    }
}

/// Parses a value the way memcached's `safe_strtoull` does on the stored bytes (which memcached
/// follows with "\r\n"): optional leading whitespace, an optional sign, at least one digit, then
/// the end of the value, a whitespace byte or a NUL byte. A negative result is refused unless
/// `strtoull`'s negation of it fits in 63 bits ("-0" is 0), as memcached does.
fn parse_decimal(v: &[u8]) -> Option<u64> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let mut i = v.iter().position(|&b| !is_space(b))?;
    let negative = match v[i] {
        b'-' => true,
        b'+' => false,
        _ => {
            i = i.wrapping_sub(1);
            false
        }
    };
    i = i.wrapping_add(1);
    let digits_start = i;
    let mut n: u64 = 0;
    while let Some(&b) = v.get(i).filter(|b| b.is_ascii_digit()) {
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    if let Some(&b) = v.get(i) {
        if !(is_space(b) || b == 0) {
            return None;
        }
    }
    if negative {
        let n = n.wrapping_neg();
        // strtoull negates; memcached refuses a '-' only when the result looks negative as i64.
        return (n as i64 >= 0).then_some(n);
    }
    Some(n)
}

/// Writes `n` in decimal into `buf` and returns the digits.
fn write_decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests;
