//! TOP_K: the `k` entries of a partition with the largest (or smallest) values of one numeric
//! column, with a bounded heap: one pass over the column, `O(n log k)` at worst, keys touched only
//! for entries that enter the heap or tie with its worst. NaN values are never selected.
//!
//! Order (so partials merge deterministically on the client): better value first; equal values
//! by key bytes, smaller first.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::{Col, Range};
use crate::tables::PartitionView;

/// A candidate; `Ord`: greater is better.
struct Cand<'a> {
    /// The value, negated when the smallest are wanted, so higher is always better.
    score: f64,
    key: &'a [u8],
    i: u32,
}

impl PartialEq for Cand<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Cand<'_> {}
impl PartialOrd for Cand<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        // Scores are never NaN (NaN values are skipped); -0.0 and 0.0 tie and go by key.
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| o.key.cmp(self.key))
    }
}

/// The best `k` entries seen so far: a bounded heap whose top is the worst of them.
struct Best<'a> {
    k: usize,
    heap: BinaryHeap<Reverse<Cand<'a>>>,
}

impl<'a> Best<'a> {
    fn new(k: usize, n: usize) -> Best<'a> {
        Best {
            k,
            heap: BinaryHeap::with_capacity(k.min(n) + 1),
        }
    }

    /// The score below which an entry cannot enter (-inf until `k` entries are held).
    fn threshold(&self) -> f64 {
        match self.heap.peek() {
            Some(w) if self.heap.len() == self.k => w.0.score,
            _ => f64::NEG_INFINITY,
        }
    }

    /// Offers entry `i` of `view` with `score` (not NaN).
    #[inline]
    fn offer(&mut self, view: &PartitionView<'a>, i: usize, score: f64) {
        // Most entries stop here, without touching their key.
        if score < self.threshold() {
            return;
        }
        let cand = Cand {
            score,
            key: view.key(i),
            i: i as u32,
        };
        if self.heap.len() < self.k {
            self.heap.push(Reverse(cand));
        } else if cand > self.heap.peek().expect("k >= 1").0 {
            self.heap.pop();
            self.heap.push(Reverse(cand));
        }
    }

    /// Best first, as (entry, value).
    fn finish(self, sign: f64) -> Vec<(u32, f64)> {
        let mut best: Vec<Cand<'_>> = self.heap.into_iter().map(|r| r.0).collect();
        best.sort_unstable_by(|a, b| b.cmp(a));
        best.into_iter().map(|c| (c.i, sign * c.score)).collect()
    }
}

/// The best `k` entries of `view` by column `column` (selected by `pred`), best first, as
/// (entry, value). `column` and `pred` are validated by the caller.
pub(crate) fn top_k(
    view: &PartitionView<'_>,
    column: u32,
    k: usize,
    largest: bool,
    pred: Option<&Range>,
) -> Vec<(u32, f64)> {
    top_k_with(view, column, k, largest, pred, true)
}

/// [`top_k`], with the intrinsics kernel where the CPU has it if `simd` (else the scalar reference).
pub(crate) fn top_k_with(
    view: &PartitionView<'_>,
    column: u32,
    k: usize,
    largest: bool,
    pred: Option<&Range>,
    simd: bool,
) -> Vec<(u32, f64)> {
    if k == 0 {
        return Vec::new();
    }
    let col = Col::of(view, column);
    let sign = if largest { 1.0 } else { -1.0 };
    let mut best = Best::new(k, view.len());
    if let (true, Col::F64(v)) = (simd, col) {
        // A scalar table's predicate is on its only column, the one ranked.
        if avx2::scan(v, view, &mut best, sign, pred.map(|r| (r.lo, r.hi))) {
            return best.finish(sign);
        }
    }
    let filter = pred.map(|r| (Col::of(view, r.component), r.lo, r.hi));
    for i in 0..view.len() {
        let v = col.get(i);
        if v.is_nan() {
            continue;
        }
        if let Some((c, lo, hi)) = &filter {
            let x = c.get(i);
            if !(x >= *lo && x < *hi) {
                continue;
            }
        }
        best.offer(view, i, sign * v);
    }
    best.finish(sign)
}

/// The f64 column's pass with AVX2 intrinsics: four values at a time are compared with the
/// predicate and the heap's threshold at once; only a block with a candidate goes lane by lane to
/// the heap (after the first `k`, almost none does).
mod avx2 {
    use super::{Best, PartitionView};

    /// Offers every value of `v` (the column of `view`) selected by `pred` to `best`; false, having
    /// done nothing, on a CPU without AVX2 (the caller runs the scalar loop).
    pub(super) fn scan<'a>(
        v: &[f64],
        view: &PartitionView<'a>,
        best: &mut Best<'a>,
        sign: f64,
        pred: Option<(f64, f64)>,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::ops::simd::has_avx2_fma() {
            let (lo, hi) = pred.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { pass(v, view, best, sign, lo, hi, pred.is_none()) };
            return true;
        }
        let _ = (v, view, best, sign, pred);
        false
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pass<'a>(
        v: &[f64],
        view: &PartitionView<'a>,
        best: &mut Best<'a>,
        sign: f64,
        lo: f64,
        hi: f64,
        all: bool,
    ) {
        use std::arch::x86_64::*;
        let (lov, hiv, signv) = (_mm256_set1_pd(lo), _mm256_set1_pd(hi), _mm256_set1_pd(sign));
        // Without a predicate every value but NaN is in range (+inf included).
        let (lov, hiv) = if all {
            (_mm256_set1_pd(f64::NEG_INFINITY), _mm256_set1_pd(f64::NAN))
        } else {
            (lov, hiv)
        };
        let mut thr = _mm256_set1_pd(best.threshold());
        let mut chunks = v.chunks_exact(4);
        let mut base = 0;
        for ch in &mut chunks {
            // SAFETY: `ch` holds 4 values.
            let x = unsafe { _mm256_loadu_pd(ch.as_ptr()) };
            let score = _mm256_mul_pd(x, signv);
            // Ordered compares: a NaN value is never a candidate. `x < NaN` is false, so without
            // a predicate the upper test is `!(x >= NaN)`, true for every value.
            let upper = if all {
                _mm256_cmp_pd::<_CMP_NGE_UQ>(x, hiv)
            } else {
                _mm256_cmp_pd::<_CMP_LT_OQ>(x, hiv)
            };
            let m = _mm256_and_pd(
                _mm256_and_pd(_mm256_cmp_pd::<_CMP_GE_OQ>(x, lov), upper),
                _mm256_cmp_pd::<_CMP_GE_OQ>(score, thr),
            );
            let mut bits = _mm256_movemask_pd(m);
            if bits != 0 {
                while bits != 0 {
                    let j = bits.trailing_zeros() as usize;
                    best.offer(view, base + j, sign * ch[j]);
                    bits &= bits - 1;
                }
                thr = _mm256_set1_pd(best.threshold());
            }
            base += 4;
        }
        for (j, &x) in chunks.remainder().iter().enumerate() {
            if !x.is_nan() && (all || (x >= lo && x < hi)) {
                best.offer(view, base + j, sign * x);
            }
        }
    }
}
