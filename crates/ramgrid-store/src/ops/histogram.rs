//! HISTOGRAM: counts of one numeric column's values per bin of given edges, as numpy's
//! `histogram`: bins `[e_i, e_i+1)`, the last one closed `[e_n-1, e_n]`; values outside the edges
//! (and NaN) are not counted.

use super::{Col, Range};
use crate::tables::PartitionView;

/// Bin counts of column `column` over the items selected by `pred` (`edges` validated).
pub(crate) fn histogram(
    view: &PartitionView<'_>,
    column: u32,
    pred: Option<&Range>,
    edges: &[f64],
) -> Vec<u64> {
    histogram_with(view, column, pred, edges, true)
}

/// [`histogram`], with the intrinsics kernel where the CPU has it if `simd` (else the scalar
/// reference).
pub(crate) fn histogram_with(
    view: &PartitionView<'_>,
    column: u32,
    pred: Option<&Range>,
    edges: &[f64],
    simd: bool,
) -> Vec<u64> {
    let bins = edges.len() - 1;
    let mut counts = vec![0u64; bins];
    let col = Col::of(view, column);
    let sel = pred.map(|r| (Col::of(view, r.component), r.lo, r.hi));
    let (first, last) = (edges[0], edges[bins]);
    // Evenly spaced edges (the usual `linspace`) find the bin by arithmetic, then correct by one
    // against the edges themselves, so the answer is the edges' exactly.
    let width = (last - first) / bins as f64;
    let even = edges
        .iter()
        .enumerate()
        .all(|(i, &e)| (e - (first + width * i as f64)).abs() <= width * 1e-9);
    // One correction step suffices when rounding is far below a bin's width (numpy's reasoning).
    let fine = first.abs().max(last.abs()) * f64::EPSILON * 1024.0 < width && bins < 1 << 24;
    if let (true, true, Col::F64(v)) = (simd, even && fine, col) {
        // A scalar table's predicate is on its only column, the one binned.
        let pred = pred.map(|r| (r.lo, r.hi));
        if avx2::even(v, edges, width, pred, &mut counts) {
            return counts;
        }
    }
    for i in 0..view.len() {
        if let Some((c, lo, hi)) = sel {
            let y = c.get(i);
            if !(y >= lo && y < hi) {
                continue;
            }
        }
        let x = col.get(i);
        if !(x >= first && x <= last) {
            continue;
        }
        let b = if even {
            correct(((x - first) / width) as usize, x, edges)
        } else {
            // First edge above x, minus one; x == last belongs to the last bin.
            edges
                .partition_point(|&e| e <= x)
                .saturating_sub(1)
                .min(bins - 1)
        };
        counts[b] += 1;
    }
    counts
}

/// The bin of `x` (within the edges) from its estimate `b`: moved down or up against the edges
/// themselves, so the answer is the edges' exactly.
#[inline(always)]
fn correct(b: usize, x: f64, edges: &[f64]) -> usize {
    let bins = edges.len() - 1;
    let mut b = b.min(bins - 1);
    while b > 0 && x < edges[b] {
        b -= 1;
    }
    while b + 1 < bins && x >= edges[b + 1] {
        b += 1;
    }
    b
}

/// Evenly spaced edges over an f64 column with AVX2 intrinsics: four values at a time are tested
/// against the edges' span (and the predicate) and their bins estimated by one multiply; each
/// selected value's bin is then corrected against the edges and counted, lane `j` in its own row
/// of counts so that increments of one bin by neighbouring values do not wait on each other.
mod avx2 {
    /// Adds to `counts` the bins of the values of `v` selected by `pred` (`edges` evenly spaced by
    /// `width`); false, having done nothing, on a CPU without AVX2 (the caller runs the scalar loop).
    pub(super) fn even(
        v: &[f64],
        edges: &[f64],
        width: f64,
        pred: Option<(f64, f64)>,
        counts: &mut [u64],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::ops::simd::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { pass(v, edges, width, pred, counts) };
            return true;
        }
        let _ = (v, edges, width, pred, counts);
        false
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pass(
        v: &[f64],
        edges: &[f64],
        width: f64,
        pred: Option<(f64, f64)>,
        counts: &mut [u64],
    ) {
        use std::arch::x86_64::*;
        let bins = edges.len() - 1;
        let (first, last) = (edges[0], edges[bins]);
        // The predicate and the edges' span together: first <= x <= last and lo <= x < hi.
        let (lo, hi) = pred.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
        let (lov, hiv) = (_mm256_set1_pd(lo.max(first)), _mm256_set1_pd(hi));
        let lastv = _mm256_set1_pd(last);
        let firstv = _mm256_set1_pd(first);
        let inv = _mm256_set1_pd(1.0 / width);
        let open_hi = pred.is_none();
        // Row j counts lane j's values; slot `bins` of each row takes the unselected ones.
        let row = bins + 1;
        let mut rows = vec![0u64; 4 * row];
        let mut chunks = v.chunks_exact(4);
        for ch in &mut chunks {
            // SAFETY: `ch` holds 4 values.
            let x = unsafe { _mm256_loadu_pd(ch.as_ptr()) };
            let mut m = _mm256_and_pd(
                _mm256_cmp_pd::<_CMP_GE_OQ>(x, lov),
                _mm256_cmp_pd::<_CMP_LE_OQ>(x, lastv),
            );
            if !open_hi {
                m = _mm256_and_pd(m, _mm256_cmp_pd::<_CMP_LT_OQ>(x, hiv));
            }
            let bits = _mm256_movemask_pd(m);
            if bits == 0 {
                continue;
            }
            // Estimates (garbage for unselected lanes: NaN, outside the span; masked below).
            let est = _mm256_cvttpd_epi32(_mm256_mul_pd(_mm256_sub_pd(x, firstv), inv));
            let mut b = [0i32; 4];
            // SAFETY: four i32 into an array of four.
            unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), est) };
            for j in 0..4 {
                let sel = (bits >> j) & 1 == 1;
                rows[j * row + step(sel, b[j] as u32 as usize, ch[j], edges)] += 1;
            }
        }
        for &x in chunks.remainder() {
            if x >= first && x <= last && x >= lo && (open_hi || x < hi) {
                let b = super::correct(((x - first) / width) as usize, x, edges);
                rows[b] += 1;
            }
        }
        for (i, c) in counts.iter_mut().enumerate() {
            *c += rows[i] + rows[row + i] + rows[2 * row + i] + rows[3 * row + i];
        }
    }

    /// The bin of a selected `x` from its estimate `b`, corrected by one step against the edges as
    /// numpy's `histogram` does for even bins (the estimate is off by at most one); `bins` (the
    /// discard slot) for an unselected one. No branch: a selected lane is as likely as not.
    #[inline(always)]
    fn step(sel: bool, b: usize, x: f64, edges: &[f64]) -> usize {
        let bins = edges.len() - 1;
        let b = b.min(bins - 1) * usize::from(sel);
        let b = b.saturating_sub(usize::from(x < edges[b]));
        let b = b + usize::from((x >= edges[b + 1]) & (b + 1 < bins));
        if sel {
            b
        } else {
            bins
        }
    }
}
