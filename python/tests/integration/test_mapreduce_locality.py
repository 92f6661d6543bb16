"""Locality of map tasks (issue 11, item 2): on a grid of two servers and a Dask LocalCluster of two worker
processes, each map task of a table input runs on the worker paired with the server that holds its partition."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)
distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install '.[dask]')")

import dask
import ramgrid
from ramgrid import mapreduce
from ramgrid.engines import DaskEngine

pytestmark = pytest.mark.timeout(90)

HERE = Path(__file__).resolve().parent
PARTITIONS = 8


def where_ran(keys: object, values: object) -> dict[str, int]:
    """Vectorised mapper: one pair "<partition>|<worker address>" -> number of keys, per scan chunk."""
    from ramgrid import _native

    ks = keys.to_pylist()  # type: ignore[attr-defined]
    parts = {int(_native.partition_of(k, PARTITIONS)) for k in ks}
    assert len(parts) == 1, "a map task reads one partition"
    worker = distributed.get_worker().address
    return {f"{parts.pop()}|{worker}": len(ks)}


def test_map_tasks_run_on_the_worker_paired_with_their_partitions_server(monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers import this module to unpickle the mapper.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    with (
        ramgrid.local(servers=2, memory="64MiB") as grid,
        # Work stealing may move a task whose paired worker is busy (the hint allows other workers, so a dead
        # worker's tasks still run): off here, so the test sees the engine's placement alone.
        dask.config.set({"distributed.scheduler.work-stealing": False}),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        t = grid.create_table("loc", partitions=PARTITIONS, replication=1, value_type="i64")
        n = 4000
        t.put_many([f"k{i}" for i in range(n)], np.arange(n, dtype=np.int64))
        owners = t.owners()
        # On one machine every server is local to every worker; the rule gives server i to worker i mod 2.
        pairing = DaskEngine(client, grid.servers).pairing
        assert sorted(pairing) == sorted(grid.servers) and len(set(pairing.values())) == 2
        primaries = {o[0] for o in owners}
        assert primaries == set(grid.servers)  # both servers hold partitions, so both workers have map tasks

        res = mapreduce.run(grid, t, where_ran, "sum", vectorised=True, dask_client=client, progress=False)

    assert res.result is not None
    ran: dict[int, set[str]] = {}
    keys = 0
    for label, count in res.result.items():
        p, worker = label.split("|", 1)
        ran.setdefault(int(p), set()).add(worker)
        keys += count
    assert keys == n
    assert sorted(ran) == list(range(PARTITIONS))
    for p, workers in ran.items():
        assert workers == {pairing[owners[p][0]]}, f"partition {p} (primary {owners[p][0]}) ran on {workers}"
