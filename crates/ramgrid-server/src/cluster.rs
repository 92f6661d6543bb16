//! Membership on this server: the installed cluster spec, the epochs it accepts, and each
//! table's partitions in one of four states (docs/membership.md):
//!
//! | state     | held under           | reads          | writes   |
//! |-----------|----------------------|----------------|----------|
//! | owned     | the `server` list    | served         | taken    |
//! | importing | the `next` list only, or owned but not copied in yet (a restart) | REPAIRING | taken |
//! | leaving   | the `server` list only (a move in progress) | served | taken |
//! | absent    | neither              | NOT_OWNER      | NOT_OWNER |
//!
//! A partition is importing, per version, exactly while the store has it *pending*
//! (`ramgrid_store::tables` copy docs); the repair thread (`repair.rs`) copies it in from a
//! replica. Leaving partitions are emptied when the move completes (the spec without `next`).
//!
//! Epochs: a request must carry this server's epoch, except that during a move, reads routed
//! under the spec the move started from are still served (they go to the old holders, which
//! keep their data). Everything else routed under another spec is refused (WRONG_EPOCH), so a
//! client learns each change from its first refused request: writes under the spec a move
//! started from would miss the new holders, and writes under a completed (or undone) move's spec
//! would wait for servers that are no longer replicas.

use std::sync::atomic::Ordering;

use ramgrid_proto::cluster::{ClusterSpec, PartitionMap};
use ramgrid_proto::native::ErrorReply;
use ramgrid_store::tables::TableSpec;

use crate::node::Node;

/// The installed cluster spec and what this server derives from it.
#[derive(Debug, Clone)]
pub struct ClusterState {
    /// The spec as installed.
    pub spec: ClusterSpec,
    /// Its epoch.
    pub epoch: u64,
    /// This server's index among the spec's members, if it is one.
    pub index: Option<u32>,
    /// The epoch installed before this one (reads routed under it are served during a move).
    pub previous: Option<u64>,
}

impl ClusterState {
    /// The partitions of `table` this server holds: its replicas under the `server` list and,
    /// during a move, under the `next` list.
    pub fn held(&self, table: &TableSpec) -> Vec<u32> {
        let Some(i) = self.index else {
            return Vec::new();
        };
        let map = PartitionMap::new(&self.spec, table.partitions, table.replication);
        (0..map.partitions())
            .filter(|&p| map.write_replicas(p).contains(&i))
            .collect()
    }
}

/// The partitions of `table` this server holds under `cluster` (all of them without a spec).
pub fn held_partitions(cluster: Option<&ClusterState>, table: &TableSpec) -> Vec<u32> {
    match cluster {
        None => (0..table.partitions).collect(),
        Some(c) => c.held(table),
    }
}

/// Installs `spec` (from `--cluster-spec`, SET_SPEC or a peer) and moves every table's
/// partitions to their new states. Refused: a spec that does not list this server, and a move
/// while another move (to other servers) is in progress.
impl Node {
    /// Installs `spec`: see [`install_spec`].
    pub fn install_spec(&self, spec: ClusterSpec) -> Result<u64, String> {
        install_spec(self, spec)
    }

    /// The epoch of the installed spec (0 before any).
    pub(crate) fn epoch(&self) -> u64 {
        self.cluster.read().as_ref().map_or(0, |c| c.epoch)
    }
}

/// Installs `spec` (from `--cluster-spec`, SET_SPEC or a peer) and moves every table's
/// partitions to their new states.
pub fn install_spec(state: &Node, spec: ClusterSpec) -> Result<u64, String> {
    if spec.index_of(&state.server_id).is_none() {
        return Err(format!(
            "this server ({}) is not listed in the spec",
            state.server_id
        ));
    }
    install(state, spec, false)
}

/// Installs a spec the metadata group committed (meta/mod.rs). Unlike [`install_spec`], one
/// that does not list this server is installed too: the server was failed over or removed, so
/// it holds nothing and refuses everything (NOT_OWNER) until a spec lists it again. With
/// `forget`, this server was failed over since it last looked: everything it held is dropped
/// first, so that what the new spec gives it is copied in again (it may have missed writes).
pub fn install_committed(state: &Node, spec: ClusterSpec, forget: bool) -> Result<u64, String> {
    install(state, spec, forget)
}

fn install(state: &Node, spec: ClusterSpec, forget: bool) -> Result<u64, String> {
    let index = spec.index_of(&state.server_id).map(|i| i as u32);
    let epoch = spec.epoch();
    let mut cluster = state.cluster.write();
    if forget {
        // Under the write lock: no request runs meanwhile.
        for name in state.tables.list() {
            if let Ok(info) = state.tables.describe(&name) {
                let _ = state.tables.release_partitions(&name, &info.held);
                let _ = state.tables.set_held_partitions(&name, &[]);
            }
        }
        if let Some(c) = cluster.as_mut() {
            c.epoch = 0; // Not the same spec any more, whatever `spec` is.
        }
    }
    let old = cluster.clone();
    if let (Some(o), Some(next)) = (&old, spec.next()) {
        if let Some(busy) = o.spec.next() {
            if busy != next || o.spec.servers() != spec.servers() {
                return Err(format!(
                    "a move to [{}] is in progress: complete or abort it first",
                    busy.join(", ")
                ));
            }
        }
    }
    if old.as_ref().is_some_and(|o| o.epoch == epoch) {
        return Ok(epoch);
    }
    // Reads routed under the spec a move started from are still served during the move (the
    // old holders keep their data); nothing else is served under an older spec, so a client
    // learns every change from its first refused request.
    let previous = old.as_ref().map(|o| o.epoch);
    let new = ClusterState {
        spec: spec.clone(),
        epoch,
        index,
        previous,
    };
    for name in state.tables.list() {
        let Ok(info) = state.tables.describe(&name) else {
            continue;
        };
        let now = new.held(&info.spec);
        let gained: Vec<u32> = match &old {
            // A first spec only narrows what a server without one held (all of it).
            None => Vec::new(),
            Some(_) => now
                .iter()
                .copied()
                .filter(|p| !info.held.contains(p))
                .collect(),
        };
        // Pending before held: no write can land in a gained partition untracked.
        if !gained.is_empty() {
            let _ = state.tables.mark_pending(&name, &gained);
        }
        let _ = state.tables.set_held_partitions(&name, &now);
        if spec.next().is_none() {
            let lost: Vec<u32> = info
                .held
                .iter()
                .copied()
                .filter(|p| !now.contains(p))
                .collect();
            let _ = state.tables.release_partitions(&name, &lost);
        }
    }
    let first = old.is_none();
    if first {
        // Replayed logs loaded before any spec: reconciled from now on (repair.rs).
        crate::repair::reconcile_deferred(state, &new);
    }
    let joining = index.is_some() && !spec.servers().contains(&state.server_id);
    *cluster = Some(new);
    drop(cluster);
    tracing::info!(
        epoch = format_args!("{epoch:016x}"),
        servers = spec.servers().join(","),
        next = spec.next().map(|n| n.join(",")),
        member = index.is_some(),
        "spec installed"
    );
    if first || joining || forget {
        // Learn the tables this server lacks from its peers, then copy what is pending.
        state.repair.needs_catalog.store(true, Ordering::Release);
    }
    state.repair.wake();
    Ok(epoch)
}

/// Refuses a request routed under an epoch this server does not serve (see the module docs).
///
/// Takes the installed state (a read guard the caller holds for the whole request, so that a
/// spec installed meanwhile waits for the request to finish: a write checked under the old spec
/// is never applied after the new one took effect).
pub fn check_epoch(
    cluster: &Option<ClusterState>,
    epoch: u64,
    write: bool,
) -> Result<(), ErrorReply> {
    let Some(c) = cluster.as_ref() else {
        return if epoch == 0 {
            Ok(())
        } else {
            Err(ErrorReply::wrong_epoch(0))
        };
    };
    if epoch == c.epoch {
        return Ok(());
    }
    // During a move: reads under the spec it started from.
    if c.previous == Some(epoch) && c.spec.next().is_some() && !write {
        return Ok(());
    }
    Err(ErrorReply::wrong_epoch(c.epoch))
}

/// Pending partitions of `name` that no other server of the spec holds a replica of: nothing
/// to copy them from (every replica they had was failed over, as after `cluster recover` with
/// data lost). They stay pending, never served empty, until the table is dropped or a server
/// that holds them comes back; until then the leader begins no rejoin (it waits for every
/// server to have nothing pending), which CLUSTER_STATUS shows as `stranded_partitions`.
fn stranded_partitions(
    state: &Node,
    cluster: Option<&ClusterState>,
    name: &str,
    pending: &[ramgrid_store::tables::PendingVersion],
) -> u64 {
    let (Some(c), Ok(info)) = (cluster, state.tables.describe(name)) else {
        return 0;
    };
    let map = PartitionMap::new(&c.spec, info.spec.partitions, info.spec.replication);
    let members = c.spec.members();
    let alone = |p: u32| {
        map.replicas(p)
            .iter()
            .all(|&i| members[i as usize] == state.server_id)
    };
    pending
        .iter()
        .map(|v| v.partitions.iter().filter(|&&p| alone(p)).count() as u64)
        .sum()
}

/// CLUSTER_STATUS: this server's view, one `key value` line each.
pub fn status_text(state: &Node) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let cluster = state.cluster.read().clone();
    let _ = writeln!(s, "server {}", state.server_id);
    match &cluster {
        None => {
            let _ = writeln!(s, "epoch 0");
        }
        Some(c) => {
            let _ = writeln!(s, "epoch {:016x}", c.epoch);
            let _ = writeln!(s, "servers {}", c.spec.servers().join(","));
            if let Some(next) = c.spec.next() {
                let _ = writeln!(s, "next {}", next.join(","));
            }
        }
    }
    let (mut pending_parts, mut pending_versions, mut stranded) = (0u64, 0u64, 0u64);
    for name in state.tables.list() {
        if let Ok(p) = state.tables.pending(&name) {
            pending_versions += p.len() as u64;
            pending_parts += p.iter().map(|v| v.partitions.len() as u64).sum::<u64>();
            stranded += stranded_partitions(state, cluster.as_ref(), &name, &p);
            for v in p {
                let _ = writeln!(
                    s,
                    "repairing {name} v{} partitions {}",
                    v.version,
                    v.partitions
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                );
            }
        }
    }
    if let Some(meta) = state.meta.get() {
        meta.status_lines(&mut s);
    }
    state.replica_checks.status_lines(&mut s);
    let r = &state.repair;
    let _ = writeln!(s, "pending_partitions {pending_parts}");
    let _ = writeln!(s, "stranded_partitions {stranded}");
    let _ = writeln!(s, "pending_versions {pending_versions}");
    let _ = writeln!(
        s,
        "catalog_learned {}",
        u8::from(!r.needs_catalog.load(Ordering::Acquire))
    );
    let _ = writeln!(
        s,
        "copied_partitions {}",
        r.copied_partitions.load(Ordering::Relaxed)
    );
    let _ = writeln!(s, "copied_bytes {}", r.copied_bytes.load(Ordering::Relaxed));
    let _ = writeln!(
        s,
        "copy_failures {}",
        r.copy_failures.load(Ordering::Relaxed)
    );
    let last = r.last_error.lock().clone();
    if !last.is_empty() {
        let _ = writeln!(s, "last_error {}", last.replace('\n', " "));
    }
    s
}
