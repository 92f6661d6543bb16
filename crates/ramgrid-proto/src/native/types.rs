//! Values shared by several messages: statuses, value types, table descriptions, error replies.

use super::error::FrameError;
use super::wire::{self, put_u32, put_u64, put_u8, Reader};

/// Longest key the wire can carry (its length is a u16). A server may enforce a lower limit
/// per key with [`KeyStatus::KeyTooLarge`].
pub const MAX_KEY_LEN: usize = u16::MAX as usize;
/// Longest table name, in bytes of UTF-8. Names are never empty.
pub const MAX_NAME_LEN: usize = 255;
/// Largest dimension of an f32 vector value type.
pub const MAX_VECTOR_DIM: u32 = 1 << 16;

/// The frame-level outcome of a request: the first byte of every response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Done; the opcode's response payload follows.
    Ok = 0,
    /// The request's epoch is not the server's; the reply carries the server's epoch.
    WrongEpoch = 1,
    /// The server does not hold some requested partitions; the reply lists them. Nothing was done.
    NotOwner = 2,
    /// No table of that name.
    NoSuchTable = 3,
    /// The table has no such version (or no current version when version 0 was asked for).
    NoSuchVersion = 4,
    /// The version is sealed: it can no longer be written.
    VersionSealed = 5,
    /// CREATE_TABLE of a name that exists.
    TableExists = 6,
    /// The server needs a HELLO with a token before anything else.
    AuthRequired = 7,
    /// The HELLO's token is wrong.
    AuthFailed = 8,
    /// The request is well-formed but not acceptable; the message says why.
    BadRequest = 9,
    /// The server has no memory for the request (nothing was done).
    OutOfMemory = 10,
    /// The request is over a server limit (keys per batch, spec size...).
    TooLarge = 11,
    /// A server fault.
    Internal = 12,
    /// CREATE_VERSION of a version number that exists.
    VersionExists = 13,
    /// SET_CURRENT to a version that is not sealed yet.
    VersionNotSealed = 14,
    /// HELLO with a protocol version the server does not speak.
    UnsupportedProtocol = 15,
    /// The server holds these partitions but is still copying them from a replica (it restarted,
    /// or they are moving to it): read them elsewhere. The reply lists them, as NOT_OWNER does.
    Repairing = 16,
    /// The server is cut off from the cluster's metadata group (no leader with a majority has
    /// reached it within its lease): it takes no write and serves no read, so that nothing is
    /// done under an assignment the majority may have changed. Go to another replica.
    NoQuorum = 17,
    /// A write the partition's primary ordered could not be completed on every replica in time
    /// (a replica neither answered nor was failed over, or the assignment changed meanwhile): it
    /// may have been applied at some replicas. Nothing reads it from a replica that lacks it while
    /// the primary holds it; a retry stores a value again, and counts a merge again.
    Indeterminate = 18,
}

impl Status {
    /// Every status, in wire order.
    pub const ALL: [Status; 19] = [
        Status::Ok,
        Status::WrongEpoch,
        Status::NotOwner,
        Status::NoSuchTable,
        Status::NoSuchVersion,
        Status::VersionSealed,
        Status::TableExists,
        Status::AuthRequired,
        Status::AuthFailed,
        Status::BadRequest,
        Status::OutOfMemory,
        Status::TooLarge,
        Status::Internal,
        Status::VersionExists,
        Status::VersionNotSealed,
        Status::UnsupportedProtocol,
        Status::Repairing,
        Status::NoQuorum,
        Status::Indeterminate,
    ];

    /// The status for a wire byte.
    pub fn from_u8(b: u8) -> Option<Status> {
        Status::ALL.get(b as usize).copied()
    }

    /// The spec's name (`"WRONG_EPOCH"`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::WrongEpoch => "WRONG_EPOCH",
            Status::NotOwner => "NOT_OWNER",
            Status::NoSuchTable => "NO_SUCH_TABLE",
            Status::NoSuchVersion => "NO_SUCH_VERSION",
            Status::VersionSealed => "VERSION_SEALED",
            Status::TableExists => "TABLE_EXISTS",
            Status::AuthRequired => "AUTH_REQUIRED",
            Status::AuthFailed => "AUTH_FAILED",
            Status::BadRequest => "BAD_REQUEST",
            Status::OutOfMemory => "OUT_OF_MEMORY",
            Status::TooLarge => "TOO_LARGE",
            Status::Internal => "INTERNAL",
            Status::VersionExists => "VERSION_EXISTS",
            Status::VersionNotSealed => "VERSION_NOT_SEALED",
            Status::UnsupportedProtocol => "UNSUPPORTED_PROTOCOL",
            Status::Repairing => "REPAIRING",
            Status::NoQuorum => "NO_QUORUM",
            Status::Indeterminate => "INDETERMINATE",
        }
    }

    /// The status with the spec's name `name`.
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.iter().copied().find(|s| s.name() == name)
    }
}

/// The outcome for one key of a GET, PUT or DELETE, one byte per key in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum KeyStatus {
    /// Found (GET), stored (PUT), deleted (DELETE).
    Ok = 0,
    /// No such key.
    NotFound = 1,
    /// The key is over the server's key limit.
    KeyTooLarge = 2,
    /// The value is over the server's value limit.
    ValueTooLarge = 3,
    /// The value's type is not the table's.
    WrongType = 4,
    /// No memory to store this key.
    OutOfMemory = 5,
}

impl KeyStatus {
    /// Every key status, in wire order.
    pub const ALL: [KeyStatus; 6] = [
        KeyStatus::Ok,
        KeyStatus::NotFound,
        KeyStatus::KeyTooLarge,
        KeyStatus::ValueTooLarge,
        KeyStatus::WrongType,
        KeyStatus::OutOfMemory,
    ];

    /// The key status for a wire byte.
    pub fn from_u8(b: u8) -> Option<KeyStatus> {
        KeyStatus::ALL.get(b as usize).copied()
    }

    /// The spec's name (`"NOT_FOUND"`).
    pub fn name(self) -> &'static str {
        match self {
            KeyStatus::Ok => "OK",
            KeyStatus::NotFound => "NOT_FOUND",
            KeyStatus::KeyTooLarge => "KEY_TOO_LARGE",
            KeyStatus::ValueTooLarge => "VALUE_TOO_LARGE",
            KeyStatus::WrongType => "WRONG_TYPE",
            KeyStatus::OutOfMemory => "OUT_OF_MEMORY",
        }
    }

    /// The key status with the spec's name `name`.
    pub fn from_name(name: &str) -> Option<KeyStatus> {
        KeyStatus::ALL.iter().copied().find(|s| s.name() == name)
    }
}

/// Checks that every byte of a status array is a known [`KeyStatus`].
pub(crate) fn check_key_statuses(raw: &[u8]) -> Result<(), FrameError> {
    if raw.iter().all(|&b| (b as usize) < KeyStatus::ALL.len()) {
        Ok(())
    } else {
        Err(FrameError::Malformed("key status"))
    }
}

/// What a table's values are. Numeric types travel as packed little-endian arrays so a client can
/// hand them to numpy without per-key decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// Arbitrary bytes, each value length-prefixed on the wire.
    Bytes,
    /// Signed 64-bit integers, 8 bytes LE each.
    I64,
    /// IEEE-754 doubles, 8 bytes LE each.
    F64,
    /// Fixed-length vectors of `dim` f32 values, `4 * dim` bytes LE each (1 <= dim <= [`MAX_VECTOR_DIM`]).
    F32Vec(u32),
}

impl ValueType {
    /// Bytes per value for fixed-width types; `None` for [`ValueType::Bytes`].
    pub fn width(self) -> Option<usize> {
        match self {
            ValueType::Bytes => None,
            ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::F32Vec(dim) => Some(4 * dim as usize),
        }
    }

    /// The wire form: kind byte (0 bytes, 1 i64, 2 f64, 3 f32 vector) and dimension (0 unless a vector).
    pub fn to_wire(self) -> (u8, u32) {
        match self {
            ValueType::Bytes => (0, 0),
            ValueType::I64 => (1, 0),
            ValueType::F64 => (2, 0),
            ValueType::F32Vec(dim) => (3, dim),
        }
    }

    /// The value type for a wire kind and dimension, if valid.
    pub fn from_wire(kind: u8, dim: u32) -> Option<ValueType> {
        match (kind, dim) {
            (0, 0) => Some(ValueType::Bytes),
            (1, 0) => Some(ValueType::I64),
            (2, 0) => Some(ValueType::F64),
            (3, d) if (1..=MAX_VECTOR_DIM).contains(&d) => Some(ValueType::F32Vec(d)),
            _ => None,
        }
    }
}

/// How servers keep a table across a restart (a server with `--data-dir`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// In memory only: a restart loses it.
    #[default]
    Memory = 0,
    /// Each sealed version is written as snapshot files and loaded at restart.
    Snapshot = 1,
    /// As `Snapshot` for sealed versions; writes to open versions are also appended to a
    /// write-ahead log, fsynced before they are acknowledged, and replayed at restart.
    Log = 2,
}

impl Durability {
    /// The durability for a wire byte, if valid.
    pub fn from_u8(b: u8) -> Option<Durability> {
        match b {
            0 => Some(Durability::Memory),
            1 => Some(Durability::Snapshot),
            2 => Some(Durability::Log),
            _ => None,
        }
    }
}

/// One version of a table as one server holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    /// Version number (>= 1).
    pub number: u32,
    /// Whether the version is complete and read-only.
    pub sealed: bool,
    /// Items this server holds in this version.
    pub items: u64,
    /// Bytes this server accounts to this version.
    pub bytes: u64,
}

/// A table's description as one server sees it (LIST_TABLES, DESCRIBE_TABLE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// Number of partitions, fixed at creation.
    pub partitions: u32,
    /// Replication factor asked for at creation (the map clamps it to the server count).
    pub replication: u32,
    /// Value type, fixed at creation.
    pub value_type: ValueType,
    /// Durability, fixed at creation.
    pub durability: Durability,
    /// The table's identity, chosen at creation: a table dropped and created again under the
    /// same name has another one.
    pub incarnation: u64,
    /// The version the name points at; 0 = none yet.
    pub current_version: u32,
    /// The highest version number this server ever created for this name (dropped versions and
    /// tables included): a new version must be numbered above it.
    pub high_water: u32,
    /// Every version the server holds, ascending by number.
    pub versions: Vec<VersionInfo>,
}

impl TableInfo {
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<TableInfo, FrameError> {
        let name = r.name("table name")?.to_owned();
        let partitions = r.u32("partitions")?;
        let replication = r.u32("replication")?;
        let value_type = r.value_type()?;
        let durability = r.durability()?;
        let incarnation = r.u64("incarnation")?;
        let current_version = r.u32("current version")?;
        let high_water = r.u32("high water")?;
        let n = r.u32("version count")?;
        // Each entry is 21 bytes; a count the body cannot hold is refused before allocating.
        if n as usize > r.remaining() / 21 {
            return Err(FrameError::Truncated("versions"));
        }
        let mut versions = Vec::with_capacity(n as usize);
        for _ in 0..n {
            versions.push(VersionInfo {
                number: r.u32("version number")?,
                sealed: r.bool("sealed")?,
                items: r.u64("items")?,
                bytes: r.u64("bytes")?,
            });
        }
        Ok(TableInfo {
            name,
            partitions,
            replication,
            value_type,
            durability,
            incarnation,
            current_version,
            high_water,
            versions,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, &self.name, "table name")?;
        put_u32(out, self.partitions);
        put_u32(out, self.replication);
        wire::put_value_type(out, self.value_type)?;
        put_u8(out, self.durability as u8);
        put_u64(out, self.incarnation);
        put_u32(out, self.current_version);
        put_u32(out, self.high_water);
        let n =
            u32::try_from(self.versions.len()).map_err(|_| FrameError::Encode("version count"))?;
        put_u32(out, n);
        for v in &self.versions {
            put_u32(out, v.number);
            put_u8(out, u8::from(v.sealed));
            put_u64(out, v.items);
            put_u64(out, v.bytes);
        }
        Ok(())
    }
}

/// A refusal: the body of every response whose status is not [`Status::Ok`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// Why; never [`Status::Ok`].
    pub status: Status,
    /// The server's epoch; on the wire only for [`Status::WrongEpoch`] (0 otherwise).
    pub server_epoch: u64,
    /// Partitions the server does not hold ([`Status::NotOwner`]) or is repairing
    /// ([`Status::Repairing`]); on the wire only for those two.
    pub partitions: Vec<u32>,
    /// Human-readable detail, possibly empty; cut to 65535 bytes when encoded.
    pub message: String,
}

impl ErrorReply {
    /// A refusal with a message and no detail fields.
    pub fn new(status: Status, message: impl Into<String>) -> ErrorReply {
        ErrorReply {
            status,
            server_epoch: 0,
            partitions: Vec::new(),
            message: message.into(),
        }
    }

    /// [`Status::WrongEpoch`] carrying the server's epoch.
    pub fn wrong_epoch(server_epoch: u64) -> ErrorReply {
        ErrorReply {
            server_epoch,
            ..ErrorReply::new(Status::WrongEpoch, "")
        }
    }

    /// [`Status::NotOwner`] listing the partitions the server does not hold.
    pub fn not_owner(partitions: Vec<u32>) -> ErrorReply {
        ErrorReply {
            partitions,
            ..ErrorReply::new(Status::NotOwner, "")
        }
    }

    /// [`Status::Repairing`] listing the partitions still being copied here.
    pub fn repairing(partitions: Vec<u32>) -> ErrorReply {
        ErrorReply {
            partitions,
            ..ErrorReply::new(Status::Repairing, "")
        }
    }

    /// Reads the part after the status byte.
    pub(crate) fn read(status: Status, r: &mut Reader<'_>) -> Result<ErrorReply, FrameError> {
        let mut e = ErrorReply::new(status, "");
        match status {
            Status::Ok => return Err(FrameError::Malformed("error status")),
            Status::WrongEpoch => e.server_epoch = r.u64("server epoch")?,
            Status::NotOwner | Status::Repairing => {
                let n = r.u32("partition count")?;
                if n as usize > r.remaining() / 4 {
                    return Err(FrameError::Truncated("partitions"));
                }
                e.partitions = (0..n)
                    .map(|_| r.u32("partition"))
                    .collect::<Result<_, _>>()?;
            }
            _ => {}
        }
        e.message = r.str16("message")?.to_owned();
        Ok(e)
    }

    /// Writes the status byte and the rest.
    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u8(out, self.status as u8);
        match self.status {
            Status::Ok => return Err(FrameError::Encode("error reply with status OK")),
            Status::WrongEpoch => put_u64(out, self.server_epoch),
            Status::NotOwner | Status::Repairing => {
                let n = u32::try_from(self.partitions.len())
                    .map_err(|_| FrameError::Encode("partition count"))?;
                put_u32(out, n);
                for &p in &self.partitions {
                    put_u32(out, p);
                }
            }
            _ => {}
        }
        wire::put_str16(
            out,
            wire::truncate_str(&self.message, wire::MAX_STR16),
            "message",
        )
    }
}
