//! Exchanges with servers: checking out a connection (pooled, or fresh with HELLO), one request to
//! one server, and the fan-out of one frame to each of several servers.

use std::sync::atomic::Ordering;
use std::time::Instant;

use ramgrid_proto::native::{Hello, Opcode, Request, Response, Status, PROTOCOL_VERSION};

use crate::client::{
    encode_err, refusal, unexpected, Client, Handled, OpError, Topology, CHUNK_BODY,
};
use crate::conn::{Conn, Pool};
use crate::error::{Error, Result};

impl Client {
    pub(crate) fn checkout(&self, pool: &Pool) -> Result<Conn> {
        if let Some(c) = pool.take_idle() {
            return Ok(c);
        }
        let mut conn = Conn::connect(&pool.addr, &self.inner.settings)?;
        let token = self
            .inner
            .settings
            .token
            .as_deref()
            .unwrap_or("")
            .as_bytes();
        let hello = Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            token,
            client_name: &self.inner.settings.client_name,
        });
        let id = conn.next_request_id();
        let mut buf = std::mem::take(&mut conn.wbuf);
        buf.clear();
        hello.encode(&mut buf, id).map_err(encode_err)?;
        let deadline = Instant::now() + self.inner.settings.timeout;
        conn.send(&pool.addr, &buf, id, Opcode::Hello, deadline)?;
        conn.wbuf = buf;
        let reply = conn.recv(&pool.addr, deadline)?;
        match Response::decode_body(Opcode::Hello, reply.body) {
            Ok(Response::Hello(h)) => {
                let mb = u64::from(h.max_body);
                let _ =
                    self.inner
                        .max_body
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                            (cur == 0 || mb < cur).then_some(mb)
                        });
            }
            Ok(Response::Error(e))
                if matches!(e.status, Status::AuthFailed | Status::AuthRequired) =>
            {
                return Err(Error::Auth {
                    server: pool.addr.clone(),
                    message: format!("{} {}", e.status.name(), e.message),
                })
            }
            Ok(other) => return Err(unexpected(&pool.addr, &other)),
            Err(e) => {
                return Err(Error::Protocol {
                    server: pool.addr.clone(),
                    message: e.to_string(),
                })
            }
        }
        Ok(conn)
    }

    pub(crate) fn put_back(&self, pool: &Pool, conn: Conn) {
        pool.put_back(conn, self.inner.settings.pool_size);
    }

    /// One request to one server, its reply handed to `take`.
    pub(crate) fn request(
        &self,
        pool: &Pool,
        req: &Request<'_>,
        take: impl FnOnce(Response<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut conn = self.checkout(pool)?;
        let id = conn.next_request_id();
        let mut buf = std::mem::take(&mut conn.wbuf);
        buf.clear();
        req.encode(&mut buf, id).map_err(encode_err)?;
        let deadline = Instant::now() + self.inner.settings.timeout;
        let sent = conn.send(&pool.addr, &buf, id, req.opcode(), deadline);
        conn.wbuf = buf;
        sent.inspect_err(|e| {
            if e.is_transport() {
                pool.mark_down()
            }
        })?;
        let out = {
            let reply = conn.recv(&pool.addr, deadline).inspect_err(|e| {
                if e.is_transport() {
                    pool.mark_down()
                }
            })?;
            let resp =
                Response::decode_body(req.opcode(), reply.body).map_err(|e| Error::Protocol {
                    server: pool.addr.clone(),
                    message: e.to_string(),
                })?;
            take(resp)
        };
        pool.mark_up();
        self.put_back(pool, conn);
        out
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
            let pool = &topo.pools[s];
            let mut conn = match self.checkout(pool) {
                Ok(c) => c,
                Err(e) if e.is_transport() => {
                    pool.mark_down();
                    failed.push((s, e));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let id = conn.next_request_id();
            let mut buf = std::mem::take(&mut conn.wbuf);
            buf.clear();
            encode(s, &mut buf, id)?;
            let deadline = Instant::now() + self.inner.settings.timeout;
            let sent = conn.send(&pool.addr, &buf, id, op, deadline);
            // Keep a connection's buffer for its next frame, unless one huge batch made it huge.
            if buf.capacity() <= 4 * CHUNK_BODY / 16 {
                conn.wbuf = buf;
            }
            match sent {
                Ok(()) => inflight.push((s, conn, deadline)),
                Err(e) => {
                    pool.mark_down();
                    failed.push((s, e));
                }
            }
        }
        for (s, mut conn, deadline) in inflight {
            let pool = &topo.pools[s];
            let handled = match conn.recv(&pool.addr, deadline) {
                Ok(reply) => match Response::decode_body(op, reply.body) {
                    Ok(resp) => handle(s, resp),
                    Err(e) => Ok(Handled::Failed(Error::Protocol {
                        server: pool.addr.clone(),
                        message: e.to_string(),
                    })),
                },
                Err(e) => Ok(Handled::Failed(e)),
            };
            match handled {
                Ok(Handled::Ok) => {
                    pool.mark_up();
                    self.put_back(pool, conn);
                }
                Ok(Handled::Failed(e)) => {
                    if e.is_transport() {
                        pool.mark_down();
                    } else {
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
                    Response::Error(e) => Err(refusal(s, &topo.pools[s].addr, table, version, e)),
                    other => take(s, other).map(|()| Handled::Ok),
                },
            )
            .map_err(|e| match e {
                OpError::Fatal(e) => e,
                OpError::Stale(_, m) => Error::StaleSpec(m),
            })?;
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends one request to every server and collects each answer (refusals included) by server.
    pub(crate) fn ask_all<T>(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        mut take: impl FnMut(usize, Response<'_>) -> Result<T>,
    ) -> Result<Vec<Option<T>>> {
        let mut out: Vec<Option<T>> = (0..topo.pools.len()).map(|_| None).collect();
        let failed = self
            .exchange(
                topo,
                0..topo.pools.len(),
                req.opcode(),
                |_, buf, id| req.encode(buf, id).map_err(encode_err),
                |s, resp| {
                    out[s] = Some(take(s, resp)?);
                    Ok(Handled::Ok)
                },
            )
            .map_err(|e| match e {
                OpError::Fatal(e) => e,
                OpError::Stale(_, m) => Error::StaleSpec(m),
            })?;
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(out),
        }
    }
}
