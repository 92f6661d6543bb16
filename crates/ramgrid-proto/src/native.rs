//! The native batch protocol: length-prefixed binary frames that carry a whole batch of keys,
//! table and version admin, and the cluster spec. Normative spec: `docs/protocol-native.md`.
//!
//! Reading: [`parse_frame`] splits a byte stream into [`Frame`]s (a cheap header check first,
//! [`FrameError::Incomplete`] means "read more"); [`Request::decode`] / [`Response::decode`]
//! turn a body into a message, borrowing keys and values zero-copy.
//!
//! Writing: hot-path frames are built by writers that append to a `Vec<u8>` without allocating
//! per key ([`KeyBatchWriter`], [`PutWriter`] on the client; [`GetReplyWriter`],
//! [`KeyStatusWriter`] on the server); everything else by [`Request::encode`] and
//! [`Response::encode`].

mod admin;
mod data;
mod digest;
mod error;
mod frame;
mod get_reply;
mod message;
mod ops;
mod put;
mod scan;
mod types;
mod wire;

#[cfg(test)]
mod tests;

/// How a NO_QUORUM refusal begins when the server is catching up with the metadata group (after a
/// restart from its state directory, or a gap longer than its lease): a moment's wait, not a lost
/// majority, so a client asks again shortly (docs/protocol-native.md, NO_QUORUM).
pub const CATCHING_UP: &str = "catching up with the cluster";

pub use admin::{CreateTable, ExportChunk, ExportRequest, Hello, HelloOk, SpecReply, VersionRef};
pub use data::{
    encode_delete, encode_get, Delete, Get, KeyBatch, KeyBatchWriter, KeyGroup, KeyGroupIter,
    KeyGroups, Keys,
};
pub use digest::{partition_bytes, DigestReply, DigestRequest, DigestState, PartitionDigest};
pub use error::{FrameError, FrameErrorKind};
pub use frame::{
    encode_frame, is_native_first_byte, parse_frame, Frame, Opcode, FLAG_ACK_ONE, FLAG_REPLICA,
    FLAG_RESPONSE, HEADER_LEN, MAGIC, PROTOCOL_VERSION,
};
pub use get_reply::{GetReply, GetReplyIter, GetReplyWriter, KeyStatusWriter, KeyStatuses};
pub use message::{encode_error, RecoverMode, Request, Response};
pub use ops::{
    encode_op, f64_bytes, F64s, OpKind, OpReply, OpRequest, Operator, Outcome, Partial, Predicate,
    Stats, U32s, MAX_HISTOGRAM_BINS, MAX_OP_PARTITIONS,
};
pub use put::{Merge, Put, PutGroup, PutGroupIter, PutGroups, PutWriter, Values};
pub use scan::{
    encode_scan, encode_scan_page, Cursor, PageHead, PageState, ScanReply, ScanRequest,
};
pub use types::{
    Durability, ErrorReply, KeyStatus, Status, TableInfo, ValueType, VersionInfo, MAX_KEY_LEN,
    MAX_NAME_LEN, MAX_VECTOR_DIM,
};
