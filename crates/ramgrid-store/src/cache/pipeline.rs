//! The multi-key get pipeline of the keyspace: [`Cache::get_each`] (and [`Cache::get_many`] over
//! it) overlaps the cache misses of its keys by prefetching each key's bucket, then slot, then
//! item, a few keys ahead of its lookup; [`Cache::prefetch`] starts the same loads for a pipeline
//! of one-key requests. Each lookup itself is the one [`Cache::get`] does.

use super::shard::NO_SLOT;
use super::{Cache, GetOptions, ItemView};

/// Keys between two stages of [`Cache::get_each`]'s pipeline: one key's stage runs while the
/// loads that the previous stage started for the keys up to this many ahead are in flight. Four
/// lookups take longer than a miss on the project's virtual machines (~200 ns).
const STAGE_DISTANCE: usize = 8;

/// Keys [`Cache::prefetch`] has in flight at once: enough misses to cover the memory latency of
/// a virtual machine, few enough that their lines stay in L1.
const PREFETCH_GROUP: usize = 16;

/// Entries of the pipeline's ring: the keys of all four stages (3 x [`STAGE_DISTANCE`] + 1).
const RING: usize = 32;

impl Cache {
    /// [`Cache::get`] (or, with `touch`, [`Cache::get_and_touch`]) of many keys: calls `f` with
    /// the position of each key that hits and its item, in the order of `keys`, and returns the
    /// number of hits. The pipelined lookup of [`Cache::get_each`].
    pub fn get_many<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        touch: Option<u32>,
        mut f: impl FnMut(usize, &ItemView<'_>),
    ) -> usize {
        let (mut at, mut hits) = (0, 0);
        self.get_each(keys, touch, |item| {
            if let Some(item) = item {
                f(at, item);
                hits += 1;
            }
            at += 1;
            true
        });
        hits
    }

    /// [`Cache::get`] (or, with `touch`, [`Cache::get_and_touch`]) of each key in turn: calls `f`
    /// once per key, in the order of `keys`, with the item on a hit (under the shard lock) or
    /// `None` on a miss. When `f` returns false no further key is looked up. Returns the number
    /// of keys looked up (those `f` saw).
    ///
    /// Same result as one call per key, but much faster when the keys are not in the CPU cache:
    /// a single lookup is three dependent cache misses (index bucket, slab slot, key and value),
    /// each ~100-200 ns on a virtual machine. Here each key goes through a software pipeline of
    /// four stages, 8 keys apart (`STAGE_DISTANCE`): start loading its bucket (from the shard's
    /// bucket hint, with no lock); read the bucket and start loading the slot; read the slot and
    /// start loading the item; look it up. While key `t` is looked up, the lines of the next
    /// keys are on their way, and only the first keys of a call wait for a whole miss. The middle
    /// stages take the key's shard lock only to compute an address; the lookup is the one
    /// [`Cache::get`] does, so a key that changes in between is simply looked up anew.
    pub fn get_each<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        touch: Option<u32>,
        mut f: impl FnMut(Option<&ItemView<'_>>) -> bool,
    ) -> usize {
        const D: usize = STAGE_DISTANCE;
        let opts = GetOptions {
            touch,
            ..GetOptions::default()
        };
        let mut keys = keys.into_iter();
        // Keys from `done` to `pulled` (exclusive) are in flight, at `ring[position % RING]`.
        let mut ring: [(&'k [u8], u64, u32); RING] = [(&[], 0, NO_SLOT); RING];
        let (mut pulled, mut done) = (0usize, 0usize);
        let mut pull =
            |ring: &mut [(&'k [u8], u64, u32); RING], pulled: &mut usize, upto: usize| {
                while *pulled < upto {
                    let Some(key) = keys.next() else {
                        return;
                    };
                    let hash = self.hash(key);
                    self.shard(hash).1.prefetch(hash);
                    ring[*pulled % RING] = (key, hash, NO_SLOT);
                    *pulled += 1;
                }
            };
        pull(&mut ring, &mut pulled, 3 * D + 1);
        if pulled > 1 {
            // Prologue: the first keys go through the middle stages at once (their misses
            // overlap each other, not yet the lookups); from then on each stage runs D keys ahead.
            for j in 0..pulled.min(2 * D) {
                ring[j % RING].2 = self.prefetch_slot(ring[j % RING].1);
            }
            for j in 0..pulled.min(D) {
                self.prefetch_data(ring[j % RING].1, ring[j % RING].2);
            }
        }
        while done < pulled {
            let t = done;
            if t + 2 * D < pulled {
                let e = &mut ring[(t + 2 * D) % RING];
                e.2 = self.prefetch_slot(e.1);
            }
            if t + D < pulled {
                let (_, hash, slot) = ring[(t + D) % RING];
                self.prefetch_data(hash, slot);
            }
            let (key, hash, _) = ring[t % RING];
            let mut more = true;
            let hit = self.lookup_hashed(hash, key, opts, None, |hit| more = f(Some(&hit.item)));
            if hit.is_none() {
                more = f(None);
            }
            done += 1;
            if !more {
                break;
            }
            pull(&mut ring, &mut pulled, done + 3 * D + 1);
        }
        done
    }

    /// Starts loading what the lookups of `keys` will read (index bucket, slab slot, key and
    /// value), so that lookups of them that follow at once (one request per key, such as a
    /// pipeline of meta `mg` commands) find their lines in the CPU cache or on the way. Takes
    /// the keys in groups of 16 (`PREFETCH_GROUP`), each group's loads overlapping: the stages of
    /// [`Cache::get_each`] without the lookup. Changes nothing and returns nothing: any key may
    /// change before it is looked up.
    pub fn prefetch<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut keys = keys.into_iter();
        let mut group = [(0u64, NO_SLOT); PREFETCH_GROUP];
        loop {
            let mut n = 0;
            for key in keys.by_ref().take(PREFETCH_GROUP) {
                let hash = self.hash(key);
                self.shard(hash).1.prefetch(hash);
                group[n] = (hash, NO_SLOT);
                n += 1;
            }
            for (hash, slot) in group[..n].iter_mut() {
                *slot = self.prefetch_slot(*hash);
            }
            for &(hash, slot) in &group[..n] {
                self.prefetch_data(hash, slot);
            }
            if n < PREFETCH_GROUP {
                return;
            }
        }
    }

    /// Pipeline stage 2 of [`Cache::get_each`]: read the key's (prefetched) bucket under its
    /// shard lock and start loading the slot it names; returns the slot or [`NO_SLOT`].
    #[inline]
    fn prefetch_slot(&self, hash: u64) -> u32 {
        let shard = self.shard(hash);
        let sh = shard.0.lock();
        shard.1.refresh(sh.index_hint());
        sh.prefetch_slot(hash)
    }

    /// Pipeline stage 3 of [`Cache::get_each`]: read the (prefetched) slot under the shard lock
    /// and start loading the item's key and value.
    #[inline]
    fn prefetch_data(&self, hash: u64, slot: u32) {
        if slot != NO_SLOT {
            self.shard(hash).0.lock().prefetch_data(slot);
        }
    }
}
