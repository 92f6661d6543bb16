//! Merge writes (`put_merge`): every replica merges each value into the stored one under its
//! partition's write lock, so concurrent writers lose no update; tables that are not i64 or f64
//! refuse merges before anything is sent.

mod common;

use common::Cluster;
use ramgrid_client::{Client, Error, Keys, Merge, ValueType, Values, ValuesRef};

fn i64_of(v: &Values) -> &[i64] {
    match v {
        Values::I64(v) => v,
        other => panic!("expected i64 values, got {other:?}"),
    }
}

#[test]
fn concurrent_adds_are_exact_on_every_replica() {
    let cluster = Cluster::start(2);
    let c = cluster.client();
    c.create_table("sums", 8, 2, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..500).collect();
    std::thread::scope(|s| {
        for w in 0..4i64 {
            let (c, keys) = (c.clone(), &keys);
            s.spawn(move || {
                let ones = vec![w + 1; keys.len()];
                for _ in 0..10 {
                    c.put_merge(
                        "sums",
                        Keys::I64(keys),
                        ValuesRef::I64(&ones),
                        0,
                        Merge::Add,
                    )
                    .unwrap();
                }
            });
        }
    });
    let want = 10 * (1 + 2 + 3 + 4);
    for server in &cluster.servers {
        let mut one = cluster.config();
        one.servers = vec![server.addr.clone()];
        let got = Client::new(one)
            .unwrap()
            .get("sums", Keys::I64(&keys), 0)
            .unwrap();
        assert!(got.found.iter().all(|&f| f));
        assert!(
            i64_of(&got.values).iter().all(|&v| v == want),
            "{}",
            server.addr
        );
    }
    c.put_merge(
        "sums",
        Keys::I64(&[0, 1]),
        ValuesRef::I64(&[-1000, 1000]),
        0,
        Merge::Min,
    )
    .unwrap();
    c.put_merge(
        "sums",
        Keys::I64(&[1, 2]),
        ValuesRef::I64(&[0, 1000]),
        0,
        Merge::Max,
    )
    .unwrap();
    let got = c.get("sums", Keys::I64(&[0, 1, 2]), 0).unwrap();
    assert_eq!(i64_of(&got.values), [-1000, want, 1000]);
}

#[test]
fn bytes_tables_refuse_merges_and_keep_their_values() {
    let cluster = Cluster::start(1);
    let c = cluster.client();
    c.create_table("b", 2, 1, ValueType::Bytes).unwrap();
    let keys: [&[u8]; 1] = [b"k"];
    c.put("b", Keys::Slices(&keys), ValuesRef::Slices(&[b"v"]), 0)
        .unwrap();
    let err = c
        .put_merge(
            "b",
            Keys::Slices(&keys),
            ValuesRef::Slices(&[b"w"]),
            0,
            Merge::Add,
        )
        .expect_err("a bytes table refuses a merge");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let got = c.get("b", Keys::Slices(&keys), 0).unwrap();
    match &got.values {
        Values::Bytes(b) => assert_eq!(b.get(0), b"v"),
        other => panic!("expected bytes, got {other:?}"),
    }
}
