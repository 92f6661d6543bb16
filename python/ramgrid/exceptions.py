"""Every exception ramgrid raises, rooted at `RamgridError`.

This module is the one definition of ramgrid's exception classes. The native module raises the grid failures below
by importing them from here (crates/ramgrid-py/src/errors.rs maps each Rust client error kind to one of them), so
they exist, and can be caught, whether or not the binding is built.
"""

from __future__ import annotations

from typing import Any


class RamgridError(Exception):
    """Base class of every ramgrid error."""


class ConnectionFailed(RamgridError):
    """A server could not be reached, or the connection broke."""


class ServerRefused(ConnectionFailed):
    """A server turned the connection away (e.g. it has too many open connections); the message says why."""


class Timeout(RamgridError):
    """A request got no answer in time."""


class AuthError(RamgridError):
    """The server refused the auth token."""


class ProtocolError(RamgridError):
    """A peer sent bytes that break the protocol."""


class TableNotFound(RamgridError):
    """No table by that name."""


class TableExists(RamgridError):
    """A table by that name exists already."""


class VersionNotFound(RamgridError):
    """No such version of the table."""


class VersionSealed(RamgridError):
    """The version is sealed and can no longer be written."""


class OutOfMemory(RamgridError):
    """A server's table memory is full."""


class PartitionsUnavailable(RamgridError):
    """No replica of these partitions answered; `partitions` lists them (ascending)."""

    partitions: list[int]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.partitions = []


class MoveFailed(RamgridError):
    """Adding or removing a server did not happen, or was undone: the cluster runs the spec it ran before. Not a
    usage error: a member that did not answer is failed over within the failure timeout (the move waits up to
    30 s for that), after which asking again succeeds."""


class BatchError(RamgridError):
    """Some keys of a batch were refused; the others were applied. `failures` lists (index in the batch, reason)
    for each refused key, ascending by index."""

    failures: list[tuple[int, str]]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.failures = []


class LoadError(RamgridError, ValueError):
    """A load stopped on bad input. `path` is the file, `line` the 1-based line (the row for Parquet) or None when
    the problem is not tied to one line, `reason` what was wrong. Nothing of the load became visible."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.reason = reason or message

    @classmethod
    def at(cls, path: str, line: int | None, reason: str, what: str = "line") -> LoadError:
        message = f"{path}: {reason}" if line is None else f"{path}: {what} {line}: {reason}"
        return cls(message, path, line, reason)

    def __reduce__(self) -> Any:  # crosses process boundaries (Dask workers) with its attributes
        return (type(self), (str(self.args[0]) if self.args else "", self.path, self.line, self.reason))

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ValueOutOfRange(RamgridError, ValueError):
    """A value given to `put_many` or `put` does not fit the table's type, so the whole call was refused and nothing
    of it stored: an int outside int64 or a float that is not an integer, for an i64 table; a finite number whose
    magnitude float32 cannot hold (it would become inf), for an f32vec table; a number float64 cannot hold, for an
    f64 table. `index` is the position of the first such value in the batch (its row, for vectors), `value` the
    value."""

    def __init__(self, message: str, index: int | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.index = index
        self.value = value

    def __reduce__(self) -> Any:  # crosses process boundaries (Dask workers) with its attributes
        return (type(self), (str(self.args[0]) if self.args else "", self.index, self.value))

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CommitPending(RamgridError):
    """A MapReduce job did all its work but could not switch its output version in time: `servers` (addresses)
    were down or still repairing when `commit_timeout` ran out. Nothing was lost: the job's tables and its open
    output version are kept, and `ramgrid.mapreduce.resume(job_id, grid)` seals and switches it (no task runs
    again) once those servers are back or removed from the cluster."""

    def __init__(self, message: str, job_id: str = "", servers: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.servers = tuple(servers)

    def __reduce__(self) -> Any:
        return (type(self), (str(self.args[0]) if self.args else "", self.job_id, self.servers))

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ServerStartError(RamgridError):
    """A local server process did not start (its exit status and stderr are in the message)."""


class _KeysNotFoundBody(Exception):
    indices: list[int]

    def __init__(self, message: str, indices: list[int], count: int) -> None:
        super().__init__(message)
        self.indices = indices
        self.count = count

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class KeysNotFound(_KeysNotFoundBody, RamgridError, KeyError):
    """Keys asked for without a default were missing (a RamgridError and a KeyError, so `except KeyError` works as
    for a dict). `indices` holds the first positions (up to 20) in the batch, `count` how many were missing in
    all."""


__all__ = [
    "AuthError",
    "BatchError",
    "CommitPending",
    "ConnectionFailed",
    "KeysNotFound",
    "LoadError",
    "MoveFailed",
    "OutOfMemory",
    "PartitionsUnavailable",
    "ProtocolError",
    "RamgridError",
    "ServerRefused",
    "ServerStartError",
    "TableExists",
    "TableNotFound",
    "Timeout",
    "ValueOutOfRange",
    "VersionNotFound",
    "VersionSealed",
]
