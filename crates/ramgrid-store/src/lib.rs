//! ramgrid's storage engine. It knows items, memory, eviction and time; it knows no wire format.
//!
//! The memcached-compatible keyspace is [`Cache`]. Native partitioned tables (issue 3) get their
//! own module so that a scan of one table touches only that table's items.

#![warn(missing_docs)]

pub mod cache;
pub mod clock;

pub use cache::{ArithOutcome, Cache, CacheConfig, CacheStats, DeleteOutcome, GetHit, GetOptions, ItemView, SetMode, StoreOutcome};
pub use clock::{Clock, ManualClock, SystemClock};

/// What went wrong in a store call. Expected outcomes (miss, NOT_STORED, EXISTS) are values, not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The item (key + value + overhead) is larger than `max_item_size`.
    #[error("object too large for cache")]
    TooLarge,
    /// The memory limit is reached and eviction is off, or nothing could be evicted.
    #[error("out of memory storing object")]
    OutOfMemory,
}

/// A stable, matchable classification of [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`Error::TooLarge`].
    TooLarge,
    /// See [`Error::OutOfMemory`].
    OutOfMemory,
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::TooLarge => ErrorKind::TooLarge,
            Error::OutOfMemory => ErrorKind::OutOfMemory,
        }
    }
}

/// Result alias for store calls.
pub type Result<T> = std::result::Result<T, Error>;
