"""Parquet row groups into batches of keys and values: the key and value columns picked by name or index,
converted to the load's key and value types, with null rows and rows that do not convert reported as bad rows, and
a damaged page named by its column chunk and byte range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ramgrid import splits
from ramgrid.exceptions import LoadError
from ramgrid.load.parse import MAX_KEY_BYTES, _hint, _Options, _parse_key, _parse_value, _value_array

# Reports a bad row: its row number (or line), and why.
BadRow = Callable[[int | None, str], None]


# Rows of a row group read, converted and written at a time.
_BATCH_ROWS = 1 << 17


def _row_group_batches(
    task: splits.FileSplit, opts: _Options
) -> Iterator[tuple[Any, Any, np.ndarray, list[tuple[int | None, str]]]]:
    """A Parquet task's row group as batches of (keys, values, row numbers, bad rows): the key and value columns
    converted to the load's types; rows that cannot be (a null, a key or value that does not convert) are left out
    and listed as (row number, reason). Row numbers count from 1 at the file's first row."""
    import pyarrow as pa

    pf = splits.parquet().ParquetFile(task.path)
    meta = pf.metadata
    row = sum(meta.row_group(i).num_rows for i in range(task.row_group)) + 1
    kname, vname = _parquet_columns(pf.schema_arrow, opts, task.path)
    batches = pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[task.row_group], columns=[kname, vname])
    while True:
        try:
            t = next(batches, None)
        except (OSError, pa.ArrowException) as e:  # a damaged page: say which column chunk, and where it lies
            raise _damaged_row_group(pf, task, (kname, vname), e) from None
        if t is None:
            return
        bad: list[tuple[int | None, str]] = []

        def note(r: int | None, why: str, bad: list[tuple[int | None, str]] = bad) -> None:
            bad.append((r, why))

        keys, values = t.column(kname), t.column(vname)
        rownum = np.arange(row, row + t.num_rows)
        row += t.num_rows
        keys, values, rownum = _drop_null_rows(note, keys, values, rownum)
        keys, values, rownum = _convert_parquet_keys(opts, note, pa, keys, values, rownum)
        values, keys, rownum = _convert_parquet_values(opts, note, pa, values, keys, rownum)
        yield keys, values, rownum, bad


def _parquet_columns(schema: Any, opts: _Options, path: str) -> tuple[str, str]:
    names = list(schema.names)

    def pick(col: Any, default: int) -> str:
        if col is None:
            col = default
        if isinstance(col, int):
            if not 0 <= col < len(names):
                raise LoadError.at(path, None, f"column index {col} out of range: the file has columns {names}")
            return str(names[col])
        if col not in names:
            raise LoadError.at(path, None, f"no column {col!r}: the file has columns {names}")
        return str(col)

    return pick(opts.key_column, 0), pick(opts.value_column, 1)


def _damaged_row_group(pf: Any, task: splits.FileSplit, names: tuple[str, str], e: BaseException) -> LoadError:
    """The LoadError for a row group that pyarrow could not read (a corrupt or truncated compressed page): it names
    the column chunk that fails when read alone and the compressed byte range it occupies in the file."""
    import pyarrow as pa

    rg = pf.metadata.row_group(task.row_group)
    for name in names:
        try:
            pf.read_row_group(task.row_group, columns=[name])
            continue
        except (OSError, pa.ArrowException) as alone:
            e = alone
        for j in range(rg.num_columns):
            c = rg.column(j)
            if c.path_in_schema == name or c.path_in_schema.startswith(name + "."):
                start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                where = f"column {name!r} (compressed bytes {start}-{start + c.total_compressed_size})"
                return LoadError.at(task.path, None, f"cannot read row group {task.row_group}, {where}: {e}")
    return LoadError.at(task.path, None, f"cannot read row group {task.row_group}: {e}")


def _keep(keys: Any, values: Any, rownum: np.ndarray, mask: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    import pyarrow as pa

    m = pa.array(mask)
    return keys.filter(m), values.filter(m), rownum[mask]


def _drop_null_rows(bad: BadRow, keys: Any, values: Any, rownum: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    if not keys.null_count and not values.null_count:
        return keys, values, rownum
    knull = np.asarray(keys.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    vnull = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    for i in np.flatnonzero(knull | vnull):
        bad(int(rownum[i]), "null key" if knull[i] else "null value")
    return _keep(keys, values, rownum, ~(knull | vnull))


def _convert_parquet_keys(opts: _Options, bad: BadRow, pa: Any, keys: Any, values: Any, rownum: np.ndarray) -> Any:
    import pyarrow.compute as pc

    t = keys.type
    if opts.key_type == "int":
        if pa.types.is_integer(t):
            return keys.cast(pa.int64()), values, rownum
        return _convert_per_row(
            opts, bad, keys, values, rownum, lambda x: _parse_key(_as_bytes(x), "int"), key_side=True
        )
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        lengths = np.asarray(pc.binary_length(keys).to_numpy(zero_copy_only=False))
        ok = (lengths > 0) & (lengths <= MAX_KEY_BYTES)
        if not ok.all():
            for i in np.flatnonzero(~ok):
                n = int(lengths[i])
                bad(int(rownum[i]), "empty key" if n == 0 else f"key is {n} bytes long; the limit is {MAX_KEY_BYTES}")
            return _keep(keys, values, rownum, ok)
        return keys, values, rownum
    return keys.cast(pa.string()), values, rownum  # e.g. integer ids with key_type="str": their decimal text


def _convert_parquet_values(opts: _Options, bad: BadRow, pa: Any, values: Any, keys: Any, rownum: np.ndarray) -> Any:
    vt = opts.value_type
    t = values.type
    if vt == "bytes":
        if not (
            pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t)
        ):
            values = values.cast(pa.string())
        return values, keys, rownum
    if vt == "f32vec":
        return values, keys, rownum
    target = pa.int64() if vt == "i64" else pa.float64()
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        try:
            return values.cast(target).to_numpy(), keys, rownum
        except pa.ArrowInvalid:
            pass  # e.g. 1.5 into i64: find the rows on the slow path
    v2, k2, r2 = _convert_per_row(
        opts, bad, values, keys, rownum, lambda x: _parse_value(_as_bytes(x), vt), key_side=False
    )
    return _value_array(list(v2), vt), k2, r2


def _as_bytes(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, float) and x.is_integer():
        return str(int(x)).encode()
    return str(x).encode()


def _convert_per_row(
    opts: _Options,
    bad: BadRow,
    col: Any,
    other: Any,
    rownum: np.ndarray,
    conv: Callable[[Any], tuple[Any, str]],
    key_side: bool,
) -> tuple[Any, Any, np.ndarray]:
    out: list[Any] = []
    keep = np.ones(len(col), dtype=bool)
    for i, x in enumerate(col.to_pylist()):
        v, why = conv(x)
        if why:
            bad(int(rownum[i]), why + ("" if key_side else _hint(opts)))
            keep[i] = False
        else:
            out.append(v)
    import pyarrow as pa

    other = other.filter(pa.array(keep))
    if key_side:
        return np.array(out, dtype=np.int64), other, rownum[keep]
    return out, other, rownum[keep]
