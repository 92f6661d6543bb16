//! The closed loop: one event loop per client thread drives its share of the connections.
//!
//! Each connection has at most one batch in flight (one request, `depth` pipelined requests, or one
//! multi-key get). When every reply of the batch has been read and validated, its round-trip time goes
//! into the thread's histogram and the next batch is sent at once. An event loop rather than a thread
//! per connection keeps 50 connections from costing 50 scheduler entities on a small machine.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::keys::KeySpace;
use crate::reply::{self, Status};

/// Histogram range: 1 ns to 60 s at 3 significant digits.
const HIST_MAX_NS: u64 = 60_000_000_000;
/// How often the loop wakes to check phases and stalled connections when nothing arrives.
const TICK: Duration = Duration::from_millis(50);

/// What each request of a batch asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Get,
    /// A meta multi-get: `mg <key> v k q` per key, then `mn`.
    MetaGet,
    Set,
}

/// The shape of one batch, the unit of the closed loop.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub op: Op,
    /// Requests sent back to back before reading (pipeline depth).
    pub requests: usize,
    /// Keys in each request (a multi-key get has more than one).
    pub keys_per_request: usize,
}

/// Everything a worker thread needs to know about the run; shared read-only by all threads.
pub struct Plan {
    pub keys: KeySpace,
    pub value: Vec<u8>,
    pub shape: Shape,
    /// Write every key once, in order (the load workload), instead of drawing random keys.
    pub load: bool,
    /// Results before this instant are warm-up and are thrown away.
    pub measure_from: Instant,
    /// No batch is started after this instant.
    pub stop_at: Option<Instant>,
    /// Bound on any one socket operation: a batch with no progress for this long fails the run.
    pub op_timeout: Duration,
    /// Set by a thread that failed, so the others stop instead of running out their time.
    pub abort: AtomicBool,
}

/// What one thread measured.
pub struct Tally {
    pub requests: u64,
    pub keys: u64,
    pub hits: u64,
    pub batches: u64,
    /// Round-trip time of each batch, in nanoseconds.
    pub latency: Histogram<u64>,
    /// Completion time of the last measured batch.
    pub last_done: Option<Instant>,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            requests: 0,
            keys: 0,
            hits: 0,
            batches: 0,
            latency: Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds"),
            last_done: None,
        }
    }

    pub fn merge(&mut self, other: &Tally) -> Result<()> {
        self.requests += other.requests;
        self.keys += other.keys;
        self.hits += other.hits;
        self.batches += other.batches;
        self.latency
            .add(&other.latency)
            .map_err(|e| anyhow!("merging histograms: {e:?}"))?;
        self.last_done = self.last_done.max(other.last_done);
        Ok(())
    }
}

/// One connection of the closed loop.
pub struct Conn {
    /// Index over all connections of the run, for messages and seeding.
    pub index: usize,
    stream: TcpStream,
    rng: StdRng,
    wbuf: Vec<u8>,
    wpos: usize,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Key ids of the batch in flight, request after request.
    ids: Vec<u64>,
    /// Requests in the batch in flight.
    batch_requests: usize,
    /// Next request of the batch whose reply is awaited.
    next_reply: usize,
    batch_hits: u64,
    in_flight: bool,
    sent_at: Instant,
    progress_at: Instant,
    /// Load workload: the ids this connection still has to write.
    load_next: u64,
    load_end: u64,
}

impl Conn {
    /// Wraps a connected blocking stream; `load_range` is this connection's share of the load workload.
    pub fn new(
        index: usize,
        stream: std::net::TcpStream,
        seed: u64,
        load_range: (u64, u64),
    ) -> Result<Conn> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let now = Instant::now();
        Ok(Conn {
            index,
            stream: TcpStream::from_std(stream),
            rng: StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            wbuf: Vec::with_capacity(4096),
            wpos: 0,
            rbuf: vec![0; 64 * 1024],
            rstart: 0,
            rend: 0,
            ids: Vec::new(),
            batch_requests: 0,
            next_reply: 0,
            batch_hits: 0,
            in_flight: false,
            sent_at: now,
            progress_at: now,
            load_next: load_range.0,
            load_end: load_range.1,
        })
    }

    /// Composes the next batch into the write buffer; false when the load workload has nothing left.
    fn compose(&mut self, plan: &Plan) -> bool {
        let shape = plan.shape;
        self.ids.clear();
        self.wbuf.clear();
        self.wpos = 0;
        self.batch_requests = if plan.load {
            let left = self.load_end - self.load_next;
            if left == 0 {
                return false;
            }
            shape
                .requests
                .min(usize::try_from(left).unwrap_or(usize::MAX))
        } else {
            shape.requests
        };
        for _ in 0..self.batch_requests {
            match shape.op {
                Op::Get => {
                    self.wbuf.extend_from_slice(b"get");
                    for _ in 0..shape.keys_per_request {
                        let id = self.rng.gen_range(0..plan.keys.count());
                        self.ids.push(id);
                        self.wbuf.push(b' ');
                        plan.keys.write(id, &mut self.wbuf);
                    }
                    self.wbuf.extend_from_slice(b"\r\n");
                }
                Op::MetaGet => {
                    for _ in 0..shape.keys_per_request {
                        let id = self.rng.gen_range(0..plan.keys.count());
                        self.ids.push(id);
                        self.wbuf.extend_from_slice(b"mg ");
                        plan.keys.write(id, &mut self.wbuf);
                        self.wbuf.extend_from_slice(b" v k q\r\n");
                    }
                    self.wbuf.extend_from_slice(b"mn\r\n");
                }
                Op::Set => {
                    let id = if plan.load {
                        self.load_next += 1;
                        self.load_next - 1
                    } else {
                        self.rng.gen_range(0..plan.keys.count())
                    };
                    self.ids.push(id);
                    self.wbuf.extend_from_slice(b"set ");
                    plan.keys.write(id, &mut self.wbuf);
                    self.wbuf.extend_from_slice(b" 0 0 ");
                    self.wbuf
                        .extend_from_slice(plan.value.len().to_string().as_bytes());
                    self.wbuf.extend_from_slice(b"\r\n");
                    self.wbuf.extend_from_slice(&plan.value);
                    self.wbuf.extend_from_slice(b"\r\n");
                }
            }
        }
        true
    }

    /// Starts the next batch; false when there was none to start.
    fn start_batch(&mut self, plan: &Plan, now: Instant) -> Result<bool> {
        if !self.compose(plan) {
            return Ok(false);
        }
        self.next_reply = 0;
        self.batch_hits = 0;
        self.in_flight = true;
        self.sent_at = now;
        self.progress_at = now;
        self.flush()?;
        Ok(true)
    }

    /// Writes as much of the pending batch as the socket takes.
    fn flush(&mut self) -> Result<()> {
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => bail!("connection {}: server stopped accepting data", self.index),
                Ok(n) => {
                    self.wpos += n;
                    self.progress_at = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context(format!("connection {}: write", self.index)),
            }
        }
        Ok(())
    }

    /// Reads what is available; returns whether any byte arrived.
    ///
    /// Stops at the first short read instead of reading on to `WouldBlock`: a short read means the
    /// socket was drained at that moment, and Linux raises a fresh edge for anything arriving later.
    /// That saves one failing `read` per round trip, a large share of the client's CPU at one key
    /// per request. Were the assumption wrong, the stall timeout would fail the run, not skew it.
    fn fill(&mut self) -> Result<bool> {
        let mut got = false;
        loop {
            if self.rend == self.rbuf.len() {
                if self.rstart > 0 {
                    self.rbuf.copy_within(self.rstart..self.rend, 0);
                    self.rend -= self.rstart;
                    self.rstart = 0;
                } else {
                    let bigger = self.rbuf.len() * 2;
                    self.rbuf.resize(bigger, 0);
                }
            }
            let space = self.rbuf.len() - self.rend;
            match self.stream.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => bail!("connection {}: server closed the connection", self.index),
                Ok(n) => {
                    self.rend += n;
                    got = true;
                    if n < space {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(got),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context(format!("connection {}: read", self.index)),
            }
        }
    }

    /// Consumes the replies that have fully arrived; true when the batch in flight is complete.
    fn consume(&mut self, plan: &Plan) -> Result<bool> {
        let k = plan.shape.keys_per_request;
        while self.in_flight && self.next_reply < self.batch_requests {
            let buf = &self.rbuf[self.rstart..self.rend];
            let want = &self.ids[(self.next_reply * k).min(self.ids.len())..];
            let want = &want[..k.min(want.len())];
            // Replies list hits in request order, skipping misses: match them in that order.
            let mut cursor = 0;
            let key_ok = |key: &[u8]| {
                let Some(id) = plan.keys.id_of(key) else {
                    return false;
                };
                while cursor < want.len() {
                    cursor += 1;
                    if want[cursor - 1] == id {
                        return true;
                    }
                }
                false
            };
            let status = match plan.shape.op {
                Op::Get => reply::parse_get(buf, key_ok),
                Op::MetaGet => reply::parse_meta_get(buf, key_ok),
                Op::Set => reply::parse_stored(buf),
            }
            .with_context(|| format!("connection {}", self.index))?;
            match status {
                Status::Incomplete => break,
                Status::Complete { consumed, hits } => {
                    self.rstart += consumed;
                    self.batch_hits += u64::from(hits);
                    self.next_reply += 1;
                }
            }
        }
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
        }
        let done = self.in_flight && self.next_reply == self.batch_requests;
        if done {
            self.in_flight = false;
        }
        if !self.in_flight && self.rend > self.rstart {
            let extra =
                String::from_utf8_lossy(&self.rbuf[self.rstart..self.rend.min(self.rstart + 80)])
                    .into_owned();
            bail!(
                "connection {}: unexpected bytes after the last reply: {extra:?}",
                self.index
            );
        }
        Ok(done)
    }
}

/// Runs `conns` until the plan says stop; `quota`: stop after this many measured requests.
pub fn drive(plan: &Plan, mut conns: Vec<Conn>, quota: Option<u64>) -> Result<Tally> {
    let mut poll = Poll::new().context("creating poll")?;
    for (slot, conn) in conns.iter_mut().enumerate() {
        poll.registry()
            .register(
                &mut conn.stream,
                Token(slot),
                Interest::READABLE | Interest::WRITABLE,
            )
            .context("registering a connection")?;
    }
    let mut events = Events::with_capacity(conns.len().max(16));
    let mut tally = Tally::new();
    let mut measuring = false;
    // Requests started in the measured phase, to honour the quota.
    let mut started = 0u64;
    let mut in_flight = 0usize;

    let now = Instant::now();
    let may_start = |now: Instant, measuring: bool, started: u64| -> bool {
        let before_stop = plan.stop_at.is_none_or(|stop| now < stop);
        before_stop && (!measuring || quota.is_none_or(|q| started < q))
    };
    for conn in conns.iter_mut() {
        if conn.start_batch(plan, now)? {
            in_flight += 1;
        }
    }
    let mut last_check = now;

    loop {
        let now = Instant::now();
        if !measuring && now >= plan.measure_from {
            measuring = true;
            tally = Tally::new();
            started = 0;
        }
        // A connection goes idle only once it may start no more batches (stop time, quota, or
        // nothing left to load), and that never reverts, so no batch in flight means the run is over.
        if in_flight == 0 {
            break;
        }
        if plan.abort.load(Ordering::Relaxed) {
            bail!("stopped because another client thread failed");
        }
        // A server that trickles bytes keeps every connection "in progress": bound the drain too.
        if plan
            .stop_at
            .is_some_and(|stop| now > stop + plan.op_timeout)
        {
            bail!(
                "{in_flight} batches still in flight {:?} after the end of the run",
                plan.op_timeout
            );
        }
        if now.duration_since(last_check) >= TICK {
            last_check = now;
            for conn in &conns {
                if conn.in_flight && now.duration_since(conn.progress_at) > plan.op_timeout {
                    bail!(
                        "connection {}: no progress for {:?} with a batch in flight",
                        conn.index,
                        plan.op_timeout
                    );
                }
            }
        }
        let mut wait = TICK;
        if !measuring {
            wait = wait.min(plan.measure_from.saturating_duration_since(now));
        }
        poll.poll(&mut events, Some(wait)).context("poll")?;
        for event in events.iter() {
            let conn = &mut conns[event.token().0];
            if event.is_writable() && conn.in_flight {
                conn.flush()?;
            }
            if !(event.is_readable() || event.is_read_closed() || event.is_error()) {
                continue;
            }
            if conn.fill()? {
                conn.progress_at = Instant::now();
            }
            if !conn.consume(plan)? {
                continue;
            }
            in_flight -= 1;
            let done = Instant::now();
            if measuring || plan.load {
                let requests = conn.batch_requests as u64;
                tally.batches += 1;
                tally.requests += requests;
                tally.keys += requests * plan.shape.keys_per_request as u64;
                tally.hits += conn.batch_hits;
                let rtt = done.duration_since(conn.sent_at).as_nanos();
                tally
                    .latency
                    .saturating_record(u64::try_from(rtt).unwrap_or(u64::MAX).max(1));
                tally.last_done = Some(done);
            }
            if may_start(done, measuring, started) && conn.start_batch(plan, done)? {
                in_flight += 1;
                if measuring {
                    started += conn.batch_requests as u64;
                }
            }
        }
    }
    Ok(tally)
}
