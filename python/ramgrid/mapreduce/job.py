"""The driver of a MapReduce job: plans the splits, runs the map tasks beside their data, commits them in the job
log, runs the reduce tasks beside the owners of the intermediate partitions (or skips them when the store merged
the output on write), switches the output version, and cleans up. `resume` takes over a job whose driver died.

The data flow and what survives which failure are in docs/mapreduce.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ramgrid.engines import DaskEngine, ThreadEngine, engine_for
from ramgrid.exceptions import (
    RamgridError,
    TableNotFound,
)
from ramgrid.grid import Grid, PinnedTable, Table, VersionWriter
from ramgrid.mapreduce.commit import DEFAULT_COMMIT_TIMEOUT, commit_output, wait_whole
from ramgrid.mapreduce.joblog import JobLog
from ramgrid.mapreduce.progress import Progress
from ramgrid.mapreduce.spec import MERGE_REDUCERS, JobSpec, TableSplit
from ramgrid.mapreduce.tasks import WRITE_FAULTS, map_task, reduce_task
from ramgrid.splits import plan_splits

log = logging.getLogger("ramgrid.mapreduce")

__all__ = ["JobResult", "Summary", "abandon", "resume", "run"]

# Errors that mean a server (a replica) is unreachable or short of acknowledgements: the task is run again, and the
# job's writes go on at ack=one (the live replica), since ack=all cannot be met while a replica is down.
_WRITE_FAULTS = WRITE_FAULTS


@dataclass
class Summary:
    """What a job did. Times in seconds; `phases`: plan, map, reduce (0 when merged on write), commit."""

    job_id: str
    map_tasks: int = 0
    map_runs: int = 0  # task attempts that ran to completion or failure (speculative and retried ones included)
    maps_resumed: int = 0  # map tasks committed before a resume, not run again
    reduce_tasks: int = 0
    records_in: int = 0
    pairs_out: int = 0  # pairs the mappers emitted
    pairs_combined: int = 0  # pairs after combining in the map tasks (what was shuffled)
    bytes_shuffled: int = 0
    merged_on_write: bool = False
    rebuilt: bool = False  # merges were partial or doubled: the output was rebuilt from the shuffle
    ack: str = "all"
    retries: int = 0
    # Tasks run again at ack=all because they wrote at ack=one while a server was down and it came back during
    # their phase: its copy may lack their writes (see `_came_back`).
    rewritten: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def __str__(self) -> str:
        ph = ", ".join(f"{k} {v:.2f} s" for k, v in self.phases.items())
        how = "merged on write" if self.merged_on_write else ("rebuilt from the shuffle" if self.rebuilt else "reduced")
        if "map" not in self.phases:
            how = "resumed at its commit (no task ran)"
        return (
            f"job {self.job_id}: {self.map_tasks} map tasks ({self.map_runs} runs, {self.maps_resumed} resumed), "
            f"{self.reduce_tasks} reduce tasks, {self.records_in:,} records in, {self.pairs_out:,} pairs out, "
            f"{self.pairs_combined:,} after combining, {self.bytes_shuffled / 2**20:.1f} MiB shuffled, {how}"
            + (f", {self.rewritten} tasks written again at ack=all" if self.rewritten else "")
            + "; "
            f"{ph}; {self.seconds:.2f} s"
        )


@dataclass
class JobResult:
    """A finished job: its summary, and either its result (a dict, when no output table was named) or the output
    table and the version that is now current."""

    summary: Summary
    result: dict[Any, Any] | None = None
    output: str | None = None
    version: int | None = None


# ---------------------------------------------------------------------------------------------------------------
# planning


def _splits(grid: Grid, input: Any, format: str | None, chunk_bytes: int) -> tuple[Any, ...]:
    if isinstance(input, (Table, PinnedTable)):
        pinned = input.pin() if isinstance(input, Table) else input
        owners = pinned.owners()
        return tuple(
            TableSplit(pinned.name, pinned.version, pinned.incarnation, p, tuple(o)) for p, o in enumerate(owners)
        )
    return tuple(plan_splits(Path(input), format=format, chunk_bytes=chunk_bytes))


def run(
    grid: Grid,
    input: Any,
    mapper: Callable[..., Any],
    reducer: str | Callable[[Any, list[Any]], Any],
    *,
    combiner: Callable[[Any, list[Any]], Any] | None = None,
    vectorised: bool = False,
    output: str | None = None,
    output_type: str | None = None,
    reduce_partitions: int = 16,
    dask_client: Any = None,
    workers: int | None = None,
    format: str | None = None,
    chunk_bytes: int = 64 << 20,
    keep_intermediate: bool = False,
    speculative: bool = False,
    max_attempts: int = 4,
    progress: bool = True,
    job_id: str | None = None,
    commit_timeout: float = DEFAULT_COMMIT_TIMEOUT,
) -> JobResult:
    """Runs a MapReduce job on `grid` and returns its `JobResult`.

    `input`: a `Table` (pinned at the start) or `PinnedTable`, read partition by partition, one map task each; or
    the path of a file or directory (text, one record per line; Parquet, one row dict per row), split as loads
    split it (`chunk_bytes` per task of plain text; a compressed file is one task; a Parquet row group is one).
    `mapper`: per record, `mapper(key, value)` for a table and `mapper(line)` / `mapper(row)` for files, returning
    an iterable of (key, value) pairs (or None); with `vectorised=True`, `mapper(keys, values)` per scan chunk of a
    table (pyarrow keys, numpy values), `mapper(block)` per text block of whole lines (bytes) or
    `mapper(table)` per Parquet row group, returning pairs or a dict (for "sum"/"count", the dict's values add up).
    Keys are str, bytes or int. `reducer`: "sum", "count", "min" or "max" (merged by the store on write: no reduce
    phase), or `reducer(key, values) -> value`. `combiner(key, values) -> value`: applied in each map task before
    the shuffle (the merge reducers combine by themselves).
    `output`: a table name: the job writes a new version of it (created with `output_type`: "i64" or "f64" for the
    merge reducers, "bytes" otherwise; a general reducer's values must be bytes or str for a bytes table) and
    makes it current when the job succeeds. None: the result is returned as a dict (keep it small).
    `reduce_partitions`: R, the partitions of the intermediate table and the number of reduce tasks.
    `dask_client`: run the tasks on its workers, beside the servers (`ramgrid.engines`); else `workers` threads.
    `keep_intermediate`: keep the intermediate table and the job log (named `<job_id>.shuffle`, `.log`, `.marks`).
    `speculative`: run every map task twice at once (two attempts; the first to finish is committed), as Hadoop
    does for stragglers. `max_attempts`: runs of a failing task before the job fails.
    `commit_timeout`: seconds the job waits, once its work is done, for a server that is down (or restarted and
    still repairing) before it can seal and switch its output version (every server must take part). Past it the job
    raises `CommitPending` naming the server; its work is kept, and `resume(job_id, grid)` then only seals and
    switches. A job without an output table never waits.
    """
    t0 = time.perf_counter()
    if reduce_partitions < 1:
        raise ValueError("reduce_partitions must be >= 1")
    if not commit_timeout >= 0:
        raise ValueError(f"commit_timeout must be a number of seconds >= 0, got {commit_timeout!r}")
    if isinstance(reducer, str) and reducer not in MERGE_REDUCERS:
        raise ValueError(f"reducer must be one of {', '.join(MERGE_REDUCERS)} or a function, got {reducer!r}")
    if not callable(mapper):
        raise TypeError("mapper must be a function")
    merge = isinstance(reducer, str)
    if output_type is None:
        output_type = "i64" if merge else "bytes"
    if merge and output_type not in ("i64", "f64"):
        raise ValueError(f"a {reducer!r} job writes i64 or f64 values, not {output_type!r}")
    job_id = job_id or f"mr-{uuid.uuid4().hex[:10]}"
    splits = _splits(grid, input, format, chunk_bytes)
    if not splits:
        raise ValueError(f"{input!r} gives no map tasks")

    replication = min(2, len(grid.servers))
    config = dataclasses.replace(grid.config, ack="all")
    spec = JobSpec(
        job_id=job_id,
        config=config,
        splits=splits,
        mapper=mapper,
        reducer=reducer,
        combiner=combiner,
        vectorised=vectorised,
        reduce_partitions=reduce_partitions,
        intermediate=f"{job_id}.shuffle",
        log_table=f"{job_id}.log",
        marks_table=f"{job_id}.marks",
        output=output,
        output_type=output_type,
        keep_intermediate=keep_intermediate,
        extra={"speculative": speculative, "max_attempts": max_attempts, "commit_timeout": float(commit_timeout)},
    )
    jlog = JobLog(config, job_id)
    jlog.create(replication)
    g = jlog.grid  # the driver's one handle (spec.config is the log's)
    g.create_table(spec.intermediate, partitions=reduce_partitions, replication=replication, value_type="bytes")
    if output is not None:
        g.create_table(output, partitions=64, replication=replication, value_type=output_type, exist_ok=True)
        writer = VersionWriter(g, output).begin()
        spec = dataclasses.replace(spec, output_version=writer.version)
        if merge:
            spec = dataclasses.replace(spec, merge_target=output, merge_version=writer.version)
    elif merge:
        name = f"{job_id}.result"
        g.create_table(name, partitions=reduce_partitions, replication=replication, value_type=output_type)
        spec = dataclasses.replace(spec, merge_target=name, merge_version=1)
    jlog.put_spec(spec)
    jlog.set_state("map")
    summary = Summary(job_id=job_id, map_tasks=len(splits), phases={"plan": time.perf_counter() - t0})
    log.info("job %s: %d map tasks, %d reduce partitions", job_id, len(splits), reduce_partitions)
    with engine_for(dask_client, workers, grid.servers) as engine:
        return _drive(spec, g, jlog, engine, summary, {}, progress, t0)


def resume(
    job_id: str,
    grid: Grid,
    *,
    dask_client: Any = None,
    workers: int | None = None,
    progress: bool = True,
    commit_timeout: float | None = None,
) -> JobResult:
    """Continues job `job_id` from its log in `grid` after its driver died or its commit timed out
    (`CommitPending`): map tasks the log committed are not run again (their output is in the intermediate table);
    the rest of the job runs as `run` would. A job that had done all its work only seals and switches its output
    version. `commit_timeout`: as for `run` (None: the job's own)."""
    t0 = time.perf_counter()
    if commit_timeout is not None and not commit_timeout >= 0:
        raise ValueError(f"commit_timeout must be a number of seconds >= 0, got {commit_timeout!r}")
    jlog = JobLog(dataclasses.replace(grid.config, ack="all"), job_id)
    if not jlog.exists():
        raise TableNotFound(f"no job {job_id!r} on this grid (its log table {jlog.log_name!r} does not exist)")
    spec: JobSpec = jlog.spec()
    state = jlog.state()
    if state == "done":
        raise RamgridError(f"job {job_id!r} has finished already")
    if commit_timeout is not None:
        spec = dataclasses.replace(spec, extra={**spec.extra, "commit_timeout": float(commit_timeout)})
    committed = jlog.committed_maps(len(spec.splits))
    g = jlog.grid if jlog.config == spec.config else Grid(spec.config)
    summary = Summary(job_id=job_id, map_tasks=len(spec.splits), maps_resumed=len(committed))
    summary.phases["plan"] = time.perf_counter() - t0
    if state == "commit" and spec.output is not None:
        log.info("job %s resumed at its commit: sealing and switching version %d", job_id, spec.output_version)
        _add_counts(summary, committed)
        return _finish(spec, g, jlog, summary, None, t0)
    log.info("job %s resumed: %d of %d map tasks committed", job_id, len(committed), len(spec.splits))
    with engine_for(dask_client, workers, grid.servers) as engine:
        return _drive(spec, g, jlog, engine, summary, committed, progress, t0)


def abandon(job_id: str, grid: Grid) -> None:
    """Gives up job `job_id` after a failure (instead of `resume`): aborts its output version, if it opened one,
    and drops its intermediate, result and log tables. A job that failed keeps them until then, so it can be
    resumed."""
    jlog = JobLog(dataclasses.replace(grid.config, ack="all"), job_id)
    if not jlog.exists():
        raise TableNotFound(f"no job {job_id!r} on this grid (its log table {jlog.log_name!r} does not exist)")
    spec: JobSpec = jlog.spec()
    g = Grid(spec.config)
    if spec.output is not None and spec.output_version and jlog.state() != "done":
        VersionWriter.adopt(g, spec.output, spec.output_version).abort()
    for name in (spec.intermediate, f"{job_id}.result"):
        _quietly(g.drop_table, name)
    jlog.drop()


# ---------------------------------------------------------------------------------------------------------------
# running


def place_map_task(owners: tuple[str, ...], attempt: int, load: dict[str, int]) -> str | None:
    """Where a map task over a partition with these replicas (primary first) runs: Horcrux's load balancing. A first
    attempt goes to the replica with the fewest map tasks placed so far (`load`, updated here; the primary on ties),
    so a table whose primaries crowd on a few servers still spreads its maps over every replica; a retry goes to the
    next replica. None for an input without owners (files)."""
    if not owners:
        return None
    if attempt == 0:
        best = min(owners, key=lambda o: (load.get(o, 0), owners.index(o)))
    else:
        best = owners[attempt % len(owners)]
    load[best] = load.get(best, 0) + 1
    return best


class _Attempts:
    """Runs tasks on an engine until each has one success, retrying failures (up to `max_attempts` runs each).
    After a write fault (a replica down) the job's writes go on at ack=one."""

    def __init__(self, engine: ThreadEngine | DaskEngine, summary: Summary, max_attempts: int) -> None:
        self.engine = engine
        self.summary = summary
        self.max_attempts = max_attempts
        self.ack = summary.ack
        self.runs = 0

    def run(
        self,
        todo: list[int],
        submit: Callable[[int, int, str], Any],
        done: Callable[[int, dict[str, Any]], None],
        copies: int = 1,
        prog: Progress | None = None,
    ) -> None:
        attempt = dict.fromkeys(todo, 0)
        finished: set[int] = set()
        wave: dict[Any, int] = {}
        for t in todo:
            for _ in range(copies):
                wave[submit(t, attempt[t], self.ack)] = t
                attempt[t] += 1
        while wave:
            nxt: dict[Any, int] = {}
            try:
                for f in self.engine.as_completed(list(wave)):
                    t = wave[f]
                    self.runs += 1
                    try:
                        rec = f.result()
                    except _WRITE_FAULTS as e:
                        self._retry(t, attempt, finished, nxt, submit, e, degrade=True)
                        continue
                    except RamgridError as e:
                        self._retry(t, attempt, finished, nxt, submit, e, degrade=False)
                        continue
                    if t in finished:
                        continue  # a speculative copy that lost the race
                    finished.add(t)
                    done(t, rec)
                    if prog is not None:
                        prog.update(1)
            except BaseException:
                self.engine.cancel(list(wave) + list(nxt))
                raise
            wave = {f: t for f, t in nxt.items() if t not in finished}

    def _retry(
        self,
        t: int,
        attempt: dict[int, int],
        finished: set[int],
        nxt: dict[Any, int],
        submit: Callable[[int, int, str], Any],
        e: BaseException,
        degrade: bool,
    ) -> None:
        if t in finished:
            return
        if attempt[t] >= self.max_attempts:
            raise e
        if degrade and self.ack != "one":
            log.warning("a write fell short (%s): the job's writes go on at ack=one", e)
            self.ack = "one"
            self.summary.ack = "one"
        self.summary.retries += 1
        nxt[submit(t, attempt[t], self.ack)] = t
        attempt[t] += 1


def _drive(
    spec: JobSpec,
    g: Grid,
    jlog: JobLog,
    engine: ThreadEngine | DaskEngine,
    summary: Summary,
    committed: dict[int, dict[str, Any]],
    progress: bool,
    t0: float,
) -> JobResult:
    """Runs the job's map and reduce phases and commits it; `g` is the driver's handle on `spec.config`."""
    runner = _Attempts(engine, summary, int(spec.extra.get("max_attempts", 4)))
    key_kinds: set[str] = {r.get("key_kind", "str") for r in committed.values()}

    # Map phase.
    t_map = time.perf_counter()
    todo = [t for t in range(len(spec.splits)) if t not in committed]
    load_by_server: dict[str, int] = {}

    def where_map(t: int, attempt: int) -> str | None:
        return place_map_task(spec.splits[t].owners, attempt, load_by_server)

    def submit_map(t: int, attempt: int, ack: str) -> Any:
        # A speculative second copy is a second attempt: it writes its own keys. The task reads its partition from
        # the replica it is placed beside (`where` goes to the engine as the locality hint and to the task).
        where = where_map(t, attempt)
        return engine.submit(map_task, spec, t, attempt, ack, where, where=where, name="map")

    def map_done(t: int, rec: dict[str, Any]) -> None:
        if rec.get("degraded") and runner.ack != "one":
            log.warning("job %s: a replica is down; the job's writes go on at ack=one", spec.job_id)
            runner.ack = summary.ack = "one"
        jlog.commit_map(t, rec)
        committed[t] = rec
        key_kinds.add(rec.get("key_kind", "str"))

    with Progress(f"map {spec.job_id}", len(spec.splits), progress, done=len(committed)) as prog:
        runner.run(todo, submit_map, map_done, copies=2 if spec.extra.get("speculative") else 1, prog=prog)
    summary.map_runs = runner.runs
    force_dirty = False
    weak = sorted(t for t, rec in committed.items() if rec.get("ack") == "one")
    if weak and _came_back(g, spec.job_id, f"{len(weak)} map tasks"):
        runner.ack = "all"

        def again(t: int) -> Any:
            a = committed[t]["attempt"]  # the same keys and values, written again to every replica
            where = place_map_task(spec.splits[t].owners, a, load_by_server)
            return engine.submit(map_task, spec, t, a, "all", where, where=where, name="map")

        for t, rec in _again_at_all(engine, weak, again, runner.max_attempts).items():
            jlog.commit_map(t, rec)
            committed[t] = rec
        summary.rewritten += len(weak)
        if spec.merge is not None:
            # Merges made at ack=one may be missing on the server that came back: rebuild from the shuffle.
            jlog.mark_dirty()
            force_dirty = True
    _add_counts(summary, committed)
    summary.phases["map"] = time.perf_counter() - t_map

    # Reduce phase: skipped when the store merged every task's output exactly once.
    t_red = time.perf_counter()
    merge = spec.merge is not None
    dirty = merge and (force_dirty or jlog.dirty() or any(r.get("merge") == "dirty" for r in committed.values()))
    result: dict[Any, Any] | None = None
    writer: VersionWriter | None = None
    if spec.output is not None:
        writer = VersionWriter.adopt(g, spec.output, spec.output_version)
    if merge and not dirty:
        summary.merged_on_write = True
    else:
        jlog.set_state("reduce")
        if dirty:
            summary.rebuilt = True
            log.warning("job %s: merges were partial or doubled; rebuilding the output from the shuffle", spec.job_id)
            if writer is not None:
                # A new version needs every server, as the commit does: wait for one that is down as it would.
                deadline = time.monotonic() + _commit_timeout(spec)
                if wait_whole(g, deadline, "rebuilding its output", spec.job_id, jlog.note_waiting) > 0:
                    # The cluster is whole again: the rebuild writes at ack=all, once the clients' probers (every
                    # 500 ms, client rule 4) have seen the server back, so no write skips it as down.
                    time.sleep(_PROBE_GRACE)
                    runner.ack = "all"
                writer.abort()
                writer = VersionWriter(g, spec.output or "").begin()
                spec = dataclasses.replace(spec, output_version=writer.version, merge_version=writer.version)
                jlog.put_spec(spec)
        result = _reduce(spec, g, jlog, engine, runner, committed, summary, progress, writer is not None and not dirty)
    summary.phases["reduce"] = time.perf_counter() - t_red
    if spec.output is not None:
        jlog.set_state("commit")  # all work done: a resume only seals and switches
    elif merge and not dirty:
        result = _read_merged(g, spec.merge_target, key_kinds)
    return _finish(spec, g, jlog, summary, result, t0)


def _add_counts(summary: Summary, committed: dict[int, dict[str, Any]]) -> None:
    for rec in committed.values():
        summary.records_in += rec["records"]
        summary.pairs_out += rec["pairs"]
        summary.pairs_combined += rec["combined"]
        summary.bytes_shuffled += rec["bytes"]


# Longer than a client's probe interval plus a probe's timeout (docs/client.md, rule 4).
_PROBE_GRACE = 1.0


def _came_back(g: Grid, job_id: str, what: str) -> bool:
    """Whether every server answers, after some of the job's writes of this phase were made at ack=one (a server was
    down). A server that came back copied its partitions from a replica, but a write its clients sent while they
    still counted it down (until their probe answered) may have reached the replica after the copy: the server then
    lacks it (docs/membership.md, what ack promises). So those writes are made again, at
    ack=all; once the clients' probers have seen the server (a probe interval), none skips it."""
    try:
        status = g.status()
    except RamgridError:
        return False
    if not all(st.get("ok") for st in status):
        return False  # still down: when it comes back it copies writes made until then (the job waits for it)
    log.warning(
        "job %s: %s wrote at ack=one while a server was down, and every server answers again: they run again at "
        "ack=all so that the server that came back holds their writes",
        job_id,
        what,
    )
    time.sleep(_PROBE_GRACE)
    return True


def _again_at_all(
    engine: ThreadEngine | DaskEngine, tasks: list[int], submit: Callable[[int], Any], max_attempts: int
) -> dict[int, dict[str, Any]]:
    """Runs `submit(t)` for each task and waits; a task that fails is run again (a probe interval later) up to
    `max_attempts` times, never at a lower ack: the point is that every replica takes its writes."""
    out: dict[int, dict[str, Any]] = {}
    todo = list(tasks)
    for round_ in range(max_attempts):
        futures = {submit(t): t for t in todo}
        failed: list[int] = []
        try:
            for f in engine.as_completed(list(futures)):
                try:
                    out[futures[f]] = f.result()
                except RamgridError:
                    if round_ == max_attempts - 1:
                        raise
                    failed.append(futures[f])
        except BaseException:
            engine.cancel(list(futures))
            raise
        if not failed:
            break
        todo = failed
        time.sleep(_PROBE_GRACE)
    return out


def _commit_timeout(spec: JobSpec) -> float:
    return float(spec.extra.get("commit_timeout", DEFAULT_COMMIT_TIMEOUT))


def _finish(
    spec: JobSpec,
    g: Grid,
    jlog: JobLog,
    summary: Summary,
    result: dict[Any, Any] | None,
    t0: float,
) -> JobResult:
    """Commits the job: seals and switches the output version (waiting, bounded, for every server), then drops the
    job's tables."""
    t_commit = time.perf_counter()
    version = None
    if spec.output is not None:
        commit_output(g, spec.output, spec.output_version, spec.job_id, _commit_timeout(spec), jlog.note_waiting)
        version = spec.output_version
        result = None
        log.info("job %s: version %d of %s is current", spec.job_id, version, spec.output)
    jlog.set_state("done")
    if not spec.keep_intermediate:
        for name in (spec.intermediate, spec.merge_target if spec.output is None else ""):
            if name:
                _quietly(g.drop_table, name)
        jlog.drop()
    summary.phases["commit"] = time.perf_counter() - t_commit
    summary.seconds = time.perf_counter() - t0
    log.info("%s", summary)
    return JobResult(summary=summary, result=result, output=spec.output, version=version)


def _reduce(
    spec: JobSpec,
    g: Grid,
    jlog: JobLog,
    engine: ThreadEngine | DaskEngine,
    runner: _Attempts,
    committed: dict[int, dict[str, Any]],
    summary: Summary,
    progress: bool,
    skip_logged: bool,
) -> dict[Any, Any] | None:
    R = spec.reduce_partitions
    owners = g.table(spec.intermediate).owners()
    per_r = [
        {t: (rec["attempt"], rec["chunks"][r]) for t, rec in committed.items() if rec["chunks"][r]} for r in range(R)
    ]
    done_before = jlog.reduces_done(R) if (spec.output is not None and skip_logged) else {}
    todo = [r for r in range(R) if r not in done_before]
    summary.reduce_tasks = R
    out: dict[Any, Any] = {}

    def submit(r: int, attempt: int, ack: str) -> Any:
        where = owners[r][attempt % len(owners[r])] if owners[r] else None
        return engine.submit(reduce_task, spec, r, per_r[r], ack, where=where, name="reduce")

    weak: list[int] = []

    def done(r: int, rec: dict[str, Any]) -> None:
        if "result" in rec:
            out.update(rec["result"])
        elif spec.output is not None:
            jlog.reduce_done(r, {"pairs_out": rec["pairs_out"]})
            if rec.get("ack") == "one":
                weak.append(r)

    with Progress(f"reduce {spec.job_id}", R, progress, done=R - len(todo)) as prog:
        runner.run(todo, submit, done, prog=prog)
    if weak and _came_back(g, spec.job_id, f"{len(weak)} reduce tasks"):
        runner.ack = "all"

        def again(r: int) -> Any:
            return engine.submit(
                reduce_task, spec, r, per_r[r], "all", where=owners[r][0] if owners[r] else None, name="reduce"
            )

        _again_at_all(engine, sorted(weak), again, runner.max_attempts)  # plain puts: the same values again
        summary.rewritten += len(weak)
    return out if spec.output is None else None


def _read_merged(g: Grid, name: str, key_kinds: set[str]) -> dict[Any, Any]:
    """The merge target's items as a dict, keys decoded back to the mappers' kind (str, int or bytes)."""
    import numpy as np

    kind = next(iter(key_kinds)) if len(key_kinds) == 1 else "bytes"
    out: dict[Any, Any] = {}
    for keys, values in g.table(name).scan():
        ks = keys.to_pylist()
        vs = values.tolist()
        if kind == "str":
            ks = [k.decode("utf-8") for k in ks]
        elif kind == "int":
            ks = np.frombuffer(b"".join(ks), dtype="<i8").tolist()
        out.update(zip(ks, vs))
    return out


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except (RamgridError, ValueError):
        pass  # cleanup: the job's outcome is decided
