"""The job log: what a MapReduce job has done, kept in two small replicated grid tables so that a driver that dies
can be replaced (`ramgrid.mapreduce.resume`), as Horcrux kept its job's commit log in Kafka.

`<job>.log` (bytes): "spec" (the pickled JobSpec), "state" ("map", "reduce", "commit": all
work done, the output version is to be sealed and switched, "done"), "waiting" (the servers the driver last waited
for at its commit, down or repairing), "map/<t>" (the
committed attempt of map task t with its counts: written by the driver when the first attempt of t succeeds, never
changed after), "reduce/<r>" (a reduce partition whose output was written to the output table).

`<job>.marks` (i64): merge-on-write bookkeeping. "claim/<t>" counts the runs of task t that reached their merge
writes (a merge add, so concurrent runs each see a distinct count or a count above 1); "merged/<t>" is 1 once one
run of t merged all of its output; "dirty" is above 0 once merges may have been applied partly or twice (a run
failed during its merges, or found another run's merges unfinished, or the driver died). A dirty output is rebuilt
from the shuffled blobs, which the committed attempts keep, so no map task runs again.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import numpy as np

from ramgrid.exceptions import BatchError, ConnectionFailed, PartitionsUnavailable, RamgridError, TableNotFound
from ramgrid.grid import Grid, GridConfig

__all__ = ["JobLog"]


class JobLog:
    """Handles on a job's log tables. Picklable (configuration and names; the grid handle pickles its configuration).

    `grid`: a handle on `config` to use (a task's own, so that a task builds one); by default the log builds one."""

    def __init__(self, config: GridConfig, job_id: str, grid: Grid | None = None) -> None:
        if grid is not None and grid.config != config:
            raise ValueError("JobLog: the grid handle given is not one on the log's configuration")
        self.config = config
        self.job_id = job_id
        self.log_name = f"{job_id}.log"
        self.marks_name = f"{job_id}.marks"
        self.grid = grid if grid is not None else Grid(config)

    def _write(self, table: str, keys: list[str], values: Any, merge: str = "store") -> None:
        """Writes at the job's level (ack=all); when a replica is down and that cannot be met, again at ack=one
        (the live replica keeps the log). A merge written twice that way only overcounts a claim, which makes the
        task's merges count as dirty: the safe side."""
        try:
            self.grid.table(table).put_many(keys, values, merge=merge)
        except (BatchError, PartitionsUnavailable, ConnectionFailed):
            if self.config.ack == "one":
                raise
            Grid(replace(self.config, ack="one")).table(table).put_many(keys, values, merge=merge)

    def create(self, replication: int) -> None:
        g = self.grid
        g.create_table(self.log_name, partitions=4, replication=replication, value_type="bytes")
        g.create_table(self.marks_name, partitions=4, replication=replication, value_type="i64")

    def exists(self) -> bool:
        try:
            self.grid.table(self.log_name).describe()
        except TableNotFound:
            return False
        return True

    def drop(self) -> None:
        for name in (self.log_name, self.marks_name):
            try:
                self.grid.drop_table(name)
            except (RamgridError, ValueError):
                pass  # a server down: the table stays listed there; harmless

    # the log

    def _put(self, key: str, value: Any) -> None:
        self._write(self.log_name, [key], [pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)])

    def _get_many(self, keys: list[str]) -> list[Any]:
        if not keys:
            return []
        raw = self.grid.table(self.log_name).get_many(keys, default=None)
        return [None if b is None else pickle.loads(b) for b in raw]

    def put_spec(self, spec: Any) -> None:
        self._put("spec", spec)

    def spec(self) -> Any:
        (s,) = self._get_many(["spec"])
        if s is None:
            raise RamgridError(f"job {self.job_id!r} has no spec in its log")
        return s

    def set_state(self, state: str) -> None:
        self._put("state", state)

    def state(self) -> str | None:
        (s,) = self._get_many(["state"])
        return None if s is None else str(s)

    def note_waiting(self, servers: list[str]) -> None:
        """The driver waits for these servers (down or repairing) before it can switch the output version."""
        self._put("waiting", list(servers))

    def waiting(self) -> list[str]:
        (w,) = self._get_many(["waiting"])
        return [] if w is None else list(w)

    def commit_map(self, task: int, record: dict[str, Any]) -> None:
        self._put(f"map/{task}", record)

    def committed_maps(self, tasks: int) -> dict[int, dict[str, Any]]:
        got = self._get_many([f"map/{t}" for t in range(tasks)])
        return {t: r for t, r in enumerate(got) if r is not None}

    def reduce_done(self, r: int, record: dict[str, Any]) -> None:
        self._put(f"reduce/{r}", record)

    def reduces_done(self, partitions: int) -> dict[int, dict[str, Any]]:
        got = self._get_many([f"reduce/{r}" for r in range(partitions)])
        return {r: x for r, x in enumerate(got) if x is not None}

    # merge marks

    def _add(self, key: str, n: int = 1) -> int:
        self._write(self.marks_name, [key], np.array([n], dtype=np.int64), merge="add")
        return int(self.grid.table(self.marks_name).get(key))

    def claim(self, task: int) -> int:
        """Counts a run of `task` reaching its merges; returns the count seen (1: this run is the first)."""
        return self._add(f"claim/{task}")

    def mark_merged(self, task: int) -> None:
        self._write(self.marks_name, [f"merged/{task}"], np.array([1], dtype=np.int64))

    def merged(self, task: int) -> bool:
        return int(self.grid.table(self.marks_name).get(f"merged/{task}", 0)) > 0

    def mark_dirty(self) -> None:
        self._add("dirty")

    def dirty(self) -> bool:
        return int(self.grid.table(self.marks_name).get("dirty", 0)) > 0
