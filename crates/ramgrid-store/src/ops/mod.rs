//! Operators run at the data: kernels over one partition of one version, reading the typed columns
//! of a [`PartitionView`] (no per-key decoding), one file per family. Their cost is proportional to
//! that partition's items only. Partial results merge on the client.
//!
//! Every operator is checked against the table's value type and its parameters by [`validate`]
//! before any partition is read, so a bad request is refused whole and reads nothing.

mod count;
mod histogram;
mod kmeans;
mod lr;
pub mod scan;
mod simd;
mod stats;
mod topk;

use crate::tables::{PartitionView, ValueType};
use crate::{Error, Result};

pub use stats::StatsPartial;

/// A range on one numeric value: selects `lo <= v < hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    /// Component of a vector (0 for i64 and f64 tables).
    pub component: u32,
    /// Smallest value selected.
    pub lo: f64,
    /// First value not selected.
    pub hi: f64,
}

/// An operator and its parameters.
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// Items (selected by the range).
    Count {
        /// Optional range.
        pred: Option<Range>,
    },
    /// Summary statistics of one numeric column.
    Stats {
        /// Component of a vector (0 for scalars).
        column: u32,
        /// Optional range.
        pred: Option<Range>,
    },
    /// Counts per bin (`[e_i, e_i+1)`, the last bin closed, as numpy's).
    Histogram {
        /// Component of a vector (0 for scalars).
        column: u32,
        /// Optional range.
        pred: Option<Range>,
        /// Strictly increasing, finite, at least 2.
        edges: &'a [f64],
    },
    /// Logistic-regression loss and gradient over f32-vector rows whose last component is the
    /// label; `weights` are the coefficients then the intercept (`dim` numbers).
    LrGradient {
        /// Coefficients then intercept.
        weights: &'a [f64],
    },
    /// One k-means step over the first `components` components of each row.
    KmeansStep {
        /// Leading components used.
        components: u32,
        /// `k × components`, centroid by centroid.
        centroids: &'a [f64],
    },
    /// The `k` entries with the largest (or smallest) values of one numeric column.
    TopK {
        /// Component of a vector (0 for scalars).
        column: u32,
        /// How many, 1..=[`MAX_TOP_K`].
        k: u32,
        /// Largest first (else smallest first).
        largest: bool,
        /// Optional range.
        pred: Option<Range>,
    },
}

/// One partition's partial result.
#[derive(Debug, Clone, PartialEq)]
pub enum OpOutput {
    /// Selected items and items looked at.
    Count {
        /// Selected.
        matched: u64,
        /// In the partition.
        scanned: u64,
    },
    /// Summary statistics.
    Stats(StatsPartial),
    /// A count per bin.
    Histogram(Vec<u64>),
    /// Summed loss and gradient (coefficients then intercept) over `rows` rows.
    LrGradient {
        /// Rows.
        rows: u64,
        /// Sum of the log-loss.
        loss: f64,
        /// Sum of the gradient.
        gradient: Vec<f64>,
    },
    /// Per centroid: rows nearest to it and their sum; the summed squared distances.
    KmeansStep {
        /// Per centroid.
        counts: Vec<u64>,
        /// `k × components`.
        sums: Vec<f64>,
        /// Sum of squared distances to the nearest centroid.
        inertia: f64,
    },
    /// The best entries, best first (ties by key bytes, smaller first): (key, value).
    TopK(Vec<(Vec<u8>, f64)>),
}

/// Most entries a TOP_K asks for.
pub const MAX_TOP_K: u32 = 1 << 20;

/// Most numbers a k-means request's centroids may hold (k × components).
pub const MAX_CENTROID_VALUES: usize = 1 << 20;

fn invalid(msg: String) -> Error {
    Error::Invalid(msg)
}

/// Components of a value of type `vt` an operator can read: 1 for i64 and f64, `dim` for f32
/// vectors, none for bytes.
fn numeric_width(vt: ValueType) -> Option<u32> {
    match vt {
        ValueType::I64 | ValueType::F64 => Some(1),
        ValueType::F32Vec { dim } => Some(dim),
        ValueType::Bytes => None,
    }
}

fn check_component(vt: ValueType, c: u32, what: &str) -> Result<()> {
    let Some(w) = numeric_width(vt) else {
        return Err(invalid(format!(
            "{what} needs numeric values; this table holds bytes"
        )));
    };
    if c >= w {
        return Err(invalid(match vt {
            ValueType::F32Vec { dim } => {
                format!("{what} names component {c}, but the vectors have {dim} (0..{dim})")
            }
            _ => format!("{what} names component {c} of a scalar table (only 0)"),
        }));
    }
    Ok(())
}

pub(crate) fn check_range(vt: ValueType, r: &Option<Range>) -> Result<()> {
    if let Some(r) = r {
        check_component(vt, r.component, "the predicate")?;
        if r.lo.is_nan() || r.hi.is_nan() {
            return Err(invalid("a predicate bound is NaN".into()));
        }
    }
    Ok(())
}

fn check_finite(xs: &[f64], what: &str) -> Result<()> {
    match xs.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(invalid(format!(
            "{what}[{i}] is {} (must be finite)",
            xs[i]
        ))),
        None => Ok(()),
    }
}

/// Refuses an operator that does not fit a table of type `vt`, or whose parameters are bad.
pub fn validate(op: &Op<'_>, vt: ValueType) -> Result<()> {
    match op {
        Op::Count { pred } => check_range(vt, pred),
        Op::Stats { column, pred } => {
            check_component(vt, *column, "stats")?;
            check_range(vt, pred)
        }
        Op::Histogram {
            column,
            pred,
            edges,
        } => {
            check_component(vt, *column, "histogram")?;
            check_range(vt, pred)?;
            if edges.len() < 2 {
                return Err(invalid("a histogram needs at least 2 edges".into()));
            }
            check_finite(edges, "edges")?;
            if let Some(i) = edges.windows(2).position(|w| w[0] >= w[1]) {
                return Err(invalid(format!(
                    "histogram edges must increase strictly: edges[{}] = {} is not above edges[{i}] = {}",
                    i + 1,
                    edges[i + 1],
                    edges[i]
                )));
            }
            Ok(())
        }
        Op::LrGradient { weights } => {
            let ValueType::F32Vec { dim } = vt else {
                return Err(invalid(format!(
                    "the logistic-regression gradient needs f32vec rows (features then the label); this table is {vt:?}"
                )));
            };
            if dim < 2 {
                return Err(invalid(
                    "the logistic-regression gradient needs rows of at least one feature and the label".into(),
                ));
            }
            if weights.len() != dim as usize {
                return Err(invalid(format!(
                    "{} weights for rows of {} features: give {} coefficients and the intercept ({dim} numbers)",
                    weights.len(),
                    dim - 1,
                    dim - 1
                )));
            }
            check_finite(weights, "weights")
        }
        Op::KmeansStep {
            components,
            centroids,
        } => {
            let ValueType::F32Vec { dim } = vt else {
                return Err(invalid(format!(
                    "a k-means step needs f32vec rows; this table is {vt:?}"
                )));
            };
            if *components == 0 || *components > dim {
                return Err(invalid(format!(
                    "k-means over {components} components of vectors of {dim}: use 1..={dim}"
                )));
            }
            if centroids.is_empty() || centroids.len() % *components as usize != 0 {
                return Err(invalid(format!(
                    "{} centroid numbers are not k × {components} (k >= 1)",
                    centroids.len()
                )));
            }
            if centroids.len() > MAX_CENTROID_VALUES {
                return Err(invalid(format!(
                    "k × components is {}, over {MAX_CENTROID_VALUES}",
                    centroids.len()
                )));
            }
            check_finite(centroids, "centroids")
        }
        Op::TopK {
            column, k, pred, ..
        } => {
            check_component(vt, *column, "top_k")?;
            check_range(vt, pred)?;
            if *k == 0 || *k > MAX_TOP_K {
                return Err(invalid(format!(
                    "top_k needs 1 <= k <= {MAX_TOP_K}, not {k}"
                )));
            }
            Ok(())
        }
    }
}

/// Runs `op` (already [`validate`]d for this table) over one partition.
pub fn run(op: &Op<'_>, view: &PartitionView<'_>) -> Result<OpOutput> {
    validate(op, view.value_type())?;
    Ok(match op {
        Op::Count { pred } => OpOutput::Count {
            matched: count::count(view, pred.as_ref()),
            scanned: view.len() as u64,
        },
        Op::Stats { column, pred } => OpOutput::Stats(stats::stats(view, *column, pred.as_ref())),
        Op::Histogram {
            column,
            pred,
            edges,
        } => OpOutput::Histogram(histogram::histogram(view, *column, pred.as_ref(), edges)),
        Op::LrGradient { weights } => {
            let (rows, loss, gradient) = lr::gradient(view, weights);
            OpOutput::LrGradient {
                rows,
                loss,
                gradient,
            }
        }
        Op::KmeansStep {
            components,
            centroids,
        } => {
            let (counts, sums, inertia) = kmeans::step(view, *components as usize, centroids);
            OpOutput::KmeansStep {
                counts,
                sums,
                inertia,
            }
        }
        Op::TopK {
            column,
            k,
            largest,
            pred,
        } => OpOutput::TopK(
            topk::top_k(view, *column, *k as usize, *largest, pred.as_ref())
                .into_iter()
                .map(|(i, v)| (view.key(i as usize).to_vec(), v))
                .collect(),
        ),
    })
}

/// One numeric column of a partition: the values themselves, or one component of each vector.
#[derive(Clone, Copy)]
pub(crate) enum Col<'a> {
    I64(&'a [i64]),
    F64(&'a [f64]),
    F32 {
        data: &'a [f32],
        dim: usize,
        comp: usize,
    },
}

impl<'a> Col<'a> {
    /// Column `comp` of `view` (validated: numeric, in range).
    pub(crate) fn of(view: &PartitionView<'a>, comp: u32) -> Col<'a> {
        match view.value_type() {
            ValueType::I64 => Col::I64(view.column_i64().unwrap_or_default()),
            ValueType::F64 => Col::F64(view.column_f64().unwrap_or_default()),
            ValueType::F32Vec { dim } => Col::F32 {
                data: view.column_f32().unwrap_or_default(),
                dim: dim as usize,
                comp: comp as usize,
            },
            ValueType::Bytes => Col::F64(&[]),
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> f64 {
        match *self {
            Col::I64(v) => v[i] as f64,
            Col::F64(v) => v[i],
            Col::F32 { data, dim, comp } => f64::from(data[i * dim + comp]),
        }
    }
}

#[cfg(test)]
mod scan_tests;
#[cfg(test)]
mod simd_tests;
#[cfg(test)]
mod tests;
