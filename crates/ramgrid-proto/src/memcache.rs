//! The memcached text and meta protocols: a request parser, a request composer and the reply
//! writers the server uses, all pure functions over byte slices.
//!
//! The normative description of what is accepted and how each command is answered is
//! `docs/protocol.md`; the replies were checked byte for byte against memcached 1.6.18.
//!
//! CONTRACT (fixed): `parse_request`, `ParseError` and `Limits` are what the server's connection
//! loop calls. `Request` is defined by this module.

use std::borrow::Cow;

mod base64;
mod compose;
#[cfg(any(test, feature = "fuzzing"))]
pub mod invariants;
mod num;
mod parse;
pub mod reply;
mod request;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use compose::compose_request;
pub use request::{KeyBytes, Keys, Meta, MetaFlags, MetaKey, Request, Store, StoreMode, Tokens};

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
        Limits {
            max_key_len: 250,
            max_value_len: 1 << 20,
            max_line_len: 64 << 10,
            max_keys_per_get: 10_000,
        }
    }
}

/// Why a request could not be parsed, and what the connection should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not enough bytes yet: read more and call again with the same buffer start. Not an error.
    #[error("incomplete request")]
    Incomplete,
    /// A bad request the connection survives: write `reply` (e.g. `ERROR\r\n`,
    /// `CLIENT_ERROR bad data chunk\r\n`), drop `consumed` bytes, continue.
    #[error("bad request: {reply:?}")]
    Recoverable {
        /// Bytes of the input to skip (the bad line, and its data block where memcached skips it).
        ///
        /// This can be larger than the buffer that was parsed: a storage command whose value is
        /// over the size limit has its data block swallowed without being buffered, so the
        /// connection must go on discarding input until `consumed` bytes in all have been dropped.
        consumed: usize,
        /// The complete reply line(s), CRLF included. Empty when the request said `noreply`.
        reply: Cow<'static, str>,
    },
    /// A violation we do not recover from (line too long, binary garbage, HTTP): write `reply`
    /// (may be empty) and close the connection.
    #[error("closing connection: {reason}")]
    Fatal {
        /// The reply to send before closing, CRLF included; may be empty.
        reply: Cow<'static, str>,
        /// For logs and tests.
        reason: &'static str,
    },
}

/// Parses one request from the front of `buf`. On success returns the request and the number of
/// bytes it used (command line plus any data block).
///
/// The line end is found first and nothing is allocated; for storage commands the data block is
/// checked to have fully arrived before a request is returned.
pub fn parse_request<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<(Request<'a>, usize), ParseError> {
    parse::parse(buf, limits)
}
