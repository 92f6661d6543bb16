//! Operators (OPERATOR, docs/protocol-native.md section 10) on in-process servers through the real
//! cluster client: every operator against a plain computation over the same rows (random tables,
//! partition counts and replication), bad operators refused with their reason and the server
//! unharmed, an epoch change forced in the middle of a pass (the partition is refused, the client
//! asks again for it alone, the result is exact), and operators against a table being written.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use ramgrid_client::{Client, ClientConfig, Error, Keys, OpResult, OpSpec, Predicate, ValuesRef};
use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::ValueType;
use ramgrid_server::native::OPERATOR_AFTER_PASS_HOOK;
use ramgrid_server::node::Node;
use ramgrid_server::{start, Config, ServerHandle};
use rand::{Rng, SeedableRng};

fn server() -> ServerHandle {
    start(&Config::parse_from([
        "ramgrid-server",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--memory",
        "16MiB",
        "--table-memory",
        "256MiB",
    ]))
    .expect("server starts")
}

fn cluster(n: usize) -> (Vec<ServerHandle>, Client) {
    let servers: Vec<ServerHandle> = (0..n).map(|_| server()).collect();
    let addrs = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let client = Client::new(ClientConfig::new(addrs)).unwrap();
    client.push_spec().unwrap();
    (servers, client)
}

/// Two servers holding table "t" (8 partitions, both replicas of each) with values 0..n, and
/// the spec of the same two servers in the other order: another epoch under which both still hold
/// every partition.
fn two_servers_and_a_swapped_spec(n: i64) -> (Vec<ServerHandle>, Client, Vec<f64>, ClusterSpec) {
    let (servers, c) = cluster(2);
    c.create_table("t", 8, 2, ValueType::F64).unwrap();
    let keys: Vec<i64> = (0..n).collect();
    let xs: Vec<f64> = keys.iter().map(|&k| k as f64).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::F64(&xs), 0)
        .unwrap();
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let swapped =
        ClusterSpec::parse(&format!("server {}\nserver {}\n", addrs[1], addrs[0])).unwrap();
    (servers, c, xs, swapped)
}

/// What the hook does: set by one test at a time (the hook itself is process-wide).
type Hook = Box<dyn Fn(&Node, u32) + Send>;
static HOOK: Mutex<Option<Hook>> = Mutex::new(None);
static HOOK_LOCK: Mutex<()> = Mutex::new(());

fn install_hook() {
    let _ = OPERATOR_AFTER_PASS_HOOK.set(Box::new(|state, p| {
        if let Some(f) = HOOK.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            f(state, p);
        }
    }));
}

fn run(c: &Client, table: &str, op: &OpSpec) -> OpResult {
    c.run_op(table, 0, 0, op).unwrap().result
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn every_operator_matches_a_plain_computation() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (_servers, c) = cluster(3);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (i, &(parts, repl)) in [(1u32, 1u32), (3, 2), (16, 3), (64, 2)].iter().enumerate() {
        // Scalars: f64 and i64.
        let n = rng.gen_range(0..3000usize);
        let xs: Vec<f64> = (0..n).map(|_| rng.gen_range(-100.0..100.0)).collect();
        let keys: Vec<i64> = (0..n as i64).collect();
        let t = format!("f{i}");
        c.create_table(&t, parts, repl, ValueType::F64).unwrap();
        c.put(&t, Keys::I64(&keys), ValuesRef::F64(&xs), 0).unwrap();
        let pred = Some(Predicate {
            component: 0,
            lo: -10.0,
            hi: 50.0,
        });
        let sel: Vec<f64> = xs
            .iter()
            .copied()
            .filter(|&x| (-10.0..50.0).contains(&x))
            .collect();
        assert_eq!(
            run(&c, &t, &OpSpec::Count { predicate: pred }),
            OpResult::Count {
                matched: sel.len() as u64,
                scanned: n as u64
            }
        );
        let OpResult::Stats(s) = run(
            &c,
            &t,
            &OpSpec::Stats {
                column: 0,
                predicate: None,
            },
        ) else {
            panic!()
        };
        assert_eq!(s.count, n as u64);
        if n > 0 {
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
            assert!(close(s.sum, xs.iter().sum(), 1e-9));
            assert!(close(s.mean, mean, 1e-9), "{} {mean}", s.mean);
            assert!(close(s.m2 / n as f64, var, 1e-9));
            assert_eq!(s.min, xs.iter().copied().fold(f64::INFINITY, f64::min));
            assert_eq!(s.max, xs.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        }
        let edges: Vec<f64> = (0..=10).map(|e| -100.0 + 20.0 * e as f64).collect();
        let mut want = vec![0u64; 10];
        for &x in &xs {
            want[(((x + 100.0) / 20.0) as usize).min(9)] += 1;
        }
        assert_eq!(
            run(
                &c,
                &t,
                &OpSpec::Histogram {
                    column: 0,
                    predicate: None,
                    edges
                }
            ),
            OpResult::Histogram(want)
        );
        // Vectors: 3 features and a 0/1 label.
        let rows: Vec<[f32; 4]> = (0..n)
            .map(|_| {
                let x = [
                    rng.gen_range(-2.0..2.0f32),
                    rng.gen_range(-2.0..2.0),
                    rng.gen_range(0.0..1.0),
                ];
                [x[0], x[1], x[2], if x[0] + x[1] > 0.0 { 1.0 } else { 0.0 }]
            })
            .collect();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let v = format!("v{i}");
        c.create_table(&v, parts, repl, ValueType::F32Vec(4))
            .unwrap();
        c.put(&v, Keys::I64(&keys), ValuesRef::F32(&flat), 0)
            .unwrap();
        let w = vec![0.5, -0.25, 1.0, 0.1];
        let OpResult::LrGradient {
            rows: got_rows,
            loss,
            gradient,
        } = run(
            &c,
            &v,
            &OpSpec::LrGradient {
                weights: w.clone(),
                l2: 0.5,
            },
        )
        else {
            panic!()
        };
        let (mut wl, mut wg) = (0.0f64, vec![0.0f64; 4]);
        for r in &rows {
            let z = (0..3).map(|j| w[j] * f64::from(r[j])).sum::<f64>() + w[3];
            let y = f64::from(r[3]);
            wl += (1.0 + z.exp()).ln() - y * z;
            let e = 1.0 / (1.0 + (-z).exp()) - y;
            for j in 0..3 {
                wg[j] += e * f64::from(r[j]);
            }
            wg[3] += e;
        }
        for j in 0..3 {
            wg[j] += 0.5 * w[j];
            wl += 0.25 * w[j] * w[j];
        }
        assert_eq!(got_rows, n as u64);
        assert!(close(loss, wl, 1e-5), "{loss} {wl}");
        for j in 0..4 {
            assert!(close(gradient[j], wg[j], 1e-4), "{gradient:?} {wg:?}");
        }
        let cents = vec![-1.0, -1.0, 1.0, 1.0];
        let OpResult::KmeansStep { counts, .. } = run(
            &c,
            &v,
            &OpSpec::KmeansStep {
                components: 2,
                centroids: cents,
            },
        ) else {
            panic!()
        };
        let near_second = rows.iter().filter(|r| r[0] + r[1] > 0.0).count() as u64;
        assert_eq!(counts, vec![n as u64 - near_second, near_second]);
    }
}

#[test]
fn bad_operators_are_refused_and_the_server_goes_on() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (_servers, c) = cluster(2);
    c.create_table("vec", 4, 2, ValueType::F32Vec(3)).unwrap();
    c.put(
        "vec",
        Keys::I64(&[1, 2]),
        ValuesRef::F32(&[1.0, 2.0, 1.0, 3.0, 4.0, 0.0]),
        0,
    )
    .unwrap();
    c.create_table("b", 4, 1, ValueType::Bytes).unwrap();
    let refused = |t: &str, op: OpSpec, want: &str| {
        let e = c.run_op(t, 0, 0, &op).expect_err(want);
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("BAD_REQUEST") && m.contains(want)),
            "{want}: {e}"
        );
    };
    refused(
        "b",
        OpSpec::Stats {
            column: 0,
            predicate: None,
        },
        "numeric",
    );
    refused(
        "vec",
        OpSpec::LrGradient {
            weights: vec![0.0; 2],
            l2: 0.0,
        },
        "2 weights",
    );
    refused(
        "vec",
        OpSpec::LrGradient {
            weights: vec![0.0, f64::NAN, 0.0],
            l2: 0.0,
        },
        "finite",
    );
    refused(
        "vec",
        OpSpec::LrGradient {
            weights: vec![0.0, f64::INFINITY, 0.0],
            l2: 0.0,
        },
        "finite",
    );
    refused(
        "vec",
        OpSpec::Histogram {
            column: 0,
            predicate: None,
            edges: vec![0.0, 1.0, 1.0],
        },
        "increase strictly",
    );
    refused(
        "vec",
        OpSpec::Count {
            predicate: Some(Predicate {
                component: 3,
                lo: 0.0,
                hi: 1.0,
            }),
        },
        "component 3",
    );
    refused(
        "vec",
        OpSpec::KmeansStep {
            components: 4,
            centroids: vec![0.0; 4],
        },
        "1..=3",
    );
    let e = c
        .run_op(
            "vec",
            0,
            0,
            &OpSpec::KmeansStep {
                components: 2,
                centroids: vec![0.0; 3],
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("not k × 2"), "{e}");
    assert!(matches!(
        c.run_op("nope", 0, 0, &OpSpec::Count { predicate: None }),
        Err(Error::TableNotFound(_))
    ));
    // Nothing was harmed: the table answers, whole.
    assert_eq!(
        run(&c, "vec", &OpSpec::Count { predicate: None }),
        OpResult::Count {
            matched: 2,
            scanned: 2
        }
    );
}

#[test]
fn an_epoch_change_during_a_pass_refuses_the_partition_and_only_it_is_asked_again() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    install_hook();
    let (servers, c, xs, swapped) = two_servers_and_a_swapped_spec(5000);
    let states: Vec<Arc<Node>> = servers.iter().map(|s| s.node().clone()).collect();
    let fired = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicUsize::new(0));
    {
        let (fired, passes) = (fired.clone(), passes.clone());
        *HOOK.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(move |_, _| {
            passes.fetch_add(1, Ordering::SeqCst);
            if !fired.swap(true, Ordering::SeqCst) {
                for s in &states {
                    s.install_spec(swapped.clone()).unwrap();
                }
            }
        }));
    }
    let a = c
        .run_op(
            "t",
            0,
            0,
            &OpSpec::Stats {
                column: 0,
                predicate: None,
            },
        )
        .unwrap();
    *HOOK.lock().unwrap_or_else(|e| e.into_inner()) = None;
    assert!(fired.load(Ordering::SeqCst));
    let OpResult::Stats(s) = a.result else {
        panic!()
    };
    // Exact: every value once, none twice, none missing.
    assert_eq!(s.count, 5000);
    assert_eq!(s.sum, xs.iter().sum::<f64>());
    assert!(a.retried >= 1, "the refused partition was asked again");
    // Partitions answered before the change were not asked again: at most the 8 first passes
    // plus one pass per partition refused.
    assert!(passes.load(Ordering::SeqCst) <= 8 + a.retried as usize);
    assert_ne!(c.epoch(), 0);
}

#[test]
fn partitions_of_a_frame_refused_whole_for_a_stale_map_count_as_asked_again() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (servers, c, _, swapped) = two_servers_and_a_swapped_spec(1000);
    // Another epoch installed before the operator: every frame is refused before any pass (as a
    // server whose frame arrives after a change made during another server's pass).
    for s in &servers {
        s.node().install_spec(swapped.clone()).unwrap();
    }
    let a = c
        .run_op("t", 0, 0, &OpSpec::Count { predicate: None })
        .unwrap();
    assert_eq!(
        a.result,
        OpResult::Count {
            matched: 1000,
            scanned: 1000
        }
    );
    assert_eq!(a.retried, 8, "every partition was asked again");
}

#[test]
fn a_partition_that_keeps_being_refused_is_named_in_the_error() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    install_hook();
    let (servers, c) = cluster(2);
    c.create_table("t", 4, 2, ValueType::I64).unwrap();
    c.put("t", Keys::I64(&[1, 2, 3]), ValuesRef::I64(&[1, 2, 3]), 0)
        .unwrap();
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let specs = [
        ClusterSpec::parse(&format!("server {}\nserver {}\n", addrs[1], addrs[0])).unwrap(),
        ClusterSpec::parse(&format!("server {}\nserver {}\n", addrs[0], addrs[1])).unwrap(),
    ];
    let states: Vec<Arc<Node>> = servers.iter().map(|s| s.node().clone()).collect();
    let flip = Arc::new(AtomicUsize::new(0));
    // Every pass over partition 2 changes the epoch (to the other order each time, so never to
    // the one the pass started under): it can never be exact; the others can.
    *HOOK.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(move |_, p| {
        if p != 2 {
            return;
        }
        let i = flip.fetch_add(1, Ordering::SeqCst) % 2;
        for s in &states {
            s.install_spec(specs[i].clone()).unwrap();
        }
    }));
    let e = c.run_op("t", 0, 0, &OpSpec::Count { predicate: None });
    *HOOK.lock().unwrap_or_else(|e| e.into_inner()) = None;
    match e {
        Err(Error::PartitionsUnavailable { partitions, detail }) => {
            // Partition 2, and any partition after it in the same frame (its pass began under
            // the epoch partition 2's pass changed); never all of them.
            assert!(
                partitions.contains(&2) && partitions.len() < 4,
                "{partitions:?}"
            );
            assert!(detail.contains("WRONG_EPOCH"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // Once the cluster settles, the same call is exact.
    let r = c
        .run_op("t", 0, 0, &OpSpec::Count { predicate: None })
        .unwrap();
    assert_eq!(
        r.result,
        OpResult::Count {
            matched: 3,
            scanned: 3
        }
    );
}

#[test]
fn operators_on_a_table_being_written_see_whole_partitions() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (_servers, c) = cluster(2);
    c.create_table("live", 8, 2, ValueType::F64).unwrap();
    let c = Arc::new(c);
    // Keys acknowledged so far: a write in flight may be on one replica and not yet on the other,
    // and passes are spread over replicas, so only acknowledged writes must be seen by every pass.
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (c, acked) = (c.clone(), acked.clone());
        std::thread::spawn(move || {
            for b in 0..40i64 {
                let keys: Vec<i64> = (b * 250..(b + 1) * 250).collect();
                let ones = vec![1.0f64; keys.len()];
                c.put("live", Keys::I64(&keys), ValuesRef::F64(&ones), 0)
                    .unwrap();
                acked.fetch_add(keys.len() as u64, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    let mut last;
    loop {
        let done = writer.is_finished();
        let before = acked.load(std::sync::atomic::Ordering::SeqCst);
        let OpResult::Stats(s) = run(
            &c,
            "live",
            &OpSpec::Stats {
                column: 0,
                predicate: None,
            },
        ) else {
            panic!()
        };
        // Every value is 1: a pass that saw part of a value, or a key twice, would break this.
        assert_eq!(s.sum, s.count as f64);
        assert!(
            s.count >= before && s.count <= 10_000,
            "a pass saw {} items, {before} were acknowledged before it began",
            s.count
        );
        last = s.count;
        if done {
            break;
        }
    }
    writer.join().unwrap();
    assert_eq!(last, 10_000);
}
