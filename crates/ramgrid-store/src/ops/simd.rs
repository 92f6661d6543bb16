//! The inner loops of the vector kernels (dot products, scaled adds, squared distances), written as
//! independent lanes so that LLVM vectorizes them, and compiled twice: for the baseline target and,
//! chosen at run time, for AVX2 (8 floats per instruction instead of 4).

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
