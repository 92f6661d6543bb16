//! The intrinsics kernels against the scalar reference loops, on the values that break SIMD code:
//! NaN, infinities, signed zeros, empty and unaligned tails, predicates that select nothing and
//! everything, values on the edges. On a CPU without AVX2 and FMA both sides run the reference; the
//! stats kernel is checked for each instruction set the CPU has ([`Isa`]), AVX-512F included.

use proptest::prelude::*;

use super::histogram::histogram_with;
use super::kmeans::step_with;
use super::lr::gradient_with;
use super::simd::Isa;
use super::stats::{f64_stats, stats_with};
use super::topk::top_k_with;
use super::Range;
use crate::tables::{PartitionView, ValueRef, ValueType};

/// Runs `f` over a one-partition f64 table holding `xs`.
fn with_view<R>(xs: &[f64], f: impl FnOnce(&PartitionView<'_>) -> R) -> R {
    let values: Vec<ValueRef<'_>> = xs.iter().map(|&x| ValueRef::F64(x)).collect();
    let t = super::tests::table(ValueType::F64, &values);
    t.with_partition("t", 0, 0, |v| f(&v)).unwrap()
}

/// Equal, or both NaN (sums of infinities of both signs).
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// The predicates worth trying over `xs`: none, nothing, everything, a middle slice, an empty
/// range, one that ends on a value.
fn predicates(xs: &[f64]) -> Vec<Option<Range>> {
    let r = |lo, hi| {
        Some(Range {
            component: 0,
            lo,
            hi,
        })
    };
    let mut out = vec![
        None,
        r(f64::NEG_INFINITY, f64::INFINITY),
        r(1e300, 2e300),
        r(0.0, 0.0),
        r(-1.0, 1.0),
        r(f64::NEG_INFINITY, 0.0),
        r(0.0, f64::INFINITY),
    ];
    if let Some(&x) = xs.iter().find(|x| x.is_finite()) {
        out.push(r(x, x + 1.0));
        out.push(r(x - 1.0, x));
    }
    out
}

/// The stats kernel written for `isa` gives the scalar reference's count and extremes exactly,
/// its sums to rounding (they are added in another order), with each predicate: through a table,
/// and over a slice starting at each of the 8 offsets (mod 64 bytes) an f64 can have.
fn check_stats(xs: &[f64], isa: Isa) -> Result<(), TestCaseError> {
    let mut buf = vec![0.0; xs.len() + 8];
    for at in 0..8 {
        buf[at..at + xs.len()].copy_from_slice(xs);
        let v = &buf[at..at + xs.len()];
        for pred in predicates(xs) {
            let p = pred.map(|r| (r.lo, r.hi));
            let (a, b) = (f64_stats(v, p, isa), f64_stats(v, p, Isa::Scalar));
            prop_assert_eq!(a.count, b.count, "{:?} at {} count {:?}", isa, at, p);
            prop_assert!(
                a.min == b.min && a.max == b.max,
                "{:?} at {} {:?} {:?} {:?}",
                isa,
                at,
                a,
                b,
                p
            );
            prop_assert!(
                same(a.sum, b.sum) && same(a.mean, b.mean) && same(a.m2, b.m2),
                "{:?} at {} {:?} {:?} {:?}",
                isa,
                at,
                a,
                b,
                p
            );
        }
    }
    with_view(xs, |view| {
        for pred in predicates(xs) {
            let (a, b) = (
                stats_with(view, 0, pred.as_ref(), isa),
                stats_with(view, 0, pred.as_ref(), Isa::Scalar),
            );
            prop_assert_eq!(a.count, b.count, "{:?} count {:?}", isa, pred);
            prop_assert!(
                a.min == b.min && a.max == b.max,
                "{:?} {:?} {:?} {:?}",
                isa,
                a,
                b,
                pred
            );
            prop_assert!(
                same(a.sum, b.sum) && same(a.mean, b.mean) && same(a.m2, b.m2),
                "{:?} {:?} {:?} {:?}",
                isa,
                a,
                b,
                pred
            );
        }
        Ok(())
    })
}

fn check(xs: &[f64]) -> Result<(), TestCaseError> {
    // Each intrinsics build of stats this CPU runs (the others would run the reference again).
    for isa in Isa::ALL {
        if isa != Isa::Scalar && isa.supported() {
            check_stats(xs, isa)?;
        }
    }
    with_view(xs, |view| {
        for pred in predicates(xs) {
            for k in [1, 3, xs.len() + 1] {
                for largest in [true, false] {
                    let (a, b) = (
                        top_k_with(view, 0, k, largest, pred.as_ref(), true),
                        top_k_with(view, 0, k, largest, pred.as_ref(), false),
                    );
                    // Bit-for-bit: -0.0 and 0.0 tie and go by key in both.
                    let bits = |v: Vec<(u32, f64)>| -> Vec<(u32, u64)> {
                        v.into_iter().map(|(i, x)| (i, x.to_bits())).collect()
                    };
                    prop_assert_eq!(bits(a), bits(b), "k {} largest {} {:?}", k, largest, pred);
                }
            }
        }
        Ok(())
    })?;
    for edges in edge_sets() {
        check_histogram(xs, &edges)?;
    }
    Ok(())
}

/// The edges the histogram kernels are tried with: 16 bins and fewer (counted in 4-bit fields),
/// more (counted in rows), edges that are not exact multiples of their spacing (0.1), edges moved
/// off even spacing by less than the kernel tolerates, edges far from 0 relative to their spacing.
fn edge_sets() -> Vec<Vec<f64>> {
    let lin = |first: f64, width: f64, bins: u32| -> Vec<f64> {
        (0..=bins).map(|i| first + width * f64::from(i)).collect()
    };
    let mut moved = lin(0.0, 0.125, 8);
    for (i, e) in moved.iter_mut().enumerate().skip(1).take(7) {
        *e += if i % 2 == 0 { 0.9e-9 } else { -0.9e-9 } * 0.125;
    }
    vec![
        vec![-1.0, 0.0, 1.0],
        lin(-4.0, 0.5, 16),
        lin(-4.0, 0.5, 15),
        (0..=10).map(|i| f64::from(i) / 10.0).collect(),
        lin(-4.0, 0.2, 40),
        moved,
        lin(1e6, 0.25, 16),
    ]
}

/// numpy's histogram by its definition: a value's bin is the last edge at or below it, the last
/// edge closing the last bin; values outside the edges (and NaN) are not counted.
fn by_definition(xs: &[f64], pred: Option<&Range>, edges: &[f64]) -> Vec<u64> {
    let bins = edges.len() - 1;
    let mut counts = vec![0; bins];
    for &x in xs {
        let selected = pred.is_none_or(|r| x >= r.lo && x < r.hi);
        if selected && x >= edges[0] && x <= edges[bins] {
            let b = edges.iter().filter(|&&e| e <= x).count() - 1;
            counts[b.min(bins - 1)] += 1;
        }
    }
    counts
}

/// The intrinsics kernel and the scalar loop both count as [`by_definition`], with each predicate.
fn check_histogram(xs: &[f64], edges: &[f64]) -> Result<(), TestCaseError> {
    with_view(xs, |view| {
        for pred in predicates(xs) {
            let want = by_definition(xs, pred.as_ref(), edges);
            for simd in [true, false] {
                prop_assert_eq!(
                    histogram_with(view, 0, pred.as_ref(), edges, simd),
                    want.clone(),
                    "simd {} edges {:?} pred {:?}",
                    simd,
                    edges,
                    pred
                );
            }
        }
        Ok(())
    })
}

/// Each edge, its neighbours one ulp away and a little further (where an estimate by arithmetic
/// may land on the wrong side), the middles of the bins, and values beyond the ends.
fn around_edges(edges: &[f64]) -> Vec<f64> {
    let width = edges[1] - edges[0];
    let mut xs = vec![edges[0] - width, edges[edges.len() - 1] + width];
    for w in edges.windows(2) {
        xs.push((w[0] + w[1]) / 2.0);
    }
    for &e in edges {
        for d in [1e-9, 3e-10, 1e-12] {
            xs.extend([e - d * width, e + d * width]);
        }
        xs.extend([e, e.next_down(), e.next_up()]);
    }
    xs
}

const SPECIAL: [f64; 10] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e300,
    f64::MIN_POSITIVE,
];

#[test]
fn every_length_up_to_three_blocks_of_the_special_values() {
    // Every tail length past the 8-value blocks, each special value in every lane.
    for n in 0..=25 {
        for shift in 0..SPECIAL.len() {
            let xs: Vec<f64> = (0..n)
                .map(|i| SPECIAL[(i + shift) % SPECIAL.len()])
                .collect();
            check(&xs).unwrap();
        }
    }
}

/// Skips (with a note) where the CPU lacks `isa`: the comparison would be the reference against
/// itself.
fn on_cpus_with(isa: Isa, test: &str) -> bool {
    if !isa.supported() {
        eprintln!("{test}: skipped, this CPU lacks {isa:?}");
    }
    isa.supported()
}

#[test]
fn avx512_stats_on_every_length_up_to_two_blocks_and_a_value() {
    if !on_cpus_with(
        Isa::Avx512F,
        "avx512_stats_on_every_length_up_to_two_blocks_and_a_value",
    ) {
        return;
    }
    // A masked head of 0-7 values (to a 64-byte boundary), blocks of 16 and a masked tail of 0-15:
    // every tail length after zero, one and two blocks, from each alignment (`check_stats`), each
    // special value in every lane of both registers, of the head and of the tail.
    for n in 0..=33 {
        for shift in 0..SPECIAL.len() {
            let xs: Vec<f64> = (0..n)
                .map(|i| SPECIAL[(i + shift) % SPECIAL.len()])
                .collect();
            check_stats(&xs, Isa::Avx512F).unwrap();
        }
        // One NaN, one infinity or one -0.0 alone among ordinary values, in each position.
        for special in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0] {
            for at in 0..n {
                let mut xs: Vec<f64> = (0..n).map(|i| i as f64 * 0.25 - 2.0).collect();
                xs[at] = special;
                check_stats(&xs, Isa::Avx512F).unwrap();
            }
        }
    }
}

#[test]
fn avx512_stats_far_from_zero_and_long() {
    if !on_cpus_with(Isa::Avx512F, "avx512_stats_far_from_zero_and_long") {
        return;
    }
    // Values far from 0 relative to their spread (the shift carries the variance), over many
    // blocks and each tail.
    for n in [1000u32, 1001, 1007, 1008, 1015] {
        let xs: Vec<f64> = (0..n).map(|i| 1e9 + f64::from(i % 7) * 0.5).collect();
        check_stats(&xs, Isa::Avx512F).unwrap();
    }
}

#[test]
fn values_on_and_next_to_the_edges_of_each_edge_set() {
    let mut sets = edge_sets();
    sets.push((0..=1000).map(|i| -2.0 + f64::from(i) / 250.0).collect());
    for edges in sets {
        let xs = around_edges(&edges);
        // Every offset into the blocks of four and eight values.
        for skip in 0..8 {
            check_histogram(&xs[skip..], &edges).unwrap();
        }
    }
}

#[test]
fn long_runs_of_one_bin_and_of_values_counted_nowhere() {
    // Thousands of increments of one count (the kernel's small counters spill into wider ones
    // every so often: one too many would wrap), with every tail length after them.
    let edges: Vec<f64> = (0..=16).map(|i| -4.0 + f64::from(i) * 0.5).collect();
    for x in [
        0.25,
        -3.75,
        3.75,
        4.0,
        -4.0,
        5.0,
        -5.0,
        f64::NAN,
        f64::INFINITY,
    ] {
        for n in [2999, 3000, 3001, 3004, 3007] {
            check_histogram(&vec![x; n], &edges).unwrap();
            check_histogram(&vec![x; n], &edges[..11]).unwrap();
        }
    }
}

#[test]
fn values_on_the_edges_and_between_them() {
    let xs: Vec<f64> = (0..=64)
        .flat_map(|i| {
            let e = -4.0 + f64::from(i) * 0.125;
            [e, e.next_down(), e.next_up()]
        })
        .collect();
    check(&xs).unwrap();
}

proptest! {
    #[test]
    fn random_values_with_specials_mixed_in(
        xs in prop::collection::vec(
            prop_oneof![4 => -5.0f64..5.0, 1 => prop::sample::select(SPECIAL.to_vec())],
            0..200,
        )
    ) {
        check(&xs)?;
    }
}

/// Runs `f` over a one-partition table of f32 vectors of `dim` holding `rows`, row after row.
fn with_rows<R>(dim: u32, rows: &[f32], f: impl FnOnce(&PartitionView<'_>) -> R) -> R {
    let bytes: Vec<Vec<u8>> = rows
        .chunks_exact(dim as usize)
        .map(|r| r.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let values: Vec<ValueRef<'_>> = bytes.iter().map(|b| ValueRef::F32VecLe(b)).collect();
    let t = super::tests::table(ValueType::F32Vec { dim }, &values);
    t.with_partition("t", 0, 0, |v| f(&v)).unwrap()
}

/// `n` numbers from a fixed sequence: halves in -4..4 (products and sums of a few hundred of them
/// are exact in f32, so both kernels see the same dot products and distances whatever their order
/// of addition), one in `special` of them NaN or an infinity when `special` > 0.
fn halves(n: usize, seed: u64, special: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match (special, x % 997) {
                (s, r) if s > 0 && r % s == 0 => {
                    [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][(r / s % 3) as usize]
                }
                _ => ((x >> 20) % 17) as f32 * 0.5 - 4.0,
            }
        })
        .collect()
}

#[test]
fn lr_gradient_with_intrinsics_as_the_plain_loops() {
    // Features 1..=40 (every tail past the blocks of 8 and 32), rows across the f32 flush (256).
    for dim in 2..=41u32 {
        for (n, special) in [(0, 0), (1, 0), (7, 0), (300, 0), (40, 29)] {
            let mut rows = halves(n * dim as usize, u64::from(dim) * 31 + n as u64, special);
            for row in rows.chunks_exact_mut(dim as usize) {
                let y = &mut row[dim as usize - 1];
                *y = if y.is_nan() { 0.5 } else { f32::from(*y > 0.0) };
            }
            let w: Vec<f64> = halves(dim as usize, u64::from(dim), 0)
                .iter()
                .map(|&x| f64::from(x) / 8.0)
                .collect();
            let ((ra, la, ga), (rb, lb, gb)) = with_rows(dim, &rows, |view| {
                (
                    gradient_with(view, &w, true),
                    gradient_with(view, &w, false),
                )
            });
            assert_eq!(ra, rb, "dim {dim} n {n}");
            // The same z per row: the same loss, bit for bit (or NaN in both).
            assert!(
                same(la, lb) && (la.is_nan() || la == lb),
                "dim {dim} n {n}: {la} {lb}"
            );
            // The gradient's sums differ by the rounding of fused against separate multiply-adds.
            let scale = 1.0 + 4.0 * n as f64;
            for (j, (a, b)) in ga.iter().zip(&gb).enumerate() {
                assert!(
                    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-5 * scale,
                    "dim {dim} n {n} component {j}: {a} {b}"
                );
            }
        }
    }
}

#[test]
fn kmeans_step_with_intrinsics_as_the_plain_loops() {
    // Exact distances: the same nearest centroid for every row (ties to the lower index in both),
    // so counts, sums and inertia agree bit for bit.
    for dim in [1u32, 2, 3, 8, 9, 16, 31, 32, 33, 40, 70] {
        for c in [1, dim / 2, dim.saturating_sub(1), dim] {
            if c == 0 {
                continue;
            }
            for (k, special) in [(1, 0), (3, 0), (5, 0), (4, 31), (9, 0), (11, 37)] {
                let rows = halves(200 * dim as usize, u64::from(dim * 100 + c), special);
                let cents: Vec<f64> = halves(k * c as usize, u64::from(c) + k as u64, 0)
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect();
                let (a, b) = with_rows(dim, &rows, |view| {
                    (
                        step_with(view, c as usize, &cents, true),
                        step_with(view, c as usize, &cents, false),
                    )
                });
                // Bit for bit, but any NaN for any NaN (which one depends on the order of operands).
                let bits = |x: f64| if x.is_nan() { 0 } else { x.to_bits() };
                let all = |v: &[f64]| v.iter().map(|&x| bits(x)).collect::<Vec<_>>();
                assert_eq!(a.0, b.0, "dim {dim} c {c} k {k}");
                assert_eq!(all(&a.1), all(&b.1), "dim {dim} c {c} k {k}");
                if special == 0 {
                    // The counts by definition: each row's nearest centroid, the first of equals.
                    let mut want = vec![0u64; k];
                    for row in rows.chunks_exact(dim as usize) {
                        let d = |j: usize| -> f64 {
                            (0..c as usize)
                                .map(|i| (f64::from(row[i]) - cents[j * c as usize + i]).powi(2))
                                .sum()
                        };
                        want[(0..k).fold(0, |b, j| if d(j) < d(b) { j } else { b })] += 1;
                    }
                    assert_eq!(b.0, want, "dim {dim} c {c} k {k}");
                }
                assert_eq!(bits(a.2), bits(b.2), "dim {dim} c {c} k {k}");
            }
        }
    }
}
