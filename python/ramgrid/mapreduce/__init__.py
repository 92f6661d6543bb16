"""MapReduce on the grid: map tasks beside their data, the shuffle through a replicated grid table, reduce tasks at
the owners of the intermediate partitions, numeric reducers merged by the store on write, and a job log in the grid
from which `resume` continues a job whose driver died.

    import ramgrid
    from ramgrid import mapreduce

    with ramgrid.local(servers=2) as grid:
        res = mapreduce.run(grid, "corpus.txt", mapreduce.wordcount.count_block, "sum", vectorised=True)
        print(res.summary, res.result["the"])

Modules: `job` (the driver: `run`, `resume`), `tasks` (map and reduce tasks), `shuffle` (the intermediate table's
layout), `joblog` (the job log), `spec` (what a job is), `wordcount` (the word count and its command).
"""

from __future__ import annotations

from ramgrid.mapreduce import wordcount
from ramgrid.mapreduce.job import JobResult, Summary, abandon, resume, run
from ramgrid.mapreduce.spec import MERGE_REDUCERS

__all__ = ["MERGE_REDUCERS", "JobResult", "Summary", "abandon", "resume", "run", "wordcount"]
