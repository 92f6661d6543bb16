//! Replies to GET, PUT and DELETE: values with a status per key (GET), statuses per key (PUT,
//! DELETE); decoded as zero-copy views and encoded by writers that append into the output buffer.

use super::error::FrameError;
use super::frame::{Opcode, Pending, FLAG_RESPONSE};
use super::types::{check_key_statuses, KeyStatus, Status, ValueType};
use super::wire::{self, put_u32, put_u8, Reader};

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
