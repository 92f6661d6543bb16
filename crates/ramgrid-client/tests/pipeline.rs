//! Pipelined reads (`pipeline.rs`) against real servers: results in order and exact against a
//! model, a server killed with batches in flight, bad input in the middle of a stream, and the
//! replica rule (reads spread over replicas when every replica holds the data).

mod common;

use std::collections::HashMap;

use common::Cluster;
use ramgrid_client::pipeline::get_pipelined;
use ramgrid_client::{Client, Consistency, Keys, OwnedKeys, ValueType, Values, ValuesRef};

fn f64s(v: &Values) -> &[f64] {
    match v {
        Values::F64(v) => v,
        other => panic!("expected f64 values, got {other:?}"),
    }
}

/// A small deterministic generator (no timing, no seed from the clock).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Keys 0..n stored with value key * 0.5; the model holds what was stored.
fn load(c: &Client, table: &str, n: i64) -> HashMap<i64, f64> {
    let keys: Vec<i64> = (0..n).collect();
    let values: Vec<f64> = keys.iter().map(|&k| k as f64 * 0.5).collect();
    c.put(table, Keys::I64(&keys), ValuesRef::F64(&values), 0)
        .unwrap();
    keys.into_iter().zip(values).collect()
}

/// Batches of random keys, a quarter of them never stored.
fn batches(count: usize, size: usize, n: i64, seed: u64) -> Vec<Vec<i64>> {
    let mut rng = Lcg(seed);
    (0..count)
        .map(|_| {
            (0..size)
                .map(|_| (rng.next() % (n as u64 * 4 / 3)) as i64)
                .collect()
        })
        .collect()
}

fn check(model: &HashMap<i64, f64>, keys: &[i64], got: &ramgrid_client::GetResult) {
    let values = f64s(&got.values);
    for (i, k) in keys.iter().enumerate() {
        match model.get(k) {
            Some(v) => assert!(got.found[i] && values[i] == *v, "key {k}"),
            None => assert!(!got.found[i] && values[i] == 0.0, "key {k}"),
        }
    }
}

#[test]
fn results_come_back_in_order_and_exact() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 16, 2, ValueType::F64).unwrap();
    let model = load(&c, "t", 5000);
    let work = batches(300, 37, 5000, 1);
    let mut seen = 0;
    get_pipelined(
        &c,
        "t",
        work.iter().map(|b| Keys::I64(b)),
        0,
        8,
        |i, r| -> Result<(), ()> {
            assert_eq!(i, seen);
            check(&model, &work[i], &r.expect("batch"));
            seen += 1;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(seen, work.len());
    // With every server up, no batch needed the unpipelined path.
    let mut p = c.pipeline();
    for b in &work[..20] {
        p.submit("t", OwnedKeys::I64(b.clone()), 0, 0);
    }
    for b in &work[..20] {
        check(&model, b, &p.next().unwrap().unwrap());
    }
    assert_eq!(p.redone(), 0);
}

#[test]
fn a_server_killed_with_batches_in_flight_fails_over_exactly() {
    let mut cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 12, 2, ValueType::F64).unwrap();
    let model = load(&c, "t", 3000);
    let work = batches(120, 50, 3000, 2);
    let mut p = c.pipeline();
    // 40 batches in flight on every server's lane, then one server dies before any is read.
    for b in &work[..40] {
        p.submit("t", OwnedKeys::I64(b.clone()), 0, 0);
    }
    cluster.servers[1].kill();
    for b in &work[..40] {
        check(&model, b, &p.next().unwrap().expect("failed over"));
    }
    // The stream goes on without it.
    for (i, b) in work[40..].iter().enumerate() {
        p.submit("t", OwnedKeys::I64(b.clone()), 0, 0);
        if i % 4 == 3 {
            for r in p.by_ref() {
                let _ = r.expect("batch");
            }
        }
    }
    for r in p.by_ref() {
        let _ = r.expect("batch");
    }
    // Every result is exact (read again in order to compare).
    let mut p = c.pipeline();
    for b in &work {
        p.submit("t", OwnedKeys::I64(b.clone()), 0, 0);
    }
    for b in &work {
        check(&model, b, &p.next().unwrap().unwrap());
    }
    assert!(
        p.redone() < work.len() as u64,
        "lanes to the live servers work"
    );
}

#[test]
fn bad_input_fails_its_batch_only_with_the_plain_error() {
    let cluster = Cluster::start(2);
    let c = cluster.client();
    c.create_table("t", 8, 2, ValueType::F64).unwrap();
    let model = load(&c, "t", 100);
    let bad = OwnedKeys::Packed {
        offsets: vec![0, 4, 2],
        data: b"abcd".to_vec(),
    };
    let plain = c.get("t", bad.keys(), 0).expect_err("decreasing offsets");
    let mut p = c.pipeline();
    p.submit("t", OwnedKeys::I64(vec![1, 2, 500]), 0, 0);
    p.submit("t", bad, 0, 0);
    p.submit("nope", OwnedKeys::I64(vec![1]), 0, 0);
    p.submit("t", OwnedKeys::I64(vec![3]), 0, 0);
    check(&model, &[1, 2, 500], &p.next().unwrap().unwrap());
    let e = p.next().unwrap().expect_err("bad offsets");
    assert_eq!(e.to_string(), plain.to_string());
    let e = p.next().unwrap().expect_err("no such table");
    let plain = c
        .get("nope", Keys::I64(&[1]), 0)
        .expect_err("no such table");
    assert_eq!(e.kind(), plain.kind());
    check(&model, &[3], &p.next().unwrap().unwrap());
    assert!(p.next().is_none());
}

/// Keys asked of one server by GET frames so far (its `ramgrid_native_gets_total`).
fn gets(c: &Client, s: usize) -> u64 {
    let (addr, text) = c.metrics().swap_remove(s);
    let text = text.unwrap_or_else(|e| panic!("metrics of {addr}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix("ramgrid_native_gets_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("ramgrid_native_gets_total") as u64
}

/// Runs `round` (a fresh client each time) up to three times until it returns None. A replica that
/// is late once on a loaded machine is hedged and marked slow (`health.rs`), and reads then avoid it
/// until a probe brings it back: that round's counts show the slow rule, not the replica rule. A
/// broken replica rule fails every round.
fn in_some_round(mut round: impl FnMut() -> Option<String>) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match round() {
            None => return,
            Some(f) => failures.push(f),
        }
    }
    panic!("no round showed the rule: {failures:?}");
}

#[test]
fn reads_spread_over_replicas_when_every_replica_holds_the_data() {
    let cluster = Cluster::start(2);
    // One partition on both servers: the primary rule would send every read to one server.
    let c = cluster.client();
    c.create_table("t", 1, 2, ValueType::F64).unwrap();
    let model = load(&c, "t", 10);
    // Sealed, the current version is the same on every replica (a fresh table's is open).
    c.seal_version("t", c.current_version("t").unwrap())
        .unwrap();
    in_some_round(|| {
        let c = Client::new(cluster.config()).unwrap();
        let before = [gets(&c, 0), gets(&c, 1)];
        for _ in 0..40 {
            check(&model, &[1, 2], &c.get("t", Keys::I64(&[1, 2]), 0).unwrap());
        }
        let mut p = c.pipeline();
        for _ in 0..40 {
            p.submit("t", OwnedKeys::I64(vec![3]), 0, 0);
        }
        for r in p.by_ref() {
            check(&model, &[3], &r.unwrap());
        }
        let served = [gets(&c, 0) - before[0], gets(&c, 1) - before[1]];
        // A hedged read asks both replicas: at least 120 keys; the current version is sealed,
        // the same on every replica, so its reads spread.
        let spread = served[0] + served[1] >= 120 && served[0].min(served[1]) >= 30;
        (!spread).then(|| format!("current version: {served:?}"))
    });

    // An open version: its reads go to the primary (which applies a write last), unhedged...
    let v = c.create_version("t").unwrap();
    c.put("t", Keys::I64(&[1, 2]), ValuesRef::F64(&[1.5, 2.5]), v)
        .unwrap();
    let read_open = |c: &Client| {
        let before = [gets(c, 0), gets(c, 1)];
        for _ in 0..40 {
            let got = c.get("t", Keys::I64(&[1, 2]), v).unwrap();
            assert!(got.found.iter().all(|&f| f), "written keys found");
        }
        [gets(c, 0) - before[0], gets(c, 1) - before[1]]
    };
    in_some_round(|| {
        let served = read_open(&Client::new(cluster.config()).unwrap());
        (served.iter().copied().max() != Some(80) || served.iter().sum::<u64>() != 80)
            .then(|| format!("open version: {served:?}"))
    });
    // ...unless the client asked for relaxed reads.
    in_some_round(|| {
        let mut config = cluster.config();
        config.consistency = Consistency::Replica;
        let served = read_open(&Client::new(config).unwrap());
        (served.iter().copied().min() < Some(20))
            .then(|| format!("consistency = replica: {served:?}"))
    });
}
