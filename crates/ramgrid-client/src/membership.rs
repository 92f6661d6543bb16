//! Adding and removing servers: the client drives a move (docs/membership.md).
//!
//! 1. Every server of both ends of the move gets the spec with the move in it (`next` lines):
//!    new holders start taking writes for the partitions they gain (clients now write to the
//!    replicas under both ends) and their repair threads copy those partitions from current
//!    holders; old holders keep serving reads.
//! 2. The client waits until every server reports nothing pending (CLUSTER_STATUS).
//! 3. Every server of the new end gets the new spec: the move is complete, leaving copies are
//!    dropped.
//!
//! A server refuses a move while another one is in progress, so two moves never interleave. A
//! move that fails in step 1 is undone (the old spec goes back to the servers that took the new
//! one); one that fails later can be resumed by asking for the same move again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::{Request, Response};

use crate::client::Client;
use crate::conn::Pool;
use crate::error::{Error, Result};

/// One server's answer to CLUSTER_STATUS: its `key value` lines.
pub type ServerStatus = BTreeMap<String, String>;

/// How long a membership step asks again a server that is catching up with the metadata group.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// What a completed move did.
#[derive(Debug, Clone, PartialEq)]
pub struct MoveReport {
    /// The servers before.
    pub from: Vec<String>,
    /// The servers after.
    pub to: Vec<String>,
    /// Partition copies made (one per version and partition).
    pub partitions_copied: u64,
    /// Image bytes copied.
    pub bytes_copied: u64,
    /// Wall time of the whole move.
    pub seconds: f64,
}

/// A server of a move that does not answer for this long ends (and undoes) the move.
pub const DEAD_AFTER: Duration = Duration::from_secs(10);

/// How long a move may wait for its copies by default.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long adding or removing a server waits for a member that does not answer to be failed
/// over (the control plane's failure timeout, 5 s by default, plus an election and its commit).
pub const DOWN_WAIT: Duration = Duration::from_secs(30);
/// How long a move waits for the servers it removed to stop being voters of the metadata group.
const VOTER_WAIT: Duration = Duration::from_secs(10);

impl Client {
    pub(crate) fn pool_for(&self, addr: &str) -> Arc<Pool> {
        self.inner
            .pools
            .lock()
            .entry(addr.to_owned())
            .or_insert_with(|| Arc::new(Pool::new(addr.to_owned())))
            .clone()
    }

    /// CLUSTER_STATUS of one server.
    pub fn server_status(&self, addr: &str) -> Result<ServerStatus> {
        let pool = self.pool_for(addr);
        let mut out = ServerStatus::new();
        self.request(&pool, &Request::ClusterStatus, |r| match r {
            Response::Status(text) => {
                for line in text.lines() {
                    if let Some((k, v)) = line.split_once(' ') {
                        // Repeated keys (one `repairing` line per version) are joined.
                        out.entry(k.to_owned())
                            .and_modify(|e: &mut String| {
                                e.push_str("; ");
                                e.push_str(v);
                            })
                            .or_insert_with(|| v.to_owned());
                    }
                }
                Ok(())
            }
            other => Err(Error::Protocol {
                server: addr.to_owned(),
                message: format!("unexpected reply to CLUSTER_STATUS: {other:?}"),
            }),
        })?;
        Ok(out)
    }

    /// `Some((server, its refusal, the failure timeout))` when every live server of the spec says
    /// it is cut off from a majority of the metadata group (CLUSTER_STATUS `quorum lost ...`);
    /// `None` when any is in reach of a leader, outside a group, or none answered.
    pub(crate) fn quorum_lost(&self) -> Option<(String, String, Duration)> {
        let topo = self.topology();
        let mut lost = None;
        for pool in topo.pools.iter().filter(|p| !p.is_down()) {
            let Ok(status) = self.server_status(&pool.addr) else {
                continue;
            };
            let quorum = status
                .get("quorum")
                .map(String::as_str)
                .unwrap_or("no-group");
            // In reach of a leader, or outside a group: a fail-over may still come.
            let why = quorum.strip_prefix("lost ")?;
            let timeout = status
                .get("failure_timeout_ms")
                .and_then(|t| t.parse().ok())
                .map_or(Duration::from_secs(5), Duration::from_millis);
            lost.get_or_insert((pool.addr.clone(), why.to_owned(), timeout));
        }
        lost
    }

    /// METRICS of one server: its Prometheus text exposition (server-wide and per-table figures).
    pub fn server_metrics(&self, addr: &str) -> Result<String> {
        let pool = self.pool_for(addr);
        let mut out = String::new();
        self.request(&pool, &Request::Metrics, |r| match r {
            Response::Metrics(text) => {
                out = text.to_owned();
                Ok(())
            }
            other => Err(Error::Protocol {
                server: addr.to_owned(),
                message: format!("unexpected reply to METRICS: {other:?}"),
            }),
        })?;
        Ok(out)
    }

    /// METRICS of every server of the spec, in spec order.
    pub fn metrics(&self) -> Vec<(String, Result<String>)> {
        self.spec()
            .servers()
            .iter()
            .map(|a| (a.clone(), self.server_metrics(a)))
            .collect()
    }

    /// CLUSTER_STATUS of every server of the spec (both ends of a move in progress), in order.
    pub fn cluster_status(&self) -> Vec<(String, Result<ServerStatus>)> {
        let _ = self.refresh_spec();
        self.spec()
            .members()
            .into_iter()
            .map(|a| {
                let s = self.server_status(&a);
                (a, s)
            })
            .collect()
    }

    /// SET_SPEC on one server. A server catching up with the metadata group (a moment after its
    /// restart) is asked again for up to [`CATCH_UP_WAIT`]: it is not refusing the spec.
    fn set_spec_on(&self, addr: &str, spec: &ClusterSpec) -> Result<()> {
        let text = spec.to_text();
        let deadline = Instant::now() + CATCH_UP_WAIT;
        let mut pause = Duration::from_millis(25);
        loop {
            let mut catching_up = false;
            self.request(
                &self.pool_for(addr),
                &Request::SetSpec {
                    spec: text.as_bytes(),
                },
                |r| match r {
                    Response::SpecSet { .. } => Ok(()),
                    Response::Error(e)
                        if e.message.starts_with(ramgrid_proto::native::CATCHING_UP)
                            && Instant::now() + pause < deadline =>
                    {
                        catching_up = true;
                        Ok(())
                    }
                    other => Err(Error::Protocol {
                        server: addr.to_owned(),
                        message: format!("unexpected reply to SET_SPEC: {other:?}"),
                    }),
                },
            )?;
            if !catching_up {
                return Ok(());
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(400));
        }
    }

    /// Adds the server at `addr` (running, empty) and moves to it the partitions it gets.
    /// While a member is down and not yet failed over, waits for the fail-over (at most
    /// [`DOWN_WAIT`]) and moves from the spec without it.
    pub fn add_server(&self, addr: &str) -> Result<MoveReport> {
        self.move_while_down(|spec| {
            let mut to = spec.next().unwrap_or(spec.servers()).to_vec();
            if to.iter().any(|s| s == addr) {
                return Err(Error::InvalidArgument(format!(
                    "{addr} is already a member"
                )));
            }
            to.push(addr.to_owned());
            Ok(to)
        })
    }

    /// Replaces the server at `dead` with the running, empty server at `new` in one move: `new`
    /// takes `dead`'s place in the spec and its partitions. A `dead` that does not answer is first
    /// failed over by the control plane (waited for, as in [`Client::add_server`]); once it is out
    /// of the spec, `new` is added. Retiring a live server this way moves its partitions to `new`.
    pub fn replace_server(&self, dead: &str, new: &str) -> Result<MoveReport> {
        if dead == new {
            return Err(Error::InvalidArgument(format!(
                "{new} cannot replace itself"
            )));
        }
        self.move_while_down(|spec| {
            let mut to = spec.next().unwrap_or(spec.servers()).to_vec();
            if to.iter().any(|s| s == new) {
                return Err(Error::InvalidArgument(format!("{new} is already a member")));
            }
            match to.iter().position(|s| s == dead) {
                Some(i) => to[i] = new.to_owned(),
                None => to.push(new.to_owned()),
            }
            Ok(to)
        })
    }

    /// A move to `target(spec now)`, asked again with a fresh spec while it fails because a
    /// member does not answer: the control plane fails such a member over within its failure
    /// timeout, and the next spec no longer names it. Gives up after [`DOWN_WAIT`].
    fn move_while_down(
        &self,
        target: impl Fn(&ClusterSpec) -> Result<Vec<String>>,
    ) -> Result<MoveReport> {
        let started = Instant::now();
        loop {
            let _ = self.refresh_spec();
            let spec = self.spec();
            let to = target(&spec)?;
            // Nothing is begun while a member is silent: a move half begun on the others would
            // have to be undone through the group, and the fail-over takes the member out anyway.
            let silent: Vec<String> = spec
                .members()
                .into_iter()
                .filter(|a| matches!(self.server_status(a), Err(e) if e.is_transport()))
                .collect();
            if !silent.is_empty() {
                if started.elapsed() >= DOWN_WAIT {
                    return Err(Error::MoveFailed {
                        member_down: true,
                        message: format!(
                            "{} did not answer and was not failed over within {DOWN_WAIT:?}; \
                             nothing moved",
                            silent.join(", ")
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
            match self.move_to(to, MOVE_TIMEOUT) {
                Err(Error::MoveFailed {
                    member_down: true,
                    message,
                }) if started.elapsed() < DOWN_WAIT => {
                    let _ = message; // the member named is being failed over: ask again
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(Error::MoveFailed {
                    member_down: true,
                    message,
                }) => {
                    return Err(Error::MoveFailed {
                        member_down: true,
                        message: format!(
                            "{message} (waited {DOWN_WAIT:?} for it to be failed over)"
                        ),
                    })
                }
                other => return other,
            }
        }
    }

    /// Moves every partition off the server at `addr`, then drops it from the spec (it can be
    /// stopped afterwards).
    pub fn remove_server(&self, addr: &str) -> Result<MoveReport> {
        self.move_while_down(|spec| {
            let from = spec.next().unwrap_or(spec.servers()).to_vec();
            if !from.iter().any(|s| s == addr) {
                return Err(Error::InvalidArgument(format!("{addr} is not a member")));
            }
            let to: Vec<String> = from.into_iter().filter(|s| s != addr).collect();
            if to.is_empty() {
                return Err(Error::InvalidArgument(
                    "cannot remove the last server".into(),
                ));
            }
            Ok(to)
        })
    }

    /// Moves the cluster to the servers `to` (in that order): copies first, then the switch
    /// (module docs). Waits at most `timeout` for the copies.
    pub fn move_to(&self, to: Vec<String>, timeout: Duration) -> Result<MoveReport> {
        let started = Instant::now();
        self.refresh_spec()?;
        let spec = self.spec();
        let target = ClusterSpec::new(to.clone(), None)
            .map_err(|e| Error::InvalidArgument(format!("bad server list: {e}")))?;
        if spec.next().is_none() && spec.servers() == to.as_slice() {
            return Ok(MoveReport {
                from: to.clone(),
                to,
                partitions_copied: 0,
                bytes_copied: 0,
                seconds: 0.0,
            });
        }
        if let Some(next) = spec.next() {
            if next != to.as_slice() {
                return Err(Error::InvalidArgument(format!(
                    "a move to [{}] is in progress: finish it (ask for the same move) first",
                    next.join(", ")
                )));
            }
        }
        let from = spec.servers().to_vec();
        let moving = ClusterSpec::new(from.clone(), None)
            .and_then(|s| s.with_next(to.clone()))
            .map_err(|e| Error::InvalidArgument(format!("bad server list: {e}")))?;
        let members = moving.members();
        let copied = |statuses: &[(String, ServerStatus)], key: &str| -> u64 {
            statuses
                .iter()
                .filter_map(|(_, s)| s.get(key)?.parse::<u64>().ok())
                .sum()
        };
        let before: Vec<(String, ServerStatus)> = members
            .iter()
            .filter_map(|a| Some((a.clone(), self.server_status(a).ok()?)))
            .collect();
        // 1. The move, to every server of both ends; undone if any refuses. Servers joining
        //    get it first and learn the tables before any client learns of the move (an old
        //    holder's WRONG_EPOCH tells them), so the first writes routed to them find the tables.
        let joining: Vec<String> = members
            .iter()
            .filter(|a| !from.contains(a))
            .cloned()
            .collect();
        let mut order = joining.clone();
        order.extend(members.iter().filter(|a| from.contains(a)).cloned());
        let mut took = Vec::new();
        for a in &order {
            if took.len() == joining.len() {
                self.wait_for(&joining, &moving, false, started + timeout)?;
            }
            match self.set_spec_on(a, &moving) {
                Ok(()) => took.push(a.clone()),
                Err(e) => {
                    if spec.next().is_none() {
                        for b in &took {
                            let _ = self.set_spec_on(b, &spec);
                        }
                    }
                    return Err(Error::MoveFailed {
                        member_down: e.is_transport(),
                        message: format!("{a} refused the move, nothing moved: {e}"),
                    });
                }
            }
        }
        self.adopt_spec(moving.clone());
        // 2. Wait for every copy. A move that cannot finish is undone: until it is, every write
        //    to a moving partition needs the unreachable server.
        if let Err(e) = self.wait_for(&members, &moving, true, started + timeout) {
            if let Ok(back) = ClusterSpec::new(from.clone(), None) {
                for b in &members {
                    let _ = self.set_spec_on(b, &back);
                }
            }
            let _ = self.refresh_spec();
            return Err(Error::MoveFailed {
                member_down: false,
                message: format!(
                    "the move to [{}] could not finish and was undone: {e}",
                    to.join(", ")
                ),
            });
        }
        // 3. The switch, to every server of the new end.
        let statuses_after: Vec<(String, ServerStatus)> = members
            .iter()
            .filter_map(|a| Some((a.clone(), self.server_status(a).ok()?)))
            .collect();
        for a in &to {
            self.set_spec_on(a, &target)?;
        }
        self.adopt_spec(target);
        // 4. Servers that left are usually stopped right after: first let the metadata group's
        // leader take them out of its voters, so that two removals in a row never stop two of
        // its three voters.
        let left: Vec<&String> = from.iter().filter(|a| !to.contains(a)).collect();
        if !left.is_empty() {
            self.wait_not_voters(&to, &left, Instant::now() + VOTER_WAIT);
        }
        Ok(MoveReport {
            from,
            to,
            partitions_copied: copied(&statuses_after, "copied_partitions")
                .saturating_sub(copied(&before, "copied_partitions")),
            bytes_copied: copied(&statuses_after, "copied_bytes")
                .saturating_sub(copied(&before, "copied_bytes")),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Waits (at most until `deadline`, then goes on) until no server of `servers` lists any of
    /// `left` as a voter of the metadata group (CLUSTER_STATUS `meta_member` lines).
    fn wait_not_voters(&self, servers: &[String], left: &[&String], deadline: Instant) {
        loop {
            let Some(status) = servers.iter().find_map(|a| self.server_status(a).ok()) else {
                return;
            };
            let members = status.get("meta_member").cloned().unwrap_or_default();
            let voting = members.split("; ").any(|m| {
                let mut parts = m.split(' ');
                let addr = parts.next().unwrap_or("");
                m.ends_with(" voter") && left.iter().any(|l| l.as_str() == addr)
            });
            if !voting || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every server of `servers` runs `spec` and has learned the tables (and, with
    /// `copied`, has nothing pending).
    fn wait_for(
        &self,
        servers: &[String],
        spec: &ClusterSpec,
        copied: bool,
        deadline: Instant,
    ) -> Result<()> {
        let epoch = format!("{:016x}", spec.epoch());
        let mut unreachable_since: BTreeMap<&str, Instant> = BTreeMap::new();
        loop {
            let mut waiting = Vec::new();
            for a in servers {
                let status = self.server_status(a);
                match &status {
                    Ok(_) => {
                        unreachable_since.remove(a.as_str());
                    }
                    Err(e) => {
                        let since = *unreachable_since.entry(a).or_insert_with(Instant::now);
                        if since.elapsed() > DEAD_AFTER {
                            return Err(Error::MoveFailed {
                                member_down: true,
                                message: format!("{a} unreachable for {DEAD_AFTER:?}: {e}"),
                            });
                        }
                    }
                }
                match status {
                    Ok(s) => {
                        let get = |k: &str| s.get(k).map(String::as_str);
                        let ready = get("epoch") == Some(epoch.as_str())
                            && get("catalog_learned") == Some("1")
                            && (!copied || get("pending_partitions") == Some("0"));
                        if !ready {
                            waiting.push(format!(
                                "{a}: {} partitions pending{}",
                                get("pending_partitions").unwrap_or("?"),
                                get("last_error")
                                    .map(|e| format!(" (last error: {e})"))
                                    .unwrap_or_default()
                            ));
                        }
                    }
                    Err(e) => waiting.push(format!("{a}: {e}")),
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    server: waiting.join("; "),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
