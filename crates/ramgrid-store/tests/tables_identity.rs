//! A version number is never given to new contents: dropping a version does not free its number,
//! and DESCRIBE reports the high-water mark that new versions must pass.

use ramgrid_store::{Durability, Error, TableSpec, Tables, TablesConfig, ValueType};

#[test]
fn version_numbers_are_never_reused() {
    let t = Tables::new(TablesConfig::default());
    let spec = TableSpec {
        name: "t".into(),
        partitions: 2,
        replication: 1,
        value_type: ValueType::I64,
        durability: Durability::Snapshot,
        incarnation: 0xfeed,
    };
    t.create_table(spec.clone(), &[0, 1]).unwrap();
    assert_eq!(t.describe("t").unwrap().high_water, 1);
    t.create_version("t", 2).unwrap();
    t.drop_version("t", 2, false).unwrap();
    assert_eq!(
        t.create_version("t", 2),
        Err(Error::VersionNumberUsed {
            version: 2,
            high_water: 2
        })
    );
    t.create_version("t", 5).unwrap();
    assert_eq!(
        t.create_version("t", 3),
        Err(Error::VersionNumberUsed {
            version: 3,
            high_water: 5
        })
    );
    let info = t.describe("t").unwrap();
    assert_eq!(info.high_water, 5);
    assert_eq!(info.spec, spec, "durability and incarnation are kept");
    // A table created again under the name is a new table: its own incarnation and numbers.
    t.drop_table("t").unwrap();
    t.create_table(
        TableSpec {
            incarnation: 0xbeef,
            ..spec
        },
        &[0, 1],
    )
    .unwrap();
    let info = t.describe("t").unwrap();
    assert_eq!((info.spec.incarnation, info.high_water), (0xbeef, 1));
}

/// A restarting server re-creates open versions from their logs under their old numbers (at or
/// below the mark, which only rises); partitions whose log could not be read are refused, not
/// read as empty.
#[test]
fn open_versions_are_restored_under_their_numbers() {
    use ramgrid_store::ValueRef;
    let t = Tables::new(TablesConfig::default());
    let spec = TableSpec {
        name: "t".into(),
        partitions: 2,
        replication: 1,
        value_type: ValueType::I64,
        durability: Durability::Log,
        incarnation: 1,
    };
    t.create_table(spec, &[0, 1]).unwrap();
    t.raise_high_water("t", 9).unwrap();
    t.restore_open_version("t", 4, &[]).unwrap();
    t.restore_open_version("t", 12, &[1]).unwrap();
    assert_eq!(
        t.restore_open_version("t", 4, &[]),
        Err(Error::VersionExists(4))
    );
    assert_eq!(t.describe("t").unwrap().high_water, 12);
    let mut st = Vec::new();
    t.put_batch("t", 4, 0, [(&b"k"[..], ValueRef::I64(3))], &mut st)
        .unwrap();
    assert_eq!(st, vec![0]);
    // A partition whose log could not be read back is pending: it takes writes (kept when its
    // copy from a replica comes in) and refuses reads until then, never reading as empty.
    assert_eq!(
        t.put_batch("t", 12, 1, [(&b"k"[..], ValueRef::I64(3))], &mut st),
        Ok(12)
    );
    let (mut status, mut values) = (Vec::new(), Vec::new());
    assert_eq!(
        t.get_batch("t", 12, 1, [&b"k"[..]], &mut status, &mut values),
        Err(Error::Repairing(1))
    );
    t.put_batch("t", 12, 0, [(&b"k"[..], ValueRef::I64(3))], &mut st)
        .unwrap();
}

/// `put_batch_then` / `delete_batch_then` hand exactly this batch's statuses to the hook (what a
/// write-ahead log appends), and not at all when the batch is refused.
#[test]
fn write_hooks_see_this_batchs_statuses() {
    use ramgrid_store::ValueRef;
    let t = Tables::new(TablesConfig::default());
    let spec = TableSpec {
        name: "t".into(),
        partitions: 1,
        replication: 1,
        value_type: ValueType::Bytes,
        durability: Durability::Log,
        incarnation: 1,
    };
    t.create_table(spec, &[0]).unwrap();
    let tv = t.at("t", 1).unwrap();
    let mut st = vec![9];
    let mut seen = Vec::new();
    let big = vec![0u8; 70_000];
    tv.put_batch_then(
        0,
        [
            (&b"a"[..], ValueRef::Bytes(b"1")),
            (&big[..], ValueRef::Bytes(b"2")),
        ],
        &mut st,
        |s| seen = s.to_vec(),
    )
    .unwrap();
    assert_eq!(seen, vec![0, 2], "Ok, then KeyTooLarge");
    tv.delete_batch_then(0, [&b"a"[..], &b"zz"[..]], &mut st, |s| seen = s.to_vec())
        .unwrap();
    assert_eq!(seen, vec![0, 1], "Ok, then NotFound");
    t.seal_version("t", 1).unwrap();
    let mut called = false;
    assert!(tv
        .delete_batch_then(0, [&b"a"[..]], &mut st, |_| called = true)
        .is_err());
    assert!(!called);
}
