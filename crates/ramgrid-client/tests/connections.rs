//! Connection handling with real server processes: pooled connections to a restarted server,
//! metadata reads with a server gone, and a server that refuses connections (`--max-conns`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use common::{Cluster, Server};
use ramgrid_client::{Client, ClientConfig, ErrorKind, Keys, ValueType, ValuesRef};

/// The issue: after a server restarted on the same address, the first admin call failed with "server
/// closed the connection" (a pooled connection to the old process was used). Each round below makes
/// a different kind of call first: an idempotent one (SET_SPEC) and ones that must not be repeated
/// blindly (CREATE_TABLE, PUT).
#[test]
fn the_first_call_after_a_server_restart_succeeds() {
    let mut cluster = Cluster::start(2);
    let c = cluster.client();
    c.create_table("t", 8, 1, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..200).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();
    // Several pooled connections to each server.
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| c.list_tables().unwrap());
        }
    });

    cluster.servers[0].restart();
    c.push_spec().expect("first call after the restart");

    cluster.servers[0].restart();
    c.create_table("u", 8, 1, ValueType::I64)
        .expect("first call after the second restart");

    cluster.servers[1].restart();
    c.push_spec().unwrap();
    // The restarted server lost its tables: creating one that the other still has creates it there
    // and reports that it existed.
    assert_eq!(
        c.create_table("u", 8, 1, ValueType::I64)
            .unwrap_err()
            .kind(),
        ErrorKind::TableExists
    );
    cluster.servers[1].restart();
    cluster.servers[0].restart();
    c.push_spec().expect("first call after both restarted");
    c.create_table("t", 8, 1, ValueType::I64).unwrap();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .expect("a put, first data call after a restart");
    assert!(c
        .get("t", Keys::I64(&keys), 0)
        .unwrap()
        .found
        .iter()
        .all(|&f| f));
}

/// The issue: after any kill, describe_table and current_version failed with ConnectionFailed
/// instead of asking the live servers.
#[test]
fn metadata_reads_use_the_live_servers_after_a_kill() {
    let mut cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 12, 2, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..300).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();
    let v2 = c.create_version("t").unwrap();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), v2)
        .unwrap();
    c.seal_version("t", v2).unwrap();
    c.set_current("t", v2).unwrap();

    cluster.servers[1].kill();
    assert_eq!(c.current_version("t").expect("current_version"), v2);
    let d = c.describe_table("t").expect("describe_table");
    assert_eq!(
        (d.partitions, d.replication, d.current_version),
        (12, 2, v2)
    );
    assert_eq!(d.unreachable, [cluster.servers[1].addr.clone()]);
    let names: Vec<String> = c
        .list_tables()
        .expect("list_tables")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["t"]);
    // A fresh client (no pooled connections, nothing marked down) answers too.
    let fresh = Client::new(cluster.config()).unwrap();
    assert_eq!(fresh.current_version("t").unwrap(), v2);

    // With every server gone, the error is the connection's, not an empty answer.
    cluster.servers[0].kill();
    cluster.servers[2].kill();
    assert_eq!(
        c.describe_table("t").unwrap_err().kind(),
        ErrorKind::ConnectionFailed
    );
}

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
