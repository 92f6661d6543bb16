//! Each kernel against a plain computation over the same values (random partitions, proptest).

use proptest::prelude::*;

use super::*;
use crate::tables::{Durability, TableSpec, Tables, TablesConfig, ValueRef};

/// An empty table "t" of one partition held here (also the scan tests').
pub(super) fn new_table(vt: ValueType) -> Tables {
    let t = Tables::new(TablesConfig {
        memory_limit: 256 << 20,
        max_value_size: 1 << 20,
    });
    t.create_table(
        TableSpec {
            name: "t".into(),
            partitions: 1,
            replication: 1,
            value_type: vt,
            durability: Durability::Memory,
            incarnation: 1,
        },
        &[0],
    )
    .unwrap();
    t
}

/// A one-partition table "t" of type `vt` holding `values` (keys `k0`, `k1`, ...; also the SIMD tests').
pub(super) fn table(vt: ValueType, values: &[ValueRef<'_>]) -> Tables {
    let t = new_table(vt);
    let keys: Vec<Vec<u8>> = (0..values.len())
        .map(|i| format!("k{i}").into_bytes())
        .collect();
    let mut st = Vec::new();
    t.put_batch(
        "t",
        0,
        0,
        keys.iter()
            .map(|k| k.as_slice())
            .zip(values.iter().copied()),
        &mut st,
    )
    .unwrap();
    t
}

fn run_on(t: &Tables, op: &Op<'_>) -> Result<OpOutput> {
    t.with_partition("t", 0, 0, |v| run(op, &v)).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

proptest! {
    #[test]
    fn f64_count_stats_histogram(xs in prop::collection::vec(-1e6f64..1e6, 0..300), lo in -1e6f64..1e6, w in 0.0f64..2e6) {
        let vals: Vec<ValueRef<'_>> = xs.iter().map(|&x| ValueRef::F64(x)).collect();
        let t = table(ValueType::F64, &vals);
        let hi = lo + w;
        let sel: Vec<f64> = xs.iter().copied().filter(|&x| x >= lo && x < hi).collect();
        let pred = Some(Range { component: 0, lo, hi });
        prop_assert_eq!(run_on(&t, &Op::Count { pred }).unwrap(), OpOutput::Count { matched: sel.len() as u64, scanned: xs.len() as u64 });
        let OpOutput::Stats(s) = run_on(&t, &Op::Stats { column: 0, pred }).unwrap() else { panic!() };
        prop_assert_eq!(s.count, sel.len() as u64);
        if !sel.is_empty() {
            let n = sel.len() as f64;
            let mean = sel.iter().sum::<f64>() / n;
            let m2: f64 = sel.iter().map(|x| (x - mean) * (x - mean)).sum();
            prop_assert!(close(s.sum, sel.iter().sum()));
            prop_assert!(close(s.mean, mean), "{} {}", s.mean, mean);
            prop_assert!((s.m2 - m2).abs() <= 1e-6 * (1.0 + m2), "{} {}", s.m2, m2);
            prop_assert_eq!(s.min, sel.iter().copied().fold(f64::INFINITY, f64::min));
            prop_assert_eq!(s.max, sel.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        }
        let edges = [-1e6, -1e3, 0.0, 5.0, 1e3, 1e6];
        let OpOutput::Histogram(h) = run_on(&t, &Op::Histogram { column: 0, pred: None, edges: &edges }).unwrap() else { panic!() };
        let mut want = vec![0u64; 5];
        for &x in &xs {
            if x >= edges[0] && x <= edges[5] {
                let b = edges.partition_point(|&e| e <= x).saturating_sub(1).min(4);
                want[b] += 1;
            }
        }
        prop_assert_eq!(h, want);
    }

    #[test]
    fn even_histogram_matches_the_edges(xs in prop::collection::vec(-10i64..110, 0..300), bins in 1usize..40) {
        let vals: Vec<ValueRef<'_>> = xs.iter().map(|&x| ValueRef::I64(x)).collect();
        let t = table(ValueType::I64, &vals);
        let edges: Vec<f64> = (0..=bins).map(|i| 100.0 * i as f64 / bins as f64).collect();
        let OpOutput::Histogram(h) = run_on(&t, &Op::Histogram { column: 0, pred: None, edges: &edges }).unwrap() else { panic!() };
        let mut want = vec![0u64; bins];
        for &x in &xs {
            let x = x as f64;
            if (0.0..=100.0).contains(&x) {
                let b = edges.partition_point(|&e| e <= x).saturating_sub(1).min(bins - 1);
                want[b] += 1;
            }
        }
        prop_assert_eq!(h, want);
    }

    #[test]
    fn lr_gradient_and_kmeans(rows in prop::collection::vec(prop::collection::vec(-3f32..3.0, 5), 0..200), w in prop::collection::vec(-1f64..1.0, 5)) {
        // 4 features then a 0/1 label.
        let rows: Vec<Vec<f32>> = rows.into_iter().map(|mut r| { r[4] = if r[4] > 0.0 { 1.0 } else { 0.0 }; r }).collect();
        let bytes: Vec<Vec<u8>> = rows.iter().map(|r| f32_bytes(r)).collect();
        let vals: Vec<ValueRef<'_>> = bytes.iter().map(|b| ValueRef::F32VecLe(b)).collect();
        let t = table(ValueType::F32Vec { dim: 5 }, &vals);
        let OpOutput::LrGradient { rows: n, loss, gradient } = run_on(&t, &Op::LrGradient { weights: &w }).unwrap() else { panic!() };
        prop_assert_eq!(n, rows.len() as u64);
        let (mut wl, mut wg) = (0.0, [0.0f64; 5]);
        for r in &rows {
            let z: f64 = (0..4).map(|j| w[j] * f64::from(r[j])).sum::<f64>() + w[4];
            let y = f64::from(r[4]);
            let p = 1.0 / (1.0 + (-z).exp());
            wl += (1.0 + z.exp()).ln() - y * z;
            for j in 0..4 { wg[j] += (p - y) * f64::from(r[j]); }
            wg[4] += p - y;
        }
        prop_assert!((loss - wl).abs() <= 1e-4 * (1.0 + wl.abs()), "{} {}", loss, wl);
        for j in 0..5 { prop_assert!((gradient[j] - wg[j]).abs() <= 1e-4 * (1.0 + wg[j].abs()), "{:?} {:?}", gradient, wg); }
        let cents = [0.0, 0.0, 1.0, 1.0, -1.0, -1.0];
        let OpOutput::KmeansStep { counts, sums, inertia } = run_on(&t, &Op::KmeansStep { components: 2, centroids: &cents }).unwrap() else { panic!() };
        let (mut wc, mut ws, mut wi) = (vec![0u64; 3], vec![0.0f64; 6], 0.0f64);
        for r in &rows {
            let d: Vec<f64> = (0..3).map(|j| (0..2).map(|c| (f64::from(r[c]) - cents[j * 2 + c]).powi(2)).sum()).collect();
            let best = (0..3).fold(0, |b, j| if d[j] < d[b] { j } else { b });
            wc[best] += 1;
            ws[best * 2] += f64::from(r[0]);
            ws[best * 2 + 1] += f64::from(r[1]);
            wi += d[best];
        }
        prop_assert_eq!(counts, wc);
        for j in 0..6 { prop_assert!((sums[j] - ws[j]).abs() < 1e-3); }
        prop_assert!((inertia - wi).abs() <= 1e-3 * (1.0 + wi));
    }
}

#[test]
fn bad_operators_are_refused_with_the_reason() {
    let vals = [ValueRef::Bytes(b"x")];
    let t = table(ValueType::Bytes, &vals);
    let msg = |op: &Op<'_>, vt| validate(op, vt).unwrap_err().to_string();
    assert!(msg(
        &Op::Stats {
            column: 0,
            pred: None
        },
        ValueType::Bytes
    )
    .contains("numeric"));
    assert_eq!(
        run_on(&t, &Op::Count { pred: None }).unwrap(),
        OpOutput::Count {
            matched: 1,
            scanned: 1
        }
    );
    let v4 = ValueType::F32Vec { dim: 4 };
    assert!(msg(
        &Op::Count {
            pred: Some(Range {
                component: 4,
                lo: 0.0,
                hi: 1.0
            })
        },
        v4
    )
    .contains("component 4"));
    assert!(msg(
        &Op::Count {
            pred: Some(Range {
                component: 0,
                lo: f64::NAN,
                hi: 1.0
            })
        },
        v4
    )
    .contains("NaN"));
    assert!(msg(
        &Op::Histogram {
            column: 0,
            pred: None,
            edges: &[0.0, 2.0, 1.0]
        },
        ValueType::F64
    )
    .contains("increase"));
    assert!(msg(
        &Op::Histogram {
            column: 0,
            pred: None,
            edges: &[0.0]
        },
        ValueType::F64
    )
    .contains("2 edges"));
    assert!(msg(&Op::LrGradient { weights: &[0.0; 3] }, v4).contains("3 weights"));
    assert!(msg(
        &Op::LrGradient {
            weights: &[0.0, 0.0, f64::INFINITY, 0.0]
        },
        v4
    )
    .contains("finite"));
    assert!(msg(&Op::LrGradient { weights: &[0.0; 4] }, ValueType::F64).contains("f32vec"));
    assert!(msg(
        &Op::KmeansStep {
            components: 3,
            centroids: &[0.0; 4]
        },
        v4
    )
    .contains("k × 3"));
    assert!(msg(
        &Op::KmeansStep {
            components: 5,
            centroids: &[0.0; 5]
        },
        v4
    )
    .contains("1..=4"));
}

#[test]
fn stats_stay_exact_far_from_zero() {
    // Values around 1e9 with a spread of 1: a naive sum of squares would lose everything.
    let xs: Vec<f64> = (0..1000).map(|i| 1e9 + (i % 10) as f64 * 0.1).collect();
    let vals: Vec<ValueRef<'_>> = xs.iter().map(|&x| ValueRef::F64(x)).collect();
    let t = table(ValueType::F64, &vals);
    let OpOutput::Stats(s) = run_on(
        &t,
        &Op::Stats {
            column: 0,
            pred: None,
        },
    )
    .unwrap() else {
        panic!()
    };
    let mean = xs.iter().sum::<f64>() / 1000.0;
    let var: f64 = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 1000.0;
    assert!(
        (s.m2 / 1000.0 - var).abs() < 1e-6,
        "{} {}",
        s.m2 / 1000.0,
        var
    );
}

#[test]
fn infinite_values_outside_the_predicate_leave_the_stats_finite() {
    // Masking unselected values by multiplying by 0 turned inf into NaN.
    let xs = [
        1.0,
        f64::INFINITY,
        2.0,
        f64::NEG_INFINITY,
        f64::NAN,
        4.0,
        3.0,
        100.0,
        5.0,
    ];
    let vals: Vec<ValueRef<'_>> = xs.iter().map(|&x| ValueRef::F64(x)).collect();
    let t = table(ValueType::F64, &vals);
    let op = Op::Stats {
        column: 0,
        pred: Some(Range {
            component: 0,
            lo: 0.0,
            hi: 10.0,
        }),
    };
    let OpOutput::Stats(s) = run_on(&t, &op).unwrap() else {
        panic!()
    };
    assert_eq!((s.count, s.sum, s.min, s.max), (5, 15.0, 1.0, 5.0));
    assert!(
        (s.mean - 3.0).abs() < 1e-12 && (s.m2 - 10.0).abs() < 1e-9,
        "{s:?}"
    );
}
