//! The inner loops of the f32 vector kernels (dot products, scaled adds, squared distances), twice:
//! as plain loops of independent lanes ([`Scalar`]: the reference, and the fallback on other CPUs)
//! and with AVX2 and FMA intrinsics ([`Avx2Fma`], chosen at run time). A kernel (the LR gradient,
//! the k-means step) is written once over [`Lanes`] and built for each.
//!
//! Also the run-time CPU checks, [`Isa`] (which of them a kernel runs), and [`dispatch`], which
//! builds a plain loop for AVX2 as well.

/// Lanes of the reductions: two AVX2 registers of f32, so additions overlap.
const L: usize = 16;

/// `a · b` in f32 lanes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; L];
    let whole = n / L * L;
    for (ca, cb) in a[..whole].chunks_exact(L).zip(b[..whole].chunks_exact(L)) {
        for j in 0..L {
            acc[j] += ca[j] * cb[j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in whole..n {
        s += a[i] * b[i];
    }
    s
}

/// `y += a * x`.
#[inline(always)]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `|a - b|^2` in f32 lanes.
#[inline(always)]
pub(crate) fn dist2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; L];
    let whole = n / L * L;
    for (ca, cb) in a[..whole].chunks_exact(L).zip(b[..whole].chunks_exact(L)) {
        for j in 0..L {
            let d = ca[j] - cb[j];
            acc[j] += d * d;
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in whole..n {
        let d = a[i] - b[i];
        s += d * d;
    }
    s
}

/// The inner loops a kernel is written over.
pub(crate) trait Lanes: Copy {
    /// `a · b` (over the shorter of the two).
    fn dot(self, a: &[f32], b: &[f32]) -> f32;
    /// `y += a * x` (over the shorter of the two).
    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]);
    /// `|a - b|^2` (over the shorter of the two).
    fn dist2(self, a: &[f32], b: &[f32]) -> f32;
    /// `|a - b_j|^2` for four `b_j` as long as `a`, in one pass over `a`.
    fn dist2_4(self, a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        b.map(|b| self.dist2(a, b))
    }
}

/// The plain loops above.
#[derive(Clone, Copy)]
pub(crate) struct Scalar;

impl Lanes for Scalar {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        dot(a, b)
    }
    #[inline(always)]
    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]) {
        axpy(a, x, y)
    }
    #[inline(always)]
    fn dist2(self, a: &[f32], b: &[f32]) -> f32 {
        dist2(a, b)
    }
}

/// The loops with AVX2 and FMA intrinsics: eight floats per instruction, fused multiply-adds, four
/// accumulators so that successive additions overlap. A value exists only on a CPU that has both
/// ([`Avx2Fma::detect`]), which is what makes its methods safe; a kernel built over it must run in
/// a function with the same target features for them to be inlined.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Avx2Fma(());

#[cfg(target_arch = "x86_64")]
impl Avx2Fma {
    /// The token, if this CPU has AVX2 and FMA.
    pub(crate) fn detect() -> Option<Avx2Fma> {
        has_avx2_fma().then_some(Avx2Fma(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2Fma {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: an `Avx2Fma` exists only where the CPU has AVX2 and FMA.
        unsafe { avx2::dot(a, b) }
    }
    #[inline(always)]
    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]) {
        // SAFETY: as above.
        unsafe { avx2::axpy(a, x, y) }
    }
    #[inline(always)]
    fn dist2(self, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { avx2::dist2(a, b) }
    }
    #[inline(always)]
    fn dist2_4(self, a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { avx2::dist2_4(a, b) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The sum of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `Σ f(a_i, b_i, acc)` over the shorter slice in 4 accumulators of 8 lanes, then the lanes
    /// summed and the last values added one by one with `g`.
    #[inline(always)]
    fn reduce(
        a: &[f32],
        b: &[f32],
        f: impl Fn(__m256, __m256, __m256) -> __m256,
        g: impl Fn(f32, f32) -> f32,
    ) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        // SAFETY (all loads): each reads 8 floats from a chunk of at least that many.
        let load = |c: &[f32], at: usize| unsafe { _mm256_loadu_ps(c.as_ptr().add(at)) };
        // SAFETY: the callers have AVX (they run with AVX2 and FMA enabled).
        let mut acc = [unsafe { _mm256_setzero_ps() }; 4];
        let mut ca = a.chunks_exact(32);
        let mut cb = b.chunks_exact(32);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = f(load(x, 8 * j), load(y, 8 * j), *acc);
            }
        }
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ra.chunks_exact(8).zip(rb.chunks_exact(8)) {
            acc[0] = f(load(x, 0), load(y, 0), acc[0]);
        }
        // SAFETY: as above.
        let mut s = unsafe {
            sum(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ))
        };
        let done = ra.len() / 8 * 8;
        for (&x, &y) in ra[done..].iter().zip(&rb[done..]) {
            s += g(x, y);
        }
        s
    }

    /// `a · b`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        reduce(a, b, |x, y, acc| _mm256_fmadd_ps(x, y, acc), |x, y| x * y)
    }

    /// `|a - b|^2`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dist2(a: &[f32], b: &[f32]) -> f32 {
        reduce(
            a,
            b,
            |x, y, acc| {
                let d = _mm256_sub_ps(x, y);
                _mm256_fmadd_ps(d, d, acc)
            },
            |x, y| (x - y) * (x - y),
        )
    }

    /// `|a - b_j|^2` for four `b_j`: each 8 floats of `a` loaded once, 8 independent sums (two
    /// per `b_j`) so that the fused multiply-adds overlap, where one distance at a time would wait
    /// on its own additions.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dist2_4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let n = b.iter().fold(a.len(), |n, b| n.min(b.len()));
        let whole = n / 16 * 16;
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let mut i = 0;
        while i < whole {
            // SAFETY: i + 16 <= whole <= the length of `a` and of each `b_j`.
            unsafe {
                let x = [
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                ];
                for (acc, b) in acc.iter_mut().zip(b) {
                    for h in 0..2 {
                        let d = _mm256_sub_ps(x[h], _mm256_loadu_ps(b.as_ptr().add(i + 8 * h)));
                        acc[h] = _mm256_fmadd_ps(d, d, acc[h]);
                    }
                }
            }
            i += 16;
        }
        let mut out = [0f32; 4];
        for ((o, acc), b) in out.iter_mut().zip(acc).zip(b) {
            *o = sum(_mm256_add_ps(acc[0], acc[1]));
            for (&x, &y) in a[whole..n].iter().zip(&b[whole..n]) {
                *o += (x - y) * (x - y);
            }
        }
        out
    }

    /// `y += a * x`, fused.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let av = _mm256_set1_ps(a);
        let n = x.len().min(y.len());
        let (x, y) = (&x[..n], &mut y[..n]);
        let mut cx = x.chunks_exact(8);
        let mut cy = y.chunks_exact_mut(8);
        for (x, y) in (&mut cx).zip(&mut cy) {
            // SAFETY: 8 floats read from and written to chunks of 8.
            unsafe {
                let v =
                    _mm256_fmadd_ps(av, _mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
                _mm256_storeu_ps(y.as_mut_ptr(), v);
            }
        }
        for (y, &x) in cy.into_remainder().iter_mut().zip(cx.remainder()) {
            *y = a.mul_add(x, *y);
        }
    }
}

/// Whether this CPU runs the AVX2 builds of the kernels.
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the kernels written with AVX2 and FMA intrinsics (checked once, then a
/// cached load).
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the kernels written with AVX-512F intrinsics (checked once, then a cached
/// load).
pub(crate) fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The instruction sets a kernel may be written for. Only the stats kernel has all three; the
/// others choose between their AVX2 and FMA build and the plain loops with a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The plain loops: the reference, and the fallback on any CPU.
    Scalar,
    /// AVX2 and FMA: four f64 lanes a register.
    Avx2Fma,
    /// AVX-512F: eight f64 lanes a register, and mask registers for predicates and tails.
    Avx512F,
}

impl Isa {
    /// All of them, narrowest first.
    #[cfg(test)]
    pub(crate) const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2Fma, Isa::Avx512F];

    /// The widest this CPU runs: AVX-512F, else AVX2 and FMA, else the plain loops.
    pub(crate) fn best() -> Isa {
        if has_avx512f() {
            Isa::Avx512F
        } else if has_avx2_fma() {
            Isa::Avx2Fma
        } else {
            Isa::Scalar
        }
    }

    /// Whether this CPU runs the kernels written for `self`.
    #[cfg(test)]
    pub(crate) fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2Fma => has_avx2_fma(),
            Isa::Avx512F => has_avx512f(),
        }
    }
}

/// Defines `$name` running `$body` (an `#[inline(always)]` fn) built for AVX2 when the CPU has it.
macro_rules! dispatch {
    ($vis:vis fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $body:path) => {
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn wide($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                if $crate::ops::simd::has_avx2() {
                    // SAFETY: the CPU has AVX2 (checked just above), all `wide` needs.
                    return unsafe { wide($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use dispatch;
