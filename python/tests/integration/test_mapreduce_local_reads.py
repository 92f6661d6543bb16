"""Map tasks read the replica they were placed beside (issue 11, item 2): each map task of a table input scans its
partition with `prefer=` the server `place_map_task` chose, so the servers' SCAN page counters (per table, from
METRICS) match the placement, also for a table whose primaries are uneven, where balancing moves tasks to
replicas (reading the primary would then show on the wrong server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid import mapreduce
from ramgrid.mapreduce.job import place_map_task

pytestmark = pytest.mark.timeout(90)

N = 6000

# What `served_by` compares with: the grid, the input table, and each server's SCAN pages of it so far. The job
# runs its tasks one at a time on one thread of this process, so the pages counted between two mapper calls are
# those of the partition the second call maps.
_WATCH: dict[str, Any] = {}


def _scan_pages(grid: ramgrid.Grid, table: str) -> dict[str, int]:
    return {d["server"]: int(d["tables"].get(table, {}).get("scan_pages", 0)) for d in grid.stats()}


def served_by(keys: Any, values: Any) -> dict[str, int]:
    """Vectorised mapper: "<partition>|<server that served its scan>" -> number of keys."""
    from ramgrid import _native

    parts = {int(_native.partition_of(k, _WATCH["partitions"])) for k in keys.to_pylist()}
    assert len(parts) == 1, "a map task reads one partition"
    now = _scan_pages(_WATCH["grid"], _WATCH["table"])
    grew = [s for s in now if now[s] != _WATCH["last"][s]]
    _WATCH["last"] = now
    return {f"{parts.pop()}|{'+'.join(grew)}": len(keys)}


def _placed(owners: list[list[str]]) -> list[str]:
    """Where the job puts each first attempt: the same function, over the partitions in order."""
    load: dict[str, int] = {}
    out = []
    for o in owners:
        where = place_map_task(tuple(o), 0, load)
        assert where is not None
        out.append(where)
    return out


def test_each_map_task_scans_the_replica_it_was_placed_beside() -> None:
    with ramgrid.local(servers=3, memory="64MiB") as g:
        # Balancing moves a task off its primary whenever the primaries met so far crowd on one server, so most
        # partition counts give a table where some tasks move: the case where reading the primary would be wrong.
        chosen = None
        for parts in range(8, 40):
            t = g.create_table(f"in{parts}", partitions=parts, replication=2, value_type="i64")
            owners = t.owners()
            placed = _placed(owners)
            if any(w != o[0] for w, o in zip(placed, owners)):
                chosen = (t, parts, owners, placed)
                break
            g.drop_table(t.name)
        assert chosen is not None, "no partition count moved a task off its primary"
        t, parts, owners, placed = chosen
        keys = np.arange(N, dtype=np.int64)
        # A sealed input, the same on every replica: a task reads it from the replica beside it. (An open version
        # is read from its primary, which alone shows a write only once every replica holds it.)
        with t.new_version() as v:
            v.put_many(keys, keys * 3)
        _WATCH.update(grid=g, table=t.name, partitions=parts, last=_scan_pages(g, t.name))
        res = mapreduce.run(g, t, served_by, "sum", vectorised=True, workers=1, progress=False)

    assert res.result is not None and res.summary.retries == 0
    got = {}
    for label in res.result:
        p, server = label.split("|")
        got[int(p)] = server
    assert sum(res.result.values()) == N
    # Every partition with keys was scanned once, by the server its task was placed beside (one page each).
    assert got == {p: placed[p] for p in got}, (got, placed)
    assert any(placed[p] != owners[p][0] for p in got)  # and some of those are not their partition's primary


def test_scan_prefer_takes_a_server_of_the_cluster_only() -> None:
    with ramgrid.local(servers=2, memory="64MiB") as g:
        t = g.create_table("t", partitions=4, replication=2, value_type="i64")
        t.put_many(np.arange(100), np.arange(100))
        with pytest.raises(ValueError, match="not a server of the cluster"):
            t.scan(prefer="127.0.0.1:1")
        # Each server preferred in turn: the whole table either way.
        for s in g.servers:
            with t.scan(prefer=s) as chunks:
                assert sorted(k for keys, _ in chunks for k in keys.to_pylist()) == sorted(
                    k.to_bytes(8, "little", signed=True) for k in range(100)
                )
