//! Data requests: GET (one version per frame, values straight into the reply, bounded by the
//! buffer budget), PUT and DELETE (through the write-ahead log for log tables).

use ramgrid_proto::native::{
    self as wire, ErrorReply, FrameError, GetReplyWriter, Opcode, Request, Status,
};
use ramgrid_store::tables::{KeyStatus as StoreKeyStatus, MergeOp, TableVersion, ValueType};
use ramgrid_store::Error as StoreError;

use super::checks::{
    check_copied, check_current_known, check_epoch, check_held, check_incarnation,
    check_read_quorum,
};
use super::handler::Conn;
use crate::convert::{refusal, store_value_type, value_ref, wire_value_type};
use crate::node::Node;
use crate::wal;

/// The pairs of a PUT group that the store accepted, as log ops.
fn wal_puts<'a>(
    pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    status: &'a [u8],
) -> impl Iterator<Item = wal::Op<'a>> {
    pairs
        .zip(status)
        .filter(|(_, &s)| s == StoreKeyStatus::Ok as u8)
        .map(|((k, v), _)| wal::Op::Put(k, v))
}

/// The keys of a DELETE group that were removed (a missing key changes nothing), as log ops.
fn wal_deletes<'a>(
    keys: impl Iterator<Item = &'a [u8]>,
    status: &'a [u8],
) -> impl Iterator<Item = wal::Op<'a>> {
    keys.zip(status)
        .filter(|(_, &s)| s == StoreKeyStatus::Ok as u8)
        .map(|(k, _)| wal::Op::Delete(k))
}

/// Bytes of a GET reply body besides its status bytes and values: the version, value type and
/// counts (section 7.2 of the spec), generously.
const REPLY_HEADER_SLACK: usize = 64;

/// The most a GET's reply can take: exact for fixed-width values; the body limit for bytes.
pub(super) fn reply_bound(state: &Node, get: &wire::KeyBatch<'_>) -> usize {
    let keys = get.groups.key_count();
    let width = state
        .tables
        .value_type(get.table)
        .ok()
        .and_then(|vt| vt.packed_width());
    match width {
        Some(w) => keys
            .saturating_mul(w + 1)
            .saturating_add(REPLY_HEADER_SLACK + wire::HEADER_LEN)
            .min(state.max_body),
        None => state.max_body,
    }
}

impl Conn {
    pub(super) fn data(
        &mut self,
        state: &Node,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Result<(), ErrorReply> {
        match req {
            Request::Get(b) => {
                check_epoch(&state.cluster.read(), b.epoch, false)?;
                // Resolve the version once: every group of this frame reads that one version.
                let tv = state
                    .tables
                    .at(b.table, b.version)
                    .map_err(|e| refusal(&e))?;
                check_read_quorum(state, &tv, b.version)?;
                check_incarnation(&tv, b.incarnation)?;
                check_held(&tv, b.groups.iter().map(|g| g.partition))?;
                check_copied(&tv, b.groups.iter().map(|g| g.partition))?;
                check_current_known(state, &tv, b.version, b.groups.iter().map(|g| g.partition))?;
                // One call for the whole frame: its lookups share one prefetching pipeline
                // whatever the number of partitions (a group per partition holds few keys).
                // No reply frame is larger than the body limit HELLO announced (that of requests)
                // nor than the room the buffer budget gave it: a GET whose values would pass
                // either is refused (TOO_LARGE: the client asks for fewer keys), never composed
                // whole. The values go straight into the reply frame.
                let keys = b.groups.key_count();
                let max_values = state
                    .max_body
                    .min(room)
                    .saturating_sub(keys + REPLY_HEADER_SLACK);
                let enc = |e: FrameError| ErrorReply::new(Status::Internal, e.to_string());
                let wvt = wire_value_type(tv.value_type());
                let mut w = GetReplyWriter::begin(out, id, tv.version(), wvt, keys).map_err(enc)?;
                // The store's packed layout is the wire's (7.2) and its status bytes are the
                // wire's (checked at compile time next to `refusal`).
                w.fill_packed(&mut self.status, |status, values| {
                    tv.get_groups_bounded(
                        b.groups.iter().map(|g| (g.partition, g.keys)),
                        status,
                        values,
                        max_values,
                    )
                })
                .map_err(enc)?
                .map_err(|e| refusal(&e))?;
                w.finish().map_err(enc)
            }
            Request::Put(p) => {
                // Held until the write is done: a spec change waits for it (cluster.rs).
                let cluster = state.cluster.read();
                check_epoch(&cluster, p.epoch, true)?;
                state.check_quorum()?;
                self.apply_put(state, p)?;
                self.write_statuses(out, Opcode::Put, id)
            }
            Request::Delete(b) => {
                let cluster = state.cluster.read();
                check_epoch(&cluster, b.epoch, true)?;
                state.check_quorum()?;
                self.apply_delete(state, b)?;
                self.write_statuses(out, Opcode::Delete, id)
            }
            _ => unreachable!("the handler sends only data requests here"),
        }
    }
}

impl Conn {
    /// Applies a PUT here, after checking the table, its version and that this server holds
    /// every partition of it: the per-key statuses are left in `self.status`, the log commit to
    /// wait for in `self.commit`. The caller checked the epoch and holds the cluster lock.
    pub(super) fn apply_put(&mut self, state: &Node, p: &wire::Put<'_>) -> Result<(), ErrorReply> {
        let tv = writable(
            state,
            p.table,
            p.version,
            p.incarnation,
            p.groups.iter().map(|g| g.partition),
        )?;
        let vt = tv.value_type();
        let type_ok = store_value_type(p.value_type) == vt;
        let (log, mut ticket) = (state.log_of(&tv)?, 0);
        let merge = merge_op(p.merge, vt, log.is_some())?;
        if merge.is_some() {
            check_mergeable(&tv, p.groups.iter().map(|g| g.partition))?;
        }
        self.status.clear();
        // A merge with a write key: each partition group once, however often it comes (ledger.rs).
        let mut ledger = (merge.is_some() && p.write_key != 0)
            .then(|| state.replication.ledger.entry(p.write_key));
        for g in p.groups.iter() {
            if !type_ok {
                self.status.extend(std::iter::repeat_n(
                    StoreKeyStatus::WrongType as u8,
                    g.keys.len(),
                ));
                continue;
            }
            if let Some(done) = ledger.as_ref().and_then(|l| l.applied(g.partition)) {
                if done.len() == g.keys.len() {
                    self.status.extend_from_slice(done);
                    continue;
                }
            }
            let start = self.status.len();
            let items = g.keys.zip(g.values).map(|(k, v)| (k, value_ref(vt, v)));
            match merge {
                Some(op) => tv.merge_batch_then(g.partition, items, op, &mut self.status, |_| ()),
                None => tv.put_batch_then(g.partition, items, &mut self.status, |st| {
                    if let Some(log) = &log {
                        ticket = log.append(g.partition, wal_puts(g.keys.zip(g.values), st));
                    }
                }),
            }
            .map_err(|e| refusal(&e))?;
            if let Some(l) = ledger.as_mut() {
                l.record(g.partition, &self.status[start..]);
            }
        }
        self.commit = log.map(|log| (log, ticket));
        Ok(())
    }

    /// Applies a DELETE here, as [`Conn::apply_put`] does a PUT.
    pub(super) fn apply_delete(
        &mut self,
        state: &Node,
        b: &wire::KeyBatch<'_>,
    ) -> Result<(), ErrorReply> {
        let tv = writable(
            state,
            b.table,
            b.version,
            b.incarnation,
            b.groups.iter().map(|g| g.partition),
        )?;
        let (log, mut ticket) = (state.log_of(&tv)?, 0);
        self.status.clear();
        for g in b.groups.iter() {
            tv.delete_batch_then(g.partition, g.keys, &mut self.status, |st| {
                if let Some(log) = &log {
                    ticket = log.append(g.partition, wal_deletes(g.keys, st));
                }
            })
            .map_err(|e| refusal(&e))?;
        }
        self.commit = log.map(|log| (log, ticket));
        Ok(())
    }
}

/// Refuses with REPAIRING a merge into partitions this server is still copying in: a merge adds
/// to the value there, and until the copy is in that value is not the partition's. The primary
/// tries again until the copy is done (it copies from the primary, which applies a write last, so
/// the copy holds every merge completed before it and none after).
pub(super) fn check_mergeable(
    tv: &TableVersion,
    partitions: impl Iterator<Item = u32>,
) -> Result<(), ErrorReply> {
    check_copied(tv, partitions).map_err(|e| ErrorReply {
        message: format!(
            "{}: a merge waits until these partitions are copied in",
            e.message
        ),
        ..e
    })
}

/// The store's merge for a PUT's merge byte: None for a plain store. A merge is refused whole
/// (BAD_REQUEST, nothing written) on a table that is not i64 or f64, and on a table whose writes
/// go through the write-ahead log, which records stored values, not merges.
fn merge_op(
    merge: wire::Merge,
    vt: ValueType,
    logged: bool,
) -> Result<Option<MergeOp>, ErrorReply> {
    let op = match merge {
        wire::Merge::Store => return Ok(None),
        wire::Merge::Add => MergeOp::Add,
        wire::Merge::Min => MergeOp::Min,
        wire::Merge::Max => MergeOp::Max,
    };
    if !matches!(vt, ValueType::I64 | ValueType::F64) {
        return Err(ErrorReply::new(
            Status::BadRequest,
            format!(
                "merge \"{}\" needs an i64 or f64 table, not {vt:?}",
                merge.name()
            ),
        ));
    }
    if logged {
        return Err(ErrorReply::new(
            Status::BadRequest,
            "merge writes are not supported on tables with durability \"log\"",
        ));
    }
    Ok(Some(op))
}

/// The version a PUT or DELETE writes: resolved once, refused if sealed or if any of the request's
/// partitions is not held here, before any key is touched.
pub(super) fn writable(
    state: &Node,
    table: &str,
    version: u32,
    incarnation: u64,
    partitions: impl Iterator<Item = u32>,
) -> Result<TableVersion, ErrorReply> {
    let tv = state.tables.at(table, version).map_err(|e| refusal(&e))?;
    check_incarnation(&tv, incarnation)?;
    if tv.is_sealed() {
        return Err(refusal(&StoreError::VersionSealed(tv.version())));
    }
    check_held(&tv, partitions)?;
    Ok(tv)
}
