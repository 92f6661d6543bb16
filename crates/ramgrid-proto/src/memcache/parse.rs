//! The request parser. It mirrors memcached 1.6.18's `proto_text.c` decisions (token counts,
//! the order of checks, which errors swallow a data block, when `noreply` silences an error) so
//! that every reply matches byte for byte; where ramgrid is stricter, `docs/protocol.md` says so.

use std::borrow::Cow;

use memchr::memchr;

use super::num::{parse_i64, parse_u32, parse_u64};
use super::request::{
    trim_spaces, Keys, Meta, MetaFlags, MetaKey, Request, Store, StoreMode, Tokens, CE_FORMAT,
};
use super::{Limits, ParseError};

/// memcached's tokenizer bound (command included); lines with more tokens only ever fail the
/// arity checks, so counting them is enough.
const MAX_TOKENS: usize = 24;
/// Most flag tokens a meta command may carry (memcached: `MFLAG_MAX_OPT_LENGTH` tokens in all).
const MAX_META_FLAGS: usize = 17;
/// Longest `O` token, the `O` included (memcached: `MFLAG_MAX_OPAQUE_LENGTH`).
const MAX_OPAQUE_TOKEN: usize = 32;

pub(crate) const ERROR: &str = "ERROR\r\n";
pub(crate) const CE_DELTA_ARG: &str = "CLIENT_ERROR invalid numeric delta argument\r\n";
pub(crate) const CE_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument\r\n";
pub(crate) const CE_DELETE_USAGE: &str =
    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
pub(crate) const CE_BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk\r\n";
pub(crate) const CE_TOO_MANY_KEYS: &str = "CLIENT_ERROR too many keys\r\n";
pub(crate) const SE_TOO_LARGE: &str = "SERVER_ERROR object too large for cache\r\n";
const CE_MG_TOO_LONG: &str = "CLIENT_ERROR options flags are too long\r\n";
const CE_META_TOO_LONG: &str = "CLIENT_ERROR options flags too long\r\n";
const CE_INVALID_OR_DUP: &str = "CLIENT_ERROR invalid or duplicate flag\r\n";
const CE_OPAQUE: &str = "CLIENT_ERROR opaque token too long\r\n";
const CE_MS_MODE: &str = "CLIENT_ERROR invalid mode for ms M token\r\n";
const CE_MA_MODE: &str = "CLIENT_ERROR invalid mode for ma M token\r\n";
const SHUTDOWN_DISABLED: &str = "ERROR: shutdown not enabled\r\n";

type Parsed<'a> = Result<(Request<'a>, usize), ParseError>;

fn recoverable(consumed: usize, reply: &'static str) -> ParseError {
    ParseError::Recoverable {
        consumed,
        reply: Cow::Borrowed(reply),
    }
}

/// A recoverable error that `noreply` silences (the text protocol's rule).
fn quiet_unless(noreply: bool, consumed: usize, reply: &'static str) -> ParseError {
    recoverable(consumed, if noreply { "" } else { reply })
}

fn fatal(reason: &'static str) -> ParseError {
    ParseError::Fatal {
        reply: Cow::Borrowed(""),
        reason,
    }
}

pub(crate) fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let Some(&first) = buf.first() else {
        return Err(ParseError::Incomplete);
    };
    if first >= 0x80 {
        // memcached's binary protocol starts with 0x80; no text command does.
        return Err(fatal("binary protocol or non-text first byte"));
    }
    // A line is at most max_line_len bytes plus "\r\n"; looking further is wasted work.
    let window = &buf[..buf.len().min(limits.max_line_len.saturating_add(2))];
    let Some(nl) = memchr(b'\n', window) else {
        if window.len() >= limits.max_line_len.saturating_add(2) {
            return Err(fatal("command line too long"));
        }
        return Err(ParseError::Incomplete);
    };
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > limits.max_line_len {
        return Err(fatal("command line too long"));
    }
    // memcached 1.6.18 tokenizes the line as a C string (`strlen`), so a NUL ends it: whatever
    // follows, up to the '\n', is consumed unread. Every other byte, control bytes included, is
    // part of a token (only a space separates), so a key is any 1 to 250 bytes but NUL, '\n' and
    // space (docs/protocol.md, section 1, item 5).
    let line = memchr(0, line).map_or(line, |nul| &line[..nul]);
    parse_line(buf, line, nl + 1, limits)
}

/// Splits `line` into at most [`MAX_TOKENS`] tokens and returns how many there are in all.
fn tokenize<'a>(line: &'a [u8], toks: &mut [&'a [u8]; MAX_TOKENS]) -> usize {
    let mut n = 0;
    for tok in Tokens::new(line) {
        if n < MAX_TOKENS {
            toks[n] = tok;
        }
        n += 1;
    }
    n
}

fn parse_line<'a>(buf: &'a [u8], line: &'a [u8], line_len: usize, limits: &Limits) -> Parsed<'a> {
    let mut words = Tokens::new(line);
    let cmd = match words.next() {
        Some(cmd) if cmd.len() >= 2 => cmd,
        _ => return Err(recoverable(line_len, ERROR)),
    };
    match cmd {
        b"get" | b"gets" => return parse_get(words, cmd == b"gets", false, line_len, limits),
        b"gat" | b"gats" => return parse_get(words, cmd == b"gats", true, line_len, limits),
        _ => {}
    }
    let mut toks: [&[u8]; MAX_TOKENS] = [&[]; MAX_TOKENS];
    let n = tokenize(line, &mut toks);
    let toks = &toks[..n.min(MAX_TOKENS)];
    let ok = |req| Ok((req, line_len));
    match cmd {
        b"set" => parse_store(StoreMode::Set, toks, n, buf, line_len, limits),
        b"add" => parse_store(StoreMode::Add, toks, n, buf, line_len, limits),
        b"replace" => parse_store(StoreMode::Replace, toks, n, buf, line_len, limits),
        b"append" => parse_store(StoreMode::Append, toks, n, buf, line_len, limits),
        b"prepend" => parse_store(StoreMode::Prepend, toks, n, buf, line_len, limits),
        b"cas" => parse_store(StoreMode::Cas(0), toks, n, buf, line_len, limits),
        b"delete" => parse_delete(toks, n, line_len, limits),
        b"incr" | b"decr" => parse_arith(cmd == b"incr", toks, n, line_len, limits),
        b"touch" => parse_touch(toks, n, line_len, limits),
        b"mg" | b"md" | b"ma" => parse_meta(cmd[1], toks, n, line, line_len, limits),
        b"ms" => parse_meta_set(toks, n, line, buf, line_len, limits),
        b"mn" => ok(Request::MetaNoop),
        b"me" => parse_meta_debug(toks, n, line_len, limits),
        b"stats" => ok(Request::Stats {
            arg: toks.get(1).copied(),
        }),
        b"version" => ok(Request::Version),
        b"quit" => ok(Request::Quit),
        b"flush_all" => parse_flush_all(toks, n, line_len),
        b"verbosity" => parse_verbosity(toks, n, line_len),
        b"shutdown" => Err(recoverable(line_len, SHUTDOWN_DISABLED)),
        _ => Err(unknown_command(cmd, toks, line_len)),
    }
}

fn unknown_command(cmd: &[u8], toks: &[&[u8]], line_len: usize) -> ParseError {
    // memcached branches on the first letter of known commands and answers ERROR inside those
    // branches; only the remaining names get the check for an HTTP request line, which it closes.
    let known_branch = matches!(cmd[0], b'g' | b's' | b'a' | b'c' | b'i' | b'd' | b't')
        || (cmd[0] == b'm' && cmd.len() == 2);
    // memcached looks at the last of the first 23 tokens.
    let last = toks
        .get(toks.len().min(MAX_TOKENS - 1).wrapping_sub(1))
        .copied()
        .unwrap_or_default();
    if !known_branch && last.starts_with(b"HTTP/") {
        return fatal("HTTP request");
    }
    recoverable(line_len, ERROR)
}

fn parse_get<'a>(
    mut words: Tokens<'a>,
    with_cas: bool,
    touch: bool,
    line_len: usize,
    limits: &Limits,
) -> Parsed<'a> {
    let mut exptime = 0;
    if touch {
        let Some(tok) = words.next() else {
            return Err(recoverable(line_len, ERROR));
        };
        exptime = parse_i64(tok).ok_or_else(|| recoverable(line_len, CE_EXPTIME))?;
    }
    let span = trim_spaces(words.rest());
    let mut count = 0;
    for key in Tokens::new(span) {
        if key.len() > limits.max_key_len {
            return Err(recoverable(line_len, CE_FORMAT));
        }
        count += 1;
    }
    if count == 0 && !touch {
        return Err(recoverable(line_len, ERROR));
    }
    if count > limits.max_keys_per_get {
        return Err(recoverable(line_len, CE_TOO_MANY_KEYS));
    }
    let keys = Keys::counted(span, count);
    let req = if touch {
        Request::Gat {
            exptime,
            keys,
            with_cas,
        }
    } else {
        Request::Get { keys, with_cas }
    };
    Ok((req, line_len))
}

/// Where a data block of `vlen` bytes plus CRLF ends, or what to do if it cannot be taken yet.
/// `quiet_errors` silences the bad-chunk error (text `noreply`; meta commands always report).
fn data_block(
    buf: &[u8],
    line_len: usize,
    vlen: usize,
    quiet_errors: bool,
) -> Result<(&[u8], usize), ParseError> {
    let total = line_len + vlen + 2;
    if buf.len() < total {
        return Err(ParseError::Incomplete);
    }
    if &buf[line_len + vlen..total] != b"\r\n" {
        // memcached reads exactly vlen + 2 bytes before it looks at the terminator.
        return Err(quiet_unless(quiet_errors, total, CE_BAD_CHUNK));
    }
    Ok((&buf[line_len..line_len + vlen], total))
}

/// A value length as memcached accepts it: a non-negative 32-bit int that leaves room for CRLF.
fn parse_vlen(tok: &[u8]) -> Option<usize> {
    let v = parse_i64(tok)?;
    if !(0..=i64::from(i32::MAX) - 2).contains(&v) {
        return None;
    }
    usize::try_from(v).ok()
}

fn parse_store<'a>(
    mode: StoreMode,
    toks: &[&'a [u8]],
    n: usize,
    buf: &'a [u8],
    line_len: usize,
    limits: &Limits,
) -> Parsed<'a> {
    let is_cas = matches!(mode, StoreMode::Cas(_));
    let want = if is_cas { 6 } else { 5 };
    if n != want && n != want + 1 {
        return Err(recoverable(line_len, ERROR));
    }
    let noreply = toks[n - 1] == b"noreply";
    let key = toks[1];
    let format_error = || quiet_unless(noreply, line_len, CE_FORMAT);
    if key.len() > limits.max_key_len {
        return Err(format_error());
    }
    let flags = parse_u32(toks[2]).ok_or_else(format_error)?;
    let exptime = parse_i64(toks[3]).ok_or_else(format_error)?;
    let vlen = parse_vlen(toks[4]);
    let mode = if is_cas {
        StoreMode::Cas(parse_u64(toks[5]).ok_or_else(format_error)?)
    } else {
        mode
    };
    let vlen = vlen.ok_or_else(format_error)?;
    if vlen > limits.max_value_len {
        // Answer now and swallow the data block as it arrives, without buffering it.
        return Err(quiet_unless(noreply, line_len + vlen + 2, SE_TOO_LARGE));
    }
    let (data, total) = data_block(buf, line_len, vlen, noreply)?;
    Ok((
        Request::Store(Store {
            mode,
            key,
            flags,
            exptime,
            data,
            noreply,
        }),
        total,
    ))
}

fn parse_delete<'a>(toks: &[&'a [u8]], n: usize, line_len: usize, limits: &Limits) -> Parsed<'a> {
    if !(2..=4).contains(&n) {
        return Err(recoverable(line_len, ERROR));
    }
    let mut noreply = false;
    if n > 2 {
        // `delete <key> 0` survives from the days of a delete hold time.
        let hold_is_zero = toks[2] == b"0";
        noreply = toks[n - 1] == b"noreply";
        let valid = (n == 3 && (hold_is_zero || noreply)) || (n == 4 && hold_is_zero && noreply);
        if !valid {
            return Err(quiet_unless(noreply, line_len, CE_DELETE_USAGE));
        }
    }
    let key = toks[1];
    if key.len() > limits.max_key_len {
        return Err(quiet_unless(noreply, line_len, CE_FORMAT));
    }
    Ok((Request::Delete { key, noreply }, line_len))
}

fn parse_arith<'a>(
    incr: bool,
    toks: &[&'a [u8]],
    n: usize,
    line_len: usize,
    limits: &Limits,
) -> Parsed<'a> {
    if n != 3 && n != 4 {
        return Err(recoverable(line_len, ERROR));
    }
    let noreply = toks[n - 1] == b"noreply";
    let key = toks[1];
    if key.len() > limits.max_key_len {
        return Err(quiet_unless(noreply, line_len, CE_FORMAT));
    }
    let delta = parse_u64(toks[2]).ok_or_else(|| quiet_unless(noreply, line_len, CE_DELTA_ARG))?;
    Ok((
        Request::Arith {
            key,
            delta,
            incr,
            noreply,
        },
        line_len,
    ))
}

fn parse_touch<'a>(toks: &[&'a [u8]], n: usize, line_len: usize, limits: &Limits) -> Parsed<'a> {
    if n != 3 && n != 4 {
        return Err(recoverable(line_len, ERROR));
    }
    let noreply = toks[n - 1] == b"noreply";
    let key = toks[1];
    if key.len() > limits.max_key_len {
        return Err(quiet_unless(noreply, line_len, CE_FORMAT));
    }
    let exptime = parse_i64(toks[2]).ok_or_else(|| quiet_unless(noreply, line_len, CE_EXPTIME))?;
    Ok((
        Request::Touch {
            key,
            exptime,
            noreply,
        },
        line_len,
    ))
}

fn parse_flush_all<'a>(toks: &[&'a [u8]], n: usize, line_len: usize) -> Parsed<'a> {
    if n > 3 {
        return Err(recoverable(line_len, ERROR));
    }
    let noreply = toks[n - 1] == b"noreply";
    let delay = if n != if noreply { 2 } else { 1 } {
        Some(parse_i64(toks[1]).ok_or_else(|| quiet_unless(noreply, line_len, CE_EXPTIME))?)
    } else {
        None
    };
    Ok((Request::FlushAll { delay, noreply }, line_len))
}

fn parse_verbosity<'a>(toks: &[&'a [u8]], n: usize, line_len: usize) -> Parsed<'a> {
    if n != 2 && n != 3 {
        return Err(recoverable(line_len, ERROR));
    }
    let noreply = toks[n - 1] == b"noreply";
    let level = parse_u32(toks[1]).ok_or_else(|| quiet_unless(noreply, line_len, CE_FORMAT))?;
    Ok((Request::Verbosity { level, noreply }, line_len))
}

/// The flag tokens of a meta line: everything after the first `skip` tokens.
fn flag_span(line: &[u8], skip: usize) -> &[u8] {
    let mut words = Tokens::new(line);
    for _ in 0..skip {
        words.next();
    }
    trim_spaces(words.rest())
}

fn opaque_ok(flags: &MetaFlags<'_>) -> bool {
    !matches!(flags.opaque(), Some(o) if o.len() >= MAX_OPAQUE_TOKEN)
}

/// mg, md and ma: no data block, errors always answered (meta commands ignore `q` for errors).
fn parse_meta<'a>(
    which: u8,
    toks: &[&'a [u8]],
    n: usize,
    line: &'a [u8],
    line_len: usize,
    limits: &Limits,
) -> Parsed<'a> {
    if n < 2 {
        return Err(recoverable(line_len, ERROR));
    }
    let err = |reply| Err(recoverable(line_len, reply));
    let raw = toks[1];
    if raw.len() > limits.max_key_len {
        return err(CE_FORMAT);
    }
    if n - 2 > MAX_META_FLAGS {
        return err(if which == b'g' {
            CE_MG_TOO_LONG
        } else {
            CE_META_TOO_LONG
        });
    }
    let flags = match MetaFlags::scan(flag_span(line, 2), Some(raw), true) {
        Ok(flags) => flags,
        // md and ma report every flag problem with one message.
        Err(e) => return err(if which == b'g' { e } else { CE_INVALID_OR_DUP }),
    };
    if which == b'a' && !matches!(flags.mode(), None | Some(b'I' | b'+' | b'D' | b'-')) {
        return err(CE_MA_MODE);
    }
    if !opaque_ok(&flags) {
        return err(CE_OPAQUE);
    }
    let meta = Meta {
        key: MetaKey {
            raw,
            base64: flags.has(b'b'),
        },
        flags,
    };
    let req = match which {
        b'g' => Request::MetaGet(meta),
        b'd' => Request::MetaDelete(meta),
        _ => Request::MetaArith(meta),
    };
    Ok((req, line_len))
}

fn parse_meta_set<'a>(
    toks: &[&'a [u8]],
    n: usize,
    line: &'a [u8],
    buf: &'a [u8],
    line_len: usize,
    limits: &Limits,
) -> Parsed<'a> {
    if n < 2 {
        return Err(recoverable(line_len, ERROR));
    }
    let raw = toks[1];
    if raw.len() > limits.max_key_len || n == 2 {
        return Err(recoverable(line_len, CE_FORMAT));
    }
    if n - 3 > MAX_META_FLAGS {
        return Err(recoverable(line_len, CE_META_TOO_LONG));
    }
    let vlen = parse_vlen(toks[2]).ok_or_else(|| recoverable(line_len, CE_FORMAT))?;
    // From here on the data length is known, so an error swallows the data block.
    let swallow = |reply| Err(recoverable(line_len + vlen + 2, reply));
    let flags = match MetaFlags::scan(flag_span(line, 3), Some(raw), true) {
        Ok(flags) => flags,
        Err(e) => return swallow(e),
    };
    if !matches!(flags.mode(), None | Some(b'E' | b'A' | b'P' | b'R' | b'S')) {
        return swallow(CE_MS_MODE);
    }
    if !opaque_ok(&flags) {
        return swallow(CE_OPAQUE);
    }
    if vlen > limits.max_value_len {
        return swallow(SE_TOO_LARGE);
    }
    let (data, total) = data_block(buf, line_len, vlen, false)?;
    let meta = Meta {
        key: MetaKey {
            raw,
            base64: flags.has(b'b'),
        },
        flags,
    };
    Ok((Request::MetaSet { meta, data }, total))
}

fn parse_meta_debug<'a>(
    toks: &[&'a [u8]],
    n: usize,
    line_len: usize,
    limits: &Limits,
) -> Parsed<'a> {
    if n < 2 || toks[1].len() > limits.max_key_len {
        return Err(recoverable(line_len, CE_FORMAT));
    }
    let raw = toks[1];
    let base64 = n >= 3 && toks[2] == b"b";
    if base64 && super::base64::decoded_len(raw).is_none() {
        return Err(recoverable(line_len, CE_FORMAT));
    }
    Ok((
        Request::MetaDebug {
            key: MetaKey { raw, base64 },
        },
        line_len,
    ))
}
