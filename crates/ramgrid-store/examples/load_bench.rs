//! Micro-benchmark of a bulk load into a native table, as a server takes `ramgrid load`: word
//! pair keys (14 bytes on average, like the bigram corpus of benchmarks/load_speed.py) and i64
//! values, put in batches of 10,000 over 64 partitions into an open version, which is then
//! sealed; then the same keys again into a second version (a reload). Prints ns per key of the
//! puts and of the seal. A benchmark, not a test.
//! `cargo run --release -p ramgrid-store --example load_bench [KEYS] [SEAL_THREADS]`.

use std::time::Instant;

use ramgrid_store::{Durability, KeyStatus, TableSpec, Tables, TablesConfig, ValueRef, ValueType};

const PARTITIONS: u32 = 64;
const BATCH: usize = 10_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(5_000_000, |s| s.parse().expect("KEYS"));
    let threads: usize = args.next().map_or(1, |s| s.parse().expect("SEAL_THREADS"));
    let tables = Tables::new(TablesConfig {
        memory_limit: 8 << 30,
        max_value_size: 1 << 20,
    })
    .with_seal_threads(threads);
    let spec = TableSpec {
        name: "t".into(),
        partitions: PARTITIONS,
        replication: 1,
        value_type: ValueType::I64,
        durability: Durability::Memory,
        incarnation: 1,
    };
    let held: Vec<u32> = (0..PARTITIONS).collect();
    tables.create_table(spec, &held).expect("create");
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("word{} next{}", i % 9973, i / 9973).into_bytes())
        .collect();
    // Batches as a loader sends them: each batch's keys grouped by partition.
    let part = |k: &[u8]| (k.iter().fold(0u32, |h, &b| h.wrapping_mul(31) ^ b as u32)) % PARTITIONS;
    for version in [1, 2] {
        let what = if version == 1 { "load  " } else { "reload" };
        let used = tables.memory_used();
        if version > 1 {
            // A new version beside the current one: made with room for what that one holds.
            tables.set_current("t", version - 1).expect("current");
            tables.create_version("t", version).expect("version");
        }
        let t0 = Instant::now();
        for chunk in keys.chunks(BATCH) {
            let mut groups: Vec<Vec<&[u8]>> = vec![Vec::new(); PARTITIONS as usize];
            for k in chunk {
                groups[part(k) as usize].push(k);
            }
            let tv = tables.at("t", version).expect("version");
            let mut status = Vec::new();
            for (p, g) in groups.iter().enumerate() {
                status.clear();
                tv.put_batch(
                    p as u32,
                    g.iter().map(|k| (*k, ValueRef::I64(k.len() as i64))),
                    &mut status,
                )
                .expect("put");
                assert!(status.iter().all(|&s| s == KeyStatus::Ok as u8));
            }
        }
        let put = t0.elapsed().as_nanos() as f64 / n as f64;
        let open_mb = (tables.memory_used() - used) as f64 / (1 << 20) as f64;
        let t1 = Instant::now();
        tables.seal_version("t", version).expect("seal");
        let seal = t1.elapsed().as_nanos() as f64 / n as f64;
        let mb = (tables.memory_used() - used) as f64 / (1 << 20) as f64;
        println!(
            "{what} {n} keys over {PARTITIONS} partitions: put {put:5.1} ns/key, seal {seal:5.1} \
             ns/key ({threads} thread(s)); {open_mb:.0} MiB open, {mb:.0} MiB sealed"
        );
    }
}
