//! LR_GRADIENT: the logistic-regression loss and gradient over f32-vector rows whose last component
//! is the label (0 or 1; a value between is taken as a probability).
//!
//! Per row `x` (features) and `y` (label): `z = w·x + b`, `p = 1 / (1 + e^-z)`; the loss is
//! `log(1 + e^z) - y z` (computed without overflow) and the gradient `(p - y) (x, 1)`. The dot
//! product and the gradient's accumulation run in f32 lanes (the rows are f32); the gradient is
//! carried into f64 every [`FLUSH`] rows and the loss is summed in f64.

use super::simd::{Lanes, Scalar};
use crate::tables::PartitionView;

/// Rows accumulated in f32 before the gradient is added into its f64 sum.
const FLUSH: usize = 256;

/// `(rows, summed loss, summed gradient: coefficients then intercept)` (`weights` validated).
pub(crate) fn gradient(view: &PartitionView<'_>, weights: &[f64]) -> (u64, f64, Vec<f64>) {
    gradient_with(view, weights, true)
}

/// [`gradient`], with the AVX2 and FMA loops where the CPU has them if `simd` (else the plain
/// loops, the reference).
pub(crate) fn gradient_with(
    view: &PartitionView<'_>,
    weights: &[f64],
    simd: bool,
) -> (u64, f64, Vec<f64>) {
    debug_assert!(weights.len() >= 2);
    let data = view.column_f32().unwrap_or_default();
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(l)) = (simd, super::simd::Avx2Fma::detect()) {
        // SAFETY: `l` exists only where the CPU has AVX2 and FMA.
        return unsafe { wide(l, data, weights) };
    }
    body(Scalar, data, weights)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn wide(l: super::simd::Avx2Fma, data: &[f32], weights: &[f64]) -> (u64, f64, Vec<f64>) {
    body(l, data, weights)
}

#[inline(always)]
fn body(l: impl Lanes, data: &[f32], weights: &[f64]) -> (u64, f64, Vec<f64>) {
    let dim = weights.len();
    let d = dim - 1;
    let w: Vec<f32> = weights[..d].iter().map(|&x| x as f32).collect();
    let b = weights[d];
    let mut g64 = vec![0f64; dim];
    let mut g32 = vec![0f32; d];
    let (mut gb, mut loss, mut rows) = (0f64, 0f64, 0u64);
    for (i, row) in data.chunks_exact(dim).enumerate() {
        let (x, y) = (&row[..d], f64::from(row[d]));
        let z = f64::from(l.dot(&w, x)) + b;
        // softplus(z) = max(z, 0) + ln(1 + e^-|z|), never overflowing; the sigmoid from the same
        // e^-|z| (one exp a row, not two: the transcendental calls cost more than the row's
        // vector work).
        let e = (-z.abs()).exp();
        loss += z.max(0.0) + e.ln_1p() - y * z;
        let p = if z >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
        let err = p - y;
        l.axpy(err as f32, x, &mut g32);
        gb += err;
        rows += 1;
        if (i + 1) % FLUSH == 0 {
            for (a, c) in g64.iter_mut().zip(g32.iter_mut()) {
                *a += f64::from(*c);
                *c = 0.0;
            }
        }
    }
    for (a, c) in g64.iter_mut().zip(&g32) {
        *a += f64::from(*c);
    }
    g64[d] = gb;
    (rows, loss, g64)
}
