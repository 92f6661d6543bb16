"""Parallel loads of key -> value files (text/TSV/CSV, Parquet, directories of them) into a new version of a table.

    report = ramgrid.load.load_table(grid, "unigrams", "counts.tsv")          # or table.load("counts.tsv")
    print(report)   # rows, bytes, bad lines, version, seconds, rows/s

A load is cut into tasks: byte ranges of plain text files (each range owns the lines that start inside it), one task
per compressed file, one per Parquet row group. Tasks run on a local thread pool (the native calls and pyarrow's
parser release the GIL) or, given a Dask client, on its workers; each parses its part and writes batches into one
open version of the table. The version is sealed and made current only when every task succeeded: writes use
ack="all", so a batch that returned reached every replica of its partitions. On any failure the version is dropped
and the previous one stays current; a table the load itself created is dropped again.

A bad line stops the load with a `LoadError` (a ValueError) naming the file, line and reason, unless
`skip_bad_lines=True`, which skips and counts such lines. Line semantics for text files: lines end at "\\n" (a "\\r"
before it is dropped), blank lines are ignored, and the key is the text before the first delimiter and the value
the rest of the line, unless `key_column` / `value_column` pick fields (0-based) of a line split at every delimiter.
Keys are the raw bytes of the field (`key_type="int"` parses them as int64 keys); values are parsed as the table's
type (i64, f64) or kept as raw bytes. No quoting is interpreted.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np

from ramgrid import splits
from ramgrid._clients import client_for
from ramgrid._gzip import gunzip
from ramgrid._types import parse_value_type, spell_value_type
from ramgrid.engines import DaskEngine, ThreadEngine, engine_for
from ramgrid.exceptions import BatchError, LoadError, RamgridError, TableNotFound
from ramgrid.grid import Grid, Table, VersionPart, VersionWriter

if TYPE_CHECKING:
    from ramgrid.grid import GridConfig

__all__ = [
    "LoadError",
    "LoadReport",
    "infer_value_type",
    "load_main",
    "load_table",
    "plan_tasks",
    "table_load",
]

PathLike = Union[str, "os.PathLike[str]"]

# The tasks a load is cut into: its input's splits (exposed for tests and for sizing `chunk_bytes`).
plan_tasks = splits.plan_splits

_INFER_ROWS = 1000
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
log = logging.getLogger("ramgrid.load")

_MAX_BAD_SAMPLES = 10
# The client refuses a whole batch with a longer key, so such a key is caught here, as a bad line.
MAX_KEY_BYTES = 65535


@dataclass
class LoadReport:
    """What a load did. `rows` counts the rows written (duplicate keys included; the last write of a key wins),
    `bytes` the input bytes read (on disk: compressed files count their compressed size)."""

    table: str
    version: int
    rows: int
    bytes: int
    bad_lines: int
    seconds: float
    value_type: str
    key_type: str
    files: int
    tasks: int
    bad_samples: list[tuple[str, int | None, str]] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rows_per_s"] = self.rows_per_s
        return d

    def __str__(self) -> str:
        bad = f", skipped {self.bad_lines:,} bad lines" if self.bad_lines else ""
        return (
            f"loaded {self.rows:,} rows ({_human_bytes(self.bytes)}) from {self.files} file(s) into "
            f"{self.table!r} version {self.version} in {self.seconds:.2f} s ({self.rows_per_s:,.0f} rows/s){bad}"
        )


# ---------------------------------------------------------------------------------------------------------------
# options and targets (plain picklable data: they travel to Dask workers, with the tasks' splits)


@dataclass(frozen=True)
class _Options:
    delimiter: bytes
    key_column: Any  # int field index for text, column name or index for Parquet; None = default
    value_column: Any
    value_type: str
    key_type: str  # "str" (raw bytes) or "int" (int64 keys)
    header: bool
    skip_bad_lines: bool
    batch_rows: int
    read_block: int
    inferred_from: str  # non-empty when value_type was inferred: a hint for error messages


@dataclass(frozen=True)
class _Target:
    config: GridConfig
    table: str
    version: int


@dataclass
class _TaskResult:
    rows: int = 0
    bytes: int = 0
    bad_lines: int = 0
    bad_samples: list[tuple[str, int | None, str]] = field(default_factory=list)


class _Cancelled(Exception):
    """Another task failed; this one stops between batches."""


# ---------------------------------------------------------------------------------------------------------------
# parsing text


class _Rows:
    """Parsed rows of one piece: keys, values and, from the slow path, each row's line index within the piece."""

    def __init__(self, keys: Any, values: Any, lines: list[int] | None, bad: list[tuple[int, str]]) -> None:
        self.keys = keys
        self.values = values
        self.lines = lines
        self.bad = bad

    def __len__(self) -> int:
        return len(self.values)


def _hint(opts: _Options) -> str:
    return (
        f" (value type {opts.value_type} was inferred from {opts.inferred_from}; pass value_type=)"
        if (opts.inferred_from)
        else ""
    )


def _parse_value(v: bytes, vt: str) -> tuple[Any, str]:
    """Returns (value, "") or (None, reason)."""
    if vt == "bytes":
        return v, ""
    if vt == "i64":
        try:
            x = int(v)
        except ValueError:
            return None, f"value {_show(v)} is not an integer"
        if not _I64_MIN <= x <= _I64_MAX:
            return None, f"value {_show(v)} is outside the int64 range"
        return x, ""
    try:
        return float(v), ""
    except ValueError:
        return None, f"value {_show(v)} is not a number"


def _parse_key(k: bytes, key_type: str) -> tuple[Any, str]:
    if not k:
        return None, "empty key"
    if key_type == "str":
        if len(k) > MAX_KEY_BYTES:
            return None, f"key is {len(k)} bytes long; the limit is {MAX_KEY_BYTES}"
        return k, ""
    try:
        x = int(k)
    except ValueError:
        return None, f"key {_show(k)} is not an integer (key_type='int')"
    if not _I64_MIN <= x <= _I64_MAX:
        return None, f"key {_show(k)} is outside the int64 range"
    return x, ""


def _show(b: bytes, limit: int = 40) -> str:
    s = repr(b[:limit])[1:]  # repr of bytes without the b prefix
    return s + ("..." if len(b) > limit else "")


def _parse_slow(data: bytes, opts: _Options) -> _Rows:
    """Line by line, in Python: the reference semantics, and the path that knows line numbers."""
    d = opts.delimiter
    kc, vc = opts.key_column, opts.value_column
    need = max(kc, vc) + 1 if kc is not None else 0
    keys: list[Any] = []
    values: list[Any] = []
    lines: list[int] = []
    bad: list[tuple[int, str]] = []
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    for i, line in enumerate(parts):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            continue
        if kc is None:
            k, sep, v = line.partition(d)
            if not sep:
                bad.append((i, f"no delimiter {d.decode('latin-1')!r} in the line"))
                continue
        else:
            fields = line.split(d)
            if len(fields) < need:
                bad.append((i, f"expected at least {need} fields, got {len(fields)}"))
                continue
            k, v = fields[kc], fields[vc]
        key, why = _parse_key(k, opts.key_type)
        if why:
            bad.append((i, why))
            continue
        value, why = _parse_value(v, opts.value_type)
        if why:
            bad.append((i, why + _hint(opts)))
            continue
        keys.append(key)
        values.append(value)
        lines.append(i)
    return _Rows(_key_array(keys, opts.key_type), _value_array(values, opts.value_type), lines, bad)


def _key_array(keys: list[Any], key_type: str) -> Any:
    return np.array(keys, dtype=np.int64) if key_type == "int" else keys


def _value_array(values: list[Any], vt: str) -> Any:
    if vt == "i64":
        return np.array(values, dtype=np.int64)
    if vt == "f64":
        return np.array(values, dtype=np.float64)
    return values


def _parse_fast(data: bytes, opts: _Options) -> _Rows | None:
    """pyarrow's CSV parser, or None when it is unavailable or the piece needs the slow path (a bad line, a "\\r",
    an empty key): whenever this returns rows they are exactly the rows `_parse_slow` would return."""
    if len(opts.delimiter) != 1 or b"\r" in data or not data.strip(b"\n"):
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pcsv
    except ImportError:
        return None
    kc = 0 if opts.key_column is None else opts.key_column
    vc = 1 if opts.value_column is None else opts.value_column
    vtype = {"i64": pa.int64(), "f64": pa.float64()}.get(opts.value_type, pa.binary())
    ktype = pa.int64() if opts.key_type == "int" else pa.binary()
    kname, vname = f"f{kc}", f"f{vc}"
    try:
        table = pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(autogenerate_column_names=True, use_threads=False),
            parse_options=pcsv.ParseOptions(
                delimiter=opts.delimiter.decode("latin-1"),
                quote_char=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={kname: ktype, vname: vtype},
                # Without chosen columns a line is "key<delimiter>rest": every row must then have exactly two fields.
                include_columns=[kname, vname] if opts.key_column is not None else [],
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowKeyError, KeyError):
        return None
    if opts.key_column is None and table.num_columns != 2:
        return None
    keys = table.column(kname).combine_chunks()
    values = table.column(vname).combine_chunks()
    if opts.key_type == "str" and len(keys):
        lengths = pc.min_max(pc.binary_length(keys)).as_py()
        if lengths["min"] == 0 or lengths["max"] > MAX_KEY_BYTES:
            return None
    if opts.value_type in ("i64", "f64"):
        return _Rows(keys, values.to_numpy(), None, [])
    return _Rows(keys, values, None, [])


# ---------------------------------------------------------------------------------------------------------------
# running a task


class _TaskRun:
    """State of one task while it runs: counters, bad-line samples, and where to report progress."""

    def __init__(
        self,
        target: _Target,
        opts: _Options,
        task: splits.FileSplit,
        progress: Callable[[int, int], None] | None,
        cancel: threading.Event | None,
    ) -> None:
        self.target = target
        self.opts = opts
        self.task = task
        self.progress = progress
        self.cancel = cancel
        self.client = client_for(target.config)
        self.part = VersionPart(Grid(target.config), target.table, target.version)
        self.result = _TaskResult()
        # Lines of the file before this task's first line: counted only when a message needs a line number.
        self._line_base: int | None = 0 if task.kind != "range" or task.start == 0 else None
        self.first_line_offset = task.start

    def line_base(self, lines_in_task: int) -> int:
        """Absolute number of lines before a piece, given the lines this task saw before it."""
        if self._line_base is None:
            self._line_base = splits.lines_before(self.task.path, self.first_line_offset)
        return self._line_base + lines_in_task

    def bad(self, line: int | None, reason: str) -> None:
        if not self.opts.skip_bad_lines:
            what = "row" if self.task.kind == "parquet" else "line"
            raise LoadError.at(self.task.path, line, reason, what)
        self.result.bad_lines += 1
        if len(self.result.bad_samples) < _MAX_BAD_SAMPLES:
            self.result.bad_samples.append((self.task.path, line, reason))

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise _Cancelled()

    def write(self, keys: Any, values: Any, line_of: Callable[[int], int | None] | None) -> int:
        """Writes rows in batches; returns how many were stored. `line_of(i)` names row i's line for a refused key;
        without it a refusal raises _NeedLines so the caller can redo the piece on the slow path."""
        n = len(values)
        stored = 0
        step = self.opts.batch_rows
        for lo in range(0, n, step):
            self.check_cancel()
            hi = min(n, lo + step)
            try:
                self.part.put_many(keys[lo:hi], values[lo:hi])
                stored += hi - lo
            except BatchError as e:
                failures = list(getattr(e, "failures", []) or [])
                fatal = [f for f in failures if _is_fatal(f[1])]
                if fatal or not failures:
                    raise
                if line_of is None:
                    raise _NeedLines() from None
                for i, why in sorted(failures):
                    self.bad(line_of(lo + i), f"key refused by the grid: {why}")
                stored += hi - lo - len(failures)
        return stored


class _NeedLines(Exception):
    """A fast-path write had a key refused; the piece is redone on the slow path to name its line."""


_ROW_REFUSALS = ("KEY_TOO_LARGE", "VALUE_TOO_LARGE", "WRONG_TYPE")


def _is_fatal(reason: str) -> bool:
    """Only refusals caused by the row itself are bad lines; anything else (no memory, a replica short of the
    acknowledgement level, a server error) fails the load as a grid error."""
    return not reason.startswith(_ROW_REFUSALS)


def _run_task(
    target: _Target,
    opts: _Options,
    task: splits.FileSplit,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
) -> _TaskResult:
    """Runs one load task: parses its part of the input and writes it into the open version."""
    run = _TaskRun(target, opts, task, progress, cancel)
    try:
        if task.kind == "parquet":
            _run_parquet(run)
        else:
            _run_text(run)
    except OSError as e:
        raise LoadError.at(task.path, None, f"cannot read: {e.strerror or e}") from None
    return run.result


def _run_text(run: _TaskRun) -> None:
    task, opts = run.task, run.opts
    pieces = splits.text_pieces(task, opts.read_block)
    lines_seen = 0
    consumed = 0
    first = True
    for data, mark in pieces:
        run.check_cancel()
        if first and task.kind == "range":
            run.first_line_offset = mark
        skip = 0
        if first and opts.header and (task.kind == "stream" or task.start == 0):
            nl = data.find(b"\n")
            skip = len(data) if nl < 0 else nl + 1
        first = False
        body = data[skip:]
        header_lines = 1 if skip else 0
        _write_piece(run, body, lines_seen + header_lines)
        lines_seen += data.count(b"\n")
        if task.kind == "stream":
            step, consumed = mark - consumed, mark
        else:
            # A range accounts for exactly its own bytes, though its last line may run past its end.
            step = min(len(data), task.size - run.result.bytes)
        run.result.bytes += step
        if run.progress is not None and step:
            run.progress(0, step)
    if task.kind == "range" and task.size > run.result.bytes:
        rest = task.size - run.result.bytes  # the partial first line, which the previous range owns
        run.result.bytes += rest
        if run.progress is not None:
            run.progress(0, rest)


def _write_piece(run: _TaskRun, body: bytes, lines_before: int) -> None:
    opts = run.opts

    def line_of_index(i: int) -> int:
        return run.line_base(lines_before) + i + 1

    rows = _parse_fast(body, opts)
    if rows is not None:
        try:
            stored = run.write(rows.keys, rows.values, None)
            run.result.rows += stored
            if run.progress is not None:
                run.progress(stored, 0)
            return
        except _NeedLines:
            pass  # redo on the slow path, which knows each row's line; rewriting a key is idempotent
    rows = _parse_slow(body, opts)
    for i, why in rows.bad:
        run.bad(line_of_index(i), why)
    lines = rows.lines or []
    stored = run.write(rows.keys, rows.values, lambda j: line_of_index(lines[j]))
    run.result.rows += stored
    if run.progress is not None:
        run.progress(stored, 0)


def _run_parquet(run: _TaskRun) -> None:
    import pyarrow as pa

    task, opts = run.task, run.opts
    pf = splits.parquet().ParquetFile(task.path)
    meta = pf.metadata
    row0 = sum(meta.row_group(i).num_rows for i in range(task.row_group))
    kname, vname = _parquet_columns(pf.schema_arrow, opts, task.path)
    try:
        t = pf.read_row_group(task.row_group, columns=[kname, vname])
    except (OSError, pa.ArrowException) as e:  # a damaged page: say which column chunk, and where it lies
        raise _damaged_row_group(pf, task, (kname, vname), e) from None
    keys = t.column(kname).combine_chunks()
    values = t.column(vname).combine_chunks()
    rownum = np.arange(row0 + 1, row0 + 1 + t.num_rows)
    keys, values, rownum = _drop_null_rows(run, keys, values, rownum)
    keys, values, rownum = _convert_parquet_keys(run, pa, keys, values, rownum)
    values, keys, rownum = _convert_parquet_values(run, pa, values, keys, rownum)
    stored = run.write(keys, values, lambda j: int(rownum[j]))
    run.result.rows += stored
    run.result.bytes += task.size
    if run.progress is not None:
        run.progress(stored, task.size)


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


def _keep(keys: Any, values: Any, rownum: np.ndarray, mask: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    import pyarrow as pa

    m = pa.array(mask)
    return keys.filter(m), values.filter(m), rownum[mask]


def _drop_null_rows(run: _TaskRun, keys: Any, values: Any, rownum: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    if not keys.null_count and not values.null_count:
        return keys, values, rownum
    knull = np.asarray(keys.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    vnull = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    for i in np.flatnonzero(knull | vnull):
        run.bad(int(rownum[i]), "null key" if knull[i] else "null value")
    return _keep(keys, values, rownum, ~(knull | vnull))


def _convert_parquet_keys(run: _TaskRun, pa: Any, keys: Any, values: Any, rownum: np.ndarray) -> Any:
    import pyarrow.compute as pc

    t = keys.type
    if run.opts.key_type == "int":
        if pa.types.is_integer(t):
            return keys.cast(pa.int64()), values, rownum
        return _convert_per_row(run, keys, values, rownum, lambda x: _parse_key(_as_bytes(x), "int"), key_side=True)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        lengths = np.asarray(pc.binary_length(keys).to_numpy(zero_copy_only=False))
        ok = (lengths > 0) & (lengths <= MAX_KEY_BYTES)
        if not ok.all():
            for i in np.flatnonzero(~ok):
                n = int(lengths[i])
                run.bad(
                    int(rownum[i]), "empty key" if n == 0 else f"key is {n} bytes long; the limit is {MAX_KEY_BYTES}"
                )
            return _keep(keys, values, rownum, ok)
        return keys, values, rownum
    return keys.cast(pa.string()), values, rownum  # e.g. integer ids with key_type="str": their decimal text


def _convert_parquet_values(run: _TaskRun, pa: Any, values: Any, keys: Any, rownum: np.ndarray) -> Any:
    vt = run.opts.value_type
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
    v2, k2, r2 = _convert_per_row(run, values, keys, rownum, lambda x: _parse_value(_as_bytes(x), vt), key_side=False)
    return _value_array(list(v2), vt), k2, r2


def _as_bytes(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, float) and x.is_integer():
        return str(int(x)).encode()
    return str(x).encode()


def _convert_per_row(
    run: _TaskRun, col: Any, other: Any, rownum: np.ndarray, conv: Callable[[Any], tuple[Any, str]], key_side: bool
) -> tuple[Any, Any, np.ndarray]:
    out: list[Any] = []
    keep = np.ones(len(col), dtype=bool)
    for i, x in enumerate(col.to_pylist()):
        v, why = conv(x)
        if why:
            run.bad(int(rownum[i]), why + ("" if key_side else _hint(run.opts)))
            keep[i] = False
        else:
            out.append(v)
    import pyarrow as pa

    other = other.filter(pa.array(keep))
    if key_side:
        return np.array(out, dtype=np.int64), other, rownum[keep]
    return out, other, rownum[keep]


# ---------------------------------------------------------------------------------------------------------------
# inference


def infer_value_type(
    path: PathLike,
    *,
    format: str | None = None,
    delimiter: str | None = None,
    key_column: Any = None,
    value_column: Any = None,
    header: bool = False,
    rows: int = _INFER_ROWS,
) -> str | tuple[str, int]:
    """The value type of the first rows of the first file: "i64" if every value is an integer, "f64" if every value
    is a number, else "bytes". For Parquet, from the value column's type (a fixed-size float list gives
    ("f32vec", dim))."""
    files = splits.input_files(Path(path), format)
    p, fmt = files[0]
    if fmt == "parquet":
        return _infer_parquet(p, key_column, value_column)
    opts = _text_options(fmt, delimiter, key_column, value_column, "bytes", "str", header, True, 10_000, 1 << 20, "")
    sample = _head_lines(p, rows + (1 if header else 0))
    if header:
        nl = sample.find(b"\n")
        sample = b"" if nl < 0 else sample[nl + 1 :]
    parsed = _parse_slow(sample, opts)
    vals = [v.strip() for v in parsed.values]
    if not vals:
        return "bytes"
    if all(_parse_value(v, "i64")[1] == "" for v in vals):
        return "i64"
    if all(_parse_value(v, "f64")[1] == "" for v in vals):
        return "f64"
    return "bytes"


def _head_lines(p: Path, n: int) -> bytes:
    try:
        if splits.is_gzip(p):
            out, lines = [], 0
            for data, _ in gunzip(str(p), 1 << 16):
                out.append(data)
                lines += data.count(b"\n")
                if lines >= n:
                    break
            head = b"".join(out)
            end = -1
            for _ in range(n):
                end = head.find(b"\n", end + 1)
                if end < 0:
                    return head
            return head[: end + 1]
        with open(p, "rb") as f:
            return b"".join(line for line, _ in zip(f, range(n)))
    except OSError as e:
        raise LoadError.at(str(p), None, f"cannot read: {e}") from None


def _infer_parquet(p: Path, key_column: Any, value_column: Any) -> str | tuple[str, int]:
    import pyarrow as pa

    pf = splits.parquet().ParquetFile(str(p))
    opts = _text_options("parquet", None, key_column, value_column, "bytes", "str", False, True, 1, 1, "")
    _, vname = _parquet_columns(pf.schema_arrow, opts, str(p))
    t = pf.schema_arrow.field(vname).type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "i64"
    if pa.types.is_floating(t):
        return "f64"
    if pa.types.is_fixed_size_list(t) and pa.types.is_floating(t.value_type):
        return ("f32vec", int(t.list_size))
    return "bytes"


def _infer_key_type(path: Path, fmt: str, key_column: Any, value_column: Any) -> str:
    if fmt != "parquet":
        return "str"
    import pyarrow as pa

    pf = splits.parquet().ParquetFile(str(path))
    opts = _text_options("parquet", None, key_column, value_column, "bytes", "str", False, True, 1, 1, "")
    kname, _ = _parquet_columns(pf.schema_arrow, opts, str(path))
    return "int" if pa.types.is_integer(pf.schema_arrow.field(kname).type) else "str"


def _text_options(
    fmt: str,
    delimiter: str | None,
    key_column: Any,
    value_column: Any,
    value_type: str,
    key_type: str,
    header: bool,
    skip_bad_lines: bool,
    batch_rows: int,
    read_block: int,
    inferred_from: str,
) -> _Options:
    if fmt == "parquet":
        d = b"\t"
    else:
        d = (delimiter if delimiter is not None else ("," if fmt == "csv" else "\t")).encode()
        if not d or b"\n" in d or b"\r" in d:
            raise ValueError(f"delimiter must be a non-empty string without line breaks, got {delimiter!r}")
        if key_column is not None or value_column is not None:
            key_column = 0 if key_column is None else key_column
            value_column = 1 if value_column is None else value_column
            if not (isinstance(key_column, int) and isinstance(value_column, int)) or min(key_column, value_column) < 0:
                raise ValueError("for text files key_column and value_column are 0-based field indices")
            if key_column == value_column:
                raise ValueError("key_column and value_column must differ")
    return _Options(
        d, key_column, value_column, value_type, key_type, header, skip_bad_lines, batch_rows, read_block, inferred_from
    )


# ---------------------------------------------------------------------------------------------------------------
# progress


class _Progress:
    """Rows, bytes and rate on stderr: a tqdm bar when tqdm is installed, else a line redrawn a few times a second
    (on a terminal) or printed every few seconds (in a log). Thread-safe."""

    def __init__(self, desc: str, total_bytes: int, enabled: bool) -> None:
        self.enabled = enabled
        self.lock = threading.Lock()
        self.rows = 0
        self.bytes = 0
        self.total = total_bytes
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.desc = desc
        self.bar: Any = None
        self.tty = enabled and sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc, file=sys.stderr, leave=True)
            except ImportError:
                self.bar = None

    def update(self, rows: int, nbytes: int) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.rows += rows
            self.bytes += nbytes
            now = time.perf_counter()
            if self.bar is not None:
                if nbytes:
                    self.bar.update(nbytes)
                if now - self.last > 0.2:
                    self.last = now
                    self.bar.set_postfix_str(f"{self.rows:,} rows, {self.rows / max(now - self.t0, 1e-9):,.0f} rows/s")
                return
            if now - self.last >= (0.2 if self.tty else 5.0):
                self.last = now
                self._draw(final=False)

    def _draw(self, final: bool) -> None:
        el = max(time.perf_counter() - self.t0, 1e-9)
        pct = f" ({100 * self.bytes / self.total:.0f}%)" if self.total else ""
        line = (
            f"{self.desc}: {self.rows:,} rows, {_human_bytes(self.bytes)}/{_human_bytes(self.total)}{pct}, "
            f"{self.rows / el:,.0f} rows/s, {el:.1f} s"
        )
        end = "\n" if final or not self.tty else ""
        sys.stderr.write(("\r" if self.tty else "") + line + end)
        sys.stderr.flush()

    def close(self, ok: bool) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.bar is not None:
                self.bar.set_postfix_str(f"{self.rows:,} rows" + ("" if ok else ", failed"))
                self.bar.close()
            else:
                self._draw(final=True)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# ---------------------------------------------------------------------------------------------------------------
# the load


def load_table(
    grid_or_table: Grid | Table,
    table: str | None,
    path: PathLike,
    *,
    format: str | None = None,
    value_type: Any = None,
    key_type: str | None = None,
    key_column: Any = None,
    value_column: Any = None,
    delimiter: str | None = None,
    header: bool = False,
    partitions: int = 64,
    replication: int = 1,
    create: bool = True,
    dask_client: Any = None,
    workers: int | None = None,
    chunk_bytes: int = 64 << 20,
    batch_rows: int = 10_000,
    skip_bad_lines: bool = False,
    progress: bool = True,
) -> LoadReport:
    """Loads `path` (a file or a directory of files) into a new version of `table` and makes it current.

    `grid_or_table`: a Grid (then `table` names the table) or a Table handle (then `table` is None or its name).
    `format`: "text"/"tsv" (tab-separated), "csv" (comma-separated), "parquet", or None to tell by file name
    (.txt/.tsv/.csv, optionally .gz; .parquet; no suffix = tab-separated text). `delimiter` overrides the format's.
    `value_type`: "i64", "f64", "bytes" (or ("f32vec", dim) for Parquet); None keeps an existing table's type or
    infers it from the first rows. `key_type`: "str" (keys are the field's bytes) or "int" (int64 keys); None means
    "str" for text and the column's type for Parquet. `key_column` / `value_column`: field indices for text, column
    names or indices for Parquet (default: the first two). `header`: skip each text file's first line.
    `partitions` / `replication`: for a table the load creates (`create=True`; with create=False the table must
    exist). `dask_client`: run the tasks on its workers; else on `workers` local threads. `chunk_bytes`: text byte
    range per task; `batch_rows`: rows per write. `skip_bad_lines`: skip and count bad lines instead of failing.
    `progress`: a progress bar on stderr.

    Raises LoadError (a ValueError) naming file, line and reason for bad input; any failure leaves the previous
    version current.
    """
    t0 = time.perf_counter()
    grid, name = _resolve_target(grid_or_table, table)
    if key_type not in (None, "str", "int"):
        raise ValueError(f"key_type must be 'str' or 'int', got {key_type!r}")
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    src = Path(path)
    tasks = plan_tasks(src, format=format, chunk_bytes=chunk_bytes)
    files = splits.input_files(src, format)
    first_path, first_fmt = files[0]

    existing = _describe(grid, name)
    inferred_from = ""
    if existing is not None:
        have = _type_of(existing)
        if value_type is not None and _norm_type(value_type) != have:
            raise ValueError(f"table {name!r} holds {have} values, not {_norm_type(value_type)}")
        value_type = have
    elif not create:
        raise TableNotFound(f"table {name!r} does not exist (create=False)")
    elif value_type is None:
        value_type = infer_value_type(
            src, format=format, delimiter=delimiter, key_column=key_column, value_column=value_column, header=header
        )
        inferred_from = f"the first rows of {first_path}"
    vt_name = _norm_type(value_type)
    if key_type is None:
        key_type = _infer_key_type(first_path, first_fmt, key_column, value_column)
    if vt_name.startswith("f32vec") and any(fmt != "parquet" for _, fmt in files):
        raise ValueError("vector (f32vec) values can only be loaded from Parquet (a fixed-size list column)")
    opts_by_fmt = {
        fmt: _text_options(
            fmt,
            delimiter,
            key_column,
            value_column,
            vt_name.split(":")[0],
            key_type,
            header,
            skip_bad_lines,
            batch_rows,
            min(chunk_bytes, 8 << 20),
            inferred_from,
        )
        for fmt in {f for _, f in files}
    }

    created = False
    if existing is None:
        grid.create_table(name, partitions=partitions, replication=replication, value_type=value_type)
        created = True
    # Writes of a load must reach every replica before the version may become current.
    load_grid = Grid(dataclasses.replace(grid.config, ack="all"))
    writer = VersionWriter(load_grid, name)
    prog = _Progress(f"load {name}", sum(t.size for t in tasks), progress)
    ok = False
    try:
        writer.begin()
        target = _Target(load_grid.config, name, writer.version)
        work = [(opts_by_fmt[t.fmt], t) for t in tasks]
        # Leaving the engine joins its threads, also when a task failed: so no in-process task still writes into
        # the version the caller then drops.
        with engine_for(dask_client, workers) as engine:
            results = _run_on_engine(engine, target, work, prog)
        version = writer.commit()
        ok = True
    except BaseException:
        writer.abort()
        if created:
            _quietly(lambda: grid.drop_table(name))
        raise
    finally:
        prog.close(ok)
    if created:
        # The empty version 1 that creating a table opens is of no use once the load's version is current.
        _quietly(lambda: client_for(grid.config).drop_version(name, 1) if version != 1 else None)
    samples = [s for r in results for s in r.bad_samples][:_MAX_BAD_SAMPLES]
    report = LoadReport(
        table=name,
        version=version,
        rows=sum(r.rows for r in results),
        bytes=sum(r.bytes for r in results),
        bad_lines=sum(r.bad_lines for r in results),
        seconds=time.perf_counter() - t0,
        value_type=vt_name,
        key_type=key_type,
        files=len(files),
        tasks=len(tasks),
        bad_samples=samples,
    )
    log.info(
        "loaded %s into %s version %d: %d rows from %d files, %d bad lines, %.1f s",
        path,
        name,
        version,
        report.rows,
        report.files,
        report.bad_lines,
        report.seconds,
    )
    return report


def table_load(self: Table, path: PathLike, **options: Any) -> LoadReport:
    """`Table.load(path, **options)`: `load_table(self, None, path, **options)`."""
    return load_table(self, None, path, **options)


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except (RamgridError, ValueError):  # a server's refusal of the request (BAD_REQUEST) is a ValueError
        pass  # cleanup after a failure or of an empty version: the load's outcome is already decided


def _resolve_target(grid_or_table: Grid | Table, table: str | None) -> tuple[Grid, str]:
    if isinstance(grid_or_table, Table):
        if table is not None and table != grid_or_table.name:
            raise ValueError(f"a Table handle for {grid_or_table.name!r} was given with table={table!r}")
        return grid_or_table.grid, grid_or_table.name
    if isinstance(grid_or_table, Grid):
        if not table:
            raise ValueError("name the table to load: load_table(grid, 'name', path)")
        return grid_or_table, table
    raise TypeError(f"load_table takes a Grid or a Table, not {type(grid_or_table).__name__}")


def _describe(grid: Grid, name: str) -> dict[str, Any] | None:
    try:
        return grid.table(name).describe()
    except TableNotFound:
        return None


def _type_of(info: dict[str, Any]) -> str:
    return spell_value_type(str(info.get("value_type")), int(info.get("dim") or 0))


def _norm_type(value_type: Any) -> str:
    return spell_value_type(*parse_value_type(value_type))


def _run_on_engine(
    engine: ThreadEngine | DaskEngine,
    target: _Target,
    work: Sequence[tuple[_Options, splits.FileSplit]],
    prog: _Progress,
) -> list[_TaskResult]:
    """Runs the tasks on `engine`. In-process tasks report progress as they go and stop between batches once one
    failed; remote ones report when they finish, and a running one cannot be interrupted (a write it makes after
    the version is dropped is refused)."""
    local = isinstance(engine, ThreadEngine)
    cancel = engine.cancel_event
    futures = [
        engine.submit(_run_task, target, o, t, *((prog.update, cancel) if local else ()), name="load") for o, t in work
    ]
    results: list[_TaskResult] = []
    try:
        for f in engine.as_completed(futures):
            r = f.result()
            results.append(r)
            if not local:
                prog.update(r.rows, r.bytes)
    finally:
        if len(results) < len(futures):  # a task failed, or Ctrl-C: stop the rest
            engine.cancel(futures)
    return results


# ---------------------------------------------------------------------------------------------------------------
# the command


def _unescape(s: str) -> str:
    return {"\\t": "\t", "tab": "\t", "\\s": " ", "space": " "}.get(s, s)


def load_main(argv: Sequence[str]) -> int:
    """`ramgrid load TABLE PATH [options]`: the arguments after `load`. Prints the report; exit 0 when loaded, 1 on
    bad input or a grid error (nothing became visible), 2 on bad usage."""
    from ramgrid import cli

    p = argparse.ArgumentParser(
        prog="ramgrid load",
        description="load a key -> value file or directory (text/TSV/CSV, Parquet) into a new version of a table",
    )
    cli._common(p, top=True)
    p.add_argument("table")
    p.add_argument("path", help="a file or a directory of files")
    p.add_argument("--format", choices=splits.FORMATS, help="default: from the file names")
    p.add_argument("--type", dest="value_type", help="i64 | f64 | bytes (default: the table's, else inferred)")
    p.add_argument("--key-type", choices=("str", "int"), help="keys are strings (default for text) or int64")
    p.add_argument("--key-column", help="text: 0-based field index; Parquet: column name or index")
    p.add_argument("--value-column", help="text: 0-based field index; Parquet: column name or index")
    p.add_argument("--delimiter", help=r"field delimiter (default: tab, ',' for .csv; '\t' is understood)")
    p.add_argument("--header", action="store_true", help="skip each text file's first line")
    p.add_argument("--partitions", type=int, default=64, help="for a new table (default 64)")
    p.add_argument("--replication", type=int, default=1, help="for a new table (default 1)")
    p.add_argument("--no-create", action="store_true", help="fail if the table does not exist")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count bad lines instead of failing")
    p.add_argument("--workers", type=int, help="local loader threads (default: CPU count)")
    p.add_argument("--dask", metavar="SCHEDULER", help="run the tasks on this Dask scheduler's workers")
    p.add_argument("--chunk-mib", type=int, default=64, help="text bytes per task (default 64)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(list(argv))

    def column(v: str | None) -> Any:
        return int(v) if v is not None and v.lstrip("-").isdigit() else v

    def run() -> int:
        import json

        grid = cli._grid(args)
        dask_client = None
        if args.dask:
            from distributed import Client

            dask_client = Client(args.dask)
        try:
            report = load_table(
                grid,
                args.table,
                args.path,
                format=args.format,
                value_type=args.value_type,
                key_type=args.key_type,
                key_column=column(args.key_column),
                value_column=column(args.value_column),
                delimiter=_unescape(args.delimiter) if args.delimiter is not None else None,
                header=args.header,
                partitions=args.partitions,
                replication=args.replication,
                create=not args.no_create,
                dask_client=dask_client,
                workers=args.workers,
                chunk_bytes=max(1, args.chunk_mib) << 20,
                skip_bad_lines=args.skip_bad_lines,
                progress=not args.no_progress,
            )
        except LoadError as e:
            print(f"ramgrid: load failed, nothing loaded: {e}", file=sys.stderr)
            return 1
        except (ValueError, TypeError) as e:
            raise cli.CliError(str(e)) from None
        finally:
            if dask_client is not None:
                dask_client.close()
        print(json.dumps(report.to_dict(), default=str) if args.json else report)
        for path, line, reason in report.bad_samples:
            print(f"  skipped {path}:{line}: {reason}", file=sys.stderr)
        return 0

    return cli._run(run)
