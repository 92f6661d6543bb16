//! Get latency from Rust, through shared memory and over TCP, of a pinned version already loaded
//! by `benchmarks/shm_readers.py` (which runs this). Prints one JSON object per line; asserts
//! nothing (a benchmark, not a test).
//!
//! `cargo run --release -p ramgrid-client --example shm_get -- ADDR TABLE VERSION KEYS [SECONDS] [FILL]`
//!
//! FILL (value bytes): create TABLE first (16 partitions, keys 0..KEYS, values of FILL bytes),
//! seal it and read that version (VERSION is then ignored): a run needs only a server, no Python.
//!
//! Rows: "tcp" and "shm" are `Client::get_into` without and with the version attached (what a
//! Rust caller of the client pays: table lookup, key split, lookup, output), "reader" a
//! `ShmReader` handle's `get_into`, and its `get_wire` (one key, the value borrowed from the
//! mapping: what the Python binding's 1-key get uses). 1-key gets cycle over 2,000 keys
//! (`get1_ns`, `wire1_ns`: as the Python load generator does) and over every key of the table in
//! turn (`get1_all_ns`: each get waits on memory). Every figure is [wall ns, CPU ns] (this
//! thread's CPU time: what the code costs, without the scheduler's share of a busy machine).

use std::time::Instant;

use ramgrid_client::{Client, ClientConfig, Keys, ValueType, Values, ValuesRef};

/// This thread's CPU time, in seconds (what the code costs, without the time the scheduler gave
/// other processes: on a small shared machine, wall time is several times that).
fn thread_cpu() -> f64 {
    // SAFETY: `ts` is valid for writes.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime of a valid clock into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Mean ns per call of `f` over about `seconds`: (wall, this thread's CPU time).
fn time_per_call(seconds: f64, mut f: impl FnMut(u64)) -> (f64, f64) {
    let mut calls = 0u64;
    let (t0, c0) = (Instant::now(), thread_cpu());
    let mut i = 0u64;
    while t0.elapsed().as_secs_f64() < seconds {
        for _ in 0..1000 {
            f(i);
            i += 1;
        }
        calls += 1000;
    }
    let per = |s: f64| s * 1e9 / calls as f64;
    (per(t0.elapsed().as_secs_f64()), per(thread_cpu() - c0))
}

/// A figure as JSON: [wall ns, CPU ns].
fn pair((wall, cpu): (f64, f64)) -> String {
    format!("[{wall:.1}, {cpu:.1}]")
}

/// Create `table` with keys 0..n of `size`-byte values, sealed and current; returns the version.
fn fill(c: &Client, table: &str, n: i64, size: usize) -> u32 {
    c.push_spec().expect("spec");
    c.create_table(table, 16, 1, ValueType::Bytes)
        .expect("create");
    let v = c.create_version(table).expect("version");
    for lo in (0..n).step_by(10_000) {
        let keys: Vec<i64> = (lo..n.min(lo + 10_000)).collect();
        let vals: Vec<Vec<u8>> = keys.iter().map(|k| vec![*k as u8; size]).collect();
        let refs: Vec<&[u8]> = vals.iter().map(|v| &v[..]).collect();
        c.put(table, Keys::I64(&keys), ValuesRef::Slices(&refs), v)
            .expect("put");
    }
    c.seal_version(table, v).expect("seal");
    c.set_current(table, v).expect("current");
    v
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, table, version, keys, rest @ ..] = &args[..] else {
        eprintln!("usage: shm_get ADDR TABLE VERSION KEYS [SECONDS]");
        std::process::exit(2);
    };
    let mut version: u32 = version.parse().expect("version");
    let nkeys: i64 = keys.parse().expect("keys");
    let seconds: f64 = rest.first().map_or(1.0, |s| s.parse().expect("seconds"));
    let c = Client::new(ClientConfig::new(vec![addr.clone()])).expect("client");
    if let Some(size) = rest.get(1) {
        version = fill(&c, table, nkeys, size.parse().expect("value bytes"));
    }
    let meta = c.table_meta(table).expect("table");
    let batch: Vec<i64> = (0..1000).map(|i| (i * 7919) % nkeys).collect();
    // 1-key gets cycle over 2,000 keys, as the Python load generator's do (their index and value
    // lines stay in the CPU caches), and, in a second loop, over every key of the table in turn
    // (each get then waits on memory: bucket, key record, value offset, value).
    let warm: Vec<i64> = (0..2000).map(|i| (i * 7919) % nkeys).collect();
    for mode in ["tcp", "shm", "reader"] {
        if mode == "shm" {
            let info = c.shm_attach(table, 0, version).expect("attach");
            assert!(!info.mapped.is_empty(), "nothing mapped: {info:?}");
        }
        let reader = (mode == "reader").then(|| c.shm_reader(table, 0, version).expect("reader"));
        // `Client::get_into`, or the reader handle's.
        let get = |keys: Keys<'_>, out: &mut Values, found: &mut [bool]| {
            let n = keys.len();
            if let Values::Bytes(b) = out {
                b.data.clear();
            }
            match &reader {
                Some(r) => r.get_into(keys, &mut out.slice_mut(0..n), found),
                None => c.get_into(table, keys, version, &mut out.slice_mut(0..n), found),
            }
            .expect("get");
        };
        let mut out = Values::zeroed(meta.value_type, 1);
        let mut found = [false];
        let one = time_per_call(seconds, |i| {
            get(Keys::I64(&[warm[i as usize % 2000]]), &mut out, &mut found);
        });
        let one_all = time_per_call(seconds, |i| {
            get(
                Keys::I64(&[(i as i64 * 7919) % nkeys]),
                &mut out,
                &mut found,
            );
        });
        let mut out = Values::zeroed(meta.value_type, 1000);
        let mut found = vec![false; 1000];
        let (wall, cpu) = time_per_call(seconds, |_| {
            get(Keys::I64(&batch), &mut out, &mut found);
        });
        let per_batch = (wall / 1000.0, cpu / 1000.0);
        // The reader's one-key lookup that borrows the value (what the Python binding's
        // `get` uses: no output array at all).
        let wire = match &reader {
            Some(r) => {
                let mut sum = 0usize;
                let ns = time_per_call(seconds, |i| {
                    let k = warm[i as usize % 2000].to_le_bytes();
                    sum += r.get_wire(&k).expect("mapped").map_or(0, <[u8]>::len);
                });
                assert!(sum > 0);
                pair(ns)
            }
            None => "null".into(),
        };
        println!(
            "{{\"from\": \"rust\", \"mode\": \"{mode}\", \"table\": \"{table}\", \"get1_ns\": {}, \"get1_all_ns\": {}, \"wire1_ns\": {wire}, \"batch1000_ns_per_key\": {}}}",
            pair(one),
            pair(one_all),
            pair(per_batch)
        );
    }
}
