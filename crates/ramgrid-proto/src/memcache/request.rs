//! The parsed form of a memcached request. Everything borrows from the input buffer: keys,
//! values, opaque tokens and the key list of a multi-key get are slices of it.

use std::ops::Deref;

use super::base64;
use super::num::{parse_i64, parse_u32, parse_u64};

/// One request, borrowing keys and data from the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request<'a> {
    /// `get <key>+` (`with_cas: false`) or `gets <key>+` (`with_cas: true`).
    Get {
        /// The keys, in request order (duplicates kept).
        keys: Keys<'a>,
        /// `gets`: include the CAS unique in each `VALUE` line.
        with_cas: bool,
    },
    /// `gat <exptime> <key>*` or `gats <exptime> <key>*`: get and set a new exptime.
    Gat {
        /// Protocol exptime (relative seconds, absolute unix time, or negative).
        exptime: i64,
        /// The keys, possibly none.
        keys: Keys<'a>,
        /// `gats`: include the CAS unique.
        with_cas: bool,
    },
    /// `set`, `add`, `replace`, `append`, `prepend` or `cas`, with its data block.
    Store(Store<'a>),
    /// `delete <key> [0] [noreply]`.
    Delete {
        /// The key.
        key: &'a [u8],
        /// Send no reply.
        noreply: bool,
    },
    /// `incr` (`incr: true`) or `decr <key> <delta> [noreply]`.
    Arith {
        /// The key.
        key: &'a [u8],
        /// Amount to add or subtract.
        delta: u64,
        /// `incr` rather than `decr`.
        incr: bool,
        /// Send no reply.
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`.
    Touch {
        /// The key.
        key: &'a [u8],
        /// Protocol exptime.
        exptime: i64,
        /// Send no reply.
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`.
    FlushAll {
        /// Protocol exptime at which to flush; `None` (or `<= 0`) means now.
        delay: Option<i64>,
        /// Send no reply.
        noreply: bool,
    },
    /// `stats [arg]`; only the first argument matters.
    Stats {
        /// The sub-command (`settings`, ...), if any.
        arg: Option<&'a [u8]>,
    },
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]`.
    Verbosity {
        /// The level (accepted and stored).
        level: u32,
        /// Send no reply.
        noreply: bool,
    },
    /// `quit`: close the connection after earlier replies are written.
    Quit,
    /// `mg <key> <flag>*`.
    MetaGet(Meta<'a>),
    /// `ms <key> <datalen> <flag>*` and its data block.
    MetaSet {
        /// Key and flags.
        meta: Meta<'a>,
        /// The value.
        data: &'a [u8],
    },
    /// `md <key> <flag>*`.
    MetaDelete(Meta<'a>),
    /// `ma <key> <flag>*`.
    MetaArith(Meta<'a>),
    /// `mn`: answers `MN`, a marker that everything before it was processed.
    MetaNoop,
    /// `me <key> [b]`: the human-readable item dump.
    MetaDebug {
        /// The key (base64 when followed by `b`).
        key: MetaKey<'a>,
    },
}

/// How a storage command treats an existing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// `set`.
    Set,
    /// `add`.
    Add,
    /// `replace`.
    Replace,
    /// `append`.
    Append,
    /// `prepend`.
    Prepend,
    /// `cas` with the client's CAS unique.
    Cas(u64),
}

impl StoreMode {
    /// The command name on the wire.
    pub fn command(self) -> &'static str {
        match self {
            StoreMode::Set => "set",
            StoreMode::Add => "add",
            StoreMode::Replace => "replace",
            StoreMode::Append => "append",
            StoreMode::Prepend => "prepend",
            StoreMode::Cas(_) => "cas",
        }
    }
}

/// A text-protocol storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Store<'a> {
    /// Which command.
    pub mode: StoreMode,
    /// The key.
    pub key: &'a [u8],
    /// Opaque client flags (ignored by append/prepend, which keep the item's).
    pub flags: u32,
    /// Protocol exptime (ignored by append/prepend).
    pub exptime: i64,
    /// The data block, without its CRLF.
    pub data: &'a [u8],
    /// Send no reply.
    pub noreply: bool,
}

/// Space-separated tokens of a byte string; runs of spaces count as one separator.
#[derive(Debug, Clone)]
pub struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    /// Tokens of `s`.
    pub fn new(s: &'a [u8]) -> Self {
        Tokens { rest: s }
    }

    /// What has not been consumed yet, leading spaces included.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let s = &self.rest[start..];
        // A plain loop, not memchr: tokens are short (keys are ~10-40 bytes), and for those the
        // call and set-up of a vectorised search cost more than the scan (a 100-key get splits
        // its line 200 times).
        let end = s.iter().position(|&b| b == b' ').unwrap_or(s.len());
        self.rest = &s[end..];
        Some(&s[..end])
    }
}

/// The keys of a multi-key get: the raw span of the line plus its key count, so that a 100-key
/// get costs no allocation. Two `Keys` are equal when they hold the same keys in the same order.
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    span: &'a [u8],
    count: usize,
}

impl<'a> Keys<'a> {
    /// The keys in `span`, separated by spaces. The caller is responsible for key validity
    /// (at most 250 bytes; no NUL, newline or space can be in one); the parser checks that before
    /// building one.
    pub fn new(span: &'a [u8]) -> Self {
        Keys {
            span,
            count: Tokens::new(span).count(),
        }
    }

    /// [`Keys::new`] for a parser that has just counted the keys of `span` (`count` of them).
    pub(crate) fn counted(span: &'a [u8], count: usize) -> Self {
        debug_assert_eq!(Tokens::new(span).count(), count);
        Keys { span, count }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The keys in request order.
    pub fn iter(&self) -> Tokens<'a> {
        Tokens::new(self.span)
    }
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.iter().eq(other.iter())
    }
}

impl Eq for Keys<'_> {}

impl<'a> IntoIterator for &Keys<'a> {
    type Item = &'a [u8];
    type IntoIter = Tokens<'a>;
    fn into_iter(self) -> Tokens<'a> {
        self.iter()
    }
}

/// The key of a meta command as sent: plain, or base64 (flag `b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaKey<'a> {
    /// The key token exactly as on the wire.
    pub raw: &'a [u8],
    /// `raw` is base64 of the real (binary) key. The parser only sets this for valid base64.
    pub base64: bool,
}

impl<'a> MetaKey<'a> {
    /// A plain key.
    pub fn text(raw: &'a [u8]) -> Self {
        MetaKey { raw, base64: false }
    }

    /// The real key bytes: `raw` itself, or its decoded form (on the stack for keys of up to 192
    /// bytes). An invalid base64 key (which the parser never produces) yields the raw bytes.
    pub fn bytes(&self) -> KeyBytes<'a> {
        if !self.base64 {
            return KeyBytes::Borrowed(self.raw);
        }
        match base64::decoded_len(self.raw) {
            Some(len) if len <= INLINE_KEY => {
                let mut buf = [0u8; INLINE_KEY];
                let n = base64::decode_into(self.raw, &mut buf).unwrap_or(0);
                KeyBytes::Inline { buf, len: n as u8 }
            }
            Some(len) => {
                let mut buf = vec![0u8; len];
                let n = base64::decode_into(self.raw, &mut buf).unwrap_or(0);
                buf.truncate(n);
                KeyBytes::Heap(buf)
            }
            None => KeyBytes::Borrowed(self.raw),
        }
    }
}

const INLINE_KEY: usize = 192;

/// Key bytes of a [`MetaKey`], decoded without a heap allocation for keys up to 192 bytes.
#[derive(Debug, Clone)]
pub enum KeyBytes<'a> {
    /// A plain key, straight from the buffer.
    Borrowed(&'a [u8]),
    /// A decoded base64 key.
    Inline {
        /// Storage.
        buf: [u8; INLINE_KEY],
        /// Used length.
        len: u8,
    },
    /// A decoded base64 key longer than the inline buffer.
    Heap(Vec<u8>),
}

impl Deref for KeyBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            KeyBytes::Borrowed(b) => b,
            KeyBytes::Inline { buf, len } => &buf[..usize::from(*len)],
            KeyBytes::Heap(v) => v,
        }
    }
}

/// A meta command's key and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta<'a> {
    /// The key.
    pub key: MetaKey<'a>,
    /// The flags.
    pub flags: MetaFlags<'a>,
}

/// The flags of a meta command: the raw tokens (the order in which return flags are echoed) and
/// the values of the flags that carry one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFlags<'a> {
    span: &'a [u8],
    seen: u128,
    opaque: Option<&'a [u8]>,
    ttl: Option<i64>,
    vivify: Option<i64>,
    recache: Option<i64>,
    client_flags: Option<u32>,
    compare_cas: Option<u64>,
    new_cas: Option<u64>,
    mode: Option<u8>,
    delta: Option<u64>,
    initial: Option<u64>,
}

/// Why the flags of a meta command were refused; maps to memcached's error lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagError {
    /// Stops the scan at once (duplicate flag, unknown flag).
    Fatal(&'static str),
    /// Reported after the scan; a later error replaces an earlier one, as in memcached.
    Bad(&'static str),
}

pub(crate) const CE_DUPLICATE_FLAG: &str = "CLIENT_ERROR duplicate flag\r\n";
pub(crate) const CE_INVALID_FLAG: &str = "CLIENT_ERROR invalid flag\r\n";
pub(crate) const CE_DECODING_KEY: &str = "CLIENT_ERROR error decoding key\r\n";
pub(crate) const CE_BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format\r\n";
pub(crate) const CE_FORMAT: &str = "CLIENT_ERROR bad command line format\r\n";
pub(crate) const CE_M_LENGTH: &str = "CLIENT_ERROR incorrect length for M token\r\n";
pub(crate) const CE_INITIAL: &str = "CLIENT_ERROR invalid numeric initial value\r\n";
pub(crate) const CE_DELTA_VALUE: &str = "CLIENT_ERROR invalid numeric delta value\r\n";

impl<'a> MetaFlags<'a> {
    /// Parses flag tokens (`"v t T30 Oabc"`). Accepts every flag any meta command accepts,
    /// including `E`; returns `None` on a duplicate, unknown or malformed flag. Whether `b`
    /// makes the key valid base64 is the caller's concern.
    pub fn new(span: &'a [u8]) -> Option<Self> {
        Self::scan(span, None, true).ok()
    }

    /// The flag scan behind the parser. `key` is checked as base64 when `b` is present;
    /// `allow_e` says whether `E` is known (memcached before 1.6.21 does not know it).
    pub(crate) fn scan(
        span: &'a [u8],
        key: Option<&[u8]>,
        allow_e: bool,
    ) -> Result<Self, &'static str> {
        let span = trim_spaces(span);
        let mut f = MetaFlags {
            span,
            ..MetaFlags::default()
        };
        let mut pending: Option<&'static str> = None;
        for tok in Tokens::new(span) {
            match f.one(tok, key, allow_e) {
                Ok(()) => {}
                Err(FlagError::Fatal(e)) => return Err(e),
                // memcached keeps scanning and reports the last problem; an `F` problem keeps
                // whatever message was set before it (the default is the generic format error).
                Err(FlagError::Bad(e)) => {
                    pending = Some(if e.is_empty() {
                        pending.unwrap_or(CE_FORMAT)
                    } else {
                        e
                    })
                }
            }
        }
        match pending {
            Some(e) => Err(e),
            None => Ok(f),
        }
    }

    fn one(&mut self, tok: &'a [u8], key: Option<&[u8]>, allow_e: bool) -> Result<(), FlagError> {
        let c = tok[0];
        if c >= 127 || self.seen & (1u128 << c) != 0 {
            return Err(FlagError::Fatal(CE_DUPLICATE_FLAG));
        }
        self.seen |= 1u128 << c;
        let arg = &tok[1..];
        let bad = FlagError::Bad;
        match c {
            b'b' => {
                if let Some(key) = key {
                    if base64::decoded_len(key).is_none() {
                        return Err(bad(CE_DECODING_KEY));
                    }
                }
            }
            b'N' => self.vivify = Some(parse_i64(arg).ok_or(bad(CE_BAD_TOKEN))?),
            b'T' => self.ttl = Some(parse_i64(arg).ok_or(bad(CE_BAD_TOKEN))?),
            b'R' => self.recache = Some(parse_i64(arg).ok_or(bad(CE_BAD_TOKEN))?),
            b'O' => self.opaque = Some(arg),
            b'F' => self.client_flags = Some(parse_u32(arg).ok_or(bad(""))?),
            b'C' => self.compare_cas = Some(parse_u64(arg).ok_or(bad(CE_BAD_TOKEN))?),
            b'E' if allow_e => self.new_cas = Some(parse_u64(arg).ok_or(bad(CE_BAD_TOKEN))?),
            b'M' => {
                if tok.len() != 2 {
                    return Err(bad(CE_M_LENGTH));
                }
                self.mode = Some(tok[1]);
            }
            b'J' => self.initial = Some(parse_u64(arg).ok_or(bad(CE_INITIAL))?),
            b'D' => self.delta = Some(parse_u64(arg).ok_or(bad(CE_DELTA_VALUE))?),
            b'P' | b'L' | b'l' | b'k' | b's' | b't' | b'c' | b'f' | b'v' | b'h' | b'u' | b'q'
            | b'I' => {}
            _ => return Err(FlagError::Fatal(CE_INVALID_FLAG)),
        }
        Ok(())
    }

    /// The flag tokens as sent, in order (the order return flags are echoed in).
    pub fn tokens(&self) -> Tokens<'a> {
        Tokens::new(self.span)
    }

    /// The flag tokens as one span (what the composer writes).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.span
    }

    /// Number of flag tokens.
    pub fn len(&self) -> usize {
        self.seen.count_ones() as usize
    }

    /// Whether there are no flags.
    pub fn is_empty(&self) -> bool {
        self.seen == 0
    }

    /// Whether the single-character flag `flag` is present (`b'v'`, `b'q'`, `b'T'`...).
    #[inline]
    pub fn has(&self, flag: u8) -> bool {
        flag < 127 && self.seen & (1u128 << flag) != 0
    }

    /// `q`: suppress the nominal reply.
    pub fn quiet(&self) -> bool {
        self.has(b'q')
    }

    /// `O<token>`: the opaque token, without its `O`.
    pub fn opaque(&self) -> Option<&'a [u8]> {
        self.opaque
    }

    /// `T<exptime>`: new TTL.
    pub fn ttl(&self) -> Option<i64> {
        self.ttl
    }

    /// `N<exptime>`: vivify on miss with this TTL.
    pub fn vivify(&self) -> Option<i64> {
        self.vivify
    }

    /// `R<secs>`: recache threshold: a hit with less TTL left wins the token (`W`).
    pub fn recache(&self) -> Option<i64> {
        self.recache
    }

    /// `F<flags>`: client flags for `ms`.
    pub fn client_flags(&self) -> Option<u32> {
        self.client_flags
    }

    /// `C<cas>`: compare-and-swap token.
    pub fn compare_cas(&self) -> Option<u64> {
        self.compare_cas
    }

    /// `E<cas>`: the CAS the item gets if the command writes it.
    pub fn new_cas(&self) -> Option<u64> {
        self.new_cas
    }

    /// `M<mode>`: mode switch character.
    pub fn mode(&self) -> Option<u8> {
        self.mode
    }

    /// `D<delta>`: `ma` delta (default 1).
    pub fn delta(&self) -> Option<u64> {
        self.delta
    }

    /// `J<initial>`: `ma` initial value on vivify (default 0).
    pub fn initial(&self) -> Option<u64> {
        self.initial
    }
}

pub(crate) fn trim_spaces(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ').unwrap_or(s.len());
    let end = s.iter().rposition(|&b| b != b' ').map_or(start, |i| i + 1);
    &s[start..end]
}
