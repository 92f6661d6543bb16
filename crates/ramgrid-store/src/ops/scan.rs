//! SCAN pages: which entries of one partition a page of a plain or filtered scan returns, bounded
//! in items and bytes. The predicate is tested on the typed column (no per-key decoding); the
//! caller copies the chosen entries out while it still holds the same view (one moment).

use super::{check_range, Col, Range};
use crate::tables::{PartitionView, ValueRef, ValueType};
use crate::{Error, Result};

/// The entries a page returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entries {
    /// Every entry of `start..end` (a plain scan): the columns can be copied as runs.
    Run(std::ops::Range<usize>),
    /// These entries, ascending (a filtered scan).
    Picked(Vec<u32>),
}

impl Entries {
    /// How many entries.
    pub fn len(&self) -> usize {
        match self {
            Entries::Run(r) => r.len(),
            Entries::Picked(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry numbers, ascending.
    pub fn iter(&self) -> Box<dyn Iterator<Item = usize> + '_> {
        match self {
            Entries::Run(r) => Box::new(r.clone()),
            Entries::Picked(v) => Box::new(v.iter().map(|&i| i as usize)),
        }
    }
}

/// One page of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// What it returns.
    pub entries: Entries,
    /// The entry the next page starts at (every entry before it was looked at).
    pub next: usize,
    /// Whether the partition is finished (`next == len`).
    pub done: bool,
    /// Bytes the entries take on the wire, as [`entry_wire_len`] counts them.
    pub bytes: usize,
}

/// Bytes entry `i` takes in a page: its key (u16 length + bytes) and its value (the width of a
/// fixed-width type, or u32 length + bytes).
#[inline]
pub fn entry_wire_len(view: &PartitionView<'_>, i: usize) -> usize {
    let key = 2 + view.key(i).len();
    key + match view.value_type() {
        ValueType::I64 | ValueType::F64 => 8,
        ValueType::F32Vec { dim } => 4 * dim as usize,
        ValueType::Bytes => match view.value(i) {
            ValueRef::Bytes(b) => 4 + b.len(),
            _ => 4,
        },
    }
}

/// The page of `view` that starts at entry `start`: the entries selected by `pred` (all without
/// one), in entry order, until `max_items` are taken or the next would pass `max_bytes`. At least
/// one selected entry is taken when there is one left, whatever its size, so a page always makes
/// progress (the caller checks it against its frame limit). Refuses a start past the end and a
/// predicate that does not fit the table.
pub fn page(
    view: &PartitionView<'_>,
    start: usize,
    pred: Option<&Range>,
    max_items: usize,
    max_bytes: usize,
) -> Result<Page> {
    check_range(view.value_type(), &pred.copied())?;
    let len = view.len();
    if start > len {
        return Err(Error::Invalid(format!(
            "scan cursor {start} is past the partition's {len} entries"
        )));
    }
    if max_items == 0 {
        return Err(Error::Invalid("a scan page needs max_items >= 1".into()));
    }
    let mut bytes = 0usize;
    let mut taken = 0usize;
    let Some(r) = pred else {
        let mut i = start;
        while i < len && taken < max_items {
            let c = entry_wire_len(view, i);
            if taken > 0 && bytes + c > max_bytes {
                break;
            }
            bytes += c;
            taken += 1;
            i += 1;
        }
        return Ok(Page {
            entries: Entries::Run(start..i),
            next: i,
            done: i == len,
            bytes,
        });
    };
    let col = Col::of(view, r.component);
    let mut picked = Vec::new();
    let mut i = start;
    while i < len {
        let x = col.get(i);
        if x >= r.lo && x < r.hi {
            if taken == max_items {
                break;
            }
            let c = entry_wire_len(view, i);
            if taken > 0 && bytes + c > max_bytes {
                break;
            }
            bytes += c;
            taken += 1;
            picked.push(i as u32);
        }
        i += 1;
    }
    Ok(Page {
        entries: Entries::Picked(picked),
        next: i,
        done: i == len,
        bytes,
    })
}
