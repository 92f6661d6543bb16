//! Micro-benchmark of native tables: per-key cost of `put_batch` and `get_batch` on an f64 table
//! of 1 M keys, in random key order, for several batch sizes. A benchmark, not a test: it prints
//! figures. Run with `cargo run --release -p ramgrid-store --example tables_bench [KEYS]`.

use std::time::Instant;

use ramgrid_store::{KeyStatus, TableSpec, Tables, TablesConfig, ValueRef, ValueType};
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
    const PASSES: usize = 5;
    for batch in [1usize, 10, 100, 1000] {
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
