//! A read-only partition served straight from the bytes of its image (docs/partition-image.md),
//! with no copy: what a process beside a server uses to read a sealed partition mapped from
//! shared memory.
//!
//! [`ImageView::open`] checks the image once, exactly as [`crate::image`]'s reader does before it
//! rebuilds a partition (header, checksums, key arena, index, value arena), and keeps only the
//! section bounds and the probe bound. Lookups then run the same prefetching pipeline as the
//! server's (`tables::partition::lookup_many`) over the image's own index buckets, which are
//! the in-memory layout byte for byte (index section at offset 192, a multiple of 64, in a
//! page-aligned mapping). Values come out in their wire form (little-endian, as the native
//! protocol packs them), borrowed from the image, for the caller to write where it wants them.

use crate::image::{
    bad, check_index, check_key_arena, check_value_arena, read_header, INDEX, KEYS, KEY_OFFS,
    VALUES, VALUE_OFFS,
};
use crate::index::{prefetch, Probe};
use crate::tables::partition::{key_hash, lookup_many, read_u32, Lookup};
use crate::tables::ValueType;
use crate::Result;

/// A checked image and what lookups need to read it in place. `B` holds the bytes (a mapping, or
/// [`AlignedBytes`]); they must not change while the view lives (a sealed memfd cannot).
pub struct ImageView<B> {
    bytes: B,
    value_type: ValueType,
    items: usize,
    sections: [(usize, usize); 5],
    max_probe: usize,
}

impl<B> std::fmt::Debug for ImageView<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageView")
            .field("value_type", &self.value_type)
            .field("items", &self.items)
            .finish()
    }
}

impl<B: AsRef<[u8]>> ImageView<B> {
    /// Check `bytes` completely (docs/partition-image.md, "What a reader checks", 1-5) and view
    /// them. The bytes must start on a 64-byte boundary (a mapping does; [`AlignedBytes`] for a
    /// copy). A damaged image is [`Error::CorruptImage`] naming what is wrong.
    pub fn open(bytes: B) -> Result<ImageView<B>> {
        let img = bytes.as_ref();
        let h = read_header(img)?;
        let sec = |i: usize| &img[h.sections[i].0..h.sections[i].0 + h.sections[i].1];
        let n = h.items;
        check_key_arena(sec(KEYS), sec(KEY_OFFS), n)?;
        let (probe, occupied) = Probe::from_image(sec(INDEX)).map_err(bad)?;
        if occupied != n {
            return Err(bad(format!("index holds {occupied} keys for {n} items")));
        }
        let max_probe = check_index(probe, sec(KEYS), sec(KEY_OFFS))?;
        if h.value_type == ValueType::Bytes {
            check_value_arena(sec(VALUES), sec(VALUE_OFFS), n)?;
        }
        let (value_type, sections) = (h.value_type, h.sections);
        Ok(ImageView {
            bytes,
            value_type,
            items: n,
            sections,
            max_probe,
        })
    }

    /// The value type the image holds.
    pub fn value_type(&self) -> ValueType {
        self.value_type
    }

    /// Live keys.
    pub fn len(&self) -> usize {
        self.items
    }

    /// Whether the partition holds no key.
    pub fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// The whole image.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    #[inline]
    fn section(&self, i: usize) -> &[u8] {
        let (off, len) = self.sections[i];
        &self.bytes.as_ref()[off..off + len]
    }

    /// Entry `i`'s value in wire form: 8 LE bytes (i64, f64), `dim * 4` LE bytes (f32 vectors),
    /// or the value's bytes.
    #[inline]
    pub fn value_wire(&self, i: usize) -> &[u8] {
        let vals = self.section(VALUES);
        match self.value_type {
            ValueType::I64 | ValueType::F64 => &vals[i * 8..i * 8 + 8],
            ValueType::F32Vec { dim } => {
                let w = dim as usize * 4;
                &vals[i * w..(i + 1) * w]
            }
            ValueType::Bytes => self.record(self.record_offset(i)),
        }
    }

    /// Where entry `i`'s value record (u32 length, bytes) starts in the value arena (bytes
    /// images only).
    #[inline]
    fn record_offset(&self, i: usize) -> usize {
        let offs = self.section(VALUE_OFFS);
        u64::from_le_bytes(offs[i * 8..i * 8 + 8].try_into().expect("8 bytes")) as usize
    }

    /// The bytes of the value record at `off` in the value arena.
    #[inline]
    fn record(&self, off: usize) -> &[u8] {
        let vals = self.section(VALUES);
        let len = read_u32(vals, off) as usize;
        &vals[off + 4..off + 4 + len]
    }

    /// Entry `i`'s key (entries are the partition's column order: what a scan visits).
    #[inline]
    pub fn key(&self, i: usize) -> &[u8] {
        let slot = read_u32(self.section(KEY_OFFS), i * 4);
        crate::tables::partition::key_at(self.section(KEYS), slot)
    }

    /// Every value in entry order, back to back in wire form, for the fixed-width types (8 LE
    /// bytes per i64 or f64, `dim * 4` LE bytes per f32 vector): the image's value section
    /// itself, borrowed. `None` for bytes values (see [`ImageView::append_bytes_values`]).
    pub fn fixed_values(&self) -> Option<&[u8]> {
        (self.value_type != ValueType::Bytes).then(|| self.section(VALUES))
    }

    /// Room enough for every key back to back: the key arena less its record headers (each record
    /// is a u32 length, a u32 entry number, the key and padding to 4 bytes).
    pub fn key_bytes_bound(&self) -> usize {
        self.section(KEYS).len().saturating_sub(8 * self.items)
    }

    /// Every bytes value back to back takes exactly this (the value arena less the u32 length of
    /// each record); 0 for the other types.
    pub fn bytes_values_len(&self) -> usize {
        match self.value_type {
            ValueType::Bytes => self.section(VALUES).len().saturating_sub(4 * self.items),
            _ => 0,
        }
    }

    /// Write every key, in entry order, back to back into `data`, and Arrow's (large) binary
    /// offsets into `ends`: `ends[0] = 0`, `ends[i + 1]` the end of key `i`. Returns the bytes
    /// written.
    ///
    /// # Panics
    ///
    /// Unless `ends` holds `len() + 1` offsets and `data` at least
    /// [`ImageView::key_bytes_bound`] bytes.
    pub fn write_keys(&self, ends: &mut [i64], data: &mut [u8]) -> usize {
        let (offs, arena) = (self.section(KEY_OFFS), self.section(KEYS));
        assert!(
            ends.len() == self.items + 1 && data.len() >= self.key_bytes_bound(),
            "room for every key and one offset more"
        );
        let starts = offs
            .chunks_exact(4)
            .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")) as usize * 4);
        // SAFETY: `open` checked the key arena (check 3 of docs/partition-image.md): it is exactly
        // `items` whole records, each named by the one key offset that points at it, so every
        // start is a whole record's and their keys together take at most the arena less 8 bytes
        // per record, which `data` holds (asserted above).
        unsafe { gather(arena, 8, starts, ends, data) }
    }

    /// [`ImageView::write_keys`] for the values of a bytes image (`data` of at least
    /// [`ImageView::bytes_values_len`] bytes); writes nothing and returns 0 for other types.
    ///
    /// # Panics
    ///
    /// As [`ImageView::write_keys`].
    pub fn write_bytes_values(&self, ends: &mut [i64], data: &mut [u8]) -> usize {
        if self.value_type != ValueType::Bytes {
            return 0;
        }
        let (offs, vals) = (self.section(VALUE_OFFS), self.section(VALUES));
        assert!(
            ends.len() == self.items + 1 && data.len() >= self.bytes_values_len(),
            "room for every value and one offset more"
        );
        let starts = offs
            .chunks_exact(8)
            .map(|o| u64::from_le_bytes(o.try_into().expect("8 bytes")) as usize);
        // SAFETY: `open` checked the value arena (check 5): exactly `items` whole records back to
        // back, the value offsets a permutation of their starts; so the values take exactly the
        // arena less 4 bytes per record, which `data` holds (asserted above).
        unsafe { gather(vals, 4, starts, ends, data) }
    }

    /// One key's value in wire form, if present.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        let keys = self.key_arena();
        self.probe()
            .find(key_hash(key), |s| {
                crate::tables::partition::key_eq(crate::tables::partition::key_at(keys, s), key)
            })
            .map(|s| self.value_wire(crate::tables::partition::entry_at(keys, s)))
    }
}

impl<B: AsRef<[u8]>> Lookup for ImageView<B> {
    #[inline]
    fn probe(&self) -> Probe<'_> {
        Probe::over_checked(self.section(INDEX), self.max_probe)
    }

    #[inline]
    fn key_arena(&self) -> &[u8] {
        self.section(KEYS)
    }

    #[inline]
    fn prefetch_value(&self, i: usize) {
        let (at, sec) = match self.value_type {
            ValueType::I64 | ValueType::F64 => (i * 8, VALUES),
            ValueType::F32Vec { dim } => (i * dim as usize * 4, VALUES),
            ValueType::Bytes => (i * 8, VALUE_OFFS),
        };
        prefetch(self.section(sec).as_ptr().wrapping_add(at));
    }
}

/// Copy the records starting at `starts` (a u32 LE length at the start, the bytes `header` bytes
/// after it) of `arena` back to back into `data`, writing `ends[0] = 0` and after each record its
/// end; returns the bytes written. The 8-byte keys most tables hold (int keys) are copied as one
/// word, not through `memcpy`. Unchecked: bounds checks on every record cost as much as the copy
/// (about 1 ns against 0.5 per key), and `ImageView::open` has proved them already.
///
/// # Safety
///
/// Every start must be that of a whole record within `arena` (`header` bytes, then as many as its
/// length says), and `data` must hold the bytes of the first `ends.len() - 1` records together
/// (those written; debug builds check each).
unsafe fn gather(
    arena: &[u8],
    header: usize,
    starts: impl Iterator<Item = usize>,
    ends: &mut [i64],
    data: &mut [u8],
) -> usize {
    let (a, d) = (arena.as_ptr(), data.as_mut_ptr());
    ends[0] = 0;
    let mut end = 0usize;
    for (at, e) in starts.zip(&mut ends[1..]) {
        debug_assert!(at + header <= arena.len());
        // SAFETY: a whole record starts at `at` (the caller's promise).
        let len = unsafe { a.add(at).cast::<u32>().read_unaligned() } as usize;
        debug_assert!(at + header + len <= arena.len() && end + len <= data.len());
        // SAFETY: the record's bytes are in `arena` and `data` has room for them (the caller's
        // promise); `data` is a `&mut` and cannot overlap `arena`.
        unsafe {
            let src = a.add(at + header);
            if len == 8 {
                d.add(end)
                    .cast::<u64>()
                    .write_unaligned(src.cast::<u64>().read_unaligned());
            } else {
                std::ptr::copy_nonoverlapping(src, d.add(end), len);
            }
        }
        end += len;
        *e = end as i64;
    }
    end
}

/// Answers of a bytes lookup held back before they are emitted: a bytes value is a second
/// dependent load past its offset (the pipeline prefetches only the offset), so each answer's
/// record is prefetched when its entry is known and read this many answers later, overlapping
/// its miss with the next keys' work instead of stalling on it.
const RECORD_DELAY: usize = 16;

/// Look up every `(view, key)`, in order, with the server's prefetching pipeline (the keys of a
/// batch may spread over any number of views), and call `emit` with each value's wire form (see
/// [`ImageView::value_wire`]) or `None` for a missing key (a key longer than `max_key` is
/// missing, unlooked). Every view must hold one value type.
pub fn lookup<'d, B, K>(
    items: impl Iterator<Item = (&'d ImageView<B>, K)>,
    max_key: usize,
    mut emit: impl FnMut(Option<&'d [u8]>),
) where
    B: AsRef<[u8]> + 'd,
    K: AsRef<[u8]> + Copy,
{
    // Bytes answers wait in `ring` (view, offset of the value record) for RECORD_DELAY answers.
    let mut ring: [Option<(&'d ImageView<B>, usize)>; RECORD_DELAY] = [None; RECORD_DELAY];
    let (mut queued, mut emitted) = (0usize, 0usize);
    lookup_many(items, max_key, |d, found| {
        if d.value_type != ValueType::Bytes {
            emit(found.ok().map(|i| d.value_wire(i)));
            return;
        }
        if queued - emitted == RECORD_DELAY {
            emit(ring[emitted % RECORD_DELAY].map(|(d, off)| d.record(off)));
            emitted += 1;
        }
        ring[queued % RECORD_DELAY] = found.ok().map(|i| {
            let off = d.record_offset(i);
            prefetch(d.section(VALUES).as_ptr().wrapping_add(off));
            (d, off)
        });
        queued += 1;
    });
    while emitted < queued {
        emit(ring[emitted % RECORD_DELAY].map(|(d, off)| d.record(off)));
        emitted += 1;
    }
}

/// One cache line of [`AlignedBytes`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Bytes on a 64-byte boundary: an image read into memory (a file, a test) that
/// [`ImageView::open`] can view.
#[derive(Clone)]
pub struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    /// A 64-byte aligned copy of `b`.
    pub fn copy_of(b: &[u8]) -> AlignedBytes {
        let mut lines = vec![Line([0; 64]); b.len().div_ceil(64)];
        for (line, chunk) in lines.iter_mut().zip(b.chunks(64)) {
            line.0[..chunk.len()].copy_from_slice(chunk);
        }
        AlignedBytes {
            lines,
            len: b.len(),
        }
    }
}

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes with no padding, so the lines are `64 * lines.len()`
        // initialised bytes, of which `len` are asked for.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::image::image_bytes;
    use crate::image::tests::{build, reseal, TYPES};
    use crate::memory::Budget;
    use crate::tables::partition::get_packed;

    /// The server's packed reply (statuses + values) for `keys` from the owned partition, and
    /// the same bytes composed from the view's answers.
    fn both(t: ValueType, ops: usize, nkeys: u64, seed: u64) -> (Vec<u8>, Vec<u8>, usize) {
        let meter = Arc::new(Budget::new(1 << 30));
        let (d, model) = build(t, ops, nkeys, seed, &meter);
        let img = image_bytes(&d).unwrap();
        let view = ImageView::open(AlignedBytes::copy_of(&img)).unwrap();
        assert_eq!(view.len(), model.len());
        // Every stored key, every key ever touched, and keys never stored (some longer).
        let mut keys: Vec<Vec<u8>> = model.keys().cloned().collect();
        keys.extend(
            (0..nkeys + 5)
                .map(|k| format!("key-{k}-{}", "x".repeat((k % 13) as usize)).into_bytes()),
        );
        keys.extend([b"".to_vec(), b"absent".to_vec(), vec![b'z'; 300]]);
        let (mut st, mut vals) = (Vec::new(), Vec::new());
        get_packed(
            keys.iter().map(|k| (&d, &k[..])),
            t,
            keys.len(),
            usize::MAX,
            usize::MAX,
            &mut st,
            &mut vals,
        );
        let mut owned = st.clone();
        owned.extend_from_slice(&vals);
        // The view's answers, packed the same way.
        let (mut st2, mut vals2) = (Vec::new(), Vec::new());
        lookup(keys.iter().map(|k| (&view, &k[..])), usize::MAX, |v| {
            st2.push(if v.is_some() {
                0
            } else {
                crate::KeyStatus::NotFound as u8
            });
            match (t, v) {
                (ValueType::Bytes, Some(b)) => {
                    vals2.extend_from_slice(&(b.len() as u32).to_le_bytes());
                    vals2.extend_from_slice(b);
                }
                (ValueType::Bytes, None) => {}
                (_, Some(b)) => vals2.extend_from_slice(b),
                (_, None) => vals2.resize(vals2.len() + t.packed_width().unwrap(), 0),
            }
        });
        for (k, s) in keys.iter().zip(&st2) {
            assert_eq!(view.get(k).is_some(), *s == 0);
        }
        let mut viewed = st2;
        viewed.extend_from_slice(&vals2);
        (owned, viewed, keys.len())
    }

    #[test]
    fn the_view_answers_as_the_owned_partition_for_every_type() {
        assert_eq!(crate::KeyStatus::Ok as u8, 0);
        for (n, t) in TYPES.into_iter().enumerate() {
            for (ops, keys) in [(0, 1), (1, 1), (50, 20), (20_000, 4_000)] {
                let (owned, viewed, _) = both(t, ops, keys, n as u64 + ops as u64);
                assert_eq!(owned, viewed, "{t:?} after {ops} ops");
            }
        }
    }

    #[test]
    fn columns_come_out_in_entry_order_as_the_owned_partition_holds_them() {
        for (n, t) in TYPES.into_iter().enumerate() {
            for (ops, keys) in [(0, 1), (1, 1), (50, 20), (20_000, 4_000)] {
                let meter = Arc::new(Budget::new(1 << 30));
                let (d, model) = build(t, ops, keys, n as u64 * 7 + ops as u64, &meter);
                let view =
                    ImageView::open(AlignedBytes::copy_of(&image_bytes(&d).unwrap())).unwrap();
                let mut ends = vec![-1i64; model.len() + 1];
                let mut data = vec![0u8; view.key_bytes_bound()];
                let used = view.write_keys(&mut ends, &mut data);
                assert_eq!(used as i64, ends[model.len()]);
                assert!(view.key_bytes_bound() - used < 4 * model.len().max(1));
                let mut vends = vec![-1i64; model.len() + 1];
                let mut vdata = vec![0u8; view.bytes_values_len()];
                let vused = view.write_bytes_values(&mut vends, &mut vdata);
                assert_eq!(vused, view.bytes_values_len(), "exactly the room asked for");
                assert_eq!(ends[0], 0);
                let width = t.packed_width();
                let fixed = view.fixed_values();
                assert_eq!(fixed.is_some(), width.is_some(), "{t:?}");
                for i in 0..model.len() {
                    let k = &data[ends[i] as usize..ends[i + 1] as usize];
                    assert_eq!(k, d.key(i), "{t:?}: key of entry {i}");
                    assert_eq!(view.key(i), k);
                    let wire = view.get(k).expect("a stored key");
                    assert_eq!(wire, view.value_wire(i));
                    let v = match (fixed, width) {
                        (Some(f), Some(w)) => &f[i * w..(i + 1) * w],
                        _ => &vdata[vends[i] as usize..vends[i + 1] as usize],
                    };
                    assert_eq!(v, wire, "{t:?}: value of entry {i}");
                }
                if let (Some(f), Some(w)) = (fixed, width) {
                    assert_eq!(f.len(), model.len() * w);
                    assert_eq!(vused, 0);
                    assert!(vends.iter().all(|&e| e == -1), "nothing written");
                }
            }
        }
    }

    #[test]
    fn keys_longer_than_max_key_are_missing_and_bytes_answers_keep_their_order() {
        let meter = Arc::new(Budget::new(1 << 30));
        let (d, model) = build(ValueType::Bytes, 3_000, 1_000, 7, &meter);
        let view = ImageView::open(AlignedBytes::copy_of(&image_bytes(&d).unwrap())).unwrap();
        let mut keys: Vec<Vec<u8>> = model.keys().cloned().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
        let max_key = keys[keys.len() / 2].len() - 1;
        // More answers than the delay ring holds, some cut by max_key, in the order asked.
        let mut got = Vec::new();
        lookup(keys.iter().map(|k| (&view, &k[..])), max_key, |v| {
            got.push(v.map(<[u8]>::to_vec))
        });
        assert_eq!(got.len(), keys.len());
        for (k, v) in keys.iter().zip(&got) {
            let want = (k.len() <= max_key).then(|| view.get(k).unwrap().to_vec());
            assert_eq!(*v, want);
        }
    }

    #[test]
    fn a_damaged_image_is_refused_and_an_unaligned_one_too() {
        let meter = Arc::new(Budget::new(1 << 30));
        let (d, _) = build(ValueType::Bytes, 60, 30, 1, &meter);
        let img = image_bytes(&d).unwrap();
        for at in (0..img.len()).step_by(7) {
            let mut b = img.clone();
            b[at] ^= 0x40;
            let e = ImageView::open(AlignedBytes::copy_of(&b)).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::CorruptImage, "byte {at}");
        }
        // A missing overflow flag with valid checksums: the structural check catches it.
        let (d, _) = build(ValueType::I64, 5_000, 5_000, 3, &meter);
        let mut img = image_bytes(&d).unwrap();
        let b = (0..img.len() / 64)
            .find(|b| 192 + b * 64 + 60 < img.len() && img[192 + b * 64 + 60] == 1)
            .expect("some bucket spilled");
        img[192 + b * 64 + 60] = 0;
        reseal(&mut img);
        assert!(ImageView::open(AlignedBytes::copy_of(&img)).is_err());
        // Unaligned bytes: refused, not misread.
        let (d, _) = build(ValueType::I64, 100, 100, 3, &meter);
        let img = image_bytes(&d).unwrap();
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&img);
        let owner = AlignedBytes::copy_of(&shifted);
        let e = ImageView::open(&owner.as_ref()[1..]).unwrap_err();
        assert!(e.to_string().contains("64-byte"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn proptest_view_equals_owned(t in 0usize..TYPES.len(), ops in 0usize..600, keys in 1u64..200, seed: u64) {
            let (owned, viewed, _) = both(TYPES[t], ops, keys, seed);
            prop_assert_eq!(owned, viewed);
        }
    }
}
