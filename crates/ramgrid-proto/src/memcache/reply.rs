//! Reply writers: append memcached replies straight into an output buffer, with integer
//! formatting on the stack, so that a multi-key get allocates nothing per key.

use super::base64;

/// `STORED\r\n`
pub const STORED: &[u8] = b"STORED\r\n";
/// `NOT_STORED\r\n`
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
/// `EXISTS\r\n`
pub const EXISTS: &[u8] = b"EXISTS\r\n";
/// `NOT_FOUND\r\n`
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
/// `DELETED\r\n`
pub const DELETED: &[u8] = b"DELETED\r\n";
/// `TOUCHED\r\n`
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
/// `OK\r\n`
pub const OK: &[u8] = b"OK\r\n";
/// `END\r\n`
pub const END: &[u8] = b"END\r\n";
/// `ERROR\r\n`
pub const ERROR: &[u8] = b"ERROR\r\n";
/// `MN\r\n`
pub const MN: &[u8] = b"MN\r\n";
/// `CLIENT_ERROR cannot increment or decrement non-numeric value\r\n`
pub const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
/// `CLIENT_ERROR flush_all not allowed\r\n`
pub const FLUSH_NOT_ALLOWED: &[u8] = b"CLIENT_ERROR flush_all not allowed\r\n";
/// `SERVER_ERROR object too large for cache\r\n`
pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
/// `SERVER_ERROR out of memory storing object\r\n`
pub const OUT_OF_MEMORY_STORING: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";
/// `SERVER_ERROR out of memory\r\n` (incr/decr and ma)
pub const OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory\r\n";

/// Appends `n` in decimal.
#[inline]
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    if n < 10 {
        // Flags are mostly 0 and small values have one-digit lengths: no buffer to copy.
        out.push(b'0' + n as u8);
        return;
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends `n` in decimal, with a `-` when negative.
#[inline]
pub fn push_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    push_u64(out, n.unsigned_abs());
}

/// Appends one item of a get reply: `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`.
#[inline]
pub fn write_value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.reserve(key.len() + data.len() + 48);
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_u64(out, data.len() as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends the start of a meta `VA` line: `VA <len>` (flags and CRLF follow).
pub fn write_meta_va(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(b"VA ");
    push_u64(out, len as u64);
}

/// Appends a meta return flag with a number: ` <flag><n>`.
#[inline]
pub fn write_meta_flag_u64(out: &mut Vec<u8>, flag: u8, n: u64) {
    out.push(b' ');
    out.push(flag);
    push_u64(out, n);
}

/// Appends a meta return flag with a signed number: ` <flag><n>` (`t-1`).
pub fn write_meta_flag_i64(out: &mut Vec<u8>, flag: u8, n: i64) {
    out.push(b' ');
    out.push(flag);
    push_i64(out, n);
}

/// Appends the echo of an opaque token: ` O<opaque>`.
pub fn write_meta_opaque(out: &mut Vec<u8>, opaque: &[u8]) {
    out.extend_from_slice(b" O");
    out.extend_from_slice(opaque);
}

/// Appends the `k` return flag: ` k<key>`, or ` k<base64 key> b` for a binary key.
pub fn write_meta_key(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        base64::encode_into(out, key);
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Appends `key` as it is shown to a client: plain, or base64 for a binary key (`me`).
pub fn write_key(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    if binary {
        base64::encode_into(out, key);
    } else {
        out.extend_from_slice(key);
    }
}

/// Appends one `STAT <name> <value>\r\n` line with a numeric value.
pub fn write_stat_u64(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    push_u64(out, value);
    out.extend_from_slice(b"\r\n");
}

/// Appends one `STAT <name> <value>\r\n` line with a text value.
pub fn write_stat_str(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        let mut out = Vec::new();
        for n in [0u64, 7, 10, 99, 12345, u64::MAX] {
            out.clear();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
        for n in [0i64, -1, 42, i64::MIN, i64::MAX] {
            out.clear();
            push_i64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }

    #[test]
    fn value_lines() {
        let mut out = Vec::new();
        write_value(&mut out, b"k", 5, b"abc", None);
        write_value(&mut out, b"k2", 0, b"", Some(99));
        assert_eq!(out, b"VALUE k 5 3\r\nabc\r\nVALUE k2 0 0 99\r\n\r\n");
    }

    #[test]
    fn meta_pieces() {
        let mut out = Vec::new();
        write_meta_va(&mut out, 5);
        write_meta_flag_u64(&mut out, b's', 5);
        write_meta_flag_i64(&mut out, b't', -1);
        write_meta_opaque(&mut out, b"99");
        write_meta_key(&mut out, b"a", true);
        write_meta_key(&mut out, b"m1", false);
        assert_eq!(out, b"VA 5 s5 t-1 O99 kYQ== b km1");
        out.clear();
        write_stat_u64(&mut out, "pid", 12);
        write_stat_str(&mut out, "version", "x");
        assert_eq!(out, b"STAT pid 12\r\nSTAT version x\r\n");
    }
}
