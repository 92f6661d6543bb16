//! TLS to servers that have it (docs/tls.md): the configuration a client is given, loaded once
//! into rustls, and the byte stream a connection reads and writes, plain TCP or TLS over it.
//!
//! The connection code reads without blocking (a short spin before a blocking read, and the
//! hedged fan-out's poll over many sockets), so [`Stream`] gives both a blocking read and one
//! that never blocks; over TLS the latter feeds whatever the socket has into rustls and hands
//! out decrypted bytes, so that when it reports nothing, nothing is buffered above the socket
//! and polling the socket is enough.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::error::{Error, Result};

/// How a client connects over TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// The CA certificate(s) (PEM) that signed the servers' certificates.
    pub ca: PathBuf,
    /// A client certificate chain (PEM), for servers started with `--tls-client-ca`.
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of `cert`.
    pub key: Option<PathBuf>,
    /// The name the servers' certificates must carry; by default each server's host as the
    /// address gives it (an IP address for an IP, as clusters are usually addressed).
    pub server_name: Option<String>,
}

/// A [`TlsConfig`] loaded: the rustls configuration every connection shares.
#[derive(Clone)]
pub(crate) struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads the files of `c`; a missing file, one without PEM of the right kind, a key that
    /// does not match its certificate, or a certificate without its key is an error.
    pub(crate) fn load(c: &TlsConfig) -> Result<ClientTls> {
        let bad = |m: String| Error::InvalidArgument(format!("TLS: {m}"));
        let provider = Arc::new(default_provider());
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&c.ca, "CA")? {
            roots
                .add(cert)
                .map_err(|e| bad(format!("CA {}: {e}", c.ca.display())))?;
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| bad(format!("CA {}: {e}", c.ca.display())))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_webpki_verifier(verifier);
        let config = match (&c.cert, &c.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "client certificate")?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    bad(format!(
                        "key {}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                        key.display()
                    ))
                })?;
                // Checks that the key matches the certificate.
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| bad(format!("{} / {}: {e}", cert.display(), key.display())))?
            }
            _ => return Err(bad("a client certificate and its key go together".into())),
        };
        let server_name = match &c.server_name {
            None => None,
            Some(n) => Some(parse_name(n).map_err(bad)?),
        };
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }

    /// Starts TLS on a connected socket to `server` (`host:port`); the handshake itself runs on
    /// the first write, under the socket's timeouts.
    pub(crate) fn wrap(&self, server: &str, sock: TcpStream) -> Result<Stream> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => {
                let host = server.rsplit_once(':').map_or(server, |(h, _)| h);
                parse_name(host.trim_start_matches('[').trim_end_matches(']'))
                    .map_err(|m| Error::InvalidArgument(format!("TLS: {server}: {m}")))?
            }
        };
        let conn = ClientConnection::new(self.config.clone(), name)
            .map_err(|e| Error::InvalidArgument(format!("TLS: {server}: {e}")))?;
        Ok(Stream::Tls(Box::new(StreamOwned::new(conn, sock))))
    }
}

fn parse_name(host: &str) -> std::result::Result<ServerName<'static>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_owned()).map_err(|e| format!("{host:?} is not a server name: {e}"))
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let bad = |m: String| Error::InvalidArgument(format!("TLS: {what} {}: {m}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in the file".into(),
        ));
    }
    Ok(certs)
}

/// A connection's byte stream.
pub(crate) enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: rustls' state is large, and most connections are plain).
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// The TCP socket underneath (for timeouts, polling and peeking).
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// Writes `buf` whole (under the socket's write timeout), TLS records included.
    pub(crate) fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(buf),
            Stream::Tls(s) => {
                s.write_all(buf)?;
                s.flush()
            }
        }
    }

    /// Reads, blocking under the socket's read timeout.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }

    /// Reads what has arrived without blocking: `Err(WouldBlock)` when nothing has, `Ok(0)`
    /// when the server closed the connection.
    pub(crate) fn read_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => recv_now(s, buf),
            Stream::Tls(s) => loop {
                match s.conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // An end without TLS' close_notify is still the server closing.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    r => return r,
                }
                // Nothing decrypted is waiting: take what the socket has (WouldBlock ends here).
                let StreamOwned { conn, sock } = &mut **s;
                conn.read_tls(&mut NowReader(sock))?;
                conn.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            },
        }
    }
}

impl Stream {
    /// Sends from `buf` without blocking and returns how many of its bytes were taken:
    /// `Err(WouldBlock)` when none could be. For TLS the bytes are taken into the record layer;
    /// what of it the socket could not take yet waits there for [`flush_now`](Self::flush_now).
    pub(crate) fn send_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => send_now(s, buf),
            Stream::Tls(s) => {
                let StreamOwned { conn, sock } = &mut **s;
                flush_tls(conn, sock)?;
                let n = conn.writer().write(buf)?;
                match flush_tls(conn, sock) {
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                    _ => {}
                }
                if n == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            }
        }
    }

    /// Pushes what the TLS record layer holds to the socket without blocking: `Ok` once nothing
    /// is left, `Err(WouldBlock)` while the socket cannot take it. Plain streams hold nothing.
    pub(crate) fn flush_now(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(s) => {
                let StreamOwned { conn, sock } = &mut **s;
                flush_tls(conn, sock)
            }
        }
    }
}

fn flush_tls(conn: &mut ClientConnection, sock: &TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(&mut NowWriter(sock))?;
    }
    Ok(())
}

/// A `Write` over a socket that never blocks (`send` with `MSG_DONTWAIT`).
struct NowWriter<'a>(&'a TcpStream);

impl Write for NowWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        send_now(self.0, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn send_now(sock: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the whole call, and the fd
    // belongs to `sock`, which outlives it.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A `Read` over a socket that never blocks (`recv` with `MSG_DONTWAIT`).
struct NowReader<'a>(&'a TcpStream);

impl Read for NowReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv_now(self.0, buf)
    }
}

fn recv_now(sock: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and the fd
    // belongs to `sock`, which outlives it.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
