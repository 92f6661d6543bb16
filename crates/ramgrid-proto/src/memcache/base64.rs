//! Standard base64 (RFC 4648 alphabet, `=` padding) for meta binary keys (the `b` flag).
//!
//! Decoding is strict: the length is a multiple of four and `=` appears only as trailing
//! padding. Like memcached, unused low bits of the last symbol are ignored.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn sextet(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Length of the decoded form of `src`, or `None` if `src` is not valid base64 or decodes to
/// nothing (an empty key).
pub(crate) fn decoded_len(src: &[u8]) -> Option<usize> {
    if src.is_empty() || src.len() & 3 != 0 {
        return None;
    }
    let pad = src.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let body = &src[..src.len() - pad];
    if !body.iter().all(|&c| sextet(c).is_some()) {
        return None;
    }
    let len = src.len() / 4 * 3 - pad;
    (len > 0).then_some(len)
}

/// Decodes valid base64 (see [`decoded_len`]) into `out`, which must be at least that long.
/// Returns the number of bytes written, or `None` if `src` is invalid.
pub(crate) fn decode_into(src: &[u8], out: &mut [u8]) -> Option<usize> {
    let len = decoded_len(src)?;
    let mut pos = 0;
    for quad in src.chunks_exact(4) {
        let mut acc: u32 = 0;
        for &c in quad {
            acc = (acc << 6) | u32::from(sextet(c).unwrap_or(0));
        }
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        let take = (len - pos).min(3);
        out[pos..pos + take].copy_from_slice(&bytes[..take]);
        pos += take;
    }
    Some(len)
}

/// Appends the base64 encoding of `src` to `out`.
pub(crate) fn encode_into(out: &mut Vec<u8>, src: &[u8]) {
    for chunk in src.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let acc = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sym = |shift: u32| ALPHABET[((acc >> shift) & 63) as usize];
        out.push(sym(18));
        out.push(sym(12));
        out.push(if chunk.len() > 1 { sym(6) } else { b'=' });
        out.push(if chunk.len() > 2 { sym(0) } else { b'=' });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(src: &[u8]) -> Option<Vec<u8>> {
        let mut out = vec![0; src.len()];
        let n = decode_into(src, &mut out)?;
        out.truncate(n);
        Some(out)
    }

    #[test]
    fn known_vectors() {
        assert_eq!(decode(b"YQ==").as_deref(), Some(&b"a"[..]));
        assert_eq!(decode(b"YWI=").as_deref(), Some(&b"ab"[..]));
        assert_eq!(decode(b"YWJj").as_deref(), Some(&b"abc"[..]));
        assert_eq!(decode(b"AA==").as_deref(), Some(&b"\0"[..]));
        assert_eq!(decode(b"YW+/").as_deref(), Some(&[0x61, 0x6f, 0xbf][..]));
        // Unused low bits are ignored, as memcached does.
        assert_eq!(decode(b"YR==").as_deref(), Some(&b"a"[..]));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            &b""[..],
            b"Y",
            b"YQ",
            b"YQ=",
            b"YW-j",
            b"YW_j",
            b"!!!!",
            b"Y===",
            b"====",
            b"YQ==YQ==",
            b"Y=Q=",
        ] {
            assert_eq!(decoded_len(bad), None, "{bad:?}");
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn round_trip() {
        for len in 0..40usize {
            let src: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut enc = Vec::new();
            encode_into(&mut enc, &src);
            assert_eq!(enc.len(), len.div_ceil(3) * 4);
            if len > 0 {
                assert_eq!(decode(&enc).as_deref(), Some(&src[..]));
            }
        }
    }
}
