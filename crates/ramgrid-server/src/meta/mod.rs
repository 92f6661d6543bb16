//! The cluster's agreed state on this server: a member of the metadata Raft group
//! (`ramgrid_meta`), whose committed spec every server installs, and the lease that keeps a
//! server cut off from the group from serving (docs/control-plane.md).
//!
//! 1. **Forming the group.** A server starts outside any group. The first server of the first
//!    spec it is given (`--cluster-spec` or SET_SPEC) forms one, alone, once every other server
//!    of that spec answers and is in no group; it then proposes the spec, and as leader adds
//!    the others (learners first, then up to three voters; `leader.rs`). A server restarted
//!    without its Raft state (no `--data-dir`) is a new node under a new id, added back the same
//!    way; messages meant for its old id are refused.
//! 2. **The spec is what the group committed.** SET_SPEC on a member becomes a proposal (begin,
//!    complete or abort a move; the first spec), and every member installs each committed spec
//!    (`cluster::install_committed`). A plain spec that differs from the agreed one is refused
//!    with WRONG_EPOCH: membership changes are moves (`ramgrid cluster add|remove`) or the
//!    failure detector's fail-overs, never a client's overwrite. A server outside the group
//!    installs what it is given, as before the group existed, until the group adds it.
//! 3. **The lease.** A member serves (reads, writes, catalog changes) only while it knows that
//!    a leader with a majority reached it within the lease (`failure_timeout - 1 s`), and
//!    after any gap longer than that (a pause, a partition) only once it has read the group's
//!    state through the leader and installed it. The leader fails a server over only after
//!    `failure_timeout` without an answer, so a cut-off server has stopped serving before its
//!    partitions are given to others: nothing is acknowledged under an assignment the majority
//!    has replaced.
//! 4. **Tables and versions** (`catalog.rs`). CREATE_TABLE, DROP_TABLE, CREATE_VERSION (its
//!    number) and SET_CURRENT on a member are proposed first: of two clients creating one name
//!    or one version number, the first committed wins on every server and the other is refused
//!    by every server; a switch is installed on every server in commit order.

mod catalog;
mod leader;
mod recover;
pub mod transport;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ramgrid_meta::{MetaCommand, MetaConfig, MetaError, MetaNode, MetaState, NodeId};
use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::{self as wire, ErrorReply, Opcode, Request, Response, Status};
use tokio::time::Instant;

use crate::node::Node;
use crate::peer_pool::Pool;

/// How often the keeper looks at the lease, the group and (on the leader) the servers.
const TICK: Duration = Duration::from_millis(100);
/// How long a SET_SPEC waits for the committed spec to be installed here.
const INSTALL_WAIT: Duration = Duration::from_secs(5);

/// This server's member of the metadata group.
pub struct Meta {
    /// The group member; replaced whole when the group is rebuilt (`recover.rs`).
    node: parking_lot::RwLock<MetaNode>,
    /// Counts replacements of `node`, so that tasks following the old one follow the new.
    swaps: tokio::sync::watch::Sender<u64>,
    /// Held while RECOVER replaces `node`.
    recovering: tokio::sync::Mutex<()>,
    /// The state directory (None: in memory), for a replacement node.
    dir: Option<std::path::PathBuf>,
    rt: tokio::runtime::Handle,
    pool: Arc<Pool>,
    server_id: String,
    failure_timeout: Duration,
    lease: Duration,
    /// When the lease clock started; `contact_ms` counts from it.
    base: Instant,
    /// The last time (ms after `base`) a leader with a majority was known to reach this node.
    contact_ms: AtomicU64,
    /// Whether this node is in a group (cached for the request path).
    member: AtomicBool,
    /// Set after a gap longer than the lease, and at a restart as a member: serve nothing until
    /// caught up.
    stale: AtomicBool,
    /// This server's failure count as last seen in the state (None before the first).
    seen_failures: Mutex<Option<u64>>,
    /// Installs the current versions the group committed (`catalog.rs`).
    installer: Mutex<catalog::Installer>,
    /// Whether the installer has no switch waiting here: the fast path of [`Node::current_known`].
    settled: AtomicBool,
    /// Proposals made here: committed, refused by the state machine, failed (no quorum, other).
    proposals: [AtomicU64; 3],
    /// Fail-overs and rejoins this node proposed as leader, and their last outcome.
    pub(crate) events: leader::Events,
    /// While this server leads: the voters that answered its last status round (itself
    /// included), for the metrics (`leader::Leader::tick`); 0 otherwise.
    pub(crate) voters_answering: AtomicU64,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The state directory's lock, held while this member runs (`lock_dir`).
    lock: Mutex<Option<std::fs::File>>,
}

/// Creates the state directory and locks it for this process: two servers sharing one would
/// share one Raft identity and log, which breaks the group's safety, so the second refuses to
/// start. The lock goes with the process (or with `Meta::shutdown`).
fn lock_dir(d: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("state directory {}: {e}", d.display());
    std::fs::create_dir_all(d).map_err(|e| err(&e))?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(d.join("LOCK"))
        .map_err(|e| err(&e))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(err(
            &"in use by another server process (each server needs its own --meta-dir / --data-dir)",
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(err(&e)),
    }
}

/// Starts this server's member, its runtime (two threads of its own) and its tasks.
pub fn start(
    state: &Arc<Node>,
    dir: Option<std::path::PathBuf>,
    failure_timeout: Duration,
) -> anyhow::Result<Arc<Meta>> {
    let lock = match &dir {
        Some(d) => Some(lock_dir(d)?),
        None => None,
    };
    let id = node_id(dir.as_deref(), &state.server_id)?;
    let mut config = MetaConfig::new(id, state.server_id.clone());
    config.dir = dir.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ramgrid-meta")
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    let pool = Arc::new(Pool::new(state.token.clone(), state.tls.clone()));
    let node = {
        let (h, pool) = (handle.clone(), pool.clone());
        // On a thread of its own: the caller may itself be inside a runtime (tests).
        std::thread::spawn(move || h.block_on(MetaNode::start_with(config, pool)))
            .join()
            .map_err(|_| anyhow::anyhow!("the metadata node panicked while starting"))?
            .map_err(|e| anyhow::anyhow!("metadata node: {e}"))?
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("ramgrid-meta-rt".into())
        .spawn(move || {
            rt.block_on(async {
                let _ = stop_rx.await;
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    let lease = failure_timeout
        .saturating_sub(Duration::from_secs(1))
        .max(failure_timeout / 2);
    // Restarted from its state directory as a member of a group: what it holds (the catalog's
    // current versions, the spec) may be behind what the group committed while it was down. It
    // serves nothing until it has caught up through the leader, as after a gap longer than the
    // lease (found by the Jepsen switch model: a read of the version current before the restart,
    // ~40 ms after it, before the keeper's first tick).
    let restored = node.restored();
    let meta = Arc::new(Meta {
        node: parking_lot::RwLock::new(node),
        swaps: tokio::sync::watch::Sender::new(0),
        recovering: tokio::sync::Mutex::new(()),
        dir,
        rt: handle.clone(),
        pool,
        server_id: state.server_id.clone(),
        failure_timeout,
        lease,
        base: Instant::now(),
        contact_ms: AtomicU64::new(0),
        member: AtomicBool::new(restored),
        stale: AtomicBool::new(restored),
        seen_failures: Mutex::new(None),
        installer: Mutex::default(),
        settled: AtomicBool::new(true),
        proposals: Default::default(),
        events: Default::default(),
        voters_answering: AtomicU64::new(0),
        stop: Mutex::new(Some(stop_tx)),
        thread: Mutex::new(Some(thread)),
        lock: Mutex::new(lock),
    });
    handle.spawn(watch_task(Arc::downgrade(state), meta.clone()));
    handle.spawn(keeper_task(Arc::downgrade(state), meta.clone()));
    Ok(meta)
}

/// The node id: kept in the Raft directory for its life; without one, new at every start (a
/// server restarted without its Raft state must not vote as the node it was).
fn node_id(dir: Option<&std::path::Path>, addr: &str) -> anyhow::Result<NodeId> {
    let fresh = || {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = format!("{addr}/{}/{nanos}", std::process::id());
        // Never 0 (openraft reserves nothing, but 0 reads as "unset" in status lines).
        xxhash_rust::xxh3::xxh3_64(seed.as_bytes()).max(1)
    };
    let Some(dir) = dir else {
        return Ok(fresh());
    };
    let path = dir.join("node_id");
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{}: not a node id: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = fresh();
            let tmp = dir.join("node_id.tmp");
            std::fs::write(&tmp, format!("{id}\n"))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            Ok(id)
        }
        Err(e) => Err(anyhow::anyhow!("{}: {e}", path.display())),
    }
}

impl Node {
    /// Whether no version switch of `table` the group committed waits here for its version to be
    /// copied in (always outside a group): `checks::check_current_known`.
    pub fn current_known(&self, table: &str) -> bool {
        match self.meta.get() {
            Some(m) if m.in_group() => m.current_installed(table),
            _ => true,
        }
    }

    /// NO_QUORUM while this server is cut off from the metadata group ([`Meta::check_quorum`]).
    pub fn check_quorum(&self) -> Result<(), ErrorReply> {
        match self.meta.get() {
            Some(m) => m.check_quorum(),
            None => Ok(()),
        }
    }
}

impl Meta {
    /// This server's group member now (a clone shares it).
    pub(crate) fn node(&self) -> MetaNode {
        self.node.read().clone()
    }

    /// The spec the group committed, as this node knows it now (from its data directory at a
    /// restart); `None` before it has learned one.
    pub fn committed_spec(&self) -> Option<ClusterSpec> {
        spec_of(&self.node().state())
    }

    /// Stops the tasks and the runtime (in-process servers; a killed process just dies).
    pub fn shutdown(&self) {
        if let Some(tx) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        self.lock.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Refuses with NO_QUORUM while this server is in a group but cut off from it (module
    /// docs, 3). Cheap: two atomics.
    pub fn check_quorum(&self) -> Result<(), ErrorReply> {
        if !self.member.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.contact_age() > self.lease {
            return Err(no_quorum(&format!(
                "no leader with a majority has reached this server for {} ms; {}",
                self.contact_age().as_millis(),
                self.voters_line()
            )));
        }
        if self.stale.load(Ordering::Acquire) {
            return Err(no_quorum(&format!(
                "{} (restarted, or cut off longer than its lease)",
                ramgrid_proto::native::CATCHING_UP
            )));
        }
        Ok(())
    }

    /// "the metadata group's voters are A, B, C (this server); 2 must be reachable": what a
    /// NO_QUORUM refusal names, so that an operator sees which servers are missing.
    fn voters_line(&self) -> String {
        let s = self.node().status();
        let names: Vec<String> = s
            .members
            .iter()
            .filter(|(_, m)| m.voter)
            .map(|(id, m)| {
                if *id == s.id {
                    format!("{} (this server)", m.addr)
                } else {
                    m.addr.clone()
                }
            })
            .collect();
        format!(
            "the metadata group's voters are {}; {} must be reachable",
            names.join(", "),
            names.len() / 2 + 1
        )
    }

    fn contact_age(&self) -> Duration {
        let now = self.base.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.contact_ms.load(Ordering::Acquire)))
    }

    fn touch(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.base).as_millis() as u64;
        self.contact_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Serves one RAFT message from a peer (on the metadata runtime).
    async fn handle_rpc(self: &Arc<Self>, message: Vec<u8>) -> Vec<u8> {
        // A leader reaching us after a gap longer than the lease: what we hold may be behind.
        if self.member.load(Ordering::Acquire) && self.contact_age() > self.lease {
            self.stale.store(true, Ordering::Release);
        }
        let node = self.node();
        match self
            .rt
            .spawn(async move { node.handle_rpc(&message).await })
            .await
        {
            Ok(reply) => reply,
            Err(e) => format!("{{\"Malformed\":\"{e}\"}}").into_bytes(),
        }
    }

    /// Answers what the group decides: RAFT messages, SET_SPEC, and the group's half of
    /// CREATE_TABLE, DROP_TABLE, CREATE_VERSION and SET_CURRENT. `None`: not answered here, the connection handles the request
    /// (a table change the group accepted is then applied locally). `Some(refused)`: answered in
    /// `out`, with the refusal's status if it was one.
    pub async fn answer(
        self: &Arc<Self>,
        state: &Node,
        req: &Request<'_>,
        op: Opcode,
        id: u64,
        out: &mut Vec<u8>,
    ) -> Option<Option<Status>> {
        let refuse = |out: &mut Vec<u8>, e: ErrorReply| {
            let _ = wire::encode_error(out, op, id, &e);
            Some(Some(e.status))
        };
        match req {
            Request::Raft { message } => {
                let reply = self.handle_rpc(message.to_vec()).await;
                let _ = Response::Raft(&reply).encode(out, op, id);
                Some(None)
            }
            Request::Recover { mode, generation } => match self.recover(*mode, *generation).await {
                Ok(text) => {
                    let _ = Response::Status(&text).encode(out, op, id);
                    Some(None)
                }
                Err(e) => refuse(out, e),
            },
            Request::SetSpec { spec } => {
                let r = match ClusterSpec::parse_bytes(spec) {
                    Ok(spec) => self.set_spec(state, spec).await,
                    Err(e) => Err(ErrorReply::new(Status::BadRequest, e.to_string())),
                };
                match r {
                    Ok(epoch) => {
                        let _ = Response::SpecSet { epoch }.encode(out, op, id);
                        Some(None)
                    }
                    Err(e) => refuse(out, e),
                }
            }
            Request::CreateTable(_)
            | Request::DropTable { .. }
            | Request::CreateVersion(_)
            | Request::SetCurrent(_) => match self.catalog(state, req).await {
                Ok(false) => None,
                Ok(true) => {
                    let _ = Response::Done.encode(out, op, id);
                    Some(None)
                }
                Err(e) => refuse(out, e),
            },
            _ => None,
        }
    }

    /// SET_SPEC: a proposal on a member, a plain install outside any group (module docs, 2).
    async fn set_spec(
        self: &Arc<Self>,
        state: &Node,
        spec: ClusterSpec,
    ) -> Result<u64, ErrorReply> {
        if !self.member.load(Ordering::Acquire) && !self.is_member() {
            return state
                .install_spec(spec)
                .map_err(|e| ErrorReply::new(Status::BadRequest, e));
        }
        self.check_quorum()?;
        let epoch = spec.epoch();
        // Decide on the committed state (this node's applied one may lag): a move's coordinator
        // sends the same spec to every server, and only the first may change anything.
        let ms = self.read_committed().await?;
        if let Some(cmd) = command_for(&ms, &spec)? {
            match self.propose(cmd).await? {
                Ok(_) => {}
                Err(MetaError::Refused(r)) => {
                    // Refused because another proposer got there first with the same spec?
                    let now = self.read_committed().await?;
                    if spec_of(&now).map(|s| s.epoch()) != Some(epoch) {
                        return Err(ErrorReply::new(Status::BadRequest, r.to_string()));
                    }
                }
                Err(e @ MetaError::NoQuorum { .. }) => return Err(no_quorum(&e.to_string())),
                Err(e) => return Err(ErrorReply::new(Status::Internal, e.to_string())),
            }
        }
        // Answer once this server runs the committed spec.
        let deadline = Instant::now() + INSTALL_WAIT;
        while state.cluster.read().as_ref().map(|c| c.epoch) != Some(epoch) {
            if Instant::now() > deadline {
                return Err(ErrorReply::new(
                    Status::Internal,
                    "the spec was committed but is not installed here yet",
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(epoch)
    }

    /// Proposes `cmd` on the metadata runtime (the caller's may be a worker's single thread).
    async fn propose(
        &self,
        cmd: MetaCommand,
    ) -> Result<Result<ramgrid_meta::MetaReply, MetaError>, ErrorReply> {
        let node = self.node();
        let r = self
            .rt
            .spawn(async move { node.propose(cmd).await })
            .await
            .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()));
        let outcome = match &r {
            Ok(Ok(_)) => 0,
            Ok(Err(MetaError::Refused(_))) => 1,
            _ => 2,
        };
        self.proposals[outcome].fetch_add(1, Ordering::Relaxed);
        r
    }

    /// The group's figures for the metrics endpoint (docs/metrics.md): (name, kind, help, value).
    pub fn figures(&self) -> Vec<(&'static str, &'static str, &'static str, u64)> {
        let s = self.node().status();
        let ms = self.node().state();
        let (failovers, rejoins, changes) = self.events.counts();
        let member = s.members.contains_key(&s.id);
        let answering = if self.node().is_leader() {
            self.voters_answering.load(Ordering::Relaxed)
        } else {
            0
        };
        let p = |i: usize| self.proposals[i].load(Ordering::Relaxed);
        vec![
            ("ramgrid_meta_member", "gauge", "1 while this server is in the metadata group", member as u64),
            ("ramgrid_meta_leader", "gauge", "1 while this server leads the metadata group", self.node().is_leader() as u64),
            ("ramgrid_meta_quorum", "gauge", "1 while this server is in reach of a leader with a majority (its lease holds)", (member && self.check_quorum().is_ok()) as u64),
            ("ramgrid_meta_term", "gauge", "the Raft term this server knows", s.term),
            ("ramgrid_meta_applied_index", "gauge", "the last Raft log index applied here", s.last_applied),
            ("ramgrid_meta_members", "gauge", "members of the metadata group (voters and learners)", s.members.len() as u64),
            ("ramgrid_meta_voters", "gauge", "voters of the metadata group", s.voters.len() as u64),
            ("ramgrid_meta_voters_answering", "gauge", "on the leader: voters that answered its last status round, itself included (0 elsewhere)", answering),
            ("ramgrid_meta_failures_tolerated", "gauge", "on the leader: how many more voters may fail with the group still deciding (0 elsewhere)", answering.saturating_sub(s.voters.len() as u64 / 2 + 1)),
            ("ramgrid_cluster_servers", "gauge", "servers in the agreed spec", ms.servers.len() as u64),
            ("ramgrid_cluster_servers_failed", "gauge", "servers failed over and not back yet", ms.failed.len() as u64),
            ("ramgrid_cluster_tables", "gauge", "tables in the agreed catalog", ms.tables.len() as u64),
            ("ramgrid_meta_proposals_committed_total", "counter", "proposals made by this server that committed", p(0)),
            ("ramgrid_meta_proposals_refused_total", "counter", "proposals made by this server that the state refused (a lost race, a stale request)", p(1)),
            ("ramgrid_meta_proposals_failed_total", "counter", "proposals made by this server that could not commit (no quorum, timeout)", p(2)),
            ("ramgrid_failovers_total", "counter", "servers this server failed over while leading", failovers),
            ("ramgrid_rejoins_total", "counter", "rejoin moves this server began while leading", rejoins),
            ("ramgrid_meta_membership_changes_total", "counter", "Raft membership changes this server made while leading", changes),
        ]
    }

    /// The group's state with every committed command applied (through the leader).
    async fn read_committed(&self) -> Result<Arc<MetaState>, ErrorReply> {
        let node = self.node();
        match self
            .rt
            .spawn(async move { node.linearizable_state().await })
            .await
        {
            Ok(Ok(ms)) => Ok(ms),
            Ok(Err(e @ MetaError::NoQuorum { .. })) => Err(no_quorum(&e.to_string())),
            Ok(Err(e)) => Err(ErrorReply::new(Status::Internal, e.to_string())),
            Err(e) => Err(ErrorReply::new(Status::Internal, e.to_string())),
        }
    }

    /// Whether `table`'s current version here is the one the group committed (module docs, 4).
    fn current_installed(&self, table: &str) -> bool {
        if self.settled.load(Ordering::Acquire) {
            return true;
        }
        self.installer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .installed(table)
    }

    fn installer_synced(&self) -> bool {
        self.installer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .synced()
    }

    /// Whether this server is in a metadata group (one that fails silent servers over).
    pub fn in_group(&self) -> bool {
        self.member.load(Ordering::Acquire)
    }

    fn is_member(&self) -> bool {
        let s = self.node().status();
        s.members.contains_key(&s.id)
    }

    /// CLUSTER_STATUS lines about the group.
    pub fn status_lines(&self, out: &mut String) {
        use std::fmt::Write;
        let s = self.node().status();
        let ms = self.node().state();
        let _ = writeln!(out, "meta_id {}", s.id);
        let _ = writeln!(out, "meta_members {}", s.members.len());
        match &s.leader {
            Some((id, addr)) => {
                let _ = writeln!(out, "meta_leader {addr} {id}");
            }
            None => {
                let _ = writeln!(out, "meta_leader none");
            }
        }
        let _ = writeln!(out, "meta_term {}", s.term);
        let _ = writeln!(out, "meta_generation {}", ms.generation);
        let _ = writeln!(out, "meta_applied {}", s.last_applied);
        for (id, m) in &s.members {
            let role = if m.voter { "voter" } else { "learner" };
            let _ = writeln!(out, "meta_member {} {id} {role}", m.addr);
        }
        for f in &ms.failed {
            let _ = writeln!(out, "failed {f}");
        }
        let quorum = match self.check_quorum() {
            Ok(()) if self.member.load(Ordering::Acquire) => "ok".to_string(),
            Ok(()) => "no-group".to_string(),
            Err(e) => format!("lost {}", e.message),
        };
        let _ = writeln!(out, "quorum {quorum}");
        let _ = writeln!(
            out,
            "failure_timeout_ms {}",
            self.failure_timeout.as_millis()
        );
        self.events.status_lines(out);
    }
}

fn no_quorum(why: &str) -> ErrorReply {
    ErrorReply::new(Status::NoQuorum, why)
}

/// The spec the state names: its servers, and a move's target as `next`.
pub(crate) fn spec_of(ms: &MetaState) -> Option<ClusterSpec> {
    if ms.servers.is_empty() {
        return None;
    }
    let spec = ClusterSpec::new(ms.servers.clone(), None).ok()?;
    match &ms.transition {
        Some(t) => spec.with_next(t.target.clone()).ok(),
        None => Some(spec),
    }
}

/// The proposal that makes the group's spec `spec`; `None` when it already is.
fn command_for(ms: &MetaState, spec: &ClusterSpec) -> Result<Option<MetaCommand>, ErrorReply> {
    let servers = spec.servers().to_vec();
    let agreed = || {
        let e = spec_of(ms).map_or(0, |s| s.epoch());
        let mut r = ErrorReply::wrong_epoch(e);
        r.message = format!(
            "the cluster agreed on another spec (epoch {e:016x}); servers are added and removed \
             by a move (ramgrid cluster add|remove), not by sending a spec"
        );
        r
    };
    if ms.servers.is_empty() {
        return match spec.next() {
            None => Ok(Some(MetaCommand::SetServers {
                servers,
                expect_epoch: Some(0),
            })),
            // A move before the group has agreed on a first spec: say so, not "another spec".
            Some(_) => {
                let mut r = agreed();
                r.message = "the metadata group has not agreed on a first spec yet (it forms once every \
                             server of the spec answers): retry when `ramgrid cluster status` names a leader"
                    .into();
                Err(r)
            }
        };
    }
    match (spec.next(), &ms.transition) {
        (Some(next), Some(t)) if ms.servers == servers && t.target == next => Ok(None),
        (Some(next), None) if ms.servers == servers => Ok(Some(MetaCommand::BeginTransition {
            target: next.to_vec(),
            by: "SET_SPEC".into(),
        })),
        (None, None) if ms.servers == servers => Ok(None),
        (None, Some(_)) if ms.servers == servers => Ok(Some(MetaCommand::AbortTransition)),
        (None, Some(t)) if t.target == servers => {
            Ok(Some(MetaCommand::CompleteTransition { target: servers }))
        }
        _ => Err(agreed()),
    }
}

/// Installs every committed state's spec here (following the member RECOVER puts in place).
async fn watch_task(state: Weak<Node>, meta: Arc<Meta>) {
    let mut swaps = meta.swaps.subscribe();
    loop {
        swaps.borrow_and_update();
        let mut rx = meta.node().watch();
        loop {
            let ms = rx.borrow_and_update().clone();
            let Some(state) = state.upgrade() else { return };
            tokio::task::block_in_place(|| apply(&state, &meta, &ms));
            drop(state);
            tokio::select! {
                r = rx.changed() => if r.is_err() {
                    // The member stopped: only a replacement brings news again.
                    if swaps.changed().await.is_err() {
                        return;
                    }
                    break;
                },
                r = swaps.changed() => if r.is_err() { return } else { break },
            }
        }
    }
}

/// Installs `ms`'s spec; if this server was failed over since it last looked, it first forgets
/// everything it holds (it may have missed writes) and copies it in again.
fn apply(state: &Node, meta: &Meta, ms: &MetaState) {
    meta.observe_catalog(state, false);
    let Some(spec) = spec_of(ms) else { return };
    let count = ms.failures.get(&meta.server_id).copied().unwrap_or(0);
    let rejoined = {
        let mut seen = meta.seen_failures.lock().unwrap_or_else(|p| p.into_inner());
        let r = seen.is_some_and(|s| count > s);
        *seen = Some(count);
        r
    };
    if rejoined {
        tracing::warn!(
            "{} was failed over while away: copying in everything it holds again",
            meta.server_id
        );
    }
    if let Err(e) = crate::cluster::install_committed(state, spec, rejoined) {
        tracing::error!("cannot install the committed spec: {e}");
    }
}

/// The lease, catching up after a gap, forming a group, and the leader's duties.
async fn keeper_task(state: Weak<Node>, meta: Arc<Meta>) {
    let mut last_tick = Instant::now();
    let mut last_bootstrap = Instant::now();
    let mut leading: Option<leader::Leader> = None;
    let mut swaps = meta.swaps.subscribe();
    loop {
        tokio::time::sleep(TICK).await;
        let Some(state) = state.upgrade() else { return };
        if swaps.has_changed().unwrap_or(false) {
            swaps.borrow_and_update();
            leading = None; // A new member: a leader's view starts again.
        }
        let now = Instant::now();
        let member = meta.is_member();
        if member && now.duration_since(last_tick) > meta.lease {
            // This process did not run for longer than the lease (paused, starved).
            meta.stale.store(true, Ordering::Release);
        }
        last_tick = now;
        if !member {
            meta.member.store(false, Ordering::Release);
            leading = None;
            if now.duration_since(last_bootstrap) >= Duration::from_millis(200) {
                last_bootstrap = now;
                bootstrap(&state, &meta).await;
            }
            continue;
        }
        let status = meta.node().status();
        if status.voters.len() == 1 && status.voters.contains(&status.id) {
            meta.touch(now); // The whole group: its own majority.
        } else if let Some(age) = meta.node().quorum_age() {
            if age < meta.lease {
                meta.touch(now - age);
            }
        }
        if !meta.member.swap(true, Ordering::AcqRel) {
            meta.touch(now); // Just added: the leader reached it to add it.
        }
        if meta.contact_age() > meta.lease {
            meta.stale.store(true, Ordering::Release);
        }
        if meta.stale.load(Ordering::Acquire) && meta.contact_age() <= meta.lease {
            catch_up(&state, &meta).await;
        } else if !meta.installer_synced() {
            sync_installer(&state, &meta).await;
        } else {
            meta.observe_catalog(&state, false); // Versions still being copied in, say.
        }
        if meta.node().is_leader() && !meta.stale.load(Ordering::Acquire) {
            let l = leading.get_or_insert_with(leader::Leader::new);
            l.tick(&state, &meta).await;
        } else {
            leading = None;
        }
    }
}

/// After a gap: read the group's state through the leader, install it, serve again.
async fn catch_up(state: &Node, meta: &Meta) {
    let read = tokio::time::timeout(Duration::from_secs(2), meta.node().linearizable_state()).await;
    if let Ok(Ok(ms)) = read {
        tokio::task::block_in_place(|| {
            meta.observe_catalog(state, true);
            apply(state, meta, &ms)
        });
        meta.stale.store(false, Ordering::Release);
        tracing::info!("{} caught up with the cluster", meta.server_id);
    }
}

/// The first read of the group's state through the leader since this server started: from it
/// on, the installer installs committed switches (`catalog::Installer`).
async fn sync_installer(state: &Node, meta: &Meta) {
    let read = tokio::time::timeout(Duration::from_secs(2), meta.node().linearizable_state()).await;
    if let Ok(Ok(_)) = read {
        tokio::task::block_in_place(|| meta.observe_catalog(state, true));
    }
}

/// Forms a group if this server is the first of its first spec and every other server of it
/// answers and is in none (module docs, 1).
async fn bootstrap(state: &Node, meta: &Meta) {
    let cluster = state.cluster.read().clone();
    let Some(c) = cluster else { return };
    if c.spec.next().is_some() || c.spec.servers().first() != Some(&meta.server_id) {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(500);
    for addr in c.spec.servers().iter().skip(1) {
        let members = match meta.pool.status(addr, deadline).await {
            Ok(lines) => lines
                .iter()
                .find(|(k, _)| k == "meta_members")
                .and_then(|(_, v)| v.parse::<usize>().ok()),
            Err(_) => return, // Not every server is up yet: try again later.
        };
        if members != Some(0) {
            return; // It is in a group (or too old to say): this server must be added to it.
        }
    }
    let me = BTreeMap::from([(meta.node().id(), meta.server_id.clone())]);
    if let Err(e) = meta.node().initialize(me).await {
        tracing::error!("cannot form the metadata group: {e}");
        return;
    }
    let cmd = MetaCommand::SetServers {
        servers: c.spec.servers().to_vec(),
        expect_epoch: Some(0),
    };
    match meta.node().propose(cmd).await {
        Ok(_) => tracing::info!("formed the metadata group with spec epoch {:016x}", c.epoch),
        Err(e) => tracing::info!("formed the metadata group; spec not set: {e}"),
    }
}
