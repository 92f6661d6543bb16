//! Several threads hammer the same few keys through every operation; afterwards the accounting
//! must add up exactly, the limit must have held, and no value may belong to another key. Each
//! run is bounded in operations and guarded by a timeout so a deadlock fails instead of hanging.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use ramgrid_store::{Cache, CacheConfig, Error, GetOptions, ManualClock, SetMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 6000;
const KEYS: usize = 48;

fn key(n: usize) -> Vec<u8> {
    format!("key{n:02}").into_bytes()
}

/// Values start with their key, so a value found under another key is caught.
fn value_for(k: &[u8], rng: &mut StdRng, max_len: usize) -> Vec<u8> {
    let mut v = k.to_vec();
    v.push(b'=');
    let extra = rng.gen_range(0..max_len);
    v.resize(v.len() + extra, rng.gen_range(b'a'..=b'z'));
    v
}

/// Empty (vivified) and numeric (incr) values, with '+'s appended, are legitimate; anything else
/// must start with its key.
fn check_value(k: &[u8], v: &[u8]) {
    let head = &v[..v.len() - v.iter().rev().take_while(|&&b| b == b'+').count()];
    let ok = head.iter().all(u8::is_ascii_digit) || v.starts_with(k);
    assert!(
        ok,
        "key {:?} holds {:?}",
        String::from_utf8_lossy(k),
        String::from_utf8_lossy(v)
    );
}

fn worker(cache: &Cache, clock: &ManualClock, seed: u64, max_len: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..OPS_PER_THREAD {
        let k = key(rng.gen_range(0..KEYS));
        let check = |v: &[u8]| check_value(&k, v);
        let result: Result<(), Error> = match rng.gen_range(0..100) {
            0..=24 => {
                let v = value_for(&k, &mut rng, max_len);
                let exptime = if rng.gen_bool(0.2) {
                    clock_now(cache) + rng.gen_range(1..3)
                } else {
                    0
                };
                cache
                    .store(SetMode::Set, &k, &v, 0, exptime, None)
                    .map(drop)
            }
            25..=29 => {
                let v = value_for(&k, &mut rng, max_len);
                cache.store(SetMode::Add, &k, &v, 0, 0, None).map(drop)
            }
            30..=34 => cache.store(SetMode::Append, &k, b"+", 0, 0, None).map(drop),
            35..=37 => {
                let token = cache.get(&k, |it| it.cas).unwrap_or(0);
                let v = value_for(&k, &mut rng, max_len);
                cache
                    .store(SetMode::Cas(token), &k, &v, 0, 0, None)
                    .map(drop)
            }
            38..=44 => {
                let initial = rng.gen_range(0..1000);
                cache
                    .arith(
                        &k,
                        rng.gen_bool(0.5),
                        rng.gen_range(0..10),
                        None,
                        Some((initial, 0)),
                    )
                    .map(drop)
            }
            45..=49 => {
                cache.delete(&k, None, rng.gen_bool(0.3));
                Ok(())
            }
            50..=64 => {
                cache.get(&k, |it| check(it.value));
                Ok(())
            }
            65..=79 => {
                // A multi-key get, prefetching in groups while other threads write the same keys.
                let n = rng.gen_range(1..40);
                let keys: Vec<Vec<u8>> = (0..n).map(|_| key(rng.gen_range(0..KEYS))).collect();
                let touch = rng.gen_bool(0.2).then_some(0);
                cache.get_many(keys.iter().map(Vec::as_slice), touch, |i, it| {
                    assert_eq!(it.key, keys[i].as_slice());
                    check_value(&keys[i], it.value);
                });
                Ok(())
            }
            80..=87 => {
                let opts = GetOptions {
                    vivify: Some(0),
                    no_bump: rng.gen_bool(0.3),
                    ..GetOptions::default()
                };
                cache.get_with(&k, opts, |hit| check(hit.item.value));
                Ok(())
            }
            88..=92 => {
                cache.touch(&k, 0);
                Ok(())
            }
            93..=96 => {
                cache.crawl_expired(8);
                Ok(())
            }
            97 => {
                clock.advance(1);
                Ok(())
            }
            98 => {
                let _ = cache.stats();
                Ok(())
            }
            _ => {
                cache.flush_all(0);
                Ok(())
            }
        };
        match result {
            Ok(()) | Err(Error::TooLarge) | Err(Error::OutOfMemory) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}

fn clock_now(cache: &Cache) -> u32 {
    cache.clock().now()
}

fn hammer(config: CacheConfig, max_len: usize) -> Arc<Cache> {
    let clock = Arc::new(ManualClock::new(1_700_000_000));
    let cache = Arc::new(Cache::new(config, clock.clone()));
    let (done, finished) = mpsc::channel();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, clock, done) = (cache.clone(), clock.clone(), done.clone());
            thread::spawn(move || {
                worker(&cache, &clock, t as u64 * 7919 + 1, max_len);
                done.send(()).unwrap();
            })
        })
        .collect();
    drop(done);
    let mut reported = 0;
    while reported < THREADS {
        match finished.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => reported += 1,
            Err(RecvTimeoutError::Timeout) => panic!("workers still running after 60 s: deadlock?"),
            // A worker panicked; its join below says why.
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    for h in handles {
        h.join().expect("worker panicked");
    }
    cache.debug_check_invariants().unwrap();
    let s = cache.stats();
    assert!(s.bytes <= s.limit_maxbytes);
    cache
}

#[test]
fn threads_share_keys_with_eviction() {
    let cache = hammer(
        CacheConfig {
            memory_limit: 6 * 1024,
            evict: true,
            max_item_size: 1024,
            shards: 4,
        },
        200,
    );
    assert!(
        cache.stats().evictions > 0,
        "the limit was meant to be tight"
    );
}

#[test]
fn threads_share_keys_without_eviction() {
    hammer(
        CacheConfig {
            memory_limit: 6 * 1024,
            evict: false,
            max_item_size: 1024,
            shards: 4,
        },
        200,
    );
}

#[test]
fn threads_evict_across_shards_for_large_items() {
    // Items up to half the limit and many shards: writers must free memory in other shards.
    let cache = hammer(
        CacheConfig {
            memory_limit: 16 * 1024,
            evict: true,
            max_item_size: 8 * 1024,
            shards: 16,
        },
        7000,
    );
    assert!(cache.stats().evictions > 0);
}
