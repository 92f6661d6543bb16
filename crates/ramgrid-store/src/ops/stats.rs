//! STATS: count, sum, min, max, mean and the sum of squared deviations of one numeric column.
//!
//! One pass, shifted by the first value `K` (sums of `x - K` and `(x - K)^2`): as exact as two
//! passes when the values sit far from 0 relative to their spread, at one pass's cost. Partials
//! merge with Chan et al.'s pairwise update on the client.

use super::simd::dispatch;
use super::{Col, Range};
use crate::tables::PartitionView;

/// Summary statistics of some values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsPartial {
    /// How many values.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// Smallest (`+inf` when none).
    pub min: f64,
    /// Largest (`-inf` when none).
    pub max: f64,
    /// Mean (0 when none).
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
}

const L: usize = 4;

#[derive(Clone, Copy)]
struct Acc {
    n: [u64; L],
    s: [f64; L],
    d: [f64; L],
    d2: [f64; L],
    min: [f64; L],
    max: [f64; L],
}

impl Acc {
    fn new() -> Acc {
        Acc {
            n: [0; L],
            s: [0.0; L],
            d: [0.0; L],
            d2: [0.0; L],
            min: [f64::INFINITY; L],
            max: [f64::NEG_INFINITY; L],
        }
    }

    /// Adds `x` to lane `j` if `sel`. Unselected values are masked out bit by bit (to +0.0, and to
    /// ±inf for the extremes), never multiplied by 0: an infinite value outside the predicate would
    /// make the sums NaN. Bit masks, not branches, so the lanes vectorize.
    #[inline(always)]
    fn add(&mut self, j: usize, sel: bool, x: f64, k: f64) {
        let keep = u64::from(sel).wrapping_neg();
        let masked =
            |v: f64, else_: f64| f64::from_bits((v.to_bits() & keep) | (else_.to_bits() & !keep));
        let dx = masked(x - k, 0.0);
        self.n[j] += u64::from(sel);
        self.s[j] += masked(x, 0.0);
        self.d[j] += dx;
        self.d2[j] += dx * dx;
        self.min[j] = self.min[j].min(masked(x, f64::INFINITY));
        self.max[j] = self.max[j].max(masked(x, f64::NEG_INFINITY));
    }

    fn finish(self, k: f64) -> StatsPartial {
        let n: u64 = self.n.iter().sum();
        if n == 0 {
            return StatsPartial {
                count: 0,
                sum: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
                mean: 0.0,
                m2: 0.0,
            };
        }
        let nf = n as f64;
        let d: f64 = self.d.iter().sum();
        let d2: f64 = self.d2.iter().sum();
        StatsPartial {
            count: n,
            sum: self.s.iter().sum(),
            min: self.min.iter().copied().fold(f64::INFINITY, f64::min),
            max: self.max.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean: k + d / nf,
            m2: (d2 - d * d / nf).max(0.0),
        }
    }
}

/// Statistics of column `column` over the items of `view` selected by `pred`.
pub(crate) fn stats(view: &PartitionView<'_>, column: u32, pred: Option<&Range>) -> StatsPartial {
    let n = view.len();
    let col = Col::of(view, column);
    let sel_col = pred.map(|r| (Col::of(view, r.component), r.lo, r.hi));
    // The shift: the first selected value (any value near the data keeps the sums small).
    let k = (0..n)
        .find(|&i| sel_col.is_none_or(|(c, lo, hi)| (lo..hi).contains(&c.get(i))))
        .map_or(0.0, |i| col.get(i));
    let k = if k.is_finite() { k } else { 0.0 };
    let mut acc = Acc::new();
    // The predicate's bounds are compared with `&`, not `&&`: no branch, so the loops vectorize.
    match (col, sel_col) {
        (Col::F64(v), None) => acc = f64_all(v, k),
        (Col::F64(v), Some((Col::F64(_), lo, hi))) => acc = f64_range(v, k, lo, hi),
        (Col::I64(v), None) => acc = i64_all(v, k),
        (Col::I64(v), Some((Col::I64(_), lo, hi))) => acc = i64_range(v, k, lo, hi),
        (col, None) => run(&mut acc, n, k, |i| (true, col.get(i))),
        (col, Some((sc, lo, hi))) => run(&mut acc, n, k, |i| {
            let y = sc.get(i);
            ((y >= lo) & (y < hi), col.get(i))
        }),
    }
    acc.finish(k)
}

// The scalar columns' loops, built for AVX2 too (`simd.rs`).
dispatch!(fn f64_all(v: &[f64], k: f64) -> Acc => f64_all_body);
dispatch!(fn f64_range(v: &[f64], k: f64, lo: f64, hi: f64) -> Acc => f64_range_body);
dispatch!(fn i64_all(v: &[i64], k: f64) -> Acc => i64_all_body);
dispatch!(fn i64_range(v: &[i64], k: f64, lo: f64, hi: f64) -> Acc => i64_range_body);

#[inline(always)]
fn f64_all_body(v: &[f64], k: f64) -> Acc {
    lanes(v, k, |x| (true, x))
}

#[inline(always)]
fn f64_range_body(v: &[f64], k: f64, lo: f64, hi: f64) -> Acc {
    lanes(v, k, |x| ((x >= lo) & (x < hi), x))
}

#[inline(always)]
fn i64_all_body(v: &[i64], k: f64) -> Acc {
    lanes(v, k, |x| (true, x as f64))
}

#[inline(always)]
fn i64_range_body(v: &[i64], k: f64, lo: f64, hi: f64) -> Acc {
    lanes(v, k, |x| {
        let x = x as f64;
        ((x >= lo) & (x < hi), x)
    })
}

/// [`run`] over a slice in chunks of `L` (no bounds checks in the loop).
#[inline(always)]
fn lanes<T: Copy>(v: &[T], k: f64, f: impl Fn(T) -> (bool, f64)) -> Acc {
    let mut acc = Acc::new();
    let mut chunks = v.chunks_exact(L);
    for ch in &mut chunks {
        for (j, &x) in ch.iter().enumerate() {
            let (sel, x) = f(x);
            acc.add(j, sel, x, k);
        }
    }
    for &x in chunks.remainder() {
        let (sel, x) = f(x);
        acc.add(0, sel, x, k);
    }
    acc
}

#[inline(always)]
fn run(acc: &mut Acc, n: usize, k: f64, f: impl Fn(usize) -> (bool, f64)) {
    let whole = n / L * L;
    let mut i = 0;
    while i < whole {
        for j in 0..L {
            let (sel, x) = f(i + j);
            acc.add(j, sel, x, k);
        }
        i += L;
    }
    for i in whole..n {
        let (sel, x) = f(i);
        acc.add(0, sel, x, k);
    }
}
