//! Behaviour of native tables: admin, typed round trips in the packed layout, versions and their
//! isolation, per-key errors, memory limits, scans and concurrent version switches.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ramgrid_store::tables::{Durability, MAX_KEY_LEN};
use ramgrid_store::{
    packed_values, Error, ErrorKind, KeyStatus, TableSpec, Tables, TablesConfig, ValueRef,
    ValueType,
};

const OK: u8 = KeyStatus::Ok as u8;
const NF: u8 = KeyStatus::NotFound as u8;

fn spec(name: &str, partitions: u32, value_type: ValueType) -> TableSpec {
    TableSpec {
        name: name.into(),
        partitions,
        replication: 1,
        value_type,
        durability: Durability::Memory,
        incarnation: 1,
    }
}

fn tables(limit: usize) -> Tables {
    Tables::new(TablesConfig {
        memory_limit: limit,
        max_value_size: 1 << 16,
    })
}

fn all(n: u32) -> Vec<u32> {
    (0..n).collect()
}

/// get_batch into fresh buffers.
fn get(t: &Tables, name: &str, version: u32, part: u32, keys: &[&[u8]]) -> (u32, Vec<u8>, Vec<u8>) {
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    let v = t
        .get_batch(
            name,
            version,
            part,
            keys.iter().copied(),
            &mut st,
            &mut vals,
        )
        .unwrap();
    (v, st, vals)
}

fn put_f64(t: &Tables, name: &str, version: u32, part: u32, items: &[(&[u8], f64)]) -> Vec<u8> {
    let mut st = Vec::new();
    t.put_batch(
        name,
        version,
        part,
        items.iter().map(|&(k, v)| (k, ValueRef::F64(v))),
        &mut st,
    )
    .unwrap();
    st
}

fn get_f64(t: &Tables, name: &str, version: u32, part: u32, key: &[u8]) -> Option<f64> {
    let (_, st, vals) = get(t, name, version, part, &[key]);
    (st[0] == OK).then(|| f64::from_le_bytes(vals[..8].try_into().unwrap()))
}

#[test]
fn handles_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tables>();
    assert_send_sync::<ramgrid_store::TableVersion>();
}

#[test]
fn admin_create_list_describe_drop() {
    let t = tables(1 << 20);
    t.create_table(spec("b", 4, ValueType::Bytes), &[0, 2])
        .unwrap();
    t.create_table(spec("a", 1, ValueType::F32Vec { dim: 3 }), &[0])
        .unwrap();
    assert_eq!(t.list(), vec!["a".to_string(), "b".to_string()]);
    let err = t
        .create_table(spec("a", 1, ValueType::I64), &[0])
        .unwrap_err();
    assert_eq!(err, Error::TableExists("a".into()));

    let info = t.describe("b").unwrap();
    assert_eq!(info.spec, spec("b", 4, ValueType::Bytes));
    assert_eq!(info.current, 1);
    assert_eq!(info.held, vec![0, 2]);
    assert_eq!(info.versions.len(), 1);
    assert_eq!(
        (
            info.versions[0].number,
            info.versions[0].sealed,
            info.versions[0].items
        ),
        (1, false, 0)
    );
    assert_eq!(t.value_type("a").unwrap(), ValueType::F32Vec { dim: 3 });
    t.expect_type("a", ValueType::F32Vec { dim: 3 }).unwrap();
    assert_eq!(
        t.expect_type("a", ValueType::F32Vec { dim: 4 })
            .unwrap_err(),
        Error::WrongType
    );

    t.drop_table("a").unwrap();
    assert_eq!(t.list(), vec!["b".to_string()]);
    assert_eq!(
        t.drop_table("a").unwrap_err().kind(),
        ErrorKind::NoSuchTable
    );
    assert_eq!(t.describe("a").unwrap_err(), Error::NoSuchTable("a".into()));
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    let err = t
        .get_batch("a", 0, 0, [&b"k"[..]], &mut st, &mut vals)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSuchTable);
}

#[test]
fn bad_specs_are_refused() {
    let t = tables(1 << 20);
    let bad = [
        (spec("", 1, ValueType::I64), vec![0]),
        (spec(&"n".repeat(256), 1, ValueType::I64), vec![0]),
        (spec("p0", 0, ValueType::I64), vec![]),
        (spec("dim0", 1, ValueType::F32Vec { dim: 0 }), vec![0]),
        (
            spec("dimbig", 1, ValueType::F32Vec { dim: 1 << 20 }),
            vec![0],
        ),
        (
            TableSpec {
                replication: 0,
                ..spec("r0", 1, ValueType::I64)
            },
            vec![0],
        ),
        (spec("held", 2, ValueType::I64), vec![2]),
    ];
    for (s, held) in bad {
        let name = s.name.clone();
        assert_eq!(
            t.create_table(s, &held).unwrap_err().kind(),
            ErrorKind::Invalid,
            "{name}"
        );
    }
    assert!(t.list().is_empty());
}

#[test]
fn f64_round_trip_in_packed_layout() {
    let t = tables(1 << 20);
    t.create_table(spec("f", 1, ValueType::F64), &[0]).unwrap();
    let st = put_f64(&t, "f", 0, 0, &[(b"x", 1.5), (b"y", -2.25), (b"", 7.0)]);
    assert_eq!(st, vec![OK; 3]);
    let (v, st, vals) = get(&t, "f", 0, 0, &[b"y", b"missing", b"x", b""]);
    assert_eq!(v, 1);
    assert_eq!(st, vec![OK, NF, OK, OK]);
    let mut want = Vec::new();
    for x in [-2.25f64, 0.0, 1.5, 7.0] {
        want.extend_from_slice(&x.to_le_bytes());
    }
    assert_eq!(vals, want);
    // Overwrite replaces.
    put_f64(&t, "f", 0, 0, &[(b"x", 9.0)]);
    assert_eq!(get_f64(&t, "f", 0, 0, b"x"), Some(9.0));
    assert_eq!(t.describe("f").unwrap().versions[0].items, 3);
}

#[test]
fn i64_round_trip_and_wrong_type_per_key() {
    let t = tables(1 << 20);
    t.create_table(spec("i", 1, ValueType::I64), &[0]).unwrap();
    let mut st = Vec::new();
    let items = [
        (&b"a"[..], ValueRef::I64(i64::MIN)),
        (&b"b"[..], ValueRef::F64(1.0)),
        (&b"c"[..], ValueRef::I64(42)),
        (&b"d"[..], ValueRef::Bytes(b"x")),
    ];
    t.put_batch("i", 0, 0, items, &mut st).unwrap();
    let wt = KeyStatus::WrongType as u8;
    assert_eq!(st, vec![OK, wt, OK, wt]);
    let (_, st, vals) = get(&t, "i", 0, 0, &[b"a", b"b", b"c"]);
    assert_eq!(st, vec![OK, NF, OK]);
    assert_eq!(&vals[..8], &i64::MIN.to_le_bytes());
    assert_eq!(&vals[8..16], &[0; 8]);
    assert_eq!(&vals[16..], &42i64.to_le_bytes());
}

#[test]
fn f32vec_round_trip_both_input_forms() {
    let t = tables(1 << 20);
    t.create_table(spec("v", 1, ValueType::F32Vec { dim: 3 }), &[0])
        .unwrap();
    let le: Vec<u8> = [4.0f32, 5.0, 6.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let items = [
        (&b"a"[..], ValueRef::F32Vec(&[1.0, 2.0, 3.0])),
        (&b"b"[..], ValueRef::F32VecLe(&le)),
        (&b"c"[..], ValueRef::F32Vec(&[1.0, 2.0])),
        (&b"d"[..], ValueRef::F32VecLe(&le[..8])),
    ];
    let mut st = Vec::new();
    t.put_batch("v", 0, 0, items, &mut st).unwrap();
    let wt = KeyStatus::WrongType as u8;
    assert_eq!(st, vec![OK, OK, wt, wt]);
    let (_, mut st, vals) = get(&t, "v", 0, 0, &[b"b", b"zz", b"a"]);
    assert_eq!(st, vec![OK, NF, OK]);
    let want: Vec<u8> = [4.0f32, 5.0, 6.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(vals, want);
    t.with_partition("v", 0, 0, |view| {
        assert_eq!(view.get(b"a"), Some(ValueRef::F32Vec(&[1.0, 2.0, 3.0])));
        assert_eq!(view.column_f32().unwrap().len(), 6);
        assert!(view.column_f64().is_none());
    })
    .unwrap();
    // Overwrite through the LE form, then delete the first entry (swap-remove moves "b").
    let le2: Vec<u8> = [7.0f32, 8.0, 9.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    t.put_batch("v", 0, 0, [(&b"a"[..], ValueRef::F32VecLe(&le2))], &mut st)
        .unwrap();
    t.delete_batch("v", 0, 0, [&b"a"[..]], &mut st).unwrap();
    t.with_partition("v", 0, 0, |view| {
        assert_eq!(view.len(), 1);
        assert_eq!(view.get(b"b"), Some(ValueRef::F32Vec(&[4.0, 5.0, 6.0])));
        assert_eq!(view.get(b"a"), None);
    })
    .unwrap();
}

#[test]
fn bytes_round_trip_overwrite_and_limits() {
    let t = tables(1 << 22);
    t.create_table(spec("b", 1, ValueType::Bytes), &[0])
        .unwrap();
    let big_key = vec![b'k'; MAX_KEY_LEN + 1];
    let max_key = vec![b'm'; MAX_KEY_LEN];
    let big_val = vec![0u8; (1 << 16) + 1];
    let items = [
        (&b"a"[..], ValueRef::Bytes(b"hello")),
        (&big_key[..], ValueRef::Bytes(b"x")),
        (&b"c"[..], ValueRef::Bytes(&big_val)),
        (&max_key[..], ValueRef::Bytes(b"")),
        (&b"e"[..], ValueRef::I64(1)),
    ];
    let mut st = Vec::new();
    t.put_batch("b", 0, 0, items, &mut st).unwrap();
    let (ktl, vtl, wt) = (
        KeyStatus::KeyTooLarge as u8,
        KeyStatus::ValueTooLarge as u8,
        KeyStatus::WrongType as u8,
    );
    assert_eq!(st, vec![OK, ktl, vtl, OK, wt]);

    let (_, mut st, vals) = get(&t, "b", 0, 0, &[&b"a"[..], &big_key, b"c", &max_key]);
    assert_eq!(st, vec![OK, ktl, NF, OK]);
    // Bytes: `u32 LE length + data` for hits only.
    let mut want = 5u32.to_le_bytes().to_vec();
    want.extend_from_slice(b"hello");
    want.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(vals, want);

    // Grow, shrink, grow again: each read sees the last write.
    for (i, len) in [10usize, 3, 3000, 1, 0, 65536].into_iter().enumerate() {
        let v = vec![i as u8; len];
        t.put_batch("b", 0, 0, [(&b"a"[..], ValueRef::Bytes(&v))], &mut st)
            .unwrap();
        t.with_partition("b", 0, 0, |view| {
            assert_eq!(view.get(b"a"), Some(ValueRef::Bytes(&v)))
        })
        .unwrap();
    }
    st.clear();
    t.delete_batch("b", 0, 0, [&b"a"[..], &b"a"[..], &big_key[..]], &mut st)
        .unwrap();
    assert_eq!(st, vec![OK, NF, ktl]);
}

#[test]
fn many_overwrites_and_deletes_keep_memory_bounded() {
    // Every round grows each value, so it moves to the arena's end; the garbage left behind is
    // compacted, so memory stays near the live size.
    let t = tables(8 << 20);
    t.create_table(spec("b", 1, ValueType::Bytes), &[0])
        .unwrap();
    let mut st = Vec::new();
    let val = vec![7u8; 4000];
    for round in 0..200u32 {
        let items: Vec<(Vec<u8>, Vec<u8>)> = (0..20u32)
            .map(|k| {
                (
                    k.to_le_bytes().to_vec(),
                    [
                        &val[..round as usize],
                        &round.to_le_bytes(),
                        &k.to_le_bytes(),
                    ]
                    .concat(),
                )
            })
            .collect();
        t.put_batch(
            "b",
            0,
            0,
            items.iter().map(|(k, v)| (&k[..], ValueRef::Bytes(v))),
            &mut st,
        )
        .unwrap();
    }
    assert!(st.iter().all(|&s| s == OK));
    // 20 live values of < 300 B; 200 rounds wrote over 800 KB in total.
    assert!(
        t.memory_used() < 64 << 10,
        "memory_used {}",
        t.memory_used()
    );
    t.with_partition("b", 0, 0, |view| {
        for k in 0..20u32 {
            let want = [&val[..199], &199u32.to_le_bytes(), &k.to_le_bytes()].concat();
            assert_eq!(view.get(&k.to_le_bytes()), Some(ValueRef::Bytes(&want)));
        }
    })
    .unwrap();
}

#[test]
fn delete_swap_remove_keeps_index_consistent() {
    let t = tables(16 << 20);
    t.create_table(spec("f", 1, ValueType::F64), &[0]).unwrap();
    let keys: Vec<Vec<u8>> = (0..5000u32)
        .map(|i| format!("key-{i}").into_bytes())
        .collect();
    let mut st = Vec::new();
    t.put_batch(
        "f",
        0,
        0,
        keys.iter()
            .enumerate()
            .map(|(i, k)| (&k[..], ValueRef::F64(i as f64))),
        &mut st,
    )
    .unwrap();
    st.clear();
    t.delete_batch("f", 0, 0, keys.iter().step_by(3).map(|k| &k[..]), &mut st)
        .unwrap();
    assert!(st.iter().all(|&s| s == OK));
    let (_, st, vals) = get(
        &t,
        "f",
        0,
        0,
        &keys.iter().map(|k| &k[..]).collect::<Vec<_>>(),
    );
    for (i, s) in st.iter().enumerate() {
        if i % 3 == 0 {
            assert_eq!(*s, NF, "key {i}");
        } else {
            assert_eq!(*s, OK, "key {i}");
            assert_eq!(
                f64::from_le_bytes(vals[i * 8..i * 8 + 8].try_into().unwrap()),
                i as f64
            );
        }
    }
    let sum: f64 = t
        .with_partition("f", 0, 0, |v| v.column_f64().unwrap().iter().sum())
        .unwrap();
    let want: f64 = (0..5000).filter(|i| i % 3 != 0).map(|i| i as f64).sum();
    assert_eq!(sum, want);
}

#[test]
fn deleting_most_keys_compacts_the_key_arena() {
    let t = tables(16 << 20);
    t.create_table(spec("i", 1, ValueType::I64), &[0]).unwrap();
    let keys: Vec<Vec<u8>> = (0..4000i64)
        .map(|i| format!("a-rather-long-key-number-{i}").into_bytes())
        .collect();
    let mut st = Vec::new();
    for round in 0..3i64 {
        st.clear();
        t.put_batch(
            "i",
            0,
            0,
            keys.iter()
                .enumerate()
                .map(|(i, k)| (&k[..], ValueRef::I64(i as i64 + round))),
            &mut st,
        )
        .unwrap();
        assert!(st.iter().all(|&s| s == OK));
        let full = t.memory_used();
        // Delete 90%: the key arena's garbage passes half and it is compacted.
        st.clear();
        t.delete_batch(
            "i",
            0,
            0,
            keys.iter()
                .filter(|k| k.last() != Some(&b'7'))
                .map(|k| &k[..]),
            &mut st,
        )
        .unwrap();
        assert!(st.iter().all(|&s| s == OK));
        assert!(
            t.memory_used() < full,
            "round {round}: compaction returned nothing"
        );
        t.with_partition("i", 0, 0, |view| {
            assert_eq!(view.len(), 400);
            for (i, k) in keys.iter().enumerate() {
                let want = (k.last() == Some(&b'7')).then_some(ValueRef::I64(i as i64 + round));
                assert_eq!(view.get(k), want, "round {round} key {i}");
            }
            for i in 0..view.len() {
                assert_eq!(view.get(view.key(i)), Some(view.value(i)));
            }
        })
        .unwrap();
    }
}

#[test]
fn version_lifecycle_and_errors() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 2, ValueType::F64), &[0, 1])
        .unwrap();
    assert_eq!(
        t.create_version("t", 0).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    assert_eq!(
        t.create_version("t", 1).unwrap_err(),
        Error::VersionExists(1)
    );
    assert_eq!(
        t.create_version("nope", 2).unwrap_err().kind(),
        ErrorKind::NoSuchTable
    );
    t.create_version("t", 2).unwrap();
    assert_eq!(t.set_current("t", 2).unwrap_err(), Error::VersionOpen(2));
    assert_eq!(t.set_current("t", 9).unwrap_err(), Error::NoSuchVersion(9));
    assert_eq!(t.seal_version("t", 9).unwrap_err(), Error::NoSuchVersion(9));
    put_f64(&t, "t", 2, 1, &[(b"k", 2.0)]);
    t.seal_version("t", 2).unwrap();
    t.seal_version("t", 2).unwrap(); // idempotent
    let mut st = Vec::new();
    let err = t
        .put_batch("t", 2, 1, [(&b"k"[..], ValueRef::F64(3.0))], &mut st)
        .unwrap_err();
    assert_eq!(err, Error::VersionSealed(2));
    assert_eq!(
        t.delete_batch("t", 2, 1, [&b"k"[..]], &mut st).unwrap_err(),
        Error::VersionSealed(2)
    );
    assert!(st.is_empty());
    t.set_current("t", 2).unwrap();
    // Version 0 is now the sealed v2: writes through it are refused.
    assert_eq!(
        t.put_batch("t", 0, 1, [(&b"k"[..], ValueRef::F64(3.0))], &mut st)
            .unwrap_err(),
        Error::VersionSealed(2)
    );
    assert_eq!(get_f64(&t, "t", 0, 1, b"k"), Some(2.0));

    let info = t.describe("t").unwrap();
    assert_eq!(info.current, 2);
    let vs: Vec<(u32, bool, u64)> = info
        .versions
        .iter()
        .map(|v| (v.number, v.sealed, v.items))
        .collect();
    assert_eq!(vs, vec![(1, false, 0), (2, true, 1)]);
    assert!(info.versions[1].bytes > 0);

    assert_eq!(
        t.drop_version("t", 2, false).unwrap_err(),
        Error::VersionCurrent(2)
    );
    t.drop_version("t", 1, false).unwrap();
    assert_eq!(
        t.drop_version("t", 1, false).unwrap_err(),
        Error::NoSuchVersion(1)
    );
    t.drop_version("t", 2, true).unwrap();
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    let err = t
        .get_batch("t", 0, 0, [&b"k"[..]], &mut st, &mut vals)
        .unwrap_err();
    assert_eq!(err, Error::NoSuchVersion(0));
    assert_eq!(t.describe("t").unwrap().current, 0);
}

#[test]
fn reading_a_dropped_pinned_version_fails() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 1, ValueType::F64), &[0]).unwrap();
    t.create_version("t", 5).unwrap();
    t.drop_version("t", 5, false).unwrap();
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    assert_eq!(
        t.get_batch("t", 5, 0, [&b"k"[..]], &mut st, &mut vals)
            .unwrap_err(),
        Error::NoSuchVersion(5)
    );
}

#[test]
fn version_isolation() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 1, ValueType::F64), &[0]).unwrap();
    put_f64(&t, "t", 0, 0, &[(b"a", 1.0), (b"b", 1.0)]);
    t.seal_version("t", 1).unwrap();

    t.create_version("t", 2).unwrap();
    put_f64(&t, "t", 2, 0, &[(b"a", 2.0), (b"c", 2.0)]);
    // Open v2 is invisible to readers of the current version.
    assert_eq!(get_f64(&t, "t", 0, 0, b"a"), Some(1.0));
    assert_eq!(get_f64(&t, "t", 0, 0, b"c"), None);
    // ...but readable by a reader that names it (the loader checking its work).
    assert_eq!(get_f64(&t, "t", 2, 0, b"c"), Some(2.0));

    t.seal_version("t", 2).unwrap();
    t.set_current("t", 2).unwrap();
    let (v, st, _) = get(&t, "t", 0, 0, &[b"a", b"b", b"c"]);
    assert_eq!((v, st), (2, vec![OK, NF, OK]));
    assert_eq!(get_f64(&t, "t", 0, 0, b"a"), Some(2.0));
    // A reader pinned to v1 still sees v1.
    let (v, st, vals) = get(&t, "t", 1, 0, &[b"a", b"b", b"c"]);
    assert_eq!((v, st), (1, vec![OK, OK, NF]));
    assert_eq!(&vals[..8], &1.0f64.to_le_bytes());
}

#[test]
fn held_partitions() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 4, ValueType::I64), &[1, 3])
        .unwrap();
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    assert_eq!(
        t.get_batch("t", 0, 0, [&b"k"[..]], &mut st, &mut vals)
            .unwrap_err(),
        Error::NotHeld(0)
    );
    assert_eq!(
        t.put_batch("t", 0, 2, [(&b"k"[..], ValueRef::I64(1))], &mut st)
            .unwrap_err(),
        Error::NotHeld(2)
    );
    assert_eq!(
        t.delete_batch("t", 0, 2, [&b"k"[..]], &mut st).unwrap_err(),
        Error::NotHeld(2)
    );
    assert_eq!(t.scan("t", 0, 0, |_, _| ()).unwrap_err(), Error::NotHeld(0));
    assert_eq!(
        t.get_batch("t", 0, 4, [&b"k"[..]], &mut st, &mut vals)
            .unwrap_err()
            .kind(),
        ErrorKind::Invalid
    );
    assert!(st.is_empty() && vals.is_empty());
    t.put_batch("t", 0, 3, [(&b"k"[..], ValueRef::I64(1))], &mut st)
        .unwrap();

    t.set_held_partitions("t", &[0]).unwrap();
    assert_eq!(t.describe("t").unwrap().held, vec![0]);
    assert_eq!(
        t.get_batch("t", 0, 3, [&b"k"[..]], &mut st, &mut vals)
            .unwrap_err(),
        Error::NotHeld(3)
    );
    t.get_batch("t", 0, 0, [&b"k"[..]], &mut st, &mut vals)
        .unwrap();
    assert_eq!(
        t.set_held_partitions("t", &[4]).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    // Data of a partition held again is still there.
    t.set_held_partitions("t", &[0, 3]).unwrap();
    t.with_partition("t", 0, 3, |v| {
        assert_eq!(v.get(b"k"), Some(ValueRef::I64(1)))
    })
    .unwrap();
}

#[test]
fn scan_visits_exactly_one_partition() {
    let t = tables(16 << 20);
    t.create_table(spec("a", 4, ValueType::I64), &all(4))
        .unwrap();
    t.create_table(spec("other", 4, ValueType::I64), &all(4))
        .unwrap();
    let mut want: BTreeMap<u32, BTreeMap<Vec<u8>, i64>> = BTreeMap::new();
    let mut st = Vec::new();
    for i in 0..2000i64 {
        let key = format!("k{i}").into_bytes();
        let p = (i % 4) as u32;
        t.put_batch("a", 0, p, [(&key[..], ValueRef::I64(i))], &mut st)
            .unwrap();
        t.put_batch("other", 0, p, [(&key[..], ValueRef::I64(-i))], &mut st)
            .unwrap();
        want.entry(p).or_default().insert(key, i);
    }
    for p in 0..4 {
        let mut seen = BTreeMap::new();
        let v = t
            .scan("a", 0, p, |k, v| {
                let ValueRef::I64(x) = v else { panic!("type") };
                assert!(seen.insert(k.to_vec(), x).is_none(), "visited twice");
            })
            .unwrap();
        assert_eq!(v, 1);
        assert_eq!(seen, want[&p]);
        // Column and keys line up.
        t.with_partition("a", 0, p, |view| {
            let col = view.column_i64().unwrap();
            assert_eq!(col.len(), view.len());
            for (i, x) in col.iter().enumerate() {
                assert_eq!(want[&p][view.key(i)], *x);
            }
        })
        .unwrap();
    }
}

#[test]
fn memory_limit_is_never_exceeded_and_oom_changes_nothing() {
    let limit = 256 << 10;
    let t = tables(limit);
    t.create_table(spec("b", 2, ValueType::Bytes), &[0, 1])
        .unwrap();
    let base = t.memory_used();
    let val = vec![1u8; 700];
    let mut stored = Vec::new();
    let mut st = Vec::new();
    let mut i = 0u32;
    loop {
        let key = i.to_be_bytes();
        st.clear();
        t.put_batch("b", 0, i % 2, [(&key[..], ValueRef::Bytes(&val))], &mut st)
            .unwrap();
        assert!(t.memory_used() <= limit);
        if st[0] == KeyStatus::OutOfMemory as u8 {
            break;
        }
        assert_eq!(st[0], OK);
        stored.push(i);
        i += 1;
        assert!(i < 10_000, "limit never reached");
    }
    assert!(stored.len() > 100);
    // Every refused key is absent (the other partition may still have room for some).
    for j in 0..50u32 {
        let key = (1_000_000 + j).to_be_bytes();
        st.clear();
        t.put_batch("b", 0, j % 2, [(&key[..], ValueRef::Bytes(&val))], &mut st)
            .unwrap();
        if st[0] != OK {
            assert_eq!(st[0], KeyStatus::OutOfMemory as u8);
            t.with_partition("b", 0, j % 2, |v| assert_eq!(v.get(&key), None))
                .unwrap();
        }
    }
    // Growing an existing value past the budget is refused and keeps the old value.
    let huge = vec![2u8; 60_000];
    let mut refused = false;
    for &k in &stored {
        st.clear();
        t.put_batch(
            "b",
            0,
            k % 2,
            [(&k.to_be_bytes()[..], ValueRef::Bytes(&huge))],
            &mut st,
        )
        .unwrap();
        assert!(t.memory_used() <= limit);
        if st[0] == KeyStatus::OutOfMemory as u8 {
            t.with_partition("b", 0, k % 2, |v| {
                assert_eq!(v.get(&k.to_be_bytes()), Some(ValueRef::Bytes(&val)))
            })
            .unwrap();
            refused = true;
            break;
        }
    }
    assert!(refused);
    // Creating a version needs memory too.
    let big = TableSpec {
        name: "big".into(),
        partitions: 60_000,
        replication: 1,
        value_type: ValueType::I64,
        durability: Durability::Memory,
        incarnation: 1,
    };
    assert_eq!(t.create_table(big, &[]).unwrap_err(), Error::OutOfMemory);
    // Dropping frees the accounting.
    t.drop_table("b").unwrap();
    assert_eq!(t.memory_used(), 0);
    assert!(base > 0);
}

#[test]
fn dropping_and_sealing_versions_return_memory() {
    let t = tables(64 << 20);
    t.create_table(spec("f", 2, ValueType::F64), &[0, 1])
        .unwrap();
    let head = t.memory_used();
    t.create_version("f", 2).unwrap();
    let mut st = Vec::new();
    let keys: Vec<[u8; 8]> = (0..10_000u64).map(|i| i.to_le_bytes()).collect();
    for p in 0..2 {
        t.put_batch(
            "f",
            2,
            p,
            keys.iter().map(|k| (&k[..], ValueRef::F64(1.0))),
            &mut st,
        )
        .unwrap();
    }
    let loaded = t.memory_used();
    let described: u64 = t
        .describe("f")
        .unwrap()
        .versions
        .iter()
        .map(|v| v.bytes)
        .sum();
    assert_eq!(described as usize, loaded);
    t.seal_version("f", 2).unwrap();
    assert!(t.memory_used() <= loaded);
    let described: u64 = t
        .describe("f")
        .unwrap()
        .versions
        .iter()
        .map(|v| v.bytes)
        .sum();
    assert_eq!(described as usize, t.memory_used());
    t.drop_version("f", 2, false).unwrap();
    assert_eq!(t.memory_used(), head);
}

#[test]
fn packed_values_decode_and_validate() {
    let mut buf = Vec::new();
    for x in [1.5f64, -3.0] {
        buf.extend_from_slice(&x.to_le_bytes());
    }
    let vals: Vec<ValueRef<'_>> = packed_values(ValueType::F64, &buf, 2).unwrap().collect();
    assert_eq!(vals, vec![ValueRef::F64(1.5), ValueRef::F64(-3.0)]);
    assert_eq!(
        packed_values(ValueType::F64, &buf, 3).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    assert_eq!(
        packed_values(ValueType::I64, &buf[..15], 2)
            .unwrap_err()
            .kind(),
        ErrorKind::Invalid
    );

    let mut b = Vec::new();
    for v in [&b"ab"[..], b"", b"xyz"] {
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
        b.extend_from_slice(v);
    }
    let vals: Vec<ValueRef<'_>> = packed_values(ValueType::Bytes, &b, 3).unwrap().collect();
    assert_eq!(
        vals,
        vec![
            ValueRef::Bytes(b"ab"),
            ValueRef::Bytes(b""),
            ValueRef::Bytes(b"xyz")
        ]
    );
    for bad in [&b[..b.len() - 1], &b[..5]] {
        assert!(packed_values(ValueType::Bytes, bad, 3).is_err());
    }
    assert!(packed_values(ValueType::Bytes, &b, 2).is_err());
    let huge_len = u32::MAX.to_le_bytes();
    assert!(packed_values(ValueType::Bytes, &huge_len, 1).is_err());

    let f: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let vals: Vec<ValueRef<'_>> = packed_values(ValueType::F32Vec { dim: 2 }, &f, 1)
        .unwrap()
        .collect();
    assert_eq!(vals, vec![ValueRef::F32VecLe(&f)]);

    // The decoded values feed put_batch directly, and get_batch gives back the same bytes.
    let t = tables(1 << 20);
    t.create_table(spec("b", 1, ValueType::Bytes), &[0])
        .unwrap();
    let keys = [&b"k1"[..], b"k2", b"k3"];
    let mut st = Vec::new();
    t.put_batch(
        "b",
        0,
        0,
        keys.iter()
            .copied()
            .zip(packed_values(ValueType::Bytes, &b, 3).unwrap()),
        &mut st,
    )
    .unwrap();
    let (_, st, vals) = get(&t, "b", 0, 0, &keys);
    assert_eq!(st, vec![OK; 3]);
    assert_eq!(vals, b);
}

#[test]
fn concurrent_switches_never_mix_versions_in_a_batch() {
    const KEYS: u32 = 64;
    const PARTS: u32 = 2;
    let t = Arc::new(tables(64 << 20));
    t.create_table(spec("t", PARTS, ValueType::I64), &all(PARTS))
        .unwrap();
    let keys: Arc<Vec<[u8; 4]>> = Arc::new((0..KEYS).map(|i| i.to_le_bytes()).collect());
    let load = |t: &Tables, v: u32| {
        let mut st = Vec::new();
        for p in 0..PARTS {
            t.put_batch(
                "t",
                v,
                p,
                keys.iter().map(|k| (&k[..], ValueRef::I64(v as i64))),
                &mut st,
            )
            .unwrap();
        }
    };
    load(&t, 1);
    t.seal_version("t", 1).unwrap();
    let done = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (t, keys, done) = (t.clone(), keys.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut st, mut vals) = (Vec::new(), Vec::new());
                let mut seen = BTreeSet::new();
                let mut batches = 0u32;
                while !done.load(Ordering::Acquire) || batches < 100 {
                    st.clear();
                    vals.clear();
                    let p = (batches + r) % PARTS;
                    let v = t
                        .get_batch("t", 0, p, keys.iter().map(|k| &k[..]), &mut st, &mut vals)
                        .unwrap();
                    assert!(st.iter().all(|&s| s == OK), "batch on v{v} had a miss");
                    for chunk in vals.chunks_exact(8) {
                        assert_eq!(
                            i64::from_le_bytes(chunk.try_into().unwrap()),
                            v as i64,
                            "mixed batch"
                        );
                    }
                    seen.insert(v);
                    batches += 1;
                    assert!(batches < 5_000_000, "writer never finished");
                }
                seen
            })
        })
        .collect();

    for v in 2..=200u32 {
        t.create_version("t", v).unwrap();
        load(&t, v);
        t.seal_version("t", v).unwrap();
        t.set_current("t", v).unwrap();
        // Keep a couple of old versions around for pinned readers; drop the rest.
        if v > 3 {
            t.drop_version("t", v - 3, false).unwrap();
        }
    }
    done.store(true, Ordering::Release);
    for r in readers {
        let seen = r.join().unwrap();
        assert!(!seen.is_empty());
    }
    assert_eq!(t.describe("t").unwrap().current, 200);
    assert_eq!(t.describe("t").unwrap().versions.len(), 3);
}

#[test]
fn a_handle_reads_one_version_across_groups_and_outlives_a_drop() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 2, ValueType::F64), &[0, 1])
        .unwrap();
    put_f64(&t, "t", 0, 0, &[(b"a", 1.0)]);
    put_f64(&t, "t", 0, 1, &[(b"b", 1.0)]);
    t.seal_version("t", 1).unwrap();
    t.create_version("t", 2).unwrap();
    put_f64(&t, "t", 2, 0, &[(b"a", 2.0)]);
    put_f64(&t, "t", 2, 1, &[(b"b", 2.0)]);
    t.seal_version("t", 2).unwrap();

    let at = t.at("t", 0).unwrap();
    assert_eq!(
        (at.version(), at.value_type(), at.is_sealed()),
        (1, ValueType::F64, true)
    );
    assert_eq!(at.spec().partitions, 2);
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    at.get_batch(0, [&b"a"[..]], &mut st, &mut vals).unwrap();
    // The switch and the drop happen between two groups of one request.
    t.set_current("t", 2).unwrap();
    t.drop_version("t", 1, false).unwrap();
    at.get_batch(1, [&b"b"[..]], &mut st, &mut vals).unwrap();
    assert_eq!(st, vec![OK, OK]);
    assert_eq!(vals, [1.0f64.to_le_bytes(), 1.0f64.to_le_bytes()].concat());
    // A fresh handle sees the new version; the dropped one is gone for new readers.
    assert_eq!(t.at("t", 0).unwrap().version(), 2);
    assert_eq!(t.at("t", 1).unwrap_err(), Error::NoSuchVersion(1));
    let mut seen = Vec::new();
    at.scan(1, |k, v| seen.push((k.to_vec(), v == ValueRef::F64(1.0))))
        .unwrap();
    assert_eq!(seen, vec![(b"b".to_vec(), true)]);
}

#[test]
fn a_handle_keeps_the_held_set_it_started_with() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 3, ValueType::I64), &[0, 1])
        .unwrap();
    let at = t.at("t", 0).unwrap();
    assert!(at.is_held(0) && at.is_held(1) && !at.is_held(2) && !at.is_held(7));
    t.set_held_partitions("t", &[2]).unwrap();
    let mut st = Vec::new();
    at.put_batch(1, [(&b"k"[..], ValueRef::I64(5))], &mut st)
        .unwrap();
    assert_eq!(st, vec![OK]);
    let fresh = t.at("t", 0).unwrap();
    assert_eq!(
        fresh
            .put_batch(1, [(&b"k"[..], ValueRef::I64(5))], &mut st)
            .unwrap_err(),
        Error::NotHeld(1)
    );
    assert!(fresh.is_held(2));
}

#[test]
fn a_handle_taken_on_an_open_version_sees_the_seal() {
    let t = tables(1 << 20);
    t.create_table(spec("t", 1, ValueType::I64), &[0]).unwrap();
    let at = t.at("t", 1).unwrap();
    assert!(!at.is_sealed());
    let mut st = Vec::new();
    at.put_batch(0, [(&b"k"[..], ValueRef::I64(5))], &mut st)
        .unwrap();
    t.seal_version("t", 1).unwrap();
    assert!(at.is_sealed());
    assert_eq!(
        at.put_batch(0, [(&b"k"[..], ValueRef::I64(6))], &mut st)
            .unwrap_err(),
        Error::VersionSealed(1)
    );
    let got = at
        .with_partition(0, |v| v.get(b"k") == Some(ValueRef::I64(5)))
        .unwrap();
    assert!(got);
    assert_eq!(st, vec![OK]);
}
