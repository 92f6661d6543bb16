//! A member of the metadata group: its Raft instance, storage, RPC entry point and API.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Raft, SnapshotPolicy};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::MetaError;
use crate::log::LogStore;
use crate::network::{
    encode, serve_tcp, Envelope, NetworkFactory, Received, Rpc, RpcReply, TcpTransport, Transport,
    TransportError, Write,
};
use crate::sm::StateMachineStore;
use crate::state::{Member, MetaCommand, MetaReply, MetaState, NodeId};
use crate::TypeConfig;

/// How a node is set up. [`MetaConfig::new`] gives the defaults the crate doc explains.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// This node's id; stable for the life of its directory.
    pub node_id: NodeId,
    /// The address peers reach this node at. [`MetaNode::start`] listens on it; a port of 0
    /// picks a free one (read it back with [`MetaNode::addr`]).
    pub addr: String,
    /// Where the log, vote and snapshot are kept; `None` keeps them in memory only.
    pub dir: Option<PathBuf>,
    /// The leader's heartbeat interval.
    pub heartbeat_ms: u64,
    /// A follower that has heard no leader for a random time in `min..max` stands for election.
    pub election_timeout_min_ms: u64,
    /// See `election_timeout_min_ms`.
    pub election_timeout_max_ms: u64,
    /// How long `propose` and the other writes wait for a leader with a quorum (and for the
    /// commit) before giving up with `NoQuorum` (or `Indeterminate`).
    pub propose_timeout_ms: u64,
    /// A snapshot is taken after this many entries since the last one...
    pub snapshot_every: u64,
    /// ... and the log is purged up to it, except this many entries (so a follower a little
    /// behind catches up from the log rather than from a snapshot).
    pub keep_logs: u64,
}

impl MetaConfig {
    /// A configuration with the default timings: heartbeat 100 ms, election timeout
    /// 600..1200 ms, propose timeout 5 s, a snapshot every 1000 entries keeping 100.
    pub fn new(node_id: NodeId, addr: impl Into<String>) -> MetaConfig {
        MetaConfig {
            node_id,
            addr: addr.into(),
            dir: None,
            heartbeat_ms: 100,
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 1200,
            propose_timeout_ms: 5000,
            snapshot_every: 1000,
            keep_logs: 100,
        }
    }

    fn raft_config(&self) -> Result<openraft::Config, MetaError> {
        let c = openraft::Config {
            cluster_name: "ramgrid-meta".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            // A snapshot chunk sent as JSON on a busy machine takes more than the 200 ms default.
            install_snapshot_timeout: (self.election_timeout_max_ms * 2).max(1000),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.keep_logs,
            // Purge as soon as a snapshot allows; the log file is rewritten per purge anyway.
            purge_batch_size: 1,
            ..Default::default()
        };
        c.validate()
            .map_err(|e| MetaError::Network(format!("bad Raft configuration: {e}")))
    }
}

/// Where the group stands, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaStatus {
    /// This node.
    pub id: NodeId,
    /// The leader this node knows of, with its address.
    pub leader: Option<(NodeId, String)>,
    /// The current Raft term.
    pub term: u64,
    /// The index of the last entry applied here (0 before any).
    pub last_applied: u64,
    /// Every member (voters and learners) with its address.
    pub members: BTreeMap<NodeId, Member>,
    /// The voters.
    pub voters: BTreeSet<NodeId>,
}

/// A running member of the metadata group. Clones share the node.
#[derive(Clone)]
pub struct MetaNode {
    inner: Arc<Inner>,
}

struct Inner {
    id: NodeId,
    addr: String,
    raft: Raft<TypeConfig>,
    sm: StateMachineStore,
    log: LogStore,
    transport: Arc<dyn Transport>,
    propose_timeout: Duration,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When a leader's AppendEntries (a heartbeat or entries) last reached this node.
    heard_leader: Mutex<Option<Instant>>,
    /// Whether it started from a Raft state of its own (`restored`).
    restored: bool,
}

/// How long to wait before asking again for a leader (one is being elected, or a forwarded
/// write found the leader gone).
const RETRY: Duration = Duration::from_millis(50);

impl MetaNode {
    /// Start a node that listens on `config.addr` with its own TCP listener and reaches its
    /// peers with [`TcpTransport`].
    pub async fn start(mut config: MetaConfig) -> Result<MetaNode, MetaError> {
        let listener = tokio::net::TcpListener::bind(&config.addr)
            .await
            .map_err(|e| MetaError::Network(format!("listening on {}: {e}", config.addr)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| MetaError::Network(format!("listening on {}: {e}", config.addr)))?;
        config.addr = bound.to_string();
        let node = MetaNode::start_with(config, Arc::new(TcpTransport)).await?;
        let n = node.clone();
        let task = serve_tcp(listener, move |req| {
            let n = n.clone();
            async move { n.handle_rpc(&req).await }
        });
        *node
            .inner
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(node)
    }

    /// Start a node without a listener: the embedding server delivers requests to
    /// [`MetaNode::handle_rpc`] and carries this node's requests with `transport`.
    pub async fn start_with(
        config: MetaConfig,
        transport: Arc<dyn Transport>,
    ) -> Result<MetaNode, MetaError> {
        let raft_config = Arc::new(config.raft_config()?);
        let (log, sm) = match &config.dir {
            Some(dir) => (
                LogStore::open(dir).map_err(MetaError::Storage)?,
                StateMachineStore::open(Some(dir)).map_err(MetaError::Storage)?,
            ),
            None => (
                LogStore::in_memory(),
                StateMachineStore::open(None).map_err(MetaError::Storage)?,
            ),
        };
        let restored = log.holds_state();
        let network = NetworkFactory {
            me: config.node_id,
            transport: transport.clone(),
        };
        let raft = Raft::new(
            config.node_id,
            raft_config,
            network,
            log.clone(),
            sm.clone(),
        )
        .await
        .map_err(|e| MetaError::Storage(e.to_string()))?;
        Ok(MetaNode {
            inner: Arc::new(Inner {
                id: config.node_id,
                addr: config.addr,
                raft,
                sm,
                log,
                transport,
                propose_timeout: Duration::from_millis(config.propose_timeout_ms),
                listener: Mutex::new(None),
                heard_leader: Mutex::new(None),
                restored,
            }),
        })
    }

    /// Whether this node started from a Raft state of its own (its directory held a vote or a
    /// log): it was in a group before, which may have decided more while it was down.
    pub fn restored(&self) -> bool {
        self.inner.restored
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// The address peers reach this node at.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Form a new group of `members` (id -> address), all voters. Call it on one node, once;
    /// on a node that already has a log or a vote (a restarted durable node, or one called
    /// twice) it does nothing and succeeds.
    pub async fn initialize(&self, members: BTreeMap<NodeId, String>) -> Result<(), MetaError> {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .into_iter()
            .map(|(id, a)| (id, BasicNode::new(a)))
            .collect();
        match self.inner.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(RaftError::APIError(e)) => Err(MetaError::Membership(e.to_string())),
            Err(RaftError::Fatal(f)) => Err(MetaError::Shutdown(f.to_string())),
        }
    }

    /// Add `id` at `addr` as a learner: it receives the log (or a snapshot) but does not vote.
    /// Returns once the change is committed, not once the learner has caught up.
    pub async fn add_learner(&self, id: NodeId, addr: impl Into<String>) -> Result<(), MetaError> {
        let w = Write::AddLearner {
            id,
            addr: addr.into(),
        };
        self.write(w).await.map(|_| ())
    }

    /// Make exactly `voters` the voting members (each already a member); voters left out
    /// stay as learners. Raft moves through joint consensus, so no two majorities can decide.
    pub async fn change_membership(
        &self,
        voters: impl IntoIterator<Item = NodeId>,
    ) -> Result<(), MetaError> {
        let w = Write::ChangeMembership {
            voters: voters.into_iter().collect(),
        };
        self.write(w).await.map(|_| ())
    }

    /// Remove learners (members that do not vote) from the group: nodes that are gone for
    /// good, such as a server's previous incarnation. Refused for a voter.
    pub async fn remove_learners(
        &self,
        ids: impl IntoIterator<Item = NodeId>,
    ) -> Result<(), MetaError> {
        let w = Write::RemoveLearners {
            ids: ids.into_iter().collect(),
        };
        self.write(w).await.map(|_| ())
    }

    /// Propose `cmd` from any node: the leader appends it, a follower forwards it to the
    /// leader. `Ok` and `Err(Refused)` mean it committed (and was applied, or refused with the
    /// state unchanged); `Err(NoQuorum)` that no leader with a majority took it within the
    /// timeout, so it never will be applied; `Err(Indeterminate)` that it was appended but its
    /// commit was not seen in time.
    pub async fn propose(&self, cmd: MetaCommand) -> Result<MetaReply, MetaError> {
        self.write(Write::Command(cmd)).await
    }

    /// The state applied on this node: local, immediate, possibly behind the leader.
    pub fn state(&self) -> Arc<MetaState> {
        self.inner.sm.state()
    }

    /// The state with every write committed before the call applied (Raft's read index: the
    /// leader confirms it still leads with a heartbeat round, and this node waits until it has
    /// applied up to the leader's commit index). Fails with `NoQuorum` like `propose`.
    pub async fn linearizable_state(&self) -> Result<Arc<MetaState>, MetaError> {
        let start = Instant::now();
        let deadline = start + self.inner.propose_timeout;
        loop {
            match self.leader() {
                Some((id, _)) if id == self.inner.id => match self.read_index(deadline).await {
                    Ok(index) => {
                        self.wait_applied(index, deadline).await?;
                        return Ok(self.state());
                    }
                    Err(MetaError::NotLeader | MetaError::NoQuorum { .. }) => {}
                    Err(e) => return Err(e),
                },
                Some((_, addr)) => {
                    let timeout = leader_share(deadline);
                    let rpc = Rpc::ReadIndex {
                        timeout_ms: millis(timeout),
                    };
                    match self.call(&addr, &rpc, deadline).await {
                        Ok(RpcReply::ReadIndex(Ok(index))) => {
                            self.wait_applied(index, deadline).await?;
                            return Ok(self.state());
                        }
                        Ok(RpcReply::ReadIndex(Err(
                            MetaError::NotLeader | MetaError::NoQuorum { .. },
                        )))
                        | Err(_) => {}
                        Ok(RpcReply::ReadIndex(Err(e))) => return Err(e),
                        Ok(_) => {
                            return Err(MetaError::Network(format!("{addr}: unexpected reply")))
                        }
                    }
                }
                None => {}
            }
            if !pause(deadline).await {
                return Err(no_quorum(start));
            }
        }
    }

    /// A receiver that sees every newly applied state.
    pub fn watch(&self) -> watch::Receiver<Arc<MetaState>> {
        self.inner.sm.subscribe()
    }

    /// Where the group stands, as this node sees it.
    pub fn status(&self) -> MetaStatus {
        let m = self.inner.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| {
                let member = Member {
                    addr: n.addr.clone(),
                    voter: voters.contains(id),
                };
                (*id, member)
            })
            .collect::<BTreeMap<_, _>>();
        let leader = m
            .current_leader
            .and_then(|id| members.get(&id).map(|mm| (id, mm.addr.clone())));
        MetaStatus {
            id: self.inner.id,
            leader,
            term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            members,
            voters,
        }
    }

    /// How long since this node last knew that a leader held a majority: for the leader, since
    /// a majority last acknowledged it; for a follower, since the leader last reached it.
    /// `None` when it never knew one (a node not yet in a group, or cut off since it started).
    pub fn quorum_age(&self) -> Option<Duration> {
        let m = self.inner.raft.metrics().borrow().clone();
        if m.current_leader == Some(self.inner.id) {
            return m.millis_since_quorum_ack.map(Duration::from_millis);
        }
        let heard = *self
            .inner
            .heard_leader
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        heard.map(|t| t.elapsed())
    }

    /// Whether this node is the leader (as far as it knows).
    pub fn is_leader(&self) -> bool {
        self.inner.raft.metrics().borrow().current_leader == Some(self.inner.id)
    }

    /// The number of log entries this node holds (they are purged after snapshots).
    pub fn log_len(&self) -> usize {
        self.inner.log.len()
    }

    /// Take a snapshot now (and purge the log behind it, keeping `keep_logs` entries).
    pub async fn snapshot_now(&self) -> Result<(), MetaError> {
        self.inner
            .raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| MetaError::Shutdown(e.to_string()))
    }

    /// Stop the node: its listener (and every connection it accepted) and its Raft task. To its
    /// peers it is then a dead node.
    pub async fn shutdown(&self) {
        let listener = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = listener {
            task.abort();
            let _ = task.await;
        }
        let _ = self.inner.raft.shutdown().await;
    }

    /// Serve one request from a peer: the receiving end of [`Transport::call`]. Never fails:
    /// errors are encoded in the reply.
    pub async fn handle_rpc(&self, request: &[u8]) -> Vec<u8> {
        let rpc: Rpc = match serde_json::from_slice::<Received>(request) {
            Ok(Received { to: Some(to), .. }) if to != self.inner.id => {
                return encode(&RpcReply::Malformed(format!(
                    "meant for node {to}, this is node {}",
                    self.inner.id
                )))
            }
            Ok(r) => r.rpc,
            Err(e) => return encode(&RpcReply::Malformed(e.to_string())),
        };
        let raft = &self.inner.raft;
        let reply = match rpc {
            // A leader never sends to itself: such a request comes from another process started
            // with this node's id (a configuration error), and openraft must not take it for
            // its own leadership.
            Rpc::AppendEntries(r) if r.vote.leader_id().voted_for() == Some(self.inner.id) => {
                RpcReply::Malformed(format!(
                    "a request from another node with id {}",
                    self.inner.id
                ))
            }
            Rpc::Vote(r) if r.vote.leader_id().voted_for() == Some(self.inner.id) => {
                RpcReply::Malformed(format!(
                    "a request from another node with id {}",
                    self.inner.id
                ))
            }
            Rpc::AppendEntries(r) => {
                let reply = raft.append_entries(r).await;
                if reply.is_ok() {
                    *self
                        .inner
                        .heard_leader
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                }
                RpcReply::AppendEntries(reply)
            }
            Rpc::Vote(r) => RpcReply::Vote(raft.vote(r).await),
            Rpc::InstallSnapshot(r) => RpcReply::InstallSnapshot(raft.install_snapshot(r).await),
            Rpc::Forward { write, timeout_ms } => {
                let deadline = Instant::now() + Duration::from_millis(timeout_ms);
                RpcReply::Forward(self.lead(write, deadline).await)
            }
            Rpc::ReadIndex { timeout_ms } => {
                let deadline = Instant::now() + Duration::from_millis(timeout_ms);
                RpcReply::ReadIndex(self.read_index(deadline).await)
            }
        };
        encode(&reply)
    }

    /// The leader as this node knows it.
    fn leader(&self) -> Option<(NodeId, String)> {
        self.status().leader
    }

    /// Do `w` through the leader, wherever it is, within the propose timeout.
    async fn write(&self, w: Write) -> Result<MetaReply, MetaError> {
        let start = Instant::now();
        let deadline = start + self.inner.propose_timeout;
        loop {
            match self.leader() {
                Some((id, _)) if id == self.inner.id => {
                    match self.lead(w.clone(), deadline).await {
                        // Not appended: try again (a new leader, or the quorum back) until the deadline.
                        Err(MetaError::NotLeader | MetaError::NoQuorum { .. }) => {}
                        other => return other,
                    }
                }
                Some((_, addr)) => {
                    let rpc = Rpc::Forward {
                        write: w.clone(),
                        timeout_ms: millis(leader_share(deadline)),
                    };
                    match self.call(&addr, &rpc, deadline).await {
                        Ok(RpcReply::Forward(Err(
                            MetaError::NotLeader | MetaError::NoQuorum { .. },
                        ))) => {}
                        Ok(RpcReply::Forward(r)) => return r,
                        Ok(_) => {
                            return Err(MetaError::Network(format!("{addr}: unexpected reply")))
                        }
                        // Never delivered: safe to try again.
                        Err(TransportError::Unreachable { .. }) => {}
                        // Maybe delivered: the leader may have appended it.
                        Err(e) => {
                            return Err(MetaError::Indeterminate {
                                reason: format!("forwarded to the leader: {e}"),
                            })
                        }
                    }
                }
                None => {}
            }
            if !pause(deadline).await {
                return Err(no_quorum(start));
            }
        }
    }

    /// Do `w` as the leader, before `deadline`. First a heartbeat round confirms that this node
    /// still leads a quorum: a leader cut off from its majority never appends (it answers
    /// `NoQuorum`), so a write refused for want of a quorum cannot commit later when the
    /// majority comes back.
    async fn lead(&self, w: Write, deadline: Instant) -> Result<MetaReply, MetaError> {
        self.read_index(deadline).await?;
        let raft = &self.inner.raft;
        let res = match w {
            Write::Command(cmd) => {
                match tokio::time::timeout_at(deadline, raft.client_write(cmd)).await {
                    Ok(Ok(resp)) => Ok(Ok(resp.data)),
                    Ok(Err(e)) => Ok(Err(write_error(e))),
                    Err(elapsed) => Err(elapsed),
                }
            }
            Write::AddLearner { id, addr } => {
                let node = BasicNode::new(addr);
                match tokio::time::timeout_at(deadline, raft.add_learner(id, node, false)).await {
                    Ok(Ok(_)) => Ok(Ok(Ok(MetaReply::Done))),
                    Ok(Err(e)) => Ok(Err(write_error(e))),
                    Err(elapsed) => Err(elapsed),
                }
            }
            Write::ChangeMembership { voters } => {
                match tokio::time::timeout_at(deadline, raft.change_membership(voters, true)).await
                {
                    Ok(Ok(_)) => Ok(Ok(Ok(MetaReply::Done))),
                    Ok(Err(e)) => Ok(Err(write_error(e))),
                    Err(elapsed) => Err(elapsed),
                }
            }
            Write::RemoveLearners { ids } => {
                let change = openraft::ChangeMembers::RemoveNodes(ids);
                match tokio::time::timeout_at(deadline, raft.change_membership(change, false)).await
                {
                    Ok(Ok(_)) => Ok(Ok(Ok(MetaReply::Done))),
                    Ok(Err(e)) => Ok(Err(write_error(e))),
                    Err(elapsed) => Err(elapsed),
                }
            }
        };
        match res {
            Err(_) => Err(MetaError::Indeterminate {
                reason: "appended by the leader, commit not seen within the timeout".into(),
            }),
            Ok(Ok(applied)) => applied.map_err(MetaError::Refused),
            Ok(Err(e)) => Err(e),
        }
    }

    /// As the leader: confirm leadership with a quorum and return the commit index to read at.
    async fn read_index(&self, deadline: Instant) -> Result<u64, MetaError> {
        loop {
            match tokio::time::timeout_at(deadline, self.inner.raft.get_read_log_id()).await {
                Err(_) => return Err(MetaError::NoQuorum { waited_ms: 0 }),
                Ok(Ok((read, _applied))) => return Ok(read.map_or(0, |l| l.index)),
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {
                    return Err(MetaError::NotLeader)
                }
                // Each round gives a peer one heartbeat interval to answer; on a busy machine a
                // live peer can miss it, so ask again until the deadline.
                Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                    if !pause(deadline).await {
                        return Err(MetaError::NoQuorum { waited_ms: 0 });
                    }
                }
                Ok(Err(RaftError::Fatal(f))) => return Err(MetaError::Shutdown(f.to_string())),
            }
        }
    }

    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), MetaError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.inner
            .raft
            .wait(Some(left))
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|e| MetaError::Indeterminate {
                reason: format!("waiting to apply up to {index}: {e}"),
            })
    }

    async fn call(
        &self,
        addr: &str,
        rpc: &Rpc,
        deadline: Instant,
    ) -> Result<RpcReply, TransportError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let envelope = Envelope { to: None, rpc };
        let bytes = self
            .inner
            .transport
            .call(addr, encode(&envelope), left)
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| TransportError::Io {
            addr: addr.to_owned(),
            reason: format!("undecodable reply: {e}"),
        })
    }
}

/// What a failed write through openraft means here.
fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> MetaError {
    match e {
        // Either refused before appending, or the entry was cut from the log by a new leader's
        // conflicting one: either way it is not, and will not be, committed.
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => MetaError::NotLeader,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MetaError::Membership(e.to_string())
        }
        RaftError::Fatal(f) => MetaError::Shutdown(f.to_string()),
    }
}

/// The time a forwarded request gives the leader: what is left, less a margin for the reply to
/// come back before the forwarding node's own deadline.
fn leader_share(deadline: Instant) -> Duration {
    let left = deadline.saturating_duration_since(Instant::now());
    left.saturating_sub((left / 5).min(Duration::from_millis(250)))
}

/// Sleep before the next try; false when the deadline leaves no time for one.
async fn pause(deadline: Instant) -> bool {
    let now = Instant::now();
    if now + RETRY >= deadline {
        return false;
    }
    tokio::time::sleep(RETRY).await;
    true
}

fn no_quorum(start: Instant) -> MetaError {
    MetaError::NoQuorum {
        waited_ms: millis(start.elapsed()),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
