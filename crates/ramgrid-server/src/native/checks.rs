//! The refusals a data request gets before any key is touched: wrong epoch, another incarnation of
//! the table, partitions not held here, partitions still being copied in.

use ramgrid_proto::native::{ErrorReply, Status};
use ramgrid_store::tables::TableVersion;

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
