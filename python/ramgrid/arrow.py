"""Tables out as Arrow: `to_arrow()`, Arrow record batches from `scan`/`filter`, and the Arrow C stream interface
(`__arrow_c_stream__`) that polars, DuckDB and pandas read without copies in Python.

A table comes out as two columns, `key` (large_binary; keys written as Python ints are their 8-byte little-endian
encoding, `ramgrid.scan.int_keys` views them as int64) and `value`: float64 or int64, `fixed_size_list<float32>[dim]`
for vector tables, large_binary for bytes tables. Every batch is built on the buffers the native scan returns: no
Python object per item. A batch holds one scan chunk (one partition's items, at most `chunk_items`), so the stream
is as consistent as a scan: each partition of one moment, and one version throughout (a `Table`'s current version
when the call starts; `to_arrow`'s parallel scans all read the version it pins first).

    import duckdb, polars as pl
    t = grid.table("words")
    duckdb.sql("select count(*), avg(value) from t")   # t is read through __arrow_c_stream__
    df = pl.from_arrow(t.to_arrow())
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

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

    def to_batches(
        self, where: Any = None, columns: Sequence[str] | None = None, chunk_items: int = 1 << 20
    ) -> Iterator[pa.RecordBatch]:
        """The table's items (those whose value satisfies `where`, as `filter` takes it) as Arrow record batches of
        at most `chunk_items` rows, one partition's items at a time, in partition order."""
        sch = self.arrow_schema(columns)
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
        GIL), so the servers' passes, the transfers and the decoding overlap; batches come in partition order."""
        import pyarrow as pa

        sch = self.arrow_schema(columns)
        parts = self._client().partitions(self.name)
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
