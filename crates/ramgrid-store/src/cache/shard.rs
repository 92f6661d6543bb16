//! One lock shard of the keyspace: a slab of items, a hash index into the slab, the CLOCK hand and
//! the expiry crawler's cursor. Everything here runs under the shard's mutex.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;

use super::ItemView;
use crate::index::{prefetch, Candidate, Index};

/// CLOCK reference bit: set on access, cleared by the hand.
pub(super) const ACCESSED: u8 = 1;
/// Read since written (memcached `ITEM_FETCHED`, meta `h`).
pub(super) const FETCHED: u8 = 2;
/// Marked stale by an invalidating delete (meta `md I`).
pub(super) const STALE: u8 = 4;
/// A client holds the win token to recache this item (meta `W`/`Z`).
pub(super) const WIN: u8 = 8;
/// Created empty by a vivifying miss and not written since (meta `mg N`).
pub(super) const VIVIFIED: u8 = 16;

/// Slot index meaning "no slot"; a shard never holds 2^32 - 1 slots.
pub(super) const NO_SLOT: u32 = u32::MAX;

/// Requests of this size and above are charged as if glibc served them with `mmap` (see
/// [`alloc_size`]).
const MMAP_THRESHOLD: usize = 128 * 1024;

/// Bytes that the allocator really hands out for a request of `n` bytes, modelled on glibc malloc
/// (Rust's default global allocator on Linux): a chunk carries an 8-byte size word and is rounded
/// up to 16 bytes with a 32-byte minimum; from 128 KiB on a request is charged as an `mmap` of
/// whole 4 KiB pages plus a 16-byte header. glibc may raise its mmap threshold at run time and then
/// serve such a request from the heap with 16-byte rounding, so page rounding can only overcharge
/// (by less than 4 KiB on at least 128 KiB, i.e. under 3.2%).
pub(super) fn alloc_size(n: usize) -> usize {
    if n == 0 {
        // An empty boxed slice does not allocate.
        0
    } else if n < MMAP_THRESHOLD {
        ((n + 8 + 15) & !15).max(32)
    } else {
        (n + 16 + 4095) & !4095
    }
}

/// The per-item header: what one slab slot costs on top of the key + value allocation.
pub(super) const HEADER_BYTES: usize = std::mem::size_of::<Option<Item>>();

/// Index cost of one item: its share of a 64-byte bucket at the index's maximum load of 8 keys
/// per bucket. Growth slack (the index doubles, so between 4 and 8 keys per bucket; the slab `Vec`
/// also doubles) is not charged: it is bounded by the header + index part of the peak item count.
pub(super) const INDEX_BYTES: usize = 64 / 8;

/// Bytes charged against the memory limit for an item whose key + value is `data_len` bytes.
pub(super) fn charge(data_len: usize) -> u64 {
    (alloc_size(data_len) + HEADER_BYTES + INDEX_BYTES) as u64
}

/// The global memory account (a [`Budget`](crate::memory::Budget) in bytes). `used` is the sum of
/// the charges of all stored items plus bytes reserved by writes in flight, and never exceeds the
/// limit: memory is reserved before an item is linked, and released after it is unlinked.
pub(super) type Memory = crate::memory::Budget;

/// Bytes reserved by one write and not yet spent. Whatever is left is released on drop, so an
/// early return or a failed condition never leaks a reservation.
pub(super) struct Credit<'a> {
    pub(super) mem: &'a Memory,
    pub(super) amount: u64,
}

impl Drop for Credit<'_> {
    fn drop(&mut self) {
        self.mem.release(self.amount as usize);
    }
}

/// Why an item is no longer visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Death {
    /// Its exptime has passed.
    Expired,
    /// A `flush_all` took effect after it was written.
    Flushed,
}

/// One stored item. Key and value share one allocation (`data` = key ++ value).
#[derive(Debug)]
pub(super) struct Item {
    data: Box<[u8]>,
    pub(super) cas: u64,
    /// Global write sequence number of the last write; `flush_all` compares against it.
    pub(super) seq: u64,
    pub(super) flags: u32,
    pub(super) exptime: u32,
    pub(super) last_access: u32,
    key_len: u16,
    pub(super) bits: u8,
}

impl Item {
    /// A new item whose value is the concatenation of `parts`.
    pub(super) fn new(
        key: &[u8],
        parts: &[&[u8]],
        flags: u32,
        exptime: u32,
        cas: u64,
        seq: u64,
        now: u32,
    ) -> Item {
        Item {
            data: concat(key, parts),
            cas,
            seq,
            flags,
            exptime,
            last_access: now,
            key_len: u16::try_from(key.len()).expect("key length checked by the caller"),
            bits: 0,
        }
    }

    pub(super) fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }

    pub(super) fn value(&self) -> &[u8] {
        &self.data[usize::from(self.key_len)..]
    }

    /// Length of key + value, what [`charge`] is computed from.
    pub(super) fn data_len(&self) -> usize {
        self.data.len()
    }

    /// Replaces the value with the concatenation of `parts`, keeping the key.
    pub(super) fn set_value(&mut self, parts: &[&[u8]]) {
        let new_len: usize = parts.iter().map(|p| p.len()).sum();
        if new_len == self.value().len() {
            // Same size class and no allocation: write in place (incr/decr of equal width).
            let mut at = usize::from(self.key_len);
            for p in parts {
                self.data[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        } else {
            self.data = concat(self.key(), parts);
        }
    }

    /// Appends (or with `front`, prepends) `value` to the value: one new allocation, no copy of
    /// the old value elsewhere.
    pub(super) fn extend(&mut self, value: &[u8], front: bool) {
        let (key, old) = self.data.split_at(usize::from(self.key_len));
        self.data = if front {
            concat(key, &[value, old])
        } else {
            concat(key, &[old, value])
        };
    }

    pub(super) fn death(&self, now: u32, flush_seq: u64) -> Option<Death> {
        if self.seq <= flush_seq {
            Some(Death::Flushed)
        } else if self.exptime != 0 && self.exptime <= now {
            Some(Death::Expired)
        } else {
            None
        }
    }

    pub(super) fn view(&self) -> ItemView<'_> {
        ItemView {
            key: self.key(),
            value: self.value(),
            flags: self.flags,
            cas: self.cas,
            exptime: self.exptime,
            last_access: self.last_access,
            fetched: self.bits & FETCHED != 0,
            stale: self.bits & STALE != 0,
            win_token_taken: self.bits & WIN != 0,
            vivified: self.bits & VIVIFIED != 0,
        }
    }
}

/// `a == b`, without a `memcmp` call for keys of 8 to 32 bytes (the usual ones): two or four
/// overlapping 8-byte words cover them.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        17..=32 => {
            word(a, 0) == word(b, 0)
                && word(a, 8) == word(b, 8)
                && word(a, n - 16) == word(b, n - 16)
                && word(a, n - 8) == word(b, n - 8)
        }
        _ => a == b,
    }
}

fn concat(key: &[u8], parts: &[&[u8]]) -> Box<[u8]> {
    let len = key.len() + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(key);
    for p in parts {
        v.extend_from_slice(p);
    }
    // Capacity equals length, so this does not reallocate.
    v.into_boxed_slice()
}

/// Counters kept per shard, summed by `Cache::stats`.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counters {
    pub(super) items: u64,
    pub(super) bytes: u64,
    pub(super) total_items: u64,
    pub(super) evictions: u64,
    pub(super) expired: u64,
    pub(super) reclaimed: u64,
    pub(super) get_expired: u64,
    pub(super) get_flushed: u64,
}

/// The state behind one shard lock.
pub(super) struct ShardInner {
    hasher: RandomState,
    /// Maps key hash -> slot index; keys are compared through the slab.
    index: Index,
    /// The slab; `None` slots are listed in `free`.
    slots: Vec<Option<Item>>,
    free: Vec<u32>,
    /// CLOCK hand: next slot the eviction sweep looks at.
    hand: usize,
    /// Expiry crawler cursor: next slot the crawler looks at.
    crawl_pos: usize,
    /// Lower bound on the earliest non-zero exptime in the shard (`u32::MAX`: none).
    next_expiry: u32,
    /// Earliest exptime seen by the current crawler sweep, plus every exptime set meanwhile.
    sweep_min: u32,
    /// Flush sequence in force when the current sweep started.
    sweep_flush: u64,
    /// After a full sweep, no item has `seq <= flush_seen`.
    flush_seen: u64,
    pub(super) counters: Counters,
}

impl ShardInner {
    pub(super) fn new(hasher: RandomState) -> ShardInner {
        ShardInner {
            hasher,
            index: Index::new(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            crawl_pos: 0,
            next_expiry: u32::MAX,
            sweep_min: u32::MAX,
            sweep_flush: 0,
            flush_seen: 0,
            counters: Counters::default(),
        }
    }

    fn rehash(hasher: &RandomState, slots: &[Option<Item>], i: u32) -> u64 {
        let item = slots[i as usize]
            .as_ref()
            .expect("indexed slot holds an item");
        hasher.hash_one(item.key())
    }

    pub(super) fn item(&self, i: u32) -> &Item {
        self.slots[i as usize].as_ref().expect("live slot")
    }

    pub(super) fn item_mut(&mut self, i: u32) -> &mut Item {
        self.slots[i as usize].as_mut().expect("live slot")
    }

    /// Length of the slab (used and free slots).
    pub(super) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Slot of `key`, dead or alive.
    pub(super) fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(hash, |i| {
            slots[i as usize]
                .as_ref()
                .is_some_and(|it| same_key(it.key(), key))
        })
    }

    /// Where the index's buckets are now, for the shard's [`crate::index::BucketHint`].
    #[inline]
    pub(super) fn index_hint(&self) -> (*const u8, usize) {
        self.index.hint()
    }

    /// Batched lookup, step 2 of 3 (step 1, see `Cache::get_many`, prefetched the bucket with no
    /// lock): read the (prefetched) bucket by tag and start loading the slab slot it names, or the
    /// next bucket if the key may have spilled there. Returns the slot, or [`NO_SLOT`].
    #[inline]
    pub(super) fn prefetch_slot(&self, hash: u64) -> u32 {
        match self.index.first_candidate(hash) {
            Candidate::Slot(i) => {
                // A 48-byte slot crosses a cache line every other time: load both ends.
                let slot = self.slots.as_ptr().wrapping_add(i as usize);
                prefetch(slot);
                prefetch(slot.cast::<u8>().wrapping_add(HEADER_BYTES - 1));
                i
            }
            Candidate::Unsure => {
                self.index.prefetch_spill(hash);
                NO_SLOT
            }
            Candidate::Absent => NO_SLOT,
        }
    }

    /// Step 3: read the (prefetched) slot and start loading its key and value, both ends of them
    /// when they cross a cache line. The caller then does the real lookup, which finds every line
    /// it needs already loaded or on the way.
    #[inline]
    pub(super) fn prefetch_data(&self, i: u32) {
        if let Some(Some(item)) = self.slots.get(i as usize) {
            let p = item.data.as_ptr();
            prefetch(p);
            prefetch(p.wrapping_add(item.data.len().min(256).saturating_sub(1)));
        }
    }

    /// Slot of a live `key`; an expired or flushed one is unlinked on the way (lazy expiry).
    pub(super) fn lookup_live(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        flush_seq: u64,
        mem: &Memory,
    ) -> Option<u32> {
        self.lookup(hash, key, now, flush_seq, mem).ok()
    }

    /// [`ShardInner::lookup_live`] for a get: also counts a dead item found (`get_expired`,
    /// `get_flushed`).
    pub(super) fn lookup_get(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        flush_seq: u64,
        mem: &Memory,
    ) -> Option<u32> {
        match self.lookup(hash, key, now, flush_seq, mem) {
            Ok(i) => Some(i),
            Err(death) => {
                match death {
                    Some(Death::Expired) => self.counters.get_expired += 1,
                    Some(Death::Flushed) => self.counters.get_flushed += 1,
                    None => {}
                }
                None
            }
        }
    }

    /// The live slot of `key`, or why there is none: absent (`None`), or dead and now unlinked.
    fn lookup(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        flush_seq: u64,
        mem: &Memory,
    ) -> Result<u32, Option<Death>> {
        let i = self.find(hash, key).ok_or(None)?;
        match self.item(i).death(now, flush_seq) {
            None => Ok(i),
            Some(death) => {
                if death == Death::Expired {
                    self.counters.expired += 1;
                }
                self.remove(i, mem);
                Err(Some(death))
            }
        }
    }

    /// Links `item`, whose charge the caller has already reserved.
    pub(super) fn insert(&mut self, hash: u64, item: Item) -> u32 {
        self.counters.items += 1;
        self.counters.bytes += charge(item.data_len());
        self.note_exptime(item.exptime);
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(item);
                i
            }
            None => {
                let i = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i != NO_SLOT)
                    .expect("shard slab overflow");
                self.slots.push(Some(item));
                i
            }
        };
        let (hasher, slots) = (&self.hasher, &self.slots);
        if self.index.needs_growth() {
            self.index.grow(|j| Self::rehash(hasher, slots, j));
        } else if self.index.needs_rehash() {
            self.index.rehash(|j| Self::rehash(hasher, slots, j));
        }
        self.index.insert_unique(hash, i);
        i
    }

    /// Unlinks slot `i` and releases its charge. Returns the charge.
    pub(super) fn remove(&mut self, i: u32, mem: &Memory) -> u64 {
        let hash = Self::rehash(&self.hasher, &self.slots, i);
        let indexed = self.index.remove(hash, i);
        assert!(indexed, "slab slot {i} is not indexed");
        let item = self.slots[i as usize].take().expect("live slot");
        self.free.push(i);
        let c = charge(item.data_len());
        self.counters.items -= 1;
        self.counters.bytes -= c;
        mem.release(c as usize);
        c
    }

    /// Accounts a change of the data length of slot `i` from `old_len` (the caller settled the
    /// global reservation).
    pub(super) fn resized(&mut self, old_len: usize, new_len: usize) {
        self.counters.bytes = self.counters.bytes - charge(old_len) + charge(new_len);
    }

    /// Records that some item now expires at `exptime`, for the crawler's skip test.
    pub(super) fn note_exptime(&mut self, exptime: u32) {
        if exptime != 0 {
            self.next_expiry = self.next_expiry.min(exptime);
            self.sweep_min = self.sweep_min.min(exptime);
        }
    }

    /// False only when no item of this shard can be expired or flushed.
    pub(super) fn may_have_dead(&self, now: u32, flush_seq: u64) -> bool {
        self.next_expiry <= now || self.flush_seen != flush_seq
    }

    /// The crawler: looks at up to `scan` slots from its cursor and unlinks dead items, stopping
    /// after `budget` of them. `exclude` (a slot the caller is about to rewrite) is never unlinked.
    /// Returns how many items it unlinked.
    pub(super) fn reclaim_dead(
        &mut self,
        mem: &Memory,
        now: u32,
        flush_seq: u64,
        budget: usize,
        scan: usize,
        exclude: u32,
    ) -> usize {
        if self.slots.is_empty() {
            // Nothing stored: the sweep is trivially complete.
            self.next_expiry = u32::MAX;
            self.flush_seen = flush_seq;
            return 0;
        }
        let mut got = 0;
        for _ in 0..scan.min(self.slots.len()) {
            if got >= budget {
                break;
            }
            if self.crawl_pos == 0 {
                self.sweep_min = u32::MAX;
                self.sweep_flush = flush_seq;
            }
            let i = self.crawl_pos as u32;
            self.crawl_pos += 1;
            let state = self.slots[i as usize]
                .as_ref()
                .map(|item| (item.death(now, flush_seq), item.exptime));
            match state {
                Some((Some(death), _)) if i != exclude => {
                    if death == Death::Expired {
                        self.counters.expired += 1;
                    }
                    self.counters.reclaimed += 1;
                    self.remove(i, mem);
                    got += 1;
                }
                Some((_, exptime)) if exptime != 0 => self.sweep_min = self.sweep_min.min(exptime),
                _ => {}
            }
            if self.crawl_pos >= self.slots.len() {
                // A full sweep: every item alive now was seen (or noted when written) by it.
                self.crawl_pos = 0;
                self.next_expiry = self.sweep_min;
                self.flush_seen = self.sweep_flush;
            }
        }
        got
    }

    /// Frees one item to make room: a dead item if any may exist, else the CLOCK victim (when
    /// `evict`). Returns whether something was unlinked.
    pub(super) fn free_one(
        &mut self,
        mem: &Memory,
        now: u32,
        flush_seq: u64,
        exclude: u32,
        evict: bool,
    ) -> bool {
        if self.may_have_dead(now, flush_seq) {
            // At most one pass; a pass that finds nothing tightens the bounds so the next call skips.
            let scan = self.slots.len();
            if self.reclaim_dead(mem, now, flush_seq, 1, scan, exclude) > 0 {
                return true;
            }
        }
        evict && self.clock_evict(mem, now, flush_seq, exclude)
    }

    /// CLOCK (second chance): the hand clears reference bits until it meets an item without one,
    /// and evicts it. Two turns always find a victim unless only `exclude` is left.
    fn clock_evict(&mut self, mem: &Memory, now: u32, flush_seq: u64, exclude: u32) -> bool {
        let n = self.slots.len();
        for _ in 0..2 * n {
            let i = self.hand;
            self.hand = if i + 1 >= n { 0 } else { i + 1 };
            let Some(item) = self.slots[i].as_mut() else {
                continue;
            };
            if i as u32 == exclude {
                continue;
            }
            if let Some(death) = item.death(now, flush_seq) {
                if death == Death::Expired {
                    self.counters.expired += 1;
                }
                self.counters.reclaimed += 1;
            } else if item.bits & ACCESSED != 0 {
                item.bits &= !ACCESSED;
                continue;
            } else {
                self.counters.evictions += 1;
            }
            self.remove(i as u32, mem);
            return true;
        }
        false
    }

    /// Recomputes counts and charges from the slab and checks the index against it.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut items = 0u64;
        let mut bytes = 0u64;
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(item) = slot {
                items += 1;
                bytes += charge(item.data_len());
                let hash = self.hasher.hash_one(item.key());
                if self.find(hash, item.key()) != Some(i as u32) {
                    return Err(format!("slot {i} is not indexed under its key"));
                }
                if item.exptime != 0 && item.exptime < self.next_expiry {
                    return Err(format!(
                        "slot {i} expires at {} before next_expiry {}",
                        item.exptime, self.next_expiry
                    ));
                }
            }
        }
        if self.index.len() as u64 != items {
            return Err(format!(
                "index holds {} entries, slab {items} items",
                self.index.len()
            ));
        }
        if self.free.len() + items as usize != self.slots.len() {
            return Err(format!(
                "free list {} + items {items} != slab {}",
                self.free.len(),
                self.slots.len()
            ));
        }
        if self.free.iter().any(|&i| self.slots[i as usize].is_some()) {
            return Err("free list names a used slot".into());
        }
        if items != self.counters.items || bytes != self.counters.bytes {
            return Err(format!(
                "counted {} items / {} bytes, recomputed {items} / {bytes}",
                self.counters.items, self.counters.bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::same_key;

    #[test]
    fn same_key_agrees_with_slice_equality() {
        let base: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for n in 0..=base.len() {
            let a = &base[..n];
            assert!(same_key(a, a), "len {n}");
            // Any one byte changed, at every position, is a different key.
            for at in 0..n {
                let mut b = a.to_vec();
                b[at] ^= 0x20;
                assert!(!same_key(a, &b), "len {n}, byte {at}");
            }
            // A key one byte longer or shorter never equals it.
            assert!(!same_key(a, &base[..(n + 1).min(base.len())]) || n == base.len());
            if n > 0 {
                assert!(!same_key(a, &base[..n - 1]));
            }
        }
    }
}
