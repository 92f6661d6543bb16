//! One blocking connection to one server, and the per-server pool of idle connections.
//!
//! Each connection carries one request at a time: the fan-out writes a frame on one connection per
//! server, then reads each reply, so the servers work at the same time without any thread per server.
//! A connection that saw any error (I/O, timeout, a reply it could not parse) is dropped, never pooled:
//! it may hold half a reply, and the next request would read garbage. A pooled connection is checked
//! before reuse ([`Conn::is_alive`]): one the server closed while it sat idle (a restart) is dropped
//! before a request is written on it.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ramgrid_proto::native::{
    parse_frame, FrameError, Hello, Opcode, Request, Response, Status, PROTOCOL_VERSION,
};

use crate::deadline;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::tls::{ClientTls, Stream};

/// Largest reply body the client accepts (a GET of many large values); a longer header means the
/// stream is out of sync.
pub(crate) const MAX_REPLY_BODY: usize = 1 << 31;
const READ_CHUNK: usize = 64 * 1024;
/// How long a read past the request deadline may wait for bytes (see [`Conn::fill`]).
const LATE_READ: Duration = Duration::from_millis(1);
/// How long a read polls the socket without blocking before it sleeps in the kernel. A reply to a
/// batch usually arrives within tens of microseconds; sleeping for it costs a context switch on
/// each side, and on a virtual machine an idle vCPU that halts needs an interrupt to wake, which
/// costs more than the wait itself. Bounded, so an idle or slow server costs at most this much CPU.
const SPIN: Duration = Duration::from_micros(50);
/// The first byte of a TLS alert record: what a TLS server answers a plain-text frame with.
const TLS_ALERT: u8 = 0x15;
/// Longest text line read from a server that answers a native frame with text (its refusal).
const MAX_REFUSAL_LINE: usize = 512;

/// Connection settings shared by every pool of a client.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) timeout: Duration,
    pub(crate) token: Option<String>,
    /// TLS to every server, when configured.
    pub(crate) tls: Option<ClientTls>,
    pub(crate) pool_size: usize,
    pub(crate) client_name: String,
}

/// An open, authenticated connection.
pub(crate) struct Conn {
    stream: Stream,
    /// Where the next request frame is encoded (kept between requests to avoid reallocating).
    pub(crate) wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    /// Bytes at the front of `rbuf` that belong to the last reply handed out.
    consumed: usize,
    next_id: u64,
    last_id: u64,
    last_op: Opcode,
    /// A request was sent and its reply not yet read whole: the connection cannot carry another.
    awaiting: bool,
    /// Taken from the pool (it carried an earlier exchange), as opposed to opened for this request.
    pub(crate) reused: bool,
}

/// One reply frame, borrowed from its connection's read buffer until the next request.
pub(crate) struct Reply<'c> {
    pub(crate) body: &'c [u8],
}

fn io_err(server: &str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => deadline::timeout_error(server),
        _ => Error::Io {
            server: server.to_string(),
            source: e,
        },
    }
}

impl Conn {
    /// Connects and says HELLO, bounded by `connect_timeout` for the connection and `timeout` for
    /// the greeting (both capped by the call's deadline). Returns the connection and the server's
    /// largest accepted frame body.
    pub(crate) fn open(
        server: &str,
        settings: &ConnSettings,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<(Conn, u32)> {
        let deadline = deadline::after(timeout);
        let connect_timeout =
            connect_timeout.min(deadline.saturating_duration_since(Instant::now()));
        if connect_timeout.is_zero() {
            return Err(deadline::timeout_error(server));
        }
        let mut conn = Conn::connect(server, connect_timeout, settings.tls.as_ref())?;
        let token = settings.token.as_deref().unwrap_or("").as_bytes();
        let hello = Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            token,
            client_name: &settings.client_name,
        });
        let id = conn.next_request_id();
        let mut buf = std::mem::take(&mut conn.wbuf);
        buf.clear();
        hello
            .encode(&mut buf, id)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode HELLO: {e}")))?;
        let tls = conn.handshaking();
        conn.send(server, &buf, id, Opcode::Hello, deadline)
            .map_err(|e| in_handshake(tls, e))?;
        conn.wbuf = buf;
        let tls = conn.handshaking();
        let reply = conn
            .recv(server, deadline)
            .map_err(|e| in_handshake(tls, e))?;
        let max_body = match Response::decode_body(Opcode::Hello, reply.body) {
            Ok(Response::Hello(h)) => h.max_body,
            Ok(Response::Error(e))
                if matches!(e.status, Status::AuthFailed | Status::AuthRequired) =>
            {
                return Err(Error::Auth {
                    server: server.to_string(),
                    message: format!("{} {}", e.status.name(), e.message),
                })
            }
            Ok(other) => {
                return Err(Error::Protocol {
                    server: server.to_string(),
                    message: format!(
                        "unexpected reply to HELLO: {}",
                        format!("{other:?}").chars().take(80).collect::<String>()
                    ),
                })
            }
            Err(e) => {
                return Err(Error::Protocol {
                    server: server.to_string(),
                    message: e.to_string(),
                })
            }
        };
        Ok((conn, max_body))
    }

    /// Connects (bounded by `connect_timeout`) and sets up the socket, and TLS over it if `tls`.
    fn connect(server: &str, connect_timeout: Duration, tls: Option<&ClientTls>) -> Result<Conn> {
        let addrs: Vec<SocketAddr> = server
            .to_socket_addrs()
            .map_err(|e| Error::Connect {
                server: server.to_string(),
                source: e,
            })?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, connect_timeout) {
                Ok(stream) => {
                    // Frames are written whole; Nagle would only delay the last segment of each.
                    stream.set_nodelay(true).map_err(|e| Error::Connect {
                        server: server.to_string(),
                        source: e,
                    })?;
                    let stream = match tls {
                        None => Stream::Plain(stream),
                        Some(tls) => tls.wrap(server, stream)?,
                    };
                    return Ok(Conn {
                        stream,
                        wbuf: Vec::new(),
                        rbuf: Vec::with_capacity(READ_CHUNK),
                        consumed: 0,
                        next_id: 1,
                        last_id: 0,
                        last_op: Opcode::Ping,
                        awaiting: false,
                        reused: false,
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(Error::Connect {
            server: server.to_string(),
            source: last,
        })
    }

    /// A fresh request id for the next frame (the caller encodes the frame with it).
    pub(crate) fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Writes one whole request frame (encoded with id `id` and opcode `op`) before `deadline`.
    pub(crate) fn send(
        &mut self,
        server: &str,
        frame: &[u8],
        id: u64,
        op: Opcode,
        deadline: Instant,
    ) -> Result<()> {
        // Drop the previous reply's bytes (only one request is ever in flight, so all of them): from
        // here on, bytes in `rbuf` are this request's reply.
        self.rbuf.drain(..self.consumed);
        self.consumed = 0;
        self.last_id = id;
        self.last_op = op;
        self.awaiting = true;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(deadline::timeout_error(server));
        }
        self.stream
            .tcp()
            .set_write_timeout(Some(left))
            .map_err(|e| io_err(server, e))?;
        self.stream.write_all(frame).map_err(|e| io_err(server, e))
    }

    /// Reads the reply to the last request sent, waiting at most until `deadline`.
    pub(crate) fn recv(&mut self, server: &str, deadline: Instant) -> Result<Reply<'_>> {
        // Normally a no-op: `send` already dropped the previous reply.
        if self.consumed > 0 {
            self.rbuf.drain(..self.consumed);
            self.consumed = 0;
        }
        loop {
            match parse_frame(&self.rbuf, MAX_REPLY_BODY) {
                Ok((frame, used)) => {
                    if !frame.is_response()
                        || frame.request_id != self.last_id
                        || frame.opcode != self.last_op
                    {
                        return Err(Error::Protocol {
                            server: server.to_string(),
                            message: format!(
                                "reply {} #{} does not answer request {} #{}",
                                frame.opcode.name(),
                                frame.request_id,
                                self.last_op.name(),
                                self.last_id
                            ),
                        });
                    }
                    self.consumed = used;
                    self.awaiting = false;
                    let body = &self.rbuf[used - frame.body.len()..used];
                    return Ok(Reply { body });
                }
                Err(FrameError::Incomplete { needed }) => {
                    let want = needed.max(self.rbuf.len() + 1);
                    if let Err(e) = self.fill(server, want, deadline) {
                        // A TLS server closes after its alert, shorter than a frame header.
                        return Err(self.tls_alert(server).unwrap_or(e));
                    }
                }
                Err(FrameError::BadMagic(TLS_ALERT)) if self.tls_alert(server).is_some() => {
                    return Err(self.tls_alert(server).expect("checked"))
                }
                Err(FrameError::BadMagic(_)) if self.rbuf[0].is_ascii_graphic() => {
                    return Err(self.refusal(server, deadline))
                }
                Err(e) => {
                    return Err(Error::Protocol {
                        server: server.to_string(),
                        message: e.to_string(),
                    })
                }
            }
        }
    }

    /// Whether a TLS handshake is still to finish (it runs within the HELLO exchange).
    fn handshaking(&self) -> bool {
        match &self.stream {
            Stream::Plain(_) => false,
            Stream::Tls(s) => s.conn.is_handshaking(),
        }
    }

    /// Over plain TCP, a reply that starts as a TLS alert record: the server expects TLS.
    fn tls_alert(&self, server: &str) -> Option<Error> {
        (matches!(self.stream, Stream::Plain(_)) && self.rbuf.first() == Some(&TLS_ALERT)).then(
            || Error::Protocol {
                server: server.to_string(),
                message: "the server answered with a TLS alert: it expects TLS (connect with a \
                          TLS configuration, docs/tls.md)"
                    .into(),
            },
        )
    }

    /// The server answered with text where a frame should be: a memcached-style line saying why it
    /// turns the connection away (`SERVER_ERROR too many open connections`), then it closes. Reads
    /// the rest of the line (what is there by the deadline) and names it.
    fn refusal(&mut self, server: &str, deadline: Instant) -> Error {
        while !self.rbuf.contains(&b'\n') && self.rbuf.len() < MAX_REFUSAL_LINE {
            if self.fill(server, self.rbuf.len() + 1, deadline).is_err() {
                break; // closed after its line, or silent: what arrived is the message
            }
        }
        let end = self
            .rbuf
            .iter()
            .position(|&b| b == b'\r' || b == b'\n')
            .unwrap_or(self.rbuf.len())
            .min(MAX_REFUSAL_LINE);
        let line = String::from_utf8_lossy(&self.rbuf[..end]).into_owned();
        Error::Refused {
            server: server.to_string(),
            message: line,
        }
    }

    /// Reads whatever has arrived, without blocking. `Ok(true)` once a whole reply frame (or bytes
    /// that can never become one, which [`Conn::recv`] then reports) is buffered; an error when the
    /// server closed the connection or it broke.
    pub(crate) fn try_fill(&mut self, server: &str) -> Result<bool> {
        loop {
            let want = match parse_frame(&self.rbuf[self.consumed..], MAX_REPLY_BODY) {
                Err(FrameError::Incomplete { needed }) => self.consumed + needed,
                _ => return Ok(true),
            };
            let len = self.rbuf.len();
            let room = want.saturating_sub(len).max(READ_CHUNK);
            self.rbuf.resize(len + room, 0);
            let r = self.stream.read_now(&mut self.rbuf[len..]);
            if let Ok(n) = r {
                if n > 0 {
                    self.rbuf.truncate(len + n);
                    continue;
                }
            }
            self.rbuf.truncate(len);
            let e = match r {
                Ok(_) => return Err(closed(server)),
                Err(e) => e,
            };
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(false),
                io::ErrorKind::Interrupted => {}
                _ => return Err(io_err(server, e)),
            }
        }
    }

    /// Whether any byte of the reply to the last request has arrived.
    pub(crate) fn reply_started(&self) -> bool {
        self.rbuf.len() > self.consumed
    }

    /// The socket, to wait on several connections at once.
    pub(crate) fn fd(&self) -> RawFd {
        // Over TLS too: `try_fill` leaves nothing decrypted above the socket before a poll.
        self.stream.tcp().as_raw_fd()
    }

    /// Whether a pooled connection can still be used: the server has not closed it (a restart, or it
    /// dropped an idle client) and sent nothing unasked. Checked without blocking.
    pub(crate) fn is_alive(&self) -> bool {
        let mut byte = 0u8;
        // SAFETY: one byte of valid memory; the fd belongs to `stream`.
        let n = unsafe {
            libc::recv(
                self.stream.tcp().as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // -1 with EAGAIN: nothing to read, open. 0: closed. Bytes: out of step (over TLS, a
        // record the server sent unasked, such as its close_notify). Other errors: broken.
        n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
    }

    /// Reads until `rbuf` holds at least `want` bytes.
    ///
    /// Past the deadline a read still succeeds if bytes are already there (it waits at most
    /// [`LATE_READ`]): a fan-out reads its servers one after another, and a reply that arrived in
    /// time must not be lost because an earlier server used up the wait.
    fn fill(&mut self, server: &str, want: usize, deadline: Instant) -> Result<()> {
        while self.rbuf.len() < want {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(LATE_READ);
            let len = self.rbuf.len();
            let room = (want - len).max(READ_CHUNK);
            self.rbuf.resize(len + room, 0);
            let r = match spin_read(&mut self.stream, &mut self.rbuf[len..]) {
                Some(r) => r,
                None => {
                    self.stream
                        .tcp()
                        .set_read_timeout(Some(left))
                        .map_err(|e| io_err(server, e))?;
                    self.stream.read(&mut self.rbuf[len..])
                }
            };
            match r {
                Ok(0) => {
                    self.rbuf.truncate(len);
                    return Err(closed(server));
                }
                Ok(n) => self.rbuf.truncate(len + n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => self.rbuf.truncate(len),
                Err(e) => {
                    self.rbuf.truncate(len);
                    return Err(io_err(server, e));
                }
            }
        }
        Ok(())
    }

    /// Writes one more request frame while replies to earlier ones on this connection may still be
    /// unread (pipelining, `pipeline.rs`). Whatever arrives while the frame is written is read into
    /// the buffer: the server stops reading requests while its replies cannot be sent, so a client
    /// that only wrote would wait on a server that waits on it.
    pub(crate) fn send_more(
        &mut self,
        server: &str,
        frame: &[u8],
        deadline: Instant,
    ) -> Result<()> {
        // The reply handed out last has been used (its borrow ended): drop its bytes.
        self.rbuf.drain(..self.consumed);
        self.consumed = 0;
        self.awaiting = true;
        let fd = self.stream.tcp().as_raw_fd();
        let mut off = 0;
        loop {
            // The frame's bytes, then (TLS) what the record layer still holds.
            let r = if off < frame.len() {
                self.stream.send_now(&frame[off..])
            } else {
                match self.stream.flush_now() {
                    Ok(()) => break,
                    Err(e) => Err(e),
                }
            };
            match r {
                Ok(n) => {
                    off += n;
                    continue;
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => {}
                    _ => return Err(io_err(server, e)),
                },
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(deadline::timeout_error(server));
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN | libc::POLLOUT,
                revents: 0,
            };
            let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd for the whole call.
            if unsafe { libc::poll(&mut p, 1, ms) } > 0 && p.revents & libc::POLLIN != 0 {
                self.read_available(server)?;
            }
        }
        Ok(())
    }

    /// Reads what has arrived into the buffer without blocking; an error if the server closed.
    fn read_available(&mut self, server: &str) -> Result<()> {
        let len = self.rbuf.len();
        self.rbuf.resize(len + READ_CHUNK, 0);
        let r = self.stream.read_now(&mut self.rbuf[len..]);
        self.rbuf.truncate(len + *r.as_ref().unwrap_or(&0));
        match r {
            Ok(0) => Err(closed(server)),
            Ok(_) => Ok(()),
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                _ => Err(io_err(server, e)),
            },
        }
    }

    /// Reads the next reply on a pipelined connection, which must answer request `id` of `op`
    /// (the server answers in request order; anything else means the stream is out of step).
    pub(crate) fn recv_next(
        &mut self,
        server: &str,
        id: u64,
        op: Opcode,
        deadline: Instant,
    ) -> Result<Reply<'_>> {
        self.last_id = id;
        self.last_op = op;
        self.awaiting = true;
        self.recv(server, deadline)
    }

    /// Whether the connection can carry another request: the last reply was read whole and nothing
    /// else arrived after it.
    pub(crate) fn is_clean(&self) -> bool {
        !self.awaiting && self.rbuf.len() == self.consumed
    }
}

/// Says that a connection failed in its TLS handshake (a plain-text server, an unknown CA, a
/// client certificate refused), when `handshaking`.
fn in_handshake(handshaking: bool, e: Error) -> Error {
    match e {
        Error::Io { server, source } if handshaking => Error::Io {
            server,
            source: io::Error::new(source.kind(), format!("TLS handshake failed: {source}")),
        },
        e => e,
    }
}

fn closed(server: &str) -> Error {
    Error::Io {
        server: server.to_string(),
        source: io::Error::new(io::ErrorKind::UnexpectedEof, "server closed the connection"),
    }
}

/// Idle connections to one server, and its health (down or up, latency).
pub(crate) struct Pool {
    pub(crate) addr: String,
    idle: Mutex<Vec<Conn>>,
    pub(crate) health: Health,
}

impl Pool {
    pub(crate) fn new(addr: String) -> Pool {
        Pool {
            addr,
            idle: Mutex::new(Vec::new()),
            health: Health::new(),
        }
    }

    /// An idle connection, if one is pooled and still open (closed ones are dropped on the way).
    pub(crate) fn take_idle(&self) -> Option<Conn> {
        loop {
            let mut conn = self.idle.lock().pop()?;
            if conn.is_alive() {
                conn.reused = true;
                return Some(conn);
            }
        }
    }

    /// Returns a connection after a complete exchange; dropped if the pool is full or it is not clean.
    pub(crate) fn put_back(&self, conn: Conn, max_idle: usize) {
        if !conn.is_clean() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < max_idle {
            idle.push(conn);
        }
    }

    /// Drops every idle connection (close, or a server that failed: they may all be dead).
    pub(crate) fn clear(&self) {
        self.idle.lock().clear();
    }

    /// Whether the server is down (a request failed, and no probe has succeeded since).
    pub(crate) fn is_down(&self) -> bool {
        self.health.is_down()
    }
}

/// Reads without blocking, yielding the CPU between tries, for up to [`SPIN`]; `None` when nothing arrived in that time (the
/// caller then blocks, with its timeout).
fn spin_read(stream: &mut Stream, buf: &mut [u8]) -> Option<io::Result<usize>> {
    let start = Instant::now();
    loop {
        let e = match stream.read_now(buf) {
            Ok(n) => return Some(Ok(n)),
            Err(e) => e,
        };
        match e.kind() {
            // Yield rather than spin: when the server (or another task) is runnable on this core
            // it runs at once instead of waiting for our poll to end.
            io::ErrorKind::WouldBlock if start.elapsed() < SPIN => std::thread::yield_now(),
            io::ErrorKind::WouldBlock => return None,
            io::ErrorKind::Interrupted => {}
            _ => return Some(Err(e)),
        }
    }
}
