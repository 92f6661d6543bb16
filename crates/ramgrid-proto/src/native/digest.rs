//! DIGEST (0x25): a summary of what a server holds of some partitions of one version, to compare
//! replicas (spec section 6.9): per partition, how many items and an order-independent hash of
//! them (the wrapping sum of a 64-bit hash of each key with its value).

use super::error::FrameError;
use super::wire::{self, put_u32, put_u64, put_u8, Reader};

/// A DIGEST request: which partitions of which version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestRequest<'a> {
    /// Table name.
    pub table: &'a str,
    /// The version (0: the current one).
    pub version: u32,
    /// The partitions, as `u32`s (little-endian), in the order asked.
    partitions: &'a [u8],
}

impl<'a> DigestRequest<'a> {
    /// A request for `partitions` (their little-endian bytes: see [`partition_bytes`]).
    pub fn new(table: &'a str, version: u32, partitions: &'a [u8]) -> DigestRequest<'a> {
        DigestRequest {
            table,
            version,
            partitions: &partitions[..partitions.len() / 4 * 4],
        }
    }

    /// The partitions asked for, in order.
    pub fn partitions(&self) -> impl Iterator<Item = u32> + 'a {
        self.partitions
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    pub(crate) fn read(r: &mut Reader<'a>) -> Result<DigestRequest<'a>, FrameError> {
        let table = r.name("table name")?;
        let version = r.u32("version")?;
        let n = r.u32("partition count")?;
        let len = (n as usize)
            .checked_mul(4)
            .ok_or(FrameError::Truncated("partitions"))?;
        let partitions = r.take(len, "partitions")?;
        Ok(DigestRequest {
            table,
            version,
            partitions,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        put_u32(out, (self.partitions.len() / 4) as u32);
        out.extend_from_slice(self.partitions);
        Ok(())
    }
}

/// Little-endian bytes of `partitions`, for [`DigestRequest::new`].
pub fn partition_bytes(partitions: &[u32]) -> Vec<u8> {
    partitions.iter().flat_map(|p| p.to_le_bytes()).collect()
}

/// What a server holds of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestState {
    /// Held and served: the figures stand.
    Held = 0,
    /// Not held here (no figures).
    NotHeld = 1,
    /// Held but still being copied in (no figures).
    Copying = 2,
}

/// One partition's summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionDigest {
    /// The partition.
    pub partition: u32,
    /// Whether the figures stand.
    pub state: DigestState,
    /// Items held.
    pub items: u64,
    /// Wrapping sum of a 64-bit hash of each (key, value).
    pub digest: u64,
}

/// Bytes of one [`PartitionDigest`] on the wire.
const ENTRY: usize = 4 + 1 + 8 + 8;

/// The OK payload of DIGEST: one [`PartitionDigest`] per partition asked, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestReply<'a> {
    raw: &'a [u8],
}

impl<'a> DigestReply<'a> {
    /// The summaries, in the order asked.
    pub fn iter(&self) -> impl Iterator<Item = PartitionDigest> + 'a {
        self.raw.chunks_exact(ENTRY).map(|c| {
            let u64_at = |at: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&c[at..at + 8]);
                u64::from_le_bytes(b)
            };
            PartitionDigest {
                partition: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                state: match c[4] {
                    0 => DigestState::Held,
                    1 => DigestState::NotHeld,
                    _ => DigestState::Copying,
                },
                items: u64_at(5),
                digest: u64_at(13),
            }
        })
    }

    /// How many summaries.
    pub fn len(&self) -> usize {
        self.raw.len() / ENTRY
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Encodes `entries` as a reply payload into `buf`, to be viewed with [`DigestReply::view`].
    pub fn encode_entries(entries: &[PartitionDigest], buf: &mut Vec<u8>) {
        for e in entries {
            put_u32(buf, e.partition);
            put_u8(buf, e.state as u8);
            put_u64(buf, e.items);
            put_u64(buf, e.digest);
        }
    }

    /// A reply over `raw` (entries as [`DigestReply::encode_entries`] writes them).
    pub fn view(raw: &'a [u8]) -> DigestReply<'a> {
        DigestReply {
            raw: &raw[..raw.len() / ENTRY * ENTRY],
        }
    }

    pub(crate) fn read(r: &mut Reader<'a>) -> Result<DigestReply<'a>, FrameError> {
        let n = r.u32("digest count")?;
        let len = (n as usize)
            .checked_mul(ENTRY)
            .ok_or(FrameError::Truncated("digests"))?;
        let raw = r.take(len, "digests")?;
        for c in raw.chunks_exact(ENTRY) {
            if c[4] > 2 {
                return Err(FrameError::Malformed("unknown digest state"));
            }
        }
        Ok(DigestReply { raw })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u32(out, self.len() as u32);
        out.extend_from_slice(self.raw);
        Ok(())
    }
}
