//! PUT: a batch of keys and values grouped by partition, with the merge rule (spec section 7.3);
//! decoded as zero-copy views and encoded by a writer that appends straight into the output buffer.

use super::data::{put_group_keys, read_keys, Keys};
use super::error::FrameError;
use super::frame::{Opcode, Pending};
use super::types::ValueType;
use super::wire::{self, patch_u32, put_u32, put_u64, put_u8, Reader};

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
/// keys with their values, then an optional merge byte, and after a merge byte an optional
/// write key (section 7.3).
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
    /// The client's key for this merge (0: none): the same in every try of one write, so that
    /// each replica applies each of its partition groups once (section 7.5).
    pub write_key: u64,
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
        // A merge may carry a write key; 0 is sent absent.
        let write_key = if merge != Merge::Store && r.remaining() > 0 {
            match r.u64("write key")? {
                0 => return Err(FrameError::Malformed("write key 0 is sent absent")),
                k => k,
            }
        } else {
            0
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
            write_key,
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

    /// Appends this PUT as a partition's primary forwards it to a backup (section 7.5 of the
    /// spec): flag [`FLAG_REPLICA`](super::FLAG_REPLICA), the primary's `epoch`, and only the
    /// `groups` given (a subset of this PUT's, in its order), with the same merge.
    pub fn encode_replica<'g>(
        &self,
        out: &mut Vec<u8>,
        request_id: u64,
        epoch: u64,
        groups: impl IntoIterator<Item = &'g PutGroup<'g>>,
    ) -> Result<(), FrameError> {
        let p = Pending::begin(out, Opcode::Put, super::FLAG_REPLICA, request_id);
        wire::put_name(p.out, self.table, "table name")?;
        put_u32(p.out, self.version);
        put_u64(p.out, epoch);
        put_u64(p.out, self.incarnation);
        wire::put_value_type(p.out, self.value_type)?;
        super::data::put_raw_groups(p.out, groups.into_iter().map(|g| g.raw));
        put_merge(p.out, self.merge, self.write_key);
        p.finish()
    }

    pub(crate) fn write_body(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        put_u64(out, self.epoch);
        put_u64(out, self.incarnation);
        wire::put_value_type(out, self.value_type)?;
        put_u32(out, self.groups.count);
        out.extend_from_slice(self.groups.raw);
        put_merge(out, self.merge, self.write_key);
        Ok(())
    }
}

/// The optional tail of a PUT body: the merge byte (absent for `Store`), then the write key
/// (absent when 0, and without a merge).
fn put_merge(out: &mut Vec<u8>, merge: Merge, write_key: u64) {
    if merge != Merge::Store {
        put_u8(out, merge as u8);
        if write_key != 0 {
            put_u64(out, write_key);
        }
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
    /// The group as it is on the wire (partition, keys, values), for forwarding it whole.
    pub raw: &'a [u8],
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
        let start = self.r.pos();
        let partition = self.r.u32("partition").ok()?;
        let keys = read_keys(&mut self.r).ok()?;
        let values = read_values(&mut self.r, self.value_type, keys.left).ok()?;
        let raw = self.r.slice(start, self.r.pos());
        Some(PutGroup {
            partition,
            keys,
            values,
            raw,
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

    /// These values less their first `n` (fixed-width types; at most as many as are left).
    pub fn skip_packed(self, n: usize) -> Values<'a> {
        let Some(w) = self.width else { return self };
        let n = n.min(self.left as usize);
        let rest = self.r.rest();
        Values {
            r: Reader::new(&rest[(n * w).min(rest.len())..]),
            left: self.left - n as u32,
            width: self.width,
        }
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
// Encoding

/// Appends a PUT request frame, one group at a time, with no allocation per key. Dropping the
/// writer before [`PutWriter::finish`] removes the partial frame.
#[derive(Debug)]
pub struct PutWriter<'o> {
    p: Pending<'o>,
    groups_at: usize,
    groups: u32,
    value_type: ValueType,
    merge: Merge,
    write_key: u64,
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
            write_key: 0,
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

    /// Sends the PUT at `ack = one` ([`FLAG_ACK_ONE`](super::FLAG_ACK_ONE)).
    pub fn set_ack_one(&mut self) {
        self.p.set_flag(super::FLAG_ACK_ONE);
    }

    /// Asks the server to merge each value with the stored one (written by `finish`; numeric
    /// tables only, which the server checks).
    pub fn set_merge(&mut self, merge: Merge) {
        self.merge = merge;
    }

    /// Names the write (nonzero, the same in every try of it) so that each replica applies each
    /// partition group of a merge once however often it is sent (section 7.5). Written only with
    /// a merge: a store applied twice stores the same.
    pub fn set_write_key(&mut self, write_key: u64) {
        self.write_key = write_key;
    }

    /// Completes the frame.
    pub fn finish(self) -> Result<(), FrameError> {
        patch_u32(self.p.out, self.groups_at, self.groups);
        put_merge(self.p.out, self.merge, self.write_key);
        self.p.finish()
    }
}
