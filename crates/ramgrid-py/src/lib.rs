//! The PyO3 module `ramgrid._native`: converts types, releases the GIL around every network call and
//! maps errors to Python exceptions. Every policy lives in ramgrid-client or in the Python package;
//! the contract is `python/ramgrid/_native.pyi`.

mod aio;
mod arrow;
mod errors;
mod keys;
mod ops;
mod reduce;
mod scan;
mod shm;

use std::time::Duration;

use numpy::{
    IntoPyArray, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use ramgrid_client::{
    parse_type, type_name, Ack, Client as RustClient, ClientConfig, Consistency, Durability, Merge,
    MoveReport, TableDescription, ValueType, Values, ValuesRef,
};

use errors::chunked_to_py;
pub(crate) use errors::to_py;
pub(crate) use keys::{sliceable, KeyHolder};
/// Keys per network call in a long batch: between calls the GIL is taken back to check for Ctrl-C.
pub(crate) use ramgrid_client::CHUNK_KEYS;

/// A read's (values, found) as `get_many` returns them: the vectors handed to numpy without a
/// copy (float64/int64, float32 of shape (n, dim)), or a list of bytes / None for bytes tables.
pub(crate) fn values_to_py<'py>(
    py: Python<'py>,
    values: Values,
    found: Vec<bool>,
    n: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let values = match values {
        Values::I64(v) => v.into_pyarray(py).into_any(),
        Values::F64(v) => v.into_pyarray(py).into_any(),
        Values::F32Vec { dim, data } => data.into_pyarray(py).reshape([n, dim])?.into_any(),
        // Made at its length, not grown by appends.
        Values::Bytes(b) => PyList::new(
            py,
            found
                .iter()
                .enumerate()
                .map(|(i, &hit)| hit.then(|| PyBytes::new(py, b.get(i)))),
        )?
        .into_any(),
    };
    Ok((values, found.into_pyarray(py).into_any()))
}

/// Python's signal check, for a chunked call to run between chunks: with the GIL released for
/// the call, it takes the GIL back only for the check (Ctrl-C raises KeyboardInterrupt here).
pub(crate) fn check_signals() -> PyResult<()> {
    Python::with_gil(|py| py.check_signals())
}

fn description_dict<'py>(py: Python<'py>, d: &TableDescription) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("name", &d.name)?;
    out.set_item("partitions", d.partitions)?;
    out.set_item("replication", d.replication)?;
    out.set_item("value_type", type_name(d.value_type))?;
    out.set_item(
        "dim",
        if let ValueType::F32Vec(dim) = d.value_type {
            dim
        } else {
            0
        },
    )?;
    out.set_item("current_version", d.current_version)?;
    out.set_item("high_water", d.high_water)?;
    out.set_item("incarnation", d.incarnation)?;
    out.set_item(
        "durability",
        match d.durability {
            Durability::Memory => "memory",
            Durability::Snapshot => "snapshot",
            Durability::Log => "log",
        },
    )?;
    let versions = PyList::empty(py);
    for v in &d.versions {
        let e = PyDict::new(py);
        e.set_item("version", v.version)?;
        e.set_item("sealed", v.sealed)?;
        e.set_item("items", v.items)?;
        e.set_item("bytes", v.bytes)?;
        versions.append(e)?;
    }
    out.set_item("versions", versions)?;
    out.set_item("unreachable", d.unreachable.clone())?;
    Ok(out)
}

fn move_report_dict<'py>(py: Python<'py>, r: &MoveReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("from", r.from.clone())?;
    d.set_item("to", r.to.clone())?;
    d.set_item("partitions_copied", r.partitions_copied)?;
    d.set_item("bytes_copied", r.bytes_copied)?;
    d.set_item("seconds", r.seconds)?;
    Ok(d)
}

/// A cluster client (see `ramgrid_client::Client`). Thread-safe; pickled by the Python layer as its
/// configuration, never as sockets.
#[pyclass(module = "ramgrid._native", frozen)]
pub(crate) struct Client {
    inner: RustClient,
}

#[pymethods]
impl Client {
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors the Python constructor's keyword arguments"
    )]
    #[new]
    #[pyo3(signature = (servers, token=None, timeout_ms=5000, connect_timeout_ms=1000, ack="all", near_cache_bytes=0, pool_size=4, call_timeout_ms=30000, tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None, consistency="linearizable"))]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        token: Option<String>,
        timeout_ms: u64,
        connect_timeout_ms: u64,
        ack: &str,
        near_cache_bytes: usize,
        pool_size: usize,
        call_timeout_ms: u64,
        tls_ca: Option<std::path::PathBuf>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_server_name: Option<String>,
        consistency: &str,
    ) -> PyResult<Client> {
        let mut cfg = ClientConfig::new(servers);
        cfg.token = token;
        // TLS is on when a CA is given; a certificate, key or name without one is an error the
        // Python layer reports first (ramgrid.TLS).
        cfg.tls = tls_ca.map(|ca| ramgrid_client::TlsConfig {
            ca,
            cert: tls_cert,
            key: tls_key,
            server_name: tls_server_name,
        });
        cfg.timeout = Duration::from_millis(timeout_ms.max(1));
        cfg.call_timeout = Duration::from_millis(call_timeout_ms.max(1));
        cfg.connect_timeout = Duration::from_millis(connect_timeout_ms.max(1));
        cfg.ack = ack.parse::<Ack>().map_err(|e| to_py(py, e))?;
        cfg.consistency = consistency
            .parse::<Consistency>()
            .map_err(|e| to_py(py, e))?;
        cfg.near_cache_bytes = near_cache_bytes;
        cfg.pool_size = pool_size;
        cfg.client_name = format!(
            "ramgrid-py/{} pid {}",
            env!("CARGO_PKG_VERSION"),
            std::process::id()
        );
        let inner = RustClient::new(cfg).map_err(|e| to_py(py, e))?;
        Ok(Client { inner })
    }

    fn servers(&self) -> Vec<String> {
        self.inner.servers()
    }

    fn epoch(&self) -> u64 {
        self.inner.epoch()
    }

    fn refresh_spec(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.refresh_spec())
            .map_err(|e| to_py(py, e))
    }

    fn push_spec(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.push_spec())
            .map_err(|e| to_py(py, e))
    }

    #[pyo3(signature = (name, partitions=64, replication=1, value_type="bytes", dim=0, durability="memory"))]
    #[expect(clippy::too_many_arguments)]
    fn create_table(
        &self,
        py: Python<'_>,
        name: &str,
        partitions: u32,
        replication: u32,
        value_type: &str,
        dim: u32,
        durability: &str,
    ) -> PyResult<()> {
        let vt = parse_type(value_type, dim).map_err(|e| to_py(py, e))?;
        let durability = match durability {
            "memory" => Durability::Memory,
            "snapshot" => Durability::Snapshot,
            "log" => Durability::Log,
            other => {
                return Err(PyValueError::new_err(format!(
                    "durability must be \"memory\", \"snapshot\" or \"log\", not {other:?}"
                )))
            }
        };
        py.allow_threads(|| {
            self.inner
                .create_table_with(name, partitions, replication, vt, durability)
        })
        .map_err(|e| to_py(py, e))
    }

    fn drop_table(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.drop_table(name))
            .map_err(|e| to_py(py, e))
    }

    fn list_tables<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let tables = py
            .allow_threads(|| self.inner.list_tables())
            .map_err(|e| to_py(py, e))?;
        let out = PyList::empty(py);
        for t in &tables {
            out.append(description_dict(py, t)?)?;
        }
        Ok(out)
    }

    fn describe_table<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let d = py
            .allow_threads(|| self.inner.describe_table(name))
            .map_err(|e| to_py(py, e))?;
        description_dict(py, &d)
    }

    fn create_version(&self, py: Python<'_>, table: &str) -> PyResult<u32> {
        py.allow_threads(|| self.inner.create_version(table))
            .map_err(|e| to_py(py, e))
    }

    fn seal_version(&self, py: Python<'_>, table: &str, version: u32) -> PyResult<()> {
        py.allow_threads(|| self.inner.seal_version(table, version))
            .map_err(|e| to_py(py, e))
    }

    fn set_current(&self, py: Python<'_>, table: &str, version: u32) -> PyResult<()> {
        py.allow_threads(|| self.inner.set_current(table, version))
            .map_err(|e| to_py(py, e))
    }

    fn drop_version(&self, py: Python<'_>, table: &str, version: u32) -> PyResult<()> {
        py.allow_threads(|| self.inner.drop_version(table, version))
            .map_err(|e| to_py(py, e))
    }

    /// The table's value type name and its dimension (0 unless f32vec), from the client's table
    /// cache: one request the first time, none after.
    /// The incarnation id of the table of that name as this client knows it.
    fn incarnation(&self, py: Python<'_>, table: &str) -> PyResult<u64> {
        py.allow_threads(|| self.inner.table_meta(table))
            .map(|m| m.incarnation)
            .map_err(|e| to_py(py, e))
    }

    fn partitions(&self, py: Python<'_>, table: &str) -> PyResult<u32> {
        let meta = py
            .allow_threads(|| self.inner.table_meta(table))
            .map_err(|e| to_py(py, e))?;
        Ok(meta.partitions)
    }

    fn value_type(&self, py: Python<'_>, table: &str) -> PyResult<(&'static str, u32)> {
        let meta = py
            .allow_threads(|| self.inner.table_meta(table))
            .map_err(|e| to_py(py, e))?;
        let dim = match meta.value_type {
            ValueType::F32Vec(d) => d,
            _ => 0,
        };
        Ok((type_name(meta.value_type), dim))
    }

    fn current_version(&self, py: Python<'_>, table: &str) -> PyResult<u32> {
        py.allow_threads(|| self.inner.current_version(table))
            .map_err(|e| to_py(py, e))
    }

    /// Compares the replicas of every partition of `table` at `version` (0: current): (version,
    /// partitions agreed, their items, [(partition, [(server, items, digest)])] that differ,
    /// [(partition, server, why)] not compared).
    #[expect(
        clippy::type_complexity,
        reason = "a plain tuple the Python layer names"
    )]
    #[pyo3(signature = (table, version=0))]
    fn verify(
        &self,
        py: Python<'_>,
        table: &str,
        version: u32,
    ) -> PyResult<(
        u32,
        u32,
        u64,
        Vec<(u32, Vec<(String, u64, u64)>)>,
        Vec<(u32, String, String)>,
    )> {
        let v = py
            .allow_threads(|| self.inner.verify(table, version))
            .map_err(|e| to_py(py, e))?;
        let differ = v
            .differ
            .into_iter()
            .map(|(p, reps)| {
                let reps = reps.into_iter().map(|r| (r.server, r.items, r.digest));
                (p, reps.collect())
            })
            .collect();
        Ok((v.version, v.agreed, v.items, differ, v.unanswered))
    }

    /// The replicas of each partition of `table`, as server addresses, primary first.
    fn partition_owners(&self, py: Python<'_>, table: &str) -> PyResult<Vec<Vec<String>>> {
        py.allow_threads(|| self.inner.partition_owners(table))
            .map_err(|e| to_py(py, e))
    }

    /// Returns (values, found); see the .pyi for the shapes.
    #[pyo3(signature = (table, keys, version=0, incarnation=0, shared_memory=true))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        keys: &Bound<'py, PyAny>,
        version: u32,
        incarnation: u64,
        shared_memory: bool,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let holder = KeyHolder::new(keys)?;
        let slices = holder.slices()?;
        let keys = holder.keys(&slices);
        let n = keys.len();
        let client = &self.inner;
        let got = py
            .allow_threads(|| {
                let read = || {
                    client.get_chunked(table, incarnation, keys, version, CHUNK_KEYS, check_signals)
                };
                if shared_memory {
                    read()
                } else {
                    ramgrid_client::shm::tcp_only(read)
                }
            })
            .map_err(|e| chunked_to_py(py, e))?;
        values_to_py(py, got.values, got.found, n)
    }

    /// Maps the partitions of a pinned version held by servers on this host (shared memory);
    /// returns {"mapped": [partition...], "bytes", "servers", "skipped": [(server, why)...]}.
    #[pyo3(signature = (table, version, incarnation=0))]
    fn shm_attach<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        version: u32,
        incarnation: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let info = py
            .allow_threads(|| self.inner.shm_attach(table, incarnation, version))
            .map_err(|e| to_py(py, e))?;
        let d = PyDict::new(py);
        d.set_item("mapped", info.mapped)?;
        d.set_item("bytes", info.bytes)?;
        d.set_item("servers", info.servers)?;
        d.set_item("skipped", info.skipped)?;
        Ok(d)
    }

    /// Undoes one shm_attach; False if the version was not attached.
    #[pyo3(signature = (table, version, incarnation=0))]
    fn shm_detach(&self, table: &str, version: u32, incarnation: u64) -> bool {
        self.inner.shm_detach(table, incarnation, version)
    }

    /// Counters of reads answered from shared memory: {"hits", "misses", "remote", "attached",
    /// "mapped_bytes"}.
    fn shm_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.shm_stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("remote", s.remote)?;
        d.set_item("attached", s.attached)?;
        d.set_item("mapped_bytes", s.mapped_bytes)?;
        Ok(d)
    }

    /// Writes values; raises BatchError listing the keys that were not stored.
    /// `merge`: "store" (overwrite), or "add", "min", "max" to merge each value into the stored
    /// one on the server (i64 and f64 tables only).
    #[pyo3(signature = (table, keys, values, version=0, merge="store"))]
    fn put_many<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        keys: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        version: u32,
        merge: &str,
    ) -> PyResult<()> {
        let merge = match merge {
            "store" => Merge::Store,
            "add" => Merge::Add,
            "min" => Merge::Min,
            "max" => Merge::Max,
            other => {
                return Err(PyValueError::new_err(format!(
                    "merge must be one of store, add, min, max; got {other:?}"
                )))
            }
        };
        let holder = KeyHolder::new(keys)?;
        let slices = holder.slices()?;
        let keys = holder.keys(&slices);
        let n = keys.len();
        let meta = py
            .allow_threads(|| self.inner.table_meta(table))
            .map_err(|e| to_py(py, e))?;
        let vholder = ValueHolder::new(py, values, meta.value_type, n)?;
        let vslices = vholder.slices()?;
        let vals = vholder.values(&vslices);
        let client = &self.inner;
        py.allow_threads(|| {
            client.put_merge_chunked(table, keys, vals, version, merge, CHUNK_KEYS, check_signals)
        })
        .map_err(|e| chunked_to_py(py, e))
    }

    /// Deletes keys on every replica; returns how many were found.
    #[pyo3(signature = (table, keys, version=0))]
    fn delete_many<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        keys: &Bound<'py, PyAny>,
        version: u32,
    ) -> PyResult<usize> {
        let holder = KeyHolder::new(keys)?;
        let slices = holder.slices()?;
        let keys = holder.keys(&slices);
        let client = &self.inner;
        py.allow_threads(|| client.delete_chunked(table, keys, version, CHUNK_KEYS, check_signals))
            .map_err(|e| chunked_to_py(py, e))
    }

    /// One dict per server: {"server": addr, <stat>: value...}, or {"server": addr, "error": message}.
    fn server_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let stats = py.allow_threads(|| self.inner.server_stats());
        let out = PyList::empty(py);
        for (addr, r) in stats {
            let d = PyDict::new(py);
            d.set_item("server", addr)?;
            match r {
                Ok(pairs) => {
                    for (k, v) in pairs {
                        if let Ok(i) = v.parse::<i64>() {
                            d.set_item(k, i)?;
                        } else if let Ok(f) = v.parse::<f64>() {
                            d.set_item(k, f)?;
                        } else {
                            d.set_item(k, v)?;
                        }
                    }
                }
                Err(e) => d.set_item("error", e.to_string())?,
            }
            out.append(d)?;
        }
        Ok(out)
    }

    /// METRICS of every server of the spec: {"server": addr, "text": exposition} or
    /// {"server": addr, "error": message}.
    fn server_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let all = py.allow_threads(|| self.inner.metrics());
        let out = PyList::empty(py);
        for (addr, r) in all {
            let d = PyDict::new(py);
            d.set_item("server", addr)?;
            match r {
                Ok(text) => d.set_item("text", text)?,
                Err(e) => d.set_item("error", e.to_string())?,
            }
            out.append(d)?;
        }
        Ok(out)
    }

    /// Adds the running, empty server at `addr` and moves to it the partitions it gets (see
    /// `ramgrid_client::membership`); returns the move report as a dict.
    fn add_server<'py>(&self, py: Python<'py>, addr: &str) -> PyResult<Bound<'py, PyDict>> {
        let report = py
            .allow_threads(|| self.inner.add_server(addr))
            .map_err(|e| to_py(py, e))?;
        move_report_dict(py, &report)
    }

    /// Puts the running, empty server at `new` in the place of `dead` (failed over first if it
    /// does not answer); returns the move report as a dict.
    fn replace_server<'py>(
        &self,
        py: Python<'py>,
        dead: &str,
        new: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let report = py
            .allow_threads(|| self.inner.replace_server(dead, new))
            .map_err(|e| to_py(py, e))?;
        move_report_dict(py, &report)
    }

    /// Moves every partition off the server at `addr` and drops it from the spec; returns the
    /// move report as a dict.
    fn remove_server<'py>(&self, py: Python<'py>, addr: &str) -> PyResult<Bound<'py, PyDict>> {
        let report = py
            .allow_threads(|| self.inner.remove_server(addr))
            .map_err(|e| to_py(py, e))?;
        move_report_dict(py, &report)
    }

    /// Rebuilds the metadata group from the live servers after it lost its majority for good:
    /// {"generation", "leader", "joined", "dead", "lost": {table: [partitions]}, "unsettled"}.
    fn recover<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = py
            .allow_threads(|| self.inner.recover())
            .map_err(|e| to_py(py, e))?;
        let d = PyDict::new(py);
        d.set_item("generation", r.generation)?;
        d.set_item("leader", r.leader)?;
        d.set_item("joined", r.joined)?;
        d.set_item("dead", r.dead)?;
        d.set_item("lost", r.lost)?;
        d.set_item("unsettled", r.unsettled)?;
        Ok(d)
    }

    /// CLUSTER_STATUS of every server of the spec (both ends of a move in progress), in order:
    /// {"server": addr, "ok": bool, "error": str | None, <key>: value...}.
    fn cluster_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let statuses = py.allow_threads(|| self.inner.cluster_status());
        let out = PyList::empty(py);
        for (addr, r) in statuses {
            let d = PyDict::new(py);
            d.set_item("server", addr)?;
            match r {
                Ok(pairs) => {
                    d.set_item("ok", true)?;
                    d.set_item("error", py.None())?;
                    for (k, v) in pairs {
                        match k.as_str() {
                            // The server's own id; "server" is the address it was asked at.
                            "server" => d.set_item("server_id", v)?,
                            // Hex, and all digits often enough to pass for a decimal.
                            "epoch" => match u64::from_str_radix(&v, 16) {
                                Ok(e) => d.set_item(k, e)?,
                                Err(_) => d.set_item(k, v)?,
                            },
                            _ => match v.parse::<i64>() {
                                Ok(i) => d.set_item(k, i)?,
                                Err(_) => d.set_item(k, v)?,
                            },
                        }
                    }
                }
                Err(e) => {
                    d.set_item("ok", false)?;
                    d.set_item("error", e.to_string())?;
                }
            }
            out.append(d)?;
        }
        Ok(out)
    }

    fn close(&self) {
        self.inner.close();
    }

    fn __repr__(&self) -> String {
        format!(
            "<ramgrid._native.Client servers={:?} epoch={:#x}>",
            self.inner.servers(),
            self.inner.epoch()
        )
    }
}

/// Put values as Python handed them, converted to the table's type.
enum ValueHolder<'py> {
    I64(PyReadonlyArray1<'py, i64>),
    F64(PyReadonlyArray1<'py, f64>),
    F32(PyReadonlyArrayDyn<'py, f32>),
    List(Vec<Bound<'py, PyAny>>),
    /// Bytes values packed as `(offsets, data)`: value `i` is `data[offsets[i]..offsets[i + 1]]`
    /// (an Arrow binary column's buffers, handed over without a Python object per value).
    Packed(PyReadonlyArray1<'py, i64>, Bound<'py, PyBytes>),
}

impl<'py> ValueHolder<'py> {
    fn new(
        py: Python<'py>,
        values: &Bound<'py, PyAny>,
        vt: ValueType,
        n: usize,
    ) -> PyResult<ValueHolder<'py>> {
        if vt == ValueType::Bytes {
            if let Ok(t) = values.downcast::<PyTuple>() {
                return Self::packed(t, n);
            }
            let list = values.downcast::<PyList>().map_err(|_| {
                PyTypeError::new_err(
                    "values of a bytes table must be a list of bytes or str, or an (offsets, data) tuple",
                )
            })?;
            let items: Vec<_> = list.iter().collect();
            for it in &items {
                if !it.is_instance_of::<PyBytes>() && !it.is_instance_of::<PyString>() {
                    return Err(PyTypeError::new_err(format!(
                        "bytes table values must be bytes or str, not {}",
                        it.get_type().name()?
                    )));
                }
            }
            return Ok(ValueHolder::List(items));
        }
        let np = py.import("numpy")?;
        let dtype = match vt {
            ValueType::I64 => "int64",
            ValueType::F64 => "float64",
            _ => "float32",
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("casting", "same_kind")?;
        kwargs.set_item("copy", false)?;
        // same_kind casting refuses float -> int (silent truncation) but allows int -> float. Layout
        // and alignment are fixed by `sliceable` below, copying only when needed.
        let arr = np.call_method1("asarray", (values,))?.call_method(
            "astype",
            (dtype,),
            Some(&kwargs),
        )?;
        let shape_err = |what: String| PyValueError::new_err(what);
        match vt {
            ValueType::I64 | ValueType::F64 => {
                let nd: usize = arr.getattr("ndim")?.extract()?;
                if nd != 1 {
                    return Err(shape_err(format!(
                        "values must be 1-D for a {} table, got {nd}-D",
                        type_name(vt)
                    )));
                }
                if vt == ValueType::I64 {
                    Ok(ValueHolder::I64(
                        sliceable(arr.downcast_into::<PyArray1<i64>>()?)?.readonly(),
                    ))
                } else {
                    Ok(ValueHolder::F64(
                        sliceable(arr.downcast_into::<PyArray1<f64>>()?)?.readonly(),
                    ))
                }
            }
            ValueType::F32Vec(dim) => {
                let a = sliceable(arr.downcast_into::<PyArrayDyn<f32>>()?)?;
                let shape = a.shape().to_vec();
                let ok = match shape.as_slice() {
                    [rows, d] => *rows == n && *d == dim as usize,
                    [len] => *len == n * dim as usize,
                    _ => false,
                };
                if !ok {
                    return Err(shape_err(format!(
                        "values must have shape ({n}, {dim}) for this f32vec table, got {shape:?}"
                    )));
                }
                Ok(ValueHolder::F32(a.readonly()))
            }
            ValueType::Bytes => unreachable!("handled above"),
        }
    }

    /// Packed bytes values: `offsets` a 1-D int64 array of `n + 1` entries, `data` bytes. Their
    /// order and bounds are checked by the client before anything is sent.
    fn packed(t: &Bound<'py, PyTuple>, n: usize) -> PyResult<ValueHolder<'py>> {
        let err = || {
            PyTypeError::new_err(
                "packed values: a tuple of a 1-D int64 numpy array of offsets and the bytes",
            )
        };
        if t.len() != 2 {
            return Err(err());
        }
        let offsets = t
            .get_item(0)?
            .downcast_into::<PyArray1<i64>>()
            .map_err(|_| err())?;
        let data = t
            .get_item(1)?
            .downcast_into::<PyBytes>()
            .map_err(|_| err())?;
        let offsets = sliceable(offsets)?.readonly();
        if offsets.len() != n + 1 {
            return Err(PyValueError::new_err(format!(
                "{n} keys but {} packed values",
                offsets.len().saturating_sub(1)
            )));
        }
        Ok(ValueHolder::Packed(offsets, data))
    }

    fn slices(&self) -> PyResult<Vec<&[u8]>> {
        let ValueHolder::List(items) = self else {
            return Ok(Vec::new());
        };
        items
            .iter()
            .map(|it| match it.downcast::<PyString>() {
                Ok(s) => s.to_str().map(str::as_bytes),
                Err(_) => Ok(it.downcast::<PyBytes>()?.as_bytes()),
            })
            .collect()
    }

    fn values<'a>(&'a self, slices: &'a [&'a [u8]]) -> ValuesRef<'a> {
        match self {
            ValueHolder::I64(a) => ValuesRef::I64(a.as_slice().unwrap_or_default()),
            ValueHolder::F64(a) => ValuesRef::F64(a.as_slice().unwrap_or_default()),
            ValueHolder::F32(a) => ValuesRef::F32(a.as_slice().unwrap_or_default()),
            ValueHolder::List(_) => ValuesRef::Slices(slices),
            ValueHolder::Packed(o, d) => ValuesRef::Packed {
                offsets: o.as_slice().unwrap_or_default(),
                data: d.as_bytes(),
            },
        }
    }
}

/// Runs a ramgrid server in this process with ramgrid-server's flags (see
/// `ramgrid_server::run_until`): prints the listening line and blocks (without the GIL) until
/// SIGTERM or SIGINT, or until a Python signal handler raises.
#[pyfunction]
fn run_server(py: Python<'_>, args: Vec<String>) -> PyResult<()> {
    let config = match ramgrid_server::parse_args(args).map_err(PyValueError::new_err)? {
        ramgrid_server::Args::Run(config) => config,
        ramgrid_server::Args::Print(text) => {
            print!("{text}");
            return Ok(());
        }
    };
    // SIGINT reaches both the server's handler and Python's (which only sets a flag); a
    // KeyboardInterrupt pending from it is the stop we asked for, not an error. A Python signal
    // handler that raised anything else ends the server too, with its exception.
    let mut raised = None;
    py.allow_threads(|| {
        ramgrid_server::run_until(&config, || {
            Python::with_gil(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    raised = Some(e);
                    true
                }
            })
        })
    })
    .map_err(|e| PyOSError::new_err(format!("{e:#}")))?;
    match raised {
        Some(e) if !Python::with_gil(|py| e.is_instance_of::<PyKeyboardInterrupt>(py)) => Err(e),
        _ => Ok(()),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<shm::ShmReader>()?;
    m.add_function(wrap_pyfunction!(shm::shm_reader, m)?)?;
    m.add_function(wrap_pyfunction!(run_server, m)?)?;
    m.add_function(wrap_pyfunction!(keys::partition_of, m)?)?;
    m.add_function(wrap_pyfunction!(ops::run_op, m)?)?;
    m.add_class::<scan::ScanIter>()?;
    m.add_class::<arrow::MappedBuffer>()?;
    m.add_function(wrap_pyfunction!(arrow::shm_columns, m)?)?;
    m.add_class::<aio::PipelinedGets>()?;
    m.add_class::<aio::AioReader>()?;
    m.add_function(wrap_pyfunction!(aio::get_many_pipelined, m)?)?;
    m.add_function(wrap_pyfunction!(scan::scan, m)?)?;
    m.add_function(wrap_pyfunction!(scan::top_k, m)?)?;
    m.add_function(wrap_pyfunction!(reduce::lookup_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_classes, m)?)?;
    Ok(())
}
