//! Connection handling with real server processes: a server that refuses connections (`--max-conns`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use common::Server;
use ramgrid_client::{Client, ClientConfig, ErrorKind, Keys};

/// The issue: a native client refused for too many connections (the server answers memcached's
/// `SERVER_ERROR too many open connections` line and closes) got "bad magic byte 0x53".
#[test]
fn a_refused_connection_names_the_servers_reason() {
    let server = Server::start(&["--max-conns", "1"]);
    // Hold the one connection, and make sure the server has counted it (it answers).
    let mut held = TcpStream::connect(&server.addr).unwrap();
    held.write_all(b"version\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&held).read_line(&mut line).unwrap();
    assert!(line.starts_with("VERSION"), "{line:?}");

    let c = Client::new(ClientConfig::new(vec![server.addr.clone()])).unwrap();
    let err = c.list_tables().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("too many open connections") && msg.contains(&server.addr),
        "{msg}"
    );
    // Reads fail the same way (a refusal is a server failure: no replica answered).
    let err = c.get("t", Keys::I64(&[1]), 0).unwrap_err();
    assert!(
        err.to_string().contains("too many open connections"),
        "{err}"
    );

    drop(held);
}
