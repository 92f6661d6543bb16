//! `TableVersion::get_groups` (a whole request's partition groups in one call) against a model
//! and against one `get_batch` per group: same bytes for every value type, with misses, keys too
//! long, duplicates, empty and repeated groups, on open and sealed versions; refusals that append
//! nothing; and a writer racing readers on an open version.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ramgrid_store::tables::{Durability, MAX_KEY_LEN};
use ramgrid_store::{
    Error, KeyStatus, TableSpec, TableVersion, Tables, TablesConfig, ValueRef, ValueType,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PARTS: u32 = 8;
const KEYS: u32 = 3000;

fn tables() -> Tables {
    Tables::new(TablesConfig {
        memory_limit: 64 << 20,
        max_value_size: 1 << 16,
    })
}

fn spec(value_type: ValueType) -> TableSpec {
    TableSpec {
        name: "t".into(),
        partitions: PARTS,
        replication: 1,
        value_type,
        durability: Durability::Memory,
        incarnation: 1,
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("k{i}").into_bytes()
}

/// Key `i`'s value, packed as a hit is (7.2): the model the store is checked against.
fn packed(vt: ValueType, i: u32) -> Vec<u8> {
    match vt {
        ValueType::I64 => (i as i64 * 3 - 7).to_le_bytes().to_vec(),
        ValueType::F64 => (i as f64 + 0.5).to_le_bytes().to_vec(),
        ValueType::F32Vec { dim } => (0..dim)
            .flat_map(|d| (i as f32 + d as f32 * 0.25).to_le_bytes())
            .collect(),
        ValueType::Bytes => {
            let v = format!("v{i}").repeat(i as usize % 5);
            let mut rec = (v.len() as u32).to_le_bytes().to_vec();
            rec.extend_from_slice(v.as_bytes());
            rec
        }
    }
}

/// Key `i` lives in partition `i % PARTS`; every seventh key is deleted again, so the partitions
/// have had swap-removes. Returns which keys are live.
fn fill(t: &Tables, vt: ValueType) -> BTreeMap<Vec<u8>, u32> {
    t.create_table(spec(vt), &(0..PARTS).collect::<Vec<_>>())
        .unwrap();
    let mut live = BTreeMap::new();
    let mut st = Vec::new();
    for i in 0..KEYS {
        let v = packed(vt, i);
        let value = match vt {
            ValueType::I64 => ValueRef::I64(i64::from_le_bytes(v[..8].try_into().unwrap())),
            ValueType::F64 => ValueRef::F64(f64::from_le_bytes(v[..8].try_into().unwrap())),
            ValueType::F32Vec { .. } => ValueRef::F32VecLe(&v),
            ValueType::Bytes => ValueRef::Bytes(&v[4..]),
        };
        st.clear();
        t.put_batch("t", 0, i % PARTS, [(&key(i)[..], value)], &mut st)
            .unwrap();
        assert_eq!(st, [KeyStatus::Ok as u8]);
        live.insert(key(i), i);
    }
    for i in (0..KEYS).step_by(7) {
        t.delete_batch("t", 0, i % PARTS, [&key(i)[..]], &mut st)
            .unwrap();
        live.remove(&key(i));
    }
    live
}

type Groups = Vec<(u32, Vec<Vec<u8>>)>;

/// A request as a client might send it: groups in any order, a partition possibly twice, empty
/// groups, duplicate keys, keys of other partitions, unknown keys, keys too long, empty keys.
fn request(rng: &mut StdRng) -> Groups {
    (0..rng.gen_range(0..12))
        .map(|_| {
            let p = rng.gen_range(0..PARTS);
            let keys = (0..rng.gen_range(0..9))
                .map(|_| match rng.gen_range(0..20) {
                    0 => vec![b'x'; MAX_KEY_LEN + 1],
                    1 => Vec::new(),
                    2 => format!("m{}", rng.gen_range(0..100)).into_bytes(),
                    3 => key(rng.gen_range(0..KEYS)), // most likely another partition's
                    _ => key(rng.gen_range(0..KEYS / PARTS) * PARTS + p),
                })
                .collect();
            (p, keys)
        })
        .collect()
}

fn model(vt: ValueType, live: &BTreeMap<Vec<u8>, u32>, groups: &Groups) -> (Vec<u8>, Vec<u8>) {
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    let zeros = vt.packed_width().map(|w| vec![0u8; w]).unwrap_or_default();
    for (p, keys) in groups {
        for k in keys {
            match live.get(k) {
                Some(&i) if i % PARTS == *p => {
                    st.push(KeyStatus::Ok as u8);
                    vals.extend_from_slice(&packed(vt, i));
                }
                _ => {
                    let miss = if k.len() > MAX_KEY_LEN {
                        KeyStatus::KeyTooLarge
                    } else {
                        KeyStatus::NotFound
                    };
                    st.push(miss as u8);
                    vals.extend_from_slice(&zeros);
                }
            }
        }
    }
    (st, vals)
}

fn by_groups(tv: &TableVersion, groups: &Groups, st: &mut Vec<u8>, vals: &mut Vec<u8>) {
    let it = groups
        .iter()
        .map(|(p, keys)| (*p, keys.iter().map(Vec::as_slice)));
    tv.get_groups(it, st, vals).unwrap();
}

fn per_group(tv: &TableVersion, groups: &Groups) -> (Vec<u8>, Vec<u8>) {
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    for (p, keys) in groups {
        tv.get_batch(*p, keys.iter().map(Vec::as_slice), &mut st, &mut vals)
            .unwrap();
    }
    (st, vals)
}

#[test]
fn get_groups_matches_the_model_and_per_group_calls_for_every_type() {
    let types = [
        ValueType::I64,
        ValueType::F64,
        ValueType::F32Vec { dim: 3 },
        ValueType::Bytes,
    ];
    for vt in types {
        let t = tables();
        let live = fill(&t, vt);
        let mut rng = StdRng::seed_from_u64(11);
        for sealed in [false, true] {
            if sealed {
                t.seal_version("t", 1).unwrap();
            }
            let tv = t.at("t", 0).unwrap();
            assert_eq!(tv.is_sealed(), sealed);
            // Buffers that already hold something: get_groups appends, as get_batch does.
            let (mut st, mut vals) = (vec![9u8], vec![9u8]);
            let mut hits = 0;
            for _ in 0..300 {
                let groups = request(&mut rng);
                let (want_st, want_vals) = model(vt, &live, &groups);
                st.truncate(1);
                vals.truncate(1);
                by_groups(&tv, &groups, &mut st, &mut vals);
                assert_eq!((&st[1..], &vals[1..]), (&want_st[..], &want_vals[..]));
                assert_eq!(per_group(&tv, &groups), (want_st.clone(), want_vals));
                hits += want_st.iter().filter(|&&s| s == 0).count();
            }
            assert!(hits > 1000, "the requests find keys ({vt:?}: {hits})");
        }
    }
}

#[test]
fn a_request_larger_than_a_window_keeps_request_order() {
    let t = tables();
    let live = fill(&t, ValueType::F64);
    let tv = t.at("t", 0).unwrap();
    // One key per group, partitions cycling: every window mixes all partitions.
    let groups: Groups = (0..KEYS).map(|i| (i % PARTS, vec![key(i)])).collect();
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    by_groups(&tv, &groups, &mut st, &mut vals);
    assert_eq!(
        (st.clone(), vals.clone()),
        model(ValueType::F64, &live, &groups)
    );
    assert_eq!(st.len(), KEYS as usize);
    // And the same keys as one group per partition, in a scrambled key order.
    let mut rng = StdRng::seed_from_u64(5);
    let groups: Groups = (0..PARTS)
        .rev()
        .map(|p| {
            let mut keys: Vec<Vec<u8>> = (p..KEYS).step_by(PARTS as usize).map(key).collect();
            for j in (1..keys.len()).rev() {
                keys.swap(j, rng.gen_range(0..=j));
            }
            (p, keys)
        })
        .collect();
    st.clear();
    vals.clear();
    by_groups(&tv, &groups, &mut st, &mut vals);
    assert_eq!((st, vals), model(ValueType::F64, &live, &groups));
}

#[test]
fn empty_requests_and_groups_append_nothing() {
    let t = tables();
    fill(&t, ValueType::Bytes);
    let tv = t.at("t", 0).unwrap();
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    by_groups(&tv, &Vec::new(), &mut st, &mut vals);
    by_groups(&tv, &vec![(3, vec![]), (0, vec![])], &mut st, &mut vals);
    assert!(st.is_empty() && vals.is_empty());
}

#[test]
fn a_partition_not_held_or_out_of_range_refuses_the_whole_request() {
    let t = tables();
    fill(&t, ValueType::I64);
    t.set_held_partitions("t", &[0, 1, 2, 5]).unwrap();
    let tv = t.at("t", 0).unwrap();
    let (mut st, mut vals) = (vec![7u8], vec![7u8]);
    // The bad group comes last, after groups that would have found keys.
    let groups: Groups = vec![
        (0, vec![key(0), key(8)]),
        (5, vec![key(5)]),
        (3, vec![key(3)]),
    ];
    let it = groups
        .iter()
        .map(|(p, keys)| (*p, keys.iter().map(Vec::as_slice)));
    assert!(matches!(
        tv.get_groups(it, &mut st, &mut vals),
        Err(Error::NotHeld(3))
    ));
    let it = [(1u32, [&b"k1"[..]]), (PARTS, [&b"k1"[..]])];
    assert!(matches!(
        tv.get_groups(it, &mut st, &mut vals),
        Err(Error::Invalid(_))
    ));
    assert_eq!((st, vals), (vec![7u8], vec![7u8]));
    // A sealed version refuses the same way.
    t.seal_version("t", 1).unwrap();
    let tv = t.at("t", 0).unwrap();
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    let it = [(0u32, [&b"k8"[..]]), (4, [&b"k4"[..]])];
    assert!(matches!(
        tv.get_groups(it, &mut st, &mut vals),
        Err(Error::NotHeld(4))
    ));
    assert!(st.is_empty() && vals.is_empty());
}

/// A writer rewrites whole partitions of an OPEN version (one `put_batch` each, so one
/// generation per partition at any instant) and seals it at the end, while readers read every
/// partition in one `get_groups` whose groups visit partition 0 twice, apart. Each read must see
/// one generation per partition across both of its groups (the partition's lock is held for the
/// whole call), never going back, and every key found.
#[test]
fn readers_see_one_generation_per_partition_while_a_writer_rewrites_and_seals() {
    const P: u32 = 4;
    const PER: u32 = 40;
    const ROUNDS: i64 = 300;
    let t = Arc::new(tables());
    t.create_table(
        TableSpec {
            name: "t".into(),
            partitions: P,
            replication: 1,
            value_type: ValueType::I64,
            durability: Durability::Memory,
            incarnation: 1,
        },
        &(0..P).collect::<Vec<_>>(),
    )
    .unwrap();
    let keys: Vec<Vec<Vec<u8>>> = (0..P)
        .map(|p| (0..PER).map(|j| key(j * P + p)).collect())
        .collect();
    let write = |t: &Tables, gen: i64| {
        let mut st = Vec::new();
        for (p, ks) in keys.iter().enumerate() {
            let items = ks.iter().map(|k| (&k[..], ValueRef::I64(gen)));
            t.put_batch("t", 1, p as u32, items, &mut st).unwrap();
        }
        assert!(st.iter().all(|&s| s == KeyStatus::Ok as u8));
    };
    write(&t, 0);
    let done = AtomicBool::new(false);
    let half = (PER / 2) as usize;
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut seen = [0i64; P as usize];
                let (mut st, mut vals) = (Vec::new(), Vec::new());
                let mut after_done = 0;
                while after_done < 3 {
                    if done.load(Ordering::Acquire) {
                        after_done += 1;
                    }
                    let groups: Vec<(u32, &[Vec<u8>])> = vec![
                        (0, &keys[0][..half]),
                        (2, &keys[2][..]),
                        (1, &keys[1][..]),
                        (3, &[][..]),
                        (0, &keys[0][half..]),
                        (3, &keys[3][..]),
                    ];
                    st.clear();
                    vals.clear();
                    let tv = t.at("t", 1).unwrap();
                    let it = groups
                        .iter()
                        .map(|&(p, ks)| (p, ks.iter().map(Vec::as_slice)));
                    tv.get_groups(it, &mut st, &mut vals).unwrap();
                    assert!(st.iter().all(|&s| s == KeyStatus::Ok as u8));
                    let got: Vec<i64> = vals
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    let mut at = 0;
                    let mut gen = [None::<i64>; P as usize];
                    for &(p, ks) in &groups {
                        for &v in &got[at..at + ks.len()] {
                            let g = gen[p as usize].get_or_insert(v);
                            assert_eq!(*g, v, "partition {p} mixed generations in one call");
                        }
                        at += ks.len();
                    }
                    for p in 0..P as usize {
                        let g = gen[p].expect("every partition read");
                        assert!(g >= seen[p], "partition {p} went back");
                        seen[p] = g;
                        if after_done > 0 {
                            assert_eq!(g, ROUNDS, "sealed data is final");
                        }
                    }
                }
            });
        }
        s.spawn(|| {
            for gen in 1..=ROUNDS {
                write(&t, gen);
            }
            t.seal_version("t", 1).unwrap();
            done.store(true, Ordering::Release);
        });
    });
    assert!(t.at("t", 1).unwrap().is_sealed());
}
