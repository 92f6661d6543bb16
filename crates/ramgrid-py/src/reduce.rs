//! `ramgrid._native.lookup_reduce`: records from Python (texts or token lists) handed to
//! ramgrid-client's fused lookup-reduce with the GIL released for tokenising, the lookup and the
//! reduction; numpy arrays back. Policy (tokeniser, summation, miss rule) lives in the client crate.

use std::borrow::Cow;

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use ramgrid_client::reduce::{Miss, Reduce, Reduced, TokenBatch};
use ramgrid_client::{Error, Keys};

use crate::errors::chunked_to_py;
use crate::{check_signals, sliceable, to_py, Client, CHUNK_KEYS};

/// Records as Python handed them, kept alive (and borrowed from) for the length of a call.
enum Records<'py> {
    /// str or bytes lines, to be split on whitespace.
    Texts(Vec<Bound<'py, PyAny>>),
    /// Lists (or tuples) of str / bytes tokens.
    Lists(Vec<Vec<Bound<'py, PyAny>>>),
    /// (record offsets, token offsets, token bytes).
    Packed(
        PyReadonlyArray1<'py, i64>,
        PyReadonlyArray1<'py, i64>,
        Bound<'py, PyBytes>,
    ),
}

fn type_error(what: &str, item: &Bound<'_, PyAny>) -> PyResult<PyErr> {
    Ok(PyTypeError::new_err(format!(
        "{what}, not {}",
        item.get_type().name()?
    )))
}

impl<'py> Records<'py> {
    fn new(records: &Bound<'py, PyAny>, tokenize: &str) -> PyResult<Records<'py>> {
        let split = match tokenize {
            "whitespace" => true,
            "none" => false,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "tokenize must be \"whitespace\" (records are texts) or \"none\" (records are \
                     token lists), not {tokenize:?}"
                )))
            }
        };
        if let Ok(t) = records.downcast::<PyTuple>() {
            if !split && t.len() == 3 {
                let arr = |i: usize, what: &str| -> PyResult<PyReadonlyArray1<'py, i64>> {
                    let a = t
                        .get_item(i)?
                        .downcast_into::<PyArray1<i64>>()
                        .map_err(|_| {
                            PyTypeError::new_err(format!(
                                "packed records: {what} must be a 1-D int64 numpy array"
                            ))
                        })?;
                    Ok(sliceable(a)?.readonly())
                };
                let data = t.get_item(2)?.downcast_into::<PyBytes>().map_err(|_| {
                    PyTypeError::new_err("packed records: the token data must be bytes")
                })?;
                return Ok(Records::Packed(
                    arr(0, "record offsets")?,
                    arr(1, "token offsets")?,
                    data,
                ));
            }
        }
        let Ok(list) = records.downcast::<PyList>() else {
            return Err(type_error(
                if split {
                    "records must be a list of str or bytes"
                } else {
                    "records must be a list of token lists or a (record offsets, token offsets, \
                     data) tuple"
                },
                records,
            )?);
        };
        if split {
            let mut texts = Vec::with_capacity(list.len());
            for item in list.iter() {
                if !(item.is_instance_of::<PyString>() || item.is_instance_of::<PyBytes>()) {
                    return Err(type_error(
                        "with tokenize=\"whitespace\" each record must be str or bytes \
                         (token lists need tokenize=\"none\")",
                        &item,
                    )?);
                }
                texts.push(item);
            }
            return Ok(Records::Texts(texts));
        }
        let mut lists = Vec::with_capacity(list.len());
        for rec in list.iter() {
            let toks: Vec<Bound<'py, PyAny>> = if let Ok(l) = rec.downcast::<PyList>() {
                l.iter().collect()
            } else if let Ok(t) = rec.downcast::<PyTuple>() {
                t.iter().collect()
            } else {
                return Err(type_error(
                    "with tokenize=\"none\" each record must be a list or tuple of tokens",
                    &rec,
                )?);
            };
            for tok in &toks {
                if !(tok.is_instance_of::<PyString>() || tok.is_instance_of::<PyBytes>()) {
                    return Err(type_error("each token must be str or bytes", tok)?);
                }
            }
            lists.push(toks);
        }
        Ok(Records::Lists(lists))
    }
}

/// A str's UTF-8 or a bytes object's contents, borrowed from the object.
fn bytes_of<'a>(item: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(s) = item.downcast::<PyString>() {
        return Ok(s.to_str()?.as_bytes());
    }
    Ok(item.downcast::<PyBytes>()?.as_bytes())
}

/// What one call reads and how it reduces.
struct Call<'c> {
    client: &'c ramgrid_client::Client,
    table: &'c str,
    incarnation: u64,
    version: u32,
    how: Reduce,
    miss: Miss,
}

impl Call<'_> {
    /// Looks the batch's distinct tokens up in chunks (Ctrl-C is checked between them), each
    /// chunk at the version the first one read, then reduces; the GIL is released throughout but
    /// for the signal checks.
    fn run(&self, py: Python<'_>, batch: &TokenBatch<'_>) -> PyResult<Reduced> {
        let keys = batch.distinct();
        let k = keys.len();
        let mut values = vec![0.0; k];
        let mut found = vec![false; k];
        let pinned = py
            .allow_threads(|| {
                self.client.lookup_f64_chunked(
                    self.table,
                    self.incarnation,
                    self.version,
                    keys,
                    &mut values,
                    &mut found,
                    CHUNK_KEYS,
                    check_signals,
                )
            })
            .map_err(|e| chunked_to_py(py, e))?;
        py.allow_threads(|| batch.reduce(&values, &found, self.how, self.miss, pinned))
            .map_err(|e| to_py(py, e))
    }
}

/// Fused lookup-reduce; see `python/ramgrid/_native.pyi`. Returns (values, misses, counts,
/// version read, distinct tokens, tokens dropped for length).
#[pyfunction]
#[pyo3(signature = (client, table, records, version=0, incarnation=0, reduce="sum", default=None, tokenize="whitespace"))]
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the Python function's keyword arguments"
)]
#[expect(clippy::type_complexity, reason = "the tuple the .pyi documents")]
pub(crate) fn lookup_reduce<'py>(
    py: Python<'py>,
    client: PyRef<'py, Client>,
    table: &str,
    records: &Bound<'py, PyAny>,
    version: u32,
    incarnation: u64,
    reduce: &str,
    default: Option<f64>,
    tokenize: &str,
) -> PyResult<(
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    u32,
    usize,
    usize,
)> {
    let how: Reduce = reduce.parse().map_err(|e| to_py(py, e))?;
    let miss = default.map_or(Miss::Skip, Miss::Default);
    let holder = Records::new(records, tokenize)?;
    let call = Call {
        client: &client.inner,
        table,
        incarnation,
        version,
        how,
        miss,
    };
    let batch_err = |e: Error| to_py(py, e);
    let out = match &holder {
        Records::Texts(items) => {
            let raw: Vec<Result<&str, &[u8]>> = items
                .iter()
                .map(|it| match it.downcast::<PyString>() {
                    Ok(s) => Ok(Ok(s.to_str()?)),
                    Err(_) => Ok(Err(it.downcast::<PyBytes>()?.as_bytes())),
                })
                .collect::<PyResult<_>>()?;
            // Bytes lines are decoded as Python's "replace" error handler does (the experiment's
            // decode_lines); a str is UTF-8 already and is borrowed.
            let texts: Vec<Cow<'_, str>> = py.allow_threads(|| {
                raw.iter()
                    .map(|r| match *r {
                        Ok(s) => Cow::Borrowed(s),
                        Err(b) => String::from_utf8_lossy(b),
                    })
                    .collect()
            });
            let batch = py
                .allow_threads(|| TokenBatch::from_texts(&texts))
                .map_err(batch_err)?;
            call.run(py, &batch)?
        }
        Records::Lists(lists) => {
            let toks: Vec<Vec<&[u8]>> = lists
                .iter()
                .map(|l| l.iter().map(bytes_of).collect::<PyResult<_>>())
                .collect::<PyResult<_>>()?;
            let batch = py
                .allow_threads(|| {
                    TokenBatch::from_token_lists(toks.iter().map(|r| r.iter().copied()))
                })
                .map_err(batch_err)?;
            call.run(py, &batch)?
        }
        Records::Packed(rec, tok, data) => {
            let (rec, tok) = (rec.as_slice()?, tok.as_slice()?);
            let data = data.as_bytes();
            let batch = py
                .allow_threads(|| TokenBatch::from_packed(rec, Keys::Packed { offsets: tok, data }))
                .map_err(batch_err)?;
            call.run(py, &batch)?
        }
    };
    Ok((
        out.values.into_pyarray(py),
        out.misses.into_pyarray(py),
        out.counts.into_pyarray(py),
        out.version,
        out.distinct,
        out.dropped,
    ))
}
