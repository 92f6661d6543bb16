//! SCAN pages and TOP_K against a `BTreeMap` model: random tables of every value type, random
//! writes and deletes in between, pages of random item and byte bounds.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::scan::{page, Entries};
use super::tests::new_table;
use super::*;
use crate::tables::{Tables, ValueRef};

/// A value in a type-independent form: its column number (component 0 / the scalar) and bytes.
#[derive(Debug, Clone, PartialEq)]
struct Val {
    num: f64,
    bytes: Vec<u8>,
}

fn make(vt: ValueType, x: i64) -> Val {
    match vt {
        ValueType::I64 => Val {
            num: x as f64,
            bytes: x.to_le_bytes().to_vec(),
        },
        ValueType::F64 => {
            let f = x as f64 / 7.0;
            Val {
                num: f,
                bytes: f.to_le_bytes().to_vec(),
            }
        }
        ValueType::F32Vec { dim } => {
            let row: Vec<f32> = (0..dim).map(|c| (x + c as i64) as f32 / 3.0).collect();
            Val {
                num: f64::from(row[0]),
                bytes: row.iter().flat_map(|f| f.to_le_bytes()).collect(),
            }
        }
        ValueType::Bytes => Val {
            num: 0.0,
            bytes: vec![b'v'; (x.unsigned_abs() % 40) as usize],
        },
    }
}

fn value_ref(vt: ValueType, v: &Val) -> ValueRef<'_> {
    match vt {
        ValueType::I64 => ValueRef::I64(i64::from_le_bytes(v.bytes[..8].try_into().unwrap())),
        ValueType::F64 => ValueRef::F64(f64::from_le_bytes(v.bytes[..8].try_into().unwrap())),
        ValueType::F32Vec { .. } => ValueRef::F32VecLe(&v.bytes),
        ValueType::Bytes => ValueRef::Bytes(&v.bytes),
    }
}

fn value_bytes(v: ValueRef<'_>) -> Vec<u8> {
    match v {
        ValueRef::I64(x) => x.to_le_bytes().to_vec(),
        ValueRef::F64(x) => x.to_le_bytes().to_vec(),
        ValueRef::F32Vec(r) => r.iter().flat_map(|f| f.to_le_bytes()).collect(),
        ValueRef::F32VecLe(b) | ValueRef::Bytes(b) => b.to_vec(),
    }
}

const TYPES: [ValueType; 4] = [
    ValueType::I64,
    ValueType::F64,
    ValueType::F32Vec { dim: 3 },
    ValueType::Bytes,
];

/// Applies `ops` (key, Some(value) = put, None = delete) to the table and the model.
fn apply(
    t: &Tables,
    vt: ValueType,
    model: &mut BTreeMap<Vec<u8>, Val>,
    ops: &[(u16, Option<i64>)],
) {
    let mut st = Vec::new();
    for &(k, v) in ops {
        let key = format!("key{k}").into_bytes();
        match v {
            Some(x) => {
                let val = make(vt, x);
                t.put_batch("t", 0, 0, [(key.as_slice(), value_ref(vt, &val))], &mut st)
                    .unwrap();
                model.insert(key, val);
            }
            None => {
                t.delete_batch("t", 0, 0, [key.as_slice()], &mut st)
                    .unwrap();
                model.remove(&key);
            }
        }
    }
}

/// Pages through the whole partition, checking that the generation holds; (key, value bytes).
fn scan_all(
    t: &Tables,
    pred: Option<&Range>,
    max_items: usize,
    max_bytes: usize,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut generation = None;
    loop {
        let done = t
            .with_partition("t", 0, 0, |v| {
                assert!(*generation.get_or_insert(v.generation()) == v.generation());
                let p = page(&v, start, pred, max_items, max_bytes).unwrap();
                assert!(p.entries.len() <= max_items);
                assert!(p.entries.len() <= 1 || p.bytes <= max_bytes);
                if !p.done {
                    assert!(!p.entries.is_empty() || p.next == v.len());
                }
                let bytes: usize = p.entries.iter().map(|i| scan::entry_wire_len(&v, i)).sum();
                assert_eq!(bytes, p.bytes);
                if pred.is_none() {
                    assert!(matches!(p.entries, Entries::Run(_)));
                }
                for i in p.entries.iter() {
                    out.push((v.key(i).to_vec(), value_bytes(v.value(i))));
                }
                start = p.next;
                p.done
            })
            .unwrap();
        if done {
            return out;
        }
    }
}

fn ops_strategy() -> impl Strategy<Value = Vec<(u16, Option<i64>)>> {
    prop::collection::vec(
        (0u16..400, prop::option::weighted(0.8, -1000i64..1000)),
        0..600,
    )
}

proptest! {
    #[test]
    fn pages_cover_the_partition_exactly_once(
        ops in ops_strategy(),
        more in ops_strategy(),
        max_items in 1usize..200,
        max_bytes in 1usize..4000,
        lo in -150.0f64..150.0,
        w in 0.0f64..200.0,
        ti in 0usize..4,
    ) {
        let vt = TYPES[ti];
        let t = new_table(vt);
        let mut model = BTreeMap::new();
        apply(&t, vt, &mut model, &ops);
        let g0 = t.with_partition("t", 0, 0, |v| v.generation()).unwrap();
        prop_assert!(g0 != 0);
        apply(&t, vt, &mut model, &more);
        let g1 = t.with_partition("t", 0, 0, |v| v.generation()).unwrap();
        if more.iter().any(|(_, v)| v.is_some()) {
            prop_assert_ne!(g0, g1);
        }
        if more.is_empty() {
            prop_assert_eq!(g0, g1);
        }

        let mut got = scan_all(&t, None, max_items, max_bytes);
        got.sort();
        let want: Vec<(Vec<u8>, Vec<u8>)> =
            model.iter().map(|(k, v)| (k.clone(), v.bytes.clone())).collect();
        prop_assert_eq!(&got, &want);

        if vt != ValueType::Bytes {
            let r = Range { component: 0, lo, hi: lo + w };
            let mut got = scan_all(&t, Some(&r), max_items, max_bytes);
            got.sort();
            let want: Vec<(Vec<u8>, Vec<u8>)> = model
                .iter()
                .filter(|(_, v)| v.num >= r.lo && v.num < r.hi)
                .map(|(k, v)| (k.clone(), v.bytes.clone()))
                .collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn top_k_is_the_best_k_with_ties_by_key(
        ops in ops_strategy(),
        k in 1u32..50,
        largest in any::<bool>(),
        filtered in any::<bool>(),
        ti in 0usize..3,
    ) {
        let vt = TYPES[ti];
        let t = new_table(vt);
        let mut model = BTreeMap::new();
        apply(&t, vt, &mut model, &ops);
        let pred = filtered.then_some(Range { component: 0, lo: -50.0, hi: 80.0 });
        let op = Op::TopK { column: 0, k, largest, pred };
        let OpOutput::TopK(got) = t.with_partition("t", 0, 0, |v| run(&op, &v)).unwrap().unwrap() else {
            panic!("not a top_k output")
        };
        let mut want: Vec<(Vec<u8>, f64)> = model
            .iter()
            .filter(|(_, v)| pred.is_none_or(|r| v.num >= r.lo && v.num < r.hi))
            .map(|(k, v)| (k.clone(), v.num))
            .collect();
        want.sort_by(|a, b| {
            let by = if largest { b.1.partial_cmp(&a.1) } else { a.1.partial_cmp(&b.1) };
            by.unwrap().then_with(|| a.0.cmp(&b.0))
        });
        want.truncate(k as usize);
        prop_assert_eq!(got, want);
    }
}

#[test]
fn bad_pages_and_top_k_are_refused() {
    let t = new_table(ValueType::Bytes);
    let mut model = BTreeMap::new();
    apply(&t, ValueType::Bytes, &mut model, &[(1, Some(3))]);
    t.with_partition("t", 0, 0, |v| {
        let r = Range {
            component: 0,
            lo: 0.0,
            hi: 1.0,
        };
        assert!(
            page(&v, 0, Some(&r), 10, 100).is_err(),
            "a predicate on bytes"
        );
        assert!(page(&v, 2, None, 10, 100).is_err(), "a cursor past the end");
        assert!(page(&v, 0, None, 0, 100).is_err(), "no items");
        let p = page(&v, 0, None, 10, 1).unwrap();
        assert_eq!(
            (p.entries.len(), p.done),
            (1, true),
            "one entry over the byte bound still goes"
        );
    })
    .unwrap();
    let bad = |vt, op: Op<'_>| assert!(validate(&op, vt).is_err(), "{op:?} on {vt:?}");
    bad(
        ValueType::Bytes,
        Op::TopK {
            column: 0,
            k: 1,
            largest: true,
            pred: None,
        },
    );
    bad(
        ValueType::F64,
        Op::TopK {
            column: 1,
            k: 1,
            largest: true,
            pred: None,
        },
    );
    bad(
        ValueType::F64,
        Op::TopK {
            column: 0,
            k: 0,
            largest: true,
            pred: None,
        },
    );
    bad(
        ValueType::F64,
        Op::TopK {
            column: 0,
            k: MAX_TOP_K + 1,
            largest: true,
            pred: None,
        },
    );
}

#[test]
fn sealing_changes_the_generation_and_then_nothing_does() {
    let t = new_table(ValueType::F64);
    let mut model = BTreeMap::new();
    apply(
        &t,
        ValueType::F64,
        &mut model,
        &[(1, Some(3)), (2, Some(4))],
    );
    let open = t.with_partition("t", 0, 0, |v| v.generation()).unwrap();
    t.seal_version("t", 1).unwrap();
    let sealed = t.with_partition("t", 1, 0, |v| v.generation()).unwrap();
    assert_ne!(open, sealed);
    assert_eq!(
        sealed,
        t.with_partition("t", 1, 0, |v| v.generation()).unwrap()
    );
}
