//! Servers come and go without losing data: moves (add, remove) copy partitions to their new
//! holders while reads and writes go on, and a server restarted empty copies its partitions
//! back from their replicas before it serves them. Real server processes on loopback.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cluster, Server};
use ramgrid_client::{Client, Keys, ValueType, Values, ValuesRef};

fn keys(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn slices(names: &[String]) -> Vec<&[u8]> {
    names.iter().map(|s| s.as_bytes()).collect()
}

fn i64s(v: &Values) -> &[i64] {
    match v {
        Values::I64(v) => v,
        other => panic!("expected i64 values, got {other:?}"),
    }
}

/// Reads every key and checks every value exactly.
fn check_exact(c: &Client, table: &str, names: &[String], vals: &[i64], what: &str) {
    let ks = slices(names);
    for (chunk_k, chunk_v) in ks.chunks(5000).zip(vals.chunks(5000)) {
        let got = c
            .get(table, Keys::Slices(chunk_k), 0)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            got.found.iter().all(|&f| f),
            "{what}: a key read as missing"
        );
        assert_eq!(i64s(&got.values), chunk_v, "{what}: values differ");
    }
}

fn wait_repaired(c: &Client, addr: &str) {
    let start = Instant::now();
    loop {
        let s = c.server_status(addr).expect("status");
        if s.get("pending_partitions").map(String::as_str) == Some("0")
            && s.get("catalog_learned").map(String::as_str) == Some("1")
        {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{addr} not repaired: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 3 -> 4 -> 3 servers under a running writer and reader: every key reads exactly at every
/// step, every acknowledged write survives, and the moves copy few partitions.
#[test]
fn adding_and_removing_a_server_under_load_keeps_every_value() {
    let mut cluster = Cluster::start(3);
    let c = cluster.client();
    // A sealed version (current) and an open table written during the moves.
    c.create_table("sealed", 32, 2, ValueType::I64).unwrap();
    let names = keys(20_000, "s");
    let vals: Vec<i64> = (0..names.len() as i64).map(|i| i * 3).collect();
    c.put(
        "sealed",
        Keys::Slices(&slices(&names)),
        ValuesRef::I64(&vals),
        0,
    )
    .unwrap();
    assert_eq!(c.create_version("sealed").unwrap(), 2);
    c.put(
        "sealed",
        Keys::Slices(&slices(&names)),
        ValuesRef::I64(&vals),
        2,
    )
    .unwrap();
    c.seal_version("sealed", 2).unwrap();
    c.set_current("sealed", 2).unwrap();
    c.create_table("open", 16, 2, ValueType::I64).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let writer = {
        let (stop, acked, config) = (stop.clone(), acked.clone(), cluster.config());
        std::thread::spawn(move || {
            let w = Client::new(config).unwrap();
            let mut round = 0i64;
            while !stop.load(Ordering::Acquire) && round < 2000 {
                let names = keys(200, &format!("w{round}-"));
                let vals: Vec<i64> = (0..200).map(|i| round * 1000 + i).collect();
                match w.put(
                    "open",
                    Keys::Slices(&slices(&names)),
                    ValuesRef::I64(&vals),
                    0,
                ) {
                    Ok(_) => acked.lock().unwrap().extend(names.into_iter().zip(vals)),
                    Err(ramgrid_client::Error::Batch { failures }) => {
                        let bad: std::collections::HashSet<usize> =
                            failures.iter().map(|f| f.0).collect();
                        let mut a = acked.lock().unwrap();
                        for (i, (n, v)) in names.into_iter().zip(vals).enumerate() {
                            if !bad.contains(&i) {
                                a.push((n, v));
                            }
                        }
                    }
                    Err(_) => {}
                }
                round += 1;
            }
        })
    };
    let reader = {
        let (stop, config, names, vals) =
            (stop.clone(), cluster.config(), names.clone(), vals.clone());
        std::thread::spawn(move || {
            let r = Client::new(config).unwrap();
            let mut reads = 0usize;
            while !stop.load(Ordering::Acquire) {
                check_exact(
                    &r,
                    "sealed",
                    &names[..2000],
                    &vals[..2000],
                    "reader during a move",
                );
                reads += 1;
            }
            reads
        })
    };

    std::thread::sleep(Duration::from_millis(200));
    let fourth = Server::start(&[]);
    let grown = c.add_server(&fourth.addr).expect("add a server");
    assert_eq!(grown.to.len(), 4);
    assert!(grown.partitions_copied > 0, "{grown:?}");
    // Rendezvous with a cap: a fourth server takes about a quarter of each table's copies.
    assert!(
        grown.partitions_copied < (2 * 32 + 16 * 2) as u64,
        "moved too much: {grown:?}"
    );
    check_exact(&c, "sealed", &names, &vals, "after 3 -> 4");
    let fresh = Client::new(cluster.config()).unwrap();
    check_exact(&fresh, "sealed", &names, &vals, "a new client after 3 -> 4");

    let first = cluster.servers[0].addr.clone();
    let shrunk = c.remove_server(&first).expect("remove a server");
    assert_eq!(shrunk.to.len(), 3);
    assert!(!shrunk.to.contains(&first));
    check_exact(&c, "sealed", &names, &vals, "after 4 -> 3");

    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    assert!(reader.join().unwrap() > 0);
    // The removed server is gone for good; every acknowledged write is still there.
    cluster.servers[0].kill();
    let acked = acked.lock().unwrap().clone();
    assert!(!acked.is_empty());
    let (an, av): (Vec<String>, Vec<i64>) = acked.into_iter().unzip();
    check_exact(
        &c,
        "open",
        &an,
        &av,
        "acknowledged writes after 3 -> 4 -> 3",
    );
    check_exact(
        &c,
        "sealed",
        &names,
        &vals,
        "sealed after the removed server died",
    );
}

/// A server killed and started empty on its address learns the spec and the tables from its
/// peers, copies its partitions back, and then survives the loss of another server: the data it
/// serves is whole.
#[test]
fn a_restarted_server_repairs_itself_before_serving() {
    let mut cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 16, 2, ValueType::I64).unwrap();
    let names = keys(30_000, "k");
    let vals: Vec<i64> = (0..names.len() as i64).map(|i| i * 7 - 5).collect();
    c.put("t", Keys::Slices(&slices(&names)), ValuesRef::I64(&vals), 0)
        .unwrap();

    let others: Vec<String> = vec![
        cluster.servers[0].addr.clone(),
        cluster.servers[2].addr.clone(),
    ];
    // A control plane to fail the dead server over: the write below waits for it.
    wait_group(&c, 3);
    cluster.servers[1].kill();
    // Written while it is down (once the group failed it over: a partition's primary completes a
    // write on every replica of the spec): the repair must bring these too.
    let later = keys(2_000, "later");
    let later_vals: Vec<i64> = (0..later.len() as i64).collect();
    let w = Client::new(cluster.config()).unwrap();
    w.put(
        "t",
        Keys::Slices(&slices(&later)),
        ValuesRef::I64(&later_vals),
        0,
    )
    .unwrap();

    // Started empty with --join: no client has to push anything.
    let join = others.join(",");
    let addr = cluster.servers[1].addr.clone();
    cluster.servers[1] = Server::start_at(&addr, &["--join", &join]);
    check_exact(&c, "t", &names, &vals, "reads while it repairs");
    // Failed over while it was down: the group brings it back through a move, then it copies.
    let back = Instant::now();
    while !c.servers().contains(&addr) {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "{addr} not back in the spec"
        );
        std::thread::sleep(Duration::from_millis(50));
        let _ = c.refresh_spec();
    }
    wait_repaired(&c, &addr);
    let status = c.server_status(&addr).unwrap();
    assert_ne!(
        status.get("copied_partitions").map(String::as_str),
        Some("0")
    );

    // Now the others die one at a time: what the repaired server serves must be whole.
    cluster.servers[0].kill();
    check_exact(&c, "t", &names, &vals, "after server 0 died");
    check_exact(
        &c,
        "t",
        &later,
        &later_vals,
        "later writes after server 0 died",
    );
}

/// Waits (up to 20 s) until every server of `c`'s spec is in a metadata group of `members` with a
/// leader.
fn wait_group(c: &Client, members: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let formed = c.servers().iter().all(|a| {
            c.server_status(a).is_ok_and(|s| {
                s.get("meta_members") == Some(&members.to_string())
                    && s.get("meta_leader").is_some_and(|l| l != "none")
            })
        });
        if formed {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no metadata group formed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends SET_SPEC with `spec` to `addr` on a raw connection; the server's answer.
fn raw_set_spec(addr: &str, spec: &ramgrid_client::ClusterSpec) -> Result<(), String> {
    use ramgrid_proto::native::{parse_frame, Hello, Request, Response, PROTOCOL_VERSION};
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let text = spec.to_text();
    let mut out = Vec::new();
    Request::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        token: b"",
        client_name: "test",
    })
    .encode(&mut out, 1)
    .unwrap();
    Request::SetSpec {
        spec: text.as_bytes(),
    }
    .encode(&mut out, 2)
    .unwrap();
    sock.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut answers = Vec::new();
    while answers.len() < 2 {
        let n = sock.read(&mut chunk).unwrap();
        assert!(n > 0, "closed");
        buf.extend_from_slice(&chunk[..n]);
        while let Ok((frame, used)) = parse_frame(&buf, 1 << 20) {
            answers.push(match Response::decode(&frame).unwrap() {
                Response::Error(e) => Err(format!("{} {}", e.status.name(), e.message)),
                _ => Ok(()),
            });
            buf.drain(..used);
        }
    }
    answers.pop().unwrap()
}

/// Two moves at once: a server in a move refuses another, and so does the client; asking for
/// the same move again finishes it (a coordinator that died mid-move).
#[test]
fn a_second_move_is_refused_while_one_is_in_progress() {
    let cluster = Cluster::start(2);
    let c = cluster.client();
    c.create_table("t", 8, 2, ValueType::I64).unwrap();
    let names = keys(1000, "k");
    let vals: Vec<i64> = (0..1000).collect();
    c.put("t", Keys::Slices(&slices(&names)), ValuesRef::I64(&vals), 0)
        .unwrap();
    let extra = Server::start(&[]);
    let other = Server::start(&[]);
    let (a, b) = (
        cluster.servers[0].addr.clone(),
        cluster.servers[1].addr.clone(),
    );
    // A move left in progress, as a coordinator that died after step 1 leaves it.
    let to = vec![a.clone(), b.clone(), extra.addr.clone()];
    let moving = c.spec().with_next(to.clone()).unwrap();
    for m in moving.members() {
        raw_set_spec(&m, &moving).unwrap();
    }
    let another = c
        .spec()
        .with_next(vec![a.clone(), other.addr.clone()])
        .unwrap();
    let refused = raw_set_spec(&a, &another).unwrap_err();
    assert!(refused.contains("in progress"), "{refused}");
    let err = c
        .move_to(vec![a.clone(), other.addr.clone()], Duration::from_secs(30))
        .unwrap_err();
    assert!(err.to_string().contains("in progress"), "{err}");
    // The same move again completes it.
    let done = c.move_to(to.clone(), Duration::from_secs(30)).unwrap();
    assert_eq!(done.to, to);
    check_exact(&c, "t", &names, &vals, "after the resumed move");
}

/// A move whose new server cannot take its copies (here: no memory for them) is undone when it
/// times out: the old servers serve every read and take every write again.
#[test]
fn a_move_that_cannot_finish_is_undone() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 16, 2, ValueType::I64).unwrap();
    let names = keys(50_000, "k");
    let vals: Vec<i64> = (0..names.len() as i64).collect();
    c.put("t", Keys::Slices(&slices(&names)), ValuesRef::I64(&vals), 0)
        .unwrap();
    let before = c.epoch();
    // A move is refused until the group has formed (it answers "retry when ... names a leader").
    wait_group(&c, 3);
    let starved = Server::start(&["--table-memory", "64KiB"]);
    let mut to = cluster.addrs();
    to.push(starved.addr.clone());
    let err = c.move_to(to, Duration::from_secs(3)).unwrap_err();
    assert!(err.to_string().contains("undone"), "{err}");
    c.refresh_spec().unwrap();
    assert_eq!(c.epoch(), before);
    check_exact(&c, "t", &names, &vals, "after the undone move");
    let more = keys(1000, "after");
    let more_vals: Vec<i64> = (0..1000).collect();
    c.put(
        "t",
        Keys::Slices(&slices(&more)),
        ValuesRef::I64(&more_vals),
        0,
    )
    .expect("writes flow again");
    check_exact(&c, "t", &more, &more_vals, "writes after the undone move");
}
