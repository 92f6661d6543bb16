//! Exchanges with servers: checking out a connection (pooled and checked, or fresh with HELLO), one
//! request to one server, and the fan-out of one frame to each of several servers (writes and
//! admin; reads go through `hedge.rs`). A server that fails here is marked down (`health.rs`).
//!
//! The retry rule (docs/client.md, rule 7, restates it). A pooled connection may have died while it
//! sat idle (the server restarted), and a request must not fail for that alone; but a write must
//! never be applied twice without the caller knowing:
//! 1. A pooled connection is checked before reuse ([`Conn::is_alive`]); one the server has closed is
//!    dropped unused. This alone covers a restart, for every kind of request.
//! 2. A request that fails with an I/O error (not a timeout, not a refusal or a reply that made no
//!    sense) on a connection reused from the pool, before any byte of its reply arrived, is sent
//!    once more on a fresh connection if repeating it cannot change the outcome ([`idempotent`]:
//!    the reads, and the admin writes whose repeat the client takes as success).
//! 3. Any other request (PUT, DELETE, CREATE_TABLE, DROP_TABLE, CREATE_VERSION, DROP_VERSION) is sent
//!    again only when writing its frame failed: the server then cannot hold the whole frame, and a
//!    frame is only acted on whole. Once the frame is written, a lost reply may hide an applied
//!    write (the server applied it, then died or dropped the connection), so the error stands and
//!    the caller sees it (a write reports the keys as not acknowledged by that replica).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ramgrid_proto::native::{Opcode, Request, Response};

use crate::client::{encode_err, Client, Handled, Inner, OpError, Topology, CHUNK_BODY};
use crate::conn::{Conn, Pool};
use crate::deadline;
use crate::error::{Error, Result};

/// Whether sending `op` twice has the same effect as sending it once (rule 2 of the module).
/// Exhaustive on purpose: a new opcode must be classified here before it compiles.
pub(crate) fn idempotent(op: Opcode) -> bool {
    match op {
        Opcode::Hello
        | Opcode::Ping
        | Opcode::ListTables
        | Opcode::DescribeTable
        | Opcode::GetSpec
        | Opcode::ClusterStatus
        | Opcode::Metrics
        | Opcode::Get
        | Opcode::Digest
        | Opcode::Operator
        // A page is a read; the cursor names where it starts.
        | Opcode::Scan
        // The same spec again gives the same epoch; sealing a sealed version is answered
        // VERSION_SEALED, which the client takes as done; the same version made current again.
        | Opcode::SetSpec
        | Opcode::SealVersion
        | Opcode::SetCurrent => true,
        // A repeat starts another export: the copier reads from the start again. RAFT is
        // between servers only, and Raft itself handles repeats. A repeated RECOVER is refused
        // (its generation is no longer above the server's), so the first answer must be read.
        // REPAIR is between servers only: a repeat empties the partitions again.
        Opcode::ExportPartition | Opcode::Raft | Opcode::Recover | Opcode::Repair => false,
        // A repeat is refused (TABLE_EXISTS, VERSION_EXISTS, NO_SUCH_...) or, for PUT and DELETE,
        // may undo a concurrent writer's newer value and miscounts deletions.
        Opcode::Put
        | Opcode::Delete
        | Opcode::CreateTable
        | Opcode::DropTable
        | Opcode::CreateVersion
        | Opcode::DropVersion => false,
    }
}

/// Whether a request that failed with `e` on `conn` may be sent once more on a fresh connection
/// (rules 2 and 3 of the module); `frame_written`: the whole frame had been handed to the kernel.
pub(crate) fn may_resend(e: &Error, conn: &Conn, op: Opcode, frame_written: bool) -> bool {
    conn.reused
        && matches!(e, Error::Io { .. })
        && !conn.reply_started()
        && (!frame_written || idempotent(op))
}

impl Inner {
    /// Remembers the smallest frame body limit a server announced in HELLO.
    pub(crate) fn note_max_body(&self, max_body: u32) {
        let mb = u64::from(max_body);
        let _ = self
            .max_body
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                (cur == 0 || mb < cur).then_some(mb)
            });
    }
}

/// How long a write's primary may take at least: it answers once every replica applied the write,
/// and a silent replica holds it until the control plane fails that replica over (5 s by default,
/// then the spec change; an election first when it was the leader). Capped by the call's deadline.
const WRITE_REPLY_WAIT: Duration = Duration::from_secs(20);

/// How long to wait for the reply to an `op` frame, for a request timeout of `timeout`.
fn reply_wait(op: Opcode, timeout: Duration) -> Duration {
    match op {
        Opcode::Put | Opcode::Delete => timeout.max(WRITE_REPLY_WAIT),
        _ => timeout,
    }
}

impl Client {
    /// A connection to `pool`'s server: a live pooled one unless `fresh`, else a new one (connect
    /// and HELLO, both within the connect timeout: a server that accepts but never greets is as
    /// unreachable as one that refuses).
    pub(crate) fn checkout(&self, pool: &Pool, fresh: bool) -> Result<Conn> {
        if !fresh {
            if let Some(c) = pool.take_idle() {
                return Ok(c);
            }
        }
        let s = &self.inner.settings;
        let (conn, max_body) = Conn::open(
            &pool.addr,
            s,
            s.connect_timeout,
            s.connect_timeout.min(s.timeout),
        )?;
        self.inner.note_max_body(max_body);
        Ok(conn)
    }

    pub(crate) fn put_back(&self, pool: &Pool, conn: Conn) {
        pool.put_back(conn, self.inner.settings.pool_size);
    }

    /// Takes a server out of rotation until a probe succeeds (see `health.rs`).
    pub(crate) fn mark_down(&self, pool: &Pool) {
        pool.clear();
        pool.health.mark_down();
        self.inner.prober.kick(&self.inner);
    }

    /// Takes a server out of rotation for reads until a probe succeeds (see `health.rs`).
    pub(crate) fn mark_slow(&self, pool: &Pool) {
        pool.health.mark_slow();
        self.inner.prober.kick(&self.inner);
    }

    /// `e` after marking the server down if the failure is the server's.
    fn failed(&self, pool: &Pool, e: Error) -> Error {
        if e.is_transport() {
            self.mark_down(pool);
        }
        e
    }

    /// One request to one server, its reply handed to `take`.
    pub(crate) fn request(
        &self,
        pool: &Pool,
        req: &Request<'_>,
        take: impl FnOnce(Response<'_>) -> Result<()>,
    ) -> Result<()> {
        let op = req.opcode();
        let mut fresh = false;
        loop {
            let mut conn = self
                .checkout(pool, fresh)
                .map_err(|e| self.failed(pool, e))?;
            let id = conn.next_request_id();
            let mut buf = std::mem::take(&mut conn.wbuf);
            buf.clear();
            req.encode(&mut buf, id).map_err(encode_err)?;
            let deadline = deadline::after(self.inner.settings.timeout);
            let sent = conn.send(&pool.addr, &buf, id, op, deadline);
            conn.wbuf = buf;
            if let Err(e) = sent {
                if !fresh && may_resend(&e, &conn, op, false) {
                    fresh = true;
                    continue;
                }
                return Err(self.failed(pool, e));
            }
            let out = match conn.recv(&pool.addr, deadline) {
                Ok(reply) => {
                    let resp =
                        Response::decode_body(op, reply.body).map_err(|e| Error::Protocol {
                            server: pool.addr.clone(),
                            message: e.to_string(),
                        })?;
                    take(resp)
                }
                Err(e) => {
                    if !fresh && may_resend(&e, &conn, op, true) {
                        fresh = true;
                        continue;
                    }
                    return Err(self.failed(pool, e));
                }
            };
            pool.health.mark_up();
            self.put_back(pool, conn);
            return out;
        }
    }

    /// Checks out a connection to server `s` and writes one frame (built by `encode`) on it,
    /// resending once on a fresh connection as the retry rule allows. `Ok(Err(e))`: the server
    /// failed (marked down if the failure is its own).
    pub(crate) fn send_frame(
        &self,
        topo: &Topology,
        s: usize,
        op: Opcode,
        mut fresh: bool,
        encode: &mut impl FnMut(usize, &mut Vec<u8>, u64) -> Result<()>,
    ) -> std::result::Result<Result<(Conn, Instant)>, OpError> {
        let pool = &topo.pools[s];
        loop {
            let mut conn = match self.checkout(pool, fresh) {
                Ok(c) => c,
                Err(e) if e.is_transport() => return Ok(Err(self.failed(pool, e))),
                Err(e) => return Err(e.into()),
            };
            let id = conn.next_request_id();
            let mut buf = std::mem::take(&mut conn.wbuf);
            buf.clear();
            encode(s, &mut buf, id)?;
            let deadline = deadline::after(reply_wait(op, self.inner.settings.timeout));
            let sent = conn.send(&pool.addr, &buf, id, op, deadline);
            // Keep a connection's buffer for its next frame, unless one huge batch made it huge.
            if buf.capacity() <= 4 * CHUNK_BODY / 16 {
                conn.wbuf = buf;
            }
            match sent {
                Ok(()) => return Ok(Ok((conn, deadline))),
                Err(e) if !fresh && may_resend(&e, &conn, op, false) => fresh = true,
                Err(e) => return Ok(Err(self.failed(pool, e))),
            }
        }
    }

    /// Writes one frame to each server in `servers` (built by `encode(server, buf, request_id)`), then
    /// reads every reply and hands it to `handle`. Returns the servers that failed, with why; a
    /// `handle` error stops the exchange.
    pub(crate) fn exchange(
        &self,
        topo: &Topology,
        servers: impl Iterator<Item = usize>,
        op: Opcode,
        mut encode: impl FnMut(usize, &mut Vec<u8>, u64) -> Result<()>,
        mut handle: impl FnMut(usize, Response<'_>) -> std::result::Result<Handled, OpError>,
    ) -> std::result::Result<Vec<(usize, Error)>, OpError> {
        let mut failed = Vec::new();
        // Each server's wait starts when its frame is written, so a server that blocks the write
        // (a full socket buffer) does not eat the time of the servers after it.
        let mut inflight: Vec<(usize, Conn, Instant)> = Vec::new();
        for s in servers {
            match self.send_frame(topo, s, op, false, &mut encode)? {
                Ok((conn, deadline)) => inflight.push((s, conn, deadline)),
                Err(e) => failed.push((s, e)),
            }
        }
        for (s, mut conn, mut deadline) in inflight {
            let pool = &topo.pools[s];
            let mut resent = false;
            let handled = loop {
                match conn.recv(&pool.addr, deadline) {
                    Ok(reply) => {
                        break match Response::decode_body(op, reply.body) {
                            Ok(resp) => handle(s, resp),
                            Err(e) => Ok(Handled::Failed(Error::Protocol {
                                server: pool.addr.clone(),
                                message: e.to_string(),
                            })),
                        }
                    }
                    Err(e) => {
                        if resent || !may_resend(&e, &conn, op, true) {
                            break Ok(Handled::Failed(e));
                        }
                        resent = true;
                        match self.send_frame(topo, s, op, true, &mut encode)? {
                            Ok((c, d)) => (conn, deadline) = (c, d),
                            Err(e) => break Ok(Handled::Failed(e)),
                        }
                    }
                }
            };
            match handled {
                Ok(Handled::Ok) => {
                    pool.health.mark_up();
                    self.put_back(pool, conn);
                }
                Ok(Handled::Failed(e) | Handled::Refused { error: e, .. }) => {
                    // Not pooled unless the reply was read whole (a refusal of the request).
                    let e = self.failed(pool, e);
                    if !e.is_transport() {
                        self.put_back(pool, conn);
                    }
                    failed.push((s, e));
                }
                Err(e) => {
                    self.put_back(pool, conn);
                    return Err(e);
                }
            }
        }
        Ok(failed)
    }

    /// Sends one request to every server of the spec; every server must answer and accept.
    pub(crate) fn broadcast(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        table: &str,
        version: u32,
        mut take: impl FnMut(usize, Response<'_>) -> std::result::Result<(), OpError>,
    ) -> Result<()> {
        let failed = self
            .exchange(
                topo,
                0..topo.pools.len(),
                req.opcode(),
                |_, buf, id| req.encode(buf, id).map_err(encode_err),
                |s, resp| match resp {
                    Response::Error(e) => Err(crate::client::refusal(
                        s,
                        &topo.pools[s].addr,
                        table,
                        version,
                        e,
                    )),
                    other => take(s, other).map(|()| Handled::Ok),
                },
            )
            .map_err(stale_as_error)?;
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends one request to every server and collects each answer (refusals included) by server;
    /// every server must answer.
    pub(crate) fn ask_all<T>(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        take: impl FnMut(usize, Response<'_>) -> Result<T>,
    ) -> Result<Vec<Option<T>>> {
        let (out, failed) = self.ask(topo, req, 0..topo.pools.len(), take)?;
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(out),
        }
    }

    /// Like [`Client::ask_all`], for reads that can do with the servers that answer: servers that
    /// are down are not asked (unless all are), servers that fail are left out, and both are named
    /// in the second list. Fails only when no server answered, or on a refusal.
    pub(crate) fn ask_live<T>(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        take: impl FnMut(usize, Response<'_>) -> Result<T>,
    ) -> Result<(Vec<Option<T>>, Vec<String>)> {
        let n = topo.pools.len();
        let mut ask: Vec<usize> = (0..n).filter(|&s| !topo.pools[s].is_down()).collect();
        if ask.is_empty() {
            ask = (0..n).collect();
        }
        let mut unreachable: Vec<usize> = (0..n).filter(|s| !ask.contains(s)).collect();
        let (out, failed) = self.ask(topo, req, ask.into_iter(), take)?;
        let mut first = None;
        for (s, e) in failed {
            if !e.is_transport() {
                return Err(e);
            }
            unreachable.push(s);
            first.get_or_insert(e);
        }
        if let (true, Some(e)) = (unreachable.len() == n, first) {
            return Err(e);
        }
        unreachable.sort_unstable();
        let names = unreachable
            .into_iter()
            .map(|s| topo.pools[s].addr.clone())
            .collect();
        Ok((out, names))
    }

    fn ask<T>(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        servers: impl Iterator<Item = usize>,
        mut take: impl FnMut(usize, Response<'_>) -> Result<T>,
    ) -> Result<Answers<T>> {
        let mut out: Vec<Option<T>> = (0..topo.pools.len()).map(|_| None).collect();
        let failed = self
            .exchange(
                topo,
                servers,
                req.opcode(),
                |_, buf, id| req.encode(buf, id).map_err(encode_err),
                |s, resp| {
                    out[s] = Some(take(s, resp)?);
                    Ok(Handled::Ok)
                },
            )
            .map_err(stale_as_error)?;
        Ok((out, failed))
    }
}

/// Each server's answer (by server index), and the servers that failed with why.
type Answers<T> = (Vec<Option<T>>, Vec<(usize, Error)>);

fn stale_as_error(e: OpError) -> Error {
    match e {
        OpError::Fatal(e) => e,
        OpError::Stale(_, m) => Error::StaleSpec(m),
    }
}

#[cfg(test)]
mod tests {
    //! The retry rule against a scripted server: it answers HELLO and GET_SPEC, and on its first
    //! connection reads the second request and closes without a reply (as a server that died
    //! mid-request, or dropped the connection, would). A fresh connection answers everything.
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};

    use ramgrid_proto::native::{parse_frame, HelloOk, SpecReply};

    use super::*;
    use crate::client::ClientConfig;
    use crate::error::ErrorKind;
    use crate::ValueType;

    struct Fake {
        addr: String,
        /// Opcodes of the requests read (HELLO left out), in order over all connections.
        seen: Arc<Mutex<Vec<Opcode>>>,
    }

    impl Fake {
        fn start() -> Fake {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let log = seen.clone();
            std::thread::spawn(move || {
                for (n, conn) in listener.incoming().enumerate() {
                    let Ok(conn) = conn else { return };
                    let log = log.clone();
                    std::thread::spawn(move || serve(conn, n == 0, &log));
                }
            });
            Fake { addr, seen }
        }

        fn seen(&self) -> Vec<Opcode> {
            self.seen.lock().unwrap().clone()
        }
    }

    fn serve(mut conn: TcpStream, first: bool, log: &Mutex<Vec<Opcode>>) {
        let mut buf = Vec::new();
        let mut answered = 0;
        loop {
            let (op, id, used) = loop {
                if let Ok((f, used)) = parse_frame(&buf, 1 << 20) {
                    break (f.opcode, f.request_id, used);
                }
                let mut chunk = [0u8; 4096];
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            buf.drain(..used);
            let resp = match op {
                Opcode::Hello => Response::Hello(HelloOk {
                    protocol_version: 1,
                    server_id: "fake",
                    epoch: 0,
                    max_body: 1 << 20,
                }),
                _ => {
                    log.lock().unwrap().push(op);
                    if first && answered == 1 {
                        return; // read, not answered: the connection closes
                    }
                    answered += 1;
                    match op {
                        Opcode::GetSpec => Response::Spec(SpecReply {
                            epoch: 0,
                            spec: b"",
                        }),
                        _ => Response::Done,
                    }
                }
            };
            let mut out = Vec::new();
            resp.encode(&mut out, op, id).unwrap();
            conn.write_all(&out).unwrap();
        }
    }

    fn client(fake: &Fake) -> Client {
        Client::new(ClientConfig::new(vec![fake.addr.clone()])).unwrap()
    }

    #[test]
    fn an_idempotent_request_is_resent_once_on_a_fresh_connection() {
        let fake = Fake::start();
        let c = client(&fake);
        c.refresh_spec().unwrap(); // leaves the first connection pooled
        c.refresh_spec()
            .expect("GET_SPEC lost on a pooled connection is sent again");
        assert_eq!(fake.seen(), [Opcode::GetSpec; 3]);
    }

    #[test]
    fn a_write_whose_frame_was_written_is_not_resent() {
        let fake = Fake::start();
        let c = client(&fake);
        c.refresh_spec().unwrap();
        let err = c.create_table("t", 4, 1, ValueType::I64).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
        // The server may have created the table before the connection dropped: not sent twice.
        assert_eq!(fake.seen(), [Opcode::GetSpec, Opcode::CreateTable]);
    }

    #[test]
    fn every_opcode_is_classified() {
        let reads = [Opcode::Get, Opcode::DescribeTable, Opcode::ListTables];
        assert!(reads.into_iter().all(idempotent));
        let writes = [Opcode::Put, Opcode::Delete, Opcode::CreateVersion];
        assert!(!writes.into_iter().any(idempotent));
    }
}
