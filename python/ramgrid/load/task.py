"""One load task, on a local thread or a Dask worker: it reads its split (a byte range of a text file, a compressed
file, a Parquet row group), parses it, and writes it in batches into the load's open version, counting bad lines
and keeping a few of them as samples. Module-level functions of picklable arguments, so that they run anywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ramgrid import splits
from ramgrid._clients import client_for
from ramgrid.exceptions import BatchError, LoadError
from ramgrid.grid import Grid, VersionPart
from ramgrid.load.parquet import _read_row_group
from ramgrid.load.parse import _Options, _parse_fast, _parse_slow

if TYPE_CHECKING:
    from ramgrid.grid import GridConfig

_MAX_BAD_SAMPLES = 10


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
    task = run.task
    keys, values, rownum = _read_row_group(task, run.opts, run.bad)
    stored = run.write(keys, values, lambda j: int(rownum[j]))
    run.result.rows += stored
    run.result.bytes += task.size
    if run.progress is not None:
        run.progress(stored, task.size)
