//! The native-protocol workload (`native-get`): gets of `--keys-per-get` random int64 keys from a
//! float64 table through the cluster client, one call in flight per client thread (`--connections`
//! threads, each with its own client and connections), against one ramgrid server.
//!
//! Before the measured run it creates the table `ramgrid_bench` anew (64 partitions, no replica)
//! and writes keys `0 .. --key-count` with value `key as f64`; every reply is checked (each key
//! found, each value its key's).

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ramgrid_client::{Client, ClientConfig, Keys, Values, ValuesRef};
use ramgrid_proto::native::ValueType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::driver::Tally;

/// The table the workload reads.
const TABLE: &str = "ramgrid_bench";
/// Keys per write while loading the table.
const LOAD_CHUNK: usize = 10_000;

/// What the measured run needs to know.
pub struct Plan<'a> {
    pub server: &'a str,
    pub key_count: u64,
    pub keys_per_get: usize,
    pub threads: usize,
    pub seed: u64,
    pub measure_from: Instant,
    pub stop_at: Instant,
}

fn client(server: &str) -> Result<Client> {
    Client::new(ClientConfig::new(vec![server.to_owned()]))
        .with_context(|| format!("connecting the native client to {server}"))
}

/// Creates the table anew and writes every key once; returns how long that took.
pub fn load(server: &str, key_count: u64) -> Result<Duration> {
    let start = Instant::now();
    let c = client(server)?;
    c.push_spec().context("pushing the cluster spec")?;
    // A table left by an earlier run may hold other keys: start from an empty one.
    let _ = c.drop_table(TABLE);
    c.create_table(TABLE, 64, 1, ValueType::F64)
        .context("creating the bench table")?;
    let n = i64::try_from(key_count).context("--key-count is too large")?;
    let mut lo = 0;
    while lo < n {
        let hi = (lo + LOAD_CHUNK as i64).min(n);
        let ids: Vec<i64> = (lo..hi).collect();
        let values: Vec<f64> = ids.iter().map(|&i| i as f64).collect();
        c.put(TABLE, Keys::I64(&ids), ValuesRef::F64(&values), 0)
            .context("loading the bench table")?;
        lo = hi;
    }
    Ok(start.elapsed())
}

/// One client thread: gets until `stop_at`, counting those that end in the measured window.
fn drive(plan: &Plan<'_>, index: usize, abort: &AtomicBool) -> Result<Tally> {
    let c = client(plan.server)?;
    let mut rng =
        StdRng::seed_from_u64(plan.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut ids = vec![0i64; plan.keys_per_get];
    let mut tally = Tally::new();
    let n = i64::try_from(plan.key_count).context("--key-count is too large")?;
    loop {
        let start = Instant::now();
        if start >= plan.stop_at || abort.load(Ordering::Relaxed) {
            return Ok(tally);
        }
        for id in ids.iter_mut() {
            *id = rng.gen_range(0..n);
        }
        let got = c.get(TABLE, Keys::I64(&ids), 0).context("native get")?;
        let done = Instant::now();
        let Values::F64(values) = &got.values else {
            anyhow::bail!("the bench table answered with values that are not f64");
        };
        let hits = got.found.iter().filter(|&&f| f).count();
        ensure!(
            ids.iter().zip(values).all(|(&id, &v)| v == id as f64),
            "a native get returned a wrong value"
        );
        if start >= plan.measure_from {
            tally.batches += 1;
            tally.requests += 1;
            tally.keys += ids.len() as u64;
            tally.hits += hits as u64;
            let rtt = done.duration_since(start).as_nanos();
            tally
                .latency
                .saturating_record(u64::try_from(rtt).unwrap_or(u64::MAX).max(1));
            tally.last_done = Some(done);
        }
    }
}

/// Runs the client threads; `between` is called on the caller's thread and must return once the
/// measured window is over (it samples CPU time at its edges).
pub fn run<T>(plan: &Plan<'_>, between: impl FnOnce() -> T) -> Result<(Tally, T)> {
    let abort = AtomicBool::new(false);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..plan.threads)
            .map(|i| {
                let abort = &abort;
                scope.spawn(move || {
                    let r = drive(plan, i, abort);
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let sampled = between();
        let mut tally = Tally::new();
        for w in workers {
            tally.merge(&w.join().expect("native client thread panicked")?)?;
        }
        Ok((tally, sampled))
    })
}
