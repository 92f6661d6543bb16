"""Scans, filters and top_k over a whole table: the `_Scans` mixin of `Table` and `PinnedTable`.

A scan reads every item of one version of a table in chunks, one partition at a time, without knowing its keys.
Each partition's items are of one moment of it (never torn, never a key twice): the servers page it and the client
starts a partition again if it is written between two pages (docs/client.md, rule 15). Stopping early (leaving the
loop, `close()`, dropping the iterator) cancels it; the servers keep nothing between pages.

Chunks are `(keys, values)`:

- `keys`: a `pyarrow.LargeBinaryArray` built on the buffers the native module returns (no Python object per key,
  which is what makes 10 M-item scans cheap). `keys.to_pylist()` gives bytes; keys written as Python ints are their
  8-byte little-endian encoding, and `int_keys(keys)` views them as an int64 numpy array without a copy.
- `values`: a float64 / int64 numpy array, a float32 array of shape (n, dim) for vector tables, or a
  `pyarrow.LargeBinaryArray` for bytes tables.

With `format="arrow"` each chunk is a `pyarrow.RecordBatch` of columns `key` and `value` instead (arrow.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ramgrid._native import Client

from ramgrid.arrow import record_batch
from ramgrid.ops import _where

__all__ = ["int_keys"]


def _binary(offsets: np.ndarray, data: np.ndarray) -> Any:
    import pyarrow as pa

    n = len(offsets) - 1
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def int_keys(keys: Any) -> np.ndarray:
    """The int64 keys of a chunk whose keys were written as Python ints (each key 8 bytes), as a numpy view."""
    import pyarrow as pa

    arr = keys if isinstance(keys, pa.Array) else pa.array(keys, pa.large_binary())
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
    if len(arr) and not (np.diff(offsets) == 8).all():
        raise ValueError("not every key is 8 bytes: these keys were not written as ints")
    data = np.frombuffer(bufs[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return data.view("<i8")


def _format(fmt: str) -> str:
    if fmt not in ("numpy", "arrow"):
        raise ValueError(f'format must be "numpy" or "arrow", got {fmt!r}')
    return fmt


class ScanChunks:
    """An iterator of `(keys, values)` chunks, or of `pyarrow.RecordBatch`es when made with `format="arrow"` (see
    the module). `version` is the version read, `restarts` how many partitions were read again because they were
    written during the scan."""

    def __init__(self, it: Any, schema: Any = None) -> None:
        self._it = it
        self._schema = schema

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        _partition, offsets, data, values = next(self._it)
        keys = _binary(offsets, data)
        if isinstance(values, tuple):
            values = _binary(*values)
        if self._schema is not None:
            return record_batch(keys, values, self._schema)
        return keys, values

    @property
    def version(self) -> int:
        return int(self._it.version)

    @property
    def restarts(self) -> int:
        return int(self._it.restarts)

    def close(self) -> None:
        """Stops the scan; nothing is left to clean up on the servers."""
        self._it.close()

    def __enter__(self) -> ScanChunks:  # noqa: PYI034 (final in practice; Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Scans:
    """Whole-table reads: `scan`, `filter`, `top_k`. Mixed into Table (current version) and PinnedTable."""

    name: str
    _read_version: int = 0
    _read_incarnation: int = 0

    if TYPE_CHECKING:

        def _client(self) -> Client: ...  # the handle classes' (`_Reader._client`)

    def _schema(self, fmt: str) -> Any:
        if _format(fmt) == "numpy":
            return None
        from ramgrid.arrow import schema

        vt, dim = self._client().value_type(self.name)
        return schema(vt, dim)

    def scan(
        self,
        chunk_items: int = 65536,
        partitions: tuple[int, int] | None = None,
        prefer: str | None = None,
        format: str = "numpy",
    ) -> ScanChunks:
        """Every item of the table, in chunks of at most `chunk_items`, partition by partition (see the module).
        `partitions=(start, end)`: only partitions start..end-1 (a job's task reads one: `(p, p + 1)`).
        `prefer="host:port"`: ask that server first for each partition it holds a replica of (a task placed beside
        it reads there), where every replica holds the data: a pinned version confirmed sealed, or a client writing
        with ack="all". Otherwise, as without it, the primary is asked first. A preferred server that is down,
        slow or repairing is passed over for the next replica, as any read fails over. ValueError when `prefer`
        is not a server of the cluster. `format="arrow"`: chunks are `pyarrow.RecordBatch`es."""
        if int(chunk_items) < 1:
            raise ValueError("chunk_items must be at least 1")
        sch = self._schema(format)
        from ramgrid import _native

        parts = None if partitions is None else (int(partitions[0]), int(partitions[1]))
        it = _native.scan(
            self._client(),
            self.name,
            self._read_version,
            self._read_incarnation,
            None,
            int(chunk_items),
            partitions=parts,
            prefer=None if prefer is None else str(prefer),
        )
        return ScanChunks(it, sch)

    def filter(self, where: Any, chunk_items: int = 65536, format: str = "numpy") -> ScanChunks:
        """The items whose value satisfies `lo <= value < hi`, chunked as `scan`. `where` is `(lo, hi)` (on the value
        of a numeric table) or `dict(column=.., lo=.., hi=..)` (component `column` of a vector table); `None` for a
        bound leaves it open. The test runs on the servers, over the table's typed column. `format="arrow"`: chunks
        are `pyarrow.RecordBatch`es."""
        if int(chunk_items) < 1:
            raise ValueError("chunk_items must be at least 1")
        pred = _where(where)
        if pred is None:
            raise ValueError("filter needs a where: (lo, hi), a dict or a Where")
        sch = self._schema(format)
        from ramgrid import _native

        it = _native.scan(self._client(), self.name, self._read_version, self._read_incarnation, pred, int(chunk_items))
        return ScanChunks(it, sch)

    def top_k(self, k: int, column: int = 0, largest: bool = True, where: Any = None) -> tuple[list[bytes], np.ndarray]:
        """The `k` items with the largest (or, `largest=False`, smallest) values of `column` (component of a vector
        table; 0 otherwise), best first, equal values by key bytes: `(keys as bytes, values as float64)`. NaN values
        are never selected; int64 values beyond 2**53 are rounded (they travel as float64)."""
        if int(k) < 1:
            raise ValueError("k must be at least 1")
        pred = _where(where)
        from ramgrid import _native

        keys, values = _native.top_k(
            self._client(),
            self.name,
            int(k),
            self._read_version,
            self._read_incarnation,
            int(column),
            bool(largest),
            pred,
        )
        return list(keys), values
