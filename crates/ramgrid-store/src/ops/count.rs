//! COUNT: how many items of a partition (satisfy a range).

use super::{Col, Range};
use crate::tables::PartitionView;

/// Items of `view` selected by `pred` (all of them without one).
pub(crate) fn count(view: &PartitionView<'_>, pred: Option<&Range>) -> u64 {
    let Some(r) = pred else {
        return view.len() as u64;
    };
    let n = view.len();
    let (lo, hi) = (r.lo, r.hi);
    // Branch-free loops with independent lanes, one per column kind, so each vectorizes.
    match Col::of(view, r.component) {
        Col::F64(v) => count_lanes(v, |x| x, lo, hi),
        Col::I64(v) => count_lanes(v, |x| x as f64, lo, hi),
        Col::F32 { data, dim, comp } => {
            let mut c = 0u64;
            for i in 0..n {
                let x = f64::from(data[i * dim + comp]);
                c += u64::from(x >= lo && x < hi);
            }
            c
        }
    }
}

#[inline(always)]
fn count_lanes<T: Copy>(v: &[T], f: impl Fn(T) -> f64, lo: f64, hi: f64) -> u64 {
    const L: usize = 8;
    let mut lanes = [0u64; L];
    let mut chunks = v.chunks_exact(L);
    for ch in &mut chunks {
        for j in 0..L {
            let x = f(ch[j]);
            lanes[j] += u64::from(x >= lo && x < hi);
        }
    }
    let mut c: u64 = lanes.iter().sum();
    for &x in chunks.remainder() {
        let x = f(x);
        c += u64::from(x >= lo && x < hi);
    }
    c
}
