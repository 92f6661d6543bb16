"""Every exception ramgrid raises, rooted at `RamgridError`.

The classes for grid failures are defined in the native module (the binding maps Rust client errors to them) and
re-exported here; the ones that only the Python layer raises are defined below. When the native module is not
built, stand-ins with the same names and hierarchy are defined so that `ramgrid` can still be imported (for
`--help`, config checks and pure-Python tests); nothing can raise them then except the Python layer.
"""

from __future__ import annotations

from typing import Any

try:
    from ramgrid._native import (
        AuthError,
        BatchError,
        ConnectionFailed,
        OutOfMemory,
        PartitionsUnavailable,
        ProtocolError,
        RamgridError,
        ServerRefused,
        TableExists,
        TableNotFound,
        Timeout,
        VersionNotFound,
        VersionSealed,
    )

    NATIVE_EXCEPTIONS = True
except ImportError:  # the binding is not built: same names, same hierarchy
    NATIVE_EXCEPTIONS = False

    class RamgridError(Exception):  # type: ignore[no-redef]
        """Base class of every ramgrid error."""

    class ConnectionFailed(RamgridError):  # type: ignore[no-redef]
        """A server could not be reached."""

    class ServerRefused(ConnectionFailed):  # type: ignore[no-redef]
        """A server turned the connection away (e.g. too many open connections); the message says why."""

    class Timeout(RamgridError):  # type: ignore[no-redef]
        """A request got no answer in time."""

    class AuthError(RamgridError):  # type: ignore[no-redef]
        """The server refused the auth token."""

    class ProtocolError(RamgridError):  # type: ignore[no-redef]
        """A peer sent bytes that break the protocol."""

    class TableNotFound(RamgridError):  # type: ignore[no-redef]
        """No table by that name."""

    class TableExists(RamgridError):  # type: ignore[no-redef]
        """A table by that name exists already."""

    class VersionNotFound(RamgridError):  # type: ignore[no-redef]
        """No such version of the table."""

    class VersionSealed(RamgridError):  # type: ignore[no-redef]
        """The version is sealed and can no longer be written."""

    class OutOfMemory(RamgridError):  # type: ignore[no-redef]
        """A server's table memory is full."""

    class PartitionsUnavailable(RamgridError):  # type: ignore[no-redef]
        """No replica of these partitions answered."""

        partitions: list[int]

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.partitions = []

    class BatchError(RamgridError):  # type: ignore[no-redef]
        """Some keys of a batch were refused; the others were applied."""

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


# KeysNotFound is both a RamgridError and a KeyError, so `except KeyError` works as for a dict. If the native base
# class has an instance layout that cannot be combined with KeyError's, it is a RamgridError only.
try:

    class KeysNotFound(_KeysNotFoundBody, RamgridError, KeyError):
        """Keys asked for without a default were missing. `indices` holds the first positions (up to 20) in the
        batch, `count` how many were missing in all."""

except TypeError:  # pragma: no cover - depends on how the binding defines RamgridError

    class KeysNotFound(_KeysNotFoundBody, RamgridError):  # type: ignore[no-redef]
        """Keys asked for without a default were missing. `indices` holds the first positions (up to 20) in the
        batch, `count` how many were missing in all."""


__all__ = [
    "AuthError",
    "BatchError",
    "ConnectionFailed",
    "KeysNotFound",
    "LoadError",
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
