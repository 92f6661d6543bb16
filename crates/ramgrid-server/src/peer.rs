//! A blocking native-protocol connection from this server to a peer, for the repair thread
//! (spec, catalog and partition copies). One request at a time, every step under a timeout, so
//! a dead or hung peer costs a timeout and never a stuck thread. When the server has TLS the
//! connection is TLS too (`crate::tls`), under the same socket timeouts.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use ramgrid_proto::native::{
    parse_frame, ErrorReply, FrameError, Hello, Request, Response, PROTOCOL_VERSION,
};

/// How long one request to a peer may take, and its connect.
const TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What went wrong talking to a peer.
#[derive(Debug)]
pub enum PeerError {
    /// The peer answered with a refusal.
    Refused(ErrorReply),
    /// Connect, I/O, timeout or a malformed reply.
    Failed(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Refused(e) => write!(f, "{} {}", e.status.name(), e.message),
            PeerError::Failed(m) => f.write_str(m),
        }
    }
}

/// A peer connection's byte stream: plain TCP or TLS over it.
trait Wire: Read + Write + Send {}
impl<T: Read + Write + Send> Wire for T {}

/// An open, authenticated connection to one peer.
pub struct Peer {
    addr: String,
    sock: Box<dyn Wire>,
    buf: Vec<u8>,
    next_id: u64,
}

impl Peer {
    /// Connects to `addr` (over TLS when `tls` is given) and says HELLO with `token`.
    pub fn connect(
        addr: &str,
        token: Option<&str>,
        tls: Option<&crate::tls::Tls>,
    ) -> Result<Peer, PeerError> {
        let failed =
            |what: &str, e: std::io::Error| PeerError::Failed(format!("{addr}: {what}: {e}"));
        let sa = addr
            .to_socket_addrs()
            .map_err(|e| failed("resolve", e))?
            .next()
            .ok_or_else(|| PeerError::Failed(format!("{addr}: no address")))?;
        let sock =
            TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT).map_err(|e| failed("connect", e))?;
        sock.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| failed("socket", e))?;
        sock.set_write_timeout(Some(TIMEOUT))
            .map_err(|e| failed("socket", e))?;
        let _ = sock.set_nodelay(true);
        let sock: Box<dyn Wire> = match tls {
            None => Box::new(sock),
            Some(tls) => {
                let config = tls.peer_config().map_err(PeerError::Failed)?;
                let name = crate::tls::server_name(addr).map_err(PeerError::Failed)?;
                let conn = rustls::ClientConnection::new(config, name)
                    .map_err(|e| PeerError::Failed(format!("{addr}: TLS: {e}")))?;
                // The handshake runs on the first write (HELLO), under the socket timeouts.
                Box::new(rustls::StreamOwned::new(conn, sock))
            }
        };
        let mut peer = Peer {
            addr: addr.to_owned(),
            sock,
            buf: Vec::new(),
            next_id: 1,
        };
        let hello = Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            token: token.unwrap_or("").as_bytes(),
            client_name: "ramgrid-server repair",
        });
        peer.call(&hello, |r| match r {
            Response::Hello(_) => Ok(()),
            other => Err(format!("unexpected reply to HELLO: {other:?}")),
        })?;
        Ok(peer)
    }

    /// The peer's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `req` and hands its decoded OK reply to `f`; a refusal is [`PeerError::Refused`].
    pub fn call<T>(
        &mut self,
        req: &Request<'_>,
        f: impl FnOnce(Response<'_>) -> Result<T, String>,
    ) -> Result<T, PeerError> {
        let addr = self.addr.clone();
        let failed = |m: String| PeerError::Failed(format!("{addr}: {m}"));
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        req.encode(&mut out, id)
            .map_err(|e| failed(format!("encode: {e}")))?;
        self.sock
            .write_all(&out)
            .and_then(|_| self.sock.flush())
            .map_err(|e| failed(format!("write: {e}")))?;
        self.buf.clear();
        let mut have = 0usize;
        loop {
            match parse_frame(&self.buf[..have], usize::MAX) {
                Ok((frame, _)) => {
                    if frame.request_id != id || frame.opcode != req.opcode() {
                        return Err(failed("reply to another request".into()));
                    }
                    return match Response::decode(&frame) {
                        Ok(Response::Error(e)) => Err(PeerError::Refused(e)),
                        Ok(r) => f(r).map_err(failed),
                        Err(e) => Err(failed(format!("malformed reply: {e}"))),
                    };
                }
                Err(FrameError::Incomplete { needed }) => {
                    if self.buf.len() < needed {
                        self.buf.resize(needed.max(64 << 10), 0);
                    }
                    let n = self
                        .sock
                        .read(&mut self.buf[have..])
                        .map_err(|e| failed(format!("read: {e}")))?;
                    if n == 0 {
                        return Err(failed("connection closed".into()));
                    }
                    have += n;
                }
                Err(e) => return Err(failed(format!("bad reply frame: {e}"))),
            }
        }
    }
}
