//! Server statistics over the memcached text protocol (`stats`), which every ramgrid server also
//! speaks on the same port: one short-lived connection per call, nothing pooled.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::error::{Error, Result};

/// Most bytes of `stats` output accepted (a real server sends a few KiB).
const MAX_STATS: usize = 1 << 20;

/// Sends `stats` to `addr` and returns its `STAT name value` lines as pairs, in order.
pub(crate) fn fetch(
    addr: &str,
    connect_timeout: Duration,
    timeout: Duration,
    tls: Option<&crate::tls::ClientTls>,
    token: Option<&str>,
) -> Result<Vec<(String, String)>> {
    let conn_err = |e: std::io::Error| Error::Connect {
        server: addr.to_string(),
        source: e,
    };
    let sock = addr
        .to_socket_addrs()
        .map_err(conn_err)?
        .next()
        .ok_or_else(|| {
            conn_err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "address resolved to nothing",
            ))
        })?;
    let stream = TcpStream::connect_timeout(&sock, connect_timeout).map_err(conn_err)?;
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout {
            server: addr.to_string(),
        },
        _ => Error::Io {
            server: addr.to_string(),
            source: e,
        },
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut stream = match tls {
        None => crate::tls::Stream::Plain(stream),
        Some(tls) => tls.wrap(addr, stream)?,
    };
    let mut request = Vec::new();
    if let Some(token) = token {
        // memcached's text-protocol authentication (server `auth.rs`): a `set` whose data is
        // `<user> <password>`, answered STORED; the user name is not checked.
        let data = format!("ramgrid {token}");
        request.extend_from_slice(format!("set auth 0 0 {}\r\n{data}\r\n", data.len()).as_bytes());
    }
    request.extend_from_slice(b"stats\r\n");
    stream.write_all(&request).map_err(io)?;
    let mut r = BufReader::new(Blocking(stream));
    if token.is_some() {
        let mut line = String::new();
        r.read_line(&mut line).map_err(io)?;
        if line.trim_end() != "STORED" {
            return Err(Error::Auth {
                server: addr.to_string(),
                message: format!(
                    "the server refused the token for `stats`: {}",
                    line.trim_end()
                ),
            });
        }
    }
    parse(r, addr)
}

/// The stream's blocking reads, for `BufReader`.
struct Blocking(crate::tls::Stream);

impl Read for Blocking {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

fn parse(mut r: impl BufRead, addr: &str) -> Result<Vec<(String, String)>> {
    let proto = |m: String| Error::Protocol {
        server: addr.to_string(),
        message: m,
    };
    let mut out = Vec::new();
    let mut line = String::new();
    let mut total = 0;
    loop {
        line.clear();
        let n = r.read_line(&mut line).map_err(|e| Error::Io {
            server: addr.to_string(),
            source: e,
        })?;
        total += n;
        if n == 0 || total > MAX_STATS {
            return Err(proto("stats reply ended early or is too long".into()));
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l == "END" {
            return Ok(out);
        }
        match l
            .strip_prefix("STAT ")
            .and_then(|rest| rest.split_once(' '))
        {
            Some((k, v)) => out.push((k.to_string(), v.to_string())),
            None => return Err(proto(format!("unexpected stats line {l:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_until_end() {
        let text = b"STAT pid 12\r\nSTAT version 1.6.0 ramgrid\r\nEND\r\n";
        let v = parse(&text[..], "s").unwrap();
        assert_eq!(
            v,
            [
                ("pid".to_string(), "12".to_string()),
                ("version".into(), "1.6.0 ramgrid".into())
            ]
        );
        assert!(parse(&b"STAT pid 12\r\n"[..], "s").is_err());
        assert!(parse(&b"ERROR\r\n"[..], "s").is_err());
    }
}
