//! Keys as Python hands them to the binding: lists of str, bytes and ints (numpy integer scalars
//! included), int64 numpy arrays, packed `(offsets, data)` tuples, and single keys; each borrowed
//! for the length of a call, never copied where the client can read it in place.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};
use ramgrid_client::Keys;

/// Keys as Python handed them, kept alive (and borrowed from) for the length of a call.
pub(crate) enum KeyHolder<'py> {
    Ints(PyReadonlyArray1<'py, i64>),
    IntsOwned(Vec<i64>),
    Packed(PyReadonlyArray1<'py, i64>, Bound<'py, PyBytes>),
    List {
        items: Vec<Bound<'py, PyAny>>,
        ints: Vec<[u8; 8]>,
    },
}

/// `arr` itself when it can be viewed as a Rust slice (C-contiguous and aligned), else a copy that
/// can. Unpickled arrays (e.g. in Dask tasks) may sit at an unaligned address inside their buffer,
/// and a Rust slice over them would be undefined behaviour.
pub(crate) fn sliceable<'py, T: numpy::Element, D: numpy::ndarray::Dimension>(
    arr: Bound<'py, numpy::PyArray<T, D>>,
) -> PyResult<Bound<'py, numpy::PyArray<T, D>>> {
    let aligned = arr.data().is_aligned();
    if aligned && arr.is_c_contiguous() {
        return Ok(arr);
    }
    // ndarray.copy() is C-ordered and allocated by numpy, hence aligned.
    Ok(arr
        .call_method0("copy")?
        .downcast_into::<numpy::PyArray<T, D>>()?)
}

/// An integer key: a Python int, or any object Python's `operator.index` takes (numpy's integer
/// scalars, as iterating over a key array gives). None for anything else; OverflowError past i64.
fn int_key(item: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if item.is_instance_of::<PyInt>() {
        return item.extract().map(Some);
    }
    if item.is_instance_of::<PyFloat>() || !item.hasattr(pyo3::intern!(item.py(), "__index__"))? {
        return Ok(None);
    }
    item.call_method0(pyo3::intern!(item.py(), "__index__"))?
        .extract()
        .map(Some)
}

impl<'py> KeyHolder<'py> {
    pub(crate) fn new(keys: &Bound<'py, PyAny>) -> PyResult<KeyHolder<'py>> {
        if let Ok(arr) = keys.downcast::<PyArray1<i64>>() {
            return Ok(KeyHolder::Ints(sliceable(arr.clone())?.readonly()));
        }
        if let Ok(t) = keys.downcast::<PyTuple>() {
            if t.len() == 2 {
                let offsets = t
                    .get_item(0)?
                    .downcast_into::<PyArray1<i64>>()
                    .map_err(|_| {
                        PyTypeError::new_err("packed keys: offsets must be a 1-D int64 numpy array")
                    })?;
                let offsets = sliceable(offsets)?.readonly();
                let data = t
                    .get_item(1)?
                    .downcast_into::<PyBytes>()
                    .map_err(|_| PyTypeError::new_err("packed keys: data must be bytes"))?;
                return Ok(KeyHolder::Packed(offsets, data));
            }
        }
        if let Ok(list) = keys.downcast::<PyList>() {
            let n = list.len();
            let mut items = Vec::with_capacity(n);
            let mut ints = Vec::new();
            let mut all_ints = n > 0;
            for item in list.iter() {
                if item.is_instance_of::<PyString>() || item.is_instance_of::<PyBytes>() {
                    all_ints = false;
                } else if let Some(v) = int_key(&item)? {
                    ints.push(v.to_le_bytes());
                } else {
                    return Err(PyTypeError::new_err(format!(
                        "keys must be str, bytes or int, not {}",
                        item.get_type().name()?
                    )));
                }
                items.push(item);
            }
            if all_ints {
                return Ok(KeyHolder::IntsOwned(
                    ints.iter().map(|b| i64::from_le_bytes(*b)).collect(),
                ));
            }
            return Ok(KeyHolder::List { items, ints });
        }
        Err(PyTypeError::new_err(format!(
            "keys must be a list, a 1-D int64 numpy array or an (offsets, data) tuple, not {}",
            keys.get_type().name()?
        )))
    }

    /// Byte slices for a list (borrowing str UTF-8 and bytes buffers, no copies).
    pub(crate) fn slices(&self) -> PyResult<Vec<&[u8]>> {
        let KeyHolder::List { items, ints } = self else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(items.len());
        let mut next_int = 0;
        for item in items {
            if let Ok(s) = item.downcast::<PyString>() {
                out.push(s.to_str()?.as_bytes());
            } else if let Ok(b) = item.downcast::<PyBytes>() {
                out.push(b.as_bytes());
            } else {
                out.push(&ints[next_int][..]);
                next_int += 1;
            }
        }
        Ok(out)
    }

    pub(crate) fn keys<'a>(&'a self, slices: &'a [&'a [u8]]) -> Keys<'a> {
        match self {
            KeyHolder::Ints(a) => Keys::I64(a.as_slice().unwrap_or_default()),
            KeyHolder::IntsOwned(v) => Keys::I64(v),
            KeyHolder::Packed(o, d) => Keys::Packed {
                offsets: o.as_slice().unwrap_or_default(),
                data: d.as_bytes(),
            },
            KeyHolder::List { .. } => Keys::Slices(slices),
        }
    }
}

/// One key as the binding reads keys from a list: str (UTF-8), bytes, or int (its 8-byte
/// little-endian encoding); anything else is the same TypeError as in a list of keys.
pub(crate) fn key_bytes<'a>(key: &'a Bound<'_, PyAny>, int: &'a mut [u8; 8]) -> PyResult<&'a [u8]> {
    if let Ok(s) = key.downcast::<PyString>() {
        return Ok(s.to_str()?.as_bytes());
    }
    if let Ok(b) = key.downcast::<PyBytes>() {
        return Ok(b.as_bytes());
    }
    if let Some(v) = int_key(key)? {
        *int = v.to_le_bytes();
        return Ok(&int[..]);
    }
    Err(PyTypeError::new_err(format!(
        "keys must be str, bytes or int, not {}",
        key.get_type().name()?
    )))
}

/// The partition of `key` in a table of `partitions` partitions (ints are keyed by their 8-byte LE encoding).
#[pyfunction]
pub(crate) fn partition_of(key: &Bound<'_, PyAny>, partitions: u32) -> PyResult<u32> {
    let mut int = [0u8; 8];
    Ok(ramgrid_client::partition_of(
        key_bytes(key, &mut int)?,
        partitions,
    ))
}
