//! Partition images through the public table API: a sealed version's partitions exported and
//! installed into another registry read back exact; open versions have no image; a partition
//! installed as missing is refused, not read as empty; a damaged image installs nothing.

use ramgrid_store::{
    Durability, Error, ErrorKind, TableSpec, Tables, TablesConfig, ValueRef, ValueType,
};

fn spec(name: &str, value_type: ValueType) -> TableSpec {
    TableSpec {
        name: name.into(),
        partitions: 4,
        replication: 1,
        value_type,
        durability: Durability::Snapshot,
        incarnation: 7,
    }
}

fn tables() -> Tables {
    Tables::new(TablesConfig {
        memory_limit: 64 << 20,
        max_value_size: 1 << 16,
    })
}

/// Every (partition, key, value) of one version, sorted.
fn dump(t: &Tables, name: &str, version: u32) -> Vec<(u32, Vec<u8>, i64)> {
    let mut out = Vec::new();
    for p in 0..4 {
        t.scan(name, version, p, |k, v| match v {
            ValueRef::I64(x) => out.push((p, k.to_vec(), x)),
            other => panic!("unexpected value {other:?}"),
        })
        .unwrap();
    }
    out.sort();
    out
}

#[test]
fn a_sealed_version_moves_between_registries_by_its_images() {
    let (a, b) = (tables(), tables());
    a.create_table(spec("t", ValueType::I64), &[0, 1, 2, 3])
        .unwrap();
    b.create_table(spec("t", ValueType::I64), &[0, 1, 2, 3])
        .unwrap();
    a.create_version("t", 2).unwrap();
    for p in 0..4u32 {
        let keys: Vec<Vec<u8>> = (0..500).map(|i| format!("k{p}-{i}").into_bytes()).collect();
        let items = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (&k[..], ValueRef::I64(i as i64 * 3)));
        a.put_batch("t", 2, p, items, &mut Vec::new()).unwrap();
        let dels = keys.iter().step_by(7).map(|k| &k[..]);
        a.delete_batch("t", 2, p, dels, &mut Vec::new()).unwrap();
    }
    let open = a.at("t", 2).unwrap();
    assert_eq!(open.partition_image(0).unwrap_err(), Error::VersionOpen(2));
    a.seal_version("t", 2).unwrap();
    let v = a.at("t", 2).unwrap();
    let images: Vec<(u32, Vec<u8>)> = (0..4).map(|p| (p, v.partition_image(p).unwrap())).collect();
    let refs: Vec<(u32, &[u8])> = images.iter().map(|(p, i)| (*p, &i[..])).collect();
    let before = b.memory_used();
    b.install_version("t", 2, &refs, &[]).unwrap();
    assert!(b.memory_used() > before, "installed data is charged");
    b.set_current("t", 2).unwrap();
    assert_eq!(dump(&b, "t", 0), dump(&a, "t", 2));
    assert_eq!(
        b.install_version("t", 2, &refs, &[]).unwrap_err(),
        Error::VersionExists(2)
    );
    // A point lookup goes through the rebuilt index.
    let mut st = Vec::new();
    let mut vals = Vec::new();
    let got = b.at("t", 2).unwrap();
    got.get_batch(1, [&b"k1-1"[..], b"k1-7"], &mut st, &mut vals)
        .unwrap();
    assert_eq!(st, [0, 1], "k1-7 was deleted before the seal");
    assert_eq!(i64::from_le_bytes(vals[..8].try_into().unwrap()), 3);
}

#[test]
fn a_missing_partition_is_refused_and_a_damaged_image_installs_nothing() {
    let (a, b) = (tables(), tables());
    a.create_table(spec("t", ValueType::I64), &[0, 1, 2, 3])
        .unwrap();
    b.create_table(spec("t", ValueType::I64), &[0, 1, 2, 3])
        .unwrap();
    a.put_batch("t", 1, 0, [(&b"x"[..], ValueRef::I64(1))], &mut Vec::new())
        .unwrap();
    a.seal_version("t", 1).unwrap();
    let img = a.at("t", 1).unwrap().partition_image(0).unwrap();

    let mut bad = img.clone();
    let last = bad.len() - 9;
    bad[last] ^= 1;
    let used = b.memory_used();
    let err = b
        .install_version("t", 5, &[(0, &bad[..])], &[])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CorruptImage);
    assert!(err.to_string().contains("partition 0"), "{err}");
    assert!(b
        .describe("t")
        .unwrap()
        .versions
        .iter()
        .all(|v| v.number != 5));
    assert_eq!(b.memory_used(), used, "a refused install keeps no charge");

    b.install_version("t", 5, &[(0, &img[..])], &[2]).unwrap();
    let v = b.at("t", 5).unwrap();
    assert!(v.is_sealed() && v.is_missing(2) && !v.is_missing(1));
    assert_eq!(
        v.get_batch(2, [&b"x"[..]], &mut Vec::new(), &mut Vec::new())
            .unwrap_err(),
        Error::Repairing(2),
        "a missing partition must not read as empty: it waits for a copy from a replica"
    );
    assert_eq!(v.partition_image(2).unwrap_err(), Error::Repairing(2));
    let mut st = Vec::new();
    v.get_batch(1, [&b"x"[..]], &mut st, &mut Vec::new())
        .unwrap();
    assert_eq!(st, [1], "an empty partition answers misses");
    // Images of another value type are refused.
    b.create_table(spec("f", ValueType::F64), &[0, 1, 2, 3])
        .unwrap();
    let err = b
        .install_version("f", 2, &[(0, &img[..])], &[])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CorruptImage);
}
