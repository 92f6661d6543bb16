//! `run_op`: an operator run by the servers over every partition of one table version
//! (`ramgrid_client::Client::run_op`), its merged result handed to Python as a dict of numbers and
//! numpy arrays. The GIL is released for the whole call; the policy (retries, exact or refused)
//! is the client's.

use numpy::IntoPyArray;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ramgrid_client::{OpResult, OpSpec, Predicate};

use crate::{to_py, Client};

/// `(component, lo, hi)`: selects `lo <= v < hi` on that component.
type PyPredicate = (u32, f64, f64);

fn predicate(p: Option<PyPredicate>) -> Option<Predicate> {
    p.map(|(component, lo, hi)| Predicate { component, lo, hi })
}

/// The operator `op` with its parameters; unknown names and missing parameters are refused here,
/// everything the table decides (types, widths, finite numbers) by the servers.
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the Python keyword arguments"
)]
fn spec(
    op: &str,
    column: u32,
    predicate_: Option<PyPredicate>,
    edges: Option<Vec<f64>>,
    weights: Option<Vec<f64>>,
    l2: f64,
    components: u32,
    centroids: Option<Vec<f64>>,
) -> PyResult<OpSpec> {
    let need = |v: Option<Vec<f64>>, what: &str| {
        v.ok_or_else(|| PyValueError::new_err(format!("operator {op} needs {what}")))
    };
    Ok(match op {
        "count" => OpSpec::Count {
            predicate: predicate(predicate_),
        },
        "stats" => OpSpec::Stats {
            column,
            predicate: predicate(predicate_),
        },
        "histogram" => OpSpec::Histogram {
            column,
            predicate: predicate(predicate_),
            edges: need(edges, "edges")?,
        },
        "lr_gradient" => {
            if !l2.is_finite() || l2 < 0.0 {
                return Err(PyValueError::new_err(format!(
                    "l2 must be finite and >= 0, not {l2}"
                )));
            }
            OpSpec::LrGradient {
                weights: need(weights, "weights")?,
                l2,
            }
        }
        "kmeans_step" => OpSpec::KmeansStep {
            components,
            centroids: need(centroids, "centroids")?,
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown operator {other:?}: count, stats, histogram, lr_gradient, kmeans_step"
            )))
        }
    })
}

/// Runs operator `op` over table `table` at `version` (0: current) of `incarnation` (0: any) and
/// returns `{"version", "retried", ...result}`; see `_native.pyi`.
#[pyfunction]
#[pyo3(signature = (client, table, version, incarnation, op, column=0, predicate=None, edges=None, weights=None, l2=0.0, components=0, centroids=None))]
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the Python keyword arguments"
)]
pub(crate) fn run_op<'py>(
    py: Python<'py>,
    client: &Client,
    table: &str,
    version: u32,
    incarnation: u64,
    op: &str,
    column: u32,
    predicate: Option<PyPredicate>,
    edges: Option<Vec<f64>>,
    weights: Option<Vec<f64>>,
    l2: f64,
    components: u32,
    centroids: Option<Vec<f64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = spec(
        op, column, predicate, edges, weights, l2, components, centroids,
    )?;
    let answer = py
        .allow_threads(|| client.inner.run_op(table, version, incarnation, &spec))
        .map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    d.set_item("version", answer.version)?;
    d.set_item("retried", answer.retried)?;
    match answer.result {
        OpResult::Count { matched, scanned } => {
            d.set_item("count", matched)?;
            d.set_item("scanned", scanned)?;
        }
        OpResult::Stats(s) => {
            d.set_item("count", s.count)?;
            d.set_item("sum", s.sum)?;
            d.set_item("min", s.min)?;
            d.set_item("max", s.max)?;
            d.set_item("mean", s.mean)?;
            d.set_item("m2", s.m2)?;
        }
        OpResult::Histogram(counts) => {
            d.set_item("counts", counts.into_pyarray(py))?;
        }
        OpResult::LrGradient {
            rows,
            loss,
            gradient,
        } => {
            d.set_item("rows", rows)?;
            d.set_item("loss", loss)?;
            d.set_item("gradient", gradient.into_pyarray(py))?;
        }
        OpResult::KmeansStep {
            counts,
            sums,
            inertia,
        } => {
            d.set_item("counts", counts.into_pyarray(py))?;
            d.set_item("sums", sums.into_pyarray(py))?;
            d.set_item("inertia", inertia)?;
        }
        // `spec` never builds TOP_K: its keys and values come through `scan::top_k`.
        OpResult::TopK(_) => unreachable!("run_op does not ask for top_k"),
    }
    Ok(d)
}
