//! Pipelined and asynchronous reads for Python (`python/ramgrid/aio.py` wraps them).
//!
//! `PipelinedGets` is an iterator over the results of an iterable of key batches, with up to
//! `depth` batches in flight on the client's servers (`ramgrid_client::Pipeline`); the GIL is
//! released while it waits. `AioReader` serves asyncio: one I/O thread per reader owns a pipeline,
//! takes the batches callers submit (each under a token), keeps up to `depth` of them in flight,
//! and puts each finished result on a list, waking the event loop through a socket pair; the
//! loop (aio.py) watches the socket and drains the list, converting results to Python objects on
//! its own thread. The I/O thread never takes the GIL, so it never waits for the loop's thread
//! to let go of it. A caller cancelled meanwhile simply never takes its result. The pipeline
//! matches every reply to its own batch by request id, so a cancelled call's reply can never be
//! read as another call's.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyIterator, PyList, PyTuple};
use ramgrid_client::{GetResult, OwnedKeys, Pipeline, Values};

use super::{to_py, Client, KeyHolder};

/// A copy of a Python batch of keys (any form `get_many` takes); the same errors for bad input.
fn owned_keys(keys: &Bound<'_, PyAny>) -> PyResult<OwnedKeys> {
    let holder = KeyHolder::new(keys)?;
    let slices = holder.slices()?;
    Ok(OwnedKeys::copy_of(holder.keys(&slices)))
}

/// `(values, found)` as `Client.get_many` returns them.
fn result_pair(py: Python<'_>, r: GetResult) -> PyResult<Bound<'_, PyTuple>> {
    let n = r.found.len();
    let values = match r.values {
        Values::I64(v) => v.into_pyarray(py).into_any(),
        Values::F64(v) => v.into_pyarray(py).into_any(),
        Values::F32Vec { dim, data } => data.into_pyarray(py).reshape([n, dim])?.into_any(),
        Values::Bytes(b) => {
            let list = PyList::empty(py);
            for (i, &hit) in r.found.iter().enumerate() {
                if hit {
                    list.append(PyBytes::new(py, b.get(i)))?;
                } else {
                    list.append(py.None())?;
                }
            }
            list.into_any()
        }
    };
    PyTuple::new(py, [values, r.found.into_pyarray(py).into_any()])
}

/// Results of a stream of batches, in order, with up to `depth` in flight.
#[pyclass(module = "ramgrid._native")]
pub(crate) struct PipelinedGets {
    pipeline: Pipeline,
    source: Option<Py<PyIterator>>,
    /// An error taking the next batch from the source: raised after the batches before it.
    source_error: Option<PyErr>,
    table: String,
    version: u32,
    incarnation: u64,
    depth: usize,
    /// Whether batches may be read from shared memory (`PinnedTable(shared_memory=False)`: no).
    shm: bool,
}

/// `PipelinedGets` over `batches` (an iterable of key batches) of `table`.
#[pyfunction]
#[pyo3(signature = (client, table, batches, depth=8, version=0, incarnation=0, shared_memory=true))]
pub(crate) fn get_many_pipelined(
    client: PyRef<'_, Client>,
    table: &str,
    batches: &Bound<'_, PyAny>,
    depth: usize,
    version: u32,
    incarnation: u64,
    shared_memory: bool,
) -> PyResult<PipelinedGets> {
    if depth == 0 {
        return Err(PyValueError::new_err("depth must be at least 1"));
    }
    Ok(PipelinedGets {
        pipeline: client.inner.pipeline(),
        source: Some(batches.try_iter()?.unbind()),
        source_error: None,
        table: table.to_string(),
        version,
        incarnation,
        depth,
        shm: shared_memory,
    })
}

#[pymethods]
impl PipelinedGets {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        // Refill once half the batches are taken, so the new ones go out together (one write
        // per server, which the server reads and answers at once).
        let refill = self.pipeline.in_flight() <= self.depth / 2;
        while refill && self.pipeline.in_flight() < self.depth {
            let Some(source) = &self.source else { break };
            let item = source.bind(py).clone().next();
            match item.map(|k| k.and_then(|k| owned_keys(&k))) {
                Some(Ok(keys)) => {
                    let (table, v, inc) = (&self.table, self.version, self.incarnation);
                    let (p, shm) = (&mut self.pipeline, self.shm);
                    py.allow_threads(|| p.submit_with(table, keys, v, inc, shm));
                }
                Some(Err(e)) => {
                    self.source_error = Some(e);
                    self.source = None;
                }
                None => self.source = None,
            }
        }
        let p = &mut self.pipeline;
        let Some(result) = py.allow_threads(|| p.next()) else {
            return match self.source_error.take() {
                Some(e) => Err(e),
                None => Ok(None),
            };
        };
        py.check_signals()?;
        match result {
            Ok(r) => result_pair(py, r).map(Some),
            Err(e) => Err(to_py(py, e)),
        }
    }

    /// Batches read again through the unpipelined path so far (a server failed or refused).
    #[getter]
    fn redone(&self) -> u64 {
        self.pipeline.redone()
    }
}

struct Job {
    table: String,
    keys: OwnedKeys,
    version: u32,
    incarnation: u64,
    token: u64,
    shm: bool,
}

/// Results the I/O thread has finished, waiting for the event loop to take them, and the socket
/// pair that wakes the loop: one byte is written when the list becomes non-empty.
struct Finished {
    results: Mutex<Vec<(u64, ramgrid_client::Result<GetResult>)>>,
    wake: UnixStream,
}

impl Finished {
    fn push(&self, token: u64, r: ramgrid_client::Result<GetResult>) {
        let mut results = lock(&self.results);
        let was_empty = results.is_empty();
        results.push((token, r));
        drop(results);
        if was_empty {
            // A full socket means a wake-up is pending already; nothing else can go wrong here
            // that the loop would not see as the reader's socket closing.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// The I/O thread behind asyncio reads (see the module). The event loop watches `fileno()` and
/// calls `drain()` when it is readable; the I/O thread never takes the GIL.
#[pyclass(module = "ramgrid._native", frozen)]
pub(crate) struct AioReader {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    finished: Arc<Finished>,
    /// The loop's end of the wake-up socket pair (non-blocking).
    woken: UnixStream,
}

#[pymethods]
impl AioReader {
    #[new]
    #[pyo3(signature = (client, depth=32))]
    fn new(client: PyRef<'_, Client>, depth: usize) -> PyResult<AioReader> {
        if depth == 0 {
            return Err(PyValueError::new_err("depth must be at least 1"));
        }
        let io = |e: std::io::Error| {
            PyRuntimeError::new_err(format!("cannot start the async reader: {e}"))
        };
        let (woken, wake) = UnixStream::pair().map_err(io)?;
        woken.set_nonblocking(true).map_err(io)?;
        wake.set_nonblocking(true).map_err(io)?;
        let finished = Arc::new(Finished {
            results: Mutex::new(Vec::new()),
            wake,
        });
        let (tx, rx) = mpsc::channel();
        let pipeline = client.inner.pipeline();
        let f = finished.clone();
        let thread = std::thread::Builder::new()
            .name("ramgrid-aio".into())
            .spawn(move || serve(pipeline, rx, depth, &f))
            .map_err(io)?;
        Ok(AioReader {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            finished,
            woken,
        })
    }

    /// Queues one batch under `token` (the caller's, handed back by `drain`). Bad keys raise
    /// here, as `get_many` raises them. With `shared_memory` false the batch is read over TCP
    /// even where its version is mapped from this host.
    #[pyo3(signature = (table, keys, version, incarnation, token, shared_memory=true))]
    fn submit(
        &self,
        table: &str,
        keys: &Bound<'_, PyAny>,
        version: u32,
        incarnation: u64,
        token: u64,
        shared_memory: bool,
    ) -> PyResult<()> {
        let job = Job {
            table: table.to_string(),
            keys: owned_keys(keys)?,
            version,
            incarnation,
            token,
            shm: shared_memory,
        };
        match &*lock(&self.jobs) {
            Some(tx) => tx
                .send(job)
                .map_err(|_| PyRuntimeError::new_err("the async reader's I/O thread has stopped")),
            None => Err(PyRuntimeError::new_err("the async reader is closed")),
        }
    }

    /// The file descriptor that becomes readable when results are waiting.
    fn fileno(&self) -> i32 {
        self.woken.as_raw_fd()
    }

    /// The results finished so far, in order: `[(token, ok, (values, found) or exception)]`.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Vec<(u64, bool, Bound<'py, PyAny>)>> {
        let mut sink = [0u8; 64];
        // Empty the wake-up bytes first: a result pushed after this wakes the loop again.
        while matches!((&self.woken).read(&mut sink), Ok(n) if n > 0) {}
        let results = std::mem::take(&mut *lock(&self.finished.results));
        let mut out = Vec::with_capacity(results.len());
        for (token, r) in results {
            out.push(
                match r.map_err(|e| to_py(py, e)).and_then(|r| result_pair(py, r)) {
                    Ok(pair) => (token, true, pair.into_any()),
                    Err(e) => (token, false, e.into_value(py).into_bound(py).into_any()),
                },
            );
        }
        Ok(out)
    }

    /// Stops taking batches, finishes those queued and waits for the I/O thread.
    fn close(&self, py: Python<'_>) {
        lock(&self.jobs).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = py.allow_threads(|| t.join());
        }
    }
}

/// A poisoned lock only means a panic elsewhere while it was held; what it guards stays valid.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The I/O thread: submit what is queued (up to `depth` in flight; waits for a job when none
/// is), then finish the oldest batch and hand its result over. Ends when the reader is closed or
/// dropped and nothing is left in flight.
fn serve(mut p: Pipeline, jobs: mpsc::Receiver<Job>, depth: usize, finished: &Finished) {
    let mut waiting: VecDeque<u64> = VecDeque::new();
    loop {
        while waiting.len() < depth {
            let job = if waiting.is_empty() {
                match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            p.submit_with(&job.table, job.keys, job.version, job.incarnation, job.shm);
            waiting.push_back(job.token);
        }
        if let (Some(result), Some(token)) = (p.next(), waiting.pop_front()) {
            finished.push(token, result);
        }
    }
}
