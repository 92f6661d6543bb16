//! Get latency from Rust, through shared memory and over TCP, of a pinned version already loaded
//! by `benchmarks/shm_readers.py` (which runs this). Prints one JSON object per line; asserts
//! nothing (a benchmark, not a test).
//!
//! `cargo run --release -p ramgrid-client --example shm_get -- ADDR TABLE VERSION KEYS [SECONDS]`
//!
//! Rows: "client" is `Client::get_into` (what a Rust caller of the client pays: table lookup, key
//! split, lookup, output), "view" the bare lookup in the mapped image (`image_view::lookup`).

use std::time::Instant;

use ramgrid_client::{Client, ClientConfig, Keys, Values};

fn time_per_call(seconds: f64, mut f: impl FnMut(u64)) -> f64 {
    let mut calls = 0u64;
    let t0 = Instant::now();
    let mut i = 0u64;
    while t0.elapsed().as_secs_f64() < seconds {
        for _ in 0..1000 {
            f(i);
            i += 1;
        }
        calls += 1000;
    }
    t0.elapsed().as_secs_f64() * 1e9 / calls as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, table, version, keys, rest @ ..] = &args[..] else {
        eprintln!("usage: shm_get ADDR TABLE VERSION KEYS [SECONDS]");
        std::process::exit(2);
    };
    let version: u32 = version.parse().expect("version");
    let nkeys: i64 = keys.parse().expect("keys");
    let seconds: f64 = rest.first().map_or(1.0, |s| s.parse().expect("seconds"));
    let c = Client::new(ClientConfig::new(vec![addr.clone()])).expect("client");
    let meta = c.table_meta(table).expect("table");
    for mode in ["tcp", "shm"] {
        if mode == "shm" {
            let info = c.shm_attach(table, 0, version).expect("attach");
            assert!(!info.mapped.is_empty(), "nothing mapped: {info:?}");
        }
        let mut out = Values::zeroed(meta.value_type, 1);
        let mut found = [false];
        let one = time_per_call(seconds, |i| {
            let k = [(i as i64 * 7919) % nkeys];
            if let Values::Bytes(b) = &mut out {
                b.data.clear();
            }
            c.get_into(
                table,
                Keys::I64(&k),
                version,
                &mut out.slice_mut(0..1),
                &mut found,
            )
            .expect("get");
        });
        let batch: Vec<i64> = (0..1000).map(|i| (i * 7919) % nkeys).collect();
        let mut out = Values::zeroed(meta.value_type, 1000);
        let mut found = vec![false; 1000];
        let per_batch = time_per_call(seconds, |_| {
            if let Values::Bytes(b) = &mut out {
                b.data.clear();
            }
            c.get_into(
                table,
                Keys::I64(&batch),
                version,
                &mut out.slice_mut(0..1000),
                &mut found,
            )
            .expect("get");
        }) / 1000.0;
        println!(
            "{{\"from\": \"rust\", \"mode\": \"{mode}\", \"table\": \"{table}\", \"get1_ns\": {one:.0}, \"batch1000_ns_per_key\": {per_batch:.1}}}"
        );
    }
}
