"""What a MapReduce job is: its input splits, its functions, where its output goes. Plain picklable data: a job's
spec travels to the workers with each task and is kept in the job log, so `resume` can rebuild the job.

Functions (mapper, combiner, reducer) must pickle by reference (module-level functions), so a resumed job in a new
driver process finds them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ramgrid.splits import FileSplit

if TYPE_CHECKING:
    from ramgrid.grid import GridConfig

__all__ = ["MERGE_REDUCERS", "FileSplit", "JobSpec", "TableSplit"]

# Reducers the store merges itself on write (put_many(merge=...)): no reduce phase is needed.
MERGE_REDUCERS = {"sum": "add", "count": "add", "min": "min", "max": "max"}


@dataclass(frozen=True)
class TableSplit:
    """One partition of one pinned version of a grid table."""

    table: str
    version: int
    incarnation: int
    partition: int
    owners: tuple[str, ...]  # replicas, primary first: where the map task should run

    @property
    def label(self) -> str:
        return f"{self.table}@{self.version}/p{self.partition}"


Split = TableSplit | FileSplit


@dataclass(frozen=True)
class JobSpec:
    """Everything a task, or a resumed driver, needs to know about the job."""

    job_id: str
    config: GridConfig  # the grid, with the acknowledgement level the tasks write at
    splits: tuple[Split, ...]
    mapper: Callable[..., Any]
    reducer: str | Callable[[Any, list[Any]], Any]
    combiner: Callable[[Any, list[Any]], Any] | None = None
    vectorised: bool = False
    reduce_partitions: int = 16
    intermediate: str = ""  # the table map output is shuffled through
    log_table: str = ""  # the job log (bytes)
    marks_table: str = ""  # the job's counters (i64): merge claims
    output: str | None = None  # a table name, or None: return the result
    output_type: str = "i64"
    output_version: int = 0  # the open version of `output` the job writes (0: none)
    merge_target: str = ""  # the table merge-on-write writes to (the output, or a temporary one)
    merge_version: int = 0
    keep_intermediate: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def merge(self) -> str | None:
        """The store merge ("add", "min", "max") this job's reducer is, or None for a general reducer."""
        return MERGE_REDUCERS.get(self.reducer) if isinstance(self.reducer, str) else None
