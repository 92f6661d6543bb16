//! The server side of the native protocol over real sockets: a broken frame closes only its own
//! connection, nothing is answered before auth, and refused data requests (wrong epoch, a partition
//! not held, a sealed version) change nothing. The cluster client's tests cover the happy paths.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use clap::Parser;
use ramgrid_proto::cluster::{partition_of, ClusterSpec, PartitionMap};
use ramgrid_proto::native::{
    parse_frame, CreateTable, Durability, FrameError, Hello, KeyBatchWriter, Opcode, PutWriter,
    Request, Response, Status, ValueType, VersionRef, PROTOCOL_VERSION,
};
use ramgrid_server::{start, Config, ServerHandle};

fn server(extra: &[&str]) -> ServerHandle {
    let mut args = vec![
        "ramgrid-server",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--memory",
        "16MiB",
    ];
    args.extend_from_slice(extra);
    start(&Config::parse_from(args)).expect("server starts")
}

struct Conn {
    sock: TcpStream,
    buf: Vec<u8>,
    next_id: u64,
}

impl Conn {
    fn open(h: &ServerHandle) -> Conn {
        let sock = TcpStream::connect(h.local_addr()).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        Conn {
            sock,
            buf: Vec::new(),
            next_id: 1,
        }
    }

    fn send(&mut self, frame: &[u8]) {
        self.sock.write_all(frame).expect("write");
    }

    /// Reads one response frame and decodes it with `f` (the body borrows the buffer).
    fn reply<R>(&mut self, f: impl FnOnce(Response<'_>) -> R) -> R {
        loop {
            match parse_frame(&self.buf, 1 << 24) {
                Ok((frame, used)) => {
                    let r = f(Response::decode(&frame).expect("response decodes"));
                    self.buf.drain(..used);
                    return r;
                }
                Err(FrameError::Incomplete { .. }) => {
                    let mut chunk = [0u8; 65536];
                    let n = self.sock.read(&mut chunk).expect("read");
                    assert!(n > 0, "server closed the connection");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) => panic!("bad response frame: {e}"),
            }
        }
    }

    /// Sends a request and returns the status of its response.
    fn call(&mut self, req: Request<'_>) -> Status {
        let mut out = Vec::new();
        req.encode(&mut out, self.next_id).unwrap();
        self.next_id += 1;
        self.send(&out);
        self.reply(status_of)
    }

    fn hello(&mut self, token: &[u8]) -> Status {
        self.call(Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            token,
            client_name: "test",
        }))
    }

    /// Asserts the server closes this connection (EOF, or a reset) within the read timeout.
    fn expect_closed(&mut self) {
        let mut chunk = [0u8; 1024];
        loop {
            match self.sock.read(&mut chunk) {
                Ok(0) => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!("the server kept the connection open")
                }
                Err(_) => return, // reset
                // A BAD_REQUEST reply may precede the close.
                Ok(_) => continue,
            }
        }
    }
}

fn status_of(r: Response<'_>) -> Status {
    match r {
        Response::Error(e) => e.status,
        _ => Status::Ok,
    }
}

fn create_f64(c: &mut Conn, name: &str, partitions: u32) -> Status {
    c.call(Request::CreateTable(CreateTable {
        name,
        partitions,
        replication: 1,
        value_type: ValueType::F64,
        durability: Durability::Memory,
        incarnation: 7,
    }))
}

fn put_f64(
    c: &mut Conn,
    table: &str,
    version: u32,
    epoch: u64,
    partitions: u32,
    keys: &[&str],
    values: &[f64],
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 99, table, version, epoch, ValueType::F64).unwrap();
    for (k, v) in keys.iter().zip(values) {
        w.group_f64(
            partition_of(k.as_bytes(), partitions),
            [k],
            std::slice::from_ref(v),
        )
        .unwrap();
    }
    w.finish().unwrap();
    c.send(&out);
    c.reply(|r| match r {
        Response::KeyStatuses(s) => s.as_bytes().to_vec(),
        other => panic!("PUT answered {other:?}"),
    })
}

fn get_f64(
    c: &mut Conn,
    table: &str,
    epoch: u64,
    partitions: u32,
    keys: &[&str],
) -> Result<Vec<Option<f64>>, Status> {
    get_f64_at(c, table, 0, epoch, partitions, keys)
}

fn get_f64_at(
    c: &mut Conn,
    table: &str,
    version: u32,
    epoch: u64,
    partitions: u32,
    keys: &[&str],
) -> Result<Vec<Option<f64>>, Status> {
    let mut out = Vec::new();
    let mut w = KeyBatchWriter::begin(&mut out, Opcode::Get, 7, table, version, epoch).unwrap();
    for k in keys {
        w.group(partition_of(k.as_bytes(), partitions), [k])
            .unwrap();
    }
    w.finish().unwrap();
    c.send(&out);
    c.reply(|r| match r {
        Response::Get(g) => Ok(g
            .iter()
            .map(|(st, v)| {
                (st == ramgrid_proto::native::KeyStatus::Ok)
                    .then(|| f64::from_le_bytes(v.unwrap().try_into().unwrap()))
            })
            .collect()),
        Response::Error(e) => Err(e.status),
        other => panic!("GET answered {other:?}"),
    })
}

/// A frame the server cannot parse closes that connection only; the server keeps serving.
#[test]
fn broken_frames_close_only_their_connection() {
    let h = server(&[]);
    let bad_frames: Vec<Vec<u8>> = vec![
        // unknown opcode
        vec![0xA7, 1, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        // unsupported protocol version
        vec![0xA7, 9, 0x02, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        // body length far over --max-frame (decided from the header alone)
        vec![
            0xA7, 1, 0x30, 0, 0xFF, 0xFF, 0xFF, 0x7F, 1, 0, 0, 0, 0, 0, 0, 0,
        ],
        // a GET whose body is shorter than its own fields say (truncated)
        vec![
            0xA7, 1, 0x30, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, b'l', b'm',
        ],
        // bad magic after a good first frame: sent below after a PING
    ];
    for frame in &bad_frames {
        let mut c = Conn::open(&h);
        c.send(frame);
        c.expect_closed();
    }
    let mut c = Conn::open(&h);
    assert_eq!(c.call(Request::Ping), Status::Ok);
    c.send(b"get foo\r\n");
    c.expect_closed();

    // The server is unharmed: a new connection works, tables and all.
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(create_f64(&mut c, "t", 4), Status::Ok);
    assert_eq!(put_f64(&mut c, "t", 0, 0, 4, &["a"], &[1.5]), vec![0]);
    assert_eq!(
        get_f64(&mut c, "t", 0, 4, &["a", "b"]),
        Ok(vec![Some(1.5), None])
    );
    h.shutdown();
}

/// With a token, nothing but HELLO and PING is answered before a HELLO with the right token, and a
/// refused request touches no data.
#[test]
fn nothing_before_auth() {
    let h = server(&["--token", "s3cret"]);
    let mut c = Conn::open(&h);
    assert_eq!(c.call(Request::Ping), Status::Ok);
    assert_eq!(create_f64(&mut c, "t", 4), Status::AuthRequired);
    assert_eq!(c.call(Request::ListTables), Status::AuthRequired);
    assert_eq!(c.hello(b"wrong"), Status::AuthFailed);
    assert_eq!(create_f64(&mut c, "t", 4), Status::AuthRequired);
    assert!(
        h.node().tables.list().is_empty(),
        "a refused request created a table"
    );
    assert_eq!(c.hello(b"s3cret"), Status::Ok);
    assert_eq!(create_f64(&mut c, "t", 4), Status::Ok);
    h.shutdown();
}

/// A request made under another epoch, or for a partition this server does not hold, is refused
/// before any key is read or written.
#[test]
fn stale_epoch_and_foreign_partitions_are_refused() {
    let h = server(&[]);
    let me = h.local_addr().to_string();
    // Two servers in the spec: this one and one that does not exist; one replica per partition.
    let spec = ClusterSpec::parse(&format!("server {me}\nserver 127.0.0.1:1\n")).unwrap();
    let epoch = spec.epoch();
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(
        c.call(Request::SetSpec {
            spec: spec.to_text().as_bytes()
        }),
        Status::Ok
    );
    assert_eq!(create_f64(&mut c, "t", 16), Status::Ok);

    let map = PartitionMap::new(&spec, 16, 1);
    let (mine, theirs): (Vec<String>, Vec<String>) = (0..200)
        .map(|i| format!("k{i}"))
        .partition(|k| map.holds(0, partition_of(k.as_bytes(), 16)));
    assert!(!mine.is_empty() && !theirs.is_empty());

    // Old epoch: refused, nothing stored.
    assert_eq!(c.call(Request::Ping), Status::Ok);
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 5, "t", 0, epoch ^ 1, ValueType::F64).unwrap();
    w.group_f64(partition_of(mine[0].as_bytes(), 16), [&mine[0]], &[1.0])
        .unwrap();
    w.finish().unwrap();
    c.send(&out);
    assert_eq!(c.reply(status_of), Status::WrongEpoch);
    assert_eq!(
        get_f64(&mut c, "t", epoch, 16, &[mine[0].as_str()]),
        Ok(vec![None])
    );

    // A batch with one foreign partition is refused whole: the held key is not written either.
    let batch = [mine[1].as_str(), theirs[0].as_str()];
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 6, "t", 0, epoch, ValueType::F64).unwrap();
    for k in batch {
        w.group_f64(partition_of(k.as_bytes(), 16), [k], &[2.0])
            .unwrap();
    }
    w.finish().unwrap();
    c.send(&out);
    let not_held = c.reply(|r| match r {
        Response::Error(e) if e.status == Status::NotOwner => e.partitions,
        other => panic!("expected NOT_OWNER, got {other:?}"),
    });
    assert_eq!(not_held, vec![partition_of(theirs[0].as_bytes(), 16)]);
    assert_eq!(
        get_f64(&mut c, "t", epoch, 16, &[mine[1].as_str()]),
        Ok(vec![None])
    );
    assert_eq!(
        get_f64(&mut c, "t", epoch, 16, &[theirs[0].as_str()]),
        Err(Status::NotOwner)
    );
    h.shutdown();
}

/// A sealed version refuses writes; a new version is invisible until it is sealed and made current.
#[test]
fn sealed_versions_refuse_writes_and_switch_atomically() {
    let h = server(&[]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(create_f64(&mut c, "t", 4), Status::Ok);
    assert_eq!(put_f64(&mut c, "t", 0, 0, 4, &["a"], &[1.0]), vec![0]);
    let v = |version| VersionRef::new("t", version);
    assert_eq!(c.call(Request::SealVersion(v(1))), Status::Ok);
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 8, "t", 1, 0, ValueType::F64).unwrap();
    w.group_f64(partition_of(b"a", 4), ["a"], &[9.0]).unwrap();
    w.finish().unwrap();
    c.send(&out);
    assert_eq!(c.reply(status_of), Status::VersionSealed);

    assert_eq!(c.call(Request::CreateVersion(v(2))), Status::Ok);
    assert_eq!(c.call(Request::CreateVersion(v(2))), Status::VersionExists);
    assert_eq!(put_f64(&mut c, "t", 2, 0, 4, &["a"], &[2.0]), vec![0]);
    assert_eq!(
        get_f64(&mut c, "t", 0, 4, &["a"]),
        Ok(vec![Some(1.0)]),
        "an open version leaked"
    );
    assert_eq!(c.call(Request::SetCurrent(v(2))), Status::VersionNotSealed);
    assert_eq!(c.call(Request::SealVersion(v(2))), Status::Ok);
    assert_eq!(c.call(Request::SetCurrent(v(2))), Status::Ok);
    assert_eq!(get_f64(&mut c, "t", 0, 4, &["a"]), Ok(vec![Some(2.0)]));
    assert_eq!(c.call(Request::CreateVersion(v(0))), Status::BadRequest);
    h.shutdown();
}

/// A GET whose values would pass the body limit (`--max-frame`, announced in HELLO) is refused with
/// TOO_LARGE before its reply is composed whole; the connection goes on serving.
#[test]
fn a_get_whose_reply_passes_the_body_limit_is_refused() {
    let h = server(&["--max-frame", "8KiB"]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(create_f64(&mut c, "t", 1), Status::Ok);
    let keys: Vec<String> = (0..1000).map(|i| format!("{i:03}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (n, chunk) in keys.chunks(100).enumerate() {
        let values: Vec<f64> = (0..chunk.len()).map(|i| (n * 100 + i) as f64).collect();
        assert!(put_f64(&mut c, "t", 0, 0, 1, chunk, &values)
            .iter()
            .all(|&st| st == 0));
    }
    // One group of 1000 keys: a 6 KB request whose reply would be 9 KB.
    let mut get = |keys: &[&str]| {
        let mut out = Vec::new();
        let mut w = KeyBatchWriter::begin(&mut out, Opcode::Get, 7, "t", 0, 0).unwrap();
        w.group(0, keys).unwrap();
        w.finish().unwrap();
        c.send(&out);
        c.reply(|r| match r {
            Response::Get(g) => Ok(g
                .iter()
                .map(|(_, v)| f64::from_le_bytes(v.unwrap().try_into().unwrap()))
                .collect::<Vec<f64>>()),
            Response::Error(e) => Err(e.status),
            other => panic!("GET answered {other:?}"),
        })
    };
    assert_eq!(get(&keys), Err(Status::TooLarge));
    let half: Vec<f64> = (0..500).map(f64::from).collect();
    assert_eq!(get(&keys[..500]), Ok(half));
    h.shutdown();
}

#[test]
#[should_panic(expected = "kept the connection open")]
fn expect_closed_can_fail() {
    let h = server(&[]);
    let mut c = Conn::open(&h);
    c.sock
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert_eq!(c.call(Request::Ping), Status::Ok);
    c.expect_closed();
}

/// A fresh, empty directory under the system temp dir for one test.
fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ramgrid-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// With --data-dir, SEAL of a snapshot table is acknowledged only once its images are on disk:
/// when they cannot be written the SEAL is refused and the version stays unsealed (it cannot be
/// made current); a retry after the fault seals it. A server started again on the same data dir
/// serves the sealed version, and a dropped table leaves nothing behind.
#[test]
fn a_seal_is_durable_before_it_is_acknowledged() {
    let dir = temp_dir("durable");
    let data = dir.to_str().unwrap();
    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    let create = CreateTable {
        name: "d",
        partitions: 4,
        replication: 1,
        value_type: ValueType::F64,
        durability: Durability::Snapshot,
        incarnation: 0xabc,
    };
    assert_eq!(c.call(Request::CreateTable(create)), Status::Ok);
    let table_dir = dir.join("tables/d-0000000000000abc");
    assert!(
        table_dir.join("catalog").is_file(),
        "create writes the catalog"
    );
    let v = |version| VersionRef::new("d", version);
    assert_eq!(c.call(Request::CreateVersion(v(2))), Status::Ok);
    assert_eq!(
        put_f64(&mut c, "d", 2, 0, 4, &["a", "b"], &[1.5, 2.5]),
        vec![0, 0]
    );
    // A file where the version's directory must go: writing the snapshot fails.
    std::fs::write(table_dir.join("v2"), b"in the way").unwrap();
    assert_eq!(c.call(Request::SealVersion(v(2))), Status::Internal);
    assert_eq!(
        c.call(Request::SetCurrent(v(2))),
        Status::VersionNotSealed,
        "a seal that is not on disk must not count"
    );
    std::fs::remove_file(table_dir.join("v2")).unwrap();
    assert_eq!(c.call(Request::SealVersion(v(2))), Status::Ok);
    assert_eq!(c.call(Request::SetCurrent(v(2))), Status::Ok);
    assert!(table_dir.join("v2/p0.img").is_file());
    h.shutdown();

    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(
        get_f64(&mut c, "d", 0, 4, &["a", "b", "z"]),
        Ok(vec![Some(1.5), Some(2.5), None])
    );
    assert_eq!(c.call(Request::DropTable { name: "d" }), Status::Ok);
    assert!(!table_dir.exists(), "a dropped table's files are removed");
    h.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn delete_keys(c: &mut Conn, table: &str, version: u32, partitions: u32, keys: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = KeyBatchWriter::begin(&mut out, Opcode::Delete, 8, table, version, 0).unwrap();
    for k in keys {
        w.group(partition_of(k.as_bytes(), partitions), [k])
            .unwrap();
    }
    w.finish().unwrap();
    c.send(&out);
    c.reply(|r| match r {
        Response::KeyStatuses(s) => s.as_bytes().to_vec(),
        other => panic!("DELETE answered {other:?}"),
    })
}

/// A log table (durability log): every acknowledged PUT and DELETE of an open version is in its
/// log, a restart replays open versions (version 1 stays current) next to sealed ones, a seal
/// removes the version's log, a torn tail is cut and the rest kept, a corrupt record refuses
/// the version (NOT_OWNER, never a partial answer), and a version whose log cannot be created
/// is not created.
#[test]
fn log_tables_replay_open_versions_and_refuse_damage() {
    let dir = temp_dir("wal");
    let data = dir.to_str().unwrap();
    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    let create = CreateTable {
        name: "w",
        partitions: 4,
        replication: 1,
        value_type: ValueType::F64,
        durability: Durability::Log,
        incarnation: 0x10,
    };
    assert_eq!(c.call(Request::CreateTable(create)), Status::Ok);
    let table_dir = dir.join("tables/w-0000000000000010");
    let v1_log = table_dir.join("v1.log");
    assert!(v1_log.is_file(), "the open head has a log from the start");
    let v = |version| VersionRef::new("w", version);
    assert_eq!(
        put_f64(&mut c, "w", 1, 0, 4, &["a", "b", "c"], &[1.0, 2.0, 3.0]),
        vec![0, 0, 0]
    );
    assert_eq!(put_f64(&mut c, "w", 1, 0, 4, &["a"], &[1.5]), vec![0]);
    assert_eq!(delete_keys(&mut c, "w", 1, 4, &["b", "nope"]), vec![0, 1]);
    assert_eq!(c.call(Request::CreateVersion(v(2))), Status::Ok);
    assert!(table_dir.join("v2.log").is_file());
    assert_eq!(put_f64(&mut c, "w", 2, 0, 4, &["x"], &[9.0]), vec![0]);
    assert_eq!(c.call(Request::CreateVersion(v(3))), Status::Ok);
    assert_eq!(put_f64(&mut c, "w", 3, 0, 4, &["y"], &[7.0]), vec![0]);
    assert_eq!(c.call(Request::SealVersion(v(3))), Status::Ok);
    assert!(
        !table_dir.join("v3.log").exists(),
        "a sealed version's log is garbage"
    );
    assert!(table_dir.join("v3/p0.img").is_file());
    h.shutdown();

    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    let keys = ["a", "b", "c", "nope"];
    let want = vec![Some(1.5), None, Some(3.0), None];
    assert_eq!(get_f64(&mut c, "w", 0, 4, &keys), Ok(want.clone()));
    assert_eq!(
        get_f64_at(&mut c, "w", 2, 0, 4, &["x"]),
        Ok(vec![Some(9.0)])
    );
    assert_eq!(
        get_f64_at(&mut c, "w", 3, 0, 4, &["y"]),
        Ok(vec![Some(7.0)])
    );
    // Writes go on after the replay, to the same log.
    assert_eq!(put_f64(&mut c, "w", 1, 0, 4, &["d"], &[4.0]), vec![0]);
    // A version whose log cannot be created is refused and does not exist.
    std::fs::create_dir(table_dir.join("v4.log")).unwrap();
    assert_eq!(c.call(Request::CreateVersion(v(4))), Status::Internal);
    assert_eq!(
        c.call(Request::DropVersion(v(4))),
        Status::NoSuchVersion,
        "not created"
    );
    std::fs::remove_dir(table_dir.join("v4.log")).unwrap();
    h.shutdown();

    // A torn tail: half a record appended (as a crash mid-write leaves it).
    let good = std::fs::read(&v1_log).unwrap();
    let mut torn = good.clone();
    torn.extend_from_slice(&good[40..60]);
    std::fs::write(&v1_log, &torn).unwrap();
    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    let with_d = ["a", "b", "c", "d"];
    assert_eq!(
        get_f64(&mut c, "w", 0, 4, &with_d),
        Ok(vec![Some(1.5), None, Some(3.0), Some(4.0)])
    );
    assert_eq!(
        std::fs::read(&v1_log).unwrap(),
        good,
        "the torn tail is cut"
    );
    h.shutdown();

    // A corrupt record in the middle: the log is set aside, and the version is refused
    // (REPAIRING: a replica could give it), never served partly, until it is copied in.
    let mut bad = good.clone();
    bad[40 + 16 + 2] ^= 0xff;
    std::fs::write(&v1_log, &bad).unwrap();
    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(
        get_f64_at(&mut c, "w", 1, 0, 4, &with_d),
        Err(Status::Repairing)
    );
    assert_eq!(
        get_f64(&mut c, "w", 0, 4, &with_d),
        Err(Status::Repairing),
        "the open head stays current, refused until copied"
    );
    assert_eq!(
        get_f64_at(&mut c, "w", 2, 0, 4, &["x"]),
        Ok(vec![Some(9.0)])
    );
    let aside = table_dir.join("v1.log.corrupt");
    assert_eq!(std::fs::read(&aside).unwrap(), bad, "kept for inspection");
    assert!(table_dir.join("v1.copying").is_file(), "marked: copy it");
    assert_eq!(
        std::fs::read(&v1_log).unwrap(),
        good[..40],
        "a new log, header only"
    );
    // Writes are taken (and logged) meanwhile; reads still wait for the copy.
    assert_eq!(put_f64(&mut c, "w", 1, 0, 4, &["e"], &[5.0]), vec![0]);
    assert_eq!(
        get_f64_at(&mut c, "w", 1, 0, 4, &["e"]),
        Err(Status::Repairing)
    );
    assert!(std::fs::read(&v1_log).unwrap().len() > 40);
    // Other versions can still be created.
    assert_eq!(c.call(Request::CreateVersion(v(5))), Status::Ok);
    h.shutdown();
    // Restarted before any copy came: still marked, still refused (its log is not the whole
    // version), even with no replica to copy from.
    let h = server(&["--data-dir", data]);
    let mut c = Conn::open(&h);
    assert_eq!(c.hello(b""), Status::Ok);
    assert_eq!(
        get_f64_at(&mut c, "w", 1, 0, 4, &["e"]),
        Err(Status::Repairing)
    );
    // Dropping the refused version (once another is current) removes its log, the mark and the
    // damaged file.
    assert_eq!(c.call(Request::SetCurrent(v(3))), Status::Ok);
    assert_eq!(c.call(Request::DropVersion(v(1))), Status::Ok);
    assert!(!v1_log.exists());
    assert!(!aside.exists() && !table_dir.join("v1.copying").exists());
    assert_eq!(c.call(Request::DropVersion(v(2))), Status::Ok);
    assert!(!table_dir.join("v2.log").exists());
    assert_eq!(c.call(Request::DropTable { name: "w" }), Status::Ok);
    assert!(!table_dir.exists());
    h.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
