//! Pipelined reads: many GET batches in flight at once on one connection per server.
//!
//! A [`Pipeline`] takes batches ([`Pipeline::submit`]) and hands back their results in the order
//! they were submitted ([`Pipeline::next_result`]). Submitting a batch groups its keys by partition,
//! picks a replica for each partition by the read rule (`round.rs`, `Client::read_pick`) and
//! queues one GET frame per server on that server's *lane*: one connection the pipeline keeps for
//! its life, on which any number of frames may wait for their replies. Queued frames are written
//! together when the caller waits for a reply (`CORK`). The caller
//! decides how many batches are in flight (it calls `next` when it has enough); a thread issuing
//! small batches is then bound by the servers' throughput, not by one round trip per batch.
//!
//! Invariants relied on:
//! 1. A server answers the frames of one connection in the order they came (protocol-native.md
//!    §3), and batches are finished in submission order, so the reply at the head of a lane
//!    always belongs to the oldest batch with a frame on it. Each reply's request id is checked
//!    against the frame's ([`Conn::recv_next`]); a reply that does not match breaks the lane.
//! 2. A batch takes its values only from whole replies to its own frames. A batch that cannot be
//!    answered that way (a lane broke before its reply was read, a server refused, the servers
//!    resolved different current versions, its frame would be too large, the near cache applies,
//!    or its input is bad) is *redone*: read again whole through [`Client::get_into_of`], which
//!    applies the retry rule (`exchange.rs`), fails over to the replicas, refreshes a stale spec
//!    and reports errors exactly as an unpipelined call does. Reads are idempotent, so reading a
//!    batch again changes nothing; batches already handed back are never touched again.
//! 3. A broken lane (an I/O error, a timeout, a reply that is not the one expected) is dropped
//!    with every frame still waiting on it, never pooled; the next batch for that server opens a
//!    new lane. Lanes are told apart by a serial number, so a waiting frame of a dropped lane is
//!    never matched against a new lane's replies (whose request ids start again).
//!
//! Not done here: hedging (a slow server delays the batches behind it; the timeout still bounds
//! each reply), the near cache (batches it would serve go through `get_into_of`) and versions
//! mapped from this host (such a batch is read in place through `get_into_of` in its turn, and
//! only its partitions not mapped here go over TCP, unpipelined).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use ramgrid_proto::native::{KeyBatchWriter, Opcode, Response, MAX_KEY_LEN};

use crate::client::{Client, GetResult, Handled, TableMeta};
use crate::conn::{Conn, Pool};
use crate::deadline;
use crate::error::Result;
use crate::keys::OwnedKeys;
use crate::plan::Groups;
use crate::read::scatter_reply;
use crate::values::Values;

/// One server's connection and the frames waiting for a reply on it, oldest first.
struct Lane {
    serial: u64,
    pool: Arc<Pool>,
    conn: Conn,
    waiting: VecDeque<u64>,
    /// Frames encoded and not yet written (see [`CORK`]).
    out: Vec<u8>,
    /// The earliest deadline of the frames in `out`.
    out_deadline: Option<Instant>,
}

/// Frames for a lane are held until the caller waits for a reply ([`Pipeline::next_result`]) or this
/// many bytes are pending, then written together: the server then reads several frames at once
/// and answers them with one write, which is most of what pipelining saves it.
const CORK: usize = 64 * 1024;

/// One frame of a batch: where it went and what it asked.
struct Frame {
    lane: u64,
    id: u64,
    deadline: Instant,
    /// The frame's partitions, in frame order (its reply answers their keys in this order).
    parts: Vec<u32>,
}

/// One submitted batch.
struct Batch {
    table: String,
    incarnation: u64,
    version: u32,
    keys: OwnedKeys,
    /// Whether the batch may be read from shared memory (`false`: TCP only, as
    /// [`crate::shm::tcp_only`] reads).
    shm: bool,
    /// Whether the batch's version is mapped from this host: it is read in place in its turn
    /// (partitions not mapped here go over TCP in the same call), not sent.
    local: bool,
    /// Set when the batch was sent: what its frames need to be read back.
    sent: Option<Sent>,
}

struct Sent {
    meta: TableMeta,
    /// The batch positions sent (keys the wire can carry), grouped by partition below.
    idx: Vec<u32>,
    by_part: Groups,
    frames: Vec<Frame>,
    /// Every frame of the batch was written (else it is redone once they are read back).
    complete: bool,
}

/// Several GET batches in flight; see the module. Results come back in submission order.
pub struct Pipeline {
    client: Client,
    lanes: Vec<Lane>,
    next_serial: u64,
    batches: VecDeque<Batch>,
    /// Batches redone through the unpipelined path (for tests and benchmarks).
    redone: u64,
}

impl Client {
    /// A pipeline of GET batches on this client's servers (see [`Pipeline`]).
    pub fn pipeline(&self) -> Pipeline {
        Pipeline {
            client: self.clone(),
            lanes: Vec::new(),
            next_serial: 1,
            batches: VecDeque::new(),
            redone: 0,
        }
    }
}

impl Pipeline {
    /// Sends one batch: `keys` of `table` at `version` (0 = current) of `incarnation` (0 =
    /// whichever exists), as [`Client::get_into_of`] reads them. Never fails: a batch that cannot
    /// be sent now is read by [`Pipeline::next_result`] through the unpipelined path, which reports its
    /// error (bad input included) in its turn.
    pub fn submit(&mut self, table: &str, keys: OwnedKeys, version: u32, incarnation: u64) {
        self.submit_with(table, keys, version, incarnation, true);
    }

    /// [`Pipeline::submit`], saying whether the batch may be read from shared memory. A batch of
    /// a pinned version this process maps from a server on this host (shm.rs) is not sent: it is
    /// read in place in its turn, as `get_into_of` reads. With `shared_memory` false it is read
    /// over TCP even where the version is mapped.
    pub fn submit_with(
        &mut self,
        table: &str,
        keys: OwnedKeys,
        version: u32,
        incarnation: u64,
        shared_memory: bool,
    ) {
        let mut batch = Batch {
            table: table.to_string(),
            incarnation,
            version,
            keys,
            shm: shared_memory,
            local: false,
            sent: None,
        };
        batch.local = shared_memory && self.client.shm_maps(table, incarnation, version);
        if !batch.local {
            batch.sent = self.send(&batch);
        }
        self.batches.push_back(batch);
    }

    /// Batches submitted and not yet handed back.
    pub fn in_flight(&self) -> usize {
        self.batches.len()
    }

    /// Batches that were read again through the unpipelined path (see the module).
    pub fn redone(&self) -> u64 {
        self.redone
    }

    /// The result of the oldest batch not yet handed back (`None` when there is none); also the
    /// pipeline's `Iterator::next`.
    pub fn next_result(&mut self) -> Option<Result<GetResult>> {
        let batch = self.batches.pop_front()?;
        self.write_all_out();
        let got = match &batch.sent {
            Some(sent) => self.collect(&batch, sent),
            None => None,
        };
        Some(match got {
            Some(result) => Ok(result),
            None if batch.local => self.redo(&batch),
            None if !batch.shm => {
                self.redone += 1;
                crate::shm::tcp_only(|| self.redo(&batch))
            }
            None => {
                self.redone += 1;
                self.redo(&batch)
            }
        })
    }

    /// Groups, routes and writes the batch's frames; `None` if it must be redone instead.
    fn send(&mut self, batch: &Batch) -> Option<Sent> {
        let client = self.client.clone();
        let keys = batch.keys.keys();
        keys.validate().ok()?;
        if batch.version != 0 && client.inner.near.is_some() {
            return None;
        }
        let meta = client.table_meta(&batch.table).ok()?;
        if batch.incarnation != 0 && batch.incarnation != meta.incarnation {
            return None;
        }
        // A key too long for the wire cannot have been stored: it stays a miss, unsent.
        let idx: Vec<u32> = (0..keys.len() as u32)
            .filter(|&i| keys.key(i as usize).len() <= MAX_KEY_LEN)
            .collect();
        let width = meta.value_type.width().unwrap_or(16);
        let body: usize = idx
            .iter()
            .map(|&i| 2 + keys.key(i as usize).len() + width)
            .sum();
        if body + 1024 > client.max_body() {
            return None; // the unpipelined path splits it into chunks
        }
        let topo = client.topology();
        let map = topo.map(&meta);
        let by_part = Groups::by_target(map.partitions() as usize, 0..idx.len() as u32, |j| {
            Some(map.partition_of(&keys.key(idx[j as usize] as usize)) as usize)
        });
        let pick = client.read_pick(&batch.table, batch.version);
        // Each partition's server, chosen once (health may change while we group).
        let mut assign = vec![usize::MAX; map.partitions() as usize];
        for p in by_part.busy() {
            let reps = map.replicas(p as u32);
            let first = pick.first(p as u32, reps);
            let order = || reps[first..].iter().chain(&reps[..first]);
            assign[p] = order()
                .find(|&&s| !topo.pools[s as usize].health.avoid_for_reads())
                .or_else(|| order().next())
                .map_or(usize::MAX, |&s| s as usize);
        }
        let busy: Vec<u32> = by_part.busy().map(|p| p as u32).collect();
        let per_server = Groups::by_target(topo.pools.len(), busy.iter().copied(), |p| {
            Some(assign[p as usize]).filter(|&s| s != usize::MAX)
        });
        let mut sent = Sent {
            meta,
            idx,
            by_part,
            frames: Vec::new(),
            complete: true,
        };
        for s in per_server.busy() {
            let Some((serial, id, deadline)) =
                self.send_frame(&topo.pools[s], batch, &sent, per_server.row(s), map.epoch())
            else {
                // The frames already queued are still read back (the lanes stay in step); the
                // batch is redone.
                sent.complete = false;
                break;
            };
            sent.frames.push(Frame {
                lane: serial,
                id,
                deadline,
                parts: per_server.row(s).to_vec(),
            });
        }
        Some(sent)
    }

    /// Queues one GET frame for `parts` of the batch on the lane to `pool`'s server (written
    /// at once past [`CORK`] bytes). Returns the lane's serial, the request id and the reply's
    /// deadline; `None` if it could not be encoded or written (a lane that failed is dropped with
    /// the frames waiting on it).
    fn send_frame(
        &mut self,
        pool: &Arc<Pool>,
        batch: &Batch,
        sent: &Sent,
        parts: &[u32],
        epoch: u64,
    ) -> Option<(u64, u64, Instant)> {
        let keys = batch.keys.keys();
        let li = self.lane(pool).ok()?;
        let lane = &mut self.lanes[li];
        let id = lane.conn.next_request_id();
        // A writer dropped before `finish` (an encoding error) removes its partial frame.
        let mut w = KeyBatchWriter::begin(
            &mut lane.out,
            Opcode::Get,
            id,
            &batch.table,
            batch.version,
            epoch,
        )
        .ok()?;
        w.set_incarnation(sent.meta.incarnation);
        for &p in parts {
            let ks = sent
                .by_part
                .row(p as usize)
                .iter()
                .map(|&j| keys.key(sent.idx[j as usize] as usize));
            w.group(p, ks).ok()?;
        }
        w.finish().ok()?;
        let deadline = deadline::after(self.client.inner.settings.timeout);
        lane.out_deadline.get_or_insert(deadline);
        lane.waiting.push_back(id);
        let serial = lane.serial;
        if lane.out.len() >= CORK && !self.write_out(li) {
            return None;
        }
        Some((serial, id, deadline))
    }

    /// Writes lane `li`'s queued frames; false (and the lane dropped) if that failed.
    fn write_out(&mut self, li: usize) -> bool {
        let lane = &mut self.lanes[li];
        if lane.out.is_empty() {
            return true;
        }
        let deadline = lane.out_deadline.take().unwrap_or_else(Instant::now);
        let ok = lane
            .conn
            .send_more(&lane.pool.addr, &lane.out, deadline)
            .is_ok();
        lane.out.clear();
        if !ok {
            self.lanes.remove(li);
        }
        ok
    }

    /// Writes every lane's queued frames (before waiting for a reply).
    fn write_all_out(&mut self) {
        let mut li = 0;
        while li < self.lanes.len() {
            if self.write_out(li) {
                li += 1;
            }
        }
    }

    /// The index of the lane to `pool`'s server, opened (or taken from the pool) if there is none.
    fn lane(&mut self, pool: &Arc<Pool>) -> Result<usize> {
        if let Some(i) = self.lanes.iter().position(|l| Arc::ptr_eq(&l.pool, pool)) {
            return Ok(i);
        }
        let conn = self.client.checkout(pool, false)?;
        self.lanes.push(Lane {
            serial: self.next_serial,
            pool: pool.clone(),
            conn,
            waiting: VecDeque::new(),
            out: Vec::new(),
            out_deadline: None,
        });
        self.next_serial += 1;
        Ok(self.lanes.len() - 1)
    }

    fn drop_lane(&mut self, serial: u64) {
        self.lanes.retain(|l| l.serial != serial);
    }

    /// Reads every reply of the batch (each at the head of its lane, by invariant 1) into its
    /// result; `None` if the batch must be redone. Replies are read even when an earlier one
    /// already decided that, so the lanes stay in step.
    fn collect(&mut self, batch: &Batch, sent: &Sent) -> Option<GetResult> {
        let n = batch.keys.keys().len();
        let vt = sent.meta.value_type;
        let mut values = Values::zeroed(vt, n);
        let mut found = vec![false; n];
        let mut ok = sent.complete;
        let mut version: Option<u32> = None;
        let skip = vec![false; sent.by_part.servers()];
        for f in &sent.frames {
            let Some(li) = self.lanes.iter().position(|l| l.serial == f.lane) else {
                ok = false; // its lane broke: the reply is lost
                continue;
            };
            let lane = &mut self.lanes[li];
            if lane.waiting.front() != Some(&f.id) {
                // Cannot happen (invariant 1); if it did, the lane is out of step: drop it.
                self.drop_lane(f.lane);
                ok = false;
                continue;
            }
            lane.waiting.pop_front();
            let addr = &lane.pool.addr;
            let taken = match lane.conn.recv_next(addr, f.id, Opcode::Get, f.deadline) {
                Ok(reply) => match Response::decode_body(Opcode::Get, reply.body) {
                    Ok(Response::Get(g)) if ok => {
                        let at = version.get_or_insert(g.version);
                        let same = *at == g.version;
                        let h = scatter_reply(
                            &g,
                            vt,
                            addr,
                            &f.parts,
                            &skip,
                            &sent.by_part,
                            &sent.idx,
                            &mut values.slice_mut(0..n),
                            &mut found,
                        );
                        Some(same && matches!(h, Ok(Handled::Ok)))
                    }
                    // A refusal or an answer after the batch failed: read whole, the lane is fine.
                    Ok(_) => Some(false),
                    Err(_) => None,
                },
                Err(_) => None,
            };
            match taken {
                Some(good) => ok &= good,
                None => {
                    self.drop_lane(f.lane);
                    ok = false;
                }
            }
        }
        ok.then(|| GetResult {
            values,
            found,
            version: version.unwrap_or(batch.version),
        })
    }

    /// Reads the batch through the unpipelined path (invariant 2).
    fn redo(&self, batch: &Batch) -> Result<GetResult> {
        let keys = batch.keys.keys();
        if batch.incarnation == 0 {
            return self.client.get(&batch.table, keys, batch.version);
        }
        let meta = self.client.table_meta(&batch.table)?;
        let n = keys.len();
        let mut values = Values::zeroed(meta.value_type, n);
        let mut found = vec![false; n];
        let version = self.client.get_into_of(
            &batch.table,
            batch.incarnation,
            keys,
            batch.version,
            &mut values.slice_mut(0..n),
            &mut found,
        )?;
        Ok(GetResult {
            values,
            found,
            version,
        })
    }
}

impl Drop for Pipeline {
    /// Lanes with nothing waiting go back to their pools; the others are closed (a reply may
    /// still arrive on them).
    fn drop(&mut self) {
        for lane in self.lanes.drain(..) {
            if lane.waiting.is_empty() {
                self.client.put_back(&lane.pool, lane.conn);
            }
        }
    }
}

impl Iterator for Pipeline {
    type Item = Result<GetResult>;
    fn next(&mut self) -> Option<Result<GetResult>> {
        self.next_result()
    }
}

/// Reads `batches` of `table` at `version` with up to `depth` batches in flight, handing each
/// result to `each` in order (its batch index, the result). Stops at the first error `each` returns.
pub fn get_pipelined<'k, E>(
    client: &Client,
    table: &str,
    batches: impl IntoIterator<Item = crate::Keys<'k>>,
    version: u32,
    depth: usize,
    mut each: impl FnMut(usize, Result<GetResult>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut p = client.pipeline();
    let mut done = 0;
    let depth = depth.max(1);
    for keys in batches {
        if p.in_flight() >= depth {
            // Take results until half the batches are left, then queue the next ones together
            // (they go out in one write per server: see [`CORK`]).
            while p.in_flight() > depth / 2 {
                let r = p.next_result().expect("a batch in flight");
                each(done, r)?;
                done += 1;
            }
        }
        p.submit(table, OwnedKeys::copy_of(keys), version, 0);
    }
    for r in p {
        each(done, r)?;
        done += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_keys_address_the_same_bytes() {
        let slices: Vec<&[u8]> = vec![b"ab", b"", b"c"];
        let owned = OwnedKeys::copy_of(crate::Keys::Slices(&slices));
        let k = owned.keys();
        assert!(k.validate().is_ok());
        assert_eq!(k.len(), 3);
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(&*k.key(i), *s);
        }
        let ints = OwnedKeys::copy_of(crate::Keys::I64(&[5, -1]));
        assert_eq!(&*ints.keys().key(1), &(-1i64).to_le_bytes());
    }

    #[test]
    fn error_type_is_exact_for_unreachable_servers() {
        // No server listens on port 1: every batch is redone and fails as a plain get fails.
        let client = match Client::new(crate::ClientConfig::new(vec!["127.0.0.1:1".into()])) {
            Ok(c) => c,
            Err(_) => return, // the constructor itself may refuse an unreachable cluster
        };
        let mut p = client.pipeline();
        p.submit("t", OwnedKeys::I64(vec![1, 2]), 0, 0);
        let got = p.next().expect("one batch");
        let plain = client.get("t", crate::Keys::I64(&[1, 2]), 0);
        assert_eq!(got.is_err(), plain.is_err());
        assert!(p.next().is_none());
    }
}
