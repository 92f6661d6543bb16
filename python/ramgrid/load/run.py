"""The load itself: it plans the tasks, creates the table (or checks its type), opens a new version, runs the tasks
on an engine (local threads or Dask workers) and seals the version, or drops it on any failure so that the previous
one stays current; and the report of what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ramgrid import splits
from ramgrid._clients import client_for
from ramgrid._types import parse_value_type, spell_value_type
from ramgrid.engines import DaskEngine, ThreadEngine, engine_for
from ramgrid.exceptions import RamgridError, TableNotFound
from ramgrid.grid import Grid, Table, VersionWriter
from ramgrid.load.infer import _infer_key_type, infer_value_type
from ramgrid.load.parse import _Options, _text_options
from ramgrid.load.progress import _human_bytes, _Progress
from ramgrid.load.task import _MAX_BAD_SAMPLES, _run_task, _Target, _TaskResult
from ramgrid.splits import PathLike


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


# The tasks a load is cut into: its input's splits (exposed for tests and for sizing `chunk_bytes`).
plan_tasks = splits.plan_splits


log = logging.getLogger("ramgrid.load")

# Text bytes a task reads and parses at a time (the next piece is parsed while this one is written).
_READ_BLOCK = 4 << 20
# Bounds of the text byte range of a task when the caller gives none.
_MIN_TASK_BYTES, _MAX_TASK_BYTES = 4 << 20, 64 << 20


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
    replication: int | None = None,
    create: bool = True,
    dask_client: Any = None,
    workers: int | None = None,
    chunk_bytes: int | None = None,
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
    `partitions` / `replication` (None: the grid's default): for a table the load creates (`create=True`; with
    create=False the table must exist). `dask_client`: run the tasks on its workers; else on `workers` local threads. `chunk_bytes`: text byte
    range per task (default: the plain text cut into about four tasks per worker, 4-64 MiB each; a compressed file
    is one task, a Parquet row group one); `batch_rows`: rows per write. `skip_bad_lines`: skip and count bad lines
    instead of failing. `progress`: a progress bar on stderr.

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
    files = splits.input_files(src, format)
    if chunk_bytes is None:
        chunk_bytes = _task_bytes(files, _parallelism(dask_client, workers))
    tasks = plan_tasks(src, format=format, chunk_bytes=chunk_bytes)
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
            min(chunk_bytes, _READ_BLOCK),
            inferred_from,
        )
        for fmt in {f for _, f in files}
    }

    created = False
    if existing is None:
        # None: the grid's default (1, or what `ramgrid.dask.start(replication=)` gave its grid).
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


def _parallelism(dask_client: Any, workers: int | None) -> int:
    """Tasks the engine runs at once: `workers` local threads (default as ThreadEngine's), or the Dask workers'
    threads."""
    if dask_client is None:
        return int(workers or max(2, os.cpu_count() or 1))
    return max(1, int(sum(dask_client.nthreads().values())))


def _task_bytes(files: Sequence[tuple[Path, str]], parallelism: int) -> int:
    """The byte range of a text task: the plain text files' bytes spread over four tasks per worker, so that the
    last tasks to finish are short and no worker idles for long, within [4 MiB, 64 MiB]."""
    total = 0
    for p, fmt in files:
        if fmt != "parquet":
            with contextlib.suppress(OSError):  # an unreadable file fails the load later, with its name
                total += 0 if splits.is_gzip(p) else p.stat().st_size
    return min(_MAX_TASK_BYTES, max(_MIN_TASK_BYTES, total // (4 * parallelism) + 1))


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
