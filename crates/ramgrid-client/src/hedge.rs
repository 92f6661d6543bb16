//! Hedged reads: one round of a batched GET in which a server that is late gets a backup.
//!
//! The round writes one frame per server (the partitions each is the chosen replica for), then
//! waits on all the connections at once. When a server's reply has not come by its hedge delay
//! (`health.rs`: derived from its observed latency, clamped to 2..250 ms), or the server fails,
//! its partitions that are still unanswered are sent to their next live replica as well, one frame
//! per backup server on another connection. Each partition takes the first whole reply that covers
//! it, and all of its values come from that one reply; a later reply covering it is skipped for it.
//!
//! Duplicating a read is safe: it changes nothing on the servers. A pinned version reads the same
//! values from any replica. A read of version 0 ("current") lets each replica resolve the version
//! itself, as before: the partition records the version of the reply it took, and the caller's rule
//! that a call never mixes versions (partitions that resolved an older version are read again at
//! the newest) applies to hedged partitions like any other.
//!
//! When every partition is answered, flights still waiting are abandoned (their connections
//! dropped, never pooled: a reply may still arrive on them). A server that had been hedged and had
//! sent no byte of its reply by then is marked slow (`health.rs`): it was silent past its hedge
//! delay while a replica did the whole round trip. Reads avoid it until a probe answers; time alone
//! never brings it back.

use std::time::{Duration, Instant};

use ramgrid_proto::cluster::PartitionMap;
use ramgrid_proto::native::{Opcode, Response};

use crate::client::{Client, Handled, OpError, Topology};
use crate::conn::Conn;
use crate::deadline;
use crate::error::{Error, Result};
use crate::exchange::may_resend;
use crate::plan::Groups;

/// How long the wait polls the sockets without blocking before it sleeps in the kernel (the same
/// trade as `conn.rs`'s spin: a batch's reply usually comes within tens of microseconds).
const SPIN: Duration = Duration::from_micros(50);

/// Builds the GET frame for (server, its partitions, buffer, request id).
pub(crate) type Encode<'a> = dyn FnMut(usize, &[u32], &mut Vec<u8>, u64) -> Result<()> + 'a;
/// Takes one whole reply: (server, the frame's partitions, partitions answered already, reply).
/// Must leave the output alone for partitions answered already.
pub(crate) type Take<'a> =
    dyn FnMut(usize, &[u32], &[bool], Response<'_>) -> std::result::Result<Handled, OpError> + 'a;

/// How a round builds its frames and takes its replies (the caller's side).
pub(crate) struct ReadIo<'a, 'f> {
    /// The request's opcode (its replies decode as this opcode's).
    pub(crate) opcode: Opcode,
    /// Whether a late server's partitions get a backup on another replica. Reads hedge; requests
    /// whose work grows with the partition (operators) do not, so a slow pass is not run twice.
    pub(crate) hedge: bool,
    /// Keys of a partition in this read.
    pub(crate) keys_in: &'a dyn Fn(u32) -> usize,
    pub(crate) encode: &'a mut Encode<'f>,
    pub(crate) take: &'a mut Take<'f>,
}

/// What a round left for the caller.
pub(crate) struct RoundEnd {
    /// Partitions that no reply covered: every server tried for them failed.
    pub(crate) undone: Vec<u32>,
    /// Why servers failed, one entry per failure.
    pub(crate) why: Vec<String>,
}

/// One frame in flight.
struct Flight {
    server: usize,
    conn: Conn,
    parts: Vec<u32>,
    keys: usize,
    sent: Instant,
    deadline: Instant,
    /// When to send backups for its partitions; `None` once sent, and for backups themselves.
    hedge_at: Option<Instant>,
    /// A backup for another server's partitions.
    backup: bool,
    /// The retry rule (`exchange.rs`) was applied to it once already.
    resent: bool,
}

/// The state of one round.
struct Round<'r, 'f> {
    client: &'r Client,
    topo: &'r Topology,
    map: &'r PartitionMap,
    /// Servers that failed in this call (the caller's, updated).
    failed: &'r mut [bool],
    io: ReadIo<'r, 'f>,
    /// Per partition: answered.
    done: Vec<bool>,
    /// Per partition: bit i set when its replica i got a frame for it in this round.
    tried: Vec<u64>,
    /// Per partition: open flights covering it.
    covering: Vec<u16>,
    flights: Vec<Option<Flight>>,
    /// Partitions of the round not yet answered.
    left: usize,
    why: Vec<String>,
}

impl Client {
    /// Reads the partitions of `first` (grouped by the server chosen for each) in one hedged round.
    /// `failed` holds the servers that failed earlier in the call (never used for backups) and
    /// gains the ones that fail now.
    pub(crate) fn hedged_get<'f>(
        &self,
        topo: &Topology,
        map: &PartitionMap,
        first: &Groups,
        failed: &mut [bool],
        io: ReadIo<'_, 'f>,
    ) -> std::result::Result<RoundEnd, OpError> {
        let n = map.partitions() as usize;
        let mut round = Round {
            client: self,
            topo,
            map,
            failed,
            io,
            done: vec![false; n],
            tried: vec![0; n],
            covering: vec![0; n],
            flights: Vec::new(),
            left: 0,
            why: Vec::new(),
        };
        let mut all = Vec::new();
        for s in first.busy() {
            all.extend_from_slice(first.row(s));
            round.left += first.row(s).len();
        }
        for s in first.busy() {
            round.launch(s, first.row(s).to_vec(), false, false)?;
        }
        round.run()?;
        round.abandon();
        Ok(RoundEnd {
            undone: all
                .into_iter()
                .filter(|&p| !round.done[p as usize])
                .collect(),
            why: round.why,
        })
    }
}

impl Round<'_, '_> {
    /// Sends a frame for `parts` to server `s`. On failure the server is recorded as failed and the
    /// partitions go to backups.
    fn launch(
        &mut self,
        s: usize,
        parts: Vec<u32>,
        backup: bool,
        fresh: bool,
    ) -> std::result::Result<(), OpError> {
        for &p in &parts {
            if let Some(i) = self.map.replicas(p).iter().position(|&r| r as usize == s) {
                self.tried[p as usize] |= 1u64.checked_shl(i as u32).unwrap_or(0);
            }
        }
        let encode = &mut *self.io.encode;
        let mut frame = |s: usize, buf: &mut Vec<u8>, id: u64| encode(s, &parts, buf, id);
        match self
            .client
            .send_frame(self.topo, s, self.io.opcode, fresh, &mut frame)?
        {
            Ok((conn, deadline)) => {
                let keys = parts.iter().map(|&p| (self.io.keys_in)(p)).sum();
                let sent = Instant::now();
                let hedge_at = (!backup && self.io.hedge).then(|| {
                    let delay = self.topo.pools[s].health.hedge_delay(keys);
                    sent + delay
                });
                for &p in &parts {
                    self.covering[p as usize] += 1;
                }
                self.flights.push(Some(Flight {
                    server: s,
                    conn,
                    parts,
                    keys,
                    sent,
                    deadline,
                    hedge_at,
                    backup,
                    resent: fresh,
                }));
                Ok(())
            }
            Err(e) => self.server_failed(s, e, &parts),
        }
    }

    /// Server `s` failed for `parts`: remember it, and send its unanswered, uncovered partitions to
    /// their next live replica. The call's own timeout ends the round instead.
    fn server_failed(
        &mut self,
        s: usize,
        e: Error,
        parts: &[u32],
    ) -> std::result::Result<(), OpError> {
        if matches!(e, Error::CallTimeout { .. }) {
            return Err(OpError::Fatal(e));
        }
        self.failed[s] = true;
        self.why.push(e.to_string());
        let orphans: Vec<u32> = parts
            .iter()
            .copied()
            .filter(|&p| !self.done[p as usize] && self.covering[p as usize] == 0)
            .collect();
        self.back_up(&orphans)
    }

    /// Sends each of `parts` to its next replica that is live, has not failed in this call and has
    /// not had a frame for it in this round (one frame per backup server). Partitions without one
    /// are left to the caller.
    fn back_up(&mut self, parts: &[u32]) -> std::result::Result<(), OpError> {
        let servers = self.topo.pools.len();
        let target = |p: u32| {
            let tried = self.tried[p as usize];
            self.map
                .replicas(p)
                .iter()
                .enumerate()
                .find(|&(i, &r)| {
                    let r = r as usize;
                    i < 64
                        && tried & (1 << i) == 0
                        && !self.failed[r]
                        && !self.topo.pools[r].health.avoid_for_reads()
                })
                .map(|(_, &r)| r as usize)
        };
        let to: Vec<Option<usize>> = parts.iter().map(|&p| target(p)).collect();
        let groups = Groups::by_target(servers, 0..parts.len() as u32, |j| to[j as usize]);
        for b in groups.busy() {
            let row: Vec<u32> = groups.row(b).iter().map(|&j| parts[j as usize]).collect();
            self.launch(b, row, true, false)?;
        }
        Ok(())
    }

    /// Waits for replies until every partition is answered or no flight is left. Each pass asks
    /// the kernel once which sockets have bytes (without waiting while it spins, else until the
    /// next deadline or hedge time) and reads only those; the first pass reads them all.
    fn run(&mut self) -> std::result::Result<(), OpError> {
        let mut idle_since = Instant::now();
        let mut readable: Option<Vec<bool>> = None;
        while self.left > 0 && self.waiting_for_any() {
            let now = Instant::now();
            let mut progress = false;
            let mut i = 0;
            // Flights launched while this pass runs are looked at in the same pass (and read).
            while i < self.flights.len() {
                let ready = readable
                    .as_ref()
                    .is_none_or(|r| r.get(i).copied().unwrap_or(true));
                if self.step(i, now, ready)? {
                    progress = true;
                }
                i += 1;
            }
            if progress {
                idle_since = Instant::now();
            }
            let spinning = idle_since.elapsed() < SPIN;
            if spinning && !progress {
                std::thread::yield_now();
            }
            readable = Some(self.poll(spinning));
        }
        Ok(())
    }

    /// Looks at flight `i`: takes its reply if whole (reading only when `readable`), fails it past
    /// its deadline, hedges it past its hedge time. Returns whether something happened.
    fn step(
        &mut self,
        i: usize,
        now: Instant,
        readable: bool,
    ) -> std::result::Result<bool, OpError> {
        let Some(f) = self.flights[i].as_mut() else {
            return Ok(false);
        };
        let topo = self.topo;
        let addr = &topo.pools[f.server].addr;
        let filled = if readable {
            f.conn.try_fill(addr)
        } else {
            Ok(false)
        };
        match filled {
            Ok(true) => {
                let f = self.flights[i].take().expect("open flight");
                self.finish(f)?;
                Ok(true)
            }
            Ok(false) if now >= f.deadline => {
                let e = deadline::timeout_error(addr);
                let f = self.flights[i].take().expect("open flight");
                self.fail(f, e)?;
                Ok(true)
            }
            Ok(false) => match f.hedge_at {
                Some(at) if now >= at => {
                    f.hedge_at = None;
                    let parts: Vec<u32> = f
                        .parts
                        .iter()
                        .copied()
                        .filter(|&p| !self.done[p as usize])
                        .collect();
                    self.back_up(&parts)?;
                    Ok(true)
                }
                _ => Ok(false),
            },
            Err(e) => {
                let f = self.flights[i].take().expect("open flight");
                self.fail(f, e)?;
                Ok(true)
            }
        }
    }

    /// A flight's reply is whole (or broken beyond repair): hand it over.
    fn finish(&mut self, mut f: Flight) -> std::result::Result<(), OpError> {
        let topo = self.topo;
        let pool = &topo.pools[f.server];
        let handled = match f.conn.recv(&pool.addr, f.deadline) {
            Ok(reply) => match Response::decode_body(self.io.opcode, reply.body) {
                Ok(resp) => (self.io.take)(f.server, &f.parts, &self.done, resp)?,
                Err(e) => Handled::Failed(Error::Protocol {
                    server: pool.addr.clone(),
                    message: e.to_string(),
                }),
            },
            Err(e) => Handled::Failed(e),
        };
        match handled {
            Handled::Ok => {
                pool.health.record(f.sent.elapsed(), f.keys);
                pool.health.mark_up();
                for &p in &f.parts {
                    let p = p as usize;
                    self.covering[p] -= 1;
                    if !self.done[p] {
                        self.done[p] = true;
                        self.left -= 1;
                    }
                }
                self.client.put_back(pool, f.conn);
                Ok(())
            }
            Handled::Failed(e) => self.fail(f, e),
            Handled::Refused { partitions, error } => self.refused(f, &partitions, error),
        }
    }

    /// A server refused some partitions of a flight (REPAIRING): the others go back to it, the
    /// refused ones to their next replica (the caller never picks this server for them again in
    /// this call). A refusal that names none of the flight's partitions is a failure.
    fn refused(
        &mut self,
        f: Flight,
        refused: &[u32],
        e: Error,
    ) -> std::result::Result<(), OpError> {
        if !f.parts.iter().any(|p| refused.contains(p)) {
            return self.fail(f, e);
        }
        for &p in &f.parts {
            self.covering[p as usize] -= 1;
        }
        let pool = &self.topo.pools[f.server];
        pool.health.mark_up();
        self.client.put_back(pool, f.conn);
        self.why.push(e.to_string());
        let (elsewhere, here): (Vec<u32>, Vec<u32>) = f
            .parts
            .iter()
            .copied()
            .filter(|&p| !self.done[p as usize])
            .partition(|p| refused.contains(p));
        if !here.is_empty() {
            // Each refusal names at least one of the frame's partitions, so this ends.
            self.launch(f.server, here, f.backup, false)?;
        }
        let orphans: Vec<u32> = elsewhere
            .into_iter()
            .filter(|&p| self.covering[p as usize] == 0)
            .collect();
        self.back_up(&orphans)
    }

    /// A flight failed: send it again once on a fresh connection if the retry rule allows,
    /// else fail its server for its partitions.
    fn fail(&mut self, f: Flight, e: Error) -> std::result::Result<(), OpError> {
        for &p in &f.parts {
            self.covering[p as usize] -= 1;
        }
        let topo = self.topo;
        let pool = &topo.pools[f.server];
        if !f.resent && may_resend(&e, &f.conn, self.io.opcode, true) {
            let parts: Vec<u32> = f
                .parts
                .into_iter()
                .filter(|&p| !self.done[p as usize])
                .collect();
            return self.launch(f.server, parts, f.backup, true);
        }
        if e.is_transport() {
            self.client.mark_down(pool);
        } else {
            // A refusal read whole leaves the connection usable (put_back keeps only clean ones).
            self.client.put_back(pool, f.conn);
        }
        self.server_failed(f.server, e, &f.parts)
    }

    /// Which flights' sockets have bytes (or an error or hangup to report), by flight index. Waits
    /// for one, or until the next deadline or hedge time, unless `now_only`.
    fn poll(&self, now_only: bool) -> Vec<bool> {
        let mut next: Option<Instant> = None;
        let mut fds = Vec::with_capacity(self.flights.len());
        for f in &self.flights {
            let fd = match f {
                Some(f) => {
                    let t = f.hedge_at.map_or(f.deadline, |h| h.min(f.deadline));
                    next = Some(next.map_or(t, |n| n.min(t)));
                    f.conn.fd()
                }
                None => -1, // ignored by poll
            };
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ms = match (now_only, next) {
            (true, _) | (_, None) => 0,
            (false, Some(next)) => {
                // Round up to whole milliseconds: waking early only costs another pass.
                let left = next.saturating_duration_since(Instant::now());
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            }
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            // EINTR (or worse): say every socket may have bytes; reading finds out.
            return vec![true; fds.len()];
        }
        fds.iter().map(|p| p.revents != 0).collect()
    }

    /// The round is over: drop the flights still waiting. A hedged server that has sent nothing
    /// of its reply is marked down (see the module).
    fn abandon(&mut self) {
        for f in self.flights.drain(..).flatten() {
            let hedged = !f.backup && f.hedge_at.is_none();
            if hedged && !f.conn.reply_started() {
                self.client.mark_slow(&self.topo.pools[f.server]);
            }
        }
    }

    /// Whether an open flight covers a partition still unanswered (else waiting is pointless).
    fn waiting_for_any(&self) -> bool {
        self.flights
            .iter()
            .flatten()
            .any(|f| f.parts.iter().any(|&p| !self.done[p as usize]))
    }
}
