//! A batch read never holds more than its caller's bound: past it, the read is refused whole.

use ramgrid_store::tables::{Durability, TableSpec, Tables, TablesConfig, ValueRef, ValueType};
use ramgrid_store::Error;

#[test]
fn get_batch_bounded_refuses_whole_past_its_bound() {
    let t = Tables::new(TablesConfig {
        memory_limit: 64 << 20,
        max_value_size: 1 << 20,
    });
    t.create_table(
        TableSpec {
            name: "b".into(),
            partitions: 1,
            replication: 1,
            value_type: ValueType::Bytes,
            durability: Durability::Memory,
            incarnation: 1,
        },
        &[0],
    )
    .unwrap();
    let value = vec![7u8; 1000];
    let keys: Vec<Vec<u8>> = (0..10).map(|i| format!("k{i}").into_bytes()).collect();
    let mut st = Vec::new();
    let at = t.at("b", 1).unwrap();
    at.put_batch(
        0,
        keys.iter().map(|k| (&k[..], ValueRef::Bytes(&value))),
        &mut st,
    )
    .unwrap();
    let (mut status, mut values) = (vec![9u8], vec![9u8]);
    // 10 values of 4 + 1000 bytes: 10,040 bytes.
    let err = at
        .get_batch_bounded(
            0,
            keys.iter().map(|k| &k[..]),
            &mut status,
            &mut values,
            10_039,
        )
        .unwrap_err();
    assert_eq!(err, Error::ReplyTooLarge(10_039));
    assert_eq!((status.len(), values.len()), (1, 1), "nothing appended");
    at.get_batch_bounded(
        0,
        keys.iter().map(|k| &k[..]),
        &mut status,
        &mut values,
        10_040,
    )
    .unwrap();
    assert_eq!((status.len(), values.len()), (11, 1 + 10_040));
}
