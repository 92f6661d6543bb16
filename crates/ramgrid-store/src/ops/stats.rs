//! STATS: count, sum, min, max, mean and the sum of squared deviations of one numeric column.
//!
//! One pass, shifted by the first value `K` (sums of `x - K` and `(x - K)^2`): as exact as two
//! passes when the values sit far from 0 relative to their spread, at one pass's cost. Partials
//! merge with Chan et al.'s pairwise update on the client.

use super::simd::{dispatch, Isa};
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

/// Per-lane partial sums; [`Acc::finish`] folds the lanes.
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
    stats_with(view, column, pred, Isa::best())
}

/// [`stats`], with the f64 column's pass written for `isa` (the scalar reference for
/// [`Isa::Scalar`], and for an `isa` this CPU lacks). Other column types run the plain loops.
pub(crate) fn stats_with(
    view: &PartitionView<'_>,
    column: u32,
    pred: Option<&Range>,
    isa: Isa,
) -> StatsPartial {
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
        (Col::F64(v), None) => acc = f64_pass(v, k, None, isa).unwrap_or_else(|| f64_all(v, k)),
        (Col::F64(v), Some((Col::F64(_), lo, hi))) => {
            acc = f64_pass(v, k, Some((lo, hi)), isa).unwrap_or_else(|| f64_range(v, k, lo, hi))
        }
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

/// The f64 column's pass with the intrinsics of `isa`; `None` (the caller runs the scalar loop) for
/// [`Isa::Scalar`] or an `isa` this CPU lacks.
fn f64_pass(v: &[f64], k: f64, pred: Option<(f64, f64)>, isa: Isa) -> Option<Acc> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx2Fma => avx2::stats(v, k, pred),
        Isa::Avx512F => avx512::stats(v, k, pred),
    }
}

/// The statistics of `v` (selected by `lo <= x < hi` when `pred` is given) with the pass for `isa`,
/// shifted as [`stats_with`] shifts: the kernels over a plain slice, so that tests can start it at
/// every alignment (a table's column starts where its allocation does).
#[cfg(test)]
pub(crate) fn f64_stats(v: &[f64], pred: Option<(f64, f64)>, isa: Isa) -> StatsPartial {
    let k = v
        .iter()
        .copied()
        .find(|&x| pred.is_none_or(|(lo, hi)| (lo..hi).contains(&x)))
        .unwrap_or(0.0);
    let k = if k.is_finite() { k } else { 0.0 };
    f64_pass(v, k, pred, isa)
        .unwrap_or_else(|| match pred {
            None => f64_all(v, k),
            Some((lo, hi)) => f64_range(v, k, lo, hi),
        })
        .finish(k)
}

// The scalar reference loops (and the fallback without AVX2 and FMA), built for AVX2 too (`simd.rs`).
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

/// The f64 column's pass written with AVX2 and FMA intrinsics: two sets of four lanes (eight values
/// per step, so the additions' latencies overlap), the predicate as a compare mask that zeroes the
/// unselected values (never a multiply by 0: an infinite value outside the predicate stays out of
/// the sums) and sends them to +-inf for the extremes, as [`Acc::add`] does lane by lane.
mod avx2 {
    use super::{Acc, L};

    /// The statistics of `v` shifted by `k` (selected by `lo <= x < hi` when `pred` is given);
    /// `None` on a CPU without AVX2 and FMA (the caller runs the scalar loop).
    pub(super) fn stats(v: &[f64], k: f64, pred: Option<(f64, f64)>) -> Option<Acc> {
        #[cfg(target_arch = "x86_64")]
        if crate::ops::simd::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return Some(unsafe {
                match pred {
                    None => pass::<true>(v, k, 0.0, 0.0),
                    Some((lo, hi)) => pass::<false>(v, k, lo, hi),
                }
            });
        }
        let _ = (v, k, pred);
        None
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pass<const ALL: bool>(v: &[f64], k: f64, lo: f64, hi: f64) -> Acc {
        use std::arch::x86_64::*;
        let (kv, lov, hiv) = (_mm256_set1_pd(k), _mm256_set1_pd(lo), _mm256_set1_pd(hi));
        let (inf, ninf) = (
            _mm256_set1_pd(f64::INFINITY),
            _mm256_set1_pd(f64::NEG_INFINITY),
        );
        let zero = _mm256_setzero_pd();
        let mut n = [_mm256_setzero_si256(); 2];
        let (mut s, mut d, mut d2) = ([zero; 2], [zero; 2], [zero; 2]);
        let (mut mn, mut mx) = ([inf; 2], [ninf; 2]);
        let mut chunks = v.chunks_exact(2 * L);
        for ch in &mut chunks {
            for u in 0..2 {
                // SAFETY: `ch` holds 8 values; lanes 4u..4u+4 are in it.
                let x = unsafe { _mm256_loadu_pd(ch.as_ptr().add(L * u)) };
                let dx = _mm256_sub_pd(x, kv);
                if ALL {
                    s[u] = _mm256_add_pd(s[u], x);
                    d[u] = _mm256_add_pd(d[u], dx);
                    d2[u] = _mm256_fmadd_pd(dx, dx, d2[u]);
                    // min_pd(a, b) gives b when either is NaN: a NaN value leaves the extremes, as
                    // f64::min does.
                    mn[u] = _mm256_min_pd(x, mn[u]);
                    mx[u] = _mm256_max_pd(x, mx[u]);
                } else {
                    // Ordered compares: NaN is never selected.
                    let m = _mm256_and_pd(
                        _mm256_cmp_pd::<_CMP_GE_OQ>(x, lov),
                        _mm256_cmp_pd::<_CMP_LT_OQ>(x, hiv),
                    );
                    // A selected lane's mask is all ones: -1 as an integer.
                    n[u] = _mm256_sub_epi64(n[u], _mm256_castpd_si256(m));
                    let dx = _mm256_and_pd(dx, m);
                    s[u] = _mm256_add_pd(s[u], _mm256_and_pd(x, m));
                    d[u] = _mm256_add_pd(d[u], dx);
                    d2[u] = _mm256_fmadd_pd(dx, dx, d2[u]);
                    mn[u] = _mm256_min_pd(_mm256_blendv_pd(inf, x, m), mn[u]);
                    mx[u] = _mm256_max_pd(_mm256_blendv_pd(ninf, x, m), mx[u]);
                }
            }
        }
        let whole = (v.len() - chunks.remainder().len()) as u64;
        let lanes = |a: __m256d, b: __m256d, f: fn(f64, f64) -> f64| -> [f64; L] {
            let (mut x, mut y) = ([0.0; L], [0.0; L]);
            // SAFETY: two arrays of four f64, written whole.
            unsafe {
                _mm256_storeu_pd(x.as_mut_ptr(), a);
                _mm256_storeu_pd(y.as_mut_ptr(), b);
            }
            std::array::from_fn(|j| f(x[j], y[j]))
        };
        let add = |a: f64, b: f64| a + b;
        let mut acc = Acc::new();
        acc.s = lanes(s[0], s[1], add);
        acc.d = lanes(d[0], d[1], add);
        acc.d2 = lanes(d2[0], d2[1], add);
        acc.min = lanes(mn[0], mn[1], f64::min);
        acc.max = lanes(mx[0], mx[1], f64::max);
        if ALL {
            acc.n[0] = whole;
        } else {
            let (mut a, mut b) = ([0u64; L], [0u64; L]);
            // SAFETY: two arrays of four u64, written whole.
            unsafe {
                _mm256_storeu_si256(a.as_mut_ptr().cast(), n[0]);
                _mm256_storeu_si256(b.as_mut_ptr().cast(), n[1]);
            }
            acc.n = std::array::from_fn(|j| a[j] + b[j]);
        }
        for &x in chunks.remainder() {
            acc.add(0, ALL || ((x >= lo) & (x < hi)), x, k);
        }
        acc
    }
}

/// The f64 column's pass written with AVX-512F intrinsics: two sets of eight lanes (sixteen values
/// per step). The predicate is a mask register (two ordered compares, so NaN is never selected)
/// that the additions, the fused multiply-add and the extremes take as their write mask: an
/// unselected lane keeps its partial untouched, which is what [`Acc::add`]'s adding +0.0 and
/// taking the extreme with +-inf amount to (a lane's sum starts at +0.0, so it is never -0.0 and
/// adding +0.0 changes nothing). The values before the first 64-byte boundary (0-7) and the last
/// ones (fewer than sixteen) are loaded with a mask of the lanes that exist, so head and tail run
/// the same instructions, with no scalar loop; the main loop's loads are aligned (unaligned, each
/// spans two cache lines, and on the Zen 5 this was measured on the pass over 10 M values from
/// memory took twice as long as the AVX2 one: benchmarks/results/kernels.txt).
mod avx512 {
    use super::Acc;

    /// The statistics of `v` shifted by `k` (selected by `lo <= x < hi` when `pred` is given);
    /// `None` on a CPU without AVX-512F (the caller runs the scalar loop).
    pub(super) fn stats(v: &[f64], k: f64, pred: Option<(f64, f64)>) -> Option<Acc> {
        #[cfg(target_arch = "x86_64")]
        if crate::ops::simd::has_avx512f() {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return Some(unsafe {
                match pred {
                    None => pass::<true>(v, k, 0.0, 0.0),
                    Some((lo, hi)) => pass::<false>(v, k, lo, hi),
                }
            });
        }
        let _ = (v, k, pred);
        None
    }

    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::*;

    /// Eight lanes a register.
    #[cfg(target_arch = "x86_64")]
    const W: usize = 8;

    /// The partials of one pass: two sets of eight lanes, and the count.
    #[cfg(target_arch = "x86_64")]
    struct Sums {
        n: u64,
        s: [__m512d; 2],
        d: [__m512d; 2],
        d2: [__m512d; 2],
        min: [__m512d; 2],
        max: [__m512d; 2],
    }

    #[cfg(target_arch = "x86_64")]
    impl Sums {
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn new() -> Sums {
            let zero = _mm512_setzero_pd();
            Sums {
                n: 0,
                s: [zero; 2],
                d: [zero; 2],
                d2: [zero; 2],
                min: [_mm512_set1_pd(f64::INFINITY); 2],
                max: [_mm512_set1_pd(f64::NEG_INFINITY); 2],
            }
        }

        /// Adds the eight values `x` to set `u`.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn add(&mut self, u: usize, x: __m512d, k: __m512d) {
            let dx = _mm512_sub_pd(x, k);
            self.n += W as u64;
            self.s[u] = _mm512_add_pd(self.s[u], x);
            self.d[u] = _mm512_add_pd(self.d[u], dx);
            self.d2[u] = _mm512_fmadd_pd(dx, dx, self.d2[u]);
            // min_pd(a, b) gives b when either is NaN: a NaN value leaves the extremes, as
            // f64::min does (and as the AVX2 pass's min_pd).
            self.min[u] = _mm512_min_pd(x, self.min[u]);
            self.max[u] = _mm512_max_pd(x, self.max[u]);
        }

        /// Adds the lanes of `x` set in `m` to set `u`; the others leave every partial as it is.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn add_masked(&mut self, u: usize, x: __m512d, k: __m512d, m: __mmask8) {
            let dx = _mm512_sub_pd(x, k);
            self.n += u64::from(m.count_ones());
            self.s[u] = _mm512_mask_add_pd(self.s[u], m, self.s[u], x);
            self.d[u] = _mm512_mask_add_pd(self.d[u], m, self.d[u], dx);
            self.d2[u] = _mm512_mask3_fmadd_pd(dx, dx, self.d2[u], m);
            self.min[u] = _mm512_mask_min_pd(self.min[u], m, x, self.min[u]);
            self.max[u] = _mm512_mask_max_pd(self.max[u], m, x, self.max[u]);
        }

        /// The sixteen lanes folded into [`Acc`]'s four (lane `j` of `Acc` gets lanes `j` and
        /// `j + 4` of both sets).
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn finish(&self) -> Acc {
            let lanes = |v: [__m512d; 2], f: fn(f64, f64) -> f64| -> [f64; 4] {
                let (mut a, mut b) = ([0.0; W], [0.0; W]);
                // SAFETY: two arrays of eight f64, written whole.
                unsafe {
                    _mm512_storeu_pd(a.as_mut_ptr(), v[0]);
                    _mm512_storeu_pd(b.as_mut_ptr(), v[1]);
                }
                std::array::from_fn(|j| f(f(a[j], a[j + 4]), f(b[j], b[j + 4])))
            };
            let add = |a: f64, b: f64| a + b;
            let mut acc = Acc::new();
            acc.n[0] = self.n;
            acc.s = lanes(self.s, add);
            acc.d = lanes(self.d, add);
            acc.d2 = lanes(self.d2, add);
            acc.min = lanes(self.min, f64::min);
            acc.max = lanes(self.max, f64::max);
            acc
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn pass<const ALL: bool>(v: &[f64], k: f64, lo: f64, hi: f64) -> Acc {
        let (kv, lov, hiv) = (_mm512_set1_pd(k), _mm512_set1_pd(lo), _mm512_set1_pd(hi));
        // Ordered compares: NaN is never selected; the first compare's mask is the second's write
        // mask, so `m` is both.
        let select = |x: __m512d, m: __mmask8| -> __mmask8 {
            if ALL {
                m
            } else {
                let ge = _mm512_mask_cmp_pd_mask::<_CMP_GE_OQ>(m, x, lov);
                _mm512_mask_cmp_pd_mask::<_CMP_LT_OQ>(ge, x, hiv)
            }
        };
        let mut sums = Sums::new();
        // The first 0-7 values, up to a 64-byte boundary, as a masked load: the loads of the main
        // loop are then aligned (an unaligned one spans two cache lines).
        let (head, v) = v.split_at(v.as_ptr().align_offset(64).min(v.len()));
        if !head.is_empty() {
            let m = u8::MAX >> (W - head.len());
            // SAFETY: the masked load reads only the `head.len()` lanes set in `m`, all in `head`.
            let x = unsafe { _mm512_maskz_loadu_pd(m, head.as_ptr()) };
            sums.add_masked(1, x, kv, select(x, m));
        }
        let mut chunks = v.chunks_exact(2 * W);
        for ch in &mut chunks {
            for u in 0..2 {
                // SAFETY: `ch` holds 16 values; lanes 8u..8u+8 are in it.
                let x = unsafe { _mm512_loadu_pd(ch.as_ptr().add(W * u)) };
                if ALL {
                    sums.add(u, x, kv);
                } else {
                    sums.add_masked(u, x, kv, select(x, !0));
                }
            }
        }
        // The last 0 to 15 values: up to two loads of the lanes that exist (the others read as
        // 0.0 and are never selected).
        for (u, tail) in chunks.remainder().chunks(W).enumerate() {
            let m = u8::MAX >> (W - tail.len());
            // SAFETY: the masked load reads only the `tail.len()` lanes set in `m`, all in `tail`.
            let x = unsafe { _mm512_maskz_loadu_pd(m, tail.as_ptr()) };
            sums.add_masked(u, x, kv, select(x, m));
        }
        sums.finish()
    }
}
