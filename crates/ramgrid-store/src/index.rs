//! The hash index of a table partition and of a cache shard: key hash -> slot, in buckets of one
//! cache line each.
//!
//! Why not `hashbrown::HashTable`: its control bytes and its slots live in two places, so a lookup
//! is two dependent cache misses, and it offers no way to prefetch a bucket ahead of probing it.
//! Here a bucket holds ten (16-bit tag, u32 key slot) pairs in one 64-byte line, and
//! [`Index::prefetch`] lets a batch lookup bring the lines of a whole group of keys in at once.
//! Measured with examples/tables_bench.rs (1 M keys, batches of 1000, on the project's 2-core VM
//! where a dependent cache miss costs ~180 ns): 154 ns/key with `HashTable<u32>` and no
//! prefetching, 75 ns/key with `HashTable<u32>` and the rest of the lookup prefetched, 58 ns/key
//! with this index; and 8 ns/key for all of them when the table fits in cache. 50 ns/key since
//! keys that spilled into the next bucket (~3%) are pipelined too ([`Index::second_candidate`])
//! instead of paying three dependent misses each, and short keys compare without `memcmp`.
//!
//! Layout: `home(h)` is a multiply-shift of the hash onto the bucket count; a key lives in its
//! home bucket or, if that was full when it was inserted, in one of the next `max_probe` buckets
//! (linear probing over buckets, wrapping). A bucket whose keys spilled over has `overflow` set,
//! so a lookup that misses in a bucket without it stops there. Deletes clear the tag; overflow
//! flags are only reset by a rebuild (growth, shrink, compaction). At most 8 of 10 places per
//! bucket are used on average, so probing past the home bucket is the exception.

use std::fmt;

/// Hint the CPU to bring `p`'s cache line in. Never dereferences `p`; a no-op off x86-64.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it does not fault, whatever the address, and reads nothing
    // architecturally, so any pointer value is sound here.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Places per bucket.
const WAYS: usize = 10;

/// Bytes of one bucket, in memory and in a partition image.
pub(crate) const BUCKET_BYTES: usize = 64;

/// Average keys per bucket above which the index grows (80% of the places).
const MAX_LOAD: usize = 8;

/// Average keys per bucket a shrink aims at, leaving room so sealed data rarely probes twice.
const SHRINK_LOAD: usize = 7;

#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Bucket {
    /// 0 = empty place; otherwise the key's tag (never 0).
    tags: [u16; WAYS],
    slots: [u32; WAYS],
    /// Some key whose probe passed through this bucket lives further on.
    overflow: u16,
    _pad: u16,
}

/// A copy of an index's bucket address and count that readers without the index's lock can use
/// to prefetch a home bucket. It may be stale (the index grew since): a prefetch from a stale
/// address is harmless, it only loads nothing useful, and any mix of an old and a new field is
/// harmless too. The owner refreshes it with [`BucketHint::refresh`] under its lock.
#[derive(Debug, Default)]
pub(crate) struct BucketHint {
    ptr: std::sync::atomic::AtomicPtr<u8>,
    len: std::sync::atomic::AtomicUsize,
}

impl BucketHint {
    /// Record where `index`'s buckets are now.
    #[inline]
    pub(crate) fn refresh(&self, index: (*const u8, usize)) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.ptr.load(Relaxed).cast_const() != index.0 {
            self.ptr.store(index.0.cast_mut(), Relaxed);
            self.len.store(index.1, Relaxed);
        }
    }

    /// Start loading the home bucket of `h`, as [`Index::prefetch`] would.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let (ptr, len) = (self.ptr.load(Relaxed), self.len.load(Relaxed));
        let home = ((h as u128 * len as u128) >> 64) as usize;
        prefetch(
            ptr.cast_const()
                .wrapping_add(home * std::mem::size_of::<Bucket>()),
        );
    }
}

/// What the home bucket alone says about a hash (see [`Index::first_candidate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// The first place in the home bucket with this tag: probably the key, to be confirmed.
    Slot(u32),
    /// No key with this hash is in the index.
    Absent,
    /// Not in the home bucket, but it may be further on: do a full [`Index::find`].
    Unsure,
}

/// The home bucket of hash `h` among `buckets`: a multiply-shift, so it takes the high bits.
#[inline]
fn home(h: u64, buckets: usize) -> usize {
    ((h as u128 * buckets as u128) >> 64) as usize
}

/// The first empty place (tag 0) of a bucket, found a word of tags at a time without a branch
/// per place: an insert's scan for a free place was a chain of mispredicted branches, a good
/// part of an index rebuild.
#[inline]
fn empty_place(tags: &[u16; WAYS]) -> Option<usize> {
    const LOW: u64 = 0x0001_0001_0001_0001;
    const HIGH: u64 = 0x8000_8000_8000_8000;
    let word = |at: usize| {
        (0..4).fold(0u64, |w, i| {
            w | u64::from(tags.get(at + i).copied().unwrap_or(u16::MAX)) << (16 * i)
        })
    };
    // The lowest flagged lane of (w - LOW) & !w & HIGH is w's lowest zero lane (lanes above a
    // zero one may be flagged falsely, never lanes below it).
    [0, 4, 8].into_iter().find_map(|at| {
        let w = word(at);
        let zero = w.wrapping_sub(LOW) & !w & HIGH;
        (zero != 0).then(|| at + zero.trailing_zeros() as usize / 16)
    })
}

#[inline]
fn tag(h: u64) -> u16 {
    (h as u16).max(1)
}

/// A read-only view of an index's buckets: what every lookup needs, over buckets that live in
/// an [`Index`] or in a mapped partition image (docs/partition-image.md, section 0, which is
/// [`Bucket`]'s layout byte for byte on a little-endian machine).
#[derive(Clone, Copy)]
pub(crate) struct Probe<'a> {
    buckets: &'a [Bucket],
    /// Most buckets past its home that any key had to go: [`Probe::find`] stops there.
    max_probe: usize,
}

impl<'a> Probe<'a> {
    /// View the index section of an image in place, checking what one bucket can say (overflow
    /// flags 0 or 1, padding zero); returns the view (with `max_probe` 0: the caller finds the
    /// bound by locating every key, then views the bytes again with [`Probe::over_checked`]) and the occupied places.
    /// `bytes` must start on a 64-byte boundary (a mapped image's index section does).
    pub(crate) fn from_image(bytes: &'a [u8]) -> Result<(Probe<'a>, usize), String> {
        if !cfg!(target_endian = "little") {
            return Err("images are mapped in place only on little-endian machines".into());
        }
        if !bytes.len().is_multiple_of(BUCKET_BYTES) {
            return Err(format!(
                "index length {} is not a multiple of {BUCKET_BYTES}",
                bytes.len()
            ));
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<Bucket>()) {
            return Err("index section is not on a 64-byte boundary".into());
        }
        let n = bytes.len() / BUCKET_BYTES;
        // SAFETY: the pointer is aligned for `Bucket` (checked above), the bytes are `n` whole
        // buckets and live for 'a, and `Bucket` is `repr(C)` of integers only, without padding
        // (10 x u16, 10 x u32, u16, u16 = 64 bytes), so every bit pattern is a valid value. On a
        // little-endian machine the in-memory layout is the image's layout.
        let buckets: &'a [Bucket] =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<Bucket>(), n) };
        let mut len = 0;
        for (b, bucket) in buckets.iter().enumerate() {
            if bucket.overflow > 1 || bucket._pad != 0 {
                return Err(format!("index bucket {b}: bad overflow flag or padding"));
            }
            len += bucket.tags.iter().filter(|&&t| t != 0).count();
        }
        Ok((
            Probe {
                buckets,
                max_probe: 0,
            },
            len,
        ))
    }

    /// The view of buckets [`Probe::from_image`] accepted before, again (it borrows what the
    /// caller holds, so the caller keeps the checked facts, not the view).
    ///
    /// # Panics
    /// If `bytes` is not 64-byte aligned or not whole buckets: a caller bug, never the image's.
    #[inline]
    pub(crate) fn over_checked(bytes: &'a [u8], max_probe: usize) -> Probe<'a> {
        assert!(
            (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<Bucket>())
                && bytes.len().is_multiple_of(BUCKET_BYTES),
            "index bytes not aligned to buckets"
        );
        // SAFETY: as in `from_image`: aligned (asserted), whole buckets (asserted), alive for
        // 'a, and every bit pattern is a `Bucket`. The per-bucket checks only make lookups
        // meaningful, not sound: any bucket contents are safe to read.
        let buckets = unsafe {
            std::slice::from_raw_parts(bytes.as_ptr().cast::<Bucket>(), bytes.len() / BUCKET_BYTES)
        };
        Probe { buckets, max_probe }
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        home(h, self.buckets.len())
    }

    #[inline]
    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets.len() {
            0
        } else {
            b + 1
        }
    }

    /// Start loading the home bucket of `h` into the cache.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        if !self.buckets.is_empty() {
            prefetch(self.buckets.as_ptr().wrapping_add(self.home(h)));
        }
    }

    /// Look at the home bucket only, comparing tags but not keys.
    #[inline]
    pub(crate) fn first_candidate(&self, h: u64) -> Candidate {
        if self.buckets.is_empty() {
            return Candidate::Absent;
        }
        let b = &self.buckets[self.home(h)];
        let t = tag(h);
        match b.tags.iter().position(|&x| x == t) {
            Some(i) => Candidate::Slot(b.slots[i]),
            None if b.overflow == 0 => Candidate::Absent,
            None => Candidate::Unsure,
        }
    }

    /// Start loading the bucket after the home bucket of `h`, where a key that is not in its
    /// home bucket almost always is (see [`Probe::second_candidate`]).
    #[inline]
    pub(crate) fn prefetch_spill(&self, h: u64) {
        if !self.buckets.is_empty() {
            let b = self.next(self.home(h));
            prefetch(self.buckets.as_ptr().wrapping_add(b));
        }
    }

    /// For a hash whose home bucket said [`Candidate::Unsure`]: what the next bucket says, by
    /// tags only. `Absent` is sure: a key that went past the next bucket on its insert would have
    /// set that bucket's overflow flag. At the load this index keeps, ~3% of keys are not in
    /// their home bucket, and nearly all of those are in the next one.
    #[inline]
    pub(crate) fn second_candidate(&self, h: u64) -> Candidate {
        if self.buckets.is_empty() {
            return Candidate::Absent;
        }
        let b = &self.buckets[self.next(self.home(h))];
        let t = tag(h);
        match b.tags.iter().position(|&x| x == t) {
            Some(i) => Candidate::Slot(b.slots[i]),
            None if b.overflow == 0 => Candidate::Absent,
            None => Candidate::Unsure,
        }
    }

    /// The slot of the key with hash `h` for which `eq(slot)` holds.
    #[inline]
    pub(crate) fn find(&self, h: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.buckets.is_empty() {
            return None;
        }
        let t = tag(h);
        let mut b = self.home(h);
        for _ in 0..=self.max_probe {
            let bucket = &self.buckets[b];
            for i in 0..WAYS {
                if bucket.tags[i] == t && eq(bucket.slots[i]) {
                    return Some(bucket.slots[i]);
                }
            }
            if bucket.overflow == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// For a key with hash `h` stored at `slot`: how many buckets past its home the place holding
    /// (tag of `h`, `slot`) is, provided [`Probe::find`] would stop there: every bucket passed has
    /// its overflow flag, and no place before it with the same tag holds a slot for which
    /// `same_key` says the key is equal (a duplicate that `find` would return instead). `None` if
    /// `find` would not return this slot.
    pub(crate) fn locate(
        &self,
        h: u64,
        slot: u32,
        mut same_key: impl FnMut(u32) -> bool,
    ) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let t = tag(h);
        let mut b = self.home(h);
        for d in 0..self.buckets.len() {
            let bucket = &self.buckets[b];
            for i in 0..WAYS {
                if bucket.tags[i] == t {
                    if bucket.slots[i] == slot {
                        return Some(d);
                    }
                    if same_key(bucket.slots[i]) {
                        return None;
                    }
                }
            }
            if bucket.overflow == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }
}

/// The index. Keys themselves live in the partition's key arena; the index stores their slots
/// and asks the caller to compare keys (`eq`) and to re-hash slots when it rebuilds.
pub(crate) struct Index {
    buckets: Vec<Bucket>,
    len: usize,
    /// Most buckets past its home that any key now in the index had to go.
    max_probe: usize,
    /// Buckets with `overflow` set, and how many there were right after the last rebuild: deletes
    /// never clear the flag, so under churn (a cache) the count only grows until a rebuild.
    spilled: usize,
    spilled_at_rebuild: usize,
}

impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index")
            .field("buckets", &self.buckets.len())
            .field("len", &self.len)
            .field("max_probe", &self.max_probe)
            .finish()
    }
}

impl Index {
    pub(crate) fn new() -> Self {
        Index {
            buckets: Vec::new(),
            len: 0,
            max_probe: 0,
            spilled: 0,
            spilled_at_rebuild: 0,
        }
    }

    /// An empty index of `buckets` buckets: room for `buckets * 8` keys before it grows.
    pub(crate) fn with_buckets(buckets: usize) -> Self {
        Index {
            buckets: vec![Bucket::default(); buckets],
            ..Index::new()
        }
    }

    /// The buckets a sealed index of `keys` keys has (see [`Index::fitted_buckets`]).
    pub(crate) fn fitted_for(keys: usize) -> usize {
        keys.div_ceil(SHRINK_LOAD).max(1)
    }

    /// Keys in the index.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes the index has allocated.
    pub(crate) fn allocation_size(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<Bucket>()
    }

    /// Whether one more insert needs [`Index::grow`] first.
    pub(crate) fn needs_growth(&self) -> bool {
        self.len + 1 > self.buckets.len() * MAX_LOAD
    }

    /// Bytes the bucket array allocated by the next [`Index::grow`] takes (the old one is freed
    /// once the keys moved over).
    pub(crate) fn growth_bytes(&self) -> usize {
        Self::grown(self.buckets.len()) * std::mem::size_of::<Bucket>()
    }

    fn grown(buckets: usize) -> usize {
        (buckets * 2).max(1)
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        home(h, self.buckets.len())
    }

    #[inline]
    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets.len() {
            0
        } else {
            b + 1
        }
    }

    /// The read-only view lookups go through (also what a mapped image offers, see
    /// [`Probe::from_image`]).
    #[inline]
    pub(crate) fn probe(&self) -> Probe<'_> {
        Probe {
            buckets: &self.buckets,
            max_probe: self.max_probe,
        }
    }

    /// Start loading the home bucket of `h` into the cache.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        self.probe().prefetch(h)
    }

    /// Where the buckets are, for [`BucketHint`]: readers that hold no lock may prefetch from it.
    #[inline]
    pub(crate) fn hint(&self) -> (*const u8, usize) {
        (self.buckets.as_ptr().cast(), self.buckets.len())
    }

    /// [`Probe::first_candidate`].
    #[inline]
    pub(crate) fn first_candidate(&self, h: u64) -> Candidate {
        self.probe().first_candidate(h)
    }

    /// [`Probe::prefetch_spill`].
    #[inline]
    pub(crate) fn prefetch_spill(&self, h: u64) {
        self.probe().prefetch_spill(h)
    }

    /// [`Probe::second_candidate`].
    #[cfg_attr(not(test), expect(dead_code, reason = "lookups go through probe()"))]
    #[inline]
    pub(crate) fn second_candidate(&self, h: u64) -> Candidate {
        self.probe().second_candidate(h)
    }

    /// The slot of the key with hash `h` for which `eq(slot)` holds.
    #[inline]
    pub(crate) fn find(&self, h: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        self.probe().find(h, eq)
    }

    /// Add a key known to be absent. The caller made room with [`Index::grow`] when
    /// [`Index::needs_growth`] said so; this never allocates.
    pub(crate) fn insert_unique(&mut self, h: u64, slot: u32) {
        debug_assert!(!self.needs_growth(), "insert without room");
        let t = tag(h);
        let mut b = self.home(h);
        let mut probe = 0;
        loop {
            let bucket = &mut self.buckets[b];
            if let Some(i) = empty_place(&bucket.tags) {
                bucket.tags[i] = t;
                bucket.slots[i] = slot;
                break;
            }
            // At most 80% of all places are used, so an empty one exists and the loop ends.
            if bucket.overflow == 0 {
                bucket.overflow = 1;
                self.spilled += 1;
            }
            b = self.next(b);
            probe += 1;
        }
        self.max_probe = self.max_probe.max(probe);
        self.len += 1;
    }

    /// Remove the key with hash `h` stored at `slot`; returns whether it was there.
    pub(crate) fn remove(&mut self, h: u64, slot: u32) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let t = tag(h);
        let mut b = self.home(h);
        for _ in 0..=self.max_probe {
            let bucket = &mut self.buckets[b];
            for i in 0..WAYS {
                if bucket.tags[i] == t && bucket.slots[i] == slot {
                    bucket.tags[i] = 0;
                    self.len -= 1;
                    return true;
                }
            }
            if bucket.overflow == 0 {
                return false;
            }
            b = self.next(b);
        }
        false
    }

    /// Forget every key, keeping the buckets (so re-inserting as many allocates nothing).
    pub(crate) fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = Bucket::default());
        self.len = 0;
        self.max_probe = 0;
        self.spilled = 0;
        self.spilled_at_rebuild = 0;
    }

    /// Whether deletes have left so many stale overflow flags (twice as many spilled buckets as
    /// the last rebuild left, plus an eighth of all buckets) that lookups of absent keys probe
    /// too far; [`Index::rehash`] then clears them. Each rehash is paid for by the at least
    /// `buckets / 8` inserts that spilled since the last one, so its cost is amortised O(1).
    pub(crate) fn needs_rehash(&self) -> bool {
        self.spilled > 2 * self.spilled_at_rebuild + self.buckets.len() / 8
    }

    /// Rebuild with the same number of buckets, dropping stale overflow flags.
    pub(crate) fn rehash(&mut self, hash_of: impl Fn(u32) -> u64) {
        self.rebuild(self.buckets.len(), hash_of);
    }

    /// Double the buckets and re-insert every key (`hash_of` gives a slot's key hash).
    pub(crate) fn grow(&mut self, hash_of: impl Fn(u32) -> u64) {
        self.rebuild(Self::grown(self.buckets.len()), hash_of);
    }

    /// The bucket count [`Index::grow`] would double to.
    pub(crate) fn grown_buckets(&self) -> usize {
        Self::grown(self.buckets.len())
    }

    /// The fewest buckets that keep the load at [`SHRINK_LOAD`], if that is fewer than now (what
    /// a sealed partition's index is rebuilt with).
    pub(crate) fn fitted_buckets(&self) -> Option<usize> {
        let want = Self::fitted_for(self.len);
        (want < self.buckets.len()).then_some(want)
    }

    /// Rebuild with `buckets` buckets from `keys`, the (hash, slot) of exactly the keys in the
    /// index now, in any order, and room for all of them. The old buckets are freed first.
    ///
    /// Unlike [`Index::grow`], which walks the old buckets and asks for each slot's hash (for a
    /// table, a cache miss per key reading its record back from the key arena, then another
    /// writing its new bucket), the caller hands the keys over in the order it stores them
    /// (arena order: sequential reads), and [`Index::insert_all`] prefetches their new buckets.
    pub(crate) fn rebuild_from(&mut self, buckets: usize, keys: impl Iterator<Item = (u64, u32)>) {
        let len = self.len;
        self.buckets = Vec::new();
        self.buckets = vec![Bucket::default(); buckets];
        self.clear();
        self.insert_all(keys);
        debug_assert_eq!(self.len, len, "rebuilt from other keys than it held");
        debug_assert!(self.len <= buckets * MAX_LOAD, "rebuilt below the keys");
        self.spilled_at_rebuild = self.spilled;
    }

    /// [`Index::insert_unique`] of every (hash, slot), in groups whose home buckets are
    /// prefetched first, so that the cache misses of a group overlap. The caller made room.
    pub(crate) fn insert_all(&mut self, keys: impl Iterator<Item = (u64, u32)>) {
        const AHEAD: usize = 32;
        let mut keys = keys.peekable();
        let mut group = [(0u64, 0u32); AHEAD];
        while keys.peek().is_some() {
            let mut n = 0;
            for k in keys.by_ref().take(AHEAD) {
                self.prefetch(k.0);
                group[n] = k;
                n += 1;
            }
            for &(h, slot) in &group[..n] {
                self.insert_unique(h, slot);
            }
        }
    }

    /// Bytes of a bucket array of `buckets` buckets.
    pub(crate) fn bytes_of(buckets: usize) -> usize {
        buckets * std::mem::size_of::<Bucket>()
    }

    /// The bucket count a shrink should leave, if one is due: fewer than a quarter of the places
    /// a growth allows are used. The shrunk index is half as loaded as a growth allows, so it
    /// must double its keys before it grows again; it keeps at least `floor_bytes` of buckets.
    pub(crate) fn shrunk_buckets(&self, floor_bytes: usize) -> Option<usize> {
        let floor = (floor_bytes / std::mem::size_of::<Bucket>()).max(1);
        let want = self.len.div_ceil(MAX_LOAD / 2).max(floor);
        (self.len < self.buckets.len() * MAX_LOAD / 4 && want < self.buckets.len()).then_some(want)
    }

    /// Append the buckets as the partition image stores them (docs/partition-image.md, section
    /// 0): per bucket, ten u16 LE tags, ten u32 LE slots, u16 LE overflow, u16 zero; 64 bytes,
    /// which is also the in-memory layout of [`Bucket`] on a little-endian machine. Slots are
    /// key-arena positions, not addresses, so the bytes mean the same wherever they are loaded.
    pub(crate) fn write_image(&self, out: &mut Vec<u8>) {
        out.reserve(self.buckets.len() * BUCKET_BYTES);
        for b in &self.buckets {
            for t in b.tags {
                out.extend_from_slice(&t.to_le_bytes());
            }
            for s in b.slots {
                out.extend_from_slice(&s.to_le_bytes());
            }
            out.extend_from_slice(&b.overflow.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
        }
    }

    /// Rebuild an index from [`Index::write_image`]'s bytes, checking only what one bucket can
    /// say (flags and padding). Which keys the places hold, and whether each is reachable, is the
    /// caller's check: [`Index::locate`] for every key, then [`Index::len`] equal to their count.
    /// Empty places keep whatever slot they hold (never read), so writing the result again gives
    /// the same bytes. `max_probe` starts at 0; the caller raises it with [`Index::set_max_probe`].
    pub(crate) fn from_image(bytes: &[u8]) -> Result<Index, String> {
        if !bytes.len().is_multiple_of(BUCKET_BYTES) {
            return Err(format!(
                "index length {} is not a multiple of {BUCKET_BYTES}",
                bytes.len()
            ));
        }
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let n = bytes.len() / BUCKET_BYTES;
        let mut buckets = Vec::with_capacity(n);
        let (mut len, mut spilled) = (0, 0);
        for b in 0..n {
            let at = b * BUCKET_BYTES;
            let mut bucket = Bucket::default();
            for i in 0..WAYS {
                bucket.tags[i] = u16_at(at + 2 * i);
                bucket.slots[i] = u32_at(at + 2 * WAYS + 4 * i);
                len += usize::from(bucket.tags[i] != 0);
            }
            bucket.overflow = u16_at(at + 6 * WAYS);
            if bucket.overflow > 1 || u16_at(at + 6 * WAYS + 2) != 0 {
                return Err(format!("index bucket {b}: bad overflow flag or padding"));
            }
            spilled += usize::from(bucket.overflow);
            buckets.push(bucket);
        }
        Ok(Index {
            buckets,
            len,
            max_probe: 0,
            spilled,
            spilled_at_rebuild: spilled,
        })
    }

    /// Set the probe bound [`Index::find`] uses (after [`Index::from_image`]: the largest
    /// [`Index::locate`] distance of any key).
    pub(crate) fn set_max_probe(&mut self, max_probe: usize) {
        self.max_probe = max_probe;
    }

    fn rebuild(&mut self, buckets: usize, hash_of: impl Fn(u32) -> u64) {
        let old = std::mem::replace(&mut self.buckets, vec![Bucket::default(); buckets]);
        self.len = 0;
        self.max_probe = 0;
        self.spilled = 0;
        for bucket in &old {
            for i in 0..WAYS {
                if bucket.tags[i] != 0 {
                    let slot = bucket.slots[i];
                    self.insert_unique(hash_of(slot), slot);
                }
            }
        }
        self.spilled_at_rebuild = self.spilled;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u32) -> u64 {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::with_seed(7).hash_one(i)
    }

    #[test]
    fn insert_find_remove_against_a_model() {
        let mut idx = Index::new();
        let mut present = std::collections::BTreeSet::new();
        for i in 0..20_000u32 {
            if idx.needs_growth() {
                idx.grow(h);
            }
            idx.insert_unique(h(i), i);
            present.insert(i);
            if i % 3 == 0 {
                assert!(idx.remove(h(i / 2), i / 2) == present.remove(&(i / 2)));
            }
        }
        assert_eq!(idx.len(), present.len());
        for i in 0..21_000u32 {
            assert_eq!(
                idx.find(h(i), |s| s == i),
                present.contains(&i).then_some(i),
                "key {i}"
            );
            match idx.first_candidate(h(i)) {
                Candidate::Absent => assert!(!present.contains(&i)),
                Candidate::Slot(_) | Candidate::Unsure => {}
            }
        }
        let fitted = idx.fitted_buckets().expect("deletes left room to shrink");
        // Handed over in another order than the buckets hold them, as a partition does.
        idx.rebuild_from(fitted, present.iter().rev().map(|&i| (h(i), i)));
        assert_eq!(idx.buckets.len(), present.len().div_ceil(SHRINK_LOAD));
        assert_eq!((idx.len(), idx.fitted_buckets()), (present.len(), None));
        for &i in &present {
            assert_eq!(idx.find(h(i), |s| s == i), Some(i));
        }
        idx.clear();
        assert_eq!((idx.len(), idx.find(h(1), |_| true)), (0, None));
    }

    #[test]
    fn tag_collisions_and_spills_are_resolved_by_the_full_probe() {
        let mut idx = Index::new();
        while idx.buckets.len() < 2 {
            idx.grow(|_| unreachable!("empty"));
        }
        // Small hashes all have home bucket 0 (multiply-shift takes the high bits) and tag = h.
        for h in 1..=12u64 {
            idx.insert_unique(h, h as u32 * 100);
        }
        assert_eq!(idx.first_candidate(3), Candidate::Slot(300));
        // Keys 11 and 12 spilled into bucket 1: the home bucket cannot tell.
        assert_eq!(idx.first_candidate(12), Candidate::Unsure);
        assert_eq!(idx.second_candidate(12), Candidate::Slot(1200));
        assert_eq!(idx.find(12, |s| s == 1200), Some(1200));
        // Home bucket full and overflowing, next bucket without the tag or overflow: absent.
        assert_eq!(idx.first_candidate(13), Candidate::Unsure);
        assert_eq!(idx.second_candidate(13), Candidate::Absent);
        assert_eq!(idx.find(13, |_| true), None);
        // Same home, same tag (5), other key: the first candidate is the wrong one.
        let twin = 5 | 1 << 40;
        assert_eq!(idx.first_candidate(twin), Candidate::Slot(500));
        assert_eq!(idx.find(twin, |s| s == 999), None);
        assert!(idx.remove(11, 1100) && !idx.remove(11, 1100));
        assert_eq!(idx.find(11, |_| true), None);
        assert_eq!(idx.len(), 11);
    }

    #[test]
    fn churn_rehashes_away_stale_overflow_flags() {
        // A cache's index: a steady number of keys, but every key is soon deleted and replaced.
        let mut idx = Index::new();
        let (live, mut rehashes) = (4_000u32, 0);
        for i in 0..200_000u32 {
            if idx.needs_growth() {
                idx.grow(h);
            } else if idx.needs_rehash() {
                idx.rehash(h);
                rehashes += 1;
            }
            idx.insert_unique(h(i), i);
            if i >= live {
                assert!(idx.remove(h(i - live), i - live));
            }
            assert!(
                idx.spilled
                    <= 2 * idx.spilled_at_rebuild + idx.buckets.len() / 8 + idx.max_probe.max(1)
            );
        }
        assert_eq!(idx.len(), live as usize);
        assert!(rehashes > 0, "churn never rehashed");
        for i in 200_000 - live..200_000 {
            assert_eq!(idx.find(h(i), |s| s == i), Some(i));
        }
        assert_eq!(idx.find(h(0), |s| s == 0), None);
    }

    #[test]
    fn a_bucket_hint_follows_growth_and_is_harmless_when_stale() {
        let hint = BucketHint::default();
        hint.prefetch(h(1)); // never refreshed: a null address, still no fault
        let mut idx = Index::new();
        idx.grow(h);
        hint.refresh(idx.hint());
        let before = hint.ptr.load(std::sync::atomic::Ordering::Relaxed);
        for i in 0..1000u32 {
            if idx.needs_growth() {
                idx.grow(h);
            }
            idx.insert_unique(h(i), i);
        }
        // The old buckets are freed: prefetching through the stale hint must not fault.
        for i in 0..1000u32 {
            hint.prefetch(h(i));
        }
        hint.refresh(idx.hint());
        assert_ne!(hint.ptr.load(std::sync::atomic::Ordering::Relaxed), before);
        assert_eq!(
            hint.len.load(std::sync::atomic::Ordering::Relaxed),
            idx.buckets.len()
        );
    }

    #[test]
    fn empty_place_is_the_first_zero_tag() {
        // Every pattern of empty and used places, with tags that tempt the word trick (1, and
        // values with the high bit set).
        for mask in 0..1u32 << WAYS {
            for filler in [1u16, 0x8000, 0xffff, 0x0101] {
                let tags: [u16; WAYS] =
                    std::array::from_fn(|i| if mask >> i & 1 == 1 { filler } else { 0 });
                assert_eq!(
                    empty_place(&tags),
                    tags.iter().position(|&t| t == 0),
                    "{tags:?}"
                );
            }
        }
    }

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), BUCKET_BYTES);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
