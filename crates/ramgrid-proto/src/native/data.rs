//! GET and DELETE: batches of keys grouped by partition, decoded as zero-copy views and
//! encoded by writers that append straight into the output buffer (no allocation per key).

use super::error::FrameError;
use super::frame::{Opcode, Pending};
use super::types::MAX_KEY_LEN;
use super::wire::{self, patch_u32, put_u16, put_u32, put_u64, Reader};

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

    /// Appends this batch as a DELETE a partition's primary forwards to a backup (section 7.5 of
    /// the spec): flag [`FLAG_REPLICA`](super::FLAG_REPLICA), the primary's `epoch`, and only the
    /// `groups` given (a subset of this batch's, in its order).
    pub fn encode_replica<'g>(
        &self,
        out: &mut Vec<u8>,
        request_id: u64,
        epoch: u64,
        groups: impl IntoIterator<Item = &'g KeyGroup<'g>>,
    ) -> Result<(), FrameError> {
        let p = Pending::begin(out, Opcode::Delete, super::FLAG_REPLICA, request_id);
        wire::put_name(p.out, self.table, "table name")?;
        put_u32(p.out, self.version);
        put_u64(p.out, epoch);
        put_u64(p.out, self.incarnation);
        put_raw_groups(p.out, groups.into_iter().map(|g| g.raw));
        p.finish()
    }
}

/// Appends a group count and the groups `raws` as they were on the wire (a forward's groups).
pub(super) fn put_raw_groups<'g>(out: &mut Vec<u8>, raws: impl Iterator<Item = &'g [u8]>) {
    let count_at = out.len();
    put_u32(out, 0);
    let mut count = 0u32;
    for raw in raws {
        out.extend_from_slice(raw);
        count += 1;
    }
    patch_u32(out, count_at, count);
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
pub(super) fn skip_keys(r: &mut Reader<'_>) -> Result<usize, FrameError> {
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
    /// The group as it is on the wire (partition, key count, keys), for forwarding it whole.
    pub raw: &'a [u8],
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
        let start = self.r.pos();
        let partition = self.r.u32("partition").ok()?;
        let keys = read_keys(&mut self.r).ok()?;
        let raw = self.r.slice(start, self.r.pos());
        Some(KeyGroup {
            partition,
            keys,
            raw,
        })
    }
}

/// Zero-copy iterator over validated keys (u16 length + bytes each).
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    r: Reader<'a>,
    pub(super) left: u32,
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

    /// Sends the DELETE at `ack = one` ([`FLAG_ACK_ONE`](super::FLAG_ACK_ONE)).
    pub fn set_ack_one(&mut self) {
        self.p.set_flag(super::FLAG_ACK_ONE);
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
pub(super) fn put_group_keys<I>(
    out: &mut Vec<u8>,
    partition: u32,
    keys: I,
) -> Result<usize, FrameError>
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
