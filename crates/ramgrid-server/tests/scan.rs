//! SCAN (docs/protocol-native.md section 11) and TOP_K on in-process servers: scans and filters
//! through the cluster client against the rows written (every value type, replication 1 and 2,
//! deletes in between), pages on the wire bounded by the server's frame limit, a page after a
//! write to its partition answered CHANGED, a client that disconnects in the middle of a scan
//! (the server goes on serving others), and scans of a table being written.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use ramgrid_client::scan::ScanOptions;
use ramgrid_client::{partition_of, Client, ClientConfig, Keys, Predicate, Values, ValuesRef};
use ramgrid_proto::native::{
    encode_scan, parse_frame, Cursor, PageState, Response, ScanRequest, ValueType,
};
use ramgrid_server::{start, Config, ServerHandle};
use rand::{Rng, SeedableRng};

fn server(extra: &[&str]) -> ServerHandle {
    let mut args = vec![
        "ramgrid-server",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--memory",
        "16MiB",
        "--table-memory",
        "256MiB",
    ];
    args.extend_from_slice(extra);
    start(&Config::parse_from(args)).expect("server starts")
}

fn cluster(n: usize, extra: &[&str]) -> (Vec<ServerHandle>, Client) {
    let servers: Vec<ServerHandle> = (0..n).map(|_| server(extra)).collect();
    let addrs = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let client = Client::new(ClientConfig::new(addrs)).unwrap();
    client.push_spec().unwrap();
    (servers, client)
}

/// Every (key, value bytes) of a scan, checking that no key comes twice.
fn scan_all(
    c: &Client,
    t: &str,
    pred: Option<Predicate>,
    chunk: usize,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let opts = ScanOptions {
        chunk_items: chunk,
        ..ScanOptions::default()
    };
    let mut out = BTreeMap::new();
    for ch in c.scan(t, 0, 0, pred, opts).unwrap() {
        let ch = ch.unwrap();
        assert!(ch.len() <= chunk && !ch.is_empty());
        for i in 0..ch.len() {
            let v = match &ch.values {
                Values::F64(x) => x[i].to_le_bytes().to_vec(),
                Values::I64(x) => x[i].to_le_bytes().to_vec(),
                Values::Bytes(b) => b.get(i).to_vec(),
                Values::F32Vec { dim, data } => data[i * dim..(i + 1) * dim]
                    .iter()
                    .flat_map(|f| f.to_le_bytes())
                    .collect(),
            };
            let k = ch.keys.get(i).to_vec();
            assert_eq!(partition_of(&k, 16), ch.partition, "key in its partition");
            assert!(out.insert(k, v).is_none(), "a key came twice");
        }
    }
    out
}

#[test]
fn scans_filters_and_top_k_match_the_rows_written() {
    let (_servers, c) = cluster(3, &[]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for repl in [1u32, 2] {
        let n = 5000usize;
        let keys: Vec<i64> = (0..n as i64).collect();
        let kb = |k: i64| k.to_le_bytes().to_vec();
        // f64
        let xs: Vec<f64> = (0..n).map(|_| rng.gen_range(-100.0..100.0)).collect();
        let t = format!("f{repl}");
        c.create_table(&t, 16, repl, ValueType::F64).unwrap();
        c.put(&t, Keys::I64(&keys), ValuesRef::F64(&xs), 0).unwrap();
        let gone: Vec<i64> = (0..n as i64).step_by(7).collect();
        c.delete(&t, Keys::I64(&gone), 0).unwrap();
        let mut model: BTreeMap<Vec<u8>, f64> = BTreeMap::new();
        for (&k, &x) in keys.iter().zip(&xs) {
            if k % 7 != 0 {
                model.insert(kb(k), x);
            }
        }
        let want: BTreeMap<Vec<u8>, Vec<u8>> = model
            .iter()
            .map(|(k, x)| (k.clone(), x.to_le_bytes().to_vec()))
            .collect();
        assert_eq!(scan_all(&c, &t, None, 333), want);
        let pred = Predicate {
            component: 0,
            lo: -10.0,
            hi: 35.5,
        };
        let sel: BTreeMap<Vec<u8>, Vec<u8>> = want
            .iter()
            .filter(|(_, v)| {
                let x = f64::from_le_bytes(v[..].try_into().unwrap());
                (-10.0..35.5).contains(&x)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(scan_all(&c, &t, Some(pred), 100_000), sel);
        for largest in [true, false] {
            let (got, _) = c.top_k(&t, 0, 0, 0, 25, largest, None).unwrap();
            let mut all: Vec<(Vec<u8>, f64)> = model.iter().map(|(k, &x)| (k.clone(), x)).collect();
            all.sort_by(|a, b| {
                let o = if largest {
                    b.1.total_cmp(&a.1)
                } else {
                    a.1.total_cmp(&b.1)
                };
                o.then_with(|| a.0.cmp(&b.0))
            });
            all.truncate(25);
            assert_eq!(got, all);
        }
        // bytes, with empty values
        let t = format!("b{repl}");
        c.create_table(&t, 16, repl, ValueType::Bytes).unwrap();
        let vals: Vec<Vec<u8>> = (0..n).map(|i| vec![b'x'; i % 50]).collect();
        let slices: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
        c.put(&t, Keys::I64(&keys), ValuesRef::Slices(&slices), 0)
            .unwrap();
        let want: BTreeMap<Vec<u8>, Vec<u8>> = keys
            .iter()
            .map(|&k| kb(k))
            .zip(vals.iter().cloned())
            .collect();
        assert_eq!(scan_all(&c, &t, None, 1000), want);
        // f32 vectors, filtered on component 1
        let t = format!("v{repl}");
        c.create_table(&t, 16, repl, ValueType::F32Vec(3)).unwrap();
        let rows: Vec<f32> = (0..n * 3).map(|_| rng.gen_range(-1.0..1.0)).collect();
        c.put(&t, Keys::I64(&keys), ValuesRef::F32(&rows), 0)
            .unwrap();
        let pred = Predicate {
            component: 1,
            lo: 0.0,
            hi: 0.5,
        };
        let want: BTreeMap<Vec<u8>, Vec<u8>> = keys
            .iter()
            .filter(|&&k| (0.0..0.5).contains(&f64::from(rows[k as usize * 3 + 1])))
            .map(|&k| {
                let r = &rows[k as usize * 3..k as usize * 3 + 3];
                (kb(k), r.iter().flat_map(|f| f.to_le_bytes()).collect())
            })
            .collect();
        assert_eq!(scan_all(&c, &t, Some(pred), 64), want);
    }
    // Bad input: clear errors, nothing changed.
    assert!(c.scan("nope", 0, 0, None, ScanOptions::default()).is_err());
    let bytes_pred = Some(Predicate {
        component: 0,
        lo: 0.0,
        hi: 1.0,
    });
    let mut s = c
        .scan("b1", 0, 0, bytes_pred, ScanOptions::default())
        .unwrap();
    let e = s.next().unwrap().unwrap_err().to_string();
    assert!(e.contains("numeric"), "{e}");
    assert!(c.top_k("b1", 0, 0, 0, 5, true, None).is_err());
    assert!(c.top_k("f1", 0, 0, 0, 0, true, None).is_err());
    assert_eq!(scan_all(&c, "b1", None, 1000).len(), 5000);
}

/// A raw native connection (no HELLO needed without a token).
struct Raw(TcpStream, u64);

impl Raw {
    fn page(&mut self, req: &ScanRequest<'_>) -> (Vec<u8>, usize) {
        let mut buf = Vec::new();
        self.1 += 1;
        encode_scan(&mut buf, self.1, req).unwrap();
        self.0.write_all(&buf).unwrap();
        let mut head = [0u8; 16];
        self.0.read_exact(&mut head).unwrap();
        let len = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
        let mut frame = head.to_vec();
        frame.resize(16 + len, 0);
        self.0.read_exact(&mut frame[16..]).unwrap();
        (frame, len)
    }
}

fn head_of(frame: &[u8]) -> (ramgrid_proto::native::PageHead, usize) {
    let (f, _) = parse_frame(frame, 1 << 30).unwrap();
    match Response::decode(&f).unwrap() {
        Response::Scan(r) => (r.head, r.len()),
        other => panic!("not a page: {other:?}"),
    }
}

#[test]
fn pages_stay_under_the_frame_limit_and_a_write_between_pages_is_answered_changed() {
    let (servers, c) = cluster(1, &["--max-frame", "64KiB"]);
    c.create_table("t", 2, 1, ValueType::F64).unwrap();
    let keys: Vec<i64> = (0..40_000).collect();
    let xs: Vec<f64> = keys.iter().map(|&k| k as f64).collect();
    for ch in keys.chunks(2000).zip(xs.chunks(2000)) {
        c.put("t", Keys::I64(ch.0), ValuesRef::F64(ch.1), 0)
            .unwrap();
    }
    let mut raw = Raw(TcpStream::connect(servers[0].local_addr()).unwrap(), 0);
    let mut req = ScanRequest {
        table: "t",
        version: 0,
        epoch: c.epoch(),
        incarnation: 0,
        partition: 0,
        cursor: Cursor::START,
        max_items: u32::MAX,
        max_bytes: u32::MAX,
        predicate: None,
    };
    // Paging a whole partition: every page under the limit, the generation steady.
    let (mut pages, mut items) = (0, 0);
    let mut generation = 0;
    loop {
        let (frame, len) = raw.page(&req);
        assert!(len <= 64 << 10, "a page of {len} bytes");
        let (h, n) = head_of(&frame);
        if generation != 0 {
            assert_eq!(h.generation, generation);
        }
        generation = h.generation;
        pages += 1;
        items += n;
        if h.state == PageState::Done {
            break;
        }
        assert_eq!(h.state, PageState::More);
        req.version = h.version;
        req.cursor = Cursor {
            position: h.next,
            generation: h.generation,
        };
    }
    assert!(pages > 5, "{pages} pages");
    let in_p0 = keys
        .iter()
        .filter(|k| partition_of(&k.to_le_bytes(), 2) == 0)
        .count();
    assert_eq!(items, in_p0);
    // A write to the partition between pages: the next page is CHANGED, with no items.
    req.cursor = Cursor::START;
    let (frame, _) = raw.page(&req);
    let (h, _) = head_of(&frame);
    req.cursor = Cursor {
        position: h.next,
        generation: h.generation,
    };
    let k = *keys
        .iter()
        .find(|k| partition_of(&k.to_le_bytes(), 2) == 0)
        .unwrap();
    c.put("t", Keys::I64(&[k]), ValuesRef::F64(&[-1.0]), 0)
        .unwrap();
    let (frame, _) = raw.page(&req);
    let (h2, n) = head_of(&frame);
    assert_eq!((h2.state, n), (PageState::Changed, 0));
    assert_ne!(h2.generation, h.generation);
    // The client's scan goes through all of it in pages and sees the write.
    let got = scan_all_two(&c);
    assert_eq!(got.len(), 40_000);
    assert_eq!(got[&k.to_le_bytes().to_vec()], -1.0);
}

fn scan_all_two(c: &Client) -> BTreeMap<Vec<u8>, f64> {
    let mut out = BTreeMap::new();
    for ch in c.scan("t", 0, 0, None, ScanOptions::default()).unwrap() {
        let ch = ch.unwrap();
        let Values::F64(x) = &ch.values else { panic!() };
        for (i, &v) in x.iter().enumerate() {
            assert!(out.insert(ch.keys.get(i).to_vec(), v).is_none());
        }
    }
    out
}

#[test]
fn a_client_that_disconnects_mid_scan_leaves_the_server_serving() {
    let (servers, c) = cluster(1, &["--max-frame", "64KiB"]);
    c.create_table("t", 2, 1, ValueType::F64).unwrap();
    let keys: Vec<i64> = (0..40_000).collect();
    let xs: Vec<f64> = keys.iter().map(|&k| k as f64).collect();
    for ch in keys.chunks(2000).zip(xs.chunks(2000)) {
        c.put("t", Keys::I64(ch.0), ValuesRef::F64(ch.1), 0)
            .unwrap();
    }
    for _ in 0..20 {
        // Ask for pages and go away without reading them; or read half a reply and go away.
        let mut s = TcpStream::connect(servers[0].local_addr()).unwrap();
        let mut buf = Vec::new();
        for id in 0..8 {
            let req = ScanRequest {
                table: "t",
                version: 0,
                epoch: c.epoch(),
                incarnation: 0,
                partition: id % 2,
                cursor: Cursor::START,
                max_items: u32::MAX,
                max_bytes: u32::MAX,
                predicate: None,
            };
            encode_scan(&mut buf, u64::from(id), &req).unwrap();
        }
        s.write_all(&buf).unwrap();
        let mut half = [0u8; 1000];
        let _ = s.read(&mut half);
        drop(s);
    }
    // A scan dropped after its first chunk: nothing to clean up anywhere.
    let mut it = c
        .scan(
            "t",
            0,
            0,
            None,
            ScanOptions {
                chunk_items: 10,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(it.next().unwrap().unwrap().len(), 10);
    drop(it);
    assert_eq!(scan_all_two(&c).len(), 40_000);
}

#[test]
fn scans_of_a_table_being_written_see_each_key_once_and_whole_values() {
    let (_servers, c) = cluster(2, &[]);
    c.create_table("w", 8, 2, ValueType::F32Vec(4)).unwrap();
    let keys: Vec<i64> = (0..20_000).collect();
    // Every row is [x, x, x, x]: a torn value would show different components.
    let row = |x: f32| [x; 4];
    let rows: Vec<f32> = keys.iter().flat_map(|&k| row(k as f32)).collect();
    c.put("w", Keys::I64(&keys), ValuesRef::F32(&rows), 0)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let ks: Vec<i64> = (0..200).map(|_| rng.gen_range(0..40_000)).collect();
                let vs: Vec<f32> = ks.iter().flat_map(|_| row(round as f32)).collect();
                c.put("w", Keys::I64(&ks), ValuesRef::F32(&vs), 0).unwrap();
                let dels: Vec<i64> = (0..50).map(|_| rng.gen_range(0..40_000)).collect();
                c.delete("w", Keys::I64(&dels), 0).unwrap();
            }
        })
    };
    for _ in 0..5 {
        let mut seen = std::collections::HashSet::new();
        for ch in c.scan("w", 0, 0, None, ScanOptions::default()).unwrap() {
            let ch = ch.unwrap();
            let Values::F32Vec { dim, data } = &ch.values else {
                panic!()
            };
            for i in 0..ch.len() {
                let r = &data[i * dim..(i + 1) * dim];
                assert!(r.iter().all(|&x| x == r[0]), "a torn row {r:?}");
                assert!(seen.insert(ch.keys.get(i).to_vec()), "a key twice");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}
