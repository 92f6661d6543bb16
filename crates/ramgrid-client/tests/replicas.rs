//! Replicas that answered never disagree silently about an acknowledged key: a key one replica
//! stored and another refused is reported as failed, whatever the acknowledgement level.

mod common;

use common::{Cluster, Server};
use ramgrid_client::{Ack, Client, Error, Keys, ValueType, ValuesRef};

/// The case: with ack = one, a key the primary refused but the replica stored was
/// acknowledged, then read as missing, because reads go to the primary.
#[test]
fn a_key_one_replica_refused_is_not_acknowledged_even_at_ack_one() {
    // Two servers; one refuses values over 2 KiB, the other takes them.
    let cluster = Cluster {
        servers: vec![
            Server::start(&["--max-item-size", "2KiB"]),
            Server::start(&[]),
        ],
    };
    let mut config = cluster.config();
    config.ack = Ack::One;
    let c = Client::new(config).expect("client");
    c.push_spec().expect("push spec");
    c.create_table("t", 4, 2, ValueType::Bytes).unwrap();

    let names: Vec<String> = (0..2000).map(|i| format!("key-{i}")).collect();
    let keys: Vec<&[u8]> = names.iter().map(|s| s.as_bytes()).collect();
    // Even keys get a small value (both replicas take it), odd keys a large one.
    let (small, large) = (vec![7u8; 1000], vec![9u8; 4000]);
    let values: Vec<&[u8]> = (0..keys.len())
        .map(|i| if i % 2 == 0 { &small[..] } else { &large[..] })
        .collect();
    let err = c
        .put("t", Keys::Slices(&keys), ValuesRef::Slices(&values), 0)
        .expect_err("one replica refuses the large values");
    let Error::Batch { failures, .. } = &err else {
        panic!("expected a batch error naming the keys, got {err:?}");
    };
    let odd: Vec<usize> = (1..keys.len()).step_by(2).collect();
    assert_eq!(failures.iter().map(|(i, _)| *i).collect::<Vec<_>>(), odd);
    assert!(
        failures
            .iter()
            .all(|(_, why)| why.contains("VALUE_TOO_LARGE")),
        "{:?}",
        &failures[..3]
    );
    // Every key not reported failed reads back from every replica: both stored it.
    let failed: std::collections::HashSet<usize> = failures.iter().map(|(i, _)| *i).collect();
    let ok: Vec<&[u8]> = (0..keys.len())
        .filter(|i| !failed.contains(i))
        .map(|i| keys[i])
        .collect();
    assert!(!ok.is_empty());
    for server in &cluster.servers {
        let mut one = cluster.config();
        one.servers = vec![server.addr.clone()];
        let direct = Client::new(one).unwrap();
        let got = direct.get("t", Keys::Slices(&ok), 0).unwrap();
        assert!(
            got.found.iter().all(|&f| f),
            "{} misses an acknowledged key",
            server.addr
        );
    }
}

fn f64_of(v: &ramgrid_client::Values) -> &[f64] {
    match v {
        ramgrid_client::Values::F64(v) => v,
        other => panic!("expected f64 values, got {other:?}"),
    }
}

/// The restart cases: one of three servers (replication 2) killed and started again empty
/// on its address. Before: every call failed on the server's missing spec; with the spec pushed,
/// every read raised TableNotFound; after `create_table` there "to fix it", a third of the keys read
/// as silently missing. Now reads go to the replicas that have the data, exactly.
#[test]
fn a_server_restarted_empty_never_makes_keys_missing() {
    let mut cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", 16, 2, ValueType::F64).unwrap();
    let n = 20_000usize;
    let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let keys: Vec<&[u8]> = names.iter().map(|s| s.as_bytes()).collect();
    let vals: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
    c.put("t", Keys::Slices(&keys), ValuesRef::F64(&vals), 0)
        .unwrap();
    let incarnation = c.table_meta("t").unwrap().incarnation;

    cluster.servers[1].restart();
    let check = |c: &Client, what: &str| {
        let got = c
            .get("t", Keys::Slices(&keys), 0)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            got.found.iter().all(|&f| f),
            "{what}: a key read as missing"
        );
        assert_eq!(f64_of(&got.values), &vals[..], "{what}: values differ");
    };
    // The client that knew the cluster, and a new one (a fresh process).
    check(&c, "old client after the restart");
    let fresh = Client::new(cluster.config()).unwrap();
    check(&fresh, "new client after the restart");

    // "Fixing" it by creating the table again creates it on the empty server only, as another
    // incarnation; most servers hold the original, which stays the table.
    let err = fresh.create_table("t", 16, 2, ValueType::F64).unwrap_err();
    assert!(matches!(err, Error::TableExists(_)), "{err:?}");
    let newer = Client::new(cluster.config()).unwrap();
    assert_eq!(newer.table_meta("t").unwrap().incarnation, incarnation);
    check(&newer, "a client after create_table on the empty server");
    check(&c, "old client after create_table on the empty server");
}
