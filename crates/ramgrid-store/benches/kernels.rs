//! The operator kernels over one partition of 10 M f64 values, in ns per value, beside a plain
//! streaming sum of the same values (the memory-bandwidth bound). The values are uniform on [0, 2);
//! the histograms run again over normal values binned on `linspace(-4, 4, 17)`, as
//! `benchmarks/operators.py` bins them (most values in a few middle bins, so the same counts are
//! incremented again and again), and over values that all lie on edges. Then the LR gradient and a
//! k-means step over n / 50 rows of 1 KB (256 f32 features and a label), in ns per row. Prints figures, asserts nothing:
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

/// A one-partition f64 table `name` holding `values`.
fn load(t: &Tables, name: &str, values: &[f64]) {
    let values: Vec<ValueRef<'_>> = values.iter().map(|&v| ValueRef::F64(v)).collect();
    load_values(t, name, ValueType::F64, &values);
}

/// A one-partition table `name` of type `vt` holding `values`.
fn load_values(t: &Tables, name: &str, vt: ValueType, values: &[ValueRef<'_>]) {
    t.create_table(
        TableSpec {
            name: name.into(),
            partitions: 1,
            replication: 1,
            value_type: vt,
            durability: Durability::Memory,
            incarnation: 1,
        },
        &[0],
    )
    .unwrap();
    let keys: Vec<[u8; 8]> = (0..values.len() as u64).map(|i| i.to_le_bytes()).collect();
    let mut st = Vec::new();
    for (ks, vs) in keys.chunks(100_000).zip(values.chunks(100_000)) {
        t.put_batch(
            name,
            0,
            0,
            ks.iter().map(|k| k.as_slice()).zip(vs.iter().copied()),
            &mut st,
        )
        .unwrap();
    }
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
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let values: Vec<f64> = (0..n).map(|_| uniform() * 2.0).collect();
    // Box-Muller: standard normal values.
    let normal: Vec<f64> = (0..n)
        .map(|_| {
            let (u, v) = (1.0 - uniform(), uniform());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        })
        .collect();
    load(&t, "t", &values);
    load(&t, "normal", &normal);
    // Every value on an edge: no bin can be told by arithmetic alone.
    let on_edges: Vec<f64> = values.iter().map(|&v| (v * 8.5).floor() / 8.0).collect();
    load(&t, "on_edges", &on_edges);
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
    let normal_edges: Vec<f64> = (0..=16).map(|i| -4.0 + f64::from(i) / 2.0).collect();
    let edges_64: Vec<f64> = (0..=64).map(|i| f64::from(i) / 32.0).collect();
    let cases: Vec<(&str, &str, Op<'_>)> = vec![
        ("t", "count(where)", Op::Count { pred }),
        (
            "t",
            "stats()",
            Op::Stats {
                column: 0,
                pred: None,
            },
        ),
        ("t", "stats(where)", Op::Stats { column: 0, pred }),
        (
            "t",
            "histogram(16 bins)",
            Op::Histogram {
                column: 0,
                pred: None,
                edges: &edges,
            },
        ),
        (
            "t",
            "histogram(16 bins, where)",
            Op::Histogram {
                column: 0,
                pred,
                edges: &edges,
            },
        ),
        (
            "t",
            "top_k(10)",
            Op::TopK {
                column: 0,
                k: 10,
                largest: true,
                pred: None,
            },
        ),
        (
            "t",
            "top_k(10, where)",
            Op::TopK {
                column: 0,
                k: 10,
                largest: true,
                pred,
            },
        ),
        (
            "normal",
            "histogram(16 bins), normal values",
            Op::Histogram {
                column: 0,
                pred: None,
                edges: &normal_edges,
            },
        ),
        (
            "normal",
            "histogram(16 bins, where), normal",
            Op::Histogram {
                column: 0,
                pred,
                edges: &normal_edges,
            },
        ),
        (
            "t",
            "histogram(64 bins)",
            Op::Histogram {
                column: 0,
                pred: None,
                edges: &edges_64,
            },
        ),
        (
            "on_edges",
            "histogram(16 bins), all on edges",
            Op::Histogram {
                column: 0,
                pred: None,
                edges: &edges,
            },
        ),
    ];
    for (table, name, op) in cases {
        let s = best(rounds, || {
            t.with_partition(table, 0, 0, |v| black_box(run(&op, &v).unwrap()))
                .unwrap();
        });
        println!(
            "{name:<34} {:7.3} ns/value {:6.2}x the streaming sum",
            ns(s),
            s / stream
        );
    }
    rows(&t, n / 50, &mut uniform, rounds);
}

/// The LR gradient and a k-means step over `m` rows of 256 f32 features and a label (1 KB), in
/// ns per row, beside a streaming sum of the same floats in lanes.
fn rows(t: &Tables, m: usize, uniform: &mut impl FnMut() -> f64, rounds: usize) {
    const DIM: usize = 257;
    let data: Vec<f32> = (0..m * DIM)
        .map(|i| {
            let x = uniform() as f32 * 2.0 - 1.0;
            if i % DIM == DIM - 1 {
                f32::from(x > 0.0)
            } else {
                x
            }
        })
        .collect();
    let bytes: Vec<Vec<u8>> = data
        .chunks_exact(DIM)
        .map(|r| r.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let values: Vec<ValueRef<'_>> = bytes.iter().map(|b| ValueRef::F32VecLe(b)).collect();
    load_values(t, "rows", ValueType::F32Vec { dim: DIM as u32 }, &values);
    let stream = best(rounds, || {
        black_box(data.chunks_exact(16).fold([0f32; 16], |mut a, c| {
            for (a, c) in a.iter_mut().zip(c) {
                *a += c;
            }
            a
        }));
    });
    let ns = |s: f64| s * 1e9 / m as f64;
    println!("{m} rows of 256 f32 features and a label; best of {rounds}");
    println!(
        "{:<34} {:7.1} ns/row",
        "streaming sum (Vec<f32>, lanes)",
        ns(stream)
    );
    let weights: Vec<f64> = (0..DIM).map(|i| (i as f64 - 128.0) / 1000.0).collect();
    let centroids: Vec<f64> = (0..8 * 256)
        .map(|i| ((i * 37) % 101) as f64 / 50.0 - 1.0)
        .collect();
    let cases: Vec<(&str, Op<'_>)> = vec![
        ("lr_gradient", Op::LrGradient { weights: &weights }),
        (
            "kmeans_step(k=8, 256 components)",
            Op::KmeansStep {
                components: 256,
                centroids: &centroids,
            },
        ),
    ];
    for (name, op) in cases {
        let s = best(rounds, || {
            t.with_partition("rows", 0, 0, |v| black_box(run(&op, &v).unwrap()))
                .unwrap();
        });
        println!(
            "{name:<34} {:7.1} ns/row   {:6.2}x the streaming sum",
            ns(s),
            s / stream
        );
    }
}
