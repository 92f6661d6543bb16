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
