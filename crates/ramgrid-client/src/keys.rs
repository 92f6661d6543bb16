//! Batch keys as the caller holds them, borrowed: byte slices, one packed buffer with offsets, or
//! 64-bit integers (each key is its 8-byte little-endian encoding). Nothing is copied per key.

use std::ops::Deref;

use crate::error::{Error, Result};

/// The keys of one batch, in the caller's order. Results are returned in the same order.
#[derive(Debug, Clone, Copy)]
pub enum Keys<'a> {
    /// One slice per key.
    Slices(&'a [&'a [u8]]),
    /// Key `i` is `data[offsets[i]..offsets[i + 1]]`; `offsets` has one more entry than there are keys.
    Packed {
        /// `n + 1` non-decreasing offsets into `data`.
        offsets: &'a [i64],
        /// Every key's bytes, back to back.
        data: &'a [u8],
    },
    /// Integer keys: key `i` is `ints[i].to_le_bytes()`.
    I64(&'a [i64]),
}

/// One key's bytes: borrowed from the caller, or the 8 bytes of an integer key.
#[derive(Debug, Clone, Copy)]
pub enum KeyBytes<'a> {
    /// Borrowed from the caller's buffer.
    Borrowed(&'a [u8]),
    /// An integer key's little-endian encoding.
    Int([u8; 8]),
}

impl Deref for KeyBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            KeyBytes::Borrowed(b) => b,
            KeyBytes::Int(a) => a,
        }
    }
}

impl AsRef<[u8]> for KeyBytes<'_> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl<'a> Keys<'a> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        match self {
            Keys::Slices(s) => s.len(),
            Keys::Packed { offsets, .. } => offsets.len().saturating_sub(1),
            Keys::I64(v) => v.len(),
        }
    }

    /// True when the batch has no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys `range` of this batch (key `j` of the result is key `range.start + j` of this one).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Keys<'a> {
        match *self {
            Keys::Slices(s) => Keys::Slices(&s[range]),
            Keys::Packed { offsets, data } => Keys::Packed {
                offsets: &offsets[range.start..range.end + 1],
                data,
            },
            Keys::I64(v) => Keys::I64(&v[range]),
        }
    }

    /// Key `i`. Panics if `i` is out of range or (for packed keys) [`Keys::validate`] was not called.
    #[inline]
    pub fn key(&self, i: usize) -> KeyBytes<'a> {
        match *self {
            Keys::Slices(s) => KeyBytes::Borrowed(s[i]),
            Keys::Packed { offsets, data } => {
                KeyBytes::Borrowed(&data[offsets[i] as usize..offsets[i + 1] as usize])
            }
            Keys::I64(v) => KeyBytes::Int(v[i].to_le_bytes()),
        }
    }

    /// Checks that packed offsets are well formed. Key lengths are not checked here: a key too long
    /// for the wire is a per-key failure of its batch, not an error of the whole call.
    pub fn validate(&self) -> Result<()> {
        if let Keys::Packed { offsets, data } = *self {
            if offsets.is_empty() {
                return Err(Error::InvalidArgument(
                    "packed keys need n + 1 offsets (got none)".into(),
                ));
            }
            if offsets[0] < 0 {
                return Err(Error::InvalidArgument(
                    "packed key offsets must not be negative".into(),
                ));
            }
            for (i, w) in offsets.windows(2).enumerate() {
                if w[1] < w[0] {
                    return Err(Error::InvalidArgument(format!(
                        "packed key offsets decrease at key {i}"
                    )));
                }
            }
            if offsets[offsets.len() - 1] as u64 > data.len() as u64 {
                return Err(Error::InvalidArgument(format!(
                    "packed key offsets end at {} but the data holds {} bytes",
                    offsets[offsets.len() - 1],
                    data.len()
                )));
            }
        }
        Ok(())
    }
}

/// A batch's keys copied out of the caller's buffers, for a request that outlives the call that
/// made it (a pipelined batch is read back after its caller's buffers are gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedKeys {
    /// Integer keys.
    I64(Vec<i64>),
    /// Key `i` is `data[offsets[i]..offsets[i + 1]]`.
    Packed {
        /// `n + 1` offsets into `data`.
        offsets: Vec<i64>,
        /// Every key's bytes, back to back.
        data: Vec<u8>,
    },
}

impl OwnedKeys {
    /// A copy of `keys` (slices are packed). Packed keys are copied as given: call
    /// [`Keys::validate`] on the result before use.
    pub fn copy_of(keys: Keys<'_>) -> OwnedKeys {
        match keys {
            Keys::I64(v) => OwnedKeys::I64(v.to_vec()),
            Keys::Packed { offsets, data } => OwnedKeys::Packed {
                offsets: offsets.to_vec(),
                data: data.to_vec(),
            },
            Keys::Slices(s) => {
                let mut offsets = Vec::with_capacity(s.len() + 1);
                let mut data = Vec::with_capacity(s.iter().map(|k| k.len()).sum());
                offsets.push(0);
                for k in s {
                    data.extend_from_slice(k);
                    offsets.push(data.len() as i64);
                }
                OwnedKeys::Packed { offsets, data }
            }
        }
    }

    /// The keys, borrowed.
    pub fn keys(&self) -> Keys<'_> {
        match self {
            OwnedKeys::I64(v) => Keys::I64(v),
            OwnedKeys::Packed { offsets, data } => Keys::Packed { offsets, data },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_address_the_same_bytes() {
        let slices: Vec<&[u8]> = vec![b"ab", b"c"];
        let s = Keys::Slices(&slices);
        let p = Keys::Packed {
            offsets: &[0, 2, 3],
            data: b"abc",
        };
        for i in 0..2 {
            assert_eq!(&*s.key(i), &*p.key(i));
        }
        let ints = [1i64, -2];
        let k = Keys::I64(&ints);
        assert_eq!(&*k.key(0), &1i64.to_le_bytes());
        assert_eq!(&*k.key(1), &(-2i64).to_le_bytes());
        assert_eq!(p.len(), 2);
        let tail = p.slice(1..2);
        assert_eq!((tail.len(), &*tail.key(0)), (1, &b"c"[..]));
        assert_eq!(&*k.slice(1..2).key(0), &(-2i64).to_le_bytes());
    }

    #[test]
    fn bad_packed_offsets_are_refused() {
        let bad: [&[i64]; 4] = [&[], &[-1, 2], &[0, 2, 1], &[0, 4]];
        for offsets in bad {
            let k = Keys::Packed {
                offsets,
                data: b"abc",
            };
            assert!(k.validate().is_err(), "{offsets:?}");
        }
        assert!(
            Keys::Packed {
                offsets: &[0],
                data: b""
            }
            .validate()
            .is_ok(),
            "no keys"
        );
    }
}
