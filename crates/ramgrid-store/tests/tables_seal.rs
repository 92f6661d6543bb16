//! Sealing a large version on several threads gives exactly what sealing it on one gives: the
//! same partition images byte for byte, the same charge to the memory budget, every key
//! readable with its last value and no deleted key back.

use ramgrid_store::{Durability, KeyStatus, TableSpec, Tables, TablesConfig, ValueRef, ValueType};

const PARTITIONS: u32 = 8;
/// Above the size below which a seal stays on the caller's thread.
const KEYS: usize = 120_000;

fn key(i: usize) -> Vec<u8> {
    format!("k{}-{}", i % 997, i / 997).into_bytes()
}

/// A bytes table loaded with [`KEYS`] keys, some overwritten (longer: the old value becomes
/// garbage) and some deleted (key and value garbage), then sealed on `threads` threads.
fn sealed(threads: usize) -> Tables {
    let t = Tables::new(TablesConfig {
        memory_limit: 1 << 30,
        max_value_size: 1 << 10,
    })
    .with_seal_threads(threads);
    let spec = TableSpec {
        name: "t".into(),
        partitions: PARTITIONS,
        replication: 1,
        value_type: ValueType::Bytes,
        durability: Durability::Memory,
        incarnation: 1,
    };
    t.create_table(spec, &(0..PARTITIONS).collect::<Vec<_>>())
        .unwrap();
    let mut st = Vec::new();
    for i in 0..KEYS {
        let p = (i % PARTITIONS as usize) as u32;
        let v = format!("v{i}");
        t.put_batch(
            "t",
            1,
            p,
            [(&key(i)[..], ValueRef::Bytes(v.as_bytes()))],
            &mut st,
        )
        .unwrap();
    }
    for i in (0..KEYS).step_by(7) {
        let p = (i % PARTITIONS as usize) as u32;
        let v = format!("overwritten {i}");
        t.put_batch(
            "t",
            1,
            p,
            [(&key(i)[..], ValueRef::Bytes(v.as_bytes()))],
            &mut st,
        )
        .unwrap();
    }
    for i in (0..KEYS).step_by(5) {
        let p = (i % PARTITIONS as usize) as u32;
        t.delete_batch("t", 1, p, [&key(i)[..]], &mut st).unwrap();
    }
    assert!(st.iter().all(|&s| s == KeyStatus::Ok as u8));
    t.seal_version("t", 1).unwrap();
    t
}

#[test]
fn a_seal_on_several_threads_is_the_seal_on_one() {
    let (one, three) = (sealed(1), sealed(3));
    let (a, b) = (one.at("t", 1).unwrap(), three.at("t", 1).unwrap());
    assert!(b.is_sealed());
    for p in 0..PARTITIONS {
        assert_eq!(
            a.partition_image(p).unwrap(),
            b.partition_image(p).unwrap(),
            "partition {p}"
        );
    }
    assert_eq!(one.memory_used(), three.memory_used());
    let info = three.describe("t").unwrap();
    assert_eq!(info.versions[0].bytes as usize, three.memory_used());
    for i in 0..KEYS {
        let p = (i % PARTITIONS as usize) as u32;
        let (mut st, mut vals) = (Vec::new(), Vec::new());
        b.get_batch(p, [&key(i)[..]], &mut st, &mut vals).unwrap();
        let want = if i % 5 == 0 {
            None
        } else if i % 7 == 0 {
            Some(format!("overwritten {i}"))
        } else {
            Some(format!("v{i}"))
        };
        match want {
            None => assert_eq!(st, [KeyStatus::NotFound as u8], "key {i}"),
            Some(v) => {
                assert_eq!(st, [KeyStatus::Ok as u8], "key {i}");
                assert_eq!(&vals[4..], v.as_bytes(), "key {i}");
            }
        }
    }
    assert_eq!(
        info.versions[0].items as usize,
        KEYS - KEYS.div_ceil(5),
        "items after the deletes"
    );
}

/// An i64 table whose current version 1 holds keys `0..n` and is sealed.
fn loaded(limit: usize, n: usize) -> Tables {
    let t = Tables::new(TablesConfig {
        memory_limit: limit,
        max_value_size: 1 << 10,
    });
    let spec = TableSpec {
        name: "r".into(),
        partitions: 4,
        replication: 1,
        value_type: ValueType::I64,
        durability: Durability::Memory,
        incarnation: 1,
    };
    t.create_table(spec, &[0, 1, 2, 3]).unwrap();
    put_all(&t, 1, n, 0);
    t.seal_version("r", 1).unwrap();
    t
}

fn put_all(t: &Tables, version: u32, n: usize, add: i64) {
    let mut st = Vec::new();
    for p in 0..4u32 {
        let keys: Vec<Vec<u8>> = (p as usize..n).step_by(4).map(key).collect();
        t.put_batch(
            "r",
            version,
            p,
            keys.iter()
                .map(|k| (&k[..], ValueRef::I64(k.len() as i64 + add))),
            &mut st,
        )
        .unwrap();
    }
    assert!(st.iter().all(|&s| s == KeyStatus::Ok as u8));
}

fn bytes_of(t: &Tables, version: u32) -> usize {
    let info = t.describe("r").unwrap();
    let v = info.versions.iter().find(|v| v.number == version).unwrap();
    v.bytes as usize
}

#[test]
fn a_new_version_has_room_for_what_the_current_one_holds_and_gives_back_what_it_leaves() {
    let n = 20_000;
    let t = loaded(1 << 30, n);
    let sealed = bytes_of(&t, 1);
    // Version 2 starts with room for version 1's keys, charged.
    t.create_version("r", 2).unwrap();
    let reserved = bytes_of(&t, 2);
    assert!(reserved >= sealed * 9 / 10, "{reserved} of {sealed}");
    assert_eq!(t.memory_used(), sealed + reserved);
    // As many keys again: nothing grows, and the seal leaves exactly what version 1 has.
    put_all(&t, 2, n, 1);
    assert_eq!(bytes_of(&t, 2), reserved);
    t.seal_version("r", 2).unwrap();
    assert_eq!(bytes_of(&t, 2), sealed);
    let v2 = t.at("r", 2).unwrap();
    for i in (0..n).step_by(97) {
        let (mut st, mut vals) = (Vec::new(), Vec::new());
        v2.get_batch((i % 4) as u32, [&key(i)[..]], &mut st, &mut vals)
            .unwrap();
        assert_eq!(st, [KeyStatus::Ok as u8]);
        assert_eq!(vals, (key(i).len() as i64 + 1).to_le_bytes());
    }
    // A smaller load into the next version: the seal gives the unused room back.
    t.set_current("r", 2).unwrap();
    t.create_version("r", 3).unwrap();
    put_all(&t, 3, n / 10, 0);
    t.seal_version("r", 3).unwrap();
    assert!(
        bytes_of(&t, 3) < sealed / 4,
        "{} of {sealed}",
        bytes_of(&t, 3)
    );
    // Dropping an open version with room gives it all back.
    t.create_version("r", 4).unwrap();
    let before = t.memory_used();
    t.drop_version("r", 4, false).unwrap();
    assert!(t.memory_used() < before);
    assert_eq!(
        t.memory_used(),
        bytes_of(&t, 1) + bytes_of(&t, 2) + bytes_of(&t, 3)
    );
}

#[test]
fn no_room_is_made_that_the_budget_cannot_take() {
    let limit = 1 << 30;
    let t = loaded(limit, 20_000);
    // Leave the budget room for a version's slot array, not for a copy of version 1's data.
    let outside = limit - t.memory_used() - (64 << 10);
    assert!(t.try_charge_outside(outside));
    t.create_version("r", 2).unwrap();
    assert!(bytes_of(&t, 2) < 64 << 10, "{}", bytes_of(&t, 2));
    put_all(&t, 2, 100, 0);
    t.seal_version("r", 2).unwrap();
    t.release_outside(outside);
    assert_eq!(t.memory_used(), bytes_of(&t, 1) + bytes_of(&t, 2));
}
