//! The refusals a data request gets before any key is touched: wrong epoch, another incarnation of
//! the table, partitions not held here, partitions still being copied in; and the checks before and
//! after a pass over partitions (OPERATOR, SCAN) that make its result exact or refused.

use ramgrid_proto::native::{ErrorReply, Status};
use ramgrid_store::tables::TableVersion;

use crate::convert::refusal;
use crate::node::Node;

/// Refuses a batch meant for another incarnation of the table (one dropped since, whose name was
/// used again): its keys, types and version numbers are not this table's. 0 names any.
pub(super) fn check_incarnation(tv: &TableVersion, incarnation: u64) -> Result<(), ErrorReply> {
    let mine = tv.spec().incarnation;
    if incarnation != 0 && incarnation != mine {
        return Err(ErrorReply::new(
            Status::NoSuchTable,
            format!(
                "table {} is another incarnation ({mine:016x}, not {incarnation:016x}): it was dropped and created again",
                tv.spec().name
            ),
        ));
    }
    Ok(())
}

pub(super) fn check_epoch(
    cluster: &Option<crate::cluster::ClusterState>,
    epoch: u64,
    write: bool,
) -> Result<(), ErrorReply> {
    crate::cluster::check_epoch(cluster, epoch, write)
}

/// Refuses with REPAIRING, listing them, a read of partitions this server holds but is still
/// copying in from a replica: the client reads them elsewhere.
pub(super) fn check_copied(
    tv: &TableVersion,
    partitions: impl Iterator<Item = u32>,
) -> Result<(), ErrorReply> {
    let mut pending: Vec<u32> = partitions.filter(|&p| tv.is_missing(p)).collect();
    if pending.is_empty() {
        return Ok(());
    }
    pending.sort_unstable();
    pending.dedup();
    Err(ErrorReply::repairing(pending))
}

/// A read of the current version (asked as version 0) on a server where a switch the group
/// committed waits for its version to be copied in (a restarted server, say) is refused with
/// REPAIRING for `partitions`: the client reads them from another replica, which answers the new
/// version, instead of this one answering the previous. A version asked by number is unaffected.
/// (Before its first read of the group's state after a start, a server does not know of such a
/// switch: that window, one keeper tick, remains.)
pub(super) fn check_current_known(
    state: &Node,
    tv: &TableVersion,
    asked: u32,
    partitions: impl Iterator<Item = u32>,
) -> Result<(), ErrorReply> {
    if asked != 0 || state.current_known(&tv.spec().name) {
        return Ok(());
    }
    let mut parts: Vec<u32> = partitions.collect();
    parts.sort_unstable();
    parts.dedup();
    Err(ErrorReply {
        message: "this server is still learning which version the cluster made current".into(),
        ..ErrorReply::repairing(parts)
    })
}

/// Refuses with NOT_OWNER listing every requested partition this server does not hold, before any key is touched.
pub(super) fn check_held(
    tv: &TableVersion,
    partitions: impl Iterator<Item = u32>,
) -> Result<(), ErrorReply> {
    let mut missing: Vec<u32> = partitions.filter(|&p| !tv.is_held(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    missing.sort_unstable();
    missing.dedup();
    Err(ErrorReply::not_owner(missing))
}

/// What a pass over partitions (OPERATOR, SCAN) checks before reading anything: the request's
/// epoch, quorum, the table version asked for and its incarnation. Returns that version and the
/// epoch the pass starts under (for [`after_pass`]).
pub(super) fn before_pass(
    state: &Node,
    table: &str,
    version: u32,
    epoch: u64,
    incarnation: u64,
) -> Result<(TableVersion, u64), ErrorReply> {
    let started = {
        let cluster = state.cluster.read();
        check_epoch(&cluster, epoch, false)?;
        cluster.as_ref().map_or(0, |c| c.epoch)
    };
    let tv = state.tables.at(table, version).map_err(|e| refusal(&e))?;
    check_read_quorum(state, &tv, version)?;
    check_incarnation(&tv, incarnation)?;
    Ok((tv, started))
}

/// The quorum a read needs. A sealed version asked for by number (a pinned read) is the same on
/// every replica and never changes, so it is served without the metadata group: reads of pinned
/// versions go on while the control plane has no majority or this server is cut off from it
/// (docs/control-plane.md, "Without a majority"). Anything else (the current version, an open
/// version) needs the lease, so a cut-off server never serves what the majority changed since.
pub(super) fn check_read_quorum(
    state: &Node,
    tv: &TableVersion,
    asked: u32,
) -> Result<(), ErrorReply> {
    match state.check_quorum() {
        Err(_) if asked != 0 && tv.is_sealed() => Ok(()),
        other => other,
    }
}

/// What a pass checks after reading partition `p` of `tv`: its result stands only if nothing that
/// decides who answers for the partition changed while it ran (the epoch, the table's incarnation,
/// this server holding `p`, `p` not being copied in). The refusal names `p` and why.
pub(super) fn after_pass(
    state: &Node,
    tv: &TableVersion,
    p: u32,
    started_epoch: u64,
) -> Result<(), ErrorReply> {
    let now = state.cluster.read().as_ref().map_or(0, |c| c.epoch);
    if now != started_epoch {
        return Err(ErrorReply {
            message: format!("the epoch changed to {now:016x} during the pass"),
            ..ErrorReply::wrong_epoch(now)
        });
    }
    // The table's holdings as they are now (a spec change replaces them whole).
    let not_owner = |why: String| ErrorReply {
        message: why,
        ..ErrorReply::not_owner(vec![p])
    };
    let fresh = state
        .tables
        .at(&tv.spec().name, tv.version())
        .map_err(|e| not_owner(format!("after the pass: {e}")))?;
    if fresh.spec().incarnation != tv.spec().incarnation {
        return Err(not_owner(
            "the table was created again during the pass".into(),
        ));
    }
    if !fresh.is_held(p) {
        return Err(not_owner(format!(
            "partition {p} left this server during the pass"
        )));
    }
    if fresh.is_missing(p) {
        return Err(ErrorReply {
            message: format!("partition {p} is being copied in since the pass"),
            ..ErrorReply::repairing(vec![p])
        });
    }
    Ok(())
}
