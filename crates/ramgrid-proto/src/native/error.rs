//! The one error type of the native codec: why a frame could not be parsed, decoded or encoded.

/// Why a native frame could not be parsed or decoded (the connection should be closed), or why a
/// message could not be encoded (a caller bug or an over-limit input). [`FrameError::Incomplete`]
/// alone is not an error: it means "read more bytes".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The buffer holds only part of a frame; the whole frame is `needed` bytes long (or at least
    /// that many while the header itself is incomplete). Read more and call again.
    #[error("incomplete frame: {needed} bytes needed")]
    Incomplete {
        /// Bytes the buffer must hold before parsing can make progress.
        needed: usize,
    },
    /// The first byte is not [`super::MAGIC`]: not a native connection, or out of sync.
    #[error("bad magic byte {0:#04x}")]
    BadMagic(u8),
    /// The header names a protocol version this codec does not speak.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    /// The header's opcode is not assigned (or is reserved for a later release).
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Reserved flag bits are set.
    #[error("reserved flag bits set in {0:#04x}")]
    BadFlags(u8),
    /// The header announces a body longer than the caller's limit; rejected before any of it is read.
    #[error("frame body of {len} bytes exceeds the limit of {max}")]
    BodyTooLarge {
        /// Body length from the header.
        len: u32,
        /// The caller's limit.
        max: usize,
    },
    /// The body ended inside the named field.
    #[error("body truncated in {0}")]
    Truncated(&'static str),
    /// Bytes remain after the message's last field.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A field holds an impossible value (bad enum tag, invalid UTF-8, wrong direction...).
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The message cannot be encoded: a field is over its wire limit or inconsistent.
    #[error("cannot encode {0}")]
    Encode(&'static str),
}

/// A stable classification of [`FrameError`] for callers deciding what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameErrorKind {
    /// Read more bytes and retry.
    Incomplete,
    /// The peer broke the protocol: close the connection.
    Protocol,
    /// The local caller asked to encode something the wire cannot carry.
    Encode,
}

impl FrameError {
    /// The kind of this error.
    pub fn kind(&self) -> FrameErrorKind {
        match self {
            FrameError::Incomplete { .. } => FrameErrorKind::Incomplete,
            FrameError::Encode(_) => FrameErrorKind::Encode,
            _ => FrameErrorKind::Protocol,
        }
    }

    /// A short stable name (`"bad_magic"`, `"truncated"`...), used by the test vectors and in logs.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::Incomplete { .. } => "incomplete",
            FrameError::BadMagic(_) => "bad_magic",
            FrameError::UnsupportedVersion(_) => "unsupported_version",
            FrameError::UnknownOpcode(_) => "unknown_opcode",
            FrameError::BadFlags(_) => "bad_flags",
            FrameError::BodyTooLarge { .. } => "body_too_large",
            FrameError::Truncated(_) => "truncated",
            FrameError::TrailingBytes(_) => "trailing_bytes",
            FrameError::Malformed(_) => "malformed",
            FrameError::Encode(_) => "encode",
        }
    }
}
