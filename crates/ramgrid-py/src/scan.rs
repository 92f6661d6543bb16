//! Scans, filters and top_k for Python: a `ScanIter` that yields one chunk per `__next__` with
//! the GIL released while pages are fetched, and `top_k`. Keys (and bytes values) cross as
//! (offsets, data) numpy arrays, which `python/ramgrid/scan.py` wraps as pyarrow large-binary
//! arrays without a copy per key.

use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use ramgrid_client::scan::{Chunk, Scan, ScanOptions};
use ramgrid_client::{Predicate, Values};

use super::{to_py, Client};

fn to_predicate(p: Option<(u32, f64, f64)>) -> Option<Predicate> {
    p.map(|(component, lo, hi)| Predicate { component, lo, hi })
}

/// An iterator over a table's chunks: each is `(partition, key_offsets, key_data, values)`, with
/// `values` a numpy array for numeric tables (rows of `dim` for f32 vectors) or
/// `(offsets, data)` for bytes tables.
#[pyclass(module = "ramgrid._native")]
pub(crate) struct ScanIter {
    scan: Option<Scan>,
}

#[pymethods]
impl ScanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(scan) = self.scan.as_mut() else {
            return Ok(None);
        };
        let next = py.allow_threads(|| scan.next());
        py.check_signals()?;
        match next {
            None => {
                self.scan = None;
                Ok(None)
            }
            Some(Err(e)) => {
                self.scan = None;
                Err(to_py(py, e))
            }
            Some(Ok(chunk)) => chunk_tuple(py, chunk).map(Some),
        }
    }

    /// The version read (0 until the first page).
    #[getter]
    fn version(&self) -> u32 {
        self.scan.as_ref().map_or(0, |s| s.version())
    }

    /// Partitions read again because they were written between pages.
    #[getter]
    fn restarts(&self) -> u32 {
        self.scan.as_ref().map_or(0, |s| s.restarts)
    }

    /// Stops the scan (the servers keep nothing of it).
    fn close(&mut self) {
        self.scan = None;
    }
}

fn chunk_tuple(py: Python<'_>, c: Chunk) -> PyResult<Bound<'_, PyTuple>> {
    let n = c.len();
    let offsets = c.keys.offsets.into_pyarray(py).into_any();
    let data = c.keys.data.into_pyarray(py).into_any();
    let values = match c.values {
        Values::I64(v) => v.into_pyarray(py).into_any(),
        Values::F64(v) => v.into_pyarray(py).into_any(),
        Values::F32Vec { dim, data } => data.into_pyarray(py).reshape([n, dim])?.into_any(),
        Values::Bytes(b) => {
            // Values were appended in order, so the spans are back to back.
            let mut offs = Vec::with_capacity(n + 1);
            offs.push(0i64);
            offs.extend(b.spans.iter().map(|&(s, l)| (s + l) as i64));
            let pair = (offs.into_pyarray(py), b.data.into_pyarray(py));
            pair.into_pyobject(py)?.into_any()
        }
    };
    PyTuple::new(
        py,
        [
            c.partition.into_pyobject(py)?.into_any(),
            offsets,
            data,
            values,
        ],
    )
}

/// Starts a scan of `table` (filtered when `predicate` = (component, lo, hi) is given; narrowed
/// to `partitions` = (start, end); asking server `prefer` first where every replica holds the
/// data, `ramgrid_client::scan::Scan::prefer`).
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the Python keyword arguments"
)]
#[pyfunction]
#[pyo3(signature = (client, table, version=0, incarnation=0, predicate=None, chunk_items=65536, max_restarts=8, partitions=None, prefer=None))]
pub(crate) fn scan(
    py: Python<'_>,
    client: &Client,
    table: &str,
    version: u32,
    incarnation: u64,
    predicate: Option<(u32, f64, f64)>,
    chunk_items: usize,
    max_restarts: u32,
    partitions: Option<(u32, u32)>,
    prefer: Option<&str>,
) -> PyResult<ScanIter> {
    let opts = ScanOptions {
        chunk_items,
        max_restarts,
    };
    let s = py
        .allow_threads(|| {
            client
                .inner
                .scan(table, version, incarnation, to_predicate(predicate), opts)
                .and_then(|s| match partitions {
                    Some((a, b)) => s.partitions(a, b),
                    None => Ok(s),
                })
                .and_then(|s| match prefer {
                    Some(addr) => s.prefer(addr),
                    None => Ok(s),
                })
        })
        .map_err(|e| to_py(py, e))?;
    Ok(ScanIter { scan: Some(s) })
}

/// The `k` best items of `table` by column `column`: (list of key bytes, f64 numpy values).
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the Python keyword arguments"
)]
#[pyfunction]
#[pyo3(signature = (client, table, k, version=0, incarnation=0, column=0, largest=true, predicate=None))]
pub(crate) fn top_k<'py>(
    py: Python<'py>,
    client: &Client,
    table: &str,
    k: u32,
    version: u32,
    incarnation: u64,
    column: u32,
    largest: bool,
    predicate: Option<(u32, f64, f64)>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyAny>)> {
    let (items, _version) = py
        .allow_threads(|| {
            client.inner.top_k(
                table,
                version,
                incarnation,
                column,
                k,
                largest,
                to_predicate(predicate),
            )
        })
        .map_err(|e| to_py(py, e))?;
    let keys = PyList::empty(py);
    let mut values = Vec::with_capacity(items.len());
    for (k, v) in items {
        keys.append(PyBytes::new(py, &k))?;
        values.push(v);
    }
    Ok((keys, values.into_pyarray(py).into_any()))
}
