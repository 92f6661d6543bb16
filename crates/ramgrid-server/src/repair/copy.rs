//! Step 3 of the repair (module docs of `repair`): every pending (version, partition) copied in
//! from a replica that owns it, as a flat image read in chunks of [`CHUNK`] bytes
//! (EXPORT_PARTITION) and imported; an open version's copy is served only once it is durable.
//! [`COPY_THREADS`] partitions are copied at once.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::Mutex;
use ramgrid_proto::cluster::PartitionMap;
use ramgrid_proto::native::{ExportRequest, Request, Response, Status};
use ramgrid_store::tables::{Durability, TableSpec, ValueRef};

use super::token;
use crate::node::Node;
use crate::peer::{Peer, PeerError};

/// Bytes asked for per EXPORT_PARTITION chunk.
pub const CHUNK: u32 = 4 << 20;

/// Why one copy failed.
enum CopyError {
    /// Asking the source: it refused or could not be reached.
    Fetch(PeerError),
    /// Taking the copy in here (import or log).
    Local(String),
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::Fetch(e) => e.fmt(f),
            CopyError::Local(m) => f.write_str(m),
        }
    }
}

/// Copies in every pending partition of table `name`: [`COPY_THREADS`] copies at once, each
/// (version, partition) by one thread from one replica, so that a repair runs at the speed of
/// the machine rather than of one round trip at a time.
pub(super) fn copy_pending(state: &Node, name: &str) {
    let Ok(pending) = state.tables.pending(name) else {
        return;
    };
    if pending.is_empty() {
        return;
    }
    let Ok(info) = state.tables.describe(name) else {
        return;
    };
    let Some(cluster) = state.cluster.read().clone() else {
        return;
    };
    let map = PartitionMap::new(&cluster.spec, info.spec.partitions, info.spec.replication);
    let job = Job {
        state,
        name,
        spec: &info.spec,
        map: &map,
        members: cluster.spec.members(),
        epoch: cluster.epoch,
        gone: Mutex::new(Vec::new()),
    };
    let work: Vec<(u32, u32)> = pending
        .iter()
        .flat_map(|v| v.partitions.iter().map(move |&p| (v.version, p)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = COPY_THREADS.min(work.len());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut peers: HashMap<String, Peer> = HashMap::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(version, p)) = work.get(i) else {
                        return;
                    };
                    if !job.gone.lock().contains(&version) {
                        job.copy_partition(&mut peers, version, p);
                    }
                }
            });
        }
    });
}

/// Seals version `version` here if no partition of it is pending any more: it was sealed by its
/// replicas while this server was copying it in, so the seal never reached it.
fn seal_once_copied(state: &Node, spec: &TableSpec, version: u32) {
    let pending = state.tables.pending(&spec.name).unwrap_or_default();
    if pending.iter().any(|pv| pv.version == version) {
        return;
    }
    use crate::persist::SealError;
    let sealed = match &state.persist {
        Some(p) => p.seal(&state.tables, &spec.name, version),
        None => state
            .tables
            .seal_version(&spec.name, version)
            .map_err(SealError::Store),
    };
    match sealed {
        // Another copying thread's last partition came first.
        Err(SealError::Store(ramgrid_store::Error::VersionSealed(_))) => {}
        Ok(()) => tracing::info!(
            "repair: {} v{version} sealed here, as its replicas did while it was copied in",
            spec.name
        ),
        Err(SealError::Store(e)) => state
            .repair
            .fail(format!("{} v{version}: cannot seal: {e}", spec.name)),
        Err(SealError::Disk(e)) => state
            .repair
            .fail(format!("{} v{version}: cannot seal: {e}", spec.name)),
    }
}

/// How many partitions one server copies in at once.
const COPY_THREADS: usize = 4;

/// One table's copy pass, shared by the copying threads.
struct Job<'a> {
    state: &'a Node,
    name: &'a str,
    spec: &'a TableSpec,
    map: &'a PartitionMap,
    members: Vec<String>,
    epoch: u64,
    /// Versions every owner dropped (found by one thread: the others skip their partitions).
    gone: Mutex<Vec<u32>>,
}

impl Job<'_> {
    /// Copies (version, partition) `p` from the first of its replicas that gives it.
    fn copy_partition(&self, peers: &mut HashMap<String, Peer>, version: u32, p: u32) {
        let (state, name) = (self.state, self.name);
        // Owners under the `server` list hold the data; self is never a source.
        let sources: Vec<&String> = self
            .map
            .replicas(p)
            .iter()
            .map(|&i| &self.members[i as usize])
            .filter(|a| **a != state.server_id)
            .collect();
        let mut gone = 0usize;
        // Sources that do not serve the partition: unreachable, restarting (REPAIRING), or
        // without the table (restarted empty).
        let mut absent = 0usize;
        let mut quiet = false;
        let mut why = Vec::new();
        for src in &sources {
            match copy_one(state, peers, src, self.spec, (self.epoch, version), p) {
                Ok(()) => return,
                Err(CopyError::Fetch(PeerError::Refused(e)))
                    if e.status == Status::NoSuchVersion =>
                {
                    gone += 1;
                    why.push(format!("{src}: no such version"));
                }
                // Not at our spec yet (a move reaching it): try again on the next pass.
                Err(CopyError::Fetch(PeerError::Refused(e))) if e.status == Status::WrongEpoch => {
                    why.push(format!("{src}: not at this epoch yet"));
                    quiet = true;
                }
                Err(CopyError::Fetch(PeerError::Refused(e)))
                    if matches!(e.status, Status::Repairing | Status::NoSuchTable) =>
                {
                    absent += 1;
                    why.push(format!("{src}: {} {}", e.status.name(), e.message));
                }
                Err(e) => {
                    if matches!(e, CopyError::Fetch(PeerError::Failed(_))) {
                        absent += 1;
                    }
                    peers.remove(*src);
                    why.push(format!("{src}: {e}"));
                }
            }
        }
        let why = || {
            if why.is_empty() {
                "no other replica".to_string()
            } else {
                why.join("; ")
            }
        };
        if absent == sources.len()
            && state
                .tables
                .serve_replayed(name, version, p)
                .unwrap_or(false)
        {
            // No other replica serves it (a whole-cluster restart): what this server's own log
            // holds is the best there is, and waiting would wait for itself.
            tracing::info!(
                "repair: {name} v{version} partition {p}: served as replayed from this server's log, no other replica serves it ({})",
                why()
            );
            return;
        }
        if !sources.is_empty() && gone == sources.len() {
            // Every owner dropped it while this server was away.
            let mut dropped = self.gone.lock();
            if !dropped.contains(&version) {
                dropped.push(version);
                let _ = state.tables.drop_version(name, version, true);
                tracing::info!(
                    "repair: {name} v{version} was dropped by its replicas: dropped here"
                );
            }
            return;
        }
        if quiet {
            return;
        }
        state.repair.fail(format!(
            "{name} v{version} partition {p}: no replica could give it ({})",
            why()
        ));
    }
}

/// Copies one (version, partition) from `src` and imports it.
fn copy_one(
    state: &Node,
    peers: &mut HashMap<String, Peer>,
    src: &str,
    spec: &TableSpec,
    (epoch, version): (u64, u32),
    partition: u32,
) -> Result<(), CopyError> {
    let started = Instant::now();
    if !peers.contains_key(src) {
        let peer =
            Peer::connect(src, token(state), state.tls.as_deref()).map_err(CopyError::Fetch)?;
        peers.insert(src.to_owned(), peer);
    }
    let peer = peers.get_mut(src).expect("just inserted");
    let (mut id, mut image, mut sealed, mut total) = (0u64, Vec::new(), false, u64::MAX);
    while (image.len() as u64) < total {
        let req = Request::ExportPartition(ExportRequest {
            table: &spec.name,
            incarnation: spec.incarnation,
            version,
            partition,
            epoch,
            export_id: id,
            offset: image.len() as u64,
            max_len: CHUNK,
        });
        let before = image.len();
        peer.call(&req, |r| match r {
            Response::Export(c) => {
                id = c.export_id;
                total = c.total;
                sealed = c.sealed;
                image.extend_from_slice(c.chunk);
                Ok(())
            }
            other => Err(format!("unexpected reply: {other:?}")),
        })
        .map_err(CopyError::Fetch)?;
        if image.len() == before && (image.len() as u64) < total {
            return Err(CopyError::Fetch(PeerError::Failed(format!(
                "{src}: empty chunk before the end"
            ))));
        }
    }
    let open_here = sealed
        && state
            .tables
            .at(&spec.name, version)
            .is_ok_and(|tv| !tv.is_sealed());
    let (items, dropped) = if open_here {
        // Sealed by its replicas while this server held it open (a SEAL is refused here while a
        // partition is still being copied in): the copy goes in as an open one, and the version
        // is sealed here once its last partition is in.
        let r = import_open(state, spec, version, partition, &image)
            .map_err(|e| CopyError::Local(format!("copy from {src}: {e}")))?;
        seal_once_copied(state, spec, version);
        r
    } else if sealed {
        // On disk first (durable tables): once the partition is served, a restart loads it
        // rather than copying it again. A failure here costs only that; the copy is served.
        if let Some(persist) = &state.persist {
            if let Err(e) = persist.store_image(spec, version, partition, &image) {
                state.repair.fail(format!(
                    "{} v{version} partition {partition}: {e}",
                    spec.name
                ));
            }
        }
        let (items, _) = state
            .tables
            .import_image_then(&spec.name, version, partition, &image, |_, _| ())
            .map_err(|e| CopyError::Local(format!("import from {src}: {e}")))?;
        (items, 0)
    } else {
        import_open(state, spec, version, partition, &image)
            .map_err(|e| CopyError::Local(format!("copy from {src}: {e}")))?
    };
    let r = &state.repair;
    r.copied_partitions.fetch_add(1, Ordering::Relaxed);
    r.copied_bytes
        .fetch_add(image.len() as u64, Ordering::Relaxed);
    tracing::info!(
        "repair: copied {} v{version} ({}) partition {partition} from {src}: {items} items{}, {} bytes, {:.0} ms",
        spec.name,
        if sealed { "sealed" } else { "open" },
        if dropped == 0 {
            String::new()
        } else {
            format!(" ({dropped} dropped here: the replica no longer has them)")
        },
        image.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Brings a copy into open version `version` and serves it only once it is durable. For a log
/// table the copy goes into the version's write-ahead log too, or a restart would replay the
/// writes since the copy without it: the deletion of the keys the copy dropped, then every key
/// the partition holds, appended under the partition's write lock (so every later write's
/// record follows them) and fsynced. A damaged log's mark goes when the version's last pending
/// partition is in (persist.rs). Only then does the partition stop being pending; on an error
/// it stays pending and a later pass copies it again. Returns (items stored, keys dropped).
fn import_open(
    state: &Node,
    spec: &TableSpec,
    version: u32,
    partition: u32,
    image: &[u8],
) -> Result<(usize, usize), String> {
    let tables = &state.tables;
    let log = match &state.persist {
        Some(persist) => {
            let tv = tables.at(&spec.name, version).map_err(|e| e.to_string())?;
            persist.log_of(&tv)?
        }
        None => None,
    };
    let (items, appended) = tables
        .import_image_then(&spec.name, version, partition, image, |view, dropped| {
            let ticket = log.as_ref().map(|log| {
                let bytes: Vec<(&[u8], Vec<u8>)> = view
                    .iter()
                    .map(|(k, v)| {
                        let b = match v {
                            ValueRef::I64(x) => x.to_le_bytes().to_vec(),
                            ValueRef::F64(x) => x.to_le_bytes().to_vec(),
                            ValueRef::F32Vec(f) => f.iter().flat_map(|x| x.to_le_bytes()).collect(),
                            ValueRef::F32VecLe(b) | ValueRef::Bytes(b) => b.to_vec(),
                        };
                        (k, b)
                    })
                    .collect();
                let gone = dropped.iter().map(|k| crate::wal::Op::Delete(k));
                log.append(
                    partition,
                    gone.chain(bytes.iter().map(|(k, v)| crate::wal::Op::Put(k, v))),
                )
            });
            (ticket, dropped.len())
        })
        .map_err(|e| format!("import: {e}"))?;
    let Some((ticket, dropped)) = appended else {
        // Sealed meanwhile (replaced whole) or no longer pending: nothing more to do.
        return Ok((items, 0));
    };
    if let (Some(log), Some(ticket)) = (&log, ticket) {
        log.commit(ticket)
            .map_err(|e| format!("logging the copy: {e}"))?;
    }
    if let Some(persist) = &state.persist {
        let last = tables
            .pending(&spec.name)
            .map(|p| {
                p.iter()
                    .filter(|v| v.version == version)
                    .all(|v| v.partitions == [partition])
            })
            .unwrap_or(false);
        if last && spec.durability == Durability::Log {
            persist.copy_done(spec, version)?;
        }
    }
    tables
        .finish_import(&spec.name, version, partition)
        .map_err(|e| e.to_string())?;
    Ok((items, dropped))
}
