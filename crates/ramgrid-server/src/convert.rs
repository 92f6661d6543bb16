//! The store's types and errors as the wire states them: the one mapping between the store's
//! types and the native protocol's, used by the protocol handlers and by the node's behaviours
//! (repair, export, persistence) alike.

use ramgrid_proto::native::{self as wire, ErrorReply, Status};
use ramgrid_store::tables::{KeyStatus as StoreKeyStatus, ValueRef, ValueType};
use ramgrid_store::Error as StoreError;

pub(crate) fn store_value_type(vt: wire::ValueType) -> ValueType {
    match vt {
        wire::ValueType::Bytes => ValueType::Bytes,
        wire::ValueType::I64 => ValueType::I64,
        wire::ValueType::F64 => ValueType::F64,
        wire::ValueType::F32Vec(dim) => ValueType::F32Vec { dim },
    }
}

pub(crate) fn wire_value_type(vt: ValueType) -> wire::ValueType {
    match vt {
        ValueType::Bytes => wire::ValueType::Bytes,
        ValueType::I64 => wire::ValueType::I64,
        ValueType::F64 => wire::ValueType::F64,
        ValueType::F32Vec { dim } => wire::ValueType::F32Vec(dim),
    }
}

pub(crate) fn wire_key_status(s: u8) -> wire::KeyStatus {
    match StoreKeyStatus::from_u8(s) {
        Some(StoreKeyStatus::Ok) => wire::KeyStatus::Ok,
        Some(StoreKeyStatus::NotFound) | None => wire::KeyStatus::NotFound,
        Some(StoreKeyStatus::KeyTooLarge) => wire::KeyStatus::KeyTooLarge,
        Some(StoreKeyStatus::ValueTooLarge) => wire::KeyStatus::ValueTooLarge,
        Some(StoreKeyStatus::WrongType) => wire::KeyStatus::WrongType,
        Some(StoreKeyStatus::OutOfMemory) => wire::KeyStatus::OutOfMemory,
    }
}

// The GET reply copies the store's status bytes as they are; they must mean what the wire's do.
// Checked at compile time.
const _: () = {
    use wire::KeyStatus as W;
    use StoreKeyStatus as S;
    assert!(S::Ok as u8 == W::Ok as u8);
    assert!(S::NotFound as u8 == W::NotFound as u8);
    assert!(S::KeyTooLarge as u8 == W::KeyTooLarge as u8);
    assert!(S::ValueTooLarge as u8 == W::ValueTooLarge as u8);
    assert!(S::WrongType as u8 == W::WrongType as u8);
    assert!(S::OutOfMemory as u8 == W::OutOfMemory as u8);
};

/// A data-directory write that failed: the change is refused (or, where memory already changed,
/// reported) with what failed.
pub(crate) fn disk_refusal(e: String) -> ErrorReply {
    ErrorReply::new(Status::Internal, format!("data directory: {e}"))
}

/// Maps a store error to the frame-level refusal the protocol defines.
pub(crate) fn refusal(e: &StoreError) -> ErrorReply {
    let status = match e {
        StoreError::NoSuchTable(_) => Status::NoSuchTable,
        StoreError::TableExists(_) => Status::TableExists,
        StoreError::NoSuchVersion(_) => Status::NoSuchVersion,
        StoreError::VersionExists(_) | StoreError::VersionNumberUsed { .. } => {
            Status::VersionExists
        }
        StoreError::VersionSealed(_) => Status::VersionSealed,
        StoreError::VersionOpen(_) => Status::VersionNotSealed,
        StoreError::NotHeld(p) => return ErrorReply::not_owner(vec![*p]),
        StoreError::Repairing(p) => return ErrorReply::repairing(vec![*p]),
        StoreError::VersionCurrent(_) => Status::BadRequest,
        StoreError::OutOfMemory => Status::OutOfMemory,
        StoreError::TooLarge | StoreError::ReplyTooLarge(_) => Status::TooLarge,
        _ => Status::BadRequest,
    };
    ErrorReply::new(status, e.to_string())
}

/// Decodes one wire value (already validated by the codec) into the store's view.
pub(crate) fn value_ref(vt: ValueType, v: &[u8]) -> ValueRef<'_> {
    let eight = |v: &[u8]| -> [u8; 8] { v.try_into().unwrap_or_default() };
    match vt {
        ValueType::I64 => ValueRef::I64(i64::from_le_bytes(eight(v))),
        ValueType::F64 => ValueRef::F64(f64::from_le_bytes(eight(v))),
        ValueType::F32Vec { .. } => ValueRef::F32VecLe(v),
        ValueType::Bytes => ValueRef::Bytes(v),
    }
}
