"""Tables out as Arrow: `to_arrow()`, Arrow record batches from `scan`/`filter`, and the Arrow C stream interface
(`__arrow_c_stream__`) that polars, DuckDB and pandas read without copies in Python.

A table comes out as two columns, `key` (large_binary; keys written as Python ints are their 8-byte little-endian
encoding, `ramgrid.scan.int_keys` views them as int64) and `value`: float64 or int64, `fixed_size_list<float32>[dim]`
for vector tables, large_binary for bytes tables. Every batch is built on the buffers the native scan returns: no
Python object per item. A batch holds one scan chunk (one partition's items, at most `chunk_items`), so the stream
is as consistent as a scan: each partition of one moment, and one version throughout (a `Table`'s current version
when the call starts; `to_arrow`'s parallel scans all read the version it pins first).

A `PinnedTable` whose partitions this process maps from servers on its host (docs/shared-memory.md) is read from the
mappings instead, with no request: the native module gathers the keys (and bytes values) of several partitions at once
with the GIL released, and numeric and vector values are the mapped bytes themselves, not copied (such a table keeps
the mapping alive while it lives). `where=` is tested here, on the mapped values, exactly as the servers test it
(`lo <= x < hi`, `x` the value or vector component as a float64); a predicate that does not fit the table (bytes
values, a component out of range) goes to the servers, which refuse it. Partitions not mapped are scanned over TCP.

    import duckdb, polars as pl
    t = grid.table("words")
    duckdb.sql("select count(*), avg(value) from t")   # t is read through __arrow_c_stream__
    df = pl.from_arrow(t.to_arrow())
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ramgrid.ops import _where

if TYPE_CHECKING:
    import pyarrow as pa

    from ramgrid._native import Client
    from ramgrid.scan import ScanChunks

COLUMNS = ("key", "value")


def _columns(columns: Sequence[str] | None) -> tuple[str, ...]:
    if columns is None:
        return COLUMNS
    if isinstance(columns, str):
        columns = [columns]
    cols = tuple(columns)
    bad = [c for c in cols if c not in COLUMNS]
    if bad or not cols or len(set(cols)) != len(cols):
        raise ValueError(f"columns must be a non-empty selection of {COLUMNS} without repeats, got {columns!r}")
    return cols


def value_type(vt: str, dim: int) -> pa.DataType:
    """The Arrow type of a table's values."""
    import pyarrow as pa

    if vt == "f64":
        return pa.float64()
    if vt == "i64":
        return pa.int64()
    if vt == "f32vec":
        return pa.list_(pa.float32(), int(dim))
    return pa.large_binary()


def schema(vt: str, dim: int, columns: Sequence[str] | None = None) -> pa.Schema:
    """The schema of a table's batches (`columns` among "key" and "value", in that order of choice)."""
    import pyarrow as pa

    types = {"key": pa.large_binary(), "value": value_type(vt, dim)}
    return pa.schema([pa.field(c, types[c], nullable=False) for c in _columns(columns)])


def _values(values: Any, typ: pa.DataType) -> pa.Array:
    import pyarrow as pa

    if isinstance(values, pa.Array):  # bytes tables: already a LargeBinaryArray on the native buffers
        return values
    if isinstance(typ, pa.FixedSizeListType):
        flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.float32()), typ.list_size)
    return pa.array(values, type=typ)  # a view of the numpy array's buffer, no copy


def _binary(n: int, offsets: Any, data: Any, used: int) -> pa.Array:
    """A large binary array on (offsets, data) buffers that `_native.shm_columns` wrote, `used` bytes of data."""
    import pyarrow as pa

    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, offsets, data.slice(0, used)])


def _mapped_values(n: int, values: Any, typ: pa.DataType) -> pa.Array:
    """A partition's values from `_native.shm_columns`: a read-only buffer on the mapping (numbers, vectors) wrapped
    in place, or the buffers bytes values were written into."""
    import pyarrow as pa

    if isinstance(values, tuple):
        return _binary(n, *values)
    buf = pa.py_buffer(values)
    if isinstance(typ, pa.FixedSizeListType):
        dim = typ.list_size
        return pa.FixedSizeListArray.from_arrays(pa.Array.from_buffers(pa.float32(), n * dim, [None, buf]), dim)
    return pa.Array.from_buffers(typ, n, [None, buf])


def _local_where(pred: tuple[int, float, float] | None, typ: pa.DataType) -> bool:
    """Whether `pred` (component, lo, hi) can be tested here as the servers test it: on a numeric column it fits."""
    import pyarrow as pa

    if pred is None:
        return True
    if isinstance(typ, pa.FixedSizeListType):
        return pred[0] < int(typ.list_size)
    return pred[0] == 0 and bool(pa.types.is_float64(typ) or pa.types.is_int64(typ))


def _selected(n: int, values: Any, typ: pa.DataType, pred: tuple[int, float, float]) -> np.ndarray:
    """The servers' predicate over mapped values: `lo <= x < hi` with `x` the value (or vector component) as a
    float64, as `ops::Col::get` makes it (an int64 rounded to the nearest double); NaN is never selected."""
    import pyarrow as pa

    comp, lo, hi = pred
    if isinstance(typ, pa.FixedSizeListType):
        x = np.frombuffer(values, dtype="<f4").reshape(n, typ.list_size)[:, comp].astype(np.float64)
    elif pa.types.is_int64(typ):
        x = np.frombuffer(values, dtype="<i8").astype(np.float64)
    else:
        x = np.frombuffer(values, dtype="<f8")
    return np.asarray((x >= lo) & (x < hi))


def _mapped_batches(
    column: tuple[int, int, Any, Any],
    sch: pa.Schema,
    chunk_items: int,
    typ: pa.DataType,
    pred: tuple[int, float, float] | None = None,
) -> list[pa.RecordBatch]:
    """One mapped partition's columns (values of type `typ`) as batches of at most `chunk_items` rows: slices of one
    batch, with no copy; with `pred`, of the rows it selects (copied out, in entry order)."""
    import pyarrow as pa

    _partition, n, keys, values = column
    if n == 0:
        return []
    arrays = [_binary(n, *keys) if f.name == "key" else _mapped_values(n, values, typ) for f in sch]
    batch = pa.RecordBatch.from_arrays(arrays, schema=sch)
    if pred is not None:
        batch = batch.filter(pa.array(_selected(n, values, typ, pred)))
        n = batch.num_rows
    return [batch.slice(i, chunk_items) for i in range(0, n, chunk_items)]


def _scanned(it: Any, sch: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The chunks of a native scan (`_native.scan`: keys and bytes values as (offsets, data) arrays) as batches."""
    import pyarrow as pa

    def binary(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
        bufs = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1, bufs)

    try:
        for _partition, offsets, data, values in it:
            yield record_batch(binary(offsets, data), binary(*values) if isinstance(values, tuple) else values, sch)
    finally:
        it.close()


def record_batch(keys: pa.Array, values: Any, sch: pa.Schema) -> pa.RecordBatch:
    """One scan chunk as a batch of schema `sch`."""
    import pyarrow as pa

    arrays = []
    for f in sch:
        arrays.append(keys if f.name == "key" else _values(values, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


class _Arrow:
    """`to_arrow`, `to_batches` and `__arrow_c_stream__`; mixed into Table and PinnedTable (which give `scan` and
    `filter`)."""

    name: str
    _read_version: int = 0
    _read_incarnation: int = 0

    if TYPE_CHECKING:

        def _client(self) -> Client: ...

        def scan(
            self,
            chunk_items: int = 65536,
            partitions: tuple[int, int] | None = None,
            prefer: str | None = None,
            format: str = "numpy",
        ) -> ScanChunks: ...

        def filter(self, where: Any, chunk_items: int = 65536, format: str = "numpy") -> ScanChunks: ...

    def arrow_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        """The Arrow schema of this table's batches."""
        vt, dim = self._client().value_type(self.name)
        return schema(vt, dim, columns)

    def _mapped(
        self,
        sch: pa.Schema,
        partitions: list[int],
        chunk_items: int,
        threads: int,
        pred: tuple[int, float, float] | None = None,
    ) -> list[pa.RecordBatch] | None:
        """The batches of `partitions` (in order) read from this process's shared-memory mappings of a pinned
        version (the rows `pred` selects, if given), a partition that is not mapped scanned over TCP; None, with
        nothing read, when nothing can be read from the mappings now (not a PinnedTable that maps anything, detached,
        a forked child) or `pred` cannot be tested here (the servers then say why)."""
        if not getattr(self, "_attached", False):
            return None
        import pyarrow as pa

        from ramgrid import _native

        vt, dim = self._client().value_type(self.name)
        typ = value_type(vt, dim)
        if not _local_where(pred, typ):
            return None
        names = sch.names
        cols = _native.shm_columns(
            self._client(),
            self.name,
            self._read_version,
            self._read_incarnation,
            partitions,
            pa.allocate_buffer,  # pyarrow's memory pool: it keeps its pages between calls, as for pyarrow's readers
            "key" in names,
            "value" in names or pred is not None,
            threads,
        )
        if cols is None:
            return None
        out: list[pa.RecordBatch] = []
        for p, c in zip(partitions, cols):
            if c is not None:
                out.extend(_mapped_batches(c, sch, chunk_items, typ, pred))
                continue
            it = _native.scan(
                self._client(), self.name, self._read_version, self._read_incarnation, pred, chunk_items, 8, (p, p + 1)
            )
            out.extend(_scanned(it, sch))
        return out

    def to_batches(
        self, where: Any = None, columns: Sequence[str] | None = None, chunk_items: int = 1 << 20
    ) -> Iterator[pa.RecordBatch]:
        """The table's items (those whose value satisfies `where`, as `filter` takes it) as Arrow record batches of
        at most `chunk_items` rows, one partition's items at a time, in partition order. A PinnedTable's mapped
        partitions are read from shared memory, a few partitions at a time as they are consumed."""
        if int(chunk_items) < 1:
            raise ValueError("chunk_items must be at least 1")
        sch = self.arrow_schema(columns)
        pred = _where(where)
        start = 0
        if getattr(self, "_attached", False):
            parts = self._client().partitions(self.name)
            step = max(1, os.cpu_count() or 1)
            while start < parts:
                window = list(range(start, min(parts, start + step)))
                got = self._mapped(sch, window, int(chunk_items), len(window), pred)
                if got is None:
                    break  # not (or no longer) readable from the mappings: the rest over TCP
                yield from got
                start += len(window)
            if start >= parts:
                return
        if start:
            from ramgrid import _native

            parts = self._client().partitions(self.name)
            it = _native.scan(
                self._client(),
                self.name,
                self._read_version,
                self._read_incarnation,
                pred,
                int(chunk_items),
                8,
                (start, parts),
            )
            yield from _scanned(it, sch)
            return
        chunks = self.scan(chunk_items) if where is None else self.filter(where, chunk_items)
        with chunks:
            for keys, values in chunks:
                yield record_batch(keys, values, sch)

    def to_arrow(
        self,
        where: Any = None,
        columns: Sequence[str] | None = None,
        chunk_items: int = 1 << 20,
        threads: int = 8,
    ) -> pa.Table:
        """The table (its items whose value satisfies `where`) as a `pyarrow.Table` of columns `key` and `value`
        (or those named in `columns`); see the module for the types. Built from the scan's buffers: no Python
        object per item. `threads` scans of disjoint partition ranges run at once (the native scan releases the
        GIL), so the servers' passes, the transfers and the decoding overlap; batches come in partition order.
        A PinnedTable's mapped partitions are read from shared memory instead, on `threads` threads at most (no more
        than the cores), numbers and vectors in place, `where` tested here as the servers test it (see the
        module)."""
        import pyarrow as pa

        if int(chunk_items) < 1:
            raise ValueError("chunk_items must be at least 1")
        sch = self.arrow_schema(columns)
        parts = self._client().partitions(self.name)
        mapped = self._mapped(sch, list(range(parts)), int(chunk_items), max(1, int(threads)), _where(where))
        if mapped is not None:
            return pa.Table.from_batches(mapped, schema=sch)
        k = max(1, min(int(threads), parts))
        if where is not None or k == 1:
            return pa.Table.from_batches(list(self.to_batches(where, columns, chunk_items)), schema=sch)

        # One version for every range: a Table's current one, pinned before the scans start.
        pin = getattr(self, "pin", None)
        src: _Arrow = pin(shared_memory=False) if pin is not None else self

        def ranged(i: int) -> list[pa.RecordBatch]:
            with src.scan(chunk_items, partitions=(i * parts // k, (i + 1) * parts // k)) as chunks:
                return [record_batch(keys, values, sch) for keys, values in chunks]

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(k, thread_name_prefix="ramgrid-arrow") as ex:
            ranges = list(ex.map(ranged, range(k)))
        return pa.Table.from_batches([b for r in ranges for b in r], schema=sch)

    def to_reader(self, where: Any = None, columns: Sequence[str] | None = None) -> pa.RecordBatchReader:
        """A `pyarrow.RecordBatchReader` over the table's batches, read as they are consumed."""
        import pyarrow as pa

        return pa.RecordBatchReader.from_batches(self.arrow_schema(columns), self.to_batches(where, columns))

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow C stream interface (a PyCapsule): polars, DuckDB, pandas and pyarrow read the whole table
        through it, batch by batch, as they consume it."""
        return self.to_reader().__arrow_c_stream__(requested_schema)
