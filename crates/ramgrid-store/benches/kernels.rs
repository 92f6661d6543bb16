//! The operator kernels over one partition of 10 M f64 values, in ns per value, beside a plain
//! streaming sum of the same values (the memory-bandwidth bound). Prints figures, asserts nothing:
//! `cargo bench -p ramgrid-store --bench kernels [-- N]`.

use std::hint::black_box;
use std::time::Instant;

use ramgrid_store::ops::{run, Op, Range};
use ramgrid_store::tables::{Durability, TableSpec, Tables, TablesConfig, ValueRef, ValueType};

fn best(rounds: usize, mut f: impl FnMut()) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let t = Tables::new(TablesConfig {
        memory_limit: 8 << 30,
        max_value_size: 1 << 20,
    });
    t.create_table(
        TableSpec {
            name: "t".into(),
            partitions: 1,
            replication: 1,
            value_type: ValueType::F64,
            durability: Durability::Memory,
            incarnation: 1,
        },
        &[0],
    )
    .unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let values: Vec<f64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0
        })
        .collect();
    let keys: Vec<[u8; 8]> = (0..n as u64).map(|i| i.to_le_bytes()).collect();
    let mut st = Vec::new();
    for (ks, vs) in keys.chunks(100_000).zip(values.chunks(100_000)) {
        t.put_batch(
            "t",
            0,
            0,
            ks.iter()
                .map(|k| k.as_slice())
                .zip(vs.iter().map(|&v| ValueRef::F64(v))),
            &mut st,
        )
        .unwrap();
    }
    let rounds = 7;
    let stream = best(rounds, || {
        black_box(values.iter().sum::<f64>());
    });
    let ns = |s: f64| s * 1e9 / n as f64;
    println!("{n} f64 values; best of {rounds}");
    println!(
        "{:<34} {:7.3} ns/value",
        "streaming sum (Vec<f64>)",
        ns(stream)
    );
    let pred = Some(Range {
        component: 0,
        lo: 0.0,
        hi: 1.0,
    });
    let edges: Vec<f64> = (0..=16).map(|i| f64::from(i) / 8.0).collect();
    let cases: Vec<(&str, Op<'_>)> = vec![
        ("count(where)", Op::Count { pred }),
        (
            "stats()",
            Op::Stats {
                column: 0,
                pred: None,
            },
        ),
        ("stats(where)", Op::Stats { column: 0, pred }),
        (
            "histogram(16 bins)",
            Op::Histogram {
                column: 0,
                pred: None,
                edges: &edges,
            },
        ),
        (
            "histogram(16 bins, where)",
            Op::Histogram {
                column: 0,
                pred,
                edges: &edges,
            },
        ),
        (
            "top_k(10)",
            Op::TopK {
                column: 0,
                k: 10,
                largest: true,
                pred: None,
            },
        ),
        (
            "top_k(10, where)",
            Op::TopK {
                column: 0,
                k: 10,
                largest: true,
                pred,
            },
        ),
    ];
    for (name, op) in cases {
        let s = best(rounds, || {
            t.with_partition("t", 0, 0, |v| black_box(run(&op, &v).unwrap()))
                .unwrap();
        });
        println!(
            "{name:<34} {:7.3} ns/value {:6.2}x the streaming sum",
            ns(s),
            s / stream
        );
    }
}
