//! Unit tests of the keyspace, one group per method, time driven by a ManualClock.

use std::sync::Arc;

use super::shard::alloc_size;
use super::*;
use crate::ManualClock;

const EPOCH: u64 = 1_700_000_000;

fn cache_with(config: CacheConfig) -> (Cache, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(EPOCH));
    (Cache::new(config, clock.clone()), clock)
}

fn cache() -> (Cache, Arc<ManualClock>) {
    cache_with(CacheConfig {
        shards: 4,
        ..CacheConfig::default()
    })
}

fn set(c: &Cache, key: &[u8], value: &[u8]) -> u64 {
    match c.store(SetMode::Set, key, value, 0, 0, None) {
        Ok(StoreOutcome::Stored(cas)) => cas,
        other => panic!("set {key:?}: {other:?}"),
    }
}

fn value(c: &Cache, key: &[u8]) -> Option<Vec<u8>> {
    c.get(key, |it| it.value.to_vec())
}

fn check(c: &Cache) {
    c.debug_check_invariants().unwrap();
}

#[test]
fn exptime_from_protocol_follows_memcached() {
    let (c, clock) = cache();
    assert_eq!(c.exptime_from_protocol(0), 0);
    assert_eq!(c.exptime_from_protocol(-1), 1);
    assert_eq!(c.exptime_from_protocol(i64::MIN), 1);
    assert_eq!(c.exptime_from_protocol(100), 101);
    assert_eq!(c.exptime_from_protocol(2_592_000), 2_592_001);
    // One second more is an absolute unix time, long before the clock's epoch: already expired.
    assert_eq!(c.exptime_from_protocol(2_592_001), 1);
    assert_eq!(c.exptime_from_protocol(EPOCH as i64), 1);
    assert_eq!(c.exptime_from_protocol(EPOCH as i64 + 500), 500);
    assert_eq!(c.exptime_from_protocol(i64::MAX), u32::MAX);
    clock.advance(10);
    assert_eq!(c.exptime_from_protocol(5), 16);
    // An absolute time in the past expires the item at once.
    c.store(
        SetMode::Set,
        b"k",
        b"v",
        0,
        c.exptime_from_protocol(EPOCH as i64 + 3),
        None,
    )
    .unwrap();
    assert_eq!(value(&c, b"k"), None);
    c.store(
        SetMode::Set,
        b"k",
        b"v",
        0,
        c.exptime_from_protocol(-1),
        None,
    )
    .unwrap();
    assert_eq!(value(&c, b"k"), None);
}

#[test]
fn ttl_remaining_counts_down() {
    let (c, clock) = cache();
    assert_eq!(c.ttl_remaining(0), -1);
    assert_eq!(c.ttl_remaining(11), 10);
    clock.advance(15);
    assert_eq!(c.ttl_remaining(11), 0);
}

#[test]
fn get_misses_then_hits_with_all_fields() {
    let (c, clock) = cache();
    assert_eq!(value(&c, b"k"), None);
    let cas = match c
        .store(SetMode::Set, b"k", b"hello", 42, 100, None)
        .unwrap()
    {
        StoreOutcome::Stored(cas) => cas,
        other => panic!("{other:?}"),
    };
    clock.advance(3);
    let view = |c: &Cache| {
        c.get(b"k", |it| {
            assert_eq!(it.key, b"k");
            assert_eq!(it.value, b"hello");
            assert_eq!(it.flags, 42);
            assert_eq!(it.cas, cas);
            assert_eq!(it.exptime, 100);
            assert!(!it.stale && !it.vivified && !it.win_token_taken);
            (it.fetched, it.last_access)
        })
    };
    // The view shows the state before this access (meta h and l).
    assert_eq!(view(&c), Some((false, 1)));
    assert_eq!(view(&c), Some((true, 4)));
    check(&c);
}

#[test]
fn no_bump_leaves_access_state_alone() {
    let (c, clock) = cache();
    set(&c, b"k", b"v");
    clock.advance(5);
    let peek = GetOptions {
        no_bump: true,
        ..GetOptions::default()
    };
    for _ in 0..2 {
        let seen = c.get_with(b"k", peek, |h| (h.item.fetched, h.item.last_access));
        assert_eq!(seen, Some((false, 1)));
    }
    c.get(b"k", |_| ());
    assert_eq!(
        c.get_with(b"k", peek, |h| (h.item.fetched, h.item.last_access)),
        Some((true, 6))
    );
}

#[test]
fn get_and_touch_and_touch_move_exptime() {
    let (c, clock) = cache();
    c.store(SetMode::Set, b"k", b"v", 0, 5, None).unwrap();
    assert_eq!(c.get_and_touch(b"k", 20, |it| it.exptime), Some(20));
    assert_eq!(c.get_and_touch(b"nope", 20, |it| it.exptime), None);
    clock.advance(10);
    assert_eq!(value(&c, b"k").as_deref(), Some(&b"v"[..]));
    assert!(c.touch(b"k", 12));
    assert!(!c.touch(b"nope", 12));
    clock.advance(1);
    assert!(c.get(b"k", |_| ()).is_none());
    assert!(
        !c.touch(b"k", 0),
        "an expired item cannot be touched back to life"
    );
    check(&c);
}

#[test]
fn store_modes_and_their_outcomes() {
    let (c, _) = cache();
    let add = |k: &[u8], v: &[u8]| c.store(SetMode::Add, k, v, 0, 0, None).unwrap();
    let replace = |k: &[u8], v: &[u8]| c.store(SetMode::Replace, k, v, 0, 0, None).unwrap();
    assert_eq!(replace(b"k", b"x"), StoreOutcome::NotStored);
    assert!(matches!(add(b"k", b"1"), StoreOutcome::Stored(_)));
    assert_eq!(add(b"k", b"2"), StoreOutcome::NotStored);
    assert_eq!(value(&c, b"k").as_deref(), Some(&b"1"[..]));
    assert!(matches!(replace(b"k", b"3"), StoreOutcome::Stored(_)));
    assert_eq!(value(&c, b"k").as_deref(), Some(&b"3"[..]));
    let a = set(&c, b"k", b"4");
    let b = set(&c, b"k", b"4");
    assert!(b > a, "every write draws a fresh CAS");
    assert_eq!(c.stats().total_items, 4);
    assert_eq!(c.stats().curr_items, 1);
    check(&c);
}

#[test]
fn set_overwrites_value_flags_and_exptime() {
    let (c, _) = cache();
    c.store(SetMode::Set, b"k", b"short", 1, 100, None).unwrap();
    c.store(
        SetMode::Set,
        b"k",
        b"a much longer value than before",
        2,
        0,
        None,
    )
    .unwrap();
    assert_eq!(
        c.get(b"k", |it| (it.value.to_vec(), it.flags, it.exptime)),
        Some((b"a much longer value than before".to_vec(), 2, 0))
    );
    c.store(SetMode::Set, b"k", b"", 3, 0, None).unwrap();
    assert_eq!(value(&c, b"k").as_deref(), Some(&b""[..]));
    check(&c);
}

#[test]
fn cas_rules() {
    let (c, _) = cache();
    let cas_set = |token: u64, v: &[u8]| c.store(SetMode::Cas(token), b"k", v, 0, 0, None).unwrap();
    assert_eq!(cas_set(1, b"x"), StoreOutcome::NotFound);
    let token = set(&c, b"k", b"a");
    assert_eq!(cas_set(token + 1000, b"x"), StoreOutcome::Exists);
    assert_eq!(value(&c, b"k").as_deref(), Some(&b"a"[..]));
    let StoreOutcome::Stored(next) = cas_set(token, b"b") else {
        panic!("cas with the right token must store")
    };
    assert_ne!(next, token);
    assert_eq!(
        cas_set(token, b"c"),
        StoreOutcome::Exists,
        "a used token is stale"
    );
    assert_eq!(c.get(b"k", |it| it.cas), Some(next));
    // An explicit CAS (meta E) is what the item then carries.
    assert_eq!(
        c.store(SetMode::Set, b"k", b"d", 0, 0, Some(77)).unwrap(),
        StoreOutcome::Stored(77)
    );
    assert_eq!(
        cas_set(77, b"e"),
        StoreOutcome::Stored(c.get(b"k", |it| it.cas).unwrap())
    );
    assert_eq!(value(&c, b"k").as_deref(), Some(&b"e"[..]));
}

#[test]
fn append_and_prepend_keep_flags_and_exptime() {
    let (c, _) = cache();
    assert_eq!(
        c.store(SetMode::Append, b"k", b"x", 0, 0, None).unwrap(),
        StoreOutcome::NotStored
    );
    assert_eq!(
        c.store(SetMode::Prepend, b"k", b"x", 0, 0, None).unwrap(),
        StoreOutcome::NotStored
    );
    c.store(SetMode::Set, b"k", b"mid", 7, 500, None).unwrap();
    assert!(matches!(
        c.store(SetMode::Append, b"k", b">>", 1, 1, None).unwrap(),
        StoreOutcome::Stored(_)
    ));
    assert!(matches!(
        c.store(SetMode::Prepend, b"k", b"<<", 2, 2, None).unwrap(),
        StoreOutcome::Stored(_)
    ));
    assert!(matches!(
        c.store(SetMode::Append, b"k", b"", 2, 2, None).unwrap(),
        StoreOutcome::Stored(_)
    ));
    assert_eq!(
        c.get(b"k", |it| (it.value.to_vec(), it.flags, it.exptime)),
        Some((b"<<mid>>".to_vec(), 7, 500))
    );
    assert_eq!(c.stats().total_items, 4);
    check(&c);
}

#[test]
fn too_large_items_are_refused_and_nothing_changes() {
    let max = 1000;
    let (c, _) = cache_with(CacheConfig {
        max_item_size: max,
        shards: 2,
        ..CacheConfig::default()
    });
    let fits = max - ITEM_HEADER_BYTES - 1;
    assert!(matches!(
        c.store(SetMode::Set, b"k", &vec![b'a'; fits], 0, 0, None),
        Ok(StoreOutcome::Stored(_))
    ));
    assert_eq!(
        c.store(SetMode::Set, b"k", &vec![b'b'; fits + 1], 0, 0, None),
        Err(Error::TooLarge)
    );
    assert_eq!(
        c.store(SetMode::Append, b"k", b"b", 0, 0, None),
        Err(Error::TooLarge)
    );
    assert_eq!(
        c.store(SetMode::Prepend, b"k", b"b", 0, 0, None),
        Err(Error::TooLarge)
    );
    assert_eq!(value(&c, b"k"), Some(vec![b'a'; fits]));
    assert_eq!(
        c.store(SetMode::Set, &vec![b'k'; MAX_KEY_LEN + 1], b"", 0, 0, None),
        Err(Error::TooLarge)
    );
    assert_eq!(Error::TooLarge.kind(), crate::ErrorKind::TooLarge);
    assert_eq!(c.stats().total_items, 1);
    check(&c);
}

#[test]
fn delete_outcomes() {
    let (c, _) = cache();
    assert_eq!(c.delete(b"k", None, false), DeleteOutcome::NotFound);
    let token = set(&c, b"k", b"v");
    assert_eq!(
        c.delete(b"k", Some(token + 1), false),
        DeleteOutcome::Exists
    );
    assert_eq!(value(&c, b"k").as_deref(), Some(&b"v"[..]));
    assert_eq!(c.delete(b"k", Some(token), false), DeleteOutcome::Deleted);
    assert_eq!(value(&c, b"k"), None);
    set(&c, b"k", b"v");
    assert_eq!(c.delete(b"k", None, false), DeleteOutcome::Deleted);
    assert_eq!(c.delete(b"k", None, false), DeleteOutcome::NotFound);
    assert_eq!(c.stats().curr_items, 0);
    check(&c);
}

#[test]
fn invalidate_marks_stale_and_hands_out_one_win_token() {
    let (c, _) = cache();
    let token = set(&c, b"k", b"v");
    assert_eq!(c.delete(b"k", None, true), DeleteOutcome::Deleted);
    let new_cas = c.get(b"k", |it| {
        assert!(it.stale && !it.win_token_taken);
        assert_eq!(it.value, b"v");
        it.cas
    });
    assert_ne!(new_cas, Some(token), "invalidation draws a new CAS");
    let mg = |c: &Cache| {
        c.get_with(b"k", GetOptions::default(), |h| {
            (h.won, h.token_taken_by_other, h.item.stale)
        })
    };
    assert_eq!(mg(&c), Some((true, false, true)));
    assert_eq!(mg(&c), Some((false, true, true)));
    // Invalidating again frees the token for the next client.
    assert_eq!(c.delete(b"k", None, true), DeleteOutcome::Deleted);
    assert_eq!(mg(&c), Some((true, false, true)));
    // A store ends the stale state.
    set(&c, b"k", b"fresh");
    assert_eq!(mg(&c), Some((false, false, false)));
    assert_eq!(
        c.get(b"k", |it| (it.stale, it.win_token_taken)),
        Some((false, false))
    );
}

#[test]
fn vivify_creates_an_empty_item_and_one_winner() {
    let (c, _) = cache();
    let viv = GetOptions {
        vivify: Some(30),
        ..GetOptions::default()
    };
    assert_eq!(
        c.get_with(b"k", GetOptions::default(), |_| ()),
        None,
        "no vivify: plain miss"
    );
    let first = c.get_with(b"k", viv, |h| {
        assert!(h.item.vivified && h.item.win_token_taken);
        assert_eq!(
            (h.item.value, h.item.flags, h.item.exptime),
            (&b""[..], 0, 30)
        );
        (h.won, h.token_taken_by_other, h.vivified)
    });
    assert_eq!(first, Some((true, false, true)));
    assert_eq!(
        c.get_with(b"k", viv, |h| (h.won, h.token_taken_by_other, h.vivified)),
        Some((false, true, false))
    );
    // The classic get sees the empty item and does not touch the token.
    assert_eq!(value(&c, b"k").as_deref(), Some(&b""[..]));
    // add fails on the placeholder; the winner's set replaces it and clears the state.
    assert_eq!(
        c.store(SetMode::Add, b"k", b"x", 0, 0, None).unwrap(),
        StoreOutcome::NotStored
    );
    set(&c, b"k", b"real");
    assert_eq!(
        c.get_with(b"k", viv, |h| (
            h.won,
            h.token_taken_by_other,
            h.item.vivified
        )),
        Some((false, false, false))
    );
    assert_eq!(c.stats().total_items, 2);
    check(&c);
}

#[test]
fn vivify_without_memory_is_a_plain_miss() {
    let (c, _) = cache_with(CacheConfig {
        memory_limit: 10,
        shards: 1,
        ..CacheConfig::default()
    });
    let viv = GetOptions {
        vivify: Some(0),
        ..GetOptions::default()
    };
    assert_eq!(c.get_with(b"k", viv, |_| ()), None);
    check(&c);
}

#[test]
fn arith_increments_decrements_wraps_and_floors() {
    let (c, _) = cache();
    assert_eq!(
        c.arith(b"n", true, 1, None, None).unwrap(),
        ArithOutcome::NotFound
    );
    set(&c, b"n", b"10");
    let ArithOutcome::Value(11, cas1) = c.arith(b"n", true, 1, None, None).unwrap() else {
        panic!()
    };
    assert_eq!(
        c.get(b"n", |it| (it.value.to_vec(), it.cas)),
        Some((b"11".to_vec(), cas1))
    );
    assert!(matches!(
        c.arith(b"n", false, 2, None, None).unwrap(),
        ArithOutcome::Value(9, _)
    ));
    // The shorter result replaces the value without padding.
    assert_eq!(value(&c, b"n").as_deref(), Some(&b"9"[..]));
    assert!(matches!(
        c.arith(b"n", false, 100, None, None).unwrap(),
        ArithOutcome::Value(0, _)
    ));
    set(&c, b"n", b"18446744073709551615");
    assert!(matches!(
        c.arith(b"n", true, 0, None, None).unwrap(),
        ArithOutcome::Value(u64::MAX, _)
    ));
    assert!(matches!(
        c.arith(b"n", true, 2, None, None).unwrap(),
        ArithOutcome::Value(1, _)
    ));
    assert_eq!(value(&c, b"n").as_deref(), Some(&b"1"[..]));
    assert!(matches!(
        c.arith(b"n", true, u64::MAX, None, None).unwrap(),
        ArithOutcome::Value(0, _)
    ));
    assert!(matches!(
        c.arith(b"n", false, 0, None, None).unwrap(),
        ArithOutcome::Value(0, _)
    ));
    check(&c);
}

#[test]
fn arith_parses_values_like_memcached() {
    let (c, _) = cache();
    // What memcached 1.6 answers to `incr k 1` on each stored value (checked against a live one).
    let cases: &[(&[u8], Option<u64>)] = &[
        (b"12 ", Some(13)),
        (b" 12", Some(13)),
        (b"\t7", Some(8)),
        (b"12\n", Some(13)),
        (b"12 34", Some(13)),
        (b"1\x002", Some(2)),
        (b"+5", Some(6)),
        (b"-0", Some(1)),
        (b"00000000000000000000005", Some(6)),
        (b"18446744073709551615", Some(0)),
        (b"-18446744073709551615", Some(2)),
        (b"12abc", None),
        (b"-1", None),
        (b"18446744073709551616", None),
        (b"   ", None),
        (b"1.5", None),
        (b"", None),
        (b"+", None),
        (b"abc", None),
    ];
    for &(stored, want) in cases {
        set(&c, b"k", stored);
        let got = c.arith(b"k", true, 1, None, None).unwrap();
        match want {
            Some(v) => assert!(
                matches!(got, ArithOutcome::Value(n, _) if n == v),
                "{stored:?}: {got:?}"
            ),
            None => {
                assert_eq!(got, ArithOutcome::NonNumeric, "{stored:?}");
                assert_eq!(
                    value(&c, b"k").as_deref(),
                    Some(stored),
                    "a failed incr leaves the value"
                );
            }
        }
    }
}

#[test]
fn arith_cas_and_autovivify() {
    let (c, _) = cache();
    let token = set(&c, b"n", b"5");
    assert_eq!(
        c.arith(b"n", true, 1, Some(token + 1), None).unwrap(),
        ArithOutcome::Exists
    );
    let ArithOutcome::Value(6, next) = c.arith(b"n", true, 1, Some(token), None).unwrap() else {
        panic!()
    };
    assert_eq!(
        c.arith(b"n", true, 1, Some(token), None).unwrap(),
        ArithOutcome::Exists
    );
    assert!(matches!(
        c.arith(b"n", true, 1, Some(next), None).unwrap(),
        ArithOutcome::Value(7, _)
    ));
    // memcached checks for an empty value before the CAS.
    set(&c, b"e", b"");
    assert_eq!(
        c.arith(b"e", true, 1, Some(0), None).unwrap(),
        ArithOutcome::NonNumeric
    );
    // Autovivify creates the item with the initial value (the delta is not applied), then counts.
    let ArithOutcome::Value(13, cas) = c.arith(b"a", true, 1, None, Some((13, 40))).unwrap() else {
        panic!()
    };
    assert_eq!(
        c.get(b"a", |it| (it.value.to_vec(), it.cas, it.exptime, it.flags)),
        Some((b"13".to_vec(), cas, 40, 0))
    );
    assert!(matches!(
        c.arith(b"a", true, 1, None, Some((13, 40))).unwrap(),
        ArithOutcome::Value(14, _)
    ));
    check(&c);
}

#[test]
fn expired_items_miss_and_are_counted() {
    let (c, clock) = cache();
    c.store(SetMode::Set, b"k", b"v", 0, 6, None).unwrap();
    clock.advance(4);
    assert!(value(&c, b"k").is_some());
    clock.advance(1);
    assert_eq!(value(&c, b"k"), None);
    let s = c.stats();
    assert_eq!((s.expired, s.curr_items, s.bytes), (1, 0, 0));
    // Every write path treats an expired item as absent.
    c.store(SetMode::Set, b"k", b"v", 0, 7, None).unwrap();
    clock.advance(1);
    assert_eq!(
        c.store(SetMode::Replace, b"k", b"w", 0, 0, None).unwrap(),
        StoreOutcome::NotStored
    );
    c.store(SetMode::Set, b"k", b"1", 0, 8, None).unwrap();
    clock.advance(1);
    assert_eq!(
        c.arith(b"k", true, 1, None, None).unwrap(),
        ArithOutcome::NotFound
    );
    assert_eq!(c.stats().expired, 3);
    check(&c);
}

#[test]
fn crawler_reclaims_expired_items_within_budget() {
    let (c, clock) = cache();
    for i in 0..20u32 {
        let exptime = if i % 2 == 0 { 5 } else { 0 };
        c.store(
            SetMode::Set,
            format!("k{i}").as_bytes(),
            b"v",
            0,
            exptime,
            None,
        )
        .unwrap();
    }
    assert_eq!(c.crawl_expired(100), 0);
    clock.advance(10);
    assert_eq!(c.crawl_expired(3), 3);
    assert_eq!(c.crawl_expired(100), 7);
    assert_eq!(c.crawl_expired(100), 0);
    let s = c.stats();
    assert_eq!((s.curr_items, s.expired, s.reclaimed), (10, 10, 10));
    check(&c);
}

#[test]
fn crawler_notices_exptimes_set_by_touch_and_append() {
    let (c, clock) = cache();
    set(&c, b"a", b"v");
    assert_eq!(c.crawl_expired(10), 0);
    assert!(c.touch(b"a", 3));
    c.store(SetMode::Set, b"b", b"v", 0, 0, None).unwrap();
    c.get_and_touch(b"b", 4, |_| ());
    clock.advance(5);
    assert_eq!(c.crawl_expired(10), 2);
    check(&c);
}

#[test]
fn flush_all_now_hides_old_items_but_not_new_ones() {
    let (c, _) = cache();
    set(&c, b"old", b"1");
    set(&c, b"other", b"1");
    c.flush_all(0);
    assert_eq!(value(&c, b"old"), None);
    // Same second, after the flush: visible.
    set(&c, b"new", b"2");
    assert_eq!(value(&c, b"new").as_deref(), Some(&b"2"[..]));
    assert_eq!(
        c.store(SetMode::Add, b"old", b"3", 0, 0, None).unwrap(),
        StoreOutcome::Stored(4)
    );
    assert_eq!(
        c.stats().expired,
        0,
        "flushed items are not counted as expired"
    );
    // The crawler reaps the flushed item nobody looked at.
    assert_eq!(c.crawl_expired(10), 1);
    assert_eq!(c.stats().curr_items, 2);
    // A past second means now as well.
    c.flush_all(1);
    assert_eq!(value(&c, b"new"), None);
    check(&c);
}

#[test]
fn delayed_flush_takes_effect_when_its_second_comes() {
    let (c, clock) = cache();
    set(&c, b"a", b"1");
    c.flush_all(11);
    clock.advance(5);
    set(&c, b"b", b"2");
    assert!(value(&c, b"a").is_some() && value(&c, b"b").is_some());
    clock.advance(5);
    assert_eq!(value(&c, b"a"), None);
    assert_eq!(value(&c, b"b"), None, "written before the deadline");
    set(&c, b"c", b"3");
    assert!(value(&c, b"c").is_some());
    clock.advance(100);
    assert!(value(&c, b"c").is_some(), "a delayed flush applies once");
    // An immediate flush cancels a pending delayed one.
    c.flush_all(200);
    c.flush_all(0);
    set(&c, b"d", b"4");
    clock.advance(100);
    assert!(value(&c, b"d").is_some());
}

#[test]
fn alloc_size_models_glibc() {
    assert_eq!(alloc_size(0), 0);
    assert_eq!(alloc_size(1), 32);
    assert_eq!(alloc_size(24), 32);
    assert_eq!(alloc_size(25), 48);
    assert_eq!(alloc_size(1000), 1008);
    assert_eq!(alloc_size(128 * 1024 - 1), 128 * 1024 + 16);
    assert_eq!(alloc_size(128 * 1024), 132 * 1024);
    assert_eq!(alloc_size(1 << 20), (1 << 20) + 4096);
    assert_eq!(Cache::item_charge(1, 0), 32 + ITEM_HEADER_BYTES as u64 + 8);
    assert_eq!(ITEM_HEADER_BYTES, 48);
}

#[test]
fn stats_sum_over_shards() {
    let (c, _) = cache_with(CacheConfig {
        memory_limit: 1 << 20,
        shards: 8,
        ..CacheConfig::default()
    });
    let mut bytes = 0;
    for i in 0..100u32 {
        let key = format!("key{i}");
        set(&c, key.as_bytes(), &vec![b'x'; i as usize]);
        bytes += Cache::item_charge(key.len(), i as usize);
    }
    let s = c.stats();
    assert_eq!(
        (s.curr_items, s.total_items, s.bytes, s.limit_maxbytes),
        (100, 100, bytes, 1 << 20)
    );
    check(&c);
}

#[test]
fn memory_limit_holds_and_eviction_makes_room() {
    let limit = 64 * 1024;
    let (c, _) = cache_with(CacheConfig {
        memory_limit: limit,
        shards: 8,
        ..CacheConfig::default()
    });
    for i in 0..2000u32 {
        set(
            &c,
            format!("key{i}").as_bytes(),
            &vec![b'x'; (i % 300) as usize],
        );
        let s = c.stats();
        assert!(s.bytes <= limit as u64, "{} > {limit} after {i}", s.bytes);
        if i % 97 == 0 {
            check(&c);
        }
    }
    let s = c.stats();
    assert!(s.evictions > 0);
    assert!(
        s.bytes > limit as u64 / 2,
        "eviction frees only what it must: {}",
        s.bytes
    );
    assert!(
        value(&c, b"key1999").is_some(),
        "the newest item was stored"
    );
    check(&c);
}

#[test]
fn without_eviction_a_full_cache_refuses_and_keeps_old_values() {
    let per_item = Cache::item_charge(4, 10);
    let (c, _) = cache_with(CacheConfig {
        memory_limit: 10 * per_item as usize,
        evict: false,
        shards: 4,
        ..CacheConfig::default()
    });
    for i in 0..10 {
        set(&c, format!("k{i:03}").as_bytes(), b"0123456789");
    }
    assert_eq!(
        c.store(SetMode::Set, b"k999", b"0123456789", 0, 0, None),
        Err(Error::OutOfMemory)
    );
    assert_eq!(Error::OutOfMemory.kind(), crate::ErrorKind::OutOfMemory);
    // Growing an existing item does not fit either, and leaves the old value.
    let big = vec![b'y'; 200];
    assert_eq!(
        c.store(SetMode::Set, b"k000", &big, 0, 0, None),
        Err(Error::OutOfMemory)
    );
    assert_eq!(
        c.store(SetMode::Append, b"k000", &big, 0, 0, None),
        Err(Error::OutOfMemory)
    );
    assert_eq!(value(&c, b"k000").as_deref(), Some(&b"0123456789"[..]));
    // Same-size rewrites still work.
    set(&c, b"k000", b"abcdefghij");
    let s = c.stats();
    assert_eq!((s.curr_items, s.evictions), (10, 0));
    check(&c);
}

#[test]
fn without_eviction_expired_items_still_make_room() {
    let per_item = Cache::item_charge(4, 10);
    let (c, clock) = cache_with(CacheConfig {
        memory_limit: 10 * per_item as usize,
        evict: false,
        shards: 4,
        ..CacheConfig::default()
    });
    for i in 0..10 {
        c.store(
            SetMode::Set,
            format!("k{i:03}").as_bytes(),
            b"0123456789",
            0,
            3,
            None,
        )
        .unwrap();
    }
    assert_eq!(
        c.store(SetMode::Set, b"k999", b"0123456789", 0, 0, None),
        Err(Error::OutOfMemory)
    );
    clock.advance(5);
    set(&c, b"k999", b"0123456789");
    let s = c.stats();
    assert_eq!((s.evictions, s.expired), (0, 1));
    check(&c);
}

#[test]
fn an_item_larger_than_a_shards_share_fits() {
    let (c, _) = cache_with(CacheConfig {
        memory_limit: 2 << 20,
        shards: 64,
        max_item_size: 1 << 20,
        ..CacheConfig::default()
    });
    for i in 0..4000u32 {
        set(&c, format!("small{i}").as_bytes(), &[b's'; 500]);
    }
    let big = vec![b'b'; (1 << 20) - 100];
    set(&c, b"big", &big);
    assert_eq!(c.get(b"big", |it| it.value.len()), Some(big.len()));
    assert!(c.stats().evictions > 0);
    check(&c);
}

#[test]
fn an_item_over_the_whole_limit_evicts_nothing() {
    let (c, _) = cache_with(CacheConfig {
        memory_limit: 4096,
        shards: 2,
        ..CacheConfig::default()
    });
    set(&c, b"a", b"1");
    assert_eq!(
        c.store(SetMode::Set, b"big", &[0; 5000], 0, 0, None),
        Err(Error::OutOfMemory)
    );
    assert_eq!(c.stats().evictions, 0);
    assert!(value(&c, b"a").is_some());
}

#[test]
fn clock_gives_read_items_a_second_chance() {
    let n = 32u32;
    let per_item = Cache::item_charge(3, 8);
    let (c, _) = cache_with(CacheConfig {
        memory_limit: (n as u64 * per_item) as usize,
        shards: 1,
        ..CacheConfig::default()
    });
    for i in 0..n {
        set(&c, format!("{i:03}").as_bytes(), b"........");
    }
    for i in 0..n / 2 {
        assert!(c.get(format!("{i:03}").as_bytes(), |_| ()).is_some());
    }
    for i in n..n + n / 2 {
        set(&c, format!("{i:03}").as_bytes(), b"........");
    }
    assert_eq!(c.stats().evictions, u64::from(n / 2));
    for i in 0..n / 2 {
        assert!(
            value(&c, format!("{i:03}").as_bytes()).is_some(),
            "hot key {i} was evicted"
        );
    }
    for i in n / 2..n {
        assert!(
            value(&c, format!("{i:03}").as_bytes()).is_none(),
            "cold key {i} survived"
        );
    }
    check(&c);
}

#[test]
fn eviction_reclaims_expired_items_before_live_ones() {
    let per_item = Cache::item_charge(3, 8);
    let (c, clock) = cache_with(CacheConfig {
        memory_limit: (10 * per_item) as usize,
        shards: 1,
        ..CacheConfig::default()
    });
    for i in 0..10u32 {
        let exptime = if i == 7 { 2 } else { 0 };
        c.store(
            SetMode::Set,
            format!("{i:03}").as_bytes(),
            b"........",
            0,
            exptime,
            None,
        )
        .unwrap();
    }
    clock.advance(5);
    set(&c, b"new", b"........");
    let s = c.stats();
    assert_eq!((s.evictions, s.expired, s.curr_items), (0, 1, 10));
    assert!(value(&c, b"000").is_some());
}

#[test]
fn shards_round_up_to_a_power_of_two() {
    let (c, _) = cache_with(CacheConfig {
        shards: 5,
        ..CacheConfig::default()
    });
    assert_eq!(c.shards.len(), 8);
    let (c, _) = cache_with(CacheConfig {
        shards: 0,
        ..CacheConfig::default()
    });
    assert_eq!(c.shards.len(), 1);
    set(&c, b"k", b"v");
    assert!(value(&c, b"k").is_some());
}

#[test]
fn recache_hands_out_the_win_token_near_expiry() {
    // Transcribed from memcached 1.6.18: set ttl 100; mg R30 -> -; mg R200 -> W; mg -> Z;
    // mg R200 -> Z; set ttl 0; mg R200 -> -.
    let (c, _) = cache();
    c.store(SetMode::Set, b"r", b"x", 0, 101, None).unwrap();
    let mg = |recache: u32| {
        c.get_with_recache(b"r", GetOptions::default(), recache, |h| {
            (h.won, h.token_taken_by_other)
        })
    };
    assert_eq!(mg(30), Some((false, false)));
    assert_eq!(mg(200), Some((true, false)));
    assert_eq!(
        c.get_with(b"r", GetOptions::default(), |h| (
            h.won,
            h.token_taken_by_other
        )),
        Some((false, true))
    );
    assert_eq!(mg(200), Some((false, true)));
    assert_eq!(c.get(b"r", |it| it.win_token_taken), Some(true));
    set(&c, b"r", b"x");
    assert_eq!(
        mg(200),
        Some((false, false)),
        "an item that never expires is never recached"
    );
    // A touch to an already-past second does not upset the TTL arithmetic.
    let touch_past = GetOptions {
        touch: Some(1),
        ..GetOptions::default()
    };
    assert_eq!(
        c.get_with_recache(b"r", touch_past, 5, |h| h.won),
        Some(true)
    );
    assert_eq!(value(&c, b"r"), None);
}

#[test]
fn peek_has_no_side_effects() {
    let (c, clock) = cache();
    set(&c, b"k", b"v");
    c.delete(b"k", None, true);
    clock.advance(3);
    for _ in 0..2 {
        let seen = c.peek(b"k", |it| {
            (it.fetched, it.last_access, it.win_token_taken, it.stale)
        });
        assert_eq!(seen, Some((false, 1, false, true)));
    }
    assert_eq!(c.peek(b"nope", |_| ()), None);
    assert_eq!(
        c.get_with(b"k", GetOptions::default(), |h| h.won),
        Some(true),
        "the token was still free"
    );
}

#[test]
fn get_each_answers_every_key_in_order_and_stops_when_told() {
    let (c, _) = cache();
    // Even keys exist; 100 keys in all run the pipeline's prologue, steady state and drain.
    let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("k{i:03}").into_bytes()).collect();
    for k in keys.iter().step_by(2) {
        set(&c, k, k);
    }
    let mut seen = Vec::new();
    let n = c.get_each(keys.iter().map(Vec::as_slice), None, |it| {
        seen.push(it.map(|it| it.value.to_vec()));
        true
    });
    assert_eq!(n, 100);
    let want: Vec<Option<Vec<u8>>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (i % 2 == 0).then(|| k.clone()))
        .collect();
    assert_eq!(seen, want);

    // Stopping after key 37 looks up nothing further: key 38 is not bumped, so not fetched.
    let mut calls = 0;
    let n = c.get_each(keys.iter().map(Vec::as_slice), None, |_| {
        calls += 1;
        calls < 38
    });
    assert_eq!((n, calls), (38, 38));
    let fetched = |k: &[u8]| c.peek(k, |it| it.fetched).unwrap();
    let (fresh, _) = cache();
    for k in keys.iter().step_by(2) {
        set(&fresh, k, k);
    }
    fresh.get_each(keys.iter().map(Vec::as_slice), None, |_| false);
    assert!(fresh.peek(&keys[0], |it| it.fetched).unwrap());
    assert!(!fresh.peek(&keys[2], |it| it.fetched).unwrap());
    assert!(fetched(&keys[36]));
    check(&c);

    // No keys: nothing to call.
    assert_eq!(c.get_each(std::iter::empty(), None, |_| unreachable!()), 0);
}
