//! The repair thread: a server brings itself up to date from its peers, without a person.
//!
//! 1. **Spec.** A server started without one, with `--join ADDR,...`, asks those peers for the
//!    cluster spec (GET_SPEC) and installs the one most of them hold that lists it.
//! 2. **Catalog.** After its first spec (a restart) and after every move it takes part in, it
//!    asks every peer for its tables (LIST_TABLES) and adopts what it lacks: tables it does not
//!    have (or has under another incarnation: dropped and created again while it was away),
//!    versions, the current version and the high-water mark. What it adopts is *pending*
//!    for every partition it holds (cluster.rs): refused to readers with REPAIRING, open to writes.
//! 3. **Copy** (copy.rs). Every pending (version, partition) is copied from a replica that owns
//!    it, as a flat image read in chunks of [`CHUNK`] bytes (EXPORT_PARTITION), and imported
//!    (`Tables::import_image`); only then does this server serve reads of it. A partition no
//!    replica can give stays pending (reads go elsewhere, or fail as unavailable): never served
//!    empty.
//! 4. **Replayed logs.** At a restart, the open versions of log tables replayed from this
//!    server's own logs are pending too, with their content ([`reconcile_replayed`]): each
//!    partition that another replica holds is copied from one that serves it, which replaces the
//!    replay (the replica may have taken writes while this server was down). If *no* other
//!    replica serves it (each is unreachable, restarting itself and answering REPAIRING, or
//!    lacks the table), the replay is served as it is ([`Tables::serve_replayed`]): a whole
//!    cluster restarting at once must not wait for itself ([`serve_unserved`] decides it once
//!    before the server listens, the copy loop again whenever a copy fails that way). A version
//!    whose log was damaged is never served this way: it waits for a copy. A copy into an open
//!    partition is served only once it is in the log (`import_open`).
//!
//! One thread runs the passes; each table's copies run on `copy::COPY_THREADS` threads at once (a
//! partition per thread), so a repair is bound by the machine, not by one round trip at a time.
//! It wakes on every spec change and otherwise every [`PERIOD`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use ramgrid_proto::cluster::{ClusterSpec, PartitionMap};
use ramgrid_proto::native::{self as wire, Request, Response};
use ramgrid_store::tables::{Durability, TableSpec};

use crate::cluster::ClusterState;
use crate::convert::store_value_type;
use crate::node::Node;
use crate::peer::Peer;

mod copy;
use copy::copy_pending;
pub use copy::CHUNK;

/// How often the thread looks for work when nothing wakes it.
const PERIOD: Duration = Duration::from_millis(500);

/// What the repair thread shares with the rest of the server.
#[derive(Default)]
pub struct RepairState {
    /// Peers to learn the spec from when none is installed (`--join`).
    pub join: Vec<String>,
    /// The table catalog must be (re)learned from the peers.
    pub needs_catalog: AtomicBool,
    /// Partitions copied in since start.
    pub copied_partitions: AtomicU64,
    /// Image bytes copied in since start.
    pub copied_bytes: AtomicU64,
    /// Copies that failed (each is retried).
    pub copy_failures: AtomicU64,
    /// The last failure, for CLUSTER_STATUS.
    pub last_error: Mutex<String>,
    /// Log tables' replayed open versions, (table, versions), to reconcile once a first spec is
    /// installed (a restart with `--join` only: [`reconcile_replayed`]).
    pub deferred: Mutex<Vec<(String, Vec<u32>)>>,
    woken: Mutex<bool>,
    cv: Condvar,
}

impl RepairState {
    /// A state that learns its spec from `join` when it has none.
    pub fn new(join: Vec<String>) -> RepairState {
        RepairState {
            join,
            ..RepairState::default()
        }
    }

    /// Wakes the repair thread now (a spec changed).
    pub fn wake(&self) {
        *self.woken.lock() = true;
        self.cv.notify_one();
    }

    fn wait(&self, period: Duration) {
        let mut woken = self.woken.lock();
        if !*woken {
            self.cv.wait_for(&mut woken, period);
        }
        *woken = false;
    }

    fn fail(&self, msg: String) {
        self.copy_failures.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_error.lock();
        // Retried every pass: say it once, not twice a second.
        if *last != msg {
            tracing::warn!("repair: {msg}");
            *last = msg;
        }
    }
}

/// Starts the repair thread; it ends when `stop` is set.
pub fn spawn(
    state: Arc<Node>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ramgrid-repair".into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                state.repair.wait(PERIOD);
                if stop.load(Ordering::Acquire) {
                    break;
                }
                step(&state, &stop);
            }
        })
}

/// One pass: spec, catalog, copies.
fn step(state: &Node, stop: &AtomicBool) {
    if state.cluster.read().is_none() {
        if !state.repair.join.is_empty() {
            learn_spec(state);
        }
        if state.cluster.read().is_none() {
            return;
        }
    }
    if state.repair.needs_catalog.load(Ordering::Acquire) && learn_catalog(state) {
        state.repair.needs_catalog.store(false, Ordering::Release);
    }
    for name in state.tables.list() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        copy_pending(state, &name);
    }
}

fn token(state: &Node) -> Option<&str> {
    state.token.as_deref()
}

/// The specs the `--join` peers that answer hold (those that have one).
fn peer_specs(state: &Node) -> Vec<ClusterSpec> {
    ask_peers(state, &state.repair.join, Request::GetSpec, |r| match r {
        Response::Spec(s) if s.epoch == 0 => Ok(None),
        Response::Spec(s) => ClusterSpec::parse_bytes(s.spec)
            .map(Some)
            .map_err(|e| e.to_string()),
        other => Err(format!("unexpected reply: {other:?}")),
    })
    .into_iter()
    .flatten()
    .collect()
}

/// Sends `req` to every peer of `addrs` at once and returns the answers `take` makes of their
/// replies (failures are logged). Once one peer has answered the others get [`JOIN_GRACE`]
/// more: a paused peer (which accepts the connection and never answers) must not hold a
/// restart for the whole peer timeout, during which this server refuses what it holds.
fn ask_peers<T: Send + 'static>(
    state: &Node,
    addrs: &[String],
    req: Request<'static>,
    take: fn(Response<'_>) -> Result<T, String>,
) -> Vec<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    for addr in addrs {
        let (tx, addr) = (tx.clone(), addr.clone());
        let (token, tls) = (state.token.clone(), state.tls.clone());
        // Detached: one still waiting on a silent peer ends by the peer timeouts, and its answer
        // then goes nowhere.
        std::thread::spawn(move || {
            let got = Peer::connect(&addr, token.as_deref(), tls.as_deref())
                .and_then(|mut p| p.call(&req, take));
            if let Err(e) = &got {
                tracing::info!("repair: {addr}: {e}");
            }
            let _ = tx.send(got.ok());
        });
    }
    drop(tx);
    let mut out = Vec::new();
    let mut deadline: Option<Instant> = None;
    for _ in 0..addrs.len() {
        let got = match deadline {
            None => rx.recv().ok(),
            Some(d) => rx
                .recv_timeout(d.saturating_duration_since(Instant::now()))
                .ok(),
        };
        let Some(got) = got else { break };
        if let Some(answer) = got {
            out.push(answer);
            deadline.get_or_insert_with(|| Instant::now() + JOIN_GRACE);
        }
    }
    out
}

/// How long the other peers get once one has answered (`ask_peers`).
const JOIN_GRACE: Duration = Duration::from_millis(500);

/// Whether a server starting with a `--cluster-spec` file should install it. The file only
/// starts a cluster: once the cluster has a spec, it is the one the metadata group committed,
/// and it changes (servers added, removed, failed over) while the file stays as written. So a
/// server restarted with the file it was first started with installs it only when nothing newer
/// is known: not when its own data directory holds the group's committed spec (`committed`), nor
/// when a `--join` peer already holds a spec (the repair thread then learns it from them; a
/// server the cluster has since removed gets none, and serves nothing, rather than the stale
/// file's).
pub fn use_spec_file(state: &Node, file: &ClusterSpec, committed: Option<&ClusterSpec>) -> bool {
    let why = match committed {
        Some(c) => format!(
            "this server's data directory holds the committed spec (epoch {:016x})",
            c.epoch()
        ),
        None => match peer_specs(state).into_iter().next() {
            Some(p) => format!(
                "the --join peers hold the cluster's spec (epoch {:016x})",
                p.epoch()
            ),
            None => return true,
        },
    };
    if committed.is_none_or(|c| c.epoch() != file.epoch()) {
        tracing::info!("the --cluster-spec file is not installed: {why}");
    }
    false
}

/// Installs the spec most `--join` peers hold that lists this server.
fn learn_spec(state: &Node) {
    let mut seen: HashMap<u64, (usize, ClusterSpec)> = HashMap::new();
    for spec in peer_specs(state) {
        if spec.index_of(&state.server_id).is_some() {
            seen.entry(spec.epoch()).or_insert((0, spec)).0 += 1;
        }
    }
    if let Some((_, spec)) = seen.into_values().max_by_key(|(n, _)| *n) {
        match crate::cluster::install_spec(state, spec) {
            Ok(epoch) => {
                tracing::info!("learned the cluster spec from a peer (epoch {epoch:016x})")
            }
            Err(e) => state.repair.fail(format!("spec from peers refused: {e}")),
        }
    }
}

/// The spec's members other than this server.
fn peers(state: &Node) -> Vec<String> {
    let cluster = state.cluster.read();
    let Some(c) = cluster.as_ref() else {
        return Vec::new();
    };
    c.spec
        .members()
        .into_iter()
        .filter(|m| *m != state.server_id)
        .collect()
}

/// Adopts the tables, versions and marks the peers hold and this server lacks. True once at
/// least one peer answered (or there is none).
fn learn_catalog(state: &Node) -> bool {
    let peers = peers(state);
    if peers.is_empty() {
        return true;
    }
    let answers = ask_peers(state, &peers, Request::ListTables, |r| match r {
        Response::Tables(t) => Ok(t),
        other => Err(format!("unexpected reply: {other:?}")),
    });
    if answers.is_empty() {
        return false;
    }
    let mut by_name: BTreeMap<String, Vec<wire::TableInfo>> = BTreeMap::new();
    for t in answers.into_iter().flatten() {
        by_name.entry(t.name.clone()).or_default().push(t);
    }
    for (name, infos) in by_name {
        if let Err(e) = adopt(state, &name, infos) {
            state.repair.fail(format!("table {name}: {e}"));
        }
    }
    true
}

/// Brings table `name` in line with the peers' descriptions of it.
fn adopt(state: &Node, name: &str, infos: Vec<wire::TableInfo>) -> Result<(), String> {
    // The incarnation most peers hold wins; a tie is left alone (reported).
    let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
    for t in &infos {
        *votes.entry(t.incarnation).or_default() += 1;
    }
    let best = votes.values().copied().max().unwrap_or(0);
    let winners: Vec<u64> = votes
        .iter()
        .filter(|(_, &n)| n == best)
        .map(|(&i, _)| i)
        .collect();
    if winners.len() != 1 {
        return Err(format!("peers disagree on its incarnation: {winners:x?}"));
    }
    let incarnation = winners[0];
    let infos: Vec<&wire::TableInfo> = infos
        .iter()
        .filter(|t| t.incarnation == incarnation)
        .collect();
    let first = infos[0];
    let spec = TableSpec {
        name: name.to_owned(),
        partitions: first.partitions,
        replication: first.replication,
        value_type: store_value_type(first.value_type),
        durability: match first.durability {
            wire::Durability::Memory => Durability::Memory,
            wire::Durability::Snapshot => Durability::Snapshot,
            wire::Durability::Log => Durability::Log,
        },
        incarnation,
    };
    let mut versions: BTreeMap<u32, bool> = BTreeMap::new();
    let mut currents: BTreeMap<u32, usize> = BTreeMap::new();
    let mut high_water = 0;
    for t in &infos {
        for v in &t.versions {
            *versions.entry(v.number).or_default() |= v.sealed;
        }
        *currents.entry(t.current_version).or_default() += 1;
        high_water = high_water.max(t.high_water);
    }
    let current = currents
        .iter()
        .max_by_key(|(_, &n)| n)
        .map(|(&v, _)| v)
        .unwrap_or(0);
    let tables = &state.tables;
    match tables.describe(name) {
        Ok(local) if local.spec.incarnation == incarnation => {
            for (&v, &sealed) in &versions {
                if !local.versions.iter().any(|l| l.number == v) {
                    tables
                        .adopt_version(name, v, sealed)
                        .map_err(|e| e.to_string())?;
                }
            }
            let _ = tables.raise_high_water(name, high_water);
            if let Some(p) = &state.persist {
                p.sync_table(tables, name)?;
            }
            if current != local.current && (current == 0 || versions.contains_key(&current)) {
                let _ = tables.adopt_current(name, current);
            }
        }
        other => {
            if let Ok(stale) = other {
                tracing::info!(
                    "repair: table {name} here is incarnation {:016x}, the peers' is {incarnation:016x}: replacing it",
                    stale.spec.incarnation
                );
                if let Some(p) = &state.persist {
                    p.drop_table(&stale.spec)?;
                }
                let _ = tables.drop_table(name);
            }
            let held = crate::cluster::held_partitions(state.cluster.read().as_ref(), &spec);
            tables
                .adopt_table(spec, &held, high_water)
                .map_err(|e| e.to_string())?;
            for (&v, &sealed) in &versions {
                tables
                    .adopt_version(name, v, sealed)
                    .map_err(|e| e.to_string())?;
            }
            let _ = tables.adopt_current(name, current);
            if let Some(p) = &state.persist {
                // Durable here too: its catalog, and a log for each open version of a log table.
                p.sync_table(tables, name)?;
            }
            tracing::info!(
                "repair: adopted table {name} ({} versions, current {current}) from peers",
                versions.len()
            );
        }
    }
    Ok(())
}

/// After a restart from the data directory: marks pending the partitions of the open versions
/// of log table `name` replayed from this server's logs (module docs, item 4). `replayed` are
/// the versions replayed whole, each partition of which is reconciled with a replica if another
/// replica holds it (and served as replayed if none can give it); `copying` are those whose log
/// was damaged (set aside, started afresh), every held partition of which must be copied.
/// Returns the (version, partitions) marked servable, for [`serve_unserved`].
///
/// A server with no spec yet (started with `--join` only) cannot tell which partitions have
/// other replicas: the damaged versions are marked now, the others when its first spec is
/// installed ([`reconcile_deferred`], under the spec's write lock, so no request routed under
/// that spec reads them unmarked; requests routed under a spec are refused until then).
pub fn reconcile_replayed(
    state: &Node,
    name: &str,
    replayed: &[u32],
    copying: &[u32],
) -> Vec<(u32, Vec<u32>)> {
    let cluster = state.cluster.read().clone();
    if cluster.is_none() {
        let later: Vec<u32> = replayed
            .iter()
            .copied()
            .filter(|v| !copying.contains(v))
            .collect();
        if !later.is_empty() {
            state.repair.deferred.lock().push((name.to_owned(), later));
        }
        let now: Vec<u32> = replayed
            .iter()
            .copied()
            .filter(|v| copying.contains(v))
            .collect();
        mark_replayed(state, None, name, &now, copying);
        return Vec::new();
    }
    mark_replayed(state, cluster.as_ref(), name, replayed, copying)
}

/// The first spec is being installed (`cluster`, not yet published): marks the replayed
/// versions [`reconcile_replayed`] deferred. The repair thread copies or serves them.
pub fn reconcile_deferred(state: &Node, cluster: &ClusterState) {
    let deferred = std::mem::take(&mut *state.repair.deferred.lock());
    for (name, versions) in deferred {
        mark_replayed(state, Some(cluster), &name, &versions, &[]);
    }
}

fn mark_replayed(
    state: &Node,
    cluster: Option<&ClusterState>,
    name: &str,
    replayed: &[u32],
    copying: &[u32],
) -> Vec<(u32, Vec<u32>)> {
    let mut servable_marked = Vec::new();
    let Ok(info) = state.tables.describe(name) else {
        return servable_marked;
    };
    let others: Vec<u32> = match cluster {
        Some(c) => {
            let map = PartitionMap::new(&c.spec, info.spec.partitions, info.spec.replication);
            let me = c.index;
            (0..info.spec.partitions)
                .filter(|&p| info.held.contains(&p))
                .filter(|&p| map.replicas(p).iter().any(|&i| Some(i) != me))
                .collect()
        }
        None => Vec::new(),
    };
    for &v in replayed {
        let (parts, servable) = if copying.contains(&v) {
            (&info.held, false)
        } else {
            (&others, true)
        };
        if parts.is_empty() {
            continue;
        }
        match state.tables.mark_replayed_pending(name, v, parts, servable) {
            Ok(()) => {
                tracing::info!(
                    "repair: {name} v{v}: {} replayed partitions to {} a replica",
                    parts.len(),
                    if servable {
                        "reconcile with"
                    } else {
                        "copy from (its log was damaged)"
                    }
                );
                if servable {
                    servable_marked.push((v, parts.clone()));
                }
            }
            Err(e) => state.repair.fail(format!("{name} v{v}: {e}")),
        }
    }
    servable_marked
}

/// Before the server accepts connections: the replayed partitions of `marked` (table, version,
/// partitions) that no other replica serves *now* are served as replayed at once (module docs,
/// item 4), so a whole-cluster restart serves as soon as each server listens rather than after
/// its repair thread's first pass. Each peer is asked once (CLUSTER_STATUS: it is unreachable,
/// or it lists the partition as repairing); a partition some peer serves stays pending, and is
/// copied once this server takes writes (a copy taken before would miss the writes made until
/// then).
pub fn serve_unserved(state: &Node, marked: &[(String, u32, Vec<u32>)]) {
    if marked.is_empty() {
        return;
    }
    let Some(cluster) = state.cluster.read().clone() else {
        return;
    };
    let members = cluster.spec.members();
    // Per peer: None if unreachable, else the (table, version, partition) it is repairing.
    let mut status: HashMap<String, Option<Vec<Repairing>>> = HashMap::new();
    for (name, v, parts) in marked {
        let Ok(info) = state.tables.describe(name) else {
            continue;
        };
        let map = PartitionMap::new(&cluster.spec, info.spec.partitions, info.spec.replication);
        let mut served = 0usize;
        for &p in parts {
            let sources: Vec<&String> = map
                .replicas(p)
                .iter()
                .map(|&i| &members[i as usize])
                .filter(|a| **a != state.server_id)
                .collect();
            let unserved = sources.iter().all(|src| {
                let st = status
                    .entry((*src).clone())
                    .or_insert_with(|| repairing_on(state, src));
                match st {
                    None => true,
                    Some(list) => list
                        .iter()
                        .any(|(n, lv, lp)| n == name && lv == v && *lp == p),
                }
            });
            if unserved && state.tables.serve_replayed(name, *v, p).unwrap_or(false) {
                served += 1;
            }
        }
        if served > 0 {
            tracing::info!(
                "repair: {name} v{v}: {served} of {} replayed partitions served \
                 as replayed from this server's log, no other replica serves them",
                parts.len()
            );
        }
    }
}

/// A (table, version, partition) a peer is copying in.
type Repairing = (String, u32, u32);

/// What peer `addr` is repairing (CLUSTER_STATUS `repairing` lines), or `None` if it does not
/// answer.
fn repairing_on(state: &Node, addr: &str) -> Option<Vec<Repairing>> {
    let text = Peer::connect(addr, token(state), state.tls.as_deref())
        .and_then(|mut p| {
            p.call(&Request::ClusterStatus, |r| match r {
                Response::Status(t) => Ok(t.to_owned()),
                other => Err(format!("unexpected reply: {other:?}")),
            })
        })
        .ok()?;
    let mut out = Vec::new();
    for line in text.lines() {
        // `repairing <name> v<version> partitions <p>,<p>,...` (names may hold spaces).
        let Some(rest) = line.strip_prefix("repairing ") else {
            continue;
        };
        let Some((head, parts)) = rest.rsplit_once(" partitions ") else {
            continue;
        };
        let Some((name, v)) = head.rsplit_once(" v") else {
            continue;
        };
        let Ok(v) = v.parse::<u32>() else { continue };
        for p in parts.split(',').filter_map(|p| p.parse::<u32>().ok()) {
            out.push((name.to_owned(), v, p));
        }
    }
    Some(out)
}
