//! Micro-benchmark of the keyspace's hot path: single-thread get of a small item (against a
//! plain `HashMap` lookup, the in-process ceiling, run on the same keys in the same order), set,
//! gets from two threads, and multi-key gets (`get_many`, as a memcached `get k1 .. kN` does
//! them, each value copied into a reply buffer). Prints nanoseconds per operation (per key for
//! multi-key gets); it asserts nothing.
//!
//! Run: `cargo bench -p ramgrid-store --bench cache_get` (`-- multiget` for the multi-key gets only)

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use ramgrid_store::{Cache, CacheConfig, Clock, ManualClock, SetMode, SystemClock};

const LOOKUPS: usize = 2_000_000;
const VALUE: [u8; 32] = [b'v'; 32];
const KEY_LEN: usize = 13;

/// Keys "user:00000042" packed back to back, as they would sit in a request buffer.
struct Keys(Vec<u8>);

impl Keys {
    fn new(prefix: &str, n: usize) -> Keys {
        Keys(
            (0..n)
                .flat_map(|i| format!("{prefix}:{i:08}").into_bytes())
                .collect(),
        )
    }
    fn get(&self, i: u32) -> &[u8] {
        let at = i as usize * KEY_LEN;
        &self.0[at..at + KEY_LEN]
    }
    fn len(&self) -> usize {
        self.0.len() / KEY_LEN
    }
}

/// A fixed pseudo-random visiting order (xorshift), so the timed loop does not pay for an RNG.
fn order(len: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as u32
        })
        .collect()
}

fn ns_per(start: Instant, ops: usize) -> f64 {
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn cache_gets(cache: &Cache, keys: &Keys, order: &[u32]) -> f64 {
    let start = Instant::now();
    let mut bytes = 0;
    for &i in order {
        bytes += cache
            .get(keys.get(i), |it| black_box(it.value).len())
            .unwrap_or(0);
    }
    black_box(bytes);
    ns_per(start, order.len())
}

/// Nanoseconds this thread has run on a CPU (Linux; 0 elsewhere): a noisy shared machine delays
/// a benchmark, but its time off the CPU is not counted here.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Multi-key gets of `per_get` keys each over `order`, every hit's value appended to a reply
/// buffer as the server does; nanoseconds of CPU per key.
fn cache_multigets(cache: &Cache, keys: &Keys, order: &[u32], per_get: usize) -> f64 {
    // The keys in request order, back to back, as they arrive in the server's read buffer (and
    // read in order, so that fetching them costs no cache miss the server would not have).
    let requests = Keys(order.iter().flat_map(|&i| keys.get(i)).copied().collect());
    let mut out = Vec::with_capacity(64 << 10);
    let start = thread_cpu_ns();
    for group in (0..order.len() as u32).collect::<Vec<_>>().chunks(per_get) {
        out.clear();
        cache.get_many(group.iter().map(|&i| requests.get(i)), None, |_, it| {
            out.extend_from_slice(it.key);
            out.extend_from_slice(it.value);
        });
        black_box(&out);
    }
    (thread_cpu_ns() - start) as f64 / order.len() as f64
}

fn filled(n: usize, clock: Arc<dyn Clock>) -> (Cache, Keys, f64) {
    filled_shards(n, clock, CacheConfig::default().shards)
}

fn filled_shards(n: usize, clock: Arc<dyn Clock>, shards: usize) -> (Cache, Keys, f64) {
    let cache = Cache::new(
        CacheConfig {
            memory_limit: 1 << 30,
            shards,
            ..CacheConfig::default()
        },
        clock,
    );
    let keys = Keys::new("user", n);
    let start = Instant::now();
    for i in 0..n {
        cache
            .store(SetMode::Set, keys.get(i as u32), &VALUE, 0, 0, None)
            .unwrap();
    }
    (cache, keys, ns_per(start, n))
}

/// Multi-key gets over 1 M items in 256 shards (the server's default), beside single gets of the
/// same keys in the same order.
fn multigets() {
    let n = 1_000_000;
    let (cache, keys, _) = filled_shards(n, Arc::new(SystemClock::new()), 256);
    let seq = order(LOOKUPS, n, 0x2545_f491_4f6c_dd1d);
    cache_gets(&cache, &keys, &seq[..LOOKUPS / 4]);
    print!("multi-key gets, {n} items, 256 shards, CPU ns per key:");
    for per_get in [1, 10, 100] {
        cache_multigets(&cache, &keys, &seq[..LOOKUPS / 4], per_get);
        let best = (0..3)
            .map(|_| cache_multigets(&cache, &keys, &seq, per_get))
            .fold(f64::INFINITY, f64::min);
        print!(", get_many of {per_get} {best:.1}");
    }
    // Two threads at once, as two server workers: the shard locks' lines move between cores.
    let cache = Arc::new(cache);
    let keys = Arc::new(keys);
    let both: Vec<f64> = (0..2u64)
        .map(|t| {
            let (cache, keys) = (cache.clone(), keys.clone());
            let seq = order(LOOKUPS, n, 0x5851_f42d_4c95_7f2d + t);
            thread::spawn(move || cache_multigets(&cache, &keys, &seq, 100))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    println!(
        ", 2 threads get_many of 100 {:.1} / {:.1}",
        both[0], both[1]
    );
}

fn main() {
    if std::env::args().any(|a| a == "multiget") {
        multigets();
        return;
    }
    multigets();
    println!(
        "ramgrid-store Cache: {KEY_LEN}-byte keys, 32-byte values, 64 shards; ns per operation"
    );
    println!(
        "{:>9} {:>12} {:>12} {:>12}",
        "items", "get (sys)", "get (manual)", "HashMap get"
    );
    for n in [1_000, 100_000, 1_000_000] {
        let seq = order(LOOKUPS, n, 0x9e37_79b9_7f4a_7c15);
        let (cache, keys, _) = filled(n, Arc::new(SystemClock::new()));
        cache_gets(&cache, &keys, &seq[..LOOKUPS / 4]);
        let sys = cache_gets(&cache, &keys, &seq);
        drop(cache);
        let (cache, keys, _) = filled(n, Arc::new(ManualClock::new(0)));
        cache_gets(&cache, &keys, &seq[..LOOKUPS / 4]);
        let manual = cache_gets(&cache, &keys, &seq);
        drop(cache);
        let mut map: HashMap<Box<[u8]>, Box<[u8]>, foldhash::fast::RandomState> =
            HashMap::default();
        for i in 0..keys.len() {
            map.insert(keys.get(i as u32).into(), VALUE.into());
        }
        let start = Instant::now();
        let mut bytes = 0;
        for &i in &seq {
            bytes += map.get(keys.get(i)).map_or(0, |v| black_box(&v[..]).len());
        }
        black_box(bytes);
        let hashmap = ns_per(start, seq.len());
        println!("{n:>9} {sys:>12.1} {manual:>12.1} {hashmap:>12.1}");
    }

    let n = 100_000;
    let (cache, keys, insert_ns) = filled(n, Arc::new(SystemClock::new()));
    let start = Instant::now();
    for i in 0..n {
        cache
            .store(SetMode::Set, keys.get(i as u32), &VALUE, 0, 0, None)
            .unwrap();
    }
    let overwrite_ns = ns_per(start, n);
    let hot = cache_gets(&cache, &keys, &vec![42; LOOKUPS]);
    let misses = Keys::new("nope", n);
    let miss = cache_gets(&cache, &misses, &order(LOOKUPS, n, 7));
    println!("with {n} items (SystemClock):");
    println!("  set insert {insert_ns:.1}, set overwrite {overwrite_ns:.1}, get one hot key {hot:.1}, get miss {miss:.1}");

    let cache = Arc::new(cache);
    let keys = Arc::new(keys);
    let start = Instant::now();
    let per_thread: Vec<f64> = (0..2u64)
        .map(|t| {
            let (cache, keys) = (cache.clone(), keys.clone());
            let seq = order(LOOKUPS, n, 0x1234_5678 + t);
            thread::spawn(move || cache_gets(&cache, &keys, &seq))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let mops = 2.0 * LOOKUPS as f64 / start.elapsed().as_secs_f64() / 1e6;
    println!(
        "  2 threads, random gets: {:.1} / {:.1} per thread, {mops:.1} M gets/s in all",
        per_thread[0], per_thread[1]
    );
}
