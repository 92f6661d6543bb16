//! `ramgrid._native.ShmReader`: a pinned version's shared-memory reader handle
//! (`ramgrid_client::ShmReader`, docs/shared-memory.md "The fast path"), for `PinnedTable`'s
//! 1-key `get` (a Python scalar straight from the mapping: no list, no numpy array, no GIL
//! release) and its batches (keys borrowed, only the output allocated).
//!
//! Where the handle cannot answer (version detached, a forked child, a table created again, a
//! key of a partition not mapped), a call returns the `elsewhere` marker the handle was made
//! with, and the Python layer reads through the client as it would without the handle: the
//! handle itself never goes to the network.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFloat};
use ramgrid_client::{ShmReader as RustReader, ValueType, Values, CHUNK_KEYS};

use crate::keys::key_bytes;
use crate::{values_to_py, Client, KeyHolder};

/// Batches of at least this many keys release the GIL while they are looked up (about 0.5 ms of
/// work); smaller ones keep it: giving it up and taking it back costs more than they do, and
/// another thread may hold it for a whole switch interval.
const GIL_FREE_KEYS: usize = 8192;

/// A mapped pinned version, resolved once (`shm_reader`).
#[pyclass(module = "ramgrid._native", frozen)]
pub(crate) struct ShmReader {
    inner: RustReader,
    /// What a call returns when the handle cannot answer.
    elsewhere: Py<PyAny>,
}

/// The reader handle of `table`'s `version` (of `incarnation`, 0: the table as the client
/// knows it) if `client` has that version attached (`shm_attach`) with some partition mapped,
/// else None. Its calls return `elsewhere` when it cannot answer.
#[pyfunction]
#[pyo3(signature = (client, table, version, incarnation, elsewhere))]
pub(crate) fn shm_reader(
    py: Python<'_>,
    client: &Client,
    table: &str,
    version: u32,
    incarnation: u64,
    elsewhere: Py<PyAny>,
) -> Option<ShmReader> {
    let inner = py.allow_threads(|| client.inner.shm_reader(table, incarnation, version))?;
    Some(ShmReader { inner, elsewhere })
}

/// A value's wire form as the Python object `get_many(...)[0]` gives: int, float, bytes, or a
/// float32 vector (a 1-D numpy array of `dim`).
fn scalar<'py>(py: Python<'py>, vt: ValueType, wire: &[u8]) -> Bound<'py, PyAny> {
    let word = || wire.try_into().unwrap_or([0u8; 8]);
    match vt {
        ValueType::I64 => i64::from_le_bytes(word())
            .into_pyobject(py)
            .expect("an int")
            .into_any(),
        ValueType::F64 => PyFloat::new(py, f64::from_le_bytes(word())).into_any(),
        ValueType::Bytes => PyBytes::new(py, wire).into_any(),
        ValueType::F32Vec(_) => PyArray1::from_iter(
            py,
            wire.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        )
        .into_any(),
    }
}

#[pymethods]
impl ShmReader {
    /// One key's value (int, float, bytes, or a float32 vector), `default` if the key is
    /// missing, or the `elsewhere` marker if the handle cannot answer.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut int = [0u8; 8];
        let k = key_bytes(key, &mut int)?;
        Ok(match self.inner.get_wire(k) {
            Some(Some(wire)) => scalar(py, self.inner.value_type(), wire),
            Some(None) => default.clone(),
            None => self.elsewhere.bind(py).clone(),
        })
    }

    /// Whether the key is present, or the `elsewhere` marker.
    fn contains<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<PyObject> {
        let mut int = [0u8; 8];
        let k = key_bytes(key, &mut int)?;
        Ok(match self.inner.get_wire(k) {
            Some(got) => got
                .is_some()
                .into_pyobject(py)?
                .to_owned()
                .into_any()
                .unbind(),
            None => self.elsewhere.clone_ref(py),
        })
    }

    /// `Client.get_many`'s (values, found) for converted keys (a list, an int64 array read in
    /// place, or packed (offsets, data)), or the `elsewhere` marker (then nothing was read).
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let holder = KeyHolder::new(keys)?;
        let slices = holder.slices()?;
        let keys = holder.keys(&slices);
        let n = keys.len();
        // A batch long enough to want Ctrl-C checks between chunks goes the client's way.
        if n > CHUNK_KEYS {
            return Ok(self.elsewhere.bind(py).clone());
        }
        let mut values = Values::zeroed(self.inner.value_type(), n);
        let mut found = vec![false; n];
        let mut read = || {
            self.inner
                .try_get_into(keys, &mut values.slice_mut(0..n), &mut found)
        };
        let done = if n >= GIL_FREE_KEYS {
            py.allow_threads(read)
        } else {
            read()
        };
        if done.is_none() {
            return Ok(self.elsewhere.bind(py).clone());
        }
        let (values, found) = values_to_py(py, values, found, n)?;
        Ok((values, found).into_pyobject(py)?.into_any())
    }

    /// The pinned version.
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version()
    }
}
