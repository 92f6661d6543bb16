//! Replicas compared by the servers themselves (docs/replication.md, "Checked by the servers"):
//! every `--replica-check-ms`, each server compares the partitions it is the primary of with
//! their other replicas, and has a replica that differs copy them in again.
//!
//! For each open version of each table with more than one replica, the primary takes the order
//! locks of the partitions it orders (`crate::replicate`), so that no write of theirs is in
//! flight, computes its own digest of each (protocol 6.9) and asks each other replica for its
//! DIGEST of them. Under the locks the replicas hold the same writes, so unequal figures are a
//! real difference, not a write seen by one and not yet by the other. A replica still copying a
//! partition in (or not holding it yet) is left alone. A replica that differs is sent REPAIR for
//! those partitions: it empties them and copies them in again, from the primary first. Each
//! difference is counted (`ramgrid_replica_differences_total`, CLUSTER_STATUS
//! `replica_differences`) and logged.
//!
//! Sealed versions are not compared: no write reaches them, so the write path cannot set their
//! replicas apart (`ramgrid table verify --version N` compares them on request). The locks are held per batch of [`BATCH`] partitions for one digest round trip, so
//! a check delays the writes of those partitions by about the time to scan them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use ramgrid_proto::cluster::PartitionMap;
use ramgrid_proto::native::{
    partition_bytes, DigestRequest, DigestState, PartitionDigest, Request, Response,
};
use tokio::time::Instant;

use crate::native::digest::partition_digest;
use crate::node::Node;
use crate::peer_pool::Pool;

/// Partitions compared under one set of order locks.
const BATCH: usize = 64;
/// How long one DIGEST or REPAIR to a replica may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the checks found, for the metrics and CLUSTER_STATUS.
#[derive(Default)]
pub struct CheckStats {
    /// Rounds completed.
    pub rounds: AtomicU64,
    /// (partition, replica) pairs compared.
    pub compared: AtomicU64,
    /// (partition, replica) pairs found to differ (each sent REPAIR).
    pub differences: AtomicU64,
    /// The last difference found, for an operator.
    pub last: Mutex<String>,
}

impl CheckStats {
    /// The figures for the metrics endpoint (docs/metrics.md): (name, kind, help, value).
    pub fn figures(&self) -> Vec<(&'static str, &'static str, &'static str, u64)> {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("ramgrid_replica_check_rounds_total", "counter", "rounds of comparing the partitions this server is the primary of with their other replicas", n(&self.rounds)),
            ("ramgrid_replica_checks_total", "counter", "(partition, replica) pairs this primary compared", n(&self.compared)),
            ("ramgrid_replica_differences_total", "counter", "(partition, replica) pairs found to differ from this primary (each copied in again)", n(&self.differences)),
        ]
    }

    /// CLUSTER_STATUS lines.
    pub fn status_lines(&self, out: &mut String) {
        use std::fmt::Write;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(out, "replica_check_rounds {}", n(&self.rounds));
        let _ = writeln!(out, "replica_checks {}", n(&self.compared));
        let _ = writeln!(out, "replica_differences {}", n(&self.differences));
        let last = self.last.lock().clone();
        if !last.is_empty() {
            let _ = writeln!(out, "last_replica_difference {last}");
        }
    }
}

/// Starts the checking thread (a runtime of its own); `every` zero: no checks.
pub fn spawn(node: &Arc<Node>, every: Duration) -> std::io::Result<()> {
    if every.is_zero() {
        return Ok(());
    }
    let weak = Arc::downgrade(node);
    let pool = Pool::new(node.token.clone(), node.tls.clone());
    std::thread::Builder::new()
        .name("ramgrid-replica-check".into())
        .spawn(move || {
            if let Some(rt) = crate::server::thread_runtime("replica check") {
                rt.block_on(run(weak, pool, every));
            }
        })?;
    Ok(())
}

async fn run(node: Weak<Node>, pool: Pool, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(state) = node.upgrade() else { return };
        if state.check_quorum().is_err() {
            continue; // Cut off: what this server orders may be stale; the group decides.
        }
        for table in state.tables.list() {
            check_table(&state, &pool, &table).await;
        }
        state.replica_checks.rounds.fetch_add(1, Ordering::Relaxed);
    }
}

/// Compares the open versions of `table` whose partitions this server orders.
async fn check_table(state: &Node, pool: &Pool, table: &str) {
    let Ok(info) = state.tables.describe(table) else {
        return;
    };
    if info.spec.replication < 2 {
        return;
    }
    let Some(c) = state.cluster.read().clone() else {
        return;
    };
    let Some(me) = c.index else { return };
    let map = PartitionMap::new(&c.spec, info.spec.partitions, info.spec.replication);
    let members = c.spec.members();
    let mine: Vec<u32> = info
        .held
        .iter()
        .copied()
        .filter(|&p| map.primary(p) == Some(me))
        .collect();
    for v in info.versions.iter().filter(|v| !v.sealed) {
        for batch in mine.chunks(BATCH) {
            let _order = state
                .replication
                .lock(table, info.spec.incarnation, v.number, batch)
                .await;
            // Under the locks: the spec may have moved on since (then the next round checks).
            if state.cluster.read().as_ref().map(|c| c.epoch) != Some(c.epoch) {
                return;
            }
            let Ok(tv) = state.tables.at(table, v.number) else {
                break;
            };
            if tv.spec().incarnation != info.spec.incarnation || tv.is_sealed() {
                break;
            }
            let own: Vec<PartitionDigest> = batch
                .iter()
                .filter_map(|&p| partition_digest(&tv, p).ok())
                .filter(|d| d.state == DigestState::Held)
                .collect();
            let others = |p: u32| {
                map.write_replicas(p)
                    .into_iter()
                    .filter(move |&s| s != me)
                    .filter_map(|s| members.get(s as usize).cloned())
            };
            let mut addrs: Vec<String> = own.iter().flat_map(|d| others(d.partition)).collect();
            addrs.sort_unstable();
            addrs.dedup();
            for addr in addrs {
                let asked: Vec<&PartitionDigest> = own
                    .iter()
                    .filter(|d| others(d.partition).any(|a| a == addr))
                    .collect();
                let differ = compare(pool, &addr, table, v.number, &asked).await;
                let stats = &state.replica_checks;
                stats
                    .compared
                    .fetch_add(asked.len() as u64, Ordering::Relaxed);
                if differ.is_empty() {
                    continue;
                }
                stats
                    .differences
                    .fetch_add(differ.len() as u64, Ordering::Relaxed);
                let what = format!(
                    "{table} v{}: {addr} differs from this primary in partitions {differ:?}",
                    v.number
                );
                tracing::warn!("replica check: {what}; it copies them in again");
                *stats.last.lock() = what;
                let bytes = partition_bytes(&differ);
                let req = Request::Repair(DigestRequest::new(table, v.number, &bytes));
                let deadline = Instant::now() + CALL_TIMEOUT;
                let r = pool
                    .call(&addr, &req, deadline, |r| match r {
                        Response::Done => Ok(()),
                        other => Err(format!("unexpected reply to REPAIR: {other:?}")),
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!("replica check: {addr} did not take REPAIR: {e}");
                }
            }
        }
    }
}

/// The partitions of `own` whose figures `addr` answers differently (held there; a replica still
/// copying one in, or that does not answer, is not counted).
async fn compare(
    pool: &Pool,
    addr: &str,
    table: &str,
    version: u32,
    own: &[&PartitionDigest],
) -> Vec<u32> {
    let parts: Vec<u32> = own.iter().map(|d| d.partition).collect();
    let bytes = partition_bytes(&parts);
    let req = Request::Digest(DigestRequest::new(table, version, &bytes));
    let deadline = Instant::now() + CALL_TIMEOUT;
    let theirs = pool
        .call(addr, &req, deadline, |r| match r {
            Response::Digest(d) => Ok(d.iter().collect::<Vec<_>>()),
            other => Err(format!("unexpected reply to DIGEST: {other:?}")),
        })
        .await;
    let Ok(theirs) = theirs else {
        return Vec::new();
    };
    own.iter()
        .zip(theirs)
        .filter(|(mine, t)| {
            t.partition == mine.partition
                && t.state == DigestState::Held
                && (t.items, t.digest) != (mine.items, mine.digest)
        })
        .map(|(mine, _)| mine.partition)
        .collect()
}
