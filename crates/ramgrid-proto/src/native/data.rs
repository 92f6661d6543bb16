//! GET, PUT and DELETE: batches of keys grouped by partition, decoded as zero-copy views and
//! encoded by writers that append straight into the output buffer (no allocation per key).

use super::error::FrameError;
use super::frame::{Opcode, Pending, FLAG_RESPONSE};
use super::types::{check_key_statuses, KeyStatus, Status, ValueType, MAX_KEY_LEN};
use super::wire::{self, patch_u32, put_u16, put_u32, put_u64, put_u8, Reader};

// ---------------------------------------------------------------------------------------------
// Requests: decoding

/// A GET or DELETE body: which table, version and epoch, then keys grouped by partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyBatch<'a> {
    /// Table name.
    pub table: &'a str,
    /// Version to read or delete from; 0 = the table's current version.
    pub version: u32,
    /// The partition-map epoch the client routed the batch with.
    pub epoch: u64,
    /// The incarnation of the table the client means (0: any). A server refuses the batch with
    /// NO_SUCH_TABLE when its table of that name is another incarnation.
    pub incarnation: u64,
    /// The keys, by partition.
    pub groups: KeyGroups<'a>,
}

/// A GET request body.
pub type Get<'a> = KeyBatch<'a>;
/// A DELETE request body.
pub type Delete<'a> = KeyBatch<'a>;

impl<'a> KeyBatch<'a> {
    /// Decodes and fully validates a GET or DELETE body; the views it returns cannot fail later.
    pub fn decode(body: &'a [u8]) -> Result<KeyBatch<'a>, FrameError> {
        let mut r = Reader::new(body);
        let table = r.name("table name")?;
        let version = r.u32("version")?;
        let epoch = r.u64("epoch")?;
        let incarnation = r.u64("incarnation")?;
        let groups = KeyGroups::read(&mut r)?;
        r.finish()?;
        Ok(KeyBatch {
            table,
            version,
            epoch,
            incarnation,
            groups,
        })
    }

    /// Every key in request order, across groups.
    pub fn keys(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.groups.iter().flat_map(|g| g.keys)
    }

    /// Number of keys across all groups.
    pub fn key_count(&self) -> usize {
        self.groups.key_count()
    }

    pub(crate) fn write_body(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        put_u64(out, self.epoch);
        put_u64(out, self.incarnation);
        put_u32(out, self.groups.count);
        out.extend_from_slice(self.groups.raw);
        Ok(())
    }
}

/// The validated groups of a [`KeyBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyGroups<'a> {
    raw: &'a [u8],
    count: u32,
    keys: usize,
}

impl<'a> KeyGroups<'a> {
    fn read(r: &mut Reader<'a>) -> Result<KeyGroups<'a>, FrameError> {
        let count = r.u32("group count")?;
        let start = r.pos();
        let mut keys = 0usize;
        for _ in 0..count {
            r.u32("partition")?;
            keys += skip_keys(r)?;
        }
        Ok(KeyGroups {
            raw: r.slice(start, r.pos()),
            count,
            keys,
        })
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether there are no groups.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Number of keys across all groups.
    pub fn key_count(&self) -> usize {
        self.keys
    }

    /// The groups in request order.
    pub fn iter(&self) -> KeyGroupIter<'a> {
        KeyGroupIter {
            r: Reader::new(self.raw),
            left: self.count,
        }
    }
}

impl<'a> IntoIterator for KeyGroups<'a> {
    type Item = KeyGroup<'a>;
    type IntoIter = KeyGroupIter<'a>;
    fn into_iter(self) -> KeyGroupIter<'a> {
        self.iter()
    }
}

/// Reads a key count and skips that many keys, returning the count.
fn skip_keys(r: &mut Reader<'_>) -> Result<usize, FrameError> {
    let n = r.u32("key count")?;
    for _ in 0..n {
        r.bytes16("key")?;
    }
    Ok(n as usize)
}

/// Reads a key count and returns the keys' span as a [`Keys`] view.
pub(super) fn read_keys<'a>(r: &mut Reader<'a>) -> Result<Keys<'a>, FrameError> {
    let n = r.u32("key count")?;
    let start = r.pos();
    for _ in 0..n {
        r.bytes16("key")?;
    }
    Ok(Keys {
        r: Reader::new(r.slice(start, r.pos())),
        left: n,
    })
}

/// The keys of one partition in a [`KeyBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyGroup<'a> {
    /// The partition every key of the group belongs to (as the client computed it).
    pub partition: u32,
    /// The keys, in request order.
    pub keys: Keys<'a>,
}

/// Iterator over the groups of a [`KeyBatch`].
#[derive(Debug, Clone)]
pub struct KeyGroupIter<'a> {
    r: Reader<'a>,
    left: u32,
}

impl<'a> Iterator for KeyGroupIter<'a> {
    type Item = KeyGroup<'a>;
    fn next(&mut self) -> Option<KeyGroup<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated at decode time; an error here would mean a codec bug, and ends the iteration.
        let partition = self.r.u32("partition").ok()?;
        let keys = read_keys(&mut self.r).ok()?;
        Some(KeyGroup { partition, keys })
    }
}

/// Zero-copy iterator over validated keys (u16 length + bytes each).
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    r: Reader<'a>,
    left: u32,
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.left == other.left && self.r.rest() == other.r.rest()
    }
}
impl Eq for Keys<'_> {}

impl<'a> Keys<'a> {
    /// The keys not read yet, in their wire form (u16 length + bytes each).
    pub fn raw(&self) -> &'a [u8] {
        self.r.rest()
    }
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.r.bytes16("key").ok()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Keys<'_> {}

/// How a PUT stores a value whose key is already there (section 7.3 of the spec: the optional
/// merge byte after the groups). Only numeric tables (i64, f64) take a merge other than `Store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Merge {
    /// Overwrite (the byte is absent, as every client before merges sends it).
    #[default]
    Store = 0,
    /// Store the sum of the old value and the new one (a missing key counts as 0).
    Add = 1,
    /// Store the smaller of the two (a missing key takes the new value).
    Min = 2,
    /// Store the larger of the two (a missing key takes the new value).
    Max = 3,
}

impl Merge {
    /// The merge whose wire byte is `b`, if any.
    pub fn from_u8(b: u8) -> Option<Merge> {
        Some(match b {
            0 => Merge::Store,
            1 => Merge::Add,
            2 => Merge::Min,
            3 => Merge::Max,
            _ => return None,
        })
    }

    /// The spec's name: "store", "add", "min", "max".
    pub fn name(self) -> &'static str {
        match self {
            Merge::Store => "store",
            Merge::Add => "add",
            Merge::Min => "min",
            Merge::Max => "max",
        }
    }
}

/// A PUT body: table, version, epoch, the value type the values are packed as, then groups of
/// keys with their values, then an optional merge byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Put<'a> {
    /// Table name.
    pub table: &'a str,
    /// Version to write; 0 = the current version (usually sealed, so refused).
    pub version: u32,
    /// The partition-map epoch the client routed the batch with.
    pub epoch: u64,
    /// The incarnation of the table the client means (0: any); see [`KeyBatch::incarnation`].
    pub incarnation: u64,
    /// How the values are packed; a server answers [`KeyStatus::WrongType`] per key when it is
    /// not the table's.
    pub value_type: ValueType,
    /// Keys and values, by partition.
    pub groups: PutGroups<'a>,
    /// How each value combines with the one stored (absent on the wire: [`Merge::Store`]).
    pub merge: Merge,
}

impl<'a> Put<'a> {
    /// Decodes and fully validates a PUT body.
    pub fn decode(body: &'a [u8]) -> Result<Put<'a>, FrameError> {
        let mut r = Reader::new(body);
        let table = r.name("table name")?;
        let version = r.u32("version")?;
        let epoch = r.u64("epoch")?;
        let incarnation = r.u64("incarnation")?;
        let value_type = r.value_type()?;
        let count = r.u32("group count")?;
        let start = r.pos();
        let mut keys = 0usize;
        for _ in 0..count {
            r.u32("partition")?;
            let k = read_keys(&mut r)?;
            keys += k.len();
            read_values(&mut r, value_type, k.left)?;
        }
        let raw = r.slice(start, r.pos());
        // The merge byte is optional, so frames of clients that predate it decode as before.
        let merge = if r.remaining() > 0 {
            let b = r.u8("merge")?;
            match Merge::from_u8(b) {
                Some(Merge::Store) => {
                    return Err(FrameError::Malformed("merge byte 0 is sent absent"))
                }
                Some(m) => m,
                None => return Err(FrameError::Malformed("unknown merge")),
            }
        } else {
            Merge::Store
        };
        r.finish()?;
        let groups = PutGroups {
            raw,
            count,
            keys,
            value_type,
        };
        Ok(Put {
            table,
            version,
            epoch,
            incarnation,
            value_type,
            groups,
            merge,
        })
    }

    /// Number of keys across all groups.
    pub fn key_count(&self) -> usize {
        self.groups.keys
    }

    /// Every (key, value) pair in request order; values are raw wire bytes (LE numbers for
    /// numeric types).
    pub fn pairs(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.groups.iter().flat_map(|g| g.keys.zip(g.values))
    }

    pub(crate) fn write_body(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        put_u64(out, self.epoch);
        put_u64(out, self.incarnation);
        wire::put_value_type(out, self.value_type)?;
        put_u32(out, self.groups.count);
        out.extend_from_slice(self.groups.raw);
        if self.merge != Merge::Store {
            put_u8(out, self.merge as u8);
        }
        Ok(())
    }
}

pub(super) fn read_values<'a>(
    r: &mut Reader<'a>,
    vt: ValueType,
    n: u32,
) -> Result<Values<'a>, FrameError> {
    let start = r.pos();
    match vt.width() {
        Some(w) => {
            let len = (n as usize)
                .checked_mul(w)
                .ok_or(FrameError::Truncated("values"))?;
            r.take(len, "values")?;
        }
        None => {
            for _ in 0..n {
                r.bytes32("value")?;
            }
        }
    }
    Ok(Values {
        r: Reader::new(r.slice(start, r.pos())),
        left: n,
        width: vt.width(),
    })
}

/// The validated groups of a [`Put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutGroups<'a> {
    raw: &'a [u8],
    count: u32,
    keys: usize,
    value_type: ValueType,
}

impl<'a> PutGroups<'a> {
    /// Number of groups.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether there are no groups.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The groups in request order.
    pub fn iter(&self) -> PutGroupIter<'a> {
        PutGroupIter {
            r: Reader::new(self.raw),
            left: self.count,
            value_type: self.value_type,
        }
    }
}

impl<'a> IntoIterator for PutGroups<'a> {
    type Item = PutGroup<'a>;
    type IntoIter = PutGroupIter<'a>;
    fn into_iter(self) -> PutGroupIter<'a> {
        self.iter()
    }
}

/// One partition's keys and values in a [`Put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutGroup<'a> {
    /// The partition every key of the group belongs to.
    pub partition: u32,
    /// The keys, in request order.
    pub keys: Keys<'a>,
    /// One value per key, in the same order.
    pub values: Values<'a>,
}

/// Iterator over the groups of a [`Put`].
#[derive(Debug, Clone)]
pub struct PutGroupIter<'a> {
    r: Reader<'a>,
    left: u32,
    value_type: ValueType,
}

impl<'a> Iterator for PutGroupIter<'a> {
    type Item = PutGroup<'a>;
    fn next(&mut self) -> Option<PutGroup<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let partition = self.r.u32("partition").ok()?;
        let keys = read_keys(&mut self.r).ok()?;
        let values = read_values(&mut self.r, self.value_type, keys.left).ok()?;
        Some(PutGroup {
            partition,
            keys,
            values,
        })
    }
}

/// Zero-copy iterator over validated values: fixed-width slices for numeric types, the bytes
/// after each u32 length for [`ValueType::Bytes`].
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    r: Reader<'a>,
    left: u32,
    width: Option<usize>,
}

impl PartialEq for Values<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.left == other.left && self.width == other.width && self.r.rest() == other.r.rest()
    }
}
impl Eq for Values<'_> {}

impl<'a> Values<'a> {
    /// For fixed-width types, all remaining values as one packed little-endian array.
    pub fn packed(&self) -> Option<&'a [u8]> {
        self.width.map(|_| self.r.rest())
    }

    /// The values not read yet, in their wire form (packed, or u32 length + bytes each).
    pub fn raw(&self) -> &'a [u8] {
        self.r.rest()
    }
}

impl<'a> Iterator for Values<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match self.width {
            Some(w) => self.r.take(w, "value").ok(),
            None => self.r.bytes32("value").ok(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Values<'_> {}

// ---------------------------------------------------------------------------------------------
// Requests: encoding

/// Appends a GET or DELETE request frame, one group at a time, with no allocation per key.
/// Dropping the writer before [`KeyBatchWriter::finish`] removes the partial frame.
#[derive(Debug)]
pub struct KeyBatchWriter<'o> {
    p: Pending<'o>,
    groups_at: usize,
    groups: u32,
}

impl<'o> KeyBatchWriter<'o> {
    /// Starts a frame; `opcode` must be [`Opcode::Get`] or [`Opcode::Delete`].
    pub fn begin(
        out: &'o mut Vec<u8>,
        opcode: Opcode,
        request_id: u64,
        table: &str,
        version: u32,
        epoch: u64,
    ) -> Result<KeyBatchWriter<'o>, FrameError> {
        if !matches!(opcode, Opcode::Get | Opcode::Delete) {
            return Err(FrameError::Encode("key batch opcode must be GET or DELETE"));
        }
        let p = Pending::begin(out, opcode, 0, request_id);
        wire::put_name(p.out, table, "table name")?;
        put_u32(p.out, version);
        put_u64(p.out, epoch);
        put_u64(p.out, 0);
        let groups_at = p.out.len();
        put_u32(p.out, 0);
        Ok(KeyBatchWriter {
            p,
            groups_at,
            groups: 0,
        })
    }

    /// Names the table incarnation the batch is meant for (written as 0, "any", by `begin`).
    pub fn set_incarnation(&mut self, incarnation: u64) {
        let at = self.groups_at - 8;
        self.p.out[at..at + 8].copy_from_slice(&incarnation.to_le_bytes());
    }

    /// Appends one partition's keys and returns how many there were. On error (a key over
    /// [`MAX_KEY_LEN`]) the group is left out and the writer can go on.
    pub fn group<I>(&mut self, partition: u32, keys: I) -> Result<usize, FrameError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let n = put_group_keys(self.p.out, partition, keys)?;
        self.groups = self
            .groups
            .checked_add(1)
            .ok_or(FrameError::Encode("group count"))?;
        Ok(n)
    }

    /// Completes the frame.
    pub fn finish(self) -> Result<(), FrameError> {
        patch_u32(self.p.out, self.groups_at, self.groups);
        self.p.finish()
    }
}

/// Writes `partition`, the key count and the keys; on error truncates back to where it started.
fn put_group_keys<I>(out: &mut Vec<u8>, partition: u32, keys: I) -> Result<usize, FrameError>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let start = out.len();
    put_u32(out, partition);
    let count_at = out.len();
    put_u32(out, 0);
    let mut n: u32 = 0;
    for k in keys {
        let k = k.as_ref();
        if k.len() > MAX_KEY_LEN || n == u32::MAX {
            out.truncate(start);
            return Err(FrameError::Encode("key over 65535 bytes"));
        }
        put_u16(out, k.len() as u16);
        out.extend_from_slice(k);
        n += 1;
    }
    patch_u32(out, count_at, n);
    Ok(n as usize)
}

/// Appends a whole GET request: `groups` yields (partition, keys).
pub fn encode_get<G, K>(
    out: &mut Vec<u8>,
    request_id: u64,
    table: &str,
    version: u32,
    epoch: u64,
    groups: G,
) -> Result<(), FrameError>
where
    G: IntoIterator<Item = (u32, K)>,
    K: IntoIterator,
    K::Item: AsRef<[u8]>,
{
    encode_key_batch(out, Opcode::Get, request_id, table, version, epoch, groups)
}

/// Appends a whole DELETE request: `groups` yields (partition, keys).
pub fn encode_delete<G, K>(
    out: &mut Vec<u8>,
    request_id: u64,
    table: &str,
    version: u32,
    epoch: u64,
    groups: G,
) -> Result<(), FrameError>
where
    G: IntoIterator<Item = (u32, K)>,
    K: IntoIterator,
    K::Item: AsRef<[u8]>,
{
    encode_key_batch(
        out,
        Opcode::Delete,
        request_id,
        table,
        version,
        epoch,
        groups,
    )
}

fn encode_key_batch<G, K>(
    out: &mut Vec<u8>,
    opcode: Opcode,
    request_id: u64,
    table: &str,
    version: u32,
    epoch: u64,
    groups: G,
) -> Result<(), FrameError>
where
    G: IntoIterator<Item = (u32, K)>,
    K: IntoIterator,
    K::Item: AsRef<[u8]>,
{
    let mut w = KeyBatchWriter::begin(out, opcode, request_id, table, version, epoch)?;
    for (partition, keys) in groups {
        w.group(partition, keys)?;
    }
    w.finish()
}

/// Appends a PUT request frame, one group at a time, with no allocation per key. Dropping the
/// writer before [`PutWriter::finish`] removes the partial frame.
#[derive(Debug)]
pub struct PutWriter<'o> {
    p: Pending<'o>,
    groups_at: usize,
    groups: u32,
    value_type: ValueType,
    merge: Merge,
}

impl<'o> PutWriter<'o> {
    /// Starts a PUT frame whose values are packed as `value_type`.
    pub fn begin(
        out: &'o mut Vec<u8>,
        request_id: u64,
        table: &str,
        version: u32,
        epoch: u64,
        value_type: ValueType,
    ) -> Result<PutWriter<'o>, FrameError> {
        let p = Pending::begin(out, Opcode::Put, 0, request_id);
        wire::put_name(p.out, table, "table name")?;
        put_u32(p.out, version);
        put_u64(p.out, epoch);
        put_u64(p.out, 0);
        wire::put_value_type(p.out, value_type)?;
        let groups_at = p.out.len();
        put_u32(p.out, 0);
        Ok(PutWriter {
            p,
            groups_at,
            groups: 0,
            value_type,
            merge: Merge::Store,
        })
    }

    /// Names the table incarnation the batch is meant for (written as 0, "any", by `begin`).
    pub fn set_incarnation(&mut self, incarnation: u64) {
        // The head ends: epoch, incarnation, value type (kind u8 + dim u32), then the group count.
        let at = self.groups_at - 5 - 8;
        self.p.out[at..at + 8].copy_from_slice(&incarnation.to_le_bytes());
    }

    fn count_group(&mut self) -> Result<(), FrameError> {
        self.groups = self
            .groups
            .checked_add(1)
            .ok_or(FrameError::Encode("group count"))?;
        Ok(())
    }

    /// Appends one partition of a [`ValueType::Bytes`] table: `values` must yield one value per key.
    /// On error the group is left out and the writer can go on.
    pub fn group_bytes<K, V>(
        &mut self,
        partition: u32,
        keys: K,
        values: V,
    ) -> Result<usize, FrameError>
    where
        K: IntoIterator,
        K::Item: AsRef<[u8]>,
        V: IntoIterator,
        V::Item: AsRef<[u8]>,
    {
        if self.value_type != ValueType::Bytes {
            return Err(FrameError::Encode("bytes values for a numeric value type"));
        }
        let out = &mut *self.p.out;
        let start = out.len();
        let n = put_group_keys(out, partition, keys)?;
        let mut m = 0usize;
        for v in values {
            let v = v.as_ref();
            if m == n || wire::put_bytes32(out, v, "value over 4 GiB").is_err() {
                out.truncate(start);
                return Err(FrameError::Encode(
                    "values do not match keys (count or size)",
                ));
            }
            m += 1;
        }
        if m != n {
            out.truncate(start);
            return Err(FrameError::Encode("fewer values than keys"));
        }
        self.count_group()?;
        Ok(n)
    }

    /// Appends one partition of a fixed-width table: `packed` holds one value per key, already in
    /// wire form (little-endian, `width` bytes each), e.g. straight from a numpy array.
    pub fn group_packed<K>(
        &mut self,
        partition: u32,
        keys: K,
        packed: &[u8],
    ) -> Result<usize, FrameError>
    where
        K: IntoIterator,
        K::Item: AsRef<[u8]>,
    {
        let Some(width) = self.value_type.width() else {
            return Err(FrameError::Encode("packed values for a bytes value type"));
        };
        let out = &mut *self.p.out;
        let start = out.len();
        let n = put_group_keys(out, partition, keys)?;
        if n.checked_mul(width) != Some(packed.len()) {
            out.truncate(start);
            return Err(FrameError::Encode("packed values do not match keys"));
        }
        out.extend_from_slice(packed);
        self.count_group()?;
        Ok(n)
    }

    fn group_numeric<K, const W: usize>(
        &mut self,
        partition: u32,
        keys: K,
        expect: ValueType,
        len: usize,
        mut put: impl FnMut(&mut Vec<u8>, usize),
    ) -> Result<usize, FrameError>
    where
        K: IntoIterator,
        K::Item: AsRef<[u8]>,
    {
        if std::mem::discriminant(&self.value_type) != std::mem::discriminant(&expect) {
            return Err(FrameError::Encode("values do not match the value type"));
        }
        let width = self.value_type.width().unwrap_or(W);
        let out = &mut *self.p.out;
        let start = out.len();
        let n = put_group_keys(out, partition, keys)?;
        if n.checked_mul(width) != Some(len * W) {
            out.truncate(start);
            return Err(FrameError::Encode("values do not match keys"));
        }
        out.reserve(len * W);
        for i in 0..len {
            put(out, i);
        }
        self.count_group()?;
        Ok(n)
    }

    /// Appends one partition of an i64 table.
    pub fn group_i64<K>(
        &mut self,
        partition: u32,
        keys: K,
        values: &[i64],
    ) -> Result<usize, FrameError>
    where
        K: IntoIterator,
        K::Item: AsRef<[u8]>,
    {
        self.group_numeric::<K, 8>(partition, keys, ValueType::I64, values.len(), |o, i| {
            o.extend_from_slice(&values[i].to_le_bytes())
        })
    }

    /// Appends one partition of an f64 table.
    pub fn group_f64<K>(
        &mut self,
        partition: u32,
        keys: K,
        values: &[f64],
    ) -> Result<usize, FrameError>
    where
        K: IntoIterator,
        K::Item: AsRef<[u8]>,
    {
        self.group_numeric::<K, 8>(partition, keys, ValueType::F64, values.len(), |o, i| {
            o.extend_from_slice(&values[i].to_le_bytes())
        })
    }

    /// Appends one partition of an f32-vector table: `values` holds `dim` floats per key, row-major.
    pub fn group_f32<K>(
        &mut self,
        partition: u32,
        keys: K,
        values: &[f32],
    ) -> Result<usize, FrameError>
    where
        K: IntoIterator,
        K::Item: AsRef<[u8]>,
    {
        self.group_numeric::<K, 4>(
            partition,
            keys,
            ValueType::F32Vec(1),
            values.len(),
            |o, i| o.extend_from_slice(&values[i].to_le_bytes()),
        )
    }

    /// Asks the server to merge each value with the stored one (written by `finish`; numeric
    /// tables only, which the server checks).
    pub fn set_merge(&mut self, merge: Merge) {
        self.merge = merge;
    }

    /// Completes the frame.
    pub fn finish(self) -> Result<(), FrameError> {
        patch_u32(self.p.out, self.groups_at, self.groups);
        if self.merge != Merge::Store {
            put_u8(self.p.out, self.merge as u8);
        }
        self.p.finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Responses

/// The OK payload of a GET response: the version read, the value type, one status per key in
/// request order, and the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetReply<'a> {
    /// The version actually read (the current one resolved when the request said 0).
    pub version: u32,
    /// How the values are packed.
    pub value_type: ValueType,
    statuses: &'a [u8],
    values: &'a [u8],
}

impl<'a> GetReply<'a> {
    /// Decodes and validates the payload after the status byte.
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<GetReply<'a>, FrameError> {
        let version = r.u32("version")?;
        let value_type = r.value_type()?;
        let n = r.u32("key count")? as usize;
        let statuses = r.take(n, "key statuses")?;
        check_key_statuses(statuses)?;
        let start = r.pos();
        match value_type.width() {
            Some(w) => {
                r.take(
                    n.checked_mul(w).ok_or(FrameError::Truncated("values"))?,
                    "values",
                )?;
            }
            None => {
                for _ in statuses.iter().filter(|&&s| s == KeyStatus::Ok as u8) {
                    r.bytes32("value")?;
                }
            }
        }
        let values = r.slice(start, r.pos());
        Ok(GetReply {
            version,
            value_type,
            statuses,
            values,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u32(out, self.version);
        wire::put_value_type(out, self.value_type)?;
        let n = u32::try_from(self.statuses.len()).map_err(|_| FrameError::Encode("key count"))?;
        put_u32(out, n);
        out.extend_from_slice(self.statuses);
        out.extend_from_slice(self.values);
        Ok(())
    }

    /// Number of keys answered.
    pub fn len(&self) -> usize {
        self.statuses.len()
    }

    /// Whether no keys were answered.
    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    /// One status byte per key ([`KeyStatus`] values), for handing to numpy as is.
    pub fn statuses(&self) -> &'a [u8] {
        self.statuses
    }

    /// For fixed-width types, every key's value packed little-endian (zeros for misses).
    pub fn packed_values(&self) -> Option<&'a [u8]> {
        self.value_type.width().map(|_| self.values)
    }

    /// The raw value section (packed values, or u32 length + bytes for each hit).
    pub fn raw_values(&self) -> &'a [u8] {
        self.values
    }

    /// Each key's status and, for hits, its value bytes.
    pub fn iter(&self) -> GetReplyIter<'a> {
        GetReplyIter {
            statuses: self.statuses.iter(),
            values: Reader::new(self.values),
            width: self.value_type.width(),
        }
    }
}

/// Iterator over a [`GetReply`]: (status, value for hits).
#[derive(Debug, Clone)]
pub struct GetReplyIter<'a> {
    statuses: std::slice::Iter<'a, u8>,
    values: Reader<'a>,
    width: Option<usize>,
}

impl<'a> Iterator for GetReplyIter<'a> {
    type Item = (KeyStatus, Option<&'a [u8]>);
    fn next(&mut self) -> Option<Self::Item> {
        let status = KeyStatus::from_u8(*self.statuses.next()?)?;
        let value = match (self.width, status) {
            (Some(w), KeyStatus::Ok) => Some(self.values.take(w, "value").ok()?),
            (Some(w), _) => {
                self.values.take(w, "value").ok()?;
                None
            }
            (None, KeyStatus::Ok) => Some(self.values.bytes32("value").ok()?),
            (None, _) => None,
        };
        Some((status, value))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.statuses.size_hint()
    }
}

impl ExactSizeIterator for GetReplyIter<'_> {}

/// Appends a GET response (status OK) key by key, in request order, with no allocation per key.
/// Dropping the writer before [`GetReplyWriter::finish`] removes the partial frame.
#[derive(Debug)]
pub struct GetReplyWriter<'o> {
    p: Pending<'o>,
    statuses_at: usize,
    n: usize,
    i: usize,
    width: Option<usize>,
}

/// Checks `statuses` and `values` against the 7.2 layout for values of `width` bytes (None: bytes).
fn check_packed(width: Option<usize>, statuses: &[u8], values: &[u8]) -> Result<(), FrameError> {
    check_key_statuses(statuses).map_err(|_| FrameError::Encode("key status"))?;
    let ok = KeyStatus::Ok as u8;
    match width {
        Some(w) => {
            if statuses.len().checked_mul(w) != Some(values.len()) {
                return Err(FrameError::Encode("value width"));
            }
            let stray = w > 0
                && statuses
                    .iter()
                    .zip(values.chunks_exact(w))
                    .any(|(&s, v)| s != ok && v.iter().any(|&b| b != 0));
            if stray {
                return Err(FrameError::Encode("value of a key that is not OK"));
            }
        }
        None => {
            let mut at = 0usize;
            for _ in statuses.iter().filter(|&&s| s == ok) {
                let len = values
                    .get(at..at + 4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or(FrameError::Encode("values do not match the statuses"))?;
                at = at + 4 + len;
            }
            if at != values.len() {
                return Err(FrameError::Encode("values do not match the statuses"));
            }
        }
    }
    Ok(())
}

impl<'o> GetReplyWriter<'o> {
    /// Starts the response to GET `request_id`, which will answer exactly `n` keys.
    pub fn begin(
        out: &'o mut Vec<u8>,
        request_id: u64,
        version: u32,
        value_type: ValueType,
        n: usize,
    ) -> Result<GetReplyWriter<'o>, FrameError> {
        let count = u32::try_from(n).map_err(|_| FrameError::Encode("key count"))?;
        let p = Pending::begin(out, Opcode::Get, FLAG_RESPONSE, request_id);
        put_u8(p.out, Status::Ok as u8);
        put_u32(p.out, version);
        wire::put_value_type(p.out, value_type)?;
        put_u32(p.out, count);
        let statuses_at = p.out.len();
        p.out.resize(statuses_at + n, KeyStatus::NotFound as u8);
        if let Some(w) = value_type.width() {
            p.out.reserve(n.saturating_mul(w));
        }
        Ok(GetReplyWriter {
            p,
            statuses_at,
            n,
            i: 0,
            width: value_type.width(),
        })
    }

    /// Answers the next key with its value (exactly `width` bytes for fixed-width types).
    pub fn push_hit(&mut self, value: &[u8]) -> Result<(), FrameError> {
        if self.i == self.n {
            return Err(FrameError::Encode("more answers than keys"));
        }
        match self.width {
            Some(w) if value.len() != w => return Err(FrameError::Encode("value width")),
            Some(_) => self.p.out.extend_from_slice(value),
            None => wire::put_bytes32(self.p.out, value, "value over 4 GiB")?,
        }
        self.p.out[self.statuses_at + self.i] = KeyStatus::Ok as u8;
        self.i += 1;
        Ok(())
    }

    /// Answers the next key with a non-OK status (a miss is [`KeyStatus::NotFound`]).
    pub fn push_status(&mut self, status: KeyStatus) -> Result<(), FrameError> {
        if self.i == self.n {
            return Err(FrameError::Encode("more answers than keys"));
        }
        if status == KeyStatus::Ok {
            return Err(FrameError::Encode("a hit needs a value: use push_hit"));
        }
        if let Some(w) = self.width {
            let len = self.p.out.len();
            self.p.out.resize(len + w, 0);
        }
        self.p.out[self.statuses_at + self.i] = status as u8;
        self.i += 1;
        Ok(())
    }

    /// Answers the next key as a miss.
    pub fn push_miss(&mut self) -> Result<(), FrameError> {
        self.push_status(KeyStatus::NotFound)
    }

    /// Answers the next `statuses.len()` keys at once, from buffers already in the 7.2 layout:
    /// one [`KeyStatus`] byte per key, and `values` holding `width` bytes per key (all zero unless
    /// the key is OK) for fixed-width types, or `u32 LE length + bytes` per OK key for bytes. This
    /// is what a store's batch lookup produces, so a server copies two slices instead of pushing
    /// key by key. Both buffers are checked whole first: on error nothing was written.
    pub fn push_packed(&mut self, statuses: &[u8], values: &[u8]) -> Result<(), FrameError> {
        if statuses.len() > self.n - self.i {
            return Err(FrameError::Encode("more answers than keys"));
        }
        check_packed(self.width, statuses, values)?;
        let at = self.statuses_at + self.i;
        self.p.out[at..at + statuses.len()].copy_from_slice(statuses);
        self.p.out.extend_from_slice(values);
        self.i += statuses.len();
        Ok(())
    }

    /// Answers every remaining key at once, like [`GetReplyWriter::push_packed`], but `fill`
    /// appends the values straight into the frame instead of into a buffer of its own: a large
    /// reply is held once, not twice. `fill(statuses, frame)` must append one status byte per
    /// remaining key to `statuses` (cleared first) and their values in the 7.2 layout to `frame`.
    /// If `fill` fails, or what it wrote does not check, the frame is left as it was.
    pub fn fill_packed<E>(
        &mut self,
        statuses: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Result<(), E>, FrameError> {
        let values_at = self.p.out.len();
        statuses.clear();
        if let Err(e) = fill(statuses, self.p.out) {
            self.p.out.truncate(values_at);
            return Ok(Err(e));
        }
        let checked = if statuses.len() != self.n - self.i {
            Err(FrameError::Encode("answers do not match the keys"))
        } else {
            check_packed(self.width, statuses, &self.p.out[values_at..])
        };
        if let Err(e) = checked {
            self.p.out.truncate(values_at);
            return Err(e);
        }
        let at = self.statuses_at + self.i;
        self.p.out[at..at + statuses.len()].copy_from_slice(statuses);
        self.i += statuses.len();
        Ok(Ok(()))
    }

    /// Completes the frame; every key must have been answered.
    pub fn finish(self) -> Result<(), FrameError> {
        if self.i != self.n {
            return Err(FrameError::Encode("fewer answers than keys"));
        }
        self.p.finish()
    }
}

/// The OK payload of a PUT or DELETE response: one status per key, in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyStatuses<'a> {
    raw: &'a [u8],
}

impl<'a> KeyStatuses<'a> {
    /// Wraps a status array (one [`KeyStatus`] byte per key), checking every byte.
    pub fn new(raw: &'a [u8]) -> Result<KeyStatuses<'a>, FrameError> {
        check_key_statuses(raw)?;
        Ok(KeyStatuses { raw })
    }

    pub(crate) fn read(r: &mut Reader<'a>) -> Result<KeyStatuses<'a>, FrameError> {
        let n = r.u32("key count")? as usize;
        KeyStatuses::new(r.take(n, "key statuses")?)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let n = u32::try_from(self.raw.len()).map_err(|_| FrameError::Encode("key count"))?;
        put_u32(out, n);
        out.extend_from_slice(self.raw);
        Ok(())
    }

    /// The raw status bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.raw
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The statuses in request order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = KeyStatus> + 'a {
        // Every byte was checked on construction.
        self.raw
            .iter()
            .map(|&b| KeyStatus::from_u8(b).unwrap_or(KeyStatus::NotFound))
    }
}

/// Appends a PUT or DELETE response (status OK) one key status at a time.
/// Dropping the writer before [`KeyStatusWriter::finish`] removes the partial frame.
#[derive(Debug)]
pub struct KeyStatusWriter<'o> {
    p: Pending<'o>,
    left: usize,
}

impl<'o> KeyStatusWriter<'o> {
    /// Starts the response to PUT or DELETE `request_id`, which will answer exactly `n` keys.
    pub fn begin(
        out: &'o mut Vec<u8>,
        opcode: Opcode,
        request_id: u64,
        n: usize,
    ) -> Result<KeyStatusWriter<'o>, FrameError> {
        if !matches!(opcode, Opcode::Put | Opcode::Delete) {
            return Err(FrameError::Encode(
                "key status reply opcode must be PUT or DELETE",
            ));
        }
        let count = u32::try_from(n).map_err(|_| FrameError::Encode("key count"))?;
        let p = Pending::begin(out, opcode, FLAG_RESPONSE, request_id);
        put_u8(p.out, Status::Ok as u8);
        put_u32(p.out, count);
        p.out.reserve(n);
        Ok(KeyStatusWriter { p, left: n })
    }

    /// Answers the next key.
    pub fn push(&mut self, status: KeyStatus) -> Result<(), FrameError> {
        if self.left == 0 {
            return Err(FrameError::Encode("more answers than keys"));
        }
        self.left -= 1;
        put_u8(self.p.out, status as u8);
        Ok(())
    }

    /// Completes the frame; every key must have been answered.
    pub fn finish(self) -> Result<(), FrameError> {
        if self.left != 0 {
            return Err(FrameError::Encode("fewer answers than keys"));
        }
        self.p.finish()
    }
}

#[cfg(test)]
mod push_packed_tests {
    use super::super::frame::parse_frame;
    use super::super::message::Response;
    use super::*;

    /// The reply built key by key, for comparison.
    fn one_by_one(vt: ValueType, answers: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = GetReplyWriter::begin(&mut out, 9, 3, vt, answers.len()).unwrap();
        for a in answers {
            match a {
                Some(v) => w.push_hit(v).unwrap(),
                None => w.push_status(KeyStatus::KeyTooLarge).unwrap(),
            }
        }
        w.finish().unwrap();
        out
    }

    #[test]
    fn push_packed_writes_what_pushing_key_by_key_writes() {
        let (a, b) = (1.5f64.to_le_bytes(), (-2.0f64).to_le_bytes());
        let want = one_by_one(ValueType::F64, &[Some(&a), None, Some(&b)]);
        let mut values = a.to_vec();
        values.extend_from_slice(&[0; 8]);
        values.extend_from_slice(&b);
        let mut out = Vec::new();
        let mut w = GetReplyWriter::begin(&mut out, 9, 3, ValueType::F64, 3).unwrap();
        // In two calls, to show the answers follow on from each other.
        w.push_packed(&[0, 2], &values[..16]).unwrap();
        w.push_packed(&[0], &values[16..]).unwrap();
        w.finish().unwrap();
        assert_eq!(out, want);

        let want = one_by_one(ValueType::Bytes, &[Some(b"xy"), None, Some(b"")]);
        let mut out = Vec::new();
        let mut w = GetReplyWriter::begin(&mut out, 9, 3, ValueType::Bytes, 3).unwrap();
        w.push_packed(&[0, 2, 0], b"\x02\0\0\0xy\0\0\0\0").unwrap();
        w.finish().unwrap();
        assert_eq!(out, want);
        let (f, _) = parse_frame(&out, 1 << 20).unwrap();
        let Response::Get(reply) = Response::decode(&f).unwrap() else {
            panic!("not a get reply")
        };
        assert_eq!(reply.len(), 3);
    }

    #[test]
    fn push_packed_refuses_inconsistent_buffers_and_writes_nothing() {
        let mut out = b"prior".to_vec();
        {
            let mut w = GetReplyWriter::begin(&mut out, 1, 1, ValueType::I64, 2).unwrap();
            let snapshot = w.p.out.clone();
            let mut miss_with_value = [0u8; 16];
            miss_with_value[8] = 1;
            for (st, vals) in [
                (&[0u8, 0, 0][..], &[0u8; 24][..]), // more answers than keys
                (&[0, 6][..], &[0; 16][..]),        // no such status
                (&[0, 1][..], &[0; 15][..]),        // short values
                (&[0, 1][..], &miss_with_value[..]),
            ] {
                assert!(w.push_packed(st, vals).is_err(), "{st:?}");
                assert_eq!(*w.p.out, snapshot);
                assert_eq!(w.i, 0);
            }
            w.push_packed(&[1], &[0; 8]).unwrap();
            assert!(w.push_hit(&[0; 8]).is_ok());
            w.finish().unwrap();
        }
        let mut w = GetReplyWriter::begin(&mut out, 1, 1, ValueType::Bytes, 2).unwrap();
        assert!(w.push_packed(&[0, 0], b"\x01\0\0\0a\x05\0\0\0").is_err()); // runs past the end
        assert!(w.push_packed(&[0, 1], b"\x01\0\0\0ab").is_err()); // trailing bytes
        assert!(w.push_packed(&[0, 1], b"\x01\0\0").is_err()); // truncated length
        assert_eq!(w.i, 0);
        w.push_packed(&[0, 1], b"\x01\0\0\0a").unwrap();
        w.finish().unwrap();
    }
}
