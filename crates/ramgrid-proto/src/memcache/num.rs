//! Decimal number parsing for protocol tokens, as strict as memcached's `safe_strto*` for every
//! input a client would send: an optional sign, then ASCII digits, nothing else, no overflow.

/// An unsigned decimal with an optional leading `+`. `-` is refused (memcached refuses negative
/// values here too).
pub(crate) fn parse_u64(tok: &[u8]) -> Option<u64> {
    let digits = match tok.first() {
        Some(b'+') => &tok[1..],
        _ => tok,
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(n)
}

/// [`parse_u64`] limited to 32 bits (client flags, verbosity).
pub(crate) fn parse_u32(tok: &[u8]) -> Option<u32> {
    parse_u64(tok).and_then(|n| u32::try_from(n).ok())
}

/// A signed decimal with an optional leading `+` or `-`.
pub(crate) fn parse_i64(tok: &[u8]) -> Option<i64> {
    let (neg, digits) = match tok.first() {
        Some(b'-') => (true, &tok[1..]),
        Some(b'+') => (false, &tok[1..]),
        _ => (false, tok),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        // Accumulate negatively so that i64::MIN parses.
        n = n.checked_mul(10)?;
        n = if neg {
            n.checked_sub(i64::from(d))?
        } else {
            n.checked_add(i64::from(d))?
        };
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"+5"), Some(5));
        assert_eq!(parse_u64(b"007"), Some(7));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        for bad in [&b""[..], b"+", b"-1", b"-0", b"1x", b"x1", b" 1", b"1.5"] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
    }

    #[test]
    fn signed() {
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"+1"), Some(1));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        for bad in [&b""[..], b"-", b"+", b"--1", b"1-", b"a"] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }
}
