//! SCAN (0x41): one page of one partition of one version, plain or filtered by a [`Predicate`],
//! bounded in items and bytes, with the cursor the next page starts from. Spec:
//! docs/protocol-native.md, section 11.
//!
//! The server keeps nothing between pages: the cursor (an entry position and the partition's
//! write generation seen on the first page) travels with every request, so a client that stops
//! asking, or disconnects, has cancelled its scan at no cost to the server.

use super::data::{read_keys, Keys};
use super::error::FrameError;
use super::frame::{Opcode, Pending, FLAG_RESPONSE};
use super::ops::{put_predicate, read_predicate, Predicate};
use super::put::{read_values, Values};
use super::types::{Status, ValueType};
use super::wire::{self, patch_u32, put_u32, put_u64, put_u8, Reader};

/// Where a page starts: entry `position` of the partition as it was at write `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// Entries before this one were returned (or passed over by the predicate) already.
    pub position: u64,
    /// The generation the first page reported; 0 on the first page (then `position` is 0).
    pub generation: u64,
}

impl Cursor {
    /// The first page.
    pub const START: Cursor = Cursor {
        position: 0,
        generation: 0,
    };
}

/// A SCAN request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanRequest<'a> {
    /// Table name.
    pub table: &'a str,
    /// 0 = current (the first page only, in practice: later pages name the version it read).
    pub version: u32,
    /// The epoch of the partition map the client routed with.
    pub epoch: u64,
    /// The table incarnation meant (0 = whichever exists).
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// Where the page starts.
    pub cursor: Cursor,
    /// Most items in the page, at least 1.
    pub max_items: u32,
    /// Most bytes of keys and values in the page (one item is returned even if it is larger,
    /// within the server's frame limit).
    pub max_bytes: u32,
    /// Only items whose value satisfies it (a filter); `None`: every item.
    pub predicate: Option<Predicate>,
}

impl<'a> ScanRequest<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<ScanRequest<'a>, FrameError> {
        let req = ScanRequest {
            table: r.name("table name")?,
            version: r.u32("version")?,
            epoch: r.u64("epoch")?,
            incarnation: r.u64("incarnation")?,
            partition: r.u32("partition")?,
            cursor: Cursor {
                position: r.u64("cursor position")?,
                generation: r.u64("cursor generation")?,
            },
            max_items: r.u32("max items")?,
            max_bytes: r.u32("max bytes")?,
            predicate: read_predicate(r)?,
        };
        if req.max_items == 0 {
            return Err(FrameError::Malformed("max items"));
        }
        if req.cursor.generation == 0 && req.cursor.position != 0 {
            return Err(FrameError::Malformed("cursor without a generation"));
        }
        Ok(req)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        put_u64(out, self.epoch);
        put_u64(out, self.incarnation);
        put_u32(out, self.partition);
        put_u64(out, self.cursor.position);
        put_u64(out, self.cursor.generation);
        put_u32(out, self.max_items);
        put_u32(out, self.max_bytes);
        put_predicate(out, &self.predicate);
        Ok(())
    }
}

/// How a page ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PageState {
    /// More entries follow: ask again from `next`.
    More = 0,
    /// The partition is finished.
    Done = 1,
    /// The partition was written since the cursor's generation: the page holds nothing, and the
    /// scan of this partition starts again from the start (discarding what it had of it).
    Changed = 2,
}

impl PageState {
    /// The state for a wire byte.
    pub fn from_u8(b: u8) -> Option<PageState> {
        Some(match b {
            0 => PageState::More,
            1 => PageState::Done,
            2 => PageState::Changed,
            _ => return None,
        })
    }

    /// The spec's name (`"MORE"`).
    pub fn name(self) -> &'static str {
        match self {
            PageState::More => "MORE",
            PageState::Done => "DONE",
            PageState::Changed => "CHANGED",
        }
    }

    /// The state with the spec's name.
    pub fn from_name(name: &str) -> Option<PageState> {
        (0..=2)
            .filter_map(PageState::from_u8)
            .find(|s| s.name() == name)
    }
}

/// Everything of a page's reply before its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHead {
    /// The version read (a request's 0 resolved).
    pub version: u32,
    /// The incarnation of the table read.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The partition's write generation at this page.
    pub generation: u64,
    /// How the page ends.
    pub state: PageState,
    /// Where the next page starts (with `More`).
    pub next: u64,
    /// How the values are packed.
    pub value_type: ValueType,
}

/// The OK payload of SCAN: the head, then `count` keys (u16 length + bytes each) and their values
/// packed as a GET reply packs hits (fixed width each, or u32 length + bytes each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanReply<'a> {
    /// Version, partition, generation, state, next cursor, value type.
    pub head: PageHead,
    /// The keys, in entry order.
    pub keys: Keys<'a>,
    /// One value per key.
    pub values: Values<'a>,
}

fn write_head(out: &mut Vec<u8>, h: &PageHead) -> Result<(), FrameError> {
    put_u32(out, h.version);
    put_u64(out, h.incarnation);
    put_u32(out, h.partition);
    put_u64(out, h.generation);
    put_u8(out, h.state as u8);
    put_u64(out, h.next);
    wire::put_value_type(out, h.value_type)
}

impl<'a> ScanReply<'a> {
    /// Number of items.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the page holds no item.
    pub fn is_empty(&self) -> bool {
        self.keys.len() == 0
    }

    pub(crate) fn read(r: &mut Reader<'a>) -> Result<ScanReply<'a>, FrameError> {
        let version = r.u32("version")?;
        let incarnation = r.u64("incarnation")?;
        let partition = r.u32("partition")?;
        let generation = r.u64("generation")?;
        let state =
            PageState::from_u8(r.u8("page state")?).ok_or(FrameError::Malformed("page state"))?;
        let next = r.u64("next")?;
        let value_type = r.value_type()?;
        let keys = read_keys(r)?;
        if state == PageState::Changed && keys.len() != 0 {
            return Err(FrameError::Malformed("items in a CHANGED page"));
        }
        let values = read_values(r, value_type, keys.len() as u32)?;
        Ok(ScanReply {
            head: PageHead {
                version,
                incarnation,
                partition,
                generation,
                state,
                next,
                value_type,
            },
            keys,
            values,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        write_head(out, &self.head)?;
        put_u32(out, self.keys.len() as u32);
        out.extend_from_slice(self.keys.raw());
        out.extend_from_slice(self.values.raw());
        Ok(())
    }
}

/// Appends a whole SCAN request frame (the client's encoder).
pub fn encode_scan(
    out: &mut Vec<u8>,
    request_id: u64,
    req: &ScanRequest<'_>,
) -> Result<(), FrameError> {
    let p = Pending::begin(out, Opcode::Scan, 0, request_id);
    req.write(p.out)?;
    p.finish()
}

/// Appends a SCAN OK reply straight into `out` (the server's encoder, no copy of the items):
/// `keys` appends `count` keys in their wire form, then `values` their values. What they wrote is
/// checked against the layout; on any error nothing is left in `out`.
pub fn encode_scan_page(
    out: &mut Vec<u8>,
    request_id: u64,
    head: &PageHead,
    count: usize,
    keys: impl FnOnce(&mut Vec<u8>),
    values: impl FnOnce(&mut Vec<u8>),
) -> Result<(), FrameError> {
    let n = u32::try_from(count).map_err(|_| FrameError::Encode("item count"))?;
    if head.state == PageState::Changed && n != 0 {
        return Err(FrameError::Encode("items in a CHANGED page"));
    }
    let p = Pending::begin(out, Opcode::Scan, FLAG_RESPONSE, request_id);
    put_u8(p.out, Status::Ok as u8);
    write_head(p.out, head)?;
    let count_at = p.out.len();
    put_u32(p.out, n);
    keys(p.out);
    let values_at = p.out.len();
    values(p.out);
    // The layout must read back: the keys exactly fill their section, the values theirs. Reading
    // the keys back costs as much as writing them, so in release builds only the values' section
    // is measured where its size is known (fixed-width types); the tests run the whole check.
    let fixed = match head.value_type {
        ValueType::I64 | ValueType::F64 => Some(8),
        ValueType::F32Vec(dim) => Some(4 * dim as usize),
        ValueType::Bytes => None,
    };
    if cfg!(debug_assertions) || fixed.is_none() {
        let mut r = Reader::new(&p.out[count_at..]);
        let k = read_keys(&mut r).map_err(|_| FrameError::Encode("keys do not match the count"))?;
        if count_at + r.pos() != values_at || k.len() != count {
            return Err(FrameError::Encode("keys do not match the count"));
        }
        read_values(&mut r, head.value_type, n)
            .map_err(|_| FrameError::Encode("values do not match the keys"))?;
        if r.remaining() != 0 {
            return Err(FrameError::Encode("values do not match the keys"));
        }
    } else if let Some(w) = fixed {
        if p.out.len() - values_at != w * count {
            return Err(FrameError::Encode("values do not match the keys"));
        }
    }
    patch_u32(p.out, count_at, n);
    p.finish()
}
