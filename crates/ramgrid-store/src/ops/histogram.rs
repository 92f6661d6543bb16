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
    let dev = edges
        .iter()
        .enumerate()
        .map(|(i, &e)| (e - (first + width * i as f64)).abs())
        .fold(0.0, f64::max);
    let even = dev <= width * 1e-9;
    // One correction step suffices when rounding is far below a bin's width (numpy's reasoning).
    let fine = first.abs().max(last.abs()) * f64::EPSILON * 1024.0 < width && bins < 1 << 24;
    if let (true, true, Col::F64(v)) = (simd, even && fine, col) {
        // How far (in bins) the estimate `x / width - first / width` (one fused multiply-add) may
        // lie from x's true place among the edges: the edges' departure from even spacing and the
        // rounding of its measure above (of `first + width * i`), the rounding of `first / width`,
        // and the estimate's own roundings (relative, of at most bins + 1 for a value within the
        // edges), doubled for safety. An estimate farther than this from a whole number is exact.
        let eps = f64::EPSILON;
        let margin = 2.0
            * ((dev + 4.0 * eps * (first.abs() + last.abs())) / width
                + 4.0 * eps * (bins as f64 + 1.0));
        // A scalar table's predicate is on its only column, the one binned.
        let pred = pred.map(|r| (r.lo, r.hi));
        if margin < 0.25 && avx2::even(v, edges, width, margin, pred, &mut counts) {
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

/// Evenly spaced edges over an f64 column with AVX2 intrinsics, four values at a time: each bin is
/// estimated by one fused multiply-add and a floor, and taken as it is unless the estimate lies
/// within `margin` of a whole number; those (rare but for values on or next to an edge) are
/// corrected by one step against the edges themselves (loaded one by one: faster than AVX2's
/// gathers on the AMD machines measured). Values outside the edges (NaN, infinities) get bin -1
/// or `bins`, counted nowhere.
///
/// Counting then avoids scattered increments wherever the bins are few: with at most 16 bins each
/// lane keeps its counts as 4-bit fields of one 64-bit word and adds `1 << 4 b` (a shift of 64 or
/// more, for a value counted nowhere, adds nothing), the fields spread into bytes every 15 steps
/// and the bytes into the counts every few hundred. With more bins, value `j` of each eight adds
/// one to its own row of counts, so that increments of one bin by neighbouring values do not wait
/// on each other; the rows are summed at the end.
mod avx2 {
    /// Most bins counted in 4-bit fields of a 64-bit word.
    const FIELD_BINS: usize = 16;
    /// Rows of counts, one per value of each eight, while the bins are few enough for all of them
    /// to stay in the L1 cache (more bins make repeated increments of one bin rare anyway).
    const ROWS: usize = 8;
    const ROWS_UP_TO_BINS: usize = 511;

    /// Adds to `counts` the bins of the values of `v` selected by `pred` (`edges` evenly spaced by
    /// `width`, estimates exact farther than `margin` < 1/4 from a whole number); false, having
    /// done nothing, on a CPU without AVX2 and FMA (the caller runs the scalar loop).
    pub(super) fn even(
        v: &[f64],
        edges: &[f64],
        width: f64,
        margin: f64,
        pred: Option<(f64, f64)>,
        counts: &mut [u64],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::ops::simd::has_avx2_fma() {
            let bins = edges.len() - 1;
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe {
                let k = Lanes::new(edges, width, margin, pred);
                if bins <= FIELD_BINS {
                    fields(&k, v, counts);
                } else {
                    rows(&k, v, counts);
                }
            }
            // The values after the last whole four, as the scalar loop does.
            let (first, last) = (edges[0], edges[bins]);
            let (lo, hi) = pred.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
            for &x in &v[v.len() / 4 * 4..] {
                if x >= first && x <= last && x >= lo && (pred.is_none() || x < hi) {
                    counts[super::correct(((x - first) / width) as usize, x, edges)] += 1;
                }
            }
            return true;
        }
        let _ = (v, edges, width, margin, pred, counts);
        false
    }

    /// Counts in 4-bit fields (at most [`FIELD_BINS`] bins) of the whole fours of `v`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn fields(k: &Lanes, v: &[f64], counts: &mut [u64]) {
        use std::arch::x86_64::*;
        // Two words per step (eight values): a field takes at most 15 steps, a byte 8 spreads.
        const STEPS: usize = 15;
        const SPREADS: usize = 8;
        let nibbles = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi64x(1);
        let mut totals = [0u64; FIELD_BINS];
        // Bytes of the fields of even bins and of odd ones.
        let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let spill = |even: __m256i, odd: __m256i, totals: &mut [u64; FIELD_BINS]| {
            let (mut e, mut o) = ([0u8; 32], [0u8; 32]);
            // SAFETY: 32 bytes into arrays of 32.
            unsafe {
                _mm256_storeu_si256(e.as_mut_ptr().cast(), even);
                _mm256_storeu_si256(o.as_mut_ptr().cast(), odd);
            }
            // Byte i of a lane's word holds fields 2i and 2i + 1.
            for (i, (e, o)) in e.iter().zip(&o).enumerate() {
                totals[2 * (i % 8)] += u64::from(*e);
                totals[2 * (i % 8) + 1] += u64::from(*o);
            }
        };
        let mut spreads = 0;
        let whole = &v[..v.len() / 8 * 8];
        for group in whole.chunks(8 * STEPS) {
            let (mut w0, mut w1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for ch in group.chunks_exact(8) {
                // SAFETY: `ch` holds 8 values.
                let (x0, x1) = unsafe {
                    (
                        _mm256_loadu_pd(ch.as_ptr()),
                        _mm256_loadu_pd(ch.as_ptr().add(4)),
                    )
                };
                w0 = _mm256_add_epi64(w0, _mm256_sllv_epi64(one, k.shifts(k.bins(x0))));
                w1 = _mm256_add_epi64(w1, _mm256_sllv_epi64(one, k.shifts(k.bins(x1))));
            }
            let lo = _mm256_add_epi8(_mm256_and_si256(w0, nibbles), _mm256_and_si256(w1, nibbles));
            let hi = _mm256_add_epi8(
                _mm256_and_si256(_mm256_srli_epi64::<4>(w0), nibbles),
                _mm256_and_si256(_mm256_srli_epi64::<4>(w1), nibbles),
            );
            even = _mm256_add_epi8(even, lo);
            odd = _mm256_add_epi8(odd, hi);
            spreads += 1;
            if spreads == SPREADS {
                spill(even, odd, &mut totals);
                (even, odd, spreads) = (_mm256_setzero_si256(), _mm256_setzero_si256(), 0);
            }
        }
        spill(even, odd, &mut totals);
        // A last four, if any, on its own.
        let rest = &v[whole.len()..v.len() / 4 * 4];
        if !rest.is_empty() {
            // SAFETY: `rest` holds 4 values.
            let x = unsafe { _mm256_loadu_pd(rest.as_ptr()) };
            let w = _mm256_sllv_epi64(one, k.shifts(k.bins(x)));
            spill(
                _mm256_and_si256(w, nibbles),
                _mm256_and_si256(_mm256_srli_epi64::<4>(w), nibbles),
                &mut totals,
            );
        }
        for (c, t) in counts.iter_mut().zip(totals) {
            *c += t;
        }
    }

    /// Counts in rows of `u64` (any number of bins) of the whole fours of `v`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn rows(k: &Lanes, v: &[f64], counts: &mut [u64]) {
        use std::arch::x86_64::*;
        let bins = counts.len();
        // Slot 0 of a row takes the values below the edges (bin -1), slot `bins + 1` those above.
        let stride = bins + 2;
        let rows = if bins <= ROWS_UP_TO_BINS { ROWS } else { 1 };
        let mut tab = vec![0u64; rows * stride];
        // Bin -1 of value j goes to slot 0 of its row; `stride` * ROWS fits an i32 (bins < 2^24).
        let slot = |j: usize| ((j % rows) * stride + 1) as i32;
        let (s0, s1) = (
            _mm_setr_epi32(slot(0), slot(1), slot(2), slot(3)),
            _mm_setr_epi32(slot(4), slot(5), slot(6), slot(7)),
        );
        let mut at = [0i32; 8];
        let whole = &v[..v.len() / 4 * 4];
        let mut chunks = whole.chunks_exact(8);
        for ch in &mut chunks {
            // SAFETY: `ch` holds 8 values, `at` 8 i32.
            unsafe {
                let b0 = _mm256_cvttpd_epi32(k.bins(_mm256_loadu_pd(ch.as_ptr())));
                let b1 = _mm256_cvttpd_epi32(k.bins(_mm256_loadu_pd(ch.as_ptr().add(4))));
                _mm_storeu_si128(at.as_mut_ptr().cast(), _mm_add_epi32(b0, s0));
                _mm_storeu_si128(at.as_mut_ptr().add(4).cast(), _mm_add_epi32(b1, s1));
            }
            for &i in &at {
                debug_assert!((i as usize) < tab.len());
                // SAFETY: a bin is in -1..=bins (`Lanes::bins`) and `slot` adds 1 and a whole
                // row or none: in bounds of `tab`.
                unsafe { *tab.get_unchecked_mut(i as usize) += 1 };
            }
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            // SAFETY: `rest` holds 4 values (whole fours only), `at` 4 i32.
            unsafe {
                let b = _mm256_cvttpd_epi32(k.bins(_mm256_loadu_pd(rest.as_ptr())));
                _mm_storeu_si128(at.as_mut_ptr().cast(), _mm_add_epi32(b, s0));
            }
            for &i in &at[..4] {
                tab[i as usize] += 1;
            }
        }
        for (i, c) in counts.iter_mut().enumerate() {
            *c += (0..rows).map(|r| tab[r * stride + 1 + i]).sum::<u64>();
        }
    }

    /// The constants of the kernels, in registers.
    #[cfg(target_arch = "x86_64")]
    struct Lanes {
        edges: *const f64,
        /// `1 / width` and `first / width`: the estimate is `x * inv - offset`.
        inv: std::arch::x86_64::__m256d,
        offset: std::arch::x86_64::__m256d,
        /// Estimates whose distance from half a bin is above this are near an edge.
        far: std::arch::x86_64::__m256d,
        first: std::arch::x86_64::__m256d,
        last: std::arch::x86_64::__m256d,
        /// The predicate's bounds, if any.
        pred: Option<(std::arch::x86_64::__m256d, std::arch::x86_64::__m256d)>,
        /// -1 (counted nowhere), and the last bin + 1.
        below: std::arch::x86_64::__m256d,
        above: std::arch::x86_64::__m256d,
    }

    #[cfg(target_arch = "x86_64")]
    impl Lanes {
        #[target_feature(enable = "avx2,fma")]
        fn new(edges: &[f64], width: f64, margin: f64, pred: Option<(f64, f64)>) -> Lanes {
            use std::arch::x86_64::*;
            let bins = edges.len() - 1;
            let inv = 1.0 / width;
            Lanes {
                edges: edges.as_ptr(),
                inv: _mm256_set1_pd(inv),
                offset: _mm256_set1_pd(edges[0] * inv),
                far: _mm256_set1_pd(0.5 - margin),
                first: _mm256_set1_pd(edges[0]),
                last: _mm256_set1_pd(edges[bins]),
                pred: pred.map(|(lo, hi)| (_mm256_set1_pd(lo), _mm256_set1_pd(hi))),
                below: _mm256_set1_pd(-1.0),
                above: _mm256_set1_pd(bins as f64),
            }
        }

        /// The bins of four values as whole f64: 0..bins for a value counted, -1 or `bins` for
        /// one outside the edges (NaN, infinities) or the predicate.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        fn bins(&self, x: std::arch::x86_64::__m256d) -> std::arch::x86_64::__m256d {
            use std::arch::x86_64::*;
            let t = _mm256_fmsub_pd(x, self.inv, self.offset);
            let mut f = _mm256_floor_pd(t);
            // `t - f` is exact (Sterbenz: f and t within a factor of two unless t < 1); NaN for
            // NaN and infinities, never near.
            let half = _mm256_set1_pd(0.5);
            let sign = _mm256_set1_pd(-0.0);
            let off = _mm256_andnot_pd(sign, _mm256_sub_pd(_mm256_sub_pd(t, f), half));
            let near = _mm256_cmp_pd::<_CMP_GT_OQ>(off, self.far);
            if _mm256_movemask_pd(near) != 0 {
                f = self.exact(x, f, near);
            }
            // Far from an edge, f < 0 or f >= bins means outside the edges. `max` returns its
            // second operand for NaN: -1.
            f = _mm256_min_pd(_mm256_max_pd(f, self.below), self.above);
            if let Some((lo, hi)) = self.pred {
                let m = _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GE_OQ>(x, lo),
                    _mm256_cmp_pd::<_CMP_LT_OQ>(x, hi),
                );
                f = _mm256_blendv_pd(self.below, f, m);
            }
            f
        }

        /// `f` with the lanes `near` an edge replaced by their exact bins (or -1 outside the
        /// edges): the estimate, within one of the bin (`margin` < 1/4), moved by one step
        /// against the edges themselves, as the scalar loop does.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        fn exact(
            &self,
            x: std::arch::x86_64::__m256d,
            f: std::arch::x86_64::__m256d,
            near: std::arch::x86_64::__m256d,
        ) -> std::arch::x86_64::__m256d {
            use std::arch::x86_64::*;
            let one = _mm256_set1_pd(1.0);
            let top = _mm256_sub_pd(self.above, one);
            // 0..=bins-1 in every lane (NaN to 0), so both gathers read within the edges.
            let b = _mm256_min_pd(_mm256_max_pd(f, _mm256_setzero_pd()), top);
            let mut i = [0i32; 4];
            // SAFETY: 4 i32 into an array of 4; edges[b] and edges[b + 1] with 0 <= b < bins:
            // within the bins + 1 edges.
            let (lo, hi) = unsafe {
                _mm_storeu_si128(i.as_mut_ptr().cast(), _mm256_cvttpd_epi32(b));
                let e = |j: usize| *self.edges.add(i[j] as usize);
                let e1 = |j: usize| *self.edges.add(i[j] as usize + 1);
                (
                    _mm256_setr_pd(e(0), e(1), e(2), e(3)),
                    _mm256_setr_pd(e1(0), e1(1), e1(2), e1(3)),
                )
            };
            let down = _mm256_and_pd(_mm256_cmp_pd::<_CMP_LT_OQ>(x, lo), one);
            let up = _mm256_and_pd(
                _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GE_OQ>(x, hi),
                    _mm256_cmp_pd::<_CMP_LT_OQ>(b, top),
                ),
                one,
            );
            let b = _mm256_add_pd(_mm256_sub_pd(b, down), up);
            let inside = _mm256_and_pd(
                _mm256_cmp_pd::<_CMP_GE_OQ>(x, self.first),
                _mm256_cmp_pd::<_CMP_LE_OQ>(x, self.last),
            );
            _mm256_blendv_pd(f, _mm256_blendv_pd(self.below, b, inside), near)
        }

        /// The shift `4 b` of each bin `b` (f64 in -1..=bins) as a 64-bit integer: 0..=60 for a
        /// counted bin, 64 or more (adding nothing) for -1 and for 16, `4 bins` (a field that
        /// is not read) for any fewer bins.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        fn shifts(&self, b: std::arch::x86_64::__m256d) -> std::arch::x86_64::__m256i {
            use std::arch::x86_64::*;
            // 1.5 * 2^52 + 4 b is exact, its low bits 4 b in two's complement: 7 of them give
            // 0..=64 for b in 0..=16, 124 for -1.
            let magic = _mm256_set1_pd(6_755_399_441_055_744.0);
            let s = _mm256_fmadd_pd(b, _mm256_set1_pd(4.0), magic);
            _mm256_and_si256(_mm256_castpd_si256(s), _mm256_set1_epi64x(0x7F))
        }
    }
}
