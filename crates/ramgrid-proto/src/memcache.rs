//! The memcached text and meta protocols.
//!
//! CONTRACT (fixed; implementation in progress): `parse_request`, `ParseError` and `Limits` are what
//! the server's connection loop calls. Keep their shapes; `Request` is the codec's to define.

use std::borrow::Cow;

/// Limits the parser enforces before allocating anything.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest key accepted (memcached: 250).
    pub max_key_len: usize,
    /// Largest value (data block) accepted for a storage command.
    pub max_value_len: usize,
    /// Longest command line (without its data block) before the connection is closed.
    pub max_line_len: usize,
    /// Most keys in one multi-key get.
    pub max_keys_per_get: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_key_len: 250, max_value_len: 1 << 20, max_line_len: 64 << 10, max_keys_per_get: 10_000 }
    }
}

/// Why a request could not be parsed, and what the connection should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not enough bytes yet: read more and call again with the same buffer start. Not an error.
    Incomplete,
    /// A bad request the connection survives: write `reply` (e.g. `ERROR\r\n`,
    /// `CLIENT_ERROR bad data chunk\r\n`), drop `consumed` bytes, continue.
    Recoverable {
        /// Bytes of the input to skip (the bad line, and its data block where memcached skips it).
        consumed: usize,
        /// The complete reply line(s), CRLF included.
        reply: Cow<'static, str>,
    },
    /// A violation we do not recover from (line too long, binary garbage, HTTP): write `reply`
    /// (may be empty) and close the connection.
    Fatal {
        /// The reply to send before closing, CRLF included; may be empty.
        reply: Cow<'static, str>,
        /// For logs and tests.
        reason: &'static str,
    },
}

/// A parsed request borrowing from the input buffer. Defined by the codec implementation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request<'a> {
    /// Placeholder until the codec lands.
    Version(std::marker::PhantomData<&'a ()>),
}

/// Parses one request from the front of `buf`. On success returns the request and the number of
/// bytes it used (command line plus any data block).
pub fn parse_request<'a>(buf: &'a [u8], limits: &Limits) -> Result<(Request<'a>, usize), ParseError> {
    let _ = (buf, limits);
    Err(ParseError::Incomplete)
}
