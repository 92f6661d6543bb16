//! A client's PUT or DELETE, taken by the primary of its partitions (`crate::replicate` says
//! why): checked whole before anything is done, ordered by the partitions' order locks, forwarded
//! to the other replicas until each applied it, applied here last, answered per key.
//!
//! A PUT or DELETE with the REPLICA flag is a primary's forward: the handler applies it as any
//! write (data.rs), under the epoch it carries.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use ramgrid_proto::cluster::PartitionMap;
use ramgrid_proto::native::{
    self as wire, ErrorReply, KeyBatch, KeyGroup, Opcode, Put, PutGroup, Request, Status,
};
use ramgrid_store::tables::{KeyStatus as StoreKeyStatus, TableSpec};
use tokio::time::Instant;

use super::checks::check_epoch;
use super::data::{check_mergeable, writable};
use super::handler::Conn;
use crate::node::Node;
use crate::replicate::RETRY_PAUSE;

/// How long a primary outside any metadata group tries a silent replica.
const ALONE_PATIENCE: Duration = Duration::from_secs(1);

/// A client write: a PUT or a DELETE, with its groups.
enum Write<'r, 'a> {
    Put(&'r Put<'a>, Vec<PutGroup<'a>>),
    Delete(&'r KeyBatch<'a>, Vec<KeyGroup<'a>>),
}

impl Write<'_, '_> {
    fn head(&self) -> (&str, u32, u64, u64) {
        match self {
            Write::Put(p, _) => (p.table, p.version, p.epoch, p.incarnation),
            Write::Delete(b, _) => (b.table, b.version, b.epoch, b.incarnation),
        }
    }

    /// Each group's partition and key count, in request order.
    fn groups(&self) -> Vec<(u32, usize)> {
        match self {
            Write::Put(_, g) => g.iter().map(|g| (g.partition, g.keys.len())).collect(),
            Write::Delete(_, g) => g.iter().map(|g| (g.partition, g.keys.len())).collect(),
        }
    }

    /// The forward of groups `which` (indices, ascending) under `epoch`.
    fn encode(
        &self,
        out: &mut Vec<u8>,
        id: u64,
        epoch: u64,
        which: &[usize],
    ) -> Result<(), String> {
        match self {
            Write::Put(p, g) => p.encode_replica(out, id, epoch, which.iter().map(|&i| &g[i])),
            Write::Delete(b, g) => b.encode_replica(out, id, epoch, which.iter().map(|&i| &g[i])),
        }
        .map_err(|e| e.to_string())
    }

    fn apply(&self, conn: &mut Conn, state: &Node) -> Result<(), ErrorReply> {
        match self {
            Write::Put(p, _) => conn.apply_put(state, p),
            Write::Delete(b, _) => conn.apply_delete(state, b),
        }
    }

    /// Whether a backup's `status` for a key means it did what the primary will do.
    fn agrees(&self, status: u8) -> bool {
        status == StoreKeyStatus::Ok as u8
            || (matches!(self, Write::Delete(..)) && status == StoreKeyStatus::NotFound as u8)
    }
}

/// The replicas (addresses) other than this server that a write to each group must reach under
/// the installed spec, or why this server may not order it: it is not the primary of a group's
/// partition (NOT_OWNER, nothing done; at `ack = one`, any replica may), or it holds no spec the
/// write can be checked against.
fn backups(
    state: &Node,
    groups: &[(u32, usize)],
    spec: &TableSpec,
    one: bool,
) -> Result<(u64, Vec<Vec<String>>), ErrorReply> {
    let cluster = state.cluster.read();
    let Some(c) = cluster.as_ref() else {
        // No spec: a lone server, the only copy of everything.
        return Ok((0, vec![Vec::new(); groups.len()]));
    };
    let Some(me) = c.index else {
        return Err(ErrorReply::not_owner(groups.iter().map(|g| g.0).collect()));
    };
    let map = PartitionMap::new(&c.spec, spec.partitions, spec.replication);
    let members = c.spec.members();
    let mut not_primary = Vec::new();
    let mut out = Vec::with_capacity(groups.len());
    for &(p, _) in groups {
        let takes = if one {
            map.write_replicas(p).contains(&me)
        } else {
            map.primary(p) == Some(me)
        };
        if !takes {
            not_primary.push(p);
            out.push(Vec::new());
            continue;
        }
        let others = map
            .write_replicas(p)
            .into_iter()
            .filter(|&s| s != me)
            .filter_map(|s| members.get(s as usize).cloned())
            .collect();
        out.push(others);
    }
    if !not_primary.is_empty() {
        not_primary.sort_unstable();
        not_primary.dedup();
        return Err(ErrorReply {
            message: format!(
                "this server is not the primary of partitions {not_primary:?} under epoch {:016x}: writes go to the first replica",
                c.epoch
            ),
            ..ErrorReply::not_owner(not_primary)
        });
    }
    Ok((c.epoch, out))
}

impl Conn {
    /// Answers a client's PUT or DELETE as the primary of its partitions; the refusal's status,
    /// if it was one.
    pub(super) async fn primary_write(
        &mut self,
        state: &Node,
        op: Opcode,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        one: bool,
    ) -> Option<Status> {
        let w = match req {
            Request::Put(p) => Write::Put(p, p.groups.iter().collect()),
            Request::Delete(b) => Write::Delete(b, b.groups.iter().collect()),
            _ => return self.handle(state, op, id, req, out, state.max_body),
        };
        let e = self
            .try_primary_write(state, op, id, &w, out, one)
            .await
            .err()?;
        let _ = wire::encode_error(out, op, id, &e);
        Some(e.status)
    }

    async fn try_primary_write(
        &mut self,
        state: &Node,
        op: Opcode,
        id: u64,
        w: &Write<'_, '_>,
        out: &mut Vec<u8>,
        one: bool,
    ) -> Result<(), ErrorReply> {
        let (table, version, epoch, incarnation) = w.head();
        let groups = w.groups();
        // Checked whole first: a refusal here did nothing (the client may send it again).
        let (tv, first) = {
            let cluster = state.cluster.read();
            check_epoch(&cluster, epoch, true)?;
            state.check_quorum()?;
            let tv = writable(
                state,
                table,
                version,
                incarnation,
                groups.iter().map(|g| g.0),
            )?;
            if let Write::Put(p, _) = w {
                if p.merge != wire::Merge::Store {
                    check_mergeable(&tv, groups.iter().map(|g| g.0))?;
                }
            }
            drop(cluster);
            (tv.clone(), backups(state, &groups, tv.spec(), one)?)
        };
        if first.1.iter().all(Vec::is_empty) {
            // The only replica: nothing to order against.
            let cluster = state.cluster.read();
            check_epoch(&cluster, epoch, true)?;
            w.apply(self, state)?;
            return self.write_statuses(out, op, id);
        }
        let partitions: Vec<u32> = groups.iter().map(|g| g.0).collect();
        let repl = &state.replication;
        let _order = repl
            .lock(table, tv.spec().incarnation, tv.version(), &partitions)
            .await;
        // Per key, the first refusal a backup answered (it did not apply the key).
        let mut first_key = Vec::with_capacity(groups.len());
        let mut keys = 0usize;
        for g in &groups {
            first_key.push(keys);
            keys += g.1;
        }
        let mut refused: Vec<Option<u8>> = vec![None; keys];
        let mut applied: HashSet<(usize, String)> = HashSet::new();
        let mut trouble: BTreeMap<String, String> = BTreeMap::new();
        // Without a metadata group nothing fails a silent replica over: waiting would not help.
        let in_group = state.meta.get().is_some_and(|m| m.in_group());
        let patience = if in_group {
            repl.patience
        } else {
            ALONE_PATIENCE
        };
        let give_up = Instant::now() + patience;
        let write_id = repl.write_id();
        // The first round goes to the replicas found by the check above.
        let mut plan = Some(first);
        let complete = loop {
            // Who must still apply it, under the spec installed now: a replica failed over since
            // is no longer asked, a replica added since is.
            let found = match plan.take() {
                Some(p) => Ok(p),
                None => backups(state, &groups, tv.spec(), one),
            };
            let (epoch, targets) = match found {
                Ok(t) => t,
                Err(e) => {
                    trouble.insert(String::from("this server"), e.message);
                    break false;
                }
            };
            let mut by_addr: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for (g, addrs) in targets.iter().enumerate() {
                for a in addrs {
                    if !applied.contains(&(g, a.clone())) {
                        by_addr.entry(a.as_str()).or_default().push(g);
                    }
                }
            }
            if by_addr.is_empty() {
                break true;
            }
            if Instant::now() >= give_up {
                break false;
            }
            let calls = by_addr.iter().map(|(addr, which)| {
                let enc = move |o: &mut Vec<u8>, rid: u64| w.encode(o, rid, epoch, which);
                // The same id for every try of the same forward, so the backup applies it once.
                let id = forward_id(write_id, which);
                repl.forward(addr, id, enc)
            });
            let results = join_all(calls.collect()).await;
            let mut failed = false;
            for ((addr, which), r) in by_addr.iter().zip(results) {
                match r {
                    Ok(st) => {
                        let want: usize = which.iter().map(|&g| groups[g].1).sum();
                        if st.len() != want {
                            trouble.insert(
                                addr.to_string(),
                                format!("{} statuses for {want} keys", st.len()),
                            );
                            failed = true;
                            continue;
                        }
                        let mut it = st.into_iter();
                        for &g in which {
                            let span = first_key[g]..first_key[g] + groups[g].1;
                            for slot in &mut refused[span] {
                                let s = it.next().unwrap_or(StoreKeyStatus::Ok as u8);
                                if !w.agrees(s) && slot.is_none() {
                                    *slot = Some(s);
                                }
                            }
                            applied.insert((g, addr.to_string()));
                        }
                        trouble.remove(*addr);
                    }
                    Err(why) => {
                        trouble.insert(addr.to_string(), why);
                        failed = true;
                    }
                }
            }
            if one {
                // At ack = one the replicas that answered are enough: a silent one is not waited
                // for (it may then lack the write until a repair brings it over).
                break true;
            }
            if failed {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        };
        // Applied here last, whatever happened: this server then holds whatever a backup may.
        let local = {
            let _cluster = state.cluster.read();
            w.apply(self, state)
        };
        if !complete || local.is_err() {
            let mut why: Vec<String> = trouble
                .into_iter()
                .map(|(a, e)| format!("{a}: {e}"))
                .collect();
            if let Err(e) = local {
                why.push(format!("this server: {}", e.message));
            }
            tracing::warn!(
                table,
                "a write could not be completed on every replica: {}",
                why.join("; ")
            );
            return Err(ErrorReply::new(
                Status::Indeterminate,
                format!(
                    "the write was ordered but not completed on every replica in {} ms, so it may have been applied at some: {}",
                    patience.as_millis(),
                    why.join("; ")
                ),
            ));
        }
        for (k, r) in refused.into_iter().enumerate() {
            if let (Some(s), Some(mine)) = (r, self.status.get_mut(k)) {
                if *mine == StoreKeyStatus::Ok as u8 {
                    *mine = s;
                }
            }
        }
        self.write_statuses(out, op, id)
    }
}

/// The request id of the forward of groups `which` of write `write_id`: the same for every try of
/// the same groups (a backup applies it once), another for another set of them.
fn forward_id(write_id: u64, which: &[usize]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    which.hash(&mut h);
    write_id ^ (h.finish() << 32)
}

/// Runs `futs` at once and returns their outputs in order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(outs.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
}
