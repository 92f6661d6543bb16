//! DIGEST: per partition of one version, the items this server holds and an order-independent
//! hash of them, so that a client can compare replicas (`ramgrid table verify`; protocol 6.9).
//! A partition not held here, or still being copied in, is answered without figures.

use ramgrid_proto::native::{
    DigestReply, DigestRequest, DigestState, ErrorReply, Opcode, PartitionDigest, Response, Status,
};
use ramgrid_store::tables::ValueRef;
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
    let mut entries = Vec::new();
    let mut buf = Vec::new();
    for p in req.partitions() {
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
            tv.scan(p, |k, v| {
                e.items += 1;
                e.digest = e.digest.wrapping_add(item_hash(&mut buf, k, v));
            })
            .map_err(|e| refusal(&e))?;
        }
        entries.push(e);
    }
    let mut raw = Vec::with_capacity(entries.len() * 21);
    DigestReply::encode_entries(&entries, &mut raw);
    Response::Digest(DigestReply::view(&raw))
        .encode(out, Opcode::Digest, id)
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
