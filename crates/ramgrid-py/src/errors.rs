//! Rust client errors as Python exceptions. The classes are defined once, in Python
//! (`python/ramgrid/exceptions.py`), and imported here; this module only maps each client error
//! kind to one of them (python/tests/unit/test_exceptions.py checks every kind maps to a defined class).

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;
use ramgrid_client::{ChunkedError, Error, ErrorKind};

/// The Python exception class name for an error kind (`ValueError` for bad arguments; the base
/// class for kinds with no class of their own).
pub(crate) fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidArgument => "ValueError",
        ErrorKind::ConnectionFailed => "ConnectionFailed",
        ErrorKind::Refused => "ServerRefused",
        ErrorKind::Timeout => "Timeout",
        ErrorKind::Auth => "AuthError",
        ErrorKind::Protocol => "ProtocolError",
        ErrorKind::TableNotFound => "TableNotFound",
        ErrorKind::TableExists => "TableExists",
        ErrorKind::VersionNotFound => "VersionNotFound",
        ErrorKind::VersionSealed => "VersionSealed",
        ErrorKind::OutOfMemory => "OutOfMemory",
        ErrorKind::PartitionsUnavailable => "PartitionsUnavailable",
        ErrorKind::Batch => "BatchError",
        ErrorKind::MoveFailed => "MoveFailed",
        _ => "RamgridError",
    }
}

/// The exception for a client error, with `partitions` / `failures` set where the class has them.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let msg = e.to_string();
    let name = class_name(e.kind());
    if name == "ValueError" {
        return PyValueError::new_err(msg);
    }
    let class = match py
        .import("ramgrid.exceptions")
        .and_then(|m| m.getattr(name))
        .and_then(|c| Ok(c.downcast_into::<PyType>()?))
    {
        Ok(c) => c,
        Err(why) => {
            return PyRuntimeError::new_err(format!(
                "{msg} (and ramgrid.exceptions.{name} is not usable: {why})"
            ))
        }
    };
    let err = PyErr::from_type(class, msg);
    match &e {
        Error::PartitionsUnavailable { partitions, .. } => {
            let _ = err.value(py).setattr("partitions", partitions.clone());
        }
        Error::Batch { failures } => {
            let _ = err.value(py).setattr("failures", failures.clone());
        }
        _ => {}
    }
    err
}

/// A chunked call's outcome as a Python exception: the client's error mapped, or the exception the
/// signal check between chunks raised (KeyboardInterrupt), as it was.
pub(crate) fn chunked_to_py(py: Python<'_>, e: ChunkedError<PyErr>) -> PyErr {
    match e {
        ChunkedError::Failed(e) => to_py(py, e),
        ChunkedError::Stopped(e) => e,
    }
}

/// (kind, exception class name) for every client error kind, for the test that each class is
/// defined in `ramgrid.exceptions`.
#[pyfunction]
pub(crate) fn error_classes() -> Vec<(String, &'static str)> {
    ErrorKind::ALL
        .iter()
        .map(|&k| (format!("{k:?}"), class_name(k)))
        .collect()
}
