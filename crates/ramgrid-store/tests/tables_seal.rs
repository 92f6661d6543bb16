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
