//! Read access to stored values: a partition of one version seen in column order
//! ([`PartitionView`]), and values decoded from the packed batch layout ([`packed_values`]).

use super::partition::{key_hash, PartData};
use super::{ValueRef, ValueType};
use crate::{Error, Result};

/// Read access to one partition of one version, handed to [`Tables::with_partition`]'s closure.
/// Entries are numbered `0..len()` in column order, so `key(i)` belongs to `column_f64()[i]`.
#[derive(Debug, Clone, Copy)]
pub struct PartitionView<'a> {
    pub(super) data: &'a PartData,
    pub(super) version: u32,
    pub(super) value_type: ValueType,
}

impl<'a> PartitionView<'a> {
    /// The version this view reads (version 0 already resolved).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The table's value type.
    pub fn value_type(&self) -> ValueType {
        self.value_type
    }

    /// Number of keys in this partition.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The partition's write generation: changes with every write to it (insert, overwrite,
    /// delete) and when its version is sealed, and never otherwise; never 0. Two views with the
    /// same generation saw the same entries in the same order, so a scan can page through a
    /// partition across several locks and still read one moment of it.
    pub fn generation(&self) -> u64 {
        self.data.generation()
    }

    /// Whether the partition holds no keys.
    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }

    /// Value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Option<ValueRef<'a>> {
        self.data
            .find(key, key_hash(key))
            .map(|i| self.data.value(i))
    }

    /// Key of entry `i` (`i < len()`).
    pub fn key(&self, i: usize) -> &'a [u8] {
        self.data.key(i)
    }

    /// Value of entry `i` (`i < len()`).
    pub fn value(&self, i: usize) -> ValueRef<'a> {
        self.data.value(i)
    }

    /// Every (key, value), in entry order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], ValueRef<'a>)> + 'a {
        let data = self.data;
        (0..data.len()).map(move |i| (data.key(i), data.value(i)))
    }

    /// The i64 column (entry order), or `None` if the table is not i64.
    pub fn column_i64(&self) -> Option<&'a [i64]> {
        self.data.column_i64()
    }

    /// The f64 column (entry order), or `None` if the table is not f64.
    pub fn column_f64(&self) -> Option<&'a [f64]> {
        self.data.column_f64()
    }

    /// The f32 vectors, `dim` floats per entry back to back, or `None` if the table is not f32vec.
    pub fn column_f32(&self) -> Option<&'a [f32]> {
        self.data.column_f32()
    }
}

/// Iterator over values in the packed batch layout (see [`packed_values`]).
#[derive(Debug, Clone)]
pub struct PackedValues<'a> {
    value_type: ValueType,
    data: &'a [u8],
    left: usize,
}

impl<'a> Iterator for PackedValues<'a> {
    type Item = ValueRef<'a>;

    fn next(&mut self) -> Option<ValueRef<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let take = |data: &mut &'a [u8], n: usize| {
            let (head, tail) = data.split_at(n);
            *data = tail;
            head
        };
        Some(match self.value_type {
            ValueType::I64 => {
                ValueRef::I64(i64::from_le_bytes(take(&mut self.data, 8).try_into().ok()?))
            }
            ValueType::F64 => {
                ValueRef::F64(f64::from_le_bytes(take(&mut self.data, 8).try_into().ok()?))
            }
            ValueType::F32Vec { dim } => ValueRef::F32VecLe(take(&mut self.data, dim as usize * 4)),
            ValueType::Bytes => {
                let len = u32::from_le_bytes(take(&mut self.data, 4).try_into().ok()?) as usize;
                ValueRef::Bytes(take(&mut self.data, len))
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for PackedValues<'_> {}

/// Decode `count` values of `value_type` in the packed batch layout: 8 LE bytes per i64/f64,
/// `dim * 4` LE bytes per f32 vector, `u32 LE length + bytes` per bytes value. The whole buffer is
/// checked first (it must hold exactly `count` values), so a malformed buffer writes nothing.
pub fn packed_values(value_type: ValueType, data: &[u8], count: usize) -> Result<PackedValues<'_>> {
    let ok = match value_type.packed_width() {
        Some(w) => count.checked_mul(w) == Some(data.len()),
        None => {
            let mut at = 0usize;
            let mut n = 0usize;
            while n < count && at + 4 <= data.len() {
                let len =
                    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
                at = at.saturating_add(4).saturating_add(len);
                n += 1;
            }
            n == count && at == data.len()
        }
    };
    if !ok {
        return Err(Error::Invalid(format!(
            "packed values: buffer of {} bytes does not hold exactly {count} values",
            data.len()
        )));
    }
    Ok(PackedValues {
        value_type,
        data,
        left: count,
    })
}
