"""The tasks of a MapReduce job: a map task reads one split, maps and combines it, and shuffles its output into the
intermediate table (and, for a merge reducer, merges it into the output on write); a reduce task reads one reduce
partition's committed map output and writes or returns the reduced pairs. Module-level functions of picklable
arguments: they run on threads or Dask workers alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from ramgrid import splits
from ramgrid.exceptions import BatchError, ConnectionFailed, PartitionsUnavailable, Timeout
from ramgrid.grid import Grid, PinnedTable, VersionPart
from ramgrid.mapreduce import shuffle
from ramgrid.mapreduce.joblog import JobLog
from ramgrid.mapreduce.spec import FileSplit, JobSpec, TableSplit

__all__ = ["WRITE_FAULTS", "map_task", "reduce_task"]

# Errors that mean a replica is unreachable or short of acknowledgements.
WRITE_FAULTS = (BatchError, PartitionsUnavailable, ConnectionFailed, Timeout)

_READ_BLOCK = 8 << 20


# ---------------------------------------------------------------------------------------------------------------
# reading a split


def _batches(grid: Grid, split: Any, where: str | None = None) -> Iterator[Any]:
    """The split's input, a batch at a time: (keys, values) scan chunks of a table partition, text blocks of whole
    lines (bytes), or Parquet row groups (pyarrow tables). A table partition is read from the replica on server
    `where` (the one the task was placed beside) where every replica holds it, failing over as any read does."""
    if isinstance(split, TableSplit):
        t = PinnedTable(grid, split.table, split.version, split.incarnation)
        prefer = where if where in split.owners else None
        part = (split.partition, split.partition + 1)
        try:
            scan = t.scan(partitions=part, prefer=prefer)
        except ValueError:
            # The server the task was placed beside left the cluster since (failed over): any replica will do.
            scan = t.scan(partitions=part)
        with scan as chunks:
            yield from chunks
        return
    assert isinstance(split, FileSplit)
    if split.kind == "parquet":
        yield splits.parquet().ParquetFile(split.path).read_row_group(split.row_group)
    else:
        for piece, _ in splits.text_pieces(split, _READ_BLOCK):
            yield piece


def _records(split: Any, batch: Any) -> Iterator[tuple[Any, ...]]:
    """The records of a batch as mapper arguments: (key, value) for a table, (line,) for text, (row dict,)."""
    if isinstance(split, TableSplit):
        keys, values = batch
        ks = keys.to_pylist()
        vs = values.to_pylist() if hasattr(values, "to_pylist") else values.tolist()
        yield from zip(ks, vs)
    elif split.kind == "parquet":
        for row in batch.to_pylist():
            yield (row,)
    else:
        # Lines end at b"\n" only, as loads cut them (str.splitlines would also cut at \v, \f, \x1c, U+2028...).
        lines = batch.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        for line in lines:
            yield (line.decode("utf-8", errors="replace"),)


def _count_records(split: Any, batch: Any) -> int:
    if isinstance(split, TableSplit):
        return len(batch[0])
    if split.kind == "parquet":
        return int(batch.num_rows)
    return int(batch.count(b"\n")) + (0 if batch.endswith(b"\n") or not batch else 1)


# ---------------------------------------------------------------------------------------------------------------
# combining


class _Combiner:
    """A task's combined output: key -> value for merge reducers, key -> list of values otherwise."""

    def __init__(self, spec: JobSpec) -> None:
        self.kind = spec.reducer if isinstance(spec.reducer, str) else "general"
        self.acc: dict[Any, Any] = {}
        self.pairs = 0

    def pairs_in(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        acc, kind = self.acc, self.kind
        n = 0
        if kind in ("sum", "count"):
            one = kind == "count"
            for k, v in pairs:
                acc[k] = acc.get(k, 0) + (1 if one else v)
                n += 1
        elif kind in ("min", "max"):
            pick = min if kind == "min" else max
            for k, v in pairs:
                acc[k] = pick(acc[k], v) if k in acc else v
                n += 1
        else:
            for k, v in pairs:
                lst = acc.get(k)
                if lst is None:
                    acc[k] = [v]
                else:
                    lst.append(v)
                n += 1
        self.pairs += n

    def dict_in(self, d: dict[Any, Any]) -> None:
        """A vectorised mapper's dict: for sum/count its values add up (counts), otherwise each is one pair."""
        if self.kind in ("sum", "count"):
            if not self.acc:
                self.acc = dict(d)
            else:
                acc = self.acc
                for k, v in d.items():
                    acc[k] = acc.get(k, 0) + v
            self.pairs += len(d)
        else:
            self.pairs_in(d.items())

    def result(self, spec: JobSpec) -> dict[Any, Any]:
        if self.kind == "general" and spec.combiner is not None:
            c = spec.combiner
            return {k: [c(k, vs)] for k, vs in self.acc.items()}
        return self.acc


def _key_kind(d: dict[Any, Any]) -> str:
    for k in d:
        return "str" if isinstance(k, str) else "int" if isinstance(k, int) else "bytes"
    return "str"


# ---------------------------------------------------------------------------------------------------------------
# the map task


def map_task(spec: JobSpec, task: int, attempt: int, ack: str, where: str | None = None) -> dict[str, Any]:
    """Runs map task `task` (attempt `attempt`), writing at acknowledgement level `ack`; `where` is the server it was
    placed beside, whose replica of a table partition it reads. Returns its record for the job log: the chunks it
    wrote per reduce partition, its counts, and how its merges went."""
    t0 = time.perf_counter()
    spec = replace(spec, config=replace(spec.config, ack=ack))
    grid = Grid(spec.config)  # the task's one handle: its reads, shuffle writes, merges and job log go through it
    split = spec.splits[task]
    comb = _Combiner(spec)
    records = 0
    for batch in _batches(grid, split, where):
        if spec.vectorised:
            records += _count_records(split, batch)
            out = spec.mapper(*batch) if isinstance(split, TableSplit) else spec.mapper(batch)
            if isinstance(out, dict):
                comb.dict_in(out)
            elif out is not None:
                comb.pairs_in(out)
        else:
            mapper = spec.mapper
            for rec in _records(split, batch):
                records += 1
                out = mapper(*rec)
                if out is not None:
                    comb.pairs_in(out)
    combined = comb.result(spec)
    t_map = time.perf_counter() - t0

    # Shuffle: every reduce partition's pairs into the intermediate table, under this attempt's keys.
    R = spec.reduce_partitions
    chunks: list[int] = []
    keys: list[bytes] = []
    blobs: list[bytes] = []
    for r, bucket in enumerate(shuffle.cut(combined, R)):
        enc = shuffle.encode_bucket(bucket)
        chunks.append(len(enc))
        for c, b in enumerate(enc):
            keys.append(shuffle.blob_key(spec.job_id, task, attempt, r, c, R))
            blobs.append(b)
    degraded = False
    if keys:
        try:
            grid.table(spec.intermediate).put_many(keys, blobs)
        except WRITE_FAULTS:
            if spec.config.ack == "one":
                raise
            # A replica is down: ack=all cannot be met. The keys are this attempt's, so writing them again at
            # ack=one (the live replica) stores each once; the task need not run again.
            degraded = True
            spec = replace(spec, config=replace(spec.config, ack="one"))
            grid = Grid(spec.config)
            grid.table(spec.intermediate).put_many(keys, blobs)
    shuffled = sum(len(b) for b in blobs)

    merge = "none"
    if spec.merge is not None and combined:
        merge = _merge(spec, grid, task, combined)
    return {
        "task": task,
        "attempt": attempt,
        "chunks": chunks,
        "records": records,
        "pairs": comb.pairs,
        "combined": len(combined),
        "bytes": shuffled,
        "merge": merge,
        "degraded": degraded,
        "ack": spec.config.ack,  # the level its writes were acknowledged at ("one": a replica may lack them)
        "key_kind": _key_kind(combined),
        "map_s": t_map,
        "seconds": time.perf_counter() - t0,
    }


def _merge(spec: JobSpec, grid: Grid, task: int, combined: dict[Any, Any]) -> str:
    """Merge-on-write of a task's combined output into the merge target, at most once per task (the claim in the
    job log). Returns "clean" (merged here), "skipped" (another run had merged it all) or "dirty" (merges may be
    partial or doubled: the job rebuilds its output from the shuffle)."""
    log = JobLog(spec.config, spec.job_id, grid)
    n = log.claim(task)
    if n > 1:
        if log.merged(task):
            return "skipped"
        log.mark_dirty()
        return "dirty"
    dtype = np.float64 if spec.output_type == "f64" else np.int64
    part = VersionPart(grid, spec.merge_target, spec.merge_version)
    assert spec.merge is not None
    try:
        part.put_many(
            list(combined), np.fromiter(combined.values(), dtype=dtype, count=len(combined)), merge=spec.merge
        )
    except WRITE_FAULTS:
        # Some merges may have been applied, at some replicas: the output is rebuilt from the shuffle, which this
        # task's output is already in, so the task itself succeeded.
        log.mark_dirty()
        return "dirty"
    except BaseException:
        log.mark_dirty()
        raise
    log.mark_merged(task)
    return "clean"


# ---------------------------------------------------------------------------------------------------------------
# the reduce task


def read_partition(
    spec: JobSpec, grid: Grid, r: int, committed: dict[int, tuple[int, int]]
) -> Iterator[dict[Any, Any]]:
    """Reduce partition r's map output: one dict per chunk of each committed attempt ({task: (attempt, chunks)})."""
    R = spec.reduce_partitions
    keys = [shuffle.blob_key(spec.job_id, t, a, r, c, R) for t, (a, n) in sorted(committed.items()) for c in range(n)]
    table = grid.table(spec.intermediate)
    step = 64
    for i in range(0, len(keys), step):
        yield from shuffle.decode_chunks(table.get_many(keys[i : i + step]))


def reduce_task(spec: JobSpec, r: int, committed: dict[int, tuple[int, int]], ack: str) -> dict[str, Any]:
    """Reduces partition r: merges the committed map output, applies the reducer, then writes the pairs to the
    output version (plain puts: a second run writes the same values) or returns them."""
    t0 = time.perf_counter()
    spec = replace(spec, config=replace(spec.config, ack=ack))
    grid = Grid(spec.config)  # the task's one handle, for its reads and its writes
    kind = spec.reducer if isinstance(spec.reducer, str) else "general"
    acc: dict[Any, Any] = {}
    pairs = 0
    for d in read_partition(spec, grid, r, committed):
        pairs += len(d)
        if kind in ("sum", "count"):
            if not acc:
                acc = d
            else:
                for k, v in d.items():
                    acc[k] = acc.get(k, 0) + v
        elif kind in ("min", "max"):
            pick = min if kind == "min" else max
            for k, v in d.items():
                acc[k] = pick(acc[k], v) if k in acc else v
        else:
            for k, vs in d.items():
                lst = acc.get(k)
                if lst is None:
                    acc[k] = list(vs)
                else:
                    lst.extend(vs)
    if kind == "general":
        reducer = spec.reducer
        assert callable(reducer)
        acc = {k: reducer(k, vs) for k, vs in acc.items()}
    out: dict[str, Any] = {"r": r, "pairs_in": pairs, "pairs_out": len(acc), "seconds": 0.0, "ack": ack}
    if spec.output is not None and spec.output_version:
        if acc:
            part = VersionPart(grid, spec.output, spec.output_version)
            ks = list(acc)
            if spec.output_type in ("i64", "f64"):
                dtype = np.float64 if spec.output_type == "f64" else np.int64
                part.put_many(ks, np.fromiter(acc.values(), dtype=dtype, count=len(acc)))
            else:
                part.put_many(ks, [v if isinstance(v, (bytes, str)) else str(v) for v in acc.values()])
    else:
        out["result"] = acc
    out["seconds"] = time.perf_counter() - t0
    return out
