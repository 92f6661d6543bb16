//! TOP_K: the `k` entries of a partition with the largest (or smallest) values of one numeric
//! column, with a bounded heap: one pass over the column, `O(n log k)` at worst, keys touched only
//! for entries that enter the heap or tie with its worst. NaN values are never selected.
//!
//! Order (so partials merge deterministically on the client): better value first; equal values
//! by key bytes, smaller first.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::{Col, Range};
use crate::tables::PartitionView;

/// A candidate; `Ord`: greater is better.
struct Cand<'a> {
    /// The value, negated when the smallest are wanted, so higher is always better.
    score: f64,
    key: &'a [u8],
    i: u32,
}

impl PartialEq for Cand<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Cand<'_> {}
impl PartialOrd for Cand<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        // Scores are never NaN (NaN values are skipped); -0.0 and 0.0 tie and go by key.
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| o.key.cmp(self.key))
    }
}

/// The best `k` entries of `view` by column `column` (selected by `pred`), best first, as
/// (entry, value). `column` and `pred` are validated by the caller.
pub(crate) fn top_k(
    view: &PartitionView<'_>,
    column: u32,
    k: usize,
    largest: bool,
    pred: Option<&Range>,
) -> Vec<(u32, f64)> {
    if k == 0 {
        return Vec::new();
    }
    let col = Col::of(view, column);
    let filter = pred.map(|r| (Col::of(view, r.component), r.lo, r.hi));
    let sign = if largest { 1.0 } else { -1.0 };
    let mut heap: BinaryHeap<Reverse<Cand<'_>>> = BinaryHeap::with_capacity(k.min(view.len()) + 1);
    for i in 0..view.len() {
        let v = col.get(i);
        if v.is_nan() {
            continue;
        }
        if let Some((c, lo, hi)) = &filter {
            let x = c.get(i);
            if !(x >= *lo && x < *hi) {
                continue;
            }
        }
        let score = sign * v;
        if heap.len() == k {
            let worst = &heap.peek().expect("k >= 1").0;
            // Most entries stop here, without touching their key.
            if score < worst.score {
                continue;
            }
        }
        let cand = Cand {
            score,
            key: view.key(i),
            i: i as u32,
        };
        if heap.len() < k {
            heap.push(Reverse(cand));
        } else if cand > heap.peek().expect("k >= 1").0 {
            heap.pop();
            heap.push(Reverse(cand));
        }
    }
    let mut best: Vec<Cand<'_>> = heap.into_iter().map(|r| r.0).collect();
    best.sort_unstable_by(|a, b| b.cmp(a));
    best.into_iter().map(|c| (c.i, sign * c.score)).collect()
}
