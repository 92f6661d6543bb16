//! What the group's leader does besides Raft: watch every server, fail over one that stops
//! answering, put it back when it answers again, and keep the group's membership on the
//! servers of the spec (learners added, up to three live voters).
//!
//! **Failure detection.** The leader asks every server of the spec (and the failed ones, and a
//! move's target) for its status every [`PING_EVERY`], each request bounded by [`PING_TIMEOUT`];
//! the answer also names the server's node id, so a server restarted on its address without
//! its Raft state is seen as the new node it is (added, and its old id dropped). A server of the
//! spec that has not answered for `failure_timeout` (counted from the later of its last answer
//! and the moment this node became leader) is failed over: `FailOver` takes it out of the spec,
//! its partitions get other replicas, and those copy them in from the survivors (the repair
//! thread). So a failure is acted on within `failure_timeout + PING_EVERY` of the last answer,
//! plus an election (about 2.6 s at most) when the leader is the one that failed. A failed
//! server that has answered for [`REJOIN_AFTER`] rejoins through a move the leader runs itself
//! (the spec with it as `next`; it copies in everything it will hold, the others keep serving;
//! completed once every server runs the moving spec with nothing left to copy), begun only when
//! no server has anything pending: a plain spec change would let servers release partitions the
//! new holders have not copied yet. A move (the leader's or a client's) whose server stops
//! answering for `failure_timeout` is undone, so that the fail-over can run. Never a fail-over of
//! the last server.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use ramgrid_meta::{MetaCommand, NodeId};
use ramgrid_proto::native::{RecoverMode, Request};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Meta;
use crate::node::Node;

/// How often every server is probed.
const PING_EVERY: Duration = Duration::from_millis(250);
/// How long a probe (CLUSTER_STATUS) may take.
const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a failed server must answer before it rejoins.
const REJOIN_AFTER: Duration = Duration::from_secs(1);
/// How a rejoin the leader began names itself in the transition.
const REJOIN: &str = "rejoin of ";
/// How long a server sent RECOVER may take to replace its member.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// Voters kept in the group when enough servers are live.
const VOTERS: usize = 3;

/// What the leader did, for CLUSTER_STATUS.
#[derive(Default)]
pub struct Events {
    inner: Mutex<EventsInner>,
}

#[derive(Default)]
pub(super) struct EventsInner {
    failovers: u64,
    rejoins: u64,
    pub(super) membership_changes: u64,
    last: String,
}

impl Events {
    pub(super) fn note(&self, f: impl FnOnce(&mut EventsInner), what: String) {
        let mut e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut e);
        tracing::info!("{what}");
        e.last = what;
    }

    /// (fail-overs, rejoins, membership changes) this node proposed as leader.
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        let e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (e.failovers, e.rejoins, e.membership_changes)
    }

    pub(super) fn status_lines(&self, out: &mut String) {
        use std::fmt::Write;
        let e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "failovers {}", e.failovers);
        let _ = writeln!(out, "rejoins {}", e.rejoins);
        let _ = writeln!(out, "membership_changes {}", e.membership_changes);
        if !e.last.is_empty() {
            let _ = writeln!(out, "last_meta_event {}", e.last);
        }
    }
}

/// The leader's view of the servers, from the moment it became leader.
pub struct Leader {
    since: Instant,
    last_ping: Option<Instant>,
    /// When each server last answered.
    last_ok: HashMap<String, Instant>,
    /// Since when each server has answered without a miss.
    ok_since: HashMap<String, Instant>,
    /// Each server's node id, as it reports it.
    ids: HashMap<String, NodeId>,
    /// Each server's epoch and partitions still to copy in, from its last answer.
    epochs: HashMap<String, u64>,
    pending: HashMap<String, u64>,
    /// Each server's group generation, for those in some group (`recover.rs`).
    generations: HashMap<String, u64>,
}

impl Leader {
    pub fn new() -> Leader {
        Leader {
            since: Instant::now(),
            last_ping: None,
            last_ok: HashMap::new(),
            ok_since: HashMap::new(),
            ids: HashMap::new(),
            epochs: HashMap::new(),
            pending: HashMap::new(),
            generations: HashMap::new(),
        }
    }

    pub async fn tick(&mut self, state: &Node, meta: &Meta) {
        let now = Instant::now();
        if self
            .last_ping
            .is_some_and(|t| now.duration_since(t) < PING_EVERY)
        {
            return;
        }
        self.last_ping = Some(now);
        let ms = meta.node().state();
        if ms.servers.is_empty() {
            // Formed, but the first spec was not committed (its proposal timed out): again.
            let spec = state.cluster.read().as_ref().map(|c| c.spec.clone());
            if let Some(spec) = spec.filter(|s| s.next().is_none()) {
                let cmd = MetaCommand::SetServers {
                    servers: spec.servers().to_vec(),
                    expect_epoch: Some(0),
                };
                let _ = meta.node().propose(cmd).await;
            }
            return;
        }
        let mut watched: BTreeSet<String> = ms.servers.iter().cloned().collect();
        watched.extend(ms.failed.iter().cloned());
        if let Some(t) = &ms.transition {
            watched.extend(t.target.iter().cloned());
        }
        self.probe(meta, &watched).await;
        let now = Instant::now();
        let status = meta.node().status();
        let answering = status
            .voters
            .iter()
            .filter(|id| {
                **id == status.id
                    || status.members.get(id).is_some_and(|m| {
                        self.last_ok
                            .get(&m.addr)
                            .is_some_and(|t| now.duration_since(*t) <= PING_EVERY * 4)
                    })
            })
            .count();
        meta.voters_answering
            .store(answering as u64, Ordering::Relaxed);

        if let Some(t) = &ms.transition {
            // A move whose server stopped answering cannot finish: undo it (a client coordinating
            // it sees its completion refused, and undoes its side), so the fail-over can run.
            let members: BTreeSet<&String> = ms.servers.iter().chain(&t.target).collect();
            let dead = members.iter().find(|a| {
                ***a != meta.server_id
                    && now.duration_since(self.last_answer(a)) > meta.failure_timeout
            });
            if let Some(addr) = dead {
                match meta.node().propose(MetaCommand::AbortTransition).await {
                    Ok(_) => meta.events.note(
                        |_| {},
                        format!("undid the move to {:?}: {addr} stopped answering", t.target),
                    ),
                    Err(e) => tracing::error!("cannot undo the move: {e}"),
                }
                return;
            }
            // A rejoin this leader began: complete it once every server runs the moving spec and
            // has nothing left to copy in.
            if t.started_by.starts_with(REJOIN) {
                let moving = super::spec_of(&ms).map(|s| s.epoch());
                let done = members.iter().all(|a| {
                    self.epochs.get(*a).copied() == moving && self.pending.get(*a) == Some(&0)
                });
                if done {
                    let cmd = MetaCommand::CompleteTransition {
                        target: t.target.clone(),
                    };
                    match meta.node().propose(cmd).await {
                        Ok(_) => meta.events.note(
                            |e| e.rejoins += 1,
                            format!("{} rejoined: {:?}", t.started_by, t.target),
                        ),
                        Err(e) => tracing::error!("cannot complete the rejoin: {e}"),
                    }
                    return;
                }
            }
        } else {
            // Fail over a server of the spec that stopped answering (one per tick).
            let dead = ms.servers.iter().find(|a| {
                **a != meta.server_id
                    && now.duration_since(self.last_answer(a)) > meta.failure_timeout
            });
            if let Some(addr) = dead {
                let silent = now.duration_since(self.last_answer(addr));
                let cmd = MetaCommand::FailOver { addr: addr.clone() };
                match meta.node().propose(cmd).await {
                    Ok(_) => meta.events.note(
                        |e| e.failovers += 1,
                        format!(
                            "failed over {addr}: no answer for {} ms; its partitions are \
                             re-replicated from the survivors",
                            silent.as_millis()
                        ),
                    ),
                    Err(e) => tracing::warn!("fail-over of {addr} not done: {e}"),
                }
                return;
            }
            // A failed server that answers again rejoins as a move (copies first, then the new
            // spec), once nothing is being copied anywhere: a plain spec change would release
            // partitions on servers that the new holders have not copied yet.
            let settled = ms.servers.iter().all(|a| self.pending.get(a) == Some(&0));
            let back = ms.failed.iter().find(|a| {
                self.ok_since
                    .get(*a)
                    .is_some_and(|t| now.duration_since(*t) >= REJOIN_AFTER)
            });
            if let (Some(addr), true) = (back, settled) {
                let mut target = ms.servers.clone();
                target.push(addr.clone());
                let cmd = MetaCommand::BeginTransition {
                    target,
                    by: format!("{REJOIN}{addr}"),
                };
                match meta.node().propose(cmd).await {
                    Ok(_) => meta.events.note(
                        |_| {},
                        format!("{addr} answers again: it rejoins, copying in what it will hold"),
                    ),
                    Err(e) => tracing::warn!("rejoin of {addr} not begun: {e}"),
                }
                return;
            }
        }
        self.reconcile_members(meta, &watched, &ms.servers).await;
    }

    fn last_answer(&self, addr: &str) -> Instant {
        match self.last_ok.get(addr) {
            Some(t) if *t > self.since => *t,
            _ => self.since,
        }
    }

    /// Asks every watched server for its status (liveness, and its node id: a server restarted
    /// on its address without its Raft state is a new node).
    async fn probe(&mut self, meta: &Meta, watched: &BTreeSet<String>) {
        let mut set = JoinSet::new();
        for addr in watched {
            let pool = meta.pool.clone();
            let addr = addr.clone();
            set.spawn(async move {
                let deadline = Instant::now() + PING_TIMEOUT;
                let lines = pool.status(&addr, deadline).await;
                (addr, lines)
            });
        }
        let now = Instant::now();
        while let Some(r) = set.join_next().await {
            let Ok((addr, lines)) = r else { continue };
            let Ok(lines) = lines else {
                self.ok_since.remove(&addr);
                self.pending.remove(&addr);
                continue;
            };
            let field = |k: &str| {
                lines
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.as_str())
            };
            self.last_ok.insert(addr.clone(), now);
            self.ok_since.entry(addr.clone()).or_insert(now);
            match field("epoch").and_then(|v| u64::from_str_radix(v, 16).ok()) {
                Some(e) => self.epochs.insert(addr.clone(), e),
                None => self.epochs.remove(&addr),
            };
            match field("pending_partitions").and_then(|v| v.parse().ok()) {
                Some(p) => self.pending.insert(addr.clone(), p),
                None => self.pending.remove(&addr),
            };
            let in_group = field("meta_members").is_some_and(|m| m != "0");
            match field("meta_generation").and_then(|v| v.parse().ok()) {
                Some(g) if in_group => self.generations.insert(addr.clone(), g),
                _ => self.generations.remove(&addr),
            };
            match field("meta_id").and_then(|v| v.parse::<NodeId>().ok()) {
                Some(id) => self.ids.insert(addr, id),
                None => self.ids.remove(&addr),
            };
        }
    }

    /// Adds servers the group lacks as learners, and keeps up to [`VOTERS`] live voters.
    async fn reconcile_members(
        &mut self,
        meta: &Meta,
        watched: &BTreeSet<String>,
        servers: &[String],
    ) {
        let status = meta.node().status();
        for addr in watched {
            let Some(&id) = self.ids.get(addr) else {
                continue;
            };
            if !status.members.contains_key(&id) {
                let ours = meta.node().state().generation;
                if self.generations.get(addr).is_some_and(|g| *g < ours) {
                    // Back from a group given up by `cluster recover`: it leaves that one and
                    // comes back as a fresh node, which is added on a later tick.
                    let req = Request::Recover {
                        mode: RecoverMode::Join,
                        generation: ours,
                    };
                    let deadline = Instant::now() + RECOVER_TIMEOUT;
                    let r = meta
                        .pool
                        .call(addr, &req, deadline, |r| match r {
                            ramgrid_proto::native::Response::Status(_) => Ok(()),
                            other => Err(format!("RECOVER answered {other:?}")),
                        })
                        .await;
                    match r {
                        Ok(()) => meta.events.note(
                            |_| {},
                            format!(
                                "{addr} came back in the metadata group given up at generation                                  {ours}: it joins this one"
                            ),
                        ),
                        Err(e) => tracing::warn!("{addr} did not leave its old group: {e}"),
                    }
                    continue;
                }
                match meta.node().add_learner(id, addr.clone()).await {
                    Ok(()) => meta.events.note(
                        |e| e.membership_changes += 1,
                        format!("added {addr} (node {id}) to the metadata group as a learner"),
                    ),
                    Err(e) => {
                        tracing::error!("cannot add {addr} as a learner: {e}");
                        return;
                    }
                }
            }
        }
        let status = meta.node().status();
        // Members that are no server's current node: a previous incarnation at an address that
        // now answers under another id, or an address no longer watched. Learners among them are
        // removed (voters are first replaced below, then removed on a later tick).
        let stale: BTreeSet<NodeId> = status
            .members
            .iter()
            .filter(|(id, m)| {
                !status.voters.contains(id)
                    && (!watched.contains(&m.addr)
                        || self.ids.get(&m.addr).is_some_and(|c| c != *id))
            })
            .map(|(id, _)| *id)
            .collect();
        if !stale.is_empty() {
            match meta.node().remove_learners(stale.clone()).await {
                Ok(()) => meta.events.note(
                    |e| e.membership_changes += 1,
                    format!("removed stale metadata group members {stale:?}"),
                ),
                Err(e) => tracing::error!("cannot remove stale members: {e}"),
            }
            return;
        }
        let now = Instant::now();
        // A voter must be a server of the cluster (the spec, a move's target, or failed over and
        // expected back) that answers as this node: a server a move removed is replaced at once,
        // not after the failure timeout, since it is usually stopped right after (two removals
        // in a row must not take two of three voters).
        let live = |id: &NodeId| {
            status.members.get(id).is_some_and(|m| {
                self.ids.get(&m.addr) == Some(id)
                    && watched.contains(&m.addr)
                    && now.duration_since(self.last_answer(&m.addr)) <= meta.failure_timeout
            })
        };
        let mut voters: BTreeSet<NodeId> =
            status.voters.iter().copied().filter(|v| live(v)).collect();
        let want = VOTERS.min(
            servers
                .iter()
                .filter(|a| self.ids.get(*a).is_some_and(&live))
                .count()
                .max(1),
        );
        for addr in servers {
            if voters.len() >= want {
                break;
            }
            if let Some(&id) = self.ids.get(addr) {
                if live(&id) && status.members.contains_key(&id) {
                    voters.insert(id);
                }
            }
        }
        if voters.is_empty() || voters == status.voters || voters.len() < want.min(2) {
            return;
        }
        match meta.node().change_membership(voters.clone()).await {
            Ok(()) => meta.events.note(
                |e| e.membership_changes += 1,
                format!("metadata group voters are now {voters:?}"),
            ),
            Err(e) => tracing::error!("cannot change the voters: {e}"),
        }
    }
}
