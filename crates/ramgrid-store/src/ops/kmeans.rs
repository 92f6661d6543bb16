//! KMEANS_STEP: for given centroids, each row's nearest one (on the row's first `components`
//! components; ties to the lower index), and per centroid the count and sum of its rows, with the
//! summed squared distance (the inertia). The client divides sums by counts for the next centroids.

use super::simd::{dispatch, dist2};
use crate::tables::PartitionView;

/// `(counts, sums: k × components, inertia)` (`centroids` validated: k × components).
pub(crate) fn step(
    view: &PartitionView<'_>,
    components: usize,
    centroids: &[f64],
) -> (Vec<u64>, Vec<f64>, f64) {
    let dim = match view.value_type() {
        crate::tables::ValueType::F32Vec { dim } => dim as usize,
        _ => components,
    };
    let data = view.column_f32().unwrap_or_default();
    kernel(data, dim, components, centroids)
}

dispatch!(fn kernel(data: &[f32], dim: usize, c: usize, centroids: &[f64]) -> (Vec<u64>, Vec<f64>, f64) => body);

#[inline(always)]
fn body(data: &[f32], dim: usize, c: usize, centroids: &[f64]) -> (Vec<u64>, Vec<f64>, f64) {
    let k = centroids.len() / c;
    let cent: Vec<f32> = centroids.iter().map(|&x| x as f32).collect();
    let mut counts = vec![0u64; k];
    let mut sums = vec![0f64; k * c];
    let mut inertia = 0f64;
    for row in data.chunks_exact(dim) {
        let x = &row[..c];
        let (mut best, mut bd) = (0usize, f32::INFINITY);
        for (j, cj) in cent.chunks_exact(c).enumerate() {
            let d = dist2(x, cj);
            if d < bd {
                bd = d;
                best = j;
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
