//! Bounds-checked little-endian reading and writing shared by every native message.

use super::error::FrameError;
use super::types::{ValueType, MAX_VECTOR_DIM};

/// Longest string carried in a u16-length field (table names are further limited).
pub(crate) const MAX_STR16: usize = u16::MAX as usize;

/// A cursor over a message body. Every read names the field it reads so a truncated body reports
/// where it ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// The bytes between two positions already read past.
    pub(crate) fn slice(&self, start: usize, end: usize) -> &'a [u8] {
        &self.buf[start..end]
    }

    /// Everything not read yet.
    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FrameError> {
        if n > self.remaining() {
            return Err(FrameError::Truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FrameError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, FrameError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FrameError::Malformed(what)),
        }
    }

    pub(crate) fn bytes16(&mut self, what: &'static str) -> Result<&'a [u8], FrameError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }

    pub(crate) fn bytes32(&mut self, what: &'static str) -> Result<&'a [u8], FrameError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    pub(crate) fn str32(&mut self, what: &'static str) -> Result<&'a str, FrameError> {
        std::str::from_utf8(self.bytes32(what)?).map_err(|_| FrameError::Malformed(what))
    }

    pub(crate) fn str16(&mut self, what: &'static str) -> Result<&'a str, FrameError> {
        std::str::from_utf8(self.bytes16(what)?).map_err(|_| FrameError::Malformed(what))
    }

    /// A table name: a non-empty UTF-8 string of at most [`super::MAX_NAME_LEN`] bytes.
    pub(crate) fn name(&mut self, what: &'static str) -> Result<&'a str, FrameError> {
        let s = self.str16(what)?;
        if s.is_empty() || s.len() > super::MAX_NAME_LEN {
            return Err(FrameError::Malformed(what));
        }
        Ok(s)
    }

    pub(crate) fn value_type(&mut self) -> Result<ValueType, FrameError> {
        let kind = self.u8("value type")?;
        let dim = self.u32("value type dim")?;
        ValueType::from_wire(kind, dim).ok_or(FrameError::Malformed("value type"))
    }

    pub(crate) fn durability(&mut self) -> Result<super::Durability, FrameError> {
        let b = self.u8("durability")?;
        super::Durability::from_u8(b).ok_or(FrameError::Malformed("durability"))
    }

    /// Rejects bytes left over after the last field: a body must be exactly one message.
    pub(crate) fn finish(self) -> Result<(), FrameError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(FrameError::TrailingBytes(n)),
        }
    }
}

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn patch_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_bytes16(
    out: &mut Vec<u8>,
    b: &[u8],
    what: &'static str,
) -> Result<(), FrameError> {
    let n = u16::try_from(b.len()).map_err(|_| FrameError::Encode(what))?;
    put_u16(out, n);
    out.extend_from_slice(b);
    Ok(())
}

pub(crate) fn put_bytes32(
    out: &mut Vec<u8>,
    b: &[u8],
    what: &'static str,
) -> Result<(), FrameError> {
    let n = u32::try_from(b.len()).map_err(|_| FrameError::Encode(what))?;
    put_u32(out, n);
    out.extend_from_slice(b);
    Ok(())
}

pub(crate) fn put_str16(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), FrameError> {
    put_bytes16(out, s.as_bytes(), what)
}

pub(crate) fn put_name(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), FrameError> {
    if s.is_empty() || s.len() > super::MAX_NAME_LEN {
        return Err(FrameError::Encode(what));
    }
    put_str16(out, s, what)
}

pub(crate) fn put_value_type(out: &mut Vec<u8>, vt: ValueType) -> Result<(), FrameError> {
    let (kind, dim) = vt.to_wire();
    if let ValueType::F32Vec(d) = vt {
        if d == 0 || d > MAX_VECTOR_DIM {
            return Err(FrameError::Encode("vector dimension"));
        }
    }
    put_u8(out, kind);
    put_u32(out, dim);
    Ok(())
}

/// Cuts `s` to at most `max` bytes on a character boundary (for human-readable messages only).
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
