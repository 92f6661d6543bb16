//! ramgrid's storage engine. It knows items, memory, eviction and time; it knows no wire format.
//!
//! The memcached-compatible keyspace is [`Cache`]. Native partitioned tables (issue 3) get their
//! own module so that a scan of one table touches only that table's items.

#![warn(missing_docs)]

pub mod cache;
pub mod clock;
pub mod image;
pub mod image_view;
mod index;
pub mod memory;
pub mod ops;
pub mod tables;

pub use cache::{
    ArithOutcome, Cache, CacheConfig, CacheStats, DeleteOutcome, GetHit, GetOptions, ItemView,
    SetMode, StoreOutcome,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use memory::Budget;
pub use tables::{
    packed_values, Durability, KeyStatus, PackedValues, PartitionView, TableInfo, TableSpec,
    TableVersion, Tables, TablesConfig, ValueRef, ValueType, VersionInfo,
};

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
    /// A batched read whose values would take more than this many bytes (ask for fewer keys).
    #[error("reply over {0} bytes: ask for fewer keys at once")]
    ReplyTooLarge(usize),
    /// No table of this name.
    #[error("no such table: {0}")]
    NoSuchTable(String),
    /// A table of this name exists already.
    #[error("table already exists: {0}")]
    TableExists(String),
    /// No such version (0 here: the table has no current version).
    #[error("no such version: {0}")]
    NoSuchVersion(u32),
    /// The version number is taken.
    #[error("version already exists: {0}")]
    VersionExists(u32),
    /// A version of this number existed before (it was dropped): numbers are never reused.
    #[error("version {version} was used before in this table (high-water mark {high_water}): number new versions above it")]
    VersionNumberUsed {
        /// The number asked for.
        version: u32,
        /// The highest number ever created in the table.
        high_water: u32,
    },
    /// The version is sealed; it can no longer be written.
    #[error("version {0} is sealed")]
    VersionSealed(u32),
    /// The version is still open; only a sealed version can become current.
    #[error("version {0} is not sealed")]
    VersionOpen(u32),
    /// The version is current; drop it only with force.
    #[error("version {0} is current")]
    VersionCurrent(u32),
    /// This store does not hold the partition under the current cluster map.
    #[error("partition {0} is not held here")]
    NotHeld(u32),
    /// The partition is held here but its data is still being copied from a replica (a repair
    /// or a move): read it elsewhere.
    #[error("partition {0} is being repaired here")]
    Repairing(u32),
    /// A value or request of the wrong type for the table.
    #[error("wrong value type for table")]
    WrongType,
    /// A malformed argument (bad spec, partition out of range, malformed packed values).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A partition image (docs/partition-image.md) failed validation; says what is wrong.
    #[error("corrupt partition image: {0}")]
    CorruptImage(String),
}

/// A stable, matchable classification of [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`Error::TooLarge`].
    TooLarge,
    /// See [`Error::OutOfMemory`].
    OutOfMemory,
    /// See [`Error::NoSuchTable`].
    NoSuchTable,
    /// See [`Error::TableExists`].
    TableExists,
    /// See [`Error::NoSuchVersion`].
    NoSuchVersion,
    /// See [`Error::VersionExists`].
    VersionExists,
    /// See [`Error::VersionSealed`].
    VersionSealed,
    /// See [`Error::VersionOpen`].
    VersionOpen,
    /// See [`Error::VersionCurrent`].
    VersionCurrent,
    /// See [`Error::NotHeld`].
    NotHeld,
    /// See [`Error::Repairing`].
    Repairing,
    /// See [`Error::WrongType`].
    WrongType,
    /// See [`Error::Invalid`].
    Invalid,
    /// See [`Error::CorruptImage`].
    CorruptImage,
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::TooLarge | Error::ReplyTooLarge(_) => ErrorKind::TooLarge,
            Error::OutOfMemory => ErrorKind::OutOfMemory,
            Error::NoSuchTable(_) => ErrorKind::NoSuchTable,
            Error::TableExists(_) => ErrorKind::TableExists,
            Error::NoSuchVersion(_) => ErrorKind::NoSuchVersion,
            Error::VersionExists(_) | Error::VersionNumberUsed { .. } => ErrorKind::VersionExists,
            Error::VersionSealed(_) => ErrorKind::VersionSealed,
            Error::VersionOpen(_) => ErrorKind::VersionOpen,
            Error::VersionCurrent(_) => ErrorKind::VersionCurrent,
            Error::NotHeld(_) => ErrorKind::NotHeld,
            Error::Repairing(_) => ErrorKind::Repairing,
            Error::WrongType => ErrorKind::WrongType,
            Error::Invalid(_) => ErrorKind::Invalid,
            Error::CorruptImage(_) => ErrorKind::CorruptImage,
        }
    }
}

/// Result alias for store calls.
pub type Result<T> = std::result::Result<T, Error>;
