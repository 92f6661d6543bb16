//! The flat image of a sealed partition: one byte format for a snapshot file, a partition copy
//! on the wire, and a read-only segment mapped by processes on the same host (`image_view.rs`).
//!
//! The normative layout is docs/partition-image.md (format version 1). In short: a 192-byte
//! header (magic, version, value type, counts, a (offset, length, xxh3-64) triple per section, a
//! header checksum), then five sections at canonical, 8-byte aligned offsets (the index at 64):
//! index buckets, key arena, key offsets, values, value offsets. Everything is little-endian and
//! addressed by offsets or slots, never by pointers, so the same bytes are valid anywhere.
//!
//! Reading trusts nothing: a damaged image is refused with [`Error::CorruptImage`] naming what is
//! wrong, before any of it can be served. The checksums catch accidents; the structural checks
//! (every offset and length in range, every index slot a live key, every key reachable through
//! the index) make even a deliberately forged image with valid checksums unable to panic the
//! reader or make it return another key's value.

use std::io::{self, Write};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use crate::index::{Index, Probe, BUCKET_BYTES};
use crate::memory::Budget;
use crate::tables::partition::{
    entry_at, key_at, key_hash, key_record_len, read_u32, Column, PartData,
};
use crate::tables::{ValueType, MAX_F32_DIM};
use crate::{Error, Result};

/// First 8 bytes of every image.
pub const MAGIC: [u8; 8] = *b"RGPIMG\0\0";

/// The format version this code writes and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes of the header, checksum included; the first section starts here.
pub const HEADER_LEN: usize = 192;

/// Where the header checksum sits (it covers bytes `0..HEADER_SUM_AT`).
const HEADER_SUM_AT: usize = HEADER_LEN - 8;

/// Where the section table starts: five (offset, length, xxh3-64) u64 triples.
const SECTIONS_AT: usize = 48;

/// Section numbers, in file order.
pub(crate) const INDEX: usize = 0;
pub(crate) const KEYS: usize = 1;
pub(crate) const KEY_OFFS: usize = 2;
pub(crate) const VALUES: usize = 3;
pub(crate) const VALUE_OFFS: usize = 4;
const SECTIONS: usize = 5;
const SECTION_NAMES: [&str; SECTIONS] = [
    "index",
    "key arena",
    "key offsets",
    "values",
    "value offsets",
];

/// What an image says about itself, for callers that only check one (the fuzz target, tools).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The value type of the partition.
    pub value_type: ValueType,
    /// Live keys.
    pub items: u64,
    /// Bytes of the whole image.
    pub bytes: u64,
}

fn type_code(t: ValueType) -> (u32, u32) {
    match t {
        ValueType::Bytes => (1, 0),
        ValueType::I64 => (2, 0),
        ValueType::F64 => (3, 0),
        ValueType::F32Vec { dim } => (4, dim),
    }
}

fn align(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|x| x & !(to - 1))
}

/// Canonical offsets of the sections for these lengths, and the image's total length; `None`
/// if they overflow. The index goes at [`HEADER_LEN`] (a multiple of 64, so a mapped image keeps
/// buckets on cache lines); every other section at the next multiple of 8.
fn layout(lens: &[usize; SECTIONS]) -> Option<([usize; SECTIONS], usize)> {
    let mut offs = [0; SECTIONS];
    let mut at = HEADER_LEN;
    for i in 0..SECTIONS {
        offs[i] = align(at, 8)?;
        at = offs[i].checked_add(lens[i])?;
    }
    Some((offs, align(at, 8)?))
}

/// The bytes of each section of a frozen partition.
fn sections(d: &PartData) -> io::Result<[Vec<u8>; SECTIONS]> {
    let garbage = match &d.col {
        Column::Bytes { garbage, .. } => *garbage,
        _ => 0,
    };
    if d.key_garbage > 0 || garbage > 0 {
        // Sealing freezes (compacts) every partition, so only a caller bug gets here.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "partition is not frozen: only sealed partitions have an image",
        ));
    }
    let mut index = Vec::new();
    d.index.write_image(&mut index);
    let key_offs = d.key_offs.iter().flat_map(|o| o.to_le_bytes()).collect();
    let (values, value_offs) = match &d.col {
        Column::I64(v) => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), Vec::new()),
        Column::F64(v) => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), Vec::new()),
        Column::F32 { data, .. } => (
            data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Vec::new(),
        ),
        Column::Bytes { arena, offs, .. } => (
            arena.clone(),
            offs.iter().flat_map(|o| o.to_le_bytes()).collect(),
        ),
    };
    Ok([index, d.keys.clone(), key_offs, values, value_offs])
}

fn value_type_of(d: &PartData) -> ValueType {
    match &d.col {
        Column::I64(_) => ValueType::I64,
        Column::F64(_) => ValueType::F64,
        Column::F32 { dim, .. } => ValueType::F32Vec { dim: *dim as u32 },
        Column::Bytes { .. } => ValueType::Bytes,
    }
}

/// The image of a frozen (sealed) partition, as bytes.
pub(crate) fn image_bytes(d: &PartData) -> io::Result<Vec<u8>> {
    let secs = sections(d)?;
    let lens = secs.each_ref().map(Vec::len);
    let (offs, total) = layout(&lens)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "partition too large"))?;
    let mut out = vec![0u8; total];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    let (code, dim) = type_code(value_type_of(d));
    out[16..20].copy_from_slice(&code.to_le_bytes());
    out[20..24].copy_from_slice(&dim.to_le_bytes());
    out[24..32].copy_from_slice(&(d.len() as u64).to_le_bytes());
    out[32..40].copy_from_slice(&((lens[INDEX] / BUCKET_BYTES) as u64).to_le_bytes());
    for i in 0..SECTIONS {
        let at = SECTIONS_AT + 24 * i;
        out[at..at + 8].copy_from_slice(&(offs[i] as u64).to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&(lens[i] as u64).to_le_bytes());
        out[at + 16..at + 24].copy_from_slice(&xxh3_64(&secs[i]).to_le_bytes());
        out[offs[i]..offs[i] + lens[i]].copy_from_slice(&secs[i]);
    }
    let sum = xxh3_64(&out[..HEADER_SUM_AT]);
    out[HEADER_SUM_AT..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Write the image of a frozen (sealed) partition; returns the bytes written.
pub(crate) fn write_image(d: &PartData, w: &mut impl Write) -> io::Result<u64> {
    let bytes = image_bytes(d)?;
    w.write_all(&bytes)?;
    Ok(bytes.len() as u64)
}

pub(crate) fn bad(what: impl Into<String>) -> Error {
    Error::CorruptImage(what.into())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A header that passed its checks: the value type, item and bucket counts, and each section.
pub(crate) struct Header {
    pub(crate) value_type: ValueType,
    pub(crate) items: usize,
    pub(crate) sections: [(usize, usize); SECTIONS],
}

pub(crate) fn read_header(img: &[u8]) -> Result<Header> {
    if img.len() < HEADER_LEN {
        return Err(bad(format!(
            "truncated: {} bytes, a header alone is {HEADER_LEN}",
            img.len()
        )));
    }
    if img[0..8] != MAGIC {
        return Err(bad("bad magic: not a ramgrid partition image"));
    }
    let version = u32_at(img, 8);
    if version != FORMAT_VERSION {
        return Err(bad(format!(
            "format version {version}; this server reads version {FORMAT_VERSION}"
        )));
    }
    if xxh3_64(&img[..HEADER_SUM_AT]) != u64_at(img, HEADER_SUM_AT) {
        return Err(bad("header checksum mismatch"));
    }
    if u32_at(img, 12) as usize != HEADER_LEN {
        return Err(bad(format!(
            "header length {} is not {HEADER_LEN}",
            u32_at(img, 12)
        )));
    }
    if img[40..48]
        .iter()
        .chain(&img[168..HEADER_SUM_AT])
        .any(|&b| b != 0)
    {
        return Err(bad("reserved header bytes are not zero"));
    }
    let (code, dim) = (u32_at(img, 16), u32_at(img, 20));
    let value_type = match (code, dim) {
        (1, 0) => ValueType::Bytes,
        (2, 0) => ValueType::I64,
        (3, 0) => ValueType::F64,
        (4, 1..=MAX_F32_DIM) => ValueType::F32Vec { dim },
        _ => return Err(bad(format!("bad value type {code} with dim {dim}"))),
    };
    // Every count is checked against the file's size before it sizes anything.
    let items = u64_at(img, 24);
    let buckets = u64_at(img, 32);
    if items > u64::from(u32::MAX) || items > img.len() as u64 {
        return Err(bad(format!(
            "item count {items} is impossible for this image"
        )));
    }
    if buckets > (img.len() / BUCKET_BYTES) as u64 {
        return Err(bad(format!(
            "bucket count {buckets} is impossible for this image"
        )));
    }
    let (items, buckets) = (items as usize, buckets as usize);
    let mut lens = [0usize; SECTIONS];
    let mut sections = [(0usize, 0usize); SECTIONS];
    for (i, len) in lens.iter_mut().enumerate() {
        let at = SECTIONS_AT + 24 * i;
        let (off, l) = (u64_at(img, at), u64_at(img, at + 8));
        if off > img.len() as u64 || l > img.len() as u64 {
            return Err(bad(format!(
                "{} section (offset {off}, length {l}) is past the end of the image ({} bytes)",
                SECTION_NAMES[i],
                img.len()
            )));
        }
        *len = l as usize;
        sections[i] = (off as usize, l as usize);
    }
    // Lengths that follow from the counts and the value type.
    let fixed = match value_type {
        ValueType::I64 | ValueType::F64 => Some(items * 8),
        ValueType::F32Vec { dim } => Some(items * dim as usize * 4),
        ValueType::Bytes => None,
    };
    let want: [Option<usize>; SECTIONS] = [
        Some(buckets * BUCKET_BYTES),
        None,
        Some(items * 4),
        fixed,
        Some(if value_type == ValueType::Bytes {
            items * 8
        } else {
            0
        }),
    ];
    for i in 0..SECTIONS {
        if let Some(w) = want[i] {
            if lens[i] != w {
                return Err(bad(format!(
                    "{} section is {} bytes; the counts say {w}",
                    SECTION_NAMES[i], lens[i]
                )));
            }
        }
    }
    if !lens[KEYS].is_multiple_of(4) {
        return Err(bad("key arena length is not a multiple of 4"));
    }
    let (offs, total) = layout(&lens).ok_or_else(|| bad("section lengths overflow"))?;
    for i in 0..SECTIONS {
        if sections[i].0 != offs[i] {
            return Err(bad(format!(
                "{} section at offset {}; version 1 puts it at {}",
                SECTION_NAMES[i], sections[i].0, offs[i]
            )));
        }
    }
    if img.len() != total {
        return Err(bad(format!(
            "image is {} bytes; its sections end at {total} (truncated or trailing bytes)",
            img.len()
        )));
    }
    // Padding between and after sections is zero, so every byte of an image is checked.
    let mut at = HEADER_LEN;
    for i in 0..=SECTIONS {
        let next = if i < SECTIONS { offs[i] } else { total };
        if img[at..next].iter().any(|&b| b != 0) {
            return Err(bad("padding between sections is not zero"));
        }
        if i < SECTIONS {
            at = offs[i] + lens[i];
        }
    }
    for i in 0..SECTIONS {
        let (off, len) = sections[i];
        let sum = u64_at(img, SECTIONS_AT + 24 * i + 16);
        if xxh3_64(&img[off..off + len]) != sum {
            return Err(bad(format!(
                "{} section checksum mismatch",
                SECTION_NAMES[i]
            )));
        }
    }
    Ok(Header {
        value_type,
        items,
        sections,
    })
}

/// Validate an image and rebuild the partition it holds, charged to `meter`
/// ([`Error::OutOfMemory`] if it does not fit; nothing is kept charged then). `expect`, if
/// given, is the value type the image must have (its table's).
pub(crate) fn read_image(
    img: &[u8],
    expect: Option<ValueType>,
    meter: &Arc<Budget>,
) -> Result<PartData> {
    let h = read_header(img)?;
    if let Some(t) = expect {
        if t != h.value_type {
            return Err(bad(format!(
                "image holds {:?} values; the table holds {t:?}",
                h.value_type
            )));
        }
    }
    let sec = |i: usize| &img[h.sections[i].0..h.sections[i].0 + h.sections[i].1];
    // The rebuilt partition allocates what its sections hold (the bytes column's offsets are
    // u64, as stored): charge that first, as every table allocation is charged before it is made.
    let ahead: usize = (0..SECTIONS).map(|i| h.sections[i].1).sum();
    if !meter.try_charge(ahead) {
        return Err(Error::OutOfMemory);
    }
    let d = rebuild(&h, sec, meter, ahead).inspect_err(|_| meter.release(ahead))?;
    // What `rebuild` checked must mean exactly this: every key is found, at its own entry, by
    // a reader's lookup. Restated in debug builds (every test), where it costs nothing that
    // matters.
    #[cfg(debug_assertions)]
    for i in 0..d.len() {
        let k = d.key(i);
        assert_eq!(
            d.find(k, key_hash(k)),
            Some(i),
            "an accepted image misleads lookups"
        );
    }
    Ok(d)
}

/// Check 3 of docs/partition-image.md: the key arena is exactly `n` whole records, each naming
/// an entry whose key offset (`key_offs`, `n` u32 LE) points back at it, so records and entries
/// correspond one to one; padding zero.
pub(crate) fn check_key_arena(keys: &[u8], key_offs: &[u8], n: usize) -> Result<()> {
    let mut at = 0;
    let mut records = 0usize;
    while at < keys.len() {
        if at + 8 > keys.len() {
            return Err(bad(format!("key record at {at} is cut off")));
        }
        let rec = key_record_len(read_u32(keys, at) as usize);
        if rec > keys.len() - at {
            return Err(bad(format!("key record at {at} runs past the key arena")));
        }
        let e = read_u32(keys, at + 4) as usize;
        if key_off(key_offs, e) != Some((at / 4) as u32) {
            return Err(bad(format!(
                "key record at {at} names entry {e}, whose key offset is elsewhere"
            )));
        }
        let key_end = at + 8 + read_u32(keys, at) as usize;
        if keys[key_end..at + rec].iter().any(|&b| b != 0) {
            return Err(bad(format!("key record at {at}: padding is not zero")));
        }
        records += 1;
        at += rec;
    }
    if records != n {
        return Err(bad(format!("{records} key records for {n} items")));
    }
    Ok(())
}

/// Entry `e`'s key slot, from the key offsets section.
#[inline]
fn key_off(key_offs: &[u8], e: usize) -> Option<u32> {
    let at = e.checked_mul(4)?;
    key_offs
        .get(at..at + 4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
}

/// Check 4 of docs/partition-image.md, after [`check_key_arena`] and with the index's occupied
/// places counted equal to the items: every key record is found at its own slot by a reader's
/// lookup. Returns the largest probe distance, the bound lookups then use.
pub(crate) fn check_index(index: Probe<'_>, keys: &[u8], key_offs: &[u8]) -> Result<usize> {
    // Every key offset now points at a record start (each record claimed its entry's offset).
    // Walking the arena in order keeps the key reads sequential; the buckets are prefetched a
    // group ahead, so the check costs about one overlapped cache miss per key (a plain lookup
    // per key was half of the load time). Each key is located at a distinct place (one slot per
    // place), so with `n` occupied places in all, the index holds exactly the keys and nothing
    // else.
    // A slot some place holds is compared as a key only if it is a record start (key offsets
    // all are now, each claimed by its record).
    let is_record = |slot: u32| {
        let s = slot as usize;
        s.checked_mul(4)
            .and_then(|x| x.checked_add(8))
            .is_some_and(|end| end <= keys.len())
            && key_off(key_offs, entry_at(keys, slot)) == Some(slot)
    };
    const AHEAD: usize = 16;
    let mut window = [(0u32, 0u64); AHEAD];
    let (mut at, mut max_probe) = (0usize, 0usize);
    while at < keys.len() {
        let mut len = 0;
        while len < AHEAD && at < keys.len() {
            let slot = (at / 4) as u32;
            let h = key_hash(key_at(keys, slot));
            index.prefetch(h);
            window[len] = (slot, h);
            len += 1;
            at += key_record_len(read_u32(keys, at) as usize);
        }
        for &(slot, h) in &window[..len] {
            let key = key_at(keys, slot);
            let d = index
                .locate(h, slot, |other| {
                    is_record(other) && key_at(keys, other) == key
                })
                .ok_or_else(|| {
                    bad(format!(
                        "key record at {} is not found at its slot through the index \
                         (missing, unreachable, or a duplicate key)",
                        slot as usize * 4
                    ))
                })?;
            max_probe = max_probe.max(d);
        }
    }
    Ok(max_probe)
}

/// Check 5 of docs/partition-image.md (bytes tables): the value arena is exactly `n` whole
/// records and the value offsets (`n` u64 LE) are a permutation of their starts. Returns the
/// offsets.
pub(crate) fn check_value_arena(vals: &[u8], value_offs: &[u8], n: usize) -> Result<Vec<u64>> {
    let offs: Vec<u64> = value_offs
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let mut starts = Vec::with_capacity(n);
    let mut at = 0usize;
    while at < vals.len() {
        if at + 4 > vals.len() {
            return Err(bad(format!("value record at {at} is cut off")));
        }
        let len = read_u32(vals, at) as usize;
        if len > vals.len() - at - 4 {
            return Err(bad(format!(
                "value record at {at} runs past the value arena"
            )));
        }
        starts.push(at as u64);
        at += 4 + len;
    }
    let mut sorted = offs.clone();
    sorted.sort_unstable();
    if sorted != starts {
        return Err(bad(
            "value offsets are not one per value record of the arena",
        ));
    }
    Ok(offs)
}

fn rebuild<'a>(
    h: &Header,
    sec: impl Fn(usize) -> &'a [u8],
    meter: &Arc<Budget>,
    ahead: usize,
) -> Result<PartData> {
    let n = h.items;
    check_key_arena(sec(KEYS), sec(KEY_OFFS), n)?;
    let mut index = Index::from_image(sec(INDEX)).map_err(bad)?;
    if index.len() != n {
        return Err(bad(format!(
            "index holds {} keys for {n} items",
            index.len()
        )));
    }
    let max_probe = check_index(index.probe(), sec(KEYS), sec(KEY_OFFS))?;
    index.set_max_probe(max_probe);
    let key_offs: Vec<u32> = sec(KEY_OFFS)
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let keys = sec(KEYS).to_vec();
    let vals = sec(VALUES);
    let col = match h.value_type {
        ValueType::I64 => Column::I64(
            vals.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ),
        ValueType::F64 => Column::F64(
            vals.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ),
        ValueType::F32Vec { dim } => Column::F32 {
            dim: dim as usize,
            data: vals
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        },
        ValueType::Bytes => {
            let offs = check_value_arena(vals, sec(VALUE_OFFS), n)?;
            Column::Bytes {
                arena: vals.to_vec(),
                offs,
                garbage: 0,
            }
        }
    };
    Ok(PartData::from_parts(
        keys,
        key_offs,
        index,
        col,
        meter.clone(),
        ahead,
    ))
}

/// Check an image completely (as [`read_image`] would before serving it) without keeping it.
/// For tools and the fuzz target; the rebuilt copy is charged to a budget of its own.
pub fn inspect(img: &[u8]) -> Result<ImageInfo> {
    let meter = Arc::new(Budget::new(usize::MAX));
    let d = read_image(img, None, &meter)?;
    Ok(ImageInfo {
        value_type: value_type_of(&d),
        items: d.len() as u64,
        bytes: img.len() as u64,
    })
}

/// Check an image and write it again from the rebuilt partition: a valid image must come back
/// byte for byte (the fuzz target's invariant). Returns the rebuilt image.
pub fn reencode(img: &[u8]) -> Result<Vec<u8>> {
    let meter = Arc::new(Budget::new(usize::MAX));
    let d = read_image(img, None, &meter)?;
    image_bytes(&d).map_err(|e| Error::Invalid(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::tables::ValueRef;

    const MAXK: usize = 1 << 16;
    const MAXV: usize = 1 << 20;

    /// A value of `t` made from `x` (so a model can hold it as bytes).
    pub(crate) fn value_of(t: ValueType, x: u64) -> Vec<u8> {
        match t {
            ValueType::I64 => (x as i64).wrapping_mul(-7).to_le_bytes().to_vec(),
            ValueType::F64 => (x as f64 * 0.5 - 3.0).to_le_bytes().to_vec(),
            ValueType::F32Vec { dim } => (0..dim)
                .flat_map(|i| (x as f32 + i as f32 * 0.25).to_le_bytes())
                .collect(),
            ValueType::Bytes => vec![x as u8; (x % 37) as usize],
        }
    }

    fn as_ref(t: ValueType, v: &[u8]) -> ValueRef<'_> {
        match t {
            ValueType::I64 => ValueRef::I64(i64::from_le_bytes(v.try_into().unwrap())),
            ValueType::F64 => ValueRef::F64(f64::from_le_bytes(v.try_into().unwrap())),
            ValueType::F32Vec { .. } => ValueRef::F32VecLe(v),
            ValueType::Bytes => ValueRef::Bytes(v),
        }
    }

    fn bytes_of(v: ValueRef<'_>) -> Vec<u8> {
        match v {
            ValueRef::I64(x) => x.to_le_bytes().to_vec(),
            ValueRef::F64(x) => x.to_le_bytes().to_vec(),
            ValueRef::F32Vec(x) => x.iter().flat_map(|f| f.to_le_bytes()).collect(),
            ValueRef::F32VecLe(b) | ValueRef::Bytes(b) => b.to_vec(),
        }
    }

    /// A frozen partition after `ops` random puts, overwrites and deletes over `keys` keys, and
    /// the model of what it must hold.
    pub(crate) fn build(
        t: ValueType,
        ops: usize,
        keys: u64,
        seed: u64,
        meter: &Arc<Budget>,
    ) -> (PartData, BTreeMap<Vec<u8>, Vec<u8>>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut d = PartData::new(t, meter.clone());
        let mut model = BTreeMap::new();
        for _ in 0..ops {
            let k = rng.gen_range(0..keys);
            let key = format!("key-{k}-{}", "x".repeat((k % 13) as usize)).into_bytes();
            if rng.gen_bool(0.25) {
                d.delete(&key, MAXK);
                model.remove(&key);
            } else {
                let v = value_of(t, rng.gen());
                assert_eq!(d.put(&key, as_ref(t, &v), MAXK, MAXV), crate::KeyStatus::Ok);
                model.insert(key, v);
            }
        }
        d.freeze();
        (d, model)
    }

    fn check_against(d: &PartData, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
        assert_eq!(d.len(), model.len());
        for (k, v) in model {
            let i = d.find(k, key_hash(k)).expect("key lost in the round trip");
            assert_eq!(d.key(i), &k[..]);
            assert_eq!(&bytes_of(d.value(i)), v, "value of {k:?}");
        }
        assert_eq!(d.find(b"absent", key_hash(b"absent")), None);
    }

    pub(crate) const TYPES: [ValueType; 6] = [
        ValueType::Bytes,
        ValueType::I64,
        ValueType::F64,
        ValueType::F32Vec { dim: 1 },
        ValueType::F32Vec { dim: 3 },
        ValueType::F32Vec { dim: 16 },
    ];

    #[test]
    fn round_trip_of_every_type_after_deletes_and_overwrites() {
        for (n, t) in TYPES.into_iter().enumerate() {
            for (ops, keys) in [(0, 1), (1, 1), (50, 20), (20_000, 4_000)] {
                let meter = Arc::new(Budget::new(1 << 30));
                let (d, model) = build(t, ops, keys, n as u64 * 31 + ops as u64, &meter);
                check_against(&d, &model);
                let img = image_bytes(&d).unwrap();
                let used = meter.used();
                let back = read_image(&img, Some(t), &meter).unwrap();
                check_against(&back, &model);
                assert_eq!(
                    meter.used() - used,
                    back.charged(),
                    "{t:?}: charged as allocated"
                );
                assert_eq!(
                    image_bytes(&back).unwrap(),
                    img,
                    "{t:?}: image not canonical"
                );
                let mut w = Vec::new();
                assert_eq!(write_image(&back, &mut w).unwrap(), img.len() as u64);
                drop(back);
                assert_eq!(
                    meter.used(),
                    used,
                    "{t:?}: a dropped image gave its charge back"
                );
                assert_eq!(inspect(&img).unwrap().items, model.len() as u64);
            }
        }
    }

    #[test]
    fn sections_are_aligned_and_the_header_is_as_documented() {
        let meter = Arc::new(Budget::new(1 << 30));
        let (d, _) = build(ValueType::Bytes, 300, 100, 5, &meter);
        let img = image_bytes(&d).unwrap();
        assert_eq!(&img[..8], b"RGPIMG\0\0");
        assert_eq!(u32_at(&img, 8), 1);
        assert_eq!(u64_at(&img, 24), d.len() as u64);
        assert_eq!(
            u64_at(&img, SECTIONS_AT),
            HEADER_LEN as u64,
            "index right after the header"
        );
        assert_eq!(HEADER_LEN % 64, 0);
        for i in 0..SECTIONS {
            assert_eq!(u64_at(&img, SECTIONS_AT + 24 * i) % 8, 0);
        }
        assert_eq!(img.len() % 8, 0);
    }

    #[test]
    fn a_type_other_than_the_tables_is_refused() {
        let meter = Arc::new(Budget::new(1 << 30));
        let (d, _) = build(ValueType::I64, 10, 10, 1, &meter);
        let img = image_bytes(&d).unwrap();
        let err = read_image(&img, Some(ValueType::F64), &meter).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::CorruptImage);
    }

    #[test]
    fn an_image_that_does_not_fit_the_budget_is_refused_and_charges_nothing() {
        let big = Arc::new(Budget::new(1 << 30));
        let (d, _) = build(ValueType::F64, 2_000, 1_000, 2, &big);
        let img = image_bytes(&d).unwrap();
        let small = Arc::new(Budget::new(img.len() / 2));
        assert_eq!(
            read_image(&img, None, &small).unwrap_err(),
            Error::OutOfMemory
        );
        assert_eq!(small.used(), 0);
    }

    #[test]
    fn every_single_byte_corruption_and_every_truncation_is_refused() {
        for t in [
            ValueType::Bytes,
            ValueType::I64,
            ValueType::F32Vec { dim: 2 },
        ] {
            let meter = Arc::new(Budget::new(1 << 30));
            let (d, _) = build(t, 40, 15, 9, &meter);
            let img = image_bytes(&d).unwrap();
            for at in 0..img.len() {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut bad = img.clone();
                    bad[at] ^= flip;
                    let err = read_image(&bad, None, &meter)
                        .expect_err(&format!("{t:?}: byte {at} ^ {flip:#x} accepted"));
                    assert_eq!(err.kind(), crate::ErrorKind::CorruptImage);
                }
            }
            for len in 0..img.len() {
                assert!(
                    read_image(&img[..len], None, &meter).is_err(),
                    "{t:?}: cut at {len}"
                );
            }
            let mut longer = img.clone();
            longer.extend_from_slice(&[0; 8]);
            assert!(
                read_image(&longer, None, &meter).is_err(),
                "trailing bytes accepted"
            );
            drop(d);
            assert_eq!(meter.used(), 0, "refused images left charges behind");
        }
    }

    /// Recompute every checksum, as a forger (or a bug on the writing side) would.
    pub(crate) fn reseal(img: &mut [u8]) {
        for i in 0..SECTIONS {
            let at = SECTIONS_AT + 24 * i;
            let (off, len) = (u64_at(img, at) as usize, u64_at(img, at + 8) as usize);
            // A damaged section table may point anywhere: leave that checksum as it is.
            if let Some(sec) = off.checked_add(len).and_then(|end| img.get(off..end)) {
                let sum = xxh3_64(sec);
                img[at + 16..at + 24].copy_from_slice(&sum.to_le_bytes());
            }
        }
        let sum = xxh3_64(&img[..HEADER_SUM_AT]);
        img[HEADER_SUM_AT..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn structural_damage_with_valid_checksums_never_yields_a_wrong_partition() {
        for t in [ValueType::Bytes, ValueType::I64] {
            let meter = Arc::new(Budget::new(1 << 30));
            let (d, model) = build(t, 200, 60, 4, &meter);
            let img = image_bytes(&d).unwrap();
            let values = u64_at(&img, SECTIONS_AT + 24 * VALUES) as usize;
            let (mut refused, mut kept) = (0, 0);
            for at in 0..img.len() {
                for flip in [0x01u8, 0x10, 0xff] {
                    let mut bad = img.clone();
                    bad[at] ^= flip;
                    reseal(&mut bad);
                    match read_image(&bad, None, &meter) {
                        Err(_) => refused += 1,
                        Ok(back) => {
                            kept += 1;
                            // Accepted: only a value byte or an unused index place changed,
                            // so every key is still there and found at its own entry.
                            let in_values = at >= values
                                && at
                                    < values + u64_at(&img, SECTIONS_AT + 24 * VALUES + 8) as usize;
                            assert_eq!(back.len(), model.len(), "byte {at}");
                            if !in_values {
                                check_against(&back, &model);
                            }
                        }
                    }
                }
            }
            assert!(refused > 0 && kept > 0, "{refused} refused, {kept} kept");
        }
    }

    #[test]
    fn a_missing_overflow_flag_is_refused() {
        // Enough keys in few buckets that some spill past their home bucket.
        let meter = Arc::new(Budget::new(1 << 30));
        let (d, _) = build(ValueType::I64, 5_000, 5_000, 3, &meter);
        let mut img = image_bytes(&d).unwrap();
        let buckets = u64_at(&img, 32) as usize;
        let flagged: Vec<usize> = (0..buckets)
            .filter(|b| img[HEADER_LEN + b * 64 + 60] == 1)
            .collect();
        assert!(
            !flagged.is_empty(),
            "no bucket spilled; make the test denser"
        );
        img[HEADER_LEN + flagged[0] * 64 + 60] = 0;
        reseal(&mut img);
        let err = read_image(&img, None, &meter).unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
    }

    /// Writes the fuzz target's seeds: `cargo test -p ramgrid-store --lib write_fuzz_seeds --
    /// --ignored` (to fuzz/seeds/partition_image/). Small images of each value type.
    #[test]
    #[ignore = "writes files; run by hand to refresh the fuzz seeds"]
    fn write_fuzz_seeds() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/seeds/partition_image"
        );
        std::fs::create_dir_all(dir).unwrap();
        let meter = Arc::new(Budget::new(1 << 30));
        for (n, t) in TYPES.into_iter().enumerate() {
            for (ops, keys) in [(0, 1), (12, 8), (60, 30)] {
                let (d, _) = build(t, ops, keys, n as u64, &meter);
                let img = image_bytes(&d).unwrap();
                assert!(
                    img.len() <= 4096,
                    "seeds stay under the fuzz runs' -max_len"
                );
                std::fs::write(format!("{dir}/type{n}-ops{ops}.img"), img).unwrap();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn proptest_round_trip(t in 0usize..TYPES.len(), ops in 0usize..400, keys in 1u64..100, seed: u64) {
            let t = TYPES[t];
            let meter = Arc::new(Budget::new(1 << 30));
            let (d, model) = build(t, ops, keys, seed, &meter);
            let img = image_bytes(&d).unwrap();
            let back = read_image(&img, Some(t), &meter).unwrap();
            check_against(&back, &model);
            prop_assert_eq!(image_bytes(&back).unwrap(), img);
        }

        #[test]
        fn proptest_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = inspect(&bytes);
        }
    }
}
