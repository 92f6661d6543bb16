//! DIGEST: per partition of one version, the items this server holds and an order-independent
//! hash of them, so that a client or a primary can compare replicas (`ramgrid table verify`,
//! `crate::replica_check`; protocol 6.9). A partition not held here, or still being copied in, is
//! answered without figures. REPAIR (6.11): partitions found to differ are copied in again.

use ramgrid_proto::native::{
    DigestReply, DigestRequest, DigestState, ErrorReply, Opcode, PartitionDigest, Response, Status,
};
use ramgrid_store::tables::{TableVersion, ValueRef};
use xxhash_rust::xxh3::xxh3_64;

use crate::convert::refusal;
use crate::node::Node;

/// Answers `req` into `out`.
pub(super) fn answer(
    state: &Node,
    id: u64,
    req: &DigestRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ErrorReply> {
    let tv = state
        .tables
        .at(req.table, req.version)
        .map_err(|e| refusal(&e))?;
    let entries = req
        .partitions()
        .map(|p| partition_digest(&tv, p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut raw = Vec::with_capacity(entries.len() * 21);
    DigestReply::encode_entries(&entries, &mut raw);
    Response::Digest(DigestReply::view(&raw))
        .encode(out, Opcode::Digest, id)
        .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
}

/// What this server holds of partition `p` of `tv` (protocol 6.9).
pub(crate) fn partition_digest(tv: &TableVersion, p: u32) -> Result<PartitionDigest, ErrorReply> {
    let mut e = PartitionDigest {
        partition: p,
        state: DigestState::Held,
        items: 0,
        digest: 0,
    };
    if p >= tv.spec().partitions || !tv.is_held(p) {
        e.state = DigestState::NotHeld;
    } else if tv.is_missing(p) {
        e.state = DigestState::Copying;
    } else {
        let mut buf = Vec::new();
        tv.scan(p, |k, v| {
            e.items += 1;
            e.digest = e.digest.wrapping_add(item_hash(&mut buf, k, v));
        })
        .map_err(|e| refusal(&e))?;
    }
    Ok(e)
}

/// REPAIR: the partitions asked that this server holds and is not copying in already are
/// emptied and marked pending in every version of the table (refused to readers, open to
/// writes, as a partition this server starts holding), and the repair thread copies them in
/// again from their other replicas, the primary first.
pub(super) fn repair(
    state: &Node,
    id: u64,
    req: &DigestRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ErrorReply> {
    if req.version == 0 {
        return Err(ErrorReply::new(
            Status::BadRequest,
            "REPAIR names its version",
        ));
    }
    let tv = state
        .tables
        .at(req.table, req.version)
        .map_err(|e| refusal(&e))?;
    let parts: Vec<u32> = req
        .partitions()
        .filter(|&p| p < tv.spec().partitions && tv.is_held(p) && !tv.is_missing(p))
        .collect();
    if !parts.is_empty() {
        state
            .tables
            .mark_pending(req.table, &parts)
            .map_err(|e| refusal(&e))?;
        state.repair.wake();
        tracing::warn!(
            "{} v{}: partitions {parts:?} differ from their primary's: copying them in again",
            req.table,
            req.version
        );
    }
    Response::Done
        .encode(out, Opcode::Repair, id)
        .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
}

/// A 64-bit hash of one item: its key's length and bytes, then its value's little-endian bytes.
fn item_hash(buf: &mut Vec<u8>, key: &[u8], value: ValueRef<'_>) -> u64 {
    buf.clear();
    buf.extend_from_slice(&(key.len() as u16).to_le_bytes());
    buf.extend_from_slice(key);
    match value {
        ValueRef::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        ValueRef::F64(x) => buf.extend_from_slice(&x.to_bits().to_le_bytes()),
        ValueRef::F32Vec(xs) => {
            for x in xs {
                buf.extend_from_slice(&x.to_bits().to_le_bytes());
            }
        }
        ValueRef::F32VecLe(b) | ValueRef::Bytes(b) => buf.extend_from_slice(b),
    }
    xxh3_64(buf)
}
