//! Model-based test of the keyspace: random operation sequences run on `Cache` and on a
//! `BTreeMap` model with expiry and flush. With room for everything the outcomes must match
//! exactly; with a small limit and eviction, a key may vanish but a hit must never return a wrong
//! or old value, and the memory limit must hold after every step.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::Config;
use ramgrid_store::cache::ITEM_HEADER_BYTES;
use ramgrid_store::{
    ArithOutcome, Cache, CacheConfig, Clock, DeleteOutcome, Error, GetOptions, ManualClock,
    SetMode, StoreOutcome,
};

const MAX_ITEM: usize = 300;
/// A CAS token no write ever draws in these short runs.
const WRONG_CAS: u64 = 1 << 60;

#[derive(Debug, Clone, Copy)]
enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// CAS with the model's token (true) or a wrong one.
    Cas(bool),
}

#[derive(Debug, Clone)]
enum Op {
    Store {
        mode: Mode,
        key: u8,
        value: Vec<u8>,
        flags: u32,
        ttl: i64,
    },
    Delete {
        key: u8,
        cas: Option<bool>,
    },
    Arith {
        key: u8,
        incr: bool,
        delta: u64,
        cas: Option<bool>,
        autoviv: Option<u64>,
    },
    Touch {
        key: u8,
        ttl: i64,
    },
    Get {
        key: u8,
    },
    Gat {
        key: u8,
        ttl: i64,
    },
    /// A multi-key get (with `ttl`: a multi-key gat), possibly with repeated keys.
    GetMany {
        keys: Vec<u8>,
        ttl: Option<i64>,
    },
    Flush {
        delay: u32,
    },
    Advance {
        secs: u32,
    },
    Crawl {
        budget: usize,
    },
}

impl Op {
    fn key(&self) -> Option<u8> {
        match *self {
            Op::Store { key, .. }
            | Op::Delete { key, .. }
            | Op::Arith { key, .. }
            | Op::Touch { key, .. }
            | Op::Get { key }
            | Op::Gat { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Values are decimal numbers (some too big for u64), letters or empty, so the model's simple
/// "all digits" parse agrees with memcached's strtoull rules on everything generated.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        (0u64..1000).prop_map(|n| n.to_string().into_bytes()),
        Just(b"18446744073709551615".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        proptest::collection::vec(b'a'..=b'z', 0..40),
    ]
}

fn ttl() -> impl Strategy<Value = i64> {
    prop_oneof![3 => Just(0i64), 3 => 1i64..6, 1 => Just(-1i64)]
}

fn op(keys: u8) -> impl Strategy<Value = Op> {
    let mode = prop_oneof![
        Just(Mode::Set),
        Just(Mode::Add),
        Just(Mode::Replace),
        Just(Mode::Append),
        Just(Mode::Prepend),
        any::<bool>().prop_map(Mode::Cas),
    ];
    prop_oneof![
        6 => (mode, 0..keys, value(), 0u32..4, ttl())
            .prop_map(|(mode, key, value, flags, ttl)| Op::Store { mode, key, value, flags, ttl }),
        2 => (0..keys, proptest::option::of(any::<bool>())).prop_map(|(key, cas)| Op::Delete { key, cas }),
        3 => (0..keys, any::<bool>(), prop_oneof![0u64..5, any::<u64>()], proptest::option::weighted(0.2, any::<bool>()),
              proptest::option::weighted(0.2, 0u64..100))
            .prop_map(|(key, incr, delta, cas, autoviv)| Op::Arith { key, incr, delta, cas, autoviv }),
        1 => (0..keys, ttl()).prop_map(|(key, ttl)| Op::Touch { key, ttl }),
        6 => (0..keys).prop_map(|key| Op::Get { key }),
        1 => (0..keys, ttl()).prop_map(|(key, ttl)| Op::Gat { key, ttl }),
        2 => (proptest::collection::vec(0..keys, 0..40), proptest::option::weighted(0.3, ttl()))
            .prop_map(|(keys, ttl)| Op::GetMany { keys, ttl }),
        1 => prop_oneof![3 => Just(0u32), 1 => 1u32..4].prop_map(|delay| Op::Flush { delay }),
        2 => (1u32..4).prop_map(|secs| Op::Advance { secs }),
        1 => (1usize..5).prop_map(|budget| Op::Crawl { budget }),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MItem {
    value: Vec<u8>,
    flags: u32,
    exptime: u32,
    cas: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    Store(Result<StoreOutcome, Error>),
    Delete(DeleteOutcome),
    Arith(Result<ArithOutcome, Error>),
    Touch(bool),
    Get(Option<(Vec<u8>, u32, u64)>),
    GetMany(Vec<Option<(Vec<u8>, u32, u64)>>),
    Unit,
}

impl Out {
    /// The CAS a write handed out, which the model cannot predict and adopts.
    fn new_cas(&self) -> u64 {
        match *self {
            Out::Store(Ok(StoreOutcome::Stored(cas)))
            | Out::Arith(Ok(ArithOutcome::Value(_, cas))) => cas,
            _ => 0,
        }
    }

    /// The outcome with the CAS of a write blanked, for comparison.
    fn normalized(&self) -> Out {
        match self {
            Out::Store(Ok(StoreOutcome::Stored(_))) => Out::Store(Ok(StoreOutcome::Stored(0))),
            Out::Arith(Ok(ArithOutcome::Value(n, _))) => Out::Arith(Ok(ArithOutcome::Value(*n, 0))),
            other => other.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Model {
    items: BTreeMap<u8, MItem>,
    now: u32,
    flush_at: u32,
}

fn key_bytes(key: u8) -> Vec<u8> {
    format!("key{key}").into_bytes()
}

impl Model {
    fn exptime(&self, ttl: i64) -> u32 {
        match ttl {
            0 => 0,
            t if t < 0 => 1,
            t => self.now + t as u32,
        }
    }

    fn live(&mut self, key: u8) -> Option<&mut MItem> {
        let now = self.now;
        if self
            .items
            .get(&key)
            .is_some_and(|it| it.exptime != 0 && it.exptime <= now)
        {
            self.items.remove(&key);
        }
        self.items.get_mut(&key)
    }

    fn token(&self, key: u8, good: bool) -> u64 {
        match self.items.get(&key) {
            Some(it) if good => it.cas,
            _ => WRONG_CAS,
        }
    }

    fn apply(&mut self, op: &Op, new_cas: u64) -> Out {
        if let Op::Advance { secs } = *op {
            self.now += secs;
            return Out::Unit;
        }
        // Every cache call first applies a delayed flush whose second has come.
        if self.flush_at != 0 && self.flush_at <= self.now {
            self.items.clear();
            self.flush_at = 0;
        }
        match *op {
            Op::Advance { .. } => unreachable!(),
            Op::Store {
                mode,
                key,
                ref value,
                flags,
                ttl,
            } => {
                let exptime = self.exptime(ttl);
                let klen = key_bytes(key).len();
                if klen + value.len() + ITEM_HEADER_BYTES > MAX_ITEM {
                    return Out::Store(Err(Error::TooLarge));
                }
                let token = if let Mode::Cas(good) = mode {
                    self.token(key, good)
                } else {
                    0
                };
                let existing = self.live(key).cloned();
                let new = match (mode, existing) {
                    (Mode::Add, Some(_)) => return Out::Store(Ok(StoreOutcome::NotStored)),
                    (Mode::Replace | Mode::Append | Mode::Prepend, None) => {
                        return Out::Store(Ok(StoreOutcome::NotStored))
                    }
                    (Mode::Cas(_), None) => return Out::Store(Ok(StoreOutcome::NotFound)),
                    (Mode::Cas(_), Some(it)) if it.cas != token => {
                        return Out::Store(Ok(StoreOutcome::Exists))
                    }
                    (Mode::Append, Some(it)) => MItem {
                        value: [&it.value[..], value].concat(),
                        ..it
                    },
                    (Mode::Prepend, Some(it)) => MItem {
                        value: [&value[..], &it.value].concat(),
                        ..it
                    },
                    _ => MItem {
                        value: value.clone(),
                        flags,
                        exptime,
                        cas: 0,
                    },
                };
                if klen + new.value.len() + ITEM_HEADER_BYTES > MAX_ITEM {
                    return Out::Store(Err(Error::TooLarge));
                }
                self.items.insert(
                    key,
                    MItem {
                        cas: new_cas,
                        ..new
                    },
                );
                Out::Store(Ok(StoreOutcome::Stored(new_cas)))
            }
            Op::Delete { key, cas } => {
                let token = cas.map(|good| self.token(key, good));
                match self.live(key) {
                    None => Out::Delete(DeleteOutcome::NotFound),
                    Some(it) if token.is_some_and(|t| t != it.cas) => {
                        Out::Delete(DeleteOutcome::Exists)
                    }
                    Some(_) => {
                        self.items.remove(&key);
                        Out::Delete(DeleteOutcome::Deleted)
                    }
                }
            }
            Op::Arith {
                key,
                incr,
                delta,
                cas,
                autoviv,
            } => {
                let token = cas.map(|good| self.token(key, good));
                let autoviv = autoviv.map(|initial| (initial, self.exptime(0)));
                let Some(it) = self.live(key) else {
                    return match autoviv {
                        None => Out::Arith(Ok(ArithOutcome::NotFound)),
                        Some((initial, exptime)) => {
                            let value = initial.to_string().into_bytes();
                            self.items.insert(
                                key,
                                MItem {
                                    value,
                                    flags: 0,
                                    exptime,
                                    cas: new_cas,
                                },
                            );
                            Out::Arith(Ok(ArithOutcome::Value(initial, new_cas)))
                        }
                    };
                };
                if it.value.is_empty() {
                    return Out::Arith(Ok(ArithOutcome::NonNumeric));
                }
                if token.is_some_and(|t| t != it.cas) {
                    return Out::Arith(Ok(ArithOutcome::Exists));
                }
                let parsed = std::str::from_utf8(&it.value)
                    .ok()
                    .filter(|s| s.bytes().all(|b| b.is_ascii_digit()));
                let Some(old) = parsed.and_then(|s| s.parse::<u64>().ok()) else {
                    return Out::Arith(Ok(ArithOutcome::NonNumeric));
                };
                let new = if incr {
                    old.wrapping_add(delta)
                } else {
                    old.saturating_sub(delta)
                };
                it.value = new.to_string().into_bytes();
                it.cas = new_cas;
                Out::Arith(Ok(ArithOutcome::Value(new, new_cas)))
            }
            Op::Touch { key, ttl } => {
                let exptime = self.exptime(ttl);
                match self.live(key) {
                    Some(it) => {
                        it.exptime = exptime;
                        Out::Touch(true)
                    }
                    None => Out::Touch(false),
                }
            }
            Op::Get { key } => Out::Get(
                self.live(key)
                    .map(|it| (it.value.clone(), it.flags, it.cas)),
            ),
            Op::Gat { key, ttl } => {
                let exptime = self.exptime(ttl);
                Out::Get(self.live(key).map(|it| {
                    it.exptime = exptime;
                    (it.value.clone(), it.flags, it.cas)
                }))
            }
            Op::GetMany { ref keys, ttl } => Out::GetMany(
                keys.iter()
                    .map(|&key| match ttl {
                        None => self.apply(&Op::Get { key }, 0),
                        Some(ttl) => self.apply(&Op::Gat { key, ttl }, 0),
                    })
                    .map(|out| match out {
                        Out::Get(hit) => hit,
                        other => unreachable!("{other:?}"),
                    })
                    .collect(),
            ),
            Op::Flush { delay } => {
                if delay == 0 {
                    self.items.clear();
                    self.flush_at = 0;
                } else {
                    self.flush_at = self.now + delay;
                }
                Out::Unit
            }
            Op::Crawl { .. } => Out::Unit,
        }
    }
}

fn run_op(cache: &Cache, clock: &ManualClock, model: &Model, op: &Op) -> Out {
    let ttl = |t: i64| cache.exptime_from_protocol(t);
    let view = |it: &ramgrid_store::ItemView<'_>| (it.value.to_vec(), it.flags, it.cas);
    match *op {
        Op::Advance { secs } => {
            clock.advance(secs);
            Out::Unit
        }
        Op::Store {
            mode,
            key,
            ref value,
            flags,
            ttl: t,
        } => {
            let mode = match mode {
                Mode::Set => SetMode::Set,
                Mode::Add => SetMode::Add,
                Mode::Replace => SetMode::Replace,
                Mode::Append => SetMode::Append,
                Mode::Prepend => SetMode::Prepend,
                Mode::Cas(good) => SetMode::Cas(model.token(key, good)),
            };
            Out::Store(cache.store(mode, &key_bytes(key), value, flags, ttl(t), None))
        }
        Op::Delete { key, cas } => {
            Out::Delete(cache.delete(&key_bytes(key), cas.map(|g| model.token(key, g)), false))
        }
        Op::Arith {
            key,
            incr,
            delta,
            cas,
            autoviv,
        } => Out::Arith(cache.arith(
            &key_bytes(key),
            incr,
            delta,
            cas.map(|g| model.token(key, g)),
            autoviv.map(|initial| (initial, 0)),
        )),
        Op::Touch { key, ttl: t } => Out::Touch(cache.touch(&key_bytes(key), ttl(t))),
        Op::Get { key } => {
            // Alternate the classic get and the meta path so both are checked.
            if key % 2 == 0 {
                Out::Get(cache.get(&key_bytes(key), view))
            } else {
                Out::Get(cache.get_with(&key_bytes(key), GetOptions::default(), |h| view(&h.item)))
            }
        }
        Op::Gat { key, ttl: t } => Out::Get(cache.get_and_touch(&key_bytes(key), ttl(t), view)),
        Op::GetMany { ref keys, ttl: t } => {
            let keys: Vec<Vec<u8>> = keys.iter().map(|&k| key_bytes(k)).collect();
            let mut got = vec![None; keys.len()];
            let hits = cache.get_many(keys.iter().map(Vec::as_slice), t.map(ttl), |i, it| {
                assert!(got[i].is_none(), "key {i} reported twice");
                got[i] = Some(view(it));
            });
            assert_eq!(hits, got.iter().flatten().count());
            Out::GetMany(got)
        }
        Op::Flush { delay } => {
            cache.flush_all(if delay == 0 { 0 } else { clock.now() + delay });
            Out::Unit
        }
        Op::Crawl { budget } => {
            cache.crawl_expired(budget);
            Out::Unit
        }
    }
}

/// Runs `ops` on both and checks them step by step. With `evicting`, a key the model holds may
/// have been evicted: the cache's outcome is then accepted if it is the model's outcome for an
/// absent key, and the model forgets the key.
fn check_sequence(ops: &[Op], config: CacheConfig, evicting: bool) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(1_700_000_000));
    let cache = Cache::new(config, clock.clone());
    let mut model = Model {
        now: 1,
        ..Model::default()
    };
    for (n, op) in ops.iter().enumerate() {
        let got = run_op(&cache, &clock, &model, op);
        let cas = got.new_cas();
        let mut with_key = model.clone();
        let expected = with_key.apply(op, cas);
        if expected.normalized() == got.normalized() {
            model = with_key;
        } else {
            // Keys the model holds that the cache may have evicted since.
            let evicted: Vec<u8> = match (op, &got) {
                (Op::GetMany { keys, .. }, Out::GetMany(hits)) => keys
                    .iter()
                    .zip(hits)
                    .filter(|(_, hit)| hit.is_none())
                    .map(|(&k, _)| k)
                    .collect(),
                _ => op.key().into_iter().collect(),
            };
            let evicted: Vec<u8> = evicted
                .into_iter()
                .filter(|&k| evicting && model.clone().live(k).is_some())
                .collect();
            if evicted.is_empty() {
                return Err(TestCaseError::fail(format!(
                    "step {n} {op:?}: cache {got:?}, model {expected:?}"
                )));
            }
            let mut without = model.clone();
            for key in &evicted {
                without.items.remove(key);
            }
            let expected_absent = without.apply(op, cas);
            prop_assert_eq!(
                expected_absent.normalized(),
                got.normalized(),
                "step {} {:?}: cache {:?}, model {:?} (or {:?} if evicted)",
                n,
                op,
                &got,
                &expected,
                &expected_absent
            );
            model = without;
        }
        if let Err(e) = cache.debug_check_invariants() {
            return Err(TestCaseError::fail(format!("step {n} {op:?}: {e}")));
        }
        let stats = cache.stats();
        prop_assert!(stats.bytes <= stats.limit_maxbytes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 200, failure_persistence: None, ..Config::default() })]

    #[test]
    fn matches_the_model_when_everything_fits(ops in proptest::collection::vec(op(8), 1..150)) {
        let config = CacheConfig { memory_limit: 1 << 20, evict: true, max_item_size: MAX_ITEM, shards: 4 };
        check_sequence(&ops, config, false)?;
    }

    #[test]
    fn never_returns_a_wrong_value_under_eviction(ops in proptest::collection::vec(op(24), 1..150)) {
        // Room for a dozen small items, a few large ones; every item fits on its own.
        let config = CacheConfig { memory_limit: 1500, evict: true, max_item_size: MAX_ITEM, shards: 2 };
        check_sequence(&ops, config, true)?;
    }
}

#[test]
fn eviction_sequences_do_evict() {
    // Guards the test above against a limit so large that it never evicts.
    let clock = Arc::new(ManualClock::new(0));
    let cache = Cache::new(
        CacheConfig {
            memory_limit: 1500,
            evict: true,
            max_item_size: MAX_ITEM,
            shards: 2,
        },
        clock,
    );
    for key in 0..24u8 {
        cache
            .store(SetMode::Set, &key_bytes(key), b"0123456789", 0, 0, None)
            .unwrap();
    }
    assert!(cache.stats().evictions > 0);
}
