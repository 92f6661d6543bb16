//! Deleted space in native tables is reusable and released: a write that needs room first
//! reclaims the garbage of deletes, and a partition emptied by deletes gives its memory back.

use ramgrid_store::{Durability, KeyStatus, TableSpec, Tables, TablesConfig, ValueRef, ValueType};

const OK: u8 = KeyStatus::Ok as u8;
const NF: u8 = KeyStatus::NotFound as u8;
const OOM: u8 = KeyStatus::OutOfMemory as u8;

fn tables(limit: usize) -> Tables {
    Tables::new(TablesConfig {
        memory_limit: limit,
        max_value_size: 1 << 16,
    })
}

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

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:07}").into_bytes()
}

/// A 1 KiB value that differs for every `i`.
fn value(i: usize) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 1024];
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

/// Put keys `range` of [`key`]/[`value`] into partition 0 of the open head, one batch per key
/// (as a loader near its budget would), returning the statuses.
fn put_bytes(t: &Tables, range: impl Iterator<Item = usize>) -> Vec<u8> {
    let mut all = Vec::new();
    for i in range {
        let (k, v) = (key(i), value(i));
        t.put_batch("b", 0, 0, [(&k[..], ValueRef::Bytes(&v))], &mut all)
            .unwrap();
    }
    all
}

#[test]
fn deleting_half_of_a_full_bytes_table_makes_room_for_as_many_new_items() {
    const N: usize = 2000;
    // The limit: what N items take once sealed (every vector trimmed to its length), plus 1%.
    // That is all the budget the N items ever need; doubling capacities must give way to exact
    // growth near the end for them to fit at all.
    let limit = {
        let t = tables(1 << 30);
        t.create_table(spec("b", 1, ValueType::Bytes), &[0])
            .unwrap();
        assert!(put_bytes(&t, 0..N).iter().all(|&s| s == OK));
        t.seal_version("b", 1).unwrap();
        t.memory_used() + t.memory_used() / 100
    };
    let t = tables(limit);
    t.create_table(spec("b", 1, ValueType::Bytes), &[0])
        .unwrap();
    assert!(put_bytes(&t, 0..N).iter().all(|&s| s == OK));

    // Delete every other key: half of each arena becomes garbage.
    let gone: Vec<Vec<u8>> = (0..N).step_by(2).map(key).collect();
    let mut st = Vec::new();
    t.delete_batch("b", 0, 0, gone.iter().map(|k| &k[..]), &mut st)
        .unwrap();
    assert!(st.iter().all(|&s| s == OK));

    // As many new keys as were deleted fit in the same budget.
    let st = put_bytes(&t, N..N + N / 2);
    let refused = st.iter().filter(|&&s| s != OK).count();
    assert_eq!(refused, 0, "{refused} of {} new items refused", N / 2);
    assert!(t.memory_used() <= limit);

    t.with_partition("b", 0, 0, |view| {
        assert_eq!(view.len(), N);
        for i in 0..N + N / 2 {
            let want = (i >= N || i % 2 == 1).then(|| value(i));
            assert_eq!(
                view.get(&key(i)),
                want.as_deref().map(ValueRef::Bytes),
                "key {i}"
            );
        }
    })
    .unwrap();

    // The budget really is tight: another tenth of N does not fit.
    let st = put_bytes(&t, 2 * N..2 * N + N / 10);
    assert!(st.contains(&OOM), "the limit was not tight");
}

#[test]
fn an_i64_table_emptied_by_deletes_gives_its_memory_back() {
    const N: u64 = 1_000_000;
    const PARTS: u32 = 4;
    let t = tables(64 << 20);
    t.create_table(spec("i", PARTS, ValueType::I64), &[0, 1, 2, 3])
        .unwrap();
    let empty = t.memory_used();
    let keys: Vec<[u8; 8]> = (0..N).map(|i| i.to_be_bytes()).collect();
    let part = |k: &[u8; 8]| (k[7] as u32) % PARTS;
    let load = |round: i64| {
        for p in 0..PARTS {
            let mut st = Vec::new();
            t.put_batch(
                "i",
                0,
                p,
                keys.iter()
                    .filter(|k| part(k) == p)
                    .map(|k| (&k[..], ValueRef::I64(u64::from_be_bytes(*k) as i64 + round))),
                &mut st,
            )
            .unwrap();
            assert!(st.iter().all(|&s| s == OK), "round {round}");
        }
    };
    load(0);
    let full = t.memory_used();
    for p in 0..PARTS {
        let mut st = Vec::new();
        t.delete_batch(
            "i",
            0,
            p,
            keys.iter().filter(|k| part(k) == p).map(|k| &k[..]),
            &mut st,
        )
        .unwrap();
        assert!(st.iter().all(|&s| s == OK));
    }
    // An emptied partition keeps at most a small floor per vector (key arena, entry slots,
    // column, index: 4 KiB each), so 16 KiB per partition over the empty table.
    let left = t.memory_used() - empty;
    assert!(
        left <= PARTS as usize * (16 << 10),
        "{left} bytes still charged after deleting everything ({full} when full)"
    );
    let described: u64 = t
        .describe("i")
        .unwrap()
        .versions
        .iter()
        .map(|v| v.bytes)
        .sum();
    assert_eq!(described as usize, t.memory_used());

    // The table works as before: load again and read everything back.
    load(7);
    for p in 0..PARTS {
        t.with_partition("i", 0, p, |view| {
            for k in keys.iter().filter(|k| part(k) == p) {
                assert_eq!(
                    view.get(k),
                    Some(ValueRef::I64(u64::from_be_bytes(*k) as i64 + 7))
                );
            }
        })
        .unwrap();
    }
    let mut st = Vec::new();
    let mut vals = Vec::new();
    t.get_batch("i", 0, 0, [&b"absent"[..]], &mut st, &mut vals)
        .unwrap();
    assert_eq!(st, [NF]);
}
