"""One load task, on a local thread or a Dask worker: it reads its split (a byte range of a text file, a compressed
file, a Parquet row group), parses it, and writes it in batches into the load's open version, counting bad lines
and keeping a few of them as samples. Module-level functions of picklable arguments, so that they run anywhere.

A task reads and parses one piece ahead on a second thread (pyarrow's parser and the native writes release the
GIL), so that parsing the next piece overlaps writing this one; its writes stay in file order, so the last line of
a key within a task is the one that stays.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ramgrid import splits
from ramgrid._clients import client_for
from ramgrid.exceptions import BatchError, LoadError
from ramgrid.grid import Grid, VersionPart
from ramgrid.load.parquet import _row_group_batches
from ramgrid.load.parse import _Options, _parse_fast, _parse_slow, _Rows

if TYPE_CHECKING:
    from ramgrid.grid import GridConfig

_MAX_BAD_SAMPLES = 10

T = TypeVar("T")


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
        # (offset, lines before it) of a plain file, counted from the start only when a message needs a line number.
        self._lines_at = (0, 0)

    def lines_before(self, offset: int) -> int:
        """Lines of the (plain) file that end before byte `offset`; counts on from the last offset asked for."""
        at, lines = self._lines_at if offset >= self._lines_at[0] else (0, 0)
        lines += splits.lines_between(self.task.path, at, offset)
        self._lines_at = (offset, lines)
        return lines

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

    def count(self, rows: int, nbytes: int) -> None:
        self.result.rows += rows
        self.result.bytes += nbytes
        if self.progress is not None and (rows or nbytes):
            self.progress(rows, nbytes)


class _NeedLines(Exception):
    """A fast-path write had a key refused; the piece is redone on the slow path to name its line."""


_ROW_REFUSALS = ("KEY_TOO_LARGE", "VALUE_TOO_LARGE", "WRONG_TYPE")


def _is_fatal(reason: str) -> bool:
    """Only refusals caused by the row itself are bad lines; anything else (no memory, a replica short of the
    acknowledgement level, a server error) fails the load as a grid error."""
    return not reason.startswith(_ROW_REFUSALS)


_END: Any = object()


def _ahead(items: Iterator[T]) -> Generator[T, None, None]:
    """`items`, each computed on a helper thread while the caller works on the one before. The iterator runs on
    that thread only; leaving early waits for the item in progress and closes `items`."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="ramgrid-load-ahead")
    try:
        nxt = pool.submit(next, items, _END)
        while True:
            item = nxt.result()
            if item is _END:
                return
            nxt = pool.submit(next, items, _END)
            yield item
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(items, "close", None)
        if close is not None:
            close()


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


@dataclass
class _Piece:
    """A text piece read and parsed: its lines after any header, the fast parser's rows (None: take the slow
    path), the input bytes it accounts for, and what tells the number of lines before it."""

    body: bytes
    rows: _Rows | None
    step: int
    offset: int  # plain files: the byte offset of the body's first line
    lines: int  # compressed files: lines before the body (plain files count them from `offset` when needed)


def _text_pieces(run: _TaskRun) -> Iterator[_Piece]:
    """The task's pieces, read and parsed by the fast parser (on the read-ahead thread: it touches no task state)."""
    task, opts = run.task, run.opts
    lines_seen = 0
    consumed = 0
    accounted = 0
    first = True
    for data, mark in splits.text_pieces(task, opts.read_block):
        skip = 0
        if first and opts.header and (task.kind == "stream" or task.start == 0):
            nl = data.find(b"\n")
            skip = len(data) if nl < 0 else nl + 1
        first = False
        body = data[skip:] if skip else data
        if task.kind == "stream":
            step, consumed = mark - consumed, mark
            lines = lines_seen + (1 if skip else 0)
            lines_seen += data.count(b"\n")
        else:
            # A range accounts for exactly its own bytes, though its last line may run past its end.
            step = min(len(data), task.size - accounted)
            lines = 0
        accounted += step
        yield _Piece(body, _parse_fast(body, opts), step, mark + skip, lines)


def _run_text(run: _TaskRun) -> None:
    task = run.task
    with contextlib.closing(_ahead(_text_pieces(run))) as pieces:
        for piece in pieces:
            run.check_cancel()
            _write_piece(run, piece)
    if task.kind == "range" and task.size > run.result.bytes:
        run.count(0, task.size - run.result.bytes)  # the partial first line, which the previous range owns


def _write_piece(run: _TaskRun, piece: _Piece) -> None:
    opts = run.opts

    def line_of_index(i: int) -> int:
        before = piece.lines if run.task.kind == "stream" else run.lines_before(piece.offset)
        return before + i + 1

    rows = piece.rows
    if rows is not None:
        try:
            run.count(run.write(rows.keys, rows.values, None), piece.step)
            return
        except _NeedLines:
            pass  # redo on the slow path, which knows each row's line; rewriting a key is idempotent
    rows = _parse_slow(piece.body, opts)
    for i, why in rows.bad:
        run.bad(line_of_index(i), why)
    lines = rows.lines or []
    run.count(run.write(rows.keys, rows.values, lambda j: line_of_index(lines[j])), piece.step)


def _row_of(rownum: Any) -> Callable[[int], int | None]:
    return lambda j: int(rownum[j])


def _run_parquet(run: _TaskRun) -> None:
    task = run.task
    with contextlib.closing(_ahead(_row_group_batches(task, run.opts))) as batches:
        for keys, values, rownum, bad in batches:
            run.check_cancel()
            for row, why in bad:
                run.bad(row, why)
            run.count(run.write(keys, values, _row_of(rownum)), 0)
    run.count(0, task.size)
