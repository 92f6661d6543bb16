//! Micro-benchmark of native tables: per-key cost of `put_batch` and `get_batch` on an f64 table
//! of 1 M keys, in random key order, for several batch sizes; then the same keys in a table of 64
//! partitions, read as a server reads a request whose keys the client grouped by partition (a
//! batch of 100 is ~64 groups of 1-2 keys): one `get_batch` per group against one `get_groups`
//! per request, on the open version and after sealing. A benchmark, not a test: it prints
//! figures. Run with `cargo run --release -p ramgrid-store --example tables_bench [KEYS]`.

use std::time::Instant;

use ramgrid_store::{Durability, KeyStatus, TableSpec, Tables, TablesConfig, ValueRef, ValueType};

const PASSES: usize = 5;
const BATCHES: [usize; 4] = [1, 10, 100, 1000];
const PARTITIONS: u32 = 64;
use rand::seq::SliceRandom;
use rand::SeedableRng;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("KEYS must be a number"));
    let tables = Tables::new(TablesConfig {
        memory_limit: 8 << 30,
        max_value_size: 1 << 20,
    });
    let spec = TableSpec {
        name: "lm".into(),
        partitions: 1,
        replication: 1,
        value_type: ValueType::F64,
        durability: Durability::Memory,
        incarnation: 1,
    };
    tables.create_table(spec, &[0]).expect("create");
    // Word-like keys of 8-12 bytes, as in the language-model job.
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("w{i:07}x").into_bytes()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));

    let mut status = Vec::with_capacity(n);
    let t0 = Instant::now();
    for chunk in order.chunks(1000) {
        tables
            .put_batch(
                "lm",
                0,
                0,
                chunk
                    .iter()
                    .map(|&i| (&keys[i][..], ValueRef::F64(i as f64))),
                &mut status,
            )
            .expect("put");
    }
    let put_ns = t0.elapsed().as_nanos() as f64 / n as f64;
    assert!(status.iter().all(|&s| s == KeyStatus::Ok as u8));
    tables.seal_version("lm", 1).expect("seal");
    let mb = tables.memory_used() as f64 / (1 << 20) as f64;
    println!("{n} keys, random order, 1 partition, one thread");
    println!("put_batch   {n} keys: {put_ns:6.1} ns/key; table memory {mb:.1} MiB after seal");

    // Requests arrive as one contiguous buffer of keys (as a wire frame would carry them), so the
    // benchmark itself adds no pointer chasing per key.
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(8));
    let mut flat = Vec::new();
    let mut spans = Vec::with_capacity(n);
    for &i in &order {
        spans.push((flat.len(), keys[i].len()));
        flat.extend_from_slice(&keys[i]);
    }
    let mut values = Vec::with_capacity(8 * 1000);
    for batch in BATCHES {
        let mut best = f64::MAX;
        let cpu0 = thread_cpu_seconds();
        for _ in 0..PASSES {
            let t0 = Instant::now();
            let mut checksum = 0u64;
            for chunk in spans.chunks(batch) {
                status.clear();
                values.clear();
                tables
                    .get_batch(
                        "lm",
                        0,
                        0,
                        chunk.iter().map(|&(at, len)| &flat[at..at + len]),
                        &mut status,
                        &mut values,
                    )
                    .expect("get");
                checksum = checksum.wrapping_add(values[0] as u64);
            }
            std::hint::black_box(checksum);
            best = best.min(t0.elapsed().as_nanos() as f64 / n as f64);
        }
        let cpu = (thread_cpu_seconds() - cpu0) * 1e9 / (PASSES * n) as f64;
        println!("get_batch   batch {batch:5}: {best:6.1} ns/key wall (best of {PASSES}), {cpu:6.1} ns/key on-CPU (mean)");
    }
    drop(tables);
    many_partitions(&keys, &flat, &spans);
}

/// The same keys in a table of [`PARTITIONS`] partitions (key `i` in partition `i % 64`, standing
/// in for the client's partitioning function), read in requests of each batch size whose keys
/// are grouped by partition, groups ascending, keys in request order within a group.
fn many_partitions(keys: &[Vec<u8>], flat: &[u8], spans: &[(usize, usize)]) {
    let n = keys.len();
    let part_of = |k: &[u8]| -> u32 {
        let i: u32 = std::str::from_utf8(&k[1..k.len() - 1])
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("bench key");
        i % PARTITIONS
    };
    let tables = Tables::new(TablesConfig {
        memory_limit: 8 << 30,
        max_value_size: 1 << 20,
    });
    let spec = TableSpec {
        name: "lm64".into(),
        partitions: PARTITIONS,
        replication: 1,
        value_type: ValueType::F64,
        durability: Durability::Memory,
        incarnation: 1,
    };
    let all: Vec<u32> = (0..PARTITIONS).collect();
    tables.create_table(spec, &all).expect("create");
    let mut status = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let p = part_of(key);
        status.clear();
        tables
            .put_batch(
                "lm64",
                0,
                p,
                [(&key[..], ValueRef::F64(i as f64))],
                &mut status,
            )
            .expect("put");
        assert_eq!(status, [KeyStatus::Ok as u8]);
    }
    println!();
    println!("{n} keys, {PARTITIONS} partitions, requests grouped by partition, one thread");
    // Each request as (partition, span range) groups over `sorted`, the request's key spans
    // reordered by partition (stable, so request order holds within a group).
    let mut requests: Vec<Vec<(u32, usize, usize)>> = Vec::new();
    let mut sorted: Vec<(usize, usize)> = Vec::with_capacity(n);
    let mut layouts = Vec::new();
    for batch in BATCHES {
        requests.clear();
        sorted.clear();
        for chunk in spans.chunks(batch) {
            let mut c: Vec<(u32, (usize, usize))> = chunk
                .iter()
                .map(|&(at, len)| (part_of(&flat[at..at + len]), (at, len)))
                .collect();
            c.sort_by_key(|&(p, _)| p);
            let mut groups = Vec::new();
            for (j, &(p, span)) in c.iter().enumerate() {
                if j == 0 || c[j - 1].0 != p {
                    groups.push((p, sorted.len(), sorted.len()));
                }
                sorted.push(span);
                groups.last_mut().expect("pushed").2 = sorted.len();
            }
            requests.push(groups);
        }
        let groups: usize = requests.iter().map(Vec::len).sum();
        layouts.push((batch, requests.clone(), sorted.clone(), groups));
    }
    for sealed in [false, true] {
        if sealed {
            tables.seal_version("lm64", 1).expect("seal");
        }
        let state = if sealed { "sealed" } else { "open" };
        for (batch, requests, sorted, groups) in &layouts {
            let key = |&(at, len): &(usize, usize)| &flat[at..at + len];
            let mut values = Vec::with_capacity(8 * 1000);
            let mut want = Vec::new();
            let mut got = Vec::new();
            let mut figures = [(0.0, 0.0); 2];
            for (way, figure) in figures.iter_mut().enumerate() {
                let mut best = f64::MAX;
                let cpu0 = thread_cpu_seconds();
                for pass in 0..PASSES {
                    let t0 = Instant::now();
                    let mut checksum = 0u64;
                    for req in requests {
                        status.clear();
                        values.clear();
                        // One handle per request, as the server takes.
                        let tv = tables.at("lm64", 0).expect("at");
                        if way == 0 {
                            for &(p, lo, hi) in req {
                                tv.get_batch(
                                    p,
                                    sorted[lo..hi].iter().map(key),
                                    &mut status,
                                    &mut values,
                                )
                                .expect("get");
                            }
                        } else {
                            let g = req
                                .iter()
                                .map(|&(p, lo, hi)| (p, sorted[lo..hi].iter().map(key)));
                            tv.get_groups(g, &mut status, &mut values).expect("get");
                        }
                        checksum = checksum.wrapping_add(values[0] as u64);
                        if pass == 0 {
                            let out = if way == 0 { &mut want } else { &mut got };
                            out.extend_from_slice(&status);
                            out.extend_from_slice(&values);
                        }
                    }
                    std::hint::black_box(checksum);
                    best = best.min(t0.elapsed().as_nanos() as f64 / n as f64);
                }
                let cpu = (thread_cpu_seconds() - cpu0) * 1e9 / (PASSES * n) as f64;
                *figure = (best, cpu);
            }
            assert!(want == got, "get_groups and get_batch per group disagree");
            let per_req = *groups as f64 / requests.len() as f64;
            let [(w0, c0), (w1, c1)] = figures;
            println!(
                "{state:6} batch {batch:5} ({per_req:5.1} groups): per group {w0:6.1} wall {c0:6.1} CPU; \
                 get_groups {w1:6.1} wall {c1:6.1} CPU ns/key; CPU ratio {:4.2}",
                c0 / c1
            );
        }
    }
}

/// CPU time of this thread (user + system) from /proc, in seconds; 0 where /proc is missing.
/// The machine may be shared, so on-CPU time is the figure to compare, wall time the ceiling.
fn thread_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    // Fields after the command name start at field 3 (state); utime and stime are fields 14 and 15.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Linux reports these in USER_HZ, which is 100 on every mainstream configuration.
    (ticks(11) + ticks(12)) / 100.0
}
