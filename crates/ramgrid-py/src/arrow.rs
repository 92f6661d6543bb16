//! A mapped pinned version's columns for `python/ramgrid/arrow.py` (`ramgrid_client::ShmReader`'s
//! `column_sizes`, `write_columns` and `mapped_values`; docs/shared-memory.md, "Columns out").
//! Keys, and bytes values, are written into buffers that a Python callable allocates (arrow.py
//! passes `pyarrow.allocate_buffer`: pyarrow's memory pool, which keeps its pages between calls
//! as pyarrow's own readers do), on several threads with the GIL released; fixed-width values
//! come out as a read-only [`MappedBuffer`] on the mapping itself, not copied.

use std::ffi::c_int;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{ffi, IntoPyObjectExt};
use ramgrid_client::{ColumnsOut, MappedValues};

use crate::Client;

/// One partition's value bytes, read-only, on the mapping: the buffer protocol gives them out in
/// place, and the mapping stays while this object (and so any buffer made from it) lives.
#[pyclass(module = "ramgrid._native", frozen)]
pub(crate) struct MappedBuffer {
    inner: MappedValues,
}

#[pymethods]
impl MappedBuffer {
    /// A read-only view of the bytes; a writable one is refused (BufferError).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let bytes = slf.get().inner.as_ref();
        let len = ffi::Py_ssize_t::try_from(bytes.len()).expect("a mapping fits an isize");
        // SAFETY: `view` is the caller's to fill; the bytes live as long as `slf`, which the view
        // holds a reference to (FillInfo takes one), and are never written through it (readonly:
        // a writable request fails with BufferError, leaving `view` unset).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                bytes.as_ptr().cast_mut().cast(),
                len,
                1,
                flags,
            )
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.inner.as_ref().len()
    }
}

/// A buffer from the `alloc` callable, held (object and view) while the columns are written.
struct Allocated {
    obj: Py<PyAny>,
    buf: PyBuffer<i8>,
}

impl Allocated {
    /// `alloc(len)`, checked: a writable, C-contiguous buffer of at least `len` bytes, aligned
    /// for `align`.
    fn new(alloc: &Bound<'_, PyAny>, len: usize, align: usize) -> PyResult<Allocated> {
        let refused = || {
            PyValueError::new_err(format!(
                "alloc must return a writable, contiguous buffer of {len} signed bytes (format 'b', as \
                 pyarrow.allocate_buffer's) aligned to {align}"
            ))
        };
        let obj = alloc.call1((len,))?;
        let buf = PyBuffer::<i8>::get(&obj).map_err(|_| refused())?;
        if buf.readonly()
            || !buf.is_c_contiguous()
            || buf.len_bytes() < len
            || !(buf.buf_ptr() as usize).is_multiple_of(align)
        {
            return Err(refused());
        }
        Ok(Allocated {
            obj: obj.unbind(),
            buf,
        })
    }

    fn range(&self) -> (usize, usize) {
        let at = self.buf.buf_ptr() as usize;
        (at, at + self.buf.len_bytes())
    }

    /// The buffer as `len` `T`s.
    ///
    /// # Safety
    ///
    /// No other reference to the buffer's bytes may be live while the slice is, and the slice
    /// must not outlive `self`.
    unsafe fn slice<'a, T>(&self, len: usize) -> &'a mut [T] {
        if len == 0 {
            return &mut [];
        }
        // SAFETY: `new` checked the buffer is writable, contiguous, aligned for T and holds at
        // least `len * size_of::<T>()` bytes (asked for as such); the caller promises exclusive use
        // while `self` holds the exporter alive.
        unsafe { std::slice::from_raw_parts_mut(self.buf.buf_ptr().cast::<T>(), len) }
    }
}

/// (offsets, data) buffers of one column: `items + 1` i64 offsets and `bytes` of data.
fn column(
    alloc: &Bound<'_, PyAny>,
    items: usize,
    bytes: usize,
) -> PyResult<(Allocated, Allocated)> {
    Ok((
        Allocated::new(alloc, (items + 1) * 8, 8)?,
        Allocated::new(alloc, bytes, 1)?,
    ))
}

/// One partition to write: its sizes and the buffers made for it.
struct Planned {
    partition: u32,
    items: usize,
    keys: Option<(Allocated, Allocated)>,
    values: Option<(Allocated, Allocated)>,
}

/// The columns of `partitions` of `table`'s pinned `version` (of `incarnation`) where `client`
/// maps them: None if nothing of the version can be read from shared memory now (not attached,
/// detached, the table created again); else one entry per partition, in order:
/// None for a partition not mapped (to be scanned over TCP), or `(partition, items, keys,
/// values)`. `keys` is (offsets, data, data bytes used) in buffers from `alloc(nbytes)`, or None
/// (not asked, or no items); `values` a [`MappedBuffer`] (i64, f64, f32 vectors), (offsets,
/// data, bytes used) (bytes tables), or None. `alloc` must return a fresh writable buffer each
/// call (`pyarrow.allocate_buffer`).
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the Python keyword arguments"
)]
#[pyfunction]
#[pyo3(signature = (client, table, version, incarnation, partitions, alloc, keys=true, values=true, threads=1))]
pub(crate) fn shm_columns<'py>(
    py: Python<'py>,
    client: &Client,
    table: &str,
    version: u32,
    incarnation: u64,
    partitions: Vec<u32>,
    alloc: &Bound<'py, PyAny>,
    keys: bool,
    values: bool,
    threads: usize,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let reader = py.allow_threads(|| client.inner.shm_reader(table, incarnation, version));
    let Some(reader) = reader.filter(|r| r.answers()) else {
        return Ok(None);
    };
    // Buffers first, with the GIL (alloc is Python).
    let mut plan: Vec<Option<Planned>> = Vec::with_capacity(partitions.len());
    for &p in &partitions {
        let Some(sizes) = reader.column_sizes(p) else {
            plan.push(None);
            continue;
        };
        let gathered = sizes.items > 0 && reader.mapped_values(p).is_none();
        plan.push(Some(Planned {
            partition: p,
            items: sizes.items,
            keys: (keys && sizes.items > 0)
                .then(|| column(alloc, sizes.items, sizes.key_bytes))
                .transpose()?,
            values: (values && gathered)
                .then(|| column(alloc, sizes.items, sizes.value_bytes))
                .transpose()?,
        }));
    }
    // Every slice below is written as `&mut`: no two buffers may overlap.
    let mut ranges: Vec<(usize, usize)> = plan
        .iter()
        .flatten()
        .flat_map(|pl| pl.keys.iter().chain(&pl.values))
        .flat_map(|(o, d)| [o.range(), d.range()])
        .filter(|(a, b)| a < b)
        .collect();
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
        return Err(PyValueError::new_err(
            "alloc returned overlapping buffers: it must return a fresh buffer on each call",
        ));
    }
    let mut outs: Vec<ColumnsOut<'_>> = plan
        .iter()
        .flatten()
        .map(|pl| {
            // SAFETY: the buffers are distinct (checked above), fresh from `alloc`, and `plan`
            // holds them (and their exporters) until after the write; nothing else touches them
            // while the GIL is released.
            let slices = |(o, d): &(Allocated, Allocated), bytes: usize| unsafe {
                (o.slice::<i64>(pl.items + 1), d.slice::<u8>(bytes))
            };
            let sizes = reader.column_sizes(pl.partition).expect("mapped above");
            ColumnsOut {
                partition: pl.partition,
                keys: pl.keys.as_ref().map(|c| slices(c, sizes.key_bytes)),
                values: pl.values.as_ref().map(|c| slices(c, sizes.value_bytes)),
                done: None,
            }
        })
        .collect();
    py.allow_threads(|| reader.write_columns(&mut outs, threads));
    let written: Vec<Option<(usize, usize)>> = outs.iter().map(|o| o.done).collect();
    drop(outs);

    let mut rows = Vec::with_capacity(plan.len());
    let mut written = written.into_iter();
    for pl in plan {
        let Some(pl) = pl else {
            rows.push(py.None().into_bound(py));
            continue;
        };
        let Some((kb, vb)) = written.next().expect("one per planned partition") else {
            rows.push(py.None().into_bound(py));
            continue;
        };
        let col = |c: Option<(Allocated, Allocated)>, used: usize| match c {
            Some((o, d)) => (o.obj, d.obj, used).into_bound_py_any(py),
            None => Ok(py.None().into_bound(py)),
        };
        let k = col(pl.keys, kb)?;
        let v = match (values && pl.items > 0, pl.values) {
            (_, Some(c)) => col(Some(c), vb)?,
            (true, None) => match reader.mapped_values(pl.partition) {
                Some(m) => Bound::new(py, MappedBuffer { inner: m })?.into_any(),
                None => py.None().into_bound(py),
            },
            (false, None) => py.None().into_bound(py),
        };
        let row = PyTuple::new(
            py,
            [
                pl.partition.into_bound_py_any(py)?,
                pl.items.into_bound_py_any(py)?,
                k,
                v,
            ],
        )?;
        rows.push(row.into_any());
    }
    Ok(Some(PyList::new(py, rows)?))
}
