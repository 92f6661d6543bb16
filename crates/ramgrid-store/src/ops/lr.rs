//! LR_GRADIENT: the logistic-regression loss and gradient over f32-vector rows whose last component
//! is the label (0 or 1; a value between is taken as a probability).
//!
//! Per row `x` (features) and `y` (label): `z = w·x + b`, `p = 1 / (1 + e^-z)`; the loss is
//! `log(1 + e^z) - y z` (computed without overflow) and the gradient `(p - y) (x, 1)`. The dot
//! product and the gradient's accumulation run in f32 lanes (the rows are f32); the gradient is
//! carried into f64 every [`FLUSH`] rows and the loss is summed in f64.

use super::simd::{axpy, dispatch, dot};
use crate::tables::PartitionView;

/// Rows accumulated in f32 before the gradient is added into its f64 sum.
const FLUSH: usize = 256;

/// `(rows, summed loss, summed gradient: coefficients then intercept)` (`weights` validated).
pub(crate) fn gradient(view: &PartitionView<'_>, weights: &[f64]) -> (u64, f64, Vec<f64>) {
    let dim = weights.len();
    let data = view.column_f32().unwrap_or_default();
    debug_assert!(dim >= 2);
    kernel(data, weights)
}

dispatch!(fn kernel(data: &[f32], weights: &[f64]) -> (u64, f64, Vec<f64>) => body);

#[inline(always)]
fn body(data: &[f32], weights: &[f64]) -> (u64, f64, Vec<f64>) {
    let dim = weights.len();
    let d = dim - 1;
    let w: Vec<f32> = weights[..d].iter().map(|&x| x as f32).collect();
    let b = weights[d];
    let mut g64 = vec![0f64; dim];
    let mut g32 = vec![0f32; d];
    let (mut gb, mut loss, mut rows) = (0f64, 0f64, 0u64);
    for (i, row) in data.chunks_exact(dim).enumerate() {
        let (x, y) = (&row[..d], f64::from(row[d]));
        let z = f64::from(dot(&w, x)) + b;
        // softplus(z) = max(z, 0) + ln(1 + e^-|z|), never overflowing.
        loss += z.max(0.0) + (-z.abs()).exp().ln_1p() - y * z;
        let p = if z >= 0.0 {
            1.0 / (1.0 + (-z).exp())
        } else {
            let e = z.exp();
            e / (1.0 + e)
        };
        let err = p - y;
        axpy(err as f32, x, &mut g32);
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
