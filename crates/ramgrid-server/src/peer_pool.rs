//! Asynchronous server-to-server requests: native-protocol connections to peers, kept in a small
//! pool per address. The metadata group sends its Raft messages and the leader's health checks
//! through one on its runtime (`meta/transport.rs`); each worker thread forwards a primary's writes
//! to the backups through its own (`replicate.rs`).
//!
//! Every call ends by its deadline, connect and HELLO included, so a dead or paused peer costs
//! a timeout and never a stuck task. A connection that failed in any way is dropped, never
//! reused: its stream may hold half a reply. When the server has TLS, so do these connections
//! (`crate::tls`), the handshake under the same deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ramgrid_proto::native::{parse_frame, FrameError, Hello, Request, Response, PROTOCOL_VERSION};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// Idle connections kept per peer.
const POOLED_PER_PEER: usize = 4;
/// The largest reply accepted from a peer (a Raft snapshot chunk or a batch of entries).
const MAX_REPLY: usize = ramgrid_meta::network::MAX_FRAME;

/// Why a call to a peer failed.
#[derive(Debug)]
pub enum CallError {
    /// Not connected: the request certainly did not reach it.
    Unreachable(String),
    /// No whole reply by the deadline: it may have been delivered.
    Timeout,
    /// Failed after the request may have been delivered (I/O, a refusal, a malformed reply).
    Failed(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(why) => write!(f, "unreachable: {why}"),
            CallError::Timeout => f.write_str("no reply in time"),
            CallError::Failed(why) => f.write_str(why),
        }
    }
}

/// A connection's byte stream: plain TCP or TLS over it.
trait Wire: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Wire for T {}

/// One authenticated connection.
struct Conn {
    sock: Box<dyn Wire>,
    buf: Vec<u8>,
    next_id: u64,
}

impl Conn {
    async fn open(
        addr: &str,
        token: Option<&str>,
        tls: Option<&crate::tls::Tls>,
        deadline: Instant,
    ) -> Result<Conn, CallError> {
        let sock = match timeout_at(deadline, TcpStream::connect(addr)).await {
            Err(_) => return Err(CallError::Unreachable("connect timed out".into())),
            Ok(Err(e)) => return Err(CallError::Unreachable(e.to_string())),
            Ok(Ok(s)) => s,
        };
        let _ = sock.set_nodelay(true);
        let sock: Box<dyn Wire> = match tls {
            None => Box::new(sock),
            Some(tls) => {
                let config = tls.peer_config().map_err(CallError::Unreachable)?;
                let name = crate::tls::server_name(addr).map_err(CallError::Unreachable)?;
                let connector = tokio_rustls::TlsConnector::from(config);
                match timeout_at(deadline, connector.connect(name, sock)).await {
                    Err(_) => return Err(CallError::Unreachable("TLS handshake timed out".into())),
                    Ok(Err(e)) => return Err(CallError::Unreachable(format!("TLS: {e}"))),
                    Ok(Ok(s)) => Box::new(s),
                }
            }
        };
        let mut conn = Conn {
            sock,
            buf: Vec::new(),
            next_id: 1,
        };
        let hello = Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            token: token.unwrap_or("").as_bytes(),
            client_name: "ramgrid-server peer",
        });
        conn.call(&hello, deadline, |r| match r {
            Response::Hello(_) => Ok(()),
            other => Err(format!("unexpected reply to HELLO: {other:?}")),
        })
        .await
        .map_err(|e| match e {
            // Not through HELLO: nothing else was sent.
            CallError::Failed(why) | CallError::Unreachable(why) => CallError::Unreachable(why),
            CallError::Timeout => CallError::Unreachable("HELLO timed out".into()),
        })?;
        Ok(conn)
    }

    /// Whether the peer still holds this idle connection open: one read polled without waiting
    /// finds nothing to read (an idle connection gets no bytes; a closed one reads end or error).
    fn open_at_peer(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut byte);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::Pin::new(&mut self.sock)
            .poll_read(&mut cx, &mut buf)
            .is_pending()
    }

    /// Sends `req` and hands its decoded reply to `take`.
    async fn call<T>(
        &mut self,
        req: &Request<'_>,
        deadline: Instant,
        take: impl FnOnce(Response<'_>) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let encode = |out: &mut Vec<u8>, id: u64| req.encode(out, id).map_err(|e| e.to_string());
        self.call_with(None, encode, deadline, take).await
    }

    /// Sends the frame `encode` appends for a request id (`id`, or the connection's next one),
    /// and hands its decoded reply to `take`.
    async fn call_with<T>(
        &mut self,
        id: Option<u64>,
        encode: impl FnOnce(&mut Vec<u8>, u64) -> Result<(), String>,
        deadline: Instant,
        take: impl FnOnce(Response<'_>) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let id = id.unwrap_or_else(|| {
            self.next_id += 1;
            self.next_id - 1
        });
        let mut out = Vec::new();
        encode(&mut out, id).map_err(|e| CallError::Failed(format!("cannot encode: {e}")))?;
        let io = |e: std::io::Error| CallError::Failed(e.to_string());
        let write = async {
            self.sock.write_all(&out).await?;
            self.sock.flush().await
        };
        match timeout_at(deadline, write).await {
            Err(_) => return Err(CallError::Timeout),
            Ok(r) => r.map_err(io)?,
        }
        self.buf.clear();
        let mut chunk = [0u8; 64 << 10];
        loop {
            match parse_frame(&self.buf, MAX_REPLY) {
                Ok((frame, _)) => {
                    if frame.request_id != id {
                        return Err(CallError::Failed("reply to another request".into()));
                    }
                    let resp = Response::decode(&frame)
                        .map_err(|e| CallError::Failed(format!("malformed reply: {e}")))?;
                    return take(resp).map_err(CallError::Failed);
                }
                Err(FrameError::Incomplete { .. }) => {}
                Err(e) => return Err(CallError::Failed(format!("malformed reply: {e}"))),
            }
            let n = match timeout_at(deadline, self.sock.read(&mut chunk)).await {
                Err(_) => return Err(CallError::Timeout),
                Ok(r) => r.map_err(io)?,
            };
            if n == 0 {
                return Err(CallError::Failed("connection closed".into()));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Connections to peers, reused across calls.
pub struct Pool {
    token: Option<String>,
    tls: Option<Arc<crate::tls::Tls>>,
    idle: Mutex<HashMap<String, Vec<Conn>>>,
}

impl Pool {
    /// A pool that authenticates with `token`, over TLS when `tls` is given.
    pub fn new(token: Option<String>, tls: Option<Arc<crate::tls::Tls>>) -> Pool {
        Pool {
            token,
            tls,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// One request to `addr`, ending by `deadline`.
    pub async fn call<T>(
        &self,
        addr: &str,
        req: &Request<'_>,
        deadline: Instant,
        take: impl FnOnce(Response<'_>) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let encode = |out: &mut Vec<u8>, id: u64| req.encode(out, id).map_err(|e| e.to_string());
        self.call_with(addr, None, encode, deadline, take).await
    }

    /// One request to `addr` whose frame `encode` appends for a request id (`id`, or the
    /// connection's next one), ending by `deadline`.
    pub async fn call_with<T>(
        &self,
        addr: &str,
        id: Option<u64>,
        encode: impl FnOnce(&mut Vec<u8>, u64) -> Result<(), String>,
        deadline: Instant,
        take: impl FnOnce(Response<'_>) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(addr)
            .and_then(Vec::pop);
        // A pooled connection the peer closed meanwhile (it restarted or died) is dropped before
        // use: a request written into it would end as "connection closed", indeterminate.
        let mut conn = match pooled.and_then(|mut c| c.open_at_peer().then_some(c)) {
            Some(c) => c,
            None => Conn::open(addr, self.token.as_deref(), self.tls.as_deref(), deadline).await?,
        };
        let r = conn.call_with(id, encode, deadline, take).await;
        if r.is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let list = idle.entry(addr.to_owned()).or_default();
            if list.len() < POOLED_PER_PEER {
                list.push(conn);
            }
        }
        r
    }

    /// CLUSTER_STATUS of `addr`, as `(key, value)` lines.
    pub async fn status(
        &self,
        addr: &str,
        deadline: Instant,
    ) -> Result<Vec<(String, String)>, CallError> {
        self.call(addr, &Request::ClusterStatus, deadline, |r| match r {
            Response::Status(text) => Ok(text
                .lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()),
            other => Err(format!("unexpected reply to CLUSTER_STATUS: {other:?}")),
        })
        .await
    }
}
