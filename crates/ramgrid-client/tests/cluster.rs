//! Multi-server tests on loopback: real `ramgrid-server` processes, killed with SIGKILL where a test
//! needs a fault. Every loop is bounded in count; nothing sleeps to wait for a state.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Cluster, Server};

use ramgrid_client::{Client, ClientConfig, ErrorKind, Keys, ValueType, Values, ValuesRef};
use ramgrid_proto::cluster::PartitionMap;

fn f64_values(v: &Values) -> &[f64] {
    match v {
        Values::F64(v) => v,
        other => panic!("expected f64 values, got {other:?}"),
    }
}

fn i64_values(v: &Values) -> &[i64] {
    match v {
        Values::I64(v) => v,
        other => panic!("expected i64 values, got {other:?}"),
    }
}

#[test]
fn put_and_get_every_value_type_and_key_form() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("b", 16, 2, ValueType::Bytes).unwrap();
    c.create_table("i", 16, 1, ValueType::I64).unwrap();
    c.create_table("f", 16, 3, ValueType::F64).unwrap();
    c.create_table("v", 16, 2, ValueType::F32Vec(3)).unwrap();
    assert_eq!(
        c.create_table("b", 16, 2, ValueType::Bytes)
            .unwrap_err()
            .kind(),
        ErrorKind::TableExists
    );

    let n = 3000usize;
    let ints: Vec<i64> = (0..n as i64).map(|i| i * 7919 - 5000).collect();
    let names: Vec<String> = (0..n).map(|i| format!("key:{i}")).collect();
    let slices: Vec<&[u8]> = names.iter().map(|s| s.as_bytes()).collect();
    let mut offsets = vec![0i64];
    let mut data = Vec::new();
    for s in &names {
        data.extend_from_slice(s.as_bytes());
        offsets.push(data.len() as i64);
    }

    // bytes: written as slices, read back packed; value i is i bytes of (i % 251).
    let vals: Vec<Vec<u8>> = (0..n).map(|i| vec![(i % 251) as u8; i % 40]).collect();
    let vslices: Vec<&[u8]> = vals.iter().map(Vec::as_slice).collect();
    c.put("b", Keys::Slices(&slices), ValuesRef::Slices(&vslices), 0)
        .unwrap();
    let got = c
        .get(
            "b",
            Keys::Packed {
                offsets: &offsets,
                data: &data,
            },
            0,
        )
        .unwrap();
    assert_eq!(got.version, 1);
    assert!(got.found.iter().all(|&f| f));
    let Values::Bytes(b) = &got.values else {
        panic!()
    };
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(b.get(i), &v[..], "bytes key {i}");
    }

    // i64 keyed by ints, with misses mixed in.
    let ivals: Vec<i64> = ints.iter().map(|k| k * 3).collect();
    c.put("i", Keys::I64(&ints), ValuesRef::I64(&ivals), 0)
        .unwrap();
    let mut probe = ints.clone();
    probe.extend([i64::MAX, i64::MIN, 1]);
    let got = c.get("i", Keys::I64(&probe), 0).unwrap();
    assert_eq!(&i64_values(&got.values)[..n], &ivals[..]);
    assert_eq!(&got.found[n..], &[false, false, ints.contains(&1)]);

    // f64 over 3 replicas.
    let fvals: Vec<f64> = (0..n).map(|i| i as f64 / 3.0).collect();
    c.put("f", Keys::Slices(&slices), ValuesRef::F64(&fvals), 0)
        .unwrap();
    let got = c.get("f", Keys::Slices(&slices), 0).unwrap();
    assert_eq!(f64_values(&got.values), &fvals[..]);

    // f32 vectors.
    let vv: Vec<f32> = (0..n * 3).map(|i| i as f32 * 0.5).collect();
    c.put("v", Keys::I64(&ints), ValuesRef::F32(&vv), 0)
        .unwrap();
    let got = c.get("v", Keys::I64(&ints), 0).unwrap();
    assert_eq!(
        got.values,
        Values::F32Vec {
            dim: 3,
            data: vv.clone()
        }
    );

    // Wrong value type is refused before anything is sent.
    assert_eq!(
        c.put("v", Keys::I64(&ints), ValuesRef::F64(&fvals), 0)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );

    // Delete a third; they read back missing, the rest stay.
    let del: Vec<i64> = ints.iter().copied().step_by(3).collect();
    assert_eq!(c.delete("i", Keys::I64(&del), 0).unwrap(), del.len());
    let got = c.get("i", Keys::I64(&ints), 0).unwrap();
    for (j, f) in got.found.iter().enumerate() {
        assert_eq!(*f, j % 3 != 0, "key {j}");
    }

    // A big batch is cut into several frames and comes back whole and in order.
    let many: Vec<i64> = (0..200_000).collect();
    let mv: Vec<f64> = many.iter().map(|&k| k as f64).collect();
    c.create_table("big", 64, 1, ValueType::F64).unwrap();
    c.put("big", Keys::I64(&many), ValuesRef::F64(&mv), 0)
        .unwrap();
    let got = c.get("big", Keys::I64(&many), 0).unwrap();
    assert_eq!(f64_values(&got.values), &mv[..]);
}

#[test]
fn admin_tables_and_versions() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 8, 2, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..100).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();

    let d = c.describe_table("t").unwrap();
    assert_eq!(
        (d.partitions, d.replication, d.value_type, d.current_version),
        (8, 2, ValueType::I64, 1)
    );
    assert_eq!(d.versions.len(), 1);
    assert_eq!(
        d.versions[0].items, 100,
        "items are counted once over replicas"
    );
    let names: Vec<String> = c
        .list_tables()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["t"]);

    let v2 = c.create_version("t").unwrap();
    assert_eq!(v2, 2);
    let twice: Vec<i64> = keys.iter().map(|k| k * 2).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&twice), v2)
        .unwrap();
    // Not sealed: cannot become current.
    assert_eq!(
        c.set_current("t", v2).unwrap_err().kind(),
        ErrorKind::VersionNotSealed
    );
    assert_eq!(
        i64_values(&c.get("t", Keys::I64(&keys), 0).unwrap().values),
        &keys[..]
    );
    c.seal_version("t", v2).unwrap();
    assert_eq!(
        c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), v2)
            .unwrap_err()
            .kind(),
        ErrorKind::VersionSealed
    );
    c.set_current("t", v2).unwrap();
    assert_eq!(c.current_version("t").unwrap(), 2);
    let got = c.get("t", Keys::I64(&keys), 0).unwrap();
    assert_eq!((got.version, i64_values(&got.values)), (2, &twice[..]));
    // The old version stays readable when pinned, until dropped.
    assert_eq!(
        i64_values(&c.get("t", Keys::I64(&keys), 1).unwrap().values),
        &keys[..]
    );
    c.drop_version("t", 1).unwrap();
    assert_eq!(
        c.get("t", Keys::I64(&keys), 1).unwrap_err().kind(),
        ErrorKind::VersionNotFound
    );
    assert_eq!(c.create_version("t").unwrap(), 3);

    c.drop_table("t").unwrap();
    assert_eq!(
        c.get("t", Keys::I64(&keys), 0).unwrap_err().kind(),
        ErrorKind::TableNotFound
    );
    assert_eq!(
        c.drop_table("t").unwrap_err().kind(),
        ErrorKind::TableNotFound
    );
}

#[test]
fn near_cache_serves_pinned_sealed_versions() {
    let cluster = Cluster::start(2);
    let mut cfg = cluster.config();
    cfg.near_cache_bytes = 1 << 20;
    let c = Client::new(cfg).unwrap();
    c.push_spec().unwrap();
    c.create_table("t", 8, 1, ValueType::F64).unwrap();
    let keys: Vec<i64> = (0..500).collect();
    let vals: Vec<f64> = keys.iter().map(|&k| k as f64 + 0.5).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::F64(&vals), 1)
        .unwrap();
    // Open version: never cached.
    c.get("t", Keys::I64(&keys), 1).unwrap();
    assert_eq!(c.near_stats().entries, 0);
    c.seal_version("t", 1).unwrap();
    let first = c.get("t", Keys::I64(&keys), 1).unwrap();
    let s1 = c.near_stats();
    assert_eq!((s1.hits, s1.entries), (0, 500));
    let second = c.get("t", Keys::I64(&keys), 1).unwrap();
    assert_eq!(first, second);
    assert_eq!(f64_values(&second.values), &vals[..]);
    assert_eq!(c.near_stats().hits, 500);
}

#[test]
fn sigkill_mid_run_replicated_reads_everything_unreplicated_names_partitions() {
    let mut cluster = Cluster::start(4);
    let c = cluster.client();
    let parts = 32;
    c.create_table("rep", parts, 2, ValueType::I64).unwrap();
    c.create_table("one", parts, 1, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..20_000).collect();
    c.put("rep", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();
    c.put("one", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();

    // A reader runs batches while the server dies under it; every batch must be complete.
    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (c, keys, stop, batches) = (c.clone(), keys.clone(), stop.clone(), batches.clone());
        std::thread::spawn(move || {
            for _ in 0..10_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let got = c.get("rep", Keys::I64(&keys), 0).expect("replicated read");
                assert!(
                    got.found.iter().all(|&f| f),
                    "a replicated value went missing"
                );
                assert_eq!(i64_values(&got.values), &keys[..]);
                batches.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Let the reader get going (bounded spin on its progress, not a sleep).
    for _ in 0..2_000_000 {
        if batches.load(Ordering::SeqCst) >= 2 {
            break;
        }
        std::thread::yield_now();
    }
    let victim = 1;
    cluster.servers[victim].kill();
    let after = batches.load(Ordering::SeqCst);
    for _ in 0..20_000_000 {
        if batches.load(Ordering::SeqCst) >= after + 3 || reader.is_finished() {
            break;
        }
        std::thread::yield_now();
    }
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("reader saw every value");
    assert!(
        batches.load(Ordering::SeqCst) >= after + 3,
        "reader made progress after the kill"
    );

    // Unreplicated: exactly the victim's partitions are named, never a silent miss.
    let map = PartitionMap::new(&c.spec(), parts, 1);
    let expect: Vec<u32> = (0..parts)
        .filter(|&p| map.primary(p) == Some(victim as u32))
        .collect();
    assert!(!expect.is_empty());
    match c.get("one", Keys::I64(&keys), 0) {
        Err(ramgrid_client::Error::PartitionsUnavailable { partitions, .. }) => {
            assert_eq!(partitions, expect)
        }
        other => panic!("expected PartitionsUnavailable, got {other:?}"),
    }

    // Replicated writes while the victim is down. The write waits for the victim's partitions to
    // get another primary; whether the metadata group fails the victim over within that wait (then
    // the whole write succeeds) or not (then the partitions whose primary is the victim are named,
    // never others), every key of a partition not named reads back the new value: nothing is lost
    // silently. (Both happen: the fail-over takes --failure-timeout-ms, 5 s, and longer under load.)
    let map2 = PartitionMap::new(&c.spec(), parts, 2);
    let part2 = |k: &i64| map2.partition_of(&k.to_le_bytes());
    let victim_primary: Vec<u32> = (0..parts)
        .filter(|&p| map2.primary(p) == Some(victim as u32))
        .collect();
    let bumped: Vec<i64> = keys.iter().map(|k| k + 7).collect();
    let named = match c.put("rep", Keys::I64(&keys), ValuesRef::I64(&bumped), 0) {
        Ok(()) => Vec::new(),
        Err(ramgrid_client::Error::PartitionsUnavailable { partitions, detail }) => {
            assert!(
                partitions.iter().all(|p| victim_primary.contains(p)),
                "named {partitions:?}, not all of them the victim's {victim_primary:?}: {detail}"
            );
            assert!(detail.contains("not written"), "{detail}");
            partitions
        }
        Err(other) => panic!("expected success or PartitionsUnavailable, got {other:?}"),
    };
    let clear: Vec<i64> = keys
        .iter()
        .copied()
        .filter(|k| !named.contains(&part2(k)))
        .collect();
    assert!(!clear.is_empty());
    let got = c.get("rep", Keys::I64(&clear), 0).unwrap();
    let want: Vec<i64> = clear.iter().map(|k| k + 7).collect();
    assert_eq!(i64_values(&got.values), &want[..]);
    // Unreplicated writes to the lost partitions: the partitions are named, the other keys stored.
    let more: Vec<i64> = keys.iter().map(|k| k + 1_000_000).collect();
    match c.put("one", Keys::I64(&more), ValuesRef::I64(&more), 0) {
        Err(ramgrid_client::Error::PartitionsUnavailable { partitions, .. }) => {
            let hit: std::collections::BTreeSet<u32> = more
                .iter()
                .map(|k| map.partition_of(&k.to_le_bytes()))
                .filter(|p| expect.contains(p))
                .collect();
            assert_eq!(partitions, hit.into_iter().collect::<Vec<_>>());
        }
        other => panic!("expected PartitionsUnavailable, got {other:?}"),
    }
    let alive: Vec<i64> = more
        .iter()
        .copied()
        .filter(|k| !expect.contains(&map.partition_of(&k.to_le_bytes())))
        .collect();
    let got = c.get("one", Keys::I64(&alive), 0).unwrap();
    assert!(
        got.found.iter().all(|&f| f),
        "keys of reachable partitions were stored"
    );
}

#[test]
fn stale_spec_is_refreshed_and_retried() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 16, 1, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..1000).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();

    // A client that knows only two of the servers routes with another epoch: refused, it fetches the
    // servers' spec, adopts it, retries, and reads everything.
    let mut cfg = cluster.config();
    cfg.servers.truncate(2);
    let stale = Client::new(cfg).unwrap();
    assert_ne!(stale.epoch(), c.epoch());
    let got = stale.get("t", Keys::I64(&keys), 0).unwrap();
    assert!(got.found.iter().all(|&f| f));
    assert_eq!(i64_values(&got.values), &keys[..]);
    assert_eq!(stale.epoch(), c.epoch());
    assert_eq!(stale.servers(), c.servers());
}

#[test]
fn version_switch_is_atomic_for_a_concurrent_reader() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 24, 1, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..2000).collect();
    c.put(
        "t",
        Keys::I64(&keys),
        ValuesRef::I64(&vec![1; keys.len()]),
        0,
    )
    .unwrap();
    c.seal_version("t", 1).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (c, keys, stop) = (c.clone(), keys.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..100_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let got = c.get("t", Keys::I64(&keys), 0).expect("read");
                let v = i64_values(&got.values);
                // Every value of a batch comes from one version, and that is the version reported.
                assert!(
                    v.iter().all(|&x| x == got.version as i64),
                    "mixed versions in one batch: {:?}",
                    &v[..8]
                );
                seen.insert(got.version);
            }
            seen
        })
    };
    for round in 2..=12u32 {
        let v = c.create_version("t").unwrap();
        assert_eq!(v, round);
        c.put(
            "t",
            Keys::I64(&keys),
            ValuesRef::I64(&vec![v as i64; keys.len()]),
            v,
        )
        .unwrap();
        c.seal_version("t", v).unwrap();
        c.set_current("t", v).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let seen = reader.join().expect("reader never saw a mixed batch");
    assert!(!seen.is_empty());
}

#[test]
fn wrong_token_is_refused_right_token_works() {
    let cluster = Cluster::start_with(2, &["--token", "s3cret"]);
    let mut cfg = cluster.config();
    cfg.token = Some("wrong".into());
    let bad = Client::new(cfg.clone()).unwrap();
    assert_eq!(bad.push_spec().unwrap_err().kind(), ErrorKind::Auth);
    cfg.token = None;
    let none = Client::new(cfg.clone()).unwrap();
    assert_eq!(none.push_spec().unwrap_err().kind(), ErrorKind::Auth);
    cfg.token = Some("s3cret".into());
    let good = Client::new(cfg).unwrap();
    good.push_spec().unwrap();
    good.create_table("t", 4, 1, ValueType::I64).unwrap();
    good.put("t", Keys::I64(&[1]), ValuesRef::I64(&[2]), 0)
        .unwrap();
    assert_eq!(
        bad.get("t", Keys::I64(&[1]), 0).unwrap_err().kind(),
        ErrorKind::Auth
    );
}

#[test]
fn unreachable_cluster_is_an_error_not_a_miss() {
    // Ports from servers that were started and killed: nothing listens there now.
    let addrs: Vec<String> = (0..2)
        .map(|_| {
            let mut s = Server::start(&[]);
            s.kill();
            s.addr.clone()
        })
        .collect();
    let c = Client::new(ClientConfig::new(addrs)).unwrap();
    assert_eq!(
        c.get("t", Keys::I64(&[1]), 0).unwrap_err().kind(),
        ErrorKind::ConnectionFailed
    );
}

#[test]
fn a_stopped_server_times_out_and_reads_fail_over() {
    let cluster = Cluster::start(3);
    let mut cfg = cluster.config();
    cfg.timeout = Duration::from_millis(300);
    let c = Client::new(cfg).unwrap();
    c.push_spec().unwrap();
    c.create_table("t", 12, 2, ValueType::F64).unwrap();
    let keys: Vec<i64> = (0..3000).collect();
    let vals: Vec<f64> = keys.iter().map(|&k| k as f64 * 1.5).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::F64(&vals), 0)
        .unwrap();
    // SIGSTOP: the process keeps its socket open but never answers, like a hung or very slow server.
    let paused = cluster.servers[0].pause();
    let got = c.get("t", Keys::I64(&keys), 0);
    drop(paused);
    let got = got.expect("reads fail over from the stopped server");
    assert!(got.found.iter().all(|&f| f));
    assert_eq!(f64_values(&got.values), &vals[..]);
}

#[test]
fn concurrent_batches_share_one_client() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 16, 2, ValueType::I64).unwrap();
    let threads: Vec<_> = (0..8i64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for round in 0..20i64 {
                    let keys: Vec<i64> =
                        (0..500).map(|k| t * 1_000_000 + round * 1000 + k).collect();
                    let vals: Vec<i64> = keys.iter().map(|k| k ^ 0x5a5a).collect();
                    c.put("t", Keys::I64(&keys), ValuesRef::I64(&vals), 0)
                        .unwrap();
                    let got = c.get("t", Keys::I64(&keys), 0).unwrap();
                    assert_eq!(i64_values(&got.values), &vals[..]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread saw its own writes");
    }
    let d = c.describe_table("t").unwrap();
    assert_eq!(d.versions[0].items, 8 * 20 * 500);
}

#[test]
fn racing_create_version_calls_get_distinct_numbers() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 8, 1, ValueType::I64).unwrap();
    let racers: Vec<_> = (0..3)
        .map(|_| {
            let c = Client::new(cluster.config()).unwrap();
            std::thread::spawn(move || {
                (0..4)
                    .map(|_| c.create_version("t").unwrap())
                    .collect::<Vec<u32>>()
            })
        })
        .collect();
    let mut all: Vec<u32> = racers.into_iter().flat_map(|r| r.join().unwrap()).collect();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "two calls returned the same version");
    // Every returned version exists on every server: sealing it is refused by any server without it.
    for v in &all {
        c.seal_version("t", *v)
            .unwrap_or_else(|e| panic!("version {v}: {e}"));
    }
}

#[test]
fn a_key_too_long_for_the_wire_fails_alone() {
    let cluster = Cluster::start(2);
    let c = cluster.client();
    c.create_table("t", 8, 2, ValueType::Bytes).unwrap();
    let long = vec![b'k'; 70_000];
    let keys: [&[u8]; 4] = [b"a", &long, b"", b"d"];
    let vals: [&[u8]; 4] = [b"1", b"2", b"3", b"4"];
    match c.put("t", Keys::Slices(&keys), ValuesRef::Slices(&vals), 0) {
        Err(ramgrid_client::Error::Batch { failures }) => {
            assert_eq!(failures.len(), 1, "{failures:?}");
            assert_eq!(failures[0].0, 1);
            assert!(failures[0].1.contains("KEY_TOO_LARGE"), "{failures:?}");
        }
        other => panic!("expected a batch error, got {other:?}"),
    }
    let got = c.get("t", Keys::Slices(&keys), 0).unwrap();
    assert_eq!(got.found, [true, false, true, true]);
    let Values::Bytes(b) = &got.values else {
        panic!()
    };
    assert_eq!(
        (b.get(0), b.get(2), b.get(3)),
        (&b"1"[..], &b"3"[..], &b"4"[..])
    );
}

/// Values too large for one reply frame: each server refuses its GET as too large rather than
/// compose it (`--max-frame` 1 MiB here), and the client reads the batch in halves instead.
#[test]
fn a_read_whose_values_pass_the_servers_limit_is_split() {
    let cluster = Cluster::start_with(2, &["--max-frame", "1MiB"]);
    let c = cluster.client();
    c.create_table("blobs", 8, 1, ValueType::Bytes).unwrap();
    let names: Vec<String> = (0..24).map(|i| format!("blob:{i}")).collect();
    let keys: Vec<&[u8]> = names.iter().map(|s| s.as_bytes()).collect();
    let vals: Vec<Vec<u8>> = (0..24).map(|i| vec![i as u8; 200_000 + i]).collect();
    for (k, v) in keys.iter().zip(&vals) {
        c.put(
            "blobs",
            Keys::Slices(std::slice::from_ref(k)),
            ValuesRef::Slices(&[v.as_slice()]),
            0,
        )
        .unwrap();
    }
    // ~4.8 MB of values: well past one 1 MiB reply per server.
    let got = c.get("blobs", Keys::Slices(&keys), 0).unwrap();
    assert!(got.found.iter().all(|&f| f));
    let Values::Bytes(b) = &got.values else {
        panic!("bytes table")
    };
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(b.get(i), &v[..], "value {i}");
    }
}
