//! Shared memory (docs/shared-memory.md) between in-process servers and the real cluster client in
//! the same process: a pinned version's reads answered from mapped segments equal the TCP path for
//! every value type and missing keys; a server without shared memory is read over TCP in the same
//! call; a bad token and an open version are refused; a version dropped while mapped stays
//! readable through the mapping and the server lets its segments go.
//!
//! The servers and the client find the sockets under the same default directory; every server
//! has its own port, so its own socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use clap::Parser;
use ramgrid_client::{Client, ClientConfig, GetResult, Keys, Values, ValuesRef};
use ramgrid_proto::native::ValueType;
use ramgrid_proto::shm::{body_len, Reply, Request};
use ramgrid_server::{start, Config, ServerHandle};

fn server(extra: &[&str]) -> ServerHandle {
    let mut args = vec![
        "ramgrid-server",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
    ];
    if !extra.contains(&"--table-memory") {
        args.extend_from_slice(&["--table-memory", "256MiB"]);
    }
    args.extend_from_slice(extra);
    start(&Config::parse_from(args)).expect("server starts")
}

fn client(servers: &[&ServerHandle], token: Option<&str>) -> Client {
    let addrs = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let mut cfg = ClientConfig::new(addrs);
    cfg.token = token.map(str::to_string);
    let c = Client::new(cfg).unwrap();
    c.push_spec().unwrap();
    c
}

const N: i64 = 3000;

/// A table of `vt` with keys 0..N (every third missing), sealed as version 2 and current.
fn fill(c: &Client, name: &str, vt: ValueType, parts: u32, repl: u32) -> u32 {
    c.create_table(name, parts, repl, vt).unwrap();
    let v = c.create_version(name).unwrap();
    let keys: Vec<i64> = (0..N).filter(|k| k % 3 != 0).collect();
    let n = keys.len();
    match vt {
        ValueType::I64 => {
            let xs: Vec<i64> = keys.iter().map(|k| k * 7 - 100).collect();
            c.put(name, Keys::I64(&keys), ValuesRef::I64(&xs), v)
        }
        ValueType::F64 => {
            let xs: Vec<f64> = keys.iter().map(|&k| k as f64 * 0.5).collect();
            c.put(name, Keys::I64(&keys), ValuesRef::F64(&xs), v)
        }
        ValueType::F32Vec(d) => {
            let xs: Vec<f32> = (0..n * d as usize).map(|i| i as f32 * 0.25).collect();
            c.put(name, Keys::I64(&keys), ValuesRef::F32(&xs), v)
        }
        ValueType::Bytes => {
            let vals: Vec<Vec<u8>> = keys
                .iter()
                .map(|&k| vec![k as u8; (k % 50) as usize])
                .collect();
            let refs: Vec<&[u8]> = vals.iter().map(|v| &v[..]).collect();
            c.put(name, Keys::I64(&keys), ValuesRef::Slices(&refs), v)
        }
    }
    .unwrap();
    c.seal_version(name, v).unwrap();
    c.set_current(name, v).unwrap();
    v
}

/// A read's answer per key (None: missing), so two reads compare whatever order their bytes
/// values were packed in.
fn rows(r: &GetResult) -> (Vec<Option<Vec<u8>>>, u32) {
    let row = |i: usize| -> Vec<u8> {
        match &r.values {
            Values::Bytes(b) => b.get(i).to_vec(),
            Values::I64(v) => v[i].to_le_bytes().to_vec(),
            Values::F64(v) => v[i].to_le_bytes().to_vec(),
            Values::F32Vec { dim, data } => data[i * dim..(i + 1) * dim]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        }
    };
    let rows = (0..r.found.len())
        .map(|i| r.found[i].then(|| row(i)))
        .collect();
    (rows, r.version)
}

fn same(a: &GetResult, b: &GetResult) -> bool {
    rows(a) == rows(b)
}

fn all_keys() -> Vec<i64> {
    (-5..N + 5).collect()
}

#[test]
fn reads_from_shared_memory_equal_tcp_for_every_value_type() {
    let (a, b) = (server(&[]), server(&[]));
    let tcp = client(&[&a, &b], None);
    let local = client(&[&a, &b], None);
    for (i, vt) in [
        ValueType::Bytes,
        ValueType::I64,
        ValueType::F64,
        ValueType::F32Vec(3),
    ]
    .into_iter()
    .enumerate()
    {
        let t = format!("t{i}");
        let v = fill(&tcp, &t, vt, 16, 1);
        let info = local.shm_attach(&t, 0, v).unwrap();
        assert_eq!(info.mapped, (0..16).collect::<Vec<_>>(), "{vt:?}: {info:?}");
        assert_eq!(info.servers.len(), 2);
        let keys = all_keys();
        let before = local.shm_stats();
        let want = tcp.get(&t, Keys::I64(&keys), v).unwrap();
        let got = local.get(&t, Keys::I64(&keys), v).unwrap();
        assert!(same(&got, &want), "{vt:?}: shared memory and TCP differ");
        let after = local.shm_stats();
        let found = want.found.iter().filter(|&&f| f).count() as u64;
        assert_eq!(after.hits - before.hits, found);
        assert_eq!(after.misses - before.misses, keys.len() as u64 - found);
        assert_eq!(after.remote, before.remote);
        // One key at a time too (the path of a 1-key get).
        for k in [1i64, 3, 2999] {
            let one = local.get(&t, Keys::I64(&[k]), v).unwrap();
            assert!(same(&one, &tcp.get(&t, Keys::I64(&[k]), v).unwrap()));
        }
        assert!(local.shm_detach(&t, 0, v));
        assert!(!local.shm_detach(&t, 0, v));
    }
    assert_eq!(local.shm_stats().attached, 0);
}

#[test]
fn a_server_without_shared_memory_is_read_over_tcp_in_the_same_call() {
    let (a, b) = (server(&[]), server(&["--shm-dir", "off"]));
    let c = client(&[&a, &b], None);
    let v = fill(&c, "mixed", ValueType::I64, 8, 1);
    let info = c.shm_attach("mixed", 0, v).unwrap();
    assert!(!info.mapped.is_empty() && info.mapped.len() < 8, "{info:?}");
    assert_eq!(info.skipped.len(), 1, "{info:?}");
    let keys = all_keys();
    let plain = client(&[&a, &b], None);
    assert!(same(
        &c.get("mixed", Keys::I64(&keys), v).unwrap(),
        &plain.get("mixed", Keys::I64(&keys), v).unwrap()
    ));
    let s = c.shm_stats();
    assert!(s.hits > 0 && s.remote > 0, "{s:?}");
    // The current version (0) is not pinned: it never reads shared memory.
    let before = c.shm_stats();
    c.get("mixed", Keys::I64(&keys), 0).unwrap();
    assert_eq!(c.shm_stats().hits, before.hits);
}

fn ask_raw(path: &std::path::Path, req: &Request) -> Reply {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&req.encode()).unwrap();
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).unwrap();
    let mut body = vec![0u8; body_len(prefix).unwrap()];
    s.read_exact(&mut body).unwrap();
    Reply::decode(&body).unwrap()
}

#[test]
fn a_bad_token_and_an_open_version_are_refused() {
    let a = server(&["--token", "s3cret"]);
    let c = client(&[&a], Some("s3cret"));
    let v = fill(&c, "guarded", ValueType::F64, 4, 1);
    let path = ramgrid_server::shm::socket_for(Some("auto"), &a.local_addr().to_string()).unwrap();
    for token in [&b""[..], b"wrong"] {
        let req = Request {
            token: token.to_vec(),
            table: "guarded".into(),
            incarnation: 0,
            version: v,
        };
        match ask_raw(&path, &req) {
            Reply::Refused(why) => assert!(why.contains("token"), "{why}"),
            r => panic!("granted without the token: {r:?}"),
        }
    }
    assert!(a.shm().is_empty(), "a refused request made segments");
    // With the token: granted.
    let info = c.shm_attach("guarded", 0, v).unwrap();
    assert_eq!(info.mapped.len(), 4);
    // An open version has no images.
    let open = c.create_version("guarded").unwrap();
    let info = c.shm_attach("guarded", 0, open).unwrap();
    assert!(info.mapped.is_empty(), "{info:?}");
    assert!(info.skipped[0].1.contains("open"), "{info:?}");
}

#[test]
fn a_version_dropped_while_mapped_stays_readable_and_the_server_lets_go() {
    let a = server(&[]);
    let c = client(&[&a], None);
    let v = fill(&c, "dropped", ValueType::Bytes, 8, 1);
    let keys = all_keys();
    let want = c.get("dropped", Keys::I64(&keys), v).unwrap();
    assert_eq!(c.shm_attach("dropped", 0, v).unwrap().mapped.len(), 8);
    assert_eq!(a.shm().len(), 8);
    // A newer version becomes current; the mapped one is dropped on the server.
    let v2 = c.create_version("dropped").unwrap();
    c.seal_version("dropped", v2).unwrap();
    c.set_current("dropped", v2).unwrap();
    c.drop_version("dropped", v).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.shm().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the server kept the dropped version's segments"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The reader still holds its mapping: the same answers, from shared memory.
    let before = c.shm_stats().hits;
    assert!(same(&c.get("dropped", Keys::I64(&keys), v).unwrap(), &want));
    assert!(c.shm_stats().hits > before);
    // Once detached, the version is gone for this reader too.
    assert!(c.shm_detach("dropped", 0, v));
    assert!(c.get("dropped", Keys::I64(&keys), v).is_err());
}

#[test]
fn shared_copies_are_charged_to_the_table_budget_and_what_does_not_fit_is_read_over_tcp() {
    // The same table on a roomy server shows how much it takes; a second server gets room for the
    // table and about half of a second copy, so some partitions are shared and the rest are not.
    let roomy = server(&[]);
    let probe = client(&[&roomy], None);
    fill(&probe, "budget", ValueType::Bytes, 8, 1);
    let used = roomy.node().tables.memory_used();
    let limit = format!("{}B", used + used / 2);
    let a = server(&["--table-memory", &limit]);
    let c = client(&[&a], None);
    let v = fill(&c, "budget", ValueType::Bytes, 8, 1);
    let before = a.node().tables.memory_used();
    let info = c.shm_attach("budget", 0, v).unwrap();
    assert!(
        !info.mapped.is_empty() && info.mapped.len() < 8,
        "{info:?} (used {before} of {limit})"
    );
    let tables = &a.node().tables;
    assert!(tables.memory_used() > before && tables.memory_used() <= tables.memory_limit());
    let keys = all_keys();
    let plain = client(&[&a], None);
    assert!(same(
        &c.get("budget", Keys::I64(&keys), v).unwrap(),
        &plain.get("budget", Keys::I64(&keys), v).unwrap()
    ));
    let s = c.shm_stats();
    assert!(s.hits > 0 && s.remote > 0, "{s:?}");
    // Dropping the table gives the copies' charge back with the table's.
    c.drop_table("budget").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.shm().is_empty() || a.node().tables.memory_used() > 0 {
        assert!(
            Instant::now() < deadline,
            "charge kept: {} bytes, {} segments",
            a.node().tables.memory_used(),
            a.shm().len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reader handle's answers: a batch through `get_into` and every key through `get_wire`.
fn through_reader(r: &ramgrid_client::ShmReader, vt: ValueType, keys: Keys<'_>) -> GetResult {
    let n = keys.len();
    let mut values = Values::zeroed(vt, n);
    let mut found = vec![false; n];
    let version = r
        .get_into(keys, &mut values.slice_mut(0..n), &mut found)
        .unwrap();
    let got = GetResult {
        values,
        found,
        version,
    };
    // One key at a time, borrowed from the mapping: the same answers.
    let (rows, _) = rows(&got);
    for (i, row) in rows.iter().enumerate() {
        let one = r.get_wire(&keys.key(i)).expect("the handle answers");
        assert_eq!(one.map(<[u8]>::to_vec), *row, "{vt:?}: key {i}");
    }
    got
}

#[test]
fn a_reader_handle_answers_as_tcp_for_every_value_type_and_missing_keys() {
    let a = server(&[]);
    let tcp = client(&[&a], None);
    let local = client(&[&a], None);
    for (i, vt) in [
        ValueType::Bytes,
        ValueType::I64,
        ValueType::F64,
        ValueType::F32Vec(3),
    ]
    .into_iter()
    .enumerate()
    {
        let t = format!("r{i}");
        let v = fill(&tcp, &t, vt, 16, 1);
        assert!(local.shm_reader(&t, 0, v).is_none(), "not attached yet");
        local.shm_attach(&t, 0, v).unwrap();
        let r = local.shm_reader(&t, 0, v).expect("attached");
        assert_eq!((r.table(), r.version(), r.value_type()), (&t[..], v, vt));
        let before = local.shm_stats();
        // Integer keys (present and missing), batches of 1 (no pipeline), 5 and many.
        let keys = all_keys();
        for batch in [&keys[..1], &keys[3..8], &keys[..]] {
            let want = tcp.get(&t, Keys::I64(batch), v).unwrap();
            assert!(
                same(&through_reader(&r, vt, Keys::I64(batch)), &want),
                "{vt:?}"
            );
        }
        // Byte keys, one longer than the wire allows: missing, as over TCP.
        let long = vec![b'k'; ramgrid_proto::native::MAX_KEY_LEN + 1];
        let slices: Vec<&[u8]> = vec![
            &b"x\0\0\0\0\0\0\0"[..],
            b"nope",
            &long,
            &[1, 0, 0, 0, 0, 0, 0, 0],
        ];
        let want = tcp.get(&t, Keys::Slices(&slices), v).unwrap();
        let got = through_reader(&r, vt, Keys::Slices(&slices));
        assert!(same(&got, &want), "{vt:?}");
        assert_eq!(got.found, [false, false, false, true]);
        // The handle's counters show in the client's: each key counted once per lookup.
        let after = local.shm_stats();
        let looked = (1 + 5 + keys.len() + slices.len()) as u64 * 2;
        assert_eq!(
            (after.hits + after.misses) - (before.hits + before.misses),
            looked
        );
        assert_eq!(after.remote, before.remote);
        // An output of another type, or of the wrong length, is the general path's error.
        let other = if vt == ValueType::I64 {
            ValueType::F64
        } else {
            ValueType::I64
        };
        let mut wrong = Values::zeroed(other, 1);
        assert!(r
            .get_into(Keys::I64(&[1]), &mut wrong.slice_mut(0..1), &mut [false])
            .is_err());
        let mut short = Values::zeroed(vt, 1);
        assert!(r
            .get_into(
                Keys::I64(&[1, 2]),
                &mut short.slice_mut(0..1),
                &mut [false; 2]
            )
            .is_err());
        drop(r);
        assert_eq!(
            local.shm_stats().hits,
            after.hits,
            "counters outlive their handle"
        );
        assert!(local.shm_detach(&t, 0, v));
    }
}

#[test]
fn a_reader_handle_after_detach_or_a_drop_reads_over_tcp_or_errors() {
    let a = server(&[]);
    let c = client(&[&a], None);
    let v = fill(&c, "gone", ValueType::I64, 8, 1);
    let keys = all_keys();
    let want = c.get("gone", Keys::I64(&keys), v).unwrap();
    c.shm_attach("gone", 0, v).unwrap();
    let r = c.shm_reader("gone", 0, v).unwrap();
    assert!(r.get_wire(&1i64.to_le_bytes()).is_some());
    // Inside tcp_only the handle does not answer.
    assert!(ramgrid_client::shm::tcp_only(|| r.get_wire(&1i64.to_le_bytes())).is_none());
    // Detached: the handle no longer answers from its mapping; reads through it go over TCP.
    assert!(c.shm_detach("gone", 0, v));
    assert_eq!(c.shm_stats().attached, 0);
    assert!(r.get_wire(&1i64.to_le_bytes()).is_none());
    let hits = c.shm_stats().hits;
    assert!(same(&through_tcp(&r, &keys), &want));
    assert_eq!(
        c.shm_stats().hits,
        hits,
        "nothing answered from shared memory"
    );
    // The version dropped on the server: a clear error, never the old mapping's bytes.
    let v2 = c.create_version("gone").unwrap();
    c.seal_version("gone", v2).unwrap();
    c.set_current("gone", v2).unwrap();
    c.drop_version("gone", v).unwrap();
    let mut out = Values::zeroed(ValueType::I64, 1);
    let e = r
        .get_into(Keys::I64(&[1]), &mut out.slice_mut(0..1), &mut [false])
        .unwrap_err();
    assert_eq!(e.kind(), ramgrid_client::ErrorKind::VersionNotFound, "{e}");
}

/// `r.get_into` for `keys` (I64 table), as a GetResult.
fn through_tcp(r: &ramgrid_client::ShmReader, keys: &[i64]) -> GetResult {
    let n = keys.len();
    let mut values = Values::zeroed(ValueType::I64, n);
    let mut found = vec![false; n];
    let version = r
        .get_into(Keys::I64(keys), &mut values.slice_mut(0..n), &mut found)
        .unwrap();
    GetResult {
        values,
        found,
        version,
    }
}

#[test]
fn a_reader_handle_of_a_table_created_again_refuses_and_mixed_batches_go_over_tcp_too() {
    let (a, b) = (server(&[]), server(&["--shm-dir", "off"]));
    let c = client(&[&a, &b], None);
    let v = fill(&c, "again", ValueType::I64, 8, 1);
    let keys = all_keys();
    let want = c.get("again", Keys::I64(&keys), v).unwrap();
    let info = c.shm_attach("again", 0, v).unwrap();
    assert!(!info.mapped.is_empty() && info.mapped.len() < 8, "{info:?}");
    let r = c.shm_reader("again", 0, v).unwrap();
    // Keys of partitions that are not mapped: the batch goes through the client, the mapped
    // partitions still answered in place.
    let mut out = Values::zeroed(ValueType::I64, keys.len());
    let mut found = vec![false; keys.len()];
    assert!(r
        .try_get_into(
            Keys::I64(&keys),
            &mut out.slice_mut(0..keys.len()),
            &mut found
        )
        .is_none());
    let before = c.shm_stats();
    assert!(same(&through_tcp(&r, &keys), &want));
    let after = c.shm_stats();
    assert!(
        after.hits > before.hits && after.remote > before.remote,
        "{after:?}"
    );
    // The table dropped and created again under its name (this client learns it): the handle
    // refuses as the general path does, never answering from the old table's mapping.
    c.drop_table("again").unwrap();
    fill(&c, "again", ValueType::I64, 8, 1);
    assert!(r.get_wire(&1i64.to_le_bytes()).is_none());
    let mut out = Values::zeroed(ValueType::I64, 1);
    let e = r
        .get_into(Keys::I64(&[1]), &mut out.slice_mut(0..1), &mut [false])
        .unwrap_err();
    assert_eq!(e.kind(), ramgrid_client::ErrorKind::TableNotFound, "{e}");
}
