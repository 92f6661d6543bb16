//! KMEANS_STEP: for given centroids, each row's nearest one (on the row's first `components`
//! components; ties to the lower index), and per centroid the count and sum of its rows, with the
//! summed squared distance (the inertia). The client divides sums by counts for the next centroids.

use super::simd::{Lanes, Scalar};
use crate::tables::PartitionView;

/// `(counts, sums: k × components, inertia)` (`centroids` validated: k × components).
pub(crate) fn step(
    view: &PartitionView<'_>,
    components: usize,
    centroids: &[f64],
) -> (Vec<u64>, Vec<f64>, f64) {
    step_with(view, components, centroids, true)
}

/// [`step`], with the AVX2 and FMA loops where the CPU has them if `simd` (else the plain loops,
/// the reference).
pub(crate) fn step_with(
    view: &PartitionView<'_>,
    components: usize,
    centroids: &[f64],
    simd: bool,
) -> (Vec<u64>, Vec<f64>, f64) {
    let dim = match view.value_type() {
        crate::tables::ValueType::F32Vec { dim } => dim as usize,
        _ => components,
    };
    let data = view.column_f32().unwrap_or_default();
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(l)) = (simd, super::simd::Avx2Fma::detect()) {
        // SAFETY: `l` exists only where the CPU has AVX2 and FMA.
        return unsafe { wide(l, data, dim, components, centroids) };
    }
    body(Scalar, data, dim, components, centroids)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn wide(
    l: super::simd::Avx2Fma,
    data: &[f32],
    dim: usize,
    c: usize,
    centroids: &[f64],
) -> (Vec<u64>, Vec<f64>, f64) {
    body(l, data, dim, c, centroids)
}

#[inline(always)]
fn body(
    l: impl Lanes,
    data: &[f32],
    dim: usize,
    c: usize,
    centroids: &[f64],
) -> (Vec<u64>, Vec<f64>, f64) {
    let k = centroids.len() / c;
    let cent: Vec<f32> = centroids.iter().map(|&x| x as f32).collect();
    let mut counts = vec![0u64; k];
    let mut sums = vec![0f64; k * c];
    let mut inertia = 0f64;
    for row in data.chunks_exact(dim) {
        let x = &row[..c];
        let (mut best, mut bd) = (0usize, f32::INFINITY);
        // Four centroids a pass over the row, then one by one; in index order either way, so
        // ties go to the lower index.
        let mut fours = cent.chunks_exact(4 * c);
        for (q, cs) in (&mut fours).enumerate() {
            let ds = l.dist2_4(x, [0, 1, 2, 3].map(|j| &cs[j * c..(j + 1) * c]));
            for (j, d) in ds.into_iter().enumerate() {
                if d < bd {
                    bd = d;
                    best = 4 * q + j;
                }
            }
        }
        let done = cent.len() / c / 4 * 4;
        for (j, cj) in fours.remainder().chunks_exact(c).enumerate() {
            let d = l.dist2(x, cj);
            if d < bd {
                bd = d;
                best = done + j;
            }
        }
        counts[best] += 1;
        inertia += f64::from(bd);
        for (s, &v) in sums[best * c..(best + 1) * c].iter_mut().zip(x) {
            *s += f64::from(v);
        }
    }
    (counts, sums, inertia)
}
