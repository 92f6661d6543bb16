//! Values as the caller hands them to a write, and as a read returns them: packed arrays for numeric
//! tables (ready for numpy), one buffer plus spans for bytes tables. Nothing is allocated per key.

use ramgrid_proto::native::ValueType;

use crate::error::{Error, Result};

/// The values of a write, one per key in the caller's order, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum ValuesRef<'a> {
    /// Bytes values, one slice each (bytes tables).
    Slices(&'a [&'a [u8]]),
    /// Bytes values packed: value `i` is `data[offsets[i]..offsets[i + 1]]` (bytes tables).
    Packed {
        /// `n + 1` non-decreasing offsets into `data`.
        offsets: &'a [i64],
        /// Every value's bytes, back to back.
        data: &'a [u8],
    },
    /// i64 tables.
    I64(&'a [i64]),
    /// f64 tables.
    F64(&'a [f64]),
    /// f32-vector tables: `dim` floats per key, row-major.
    F32(&'a [f32]),
}

impl<'a> ValuesRef<'a> {
    /// Checks that the values fit a table of type `vt` and that there is one per key.
    pub(crate) fn check(&self, vt: ValueType, n: usize) -> Result<()> {
        let (ok, count) = match (*self, vt) {
            (ValuesRef::Slices(s), ValueType::Bytes) => (true, s.len()),
            (ValuesRef::Packed { offsets, data }, ValueType::Bytes) => {
                check_offsets(offsets, data.len())?;
                (true, offsets.len() - 1)
            }
            (ValuesRef::I64(v), ValueType::I64) => (true, v.len()),
            (ValuesRef::F64(v), ValueType::F64) => (true, v.len()),
            (ValuesRef::F32(v), ValueType::F32Vec(dim)) => {
                if v.len() % dim as usize != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "{} floats is not a whole number of {dim}-vectors",
                        v.len()
                    )));
                }
                (true, v.len() / dim as usize)
            }
            _ => (false, 0),
        };
        if !ok {
            return Err(Error::InvalidArgument(format!(
                "{} values do not fit a {} table",
                self.kind(),
                type_name(vt)
            )));
        }
        if count != n {
            return Err(Error::InvalidArgument(format!(
                "{n} keys but {count} values"
            )));
        }
        Ok(())
    }

    /// Values of keys `range` (`dim` floats per key for f32 vectors).
    pub fn slice(&self, range: std::ops::Range<usize>, dim: usize) -> ValuesRef<'a> {
        match *self {
            ValuesRef::Slices(s) => ValuesRef::Slices(&s[range]),
            ValuesRef::Packed { offsets, data } => ValuesRef::Packed {
                offsets: &offsets[range.start..range.end + 1],
                data,
            },
            ValuesRef::I64(v) => ValuesRef::I64(&v[range]),
            ValuesRef::F64(v) => ValuesRef::F64(&v[range]),
            ValuesRef::F32(v) => ValuesRef::F32(&v[range.start * dim..range.end * dim]),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ValuesRef::Slices(_) | ValuesRef::Packed { .. } => "bytes",
            ValuesRef::I64(_) => "i64",
            ValuesRef::F64(_) => "f64",
            ValuesRef::F32(_) => "f32",
        }
    }

    /// Bytes value `i` (bytes tables only; call [`ValuesRef::check`] first).
    #[inline]
    pub(crate) fn bytes(&self, i: usize) -> &'a [u8] {
        match *self {
            ValuesRef::Slices(s) => s[i],
            ValuesRef::Packed { offsets, data } => {
                &data[offsets[i] as usize..offsets[i + 1] as usize]
            }
            _ => &[],
        }
    }

    /// Appends value `i` in wire form (little-endian) for fixed-width tables.
    #[inline]
    pub(crate) fn put_fixed(&self, i: usize, dim: usize, out: &mut Vec<u8>) {
        match *self {
            ValuesRef::I64(v) => out.extend_from_slice(&v[i].to_le_bytes()),
            ValuesRef::F64(v) => out.extend_from_slice(&v[i].to_le_bytes()),
            ValuesRef::F32(v) => {
                for x in &v[i * dim..(i + 1) * dim] {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            ValuesRef::Slices(_) | ValuesRef::Packed { .. } => {}
        }
    }

    /// Wire bytes of value `i` (for frame size estimates).
    pub(crate) fn wire_len(&self, i: usize, vt: ValueType) -> usize {
        match vt.width() {
            Some(w) => w,
            None => 4 + self.bytes(i).len(),
        }
    }
}

pub(crate) fn check_offsets(offsets: &[i64], data_len: usize) -> Result<()> {
    if offsets.is_empty() {
        return Err(Error::InvalidArgument(
            "packed values need n + 1 offsets (got none)".into(),
        ));
    }
    if offsets[0] < 0 || offsets.windows(2).any(|w| w[1] < w[0]) {
        return Err(Error::InvalidArgument(
            "packed offsets must be non-negative and non-decreasing".into(),
        ));
    }
    if offsets[offsets.len() - 1] as u64 > data_len as u64 {
        return Err(Error::InvalidArgument(
            "packed offsets run past the data".into(),
        ));
    }
    Ok(())
}

/// The spec's name of a value type (`"bytes"`, `"i64"`, `"f64"`, `"f32vec"`).
pub fn type_name(vt: ValueType) -> &'static str {
    match vt {
        ValueType::Bytes => "bytes",
        ValueType::I64 => "i64",
        ValueType::F64 => "f64",
        ValueType::F32Vec(_) => "f32vec",
    }
}

/// Parses a value type name; `dim` is used (and required > 0) for `"f32vec"` only.
pub fn parse_type(name: &str, dim: u32) -> Result<ValueType> {
    match name {
        "bytes" => Ok(ValueType::Bytes),
        "i64" => Ok(ValueType::I64),
        "f64" => Ok(ValueType::F64),
        "f32vec" if (1..=ramgrid_proto::native::MAX_VECTOR_DIM).contains(&dim) => {
            Ok(ValueType::F32Vec(dim))
        }
        "f32vec" => Err(Error::InvalidArgument(format!(
            "f32vec needs 1 <= dim <= {}, got {dim}",
            ramgrid_proto::native::MAX_VECTOR_DIM
        ))),
        _ => Err(Error::InvalidArgument(format!(
            "value_type must be bytes, i64, f64 or f32vec, not {name:?}"
        ))),
    }
}

/// Values of a bytes table read back: value `i` is `data[spans[i].0..spans[i].0 + spans[i].1]` when found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BytesValues {
    /// Every found value's bytes (in reply order, not key order).
    pub data: Vec<u8>,
    /// (start, length) of each key's value in `data`; (0, 0) for misses.
    pub spans: Vec<(usize, usize)>,
}

impl BytesValues {
    /// Value `i`'s bytes (empty for a miss: check the found flags).
    pub fn get(&self, i: usize) -> &[u8] {
        let (s, l) = self.spans[i];
        &self.data[s..s + l]
    }
}

/// The values of a read, in the caller's key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Bytes table.
    Bytes(BytesValues),
    /// i64 table (0 where missing).
    I64(Vec<i64>),
    /// f64 table (0.0 where missing).
    F64(Vec<f64>),
    /// f32-vector table: `n * dim` floats, row-major (zeros where missing).
    F32Vec {
        /// Floats per key.
        dim: usize,
        /// The rows.
        data: Vec<f32>,
    },
}

impl Values {
    /// Zeroed output for `n` keys of a table of type `vt`.
    pub fn zeroed(vt: ValueType, n: usize) -> Values {
        match vt {
            ValueType::Bytes => Values::Bytes(BytesValues {
                data: Vec::new(),
                spans: vec![(0, 0); n],
            }),
            ValueType::I64 => Values::I64(vec![0; n]),
            ValueType::F64 => Values::F64(vec![0.0; n]),
            ValueType::F32Vec(d) => Values::F32Vec {
                dim: d as usize,
                data: vec![0.0; n * d as usize],
            },
        }
    }

    /// A mutable view of keys `range` of this output.
    pub fn slice_mut(&mut self, range: std::ops::Range<usize>) -> ValuesMut<'_> {
        match self {
            Values::Bytes(b) => ValuesMut::Bytes {
                data: &mut b.data,
                spans: &mut b.spans[range],
            },
            Values::I64(v) => ValuesMut::I64(&mut v[range]),
            Values::F64(v) => ValuesMut::F64(&mut v[range]),
            Values::F32Vec { dim, data } => {
                let d = *dim;
                ValuesMut::F32 {
                    dim: d,
                    data: &mut data[range.start * d..range.end * d],
                }
            }
        }
    }
}

/// Where a read writes its values: a caller-owned output, indexed by the batch's key index.
#[derive(Debug)]
pub enum ValuesMut<'a> {
    /// Bytes table: values are appended to `data`, and `spans[i]` set for each found key.
    Bytes {
        /// Shared value buffer.
        data: &'a mut Vec<u8>,
        /// One span per key of the batch.
        spans: &'a mut [(usize, usize)],
    },
    /// i64 table.
    I64(&'a mut [i64]),
    /// f64 table.
    F64(&'a mut [f64]),
    /// f32-vector table, `dim` floats per key.
    F32 {
        /// Floats per key.
        dim: usize,
        /// `n * dim` floats.
        data: &'a mut [f32],
    },
}

impl ValuesMut<'_> {
    /// Number of keys this output has room for.
    pub fn len(&self) -> usize {
        match self {
            ValuesMut::Bytes { spans, .. } => spans.len(),
            ValuesMut::I64(v) => v.len(),
            ValuesMut::F64(v) => v.len(),
            ValuesMut::F32 { dim, data } => data.len() / (*dim).max(1),
        }
    }

    /// Whether the output has room for no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn fits(&self, vt: ValueType) -> bool {
        matches!(
            (self, vt),
            (ValuesMut::Bytes { .. }, ValueType::Bytes)
                | (ValuesMut::I64(_), ValueType::I64)
                | (ValuesMut::F64(_), ValueType::F64)
        ) || matches!((self, vt), (ValuesMut::F32 { dim, .. }, ValueType::F32Vec(d)) if *dim == d as usize)
    }

    /// Stores key `i`'s value from its wire form (exactly the type's width for fixed types).
    #[inline]
    pub(crate) fn set(&mut self, i: usize, wire: &[u8]) {
        match self {
            ValuesMut::Bytes { data, spans } => {
                spans[i] = (data.len(), wire.len());
                data.extend_from_slice(wire);
            }
            ValuesMut::I64(v) => v[i] = i64::from_le_bytes(wire.try_into().unwrap_or([0; 8])),
            ValuesMut::F64(v) => v[i] = f64::from_le_bytes(wire.try_into().unwrap_or([0; 8])),
            ValuesMut::F32 { dim, data } => {
                let row = &mut data[i * *dim..(i + 1) * *dim];
                for (x, c) in row.iter_mut().zip(wire.chunks_exact(4)) {
                    *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }

    /// Resets key `i` to "missing" (zero / empty), before it is read again.
    pub(crate) fn clear(&mut self, i: usize) {
        match self {
            ValuesMut::Bytes { spans, .. } => spans[i] = (0, 0),
            ValuesMut::I64(v) => v[i] = 0,
            ValuesMut::F64(v) => v[i] = 0.0,
            ValuesMut::F32 { dim, data } => data[i * *dim..(i + 1) * *dim].fill(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_matches_types_and_counts() {
        assert!(ValuesRef::I64(&[1, 2]).check(ValueType::I64, 2).is_ok());
        assert!(ValuesRef::I64(&[1, 2]).check(ValueType::F64, 2).is_err());
        assert!(ValuesRef::I64(&[1, 2]).check(ValueType::I64, 3).is_err());
        assert!(ValuesRef::F32(&[0.0; 6])
            .check(ValueType::F32Vec(3), 2)
            .is_ok());
        assert!(ValuesRef::F32(&[0.0; 6])
            .check(ValueType::F32Vec(4), 2)
            .is_err());
        assert!(ValuesRef::Packed {
            offsets: &[0, 1, 3],
            data: b"abc"
        }
        .check(ValueType::Bytes, 2)
        .is_ok());
        assert!(ValuesRef::Packed {
            offsets: &[0, 4],
            data: b"abc"
        }
        .check(ValueType::Bytes, 1)
        .is_err());
        let s: [&[u8]; 1] = [b""];
        assert!(
            ValuesRef::Slices(&s).check(ValueType::Bytes, 1).is_ok(),
            "empty values are fine"
        );
    }

    #[test]
    fn output_views_write_by_key_index() {
        let mut v = Values::zeroed(ValueType::F32Vec(2), 3);
        {
            let mut m = v.slice_mut(1..3);
            let wire: Vec<u8> = [1.5f32, -2.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            m.set(1, &wire);
        }
        assert_eq!(
            v,
            Values::F32Vec {
                dim: 2,
                data: vec![0.0, 0.0, 0.0, 0.0, 1.5, -2.0]
            }
        );
        let mut b = Values::zeroed(ValueType::Bytes, 2);
        {
            let mut m = b.slice_mut(0..2);
            m.set(1, b"xy");
            m.set(0, b"z");
            m.clear(0);
        }
        let Values::Bytes(b) = b else { unreachable!() };
        assert_eq!(b.get(1), b"xy");
        assert_eq!(b.get(0), b"");
        assert_eq!(
            parse_type("f32vec", 0).map_err(|e| e.kind()).unwrap_err(),
            crate::ErrorKind::InvalidArgument
        );
        assert_eq!(type_name(parse_type("f32vec", 8).unwrap()), "f32vec");
    }
}
