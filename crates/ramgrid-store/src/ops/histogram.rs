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
            let mut b = (((x - first) / width) as usize).min(bins - 1);
            while b > 0 && x < edges[b] {
                b -= 1;
            }
            while b + 1 < bins && x >= edges[b + 1] {
                b += 1;
            }
            b
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
