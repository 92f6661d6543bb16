//! The partition round every read-like request shares (GET, operators, scans): assign each
//! partition to one replica, send one frame per server (`hedge.rs`), take each partition's answer
//! from exactly one reply, fail over to the replicas left when a server fails, and end with the
//! partitions that no replica answered named in the error.
//!
//! Invariants relied on:
//! 1. A partition's result comes from one whole reply: a later reply covering it (a backup, a
//!    resend) is skipped for it (`done` in `Take`), so nothing is counted twice.
//! 2. The replica-failure refusals (NO_QUORUM, REPAIRING, INTERNAL, NO_SUCH_TABLE) are decided here
//!    once for every request kind: the partition goes to another replica, the server stays up.
//!    REPAIRING names the partitions a server is still copying in: only those leave it (for the
//!    rest of the call); its other partitions of the frame go back to it (`hedge.rs`), so two
//!    replicas each repairing some partition do not fail each other's reads.
//!    WRONG_EPOCH and NOT_OWNER end the round as `OpError::Stale` (the caller refreshes the spec
//!    and runs a new round); other refusals end it as the error they map to.

use std::sync::atomic::{AtomicU64, Ordering};

use ramgrid_proto::cluster::PartitionMap;
use ramgrid_proto::native::{Opcode, Response, Status};

use crate::client::{refusal, Client, Handled, OpError, Topology};
use crate::error::Error;
use crate::hedge::{Encode, ReadIo, Take};
use crate::plan::{Consistency, Groups};

/// Which replica of a partition a round asks first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Its first replica that is up (the primary unless it is down): reads of data a replica may
    /// not hold yet (see [`Client::read_pick`]).
    Primary,
    /// Replica `(p + seed) mod R` first, then the others in order: operators, whose work per
    /// partition is a whole pass, and reads of data every replica holds; consecutive calls
    /// (another seed each) spread the work over every replica instead of loading the primaries only.
    Spread(u64),
    /// Server `.0` (an index into the topology's pools) first where it is a replica of the
    /// partition, then the others in order; the primary first where it is not. For a job's task
    /// placed beside one replica (a scan of its partition). Only for data every replica holds:
    /// [`Client::prefer_pick`] decides.
    Prefer(usize),
}

impl Pick {
    /// Index into partition `p`'s replica list `reps` (server indexes) of the replica asked first.
    pub(crate) fn first(self, p: u32, reps: &[u32]) -> usize {
        match self {
            Pick::Primary => 0,
            Pick::Spread(seed) => {
                ((u64::from(p).wrapping_add(seed)) % reps.len().max(1) as u64) as usize
            }
            Pick::Prefer(server) => reps.iter().position(|&s| s as usize == server).unwrap_or(0),
        }
    }
}

/// The spread seed: one more per read call, shared by every client of the process.
static READ_SEED: AtomicU64 = AtomicU64::new(0);

impl Client {
    /// The replica rule for reads (docs/client.md, rule 16; docs/replication.md, "Reads"):
    /// 1. a sealed version is identical on every replica (written, then sealed, before any read
    ///    can name it), so its reads spread over the replicas; so do reads of the current version
    ///    (0) once it is a sealed one (a fresh table's current version is open);
    /// 2. with `consistency = replica` reads of an open version spread too: every acknowledged
    ///    write is on every replica, but a write in flight may be seen at a backup before the
    ///    primary shows it;
    /// 3. otherwise (the default) reads of an open version go to the primary, which holds a write
    ///    only once every replica does: linearizable. The primary is not hedged; a failed
    ///    primary's partitions go to the next replica, as every read's do.
    pub(crate) fn read_pick(&self, table: &str, version: u32) -> Pick {
        let same_everywhere = self.inner.consistency == Consistency::Replica
            || match version {
                0 => self.current_sealed(table),
                v => self.version_sealed(table, v),
            };
        if same_everywhere {
            Pick::Spread(READ_SEED.fetch_add(1, Ordering::Relaxed))
        } else {
            Pick::Primary
        }
    }

    /// The replica rule for a read that would rather be served by server `server` (an index into
    /// the topology's pools): [`Pick::Prefer`] where [`Client::read_pick`] would spread the read
    /// (every replica holds what it may ask for), its own pick otherwise (a replica may lag behind
    /// this client's writes, so the primary is asked first). Failover is the same either way.
    pub(crate) fn prefer_pick(&self, table: &str, version: u32, server: usize) -> Pick {
        match self.read_pick(table, version) {
            Pick::Spread(_) => Pick::Prefer(server),
            other => other,
        }
    }
}

/// How a round builds its frames and takes its replies.
pub(crate) struct RoundIo<'a, 'f> {
    /// The request's opcode.
    pub(crate) opcode: Opcode,
    /// Whether a late server's partitions get a backup (see `ReadIo::hedge`).
    pub(crate) hedge: bool,
    /// Which replica first.
    pub(crate) pick: Pick,
    /// Work in a partition (keys), for the hedge delay.
    pub(crate) keys_in: &'a dyn Fn(u32) -> usize,
    /// Builds the frame for (server, its partitions, buffer, request id).
    pub(crate) encode: &'a mut Encode<'f>,
    /// Takes an OK reply (any refusal was handled by the round); `Handled::Failed` for a reply
    /// of the wrong shape.
    pub(crate) take: &'a mut Take<'f>,
}

impl Client {
    /// Runs partitions `todo` of `table` (at `version`, for error messages) to completion: rounds
    /// until each is answered or every replica of it has failed in this call.
    pub(crate) fn partition_round(
        &self,
        topo: &Topology,
        map: &PartitionMap,
        table: &str,
        version: u32,
        mut todo: Vec<u32>,
        io: RoundIo<'_, '_>,
    ) -> std::result::Result<(), OpError> {
        let servers = topo.pools.len();
        let mut failed = vec![false; servers];
        let mut unavailable: Vec<u32> = Vec::new();
        let mut why: Vec<String> = Vec::new();
        let mut lost_table = false;
        // Servers that refused as catching up with the metadata group (a moment after a restart).
        let mut catching_up = vec![false; servers];
        let (mut pause, started) = (NOT_YET_PAUSE, std::time::Instant::now());
        let mut assign = vec![usize::MAX; map.partitions() as usize];
        // Per partition: the servers that refused it in this call (still copying it in).
        let mut repairing: Vec<Vec<usize>> = vec![Vec::new(); map.partitions() as usize];
        let RoundIo {
            opcode,
            hedge,
            pick,
            keys_in,
            encode,
            take,
        } = io;
        while !todo.is_empty() {
            for &p in &todo {
                let reps = map.replicas(p);
                let first = pick.first(p, reps);
                let order = || reps[first..].iter().chain(&reps[..first]);
                let usable = |s: usize| !failed[s] && !repairing[p as usize].contains(&s);
                let pick = order()
                    .find(|&&s| {
                        usable(s as usize) && !topo.pools[s as usize].health.avoid_for_reads()
                    })
                    .or_else(|| order().find(|&&s| usable(s as usize)));
                match pick {
                    Some(&s) => assign[p as usize] = s as usize,
                    None => {
                        assign[p as usize] = usize::MAX;
                        unavailable.push(p);
                    }
                }
            }
            let per_server = Groups::by_target(servers, todo.iter().copied(), |p| {
                Some(assign[p as usize]).filter(|&s| s != usize::MAX)
            });
            let lost = &mut lost_table;
            let repairing = &mut repairing;
            let waiting = &mut catching_up;
            let mut take_any = |s: usize, parts: &[u32], done: &[bool], resp: Response<'_>| {
                let addr = &topo.pools[s].addr;
                match resp {
                    Response::Error(e) if e.status == Status::Repairing => {
                        for &p in &e.partitions {
                            if let Some(r) = repairing.get_mut(p as usize) {
                                r.push(s);
                            }
                        }
                        Ok(Handled::Refused {
                            error: Error::Server {
                                server: addr.clone(),
                                status: "REPAIRING",
                                message: format!(
                                    "partitions {:?} being repaired {}",
                                    e.partitions, e.message
                                ),
                            },
                            partitions: e.partitions,
                        })
                    }
                    Response::Error(e) => match replica_failure(addr, e, lost) {
                        Ok(h)
                            if matches!(&h, Handled::Failed(Error::Server { message, .. })
                            if message.starts_with(ramgrid_proto::native::CATCHING_UP)) =>
                        {
                            waiting[s] = true;
                            Ok(h)
                        }
                        Ok(h) => Ok(h),
                        Err(e) => Err(refusal(s, addr, table, version, e)),
                    },
                    other => take(s, parts, done, other),
                }
            };
            let rio = ReadIo {
                opcode,
                hedge,
                keys_in,
                encode: &mut *encode,
                take: &mut take_any,
            };
            let end = self.hedged_get(topo, map, &per_server, &mut failed, rio)?;
            why.extend(end.why);
            todo = end.undone;
            // Every replica of the partitions left said "not yet" (copying them in, or catching up
            // with the group after a restart): ask them again shortly, for a while, before
            // naming them unavailable.
            let not_yet = |p: u32| {
                let reps = map.replicas(p);
                !reps.is_empty()
                    && reps.iter().all(|&s| {
                        catching_up[s as usize] || repairing[p as usize].contains(&(s as usize))
                    })
            };
            if todo.is_empty()
                && !unavailable.is_empty()
                && unavailable.iter().all(|&p| not_yet(p))
                && started.elapsed() + pause < NOT_YET_WAIT
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(NOT_YET_PAUSE * 8);
                todo = std::mem::take(&mut unavailable);
                why.clear();
                failed.iter_mut().for_each(|f| *f = false);
                catching_up.iter_mut().for_each(|w| *w = false);
                repairing.iter_mut().for_each(Vec::clear);
            }
        }
        if unavailable.is_empty() {
            return Ok(());
        }
        if lost_table && why.iter().all(|w| w.contains("NO_SUCH_TABLE")) {
            // Dropped (or created again) on the servers that should have held these partitions:
            // the caller forgets what it knew of the table and, for the current version, asks again.
            return Err(OpError::Fatal(Error::TableNotFound(table.to_string())));
        }
        unavailable.sort_unstable();
        unavailable.dedup();
        Err(OpError::Fatal(Error::PartitionsUnavailable {
            partitions: unavailable,
            detail: why.join("; "),
        }))
    }
}

/// How long a round keeps asking again partitions whose every replica said "not yet" (copying
/// them in, catching up after a restart), and its first pause between tries (doubling to 8x).
const NOT_YET_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
const NOT_YET_PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// The refusals that fail one replica for these partitions (another replica may answer); any
/// other refusal is given back for the caller to map.
fn replica_failure(
    addr: &str,
    e: ramgrid_proto::native::ErrorReply,
    lost_table: &mut bool,
) -> std::result::Result<Handled, ramgrid_proto::native::ErrorReply> {
    let server = addr.to_string();
    Ok(Handled::Failed(match e.status {
        // Cut off from the cluster's metadata group: it serves nothing until a leader reaches it
        // again; the other replicas do.
        Status::NoQuorum => Error::Server {
            server,
            status: "NO_QUORUM",
            message: e.message,
        },
        Status::Internal => Error::Server {
            server,
            status: "INTERNAL",
            message: e.message,
        },
        // This server lost the table (restarted empty) or holds another incarnation of its name:
        // read its partitions from their other replicas. If none has them, the call ends as
        // TableNotFound, never as misses.
        Status::NoSuchTable => {
            *lost_table = true;
            Error::Server {
                server,
                status: "NO_SUCH_TABLE",
                message: e.message,
            }
        }
        _ => return Err(e),
    }))
}
