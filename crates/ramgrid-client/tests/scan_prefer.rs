//! Scans that prefer a replica (`Scan::prefer`) against real servers: each partition's pages are
//! served by the preferred server where every replica holds the data (counted by the servers'
//! `ramgrid_native_scan_pages_total`), by the primary where a replica may lag (ack = one, an open
//! version), and exactly by another replica when the preferred server is killed.

mod common;

use common::Cluster;
use ramgrid_client::scan::ScanOptions;
use ramgrid_client::{Ack, Client, Keys, Values, ValuesRef};

const PARTS: u32 = 8;
const N: i64 = 4000;

/// SCAN pages one server has answered so far.
fn scan_pages(c: &Client, s: usize) -> u64 {
    let (addr, text) = c.metrics().swap_remove(s);
    let text = text.unwrap_or_else(|e| panic!("metrics of {addr}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix("ramgrid_native_scan_pages_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("ramgrid_native_scan_pages_total") as u64
}

fn all_pages(c: &Client, servers: usize) -> Vec<u64> {
    (0..servers).map(|s| scan_pages(c, s)).collect()
}

/// The values of partition `p` read by a scan preferring `prefer`, sorted.
fn scan_values(c: &Client, table: &str, version: u32, p: u32, prefer: &str) -> Vec<f64> {
    let scan = c
        .scan(table, version, 0, None, ScanOptions::default())
        .unwrap()
        .partitions(p, p + 1)
        .unwrap()
        .prefer(prefer)
        .unwrap();
    let mut out = Vec::new();
    for chunk in scan {
        match chunk.unwrap().values {
            Values::F64(v) => out.extend(v),
            other => panic!("expected f64 values, got {other:?}"),
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// What partition `p` holds: values key * 0.5 of the keys `partition_of` puts there, sorted.
fn expected(c: &Client, table: &str, p: u32) -> Vec<f64> {
    let keys: Vec<i64> = (0..N).collect();
    let got = c.get(table, Keys::I64(&keys), 0).unwrap();
    let Values::F64(values) = got.values else {
        panic!("f64 table")
    };
    let owners = c.partition_owners(table).unwrap();
    assert_eq!(owners.len(), PARTS as usize);
    let mut out: Vec<f64> = keys
        .iter()
        .zip(values)
        .filter(|(k, _)| ramgrid_client::partition_of(&k.to_le_bytes(), PARTS) == p)
        .map(|(_, v)| v)
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

fn load(c: &Client, table: &str, version: u32) {
    let keys: Vec<i64> = (0..N).collect();
    let values: Vec<f64> = keys.iter().map(|&k| k as f64 * 0.5).collect();
    c.put(table, Keys::I64(&keys), ValuesRef::F64(&values), version)
        .unwrap();
}

#[test]
fn a_scan_reads_the_replica_it_prefers_where_every_replica_holds_the_data() {
    let cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", PARTS, 2, ramgrid_client::ValueType::F64)
        .unwrap();
    load(&c, "t", 0);
    // Sealed: the current version is then the same on every replica (a fresh table's is open, and
    // an open version is read from its primary).
    c.seal_version("t", c.current_version("t").unwrap())
        .unwrap();
    let addrs = cluster.addrs();
    let owners = c.partition_owners("t").unwrap();
    let want: Vec<Vec<f64>> = (0..PARTS).map(|p| expected(&c, "t", p)).collect();

    // A sealed version: every replica holds it. Each partition is read twice, preferring each of
    // its replicas; every page comes from the preferred one.
    let reader = Client::new(cluster.config()).unwrap();
    for (s, addr) in addrs.iter().enumerate() {
        let before = all_pages(&reader, 3);
        let mut asked = 0;
        for p in 0..PARTS {
            if owners[p as usize].contains(addr) {
                assert_eq!(scan_values(&reader, "t", 0, p, addr), want[p as usize]);
                asked += 1;
            }
        }
        let after = all_pages(&reader, 3);
        let served: Vec<u64> = (0..3).map(|i| after[i] - before[i]).collect();
        assert!(asked > 0, "server {s} holds no partition: {owners:?}");
        // One page per partition (each fits a frame), all from the preferred server.
        assert_eq!(served[s], asked, "server {s} served {served:?}");
        assert_eq!(served.iter().sum::<u64>(), asked, "{served:?}");
    }

    // An open version: only its primary is sure to show every write (a backup may show one in
    // flight), so the scan reads the primary whatever it prefers.
    let mut config = cluster.config();
    config.ack = Ack::One;
    let one = Client::new(config).unwrap();
    let v = one.create_version("t").unwrap();
    load(&one, "t", v);
    for p in 0..PARTS {
        let reps = &owners[p as usize];
        let (primary, other) = (&reps[0], &reps[1]);
        let ip = addrs.iter().position(|a| a == primary).unwrap();
        let io = addrs.iter().position(|a| a == other).unwrap();
        let before = all_pages(&one, 3);
        assert_eq!(scan_values(&one, "t", v, p, other), want[p as usize]);
        let after = all_pages(&one, 3);
        assert_eq!(after[ip] - before[ip], 1, "partition {p}: the primary");
        assert_eq!(after[io] - before[io], 0, "partition {p}: not the other");
    }
    // Sealed, the version is the same on every replica: the preferred replica serves it.
    one.seal_version("t", v).unwrap();
    for p in 0..PARTS {
        let other = &owners[p as usize][1];
        let io = addrs.iter().position(|a| a == other).unwrap();
        let before = scan_pages(&one, io);
        assert_eq!(scan_values(&one, "t", v, p, other), want[p as usize]);
        assert_eq!(scan_pages(&one, io) - before, 1, "partition {p}");
    }

    // A client that knows one server only (its seed) learns the others from the servers' spec
    // before it decides whether the one it prefers is a member.
    let p = (0..PARTS)
        .find(|&p| !owners[p as usize].contains(&addrs[0]))
        .expect("a partition server 0 does not hold");
    let seeded = Client::new(ramgrid_client::ClientConfig::new(vec![addrs[0].clone()])).unwrap();
    let other = &owners[p as usize][1];
    assert_eq!(scan_values(&seeded, "t", 0, p, other), want[p as usize]);

    // Bad input: a server that is not a member.
    let e = c
        .scan("t", 0, 0, None, ScanOptions::default())
        .unwrap()
        .prefer("127.0.0.1:1")
        .expect_err("not a member");
    assert!(e.to_string().contains("not a server of the cluster"), "{e}");
}

#[test]
fn a_scan_whose_preferred_server_is_killed_reads_another_replica_exactly() {
    let mut cluster = Cluster::start(3);
    let c = cluster.client();
    c.create_table("t", PARTS, 2, ramgrid_client::ValueType::F64)
        .unwrap();
    load(&c, "t", 0);
    let want: Vec<Vec<f64>> = (0..PARTS).map(|p| expected(&c, "t", p)).collect();
    let victim = cluster.addrs()[1].clone();
    let owners = c.partition_owners("t").unwrap();
    cluster.servers[1].kill();
    let mut held = 0;
    for p in 0..PARTS {
        held += usize::from(owners[p as usize].contains(&victim));
        // Every partition, those the dead server held included, is read whole from a live one.
        assert_eq!(
            scan_values(&c, "t", 0, p, &victim),
            want[p as usize],
            "partition {p}"
        );
    }
    assert!(held > 0, "the killed server held no partition: {owners:?}");
}
