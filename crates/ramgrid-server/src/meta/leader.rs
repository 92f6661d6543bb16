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
//! server that has answered for [`REJOIN_AFTER`] rejoins: back in the spec, it copies in
//! everything it holds before serving it. No fail-over or rejoin during a move (the move is
//! finished or undone by its coordinator first), and never of the last server.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use ramgrid_meta::{MetaCommand, NodeId};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Meta;
use crate::native::NativeState;

/// How often every server is probed.
const PING_EVERY: Duration = Duration::from_millis(250);
/// How long a probe (CLUSTER_STATUS) may take.
const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a failed server must answer before it rejoins.
const REJOIN_AFTER: Duration = Duration::from_secs(1);
/// Voters kept in the group when enough servers are live.
const VOTERS: usize = 3;

/// What the leader did, for CLUSTER_STATUS.
#[derive(Default)]
pub struct Events {
    inner: Mutex<EventsInner>,
}

#[derive(Default)]
struct EventsInner {
    failovers: u64,
    rejoins: u64,
    membership_changes: u64,
    last: String,
}

impl Events {
    fn note(&self, f: impl FnOnce(&mut EventsInner), what: String) {
        let mut e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut e);
        eprintln!("ramgrid-server: {what}");
        e.last = what;
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
}

impl Leader {
    pub fn new(_meta: &Meta) -> Leader {
        Leader {
            since: Instant::now(),
            last_ping: None,
            last_ok: HashMap::new(),
            ok_since: HashMap::new(),
            ids: HashMap::new(),
        }
    }

    pub async fn tick(&mut self, state: &NativeState, meta: &Meta) {
        let now = Instant::now();
        if self
            .last_ping
            .is_some_and(|t| now.duration_since(t) < PING_EVERY)
        {
            return;
        }
        self.last_ping = Some(now);
        let ms = meta.node.state();
        if ms.servers.is_empty() {
            // Formed, but the first spec was not committed (its proposal timed out): again.
            let spec = state.cluster.read().as_ref().map(|c| c.spec.clone());
            if let Some(spec) = spec.filter(|s| s.next().is_none()) {
                let cmd = MetaCommand::SetServers {
                    servers: spec.servers().to_vec(),
                    expect_epoch: Some(0),
                };
                let _ = meta.node.propose(cmd).await;
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

        // Fail over a server of the spec that stopped answering (one per tick).
        if ms.transition.is_none() {
            let dead = ms.servers.iter().find(|a| {
                **a != meta.server_id
                    && now.duration_since(self.last_answer(a)) > meta.failure_timeout
            });
            if let Some(addr) = dead {
                let silent = now.duration_since(self.last_answer(addr));
                let cmd = MetaCommand::FailOver { addr: addr.clone() };
                match meta.node.propose(cmd).await {
                    Ok(_) => meta.events.note(
                        |e| e.failovers += 1,
                        format!(
                            "failed over {addr}: no answer for {} ms; its partitions are \
                             re-replicated from the survivors",
                            silent.as_millis()
                        ),
                    ),
                    Err(e) => eprintln!("ramgrid-server: fail-over of {addr} not done: {e}"),
                }
                return;
            }
            let back = ms.failed.iter().find(|a| {
                self.ok_since
                    .get(*a)
                    .is_some_and(|t| now.duration_since(*t) >= REJOIN_AFTER)
            });
            if let Some(addr) = back {
                let cmd = MetaCommand::Rejoin { addr: addr.clone() };
                match meta.node.propose(cmd).await {
                    Ok(_) => meta.events.note(
                        |e| e.rejoins += 1,
                        format!("{addr} answers again: it rejoins and copies in what it holds"),
                    ),
                    Err(e) => eprintln!("ramgrid-server: rejoin of {addr} not done: {e}"),
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
                let id = pool.status(&addr, deadline).await.map(|lines| {
                    lines
                        .iter()
                        .find(|(k, _)| k == "meta_id")
                        .and_then(|(_, v)| v.parse::<NodeId>().ok())
                });
                (addr, id)
            });
        }
        let now = Instant::now();
        while let Some(r) = set.join_next().await {
            let Ok((addr, id)) = r else { continue };
            match id {
                Ok(id) => {
                    self.last_ok.insert(addr.clone(), now);
                    self.ok_since.entry(addr.clone()).or_insert(now);
                    match id {
                        Some(id) => self.ids.insert(addr, id),
                        None => self.ids.remove(&addr),
                    };
                }
                Err(_) => {
                    self.ok_since.remove(&addr);
                }
            }
        }
    }

    /// Adds servers the group lacks as learners, and keeps up to [`VOTERS`] live voters.
    async fn reconcile_members(
        &mut self,
        meta: &Meta,
        watched: &BTreeSet<String>,
        servers: &[String],
    ) {
        let status = meta.node.status();
        for addr in watched {
            let Some(&id) = self.ids.get(addr) else {
                continue;
            };
            if !status.members.contains_key(&id) {
                match meta.node.add_learner(id, addr.clone()).await {
                    Ok(()) => meta.events.note(
                        |e| e.membership_changes += 1,
                        format!("added {addr} (node {id}) to the metadata group as a learner"),
                    ),
                    Err(e) => {
                        eprintln!("ramgrid-server: cannot add {addr} as a learner: {e}");
                        return;
                    }
                }
            }
        }
        let status = meta.node.status();
        // Members that are no server's current node: a previous incarnation at an address that
        // now answers under another id, or an address no longer watched. Learners among them are
        // removed (voters are first replaced below, then removed on a later tick).
        let stale: BTreeSet<NodeId> = status
            .members
            .iter()
            .filter(|(id, m)| {
                !status.voters.contains(id)
                    && match self.ids.get(&m.addr) {
                        Some(current) => current != *id,
                        None => !watched.contains(&m.addr),
                    }
            })
            .map(|(id, _)| *id)
            .collect();
        if !stale.is_empty() {
            match meta.node.remove_learners(stale.clone()).await {
                Ok(()) => meta.events.note(
                    |e| e.membership_changes += 1,
                    format!("removed stale metadata group members {stale:?}"),
                ),
                Err(e) => eprintln!("ramgrid-server: cannot remove stale members: {e}"),
            }
            return;
        }
        let now = Instant::now();
        let live = |id: &NodeId| {
            status.members.get(id).is_some_and(|m| {
                self.ids.get(&m.addr) == Some(id)
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
        match meta.node.change_membership(voters.clone()).await {
            Ok(()) => meta.events.note(
                |e| e.membership_changes += 1,
                format!("metadata group voters are now {voters:?}"),
            ),
            Err(e) => eprintln!("ramgrid-server: cannot change the voters: {e}"),
        }
    }
}
