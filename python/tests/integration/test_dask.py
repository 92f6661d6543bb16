"""Dask: tasks on worker processes read a table through pickled handles; the quickstart example runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)
distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install '.[dask]')")

import ramgrid

REPO_ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)


def _task(table: ramgrid.Table, keys: np.ndarray) -> list[float]:
    return table.get_many(keys).tolist()


def _pinned_task(table: ramgrid.PinnedTable, keys: np.ndarray) -> tuple[int, float]:
    return table.version, float(table.get_many(keys).sum())


def test_dask_workers_read_a_table(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=16, value_type="f64")
    keys = np.arange(10_000, dtype=np.int64)
    vals = keys / 3.0
    t.put_many(keys, vals)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            # No dashboard; the scheduler's HTTP endpoint still exists, so give it a free port, not 8787.
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        chunks = np.array_split(keys, 10)
        got = client.gather(client.map(_task, [t] * len(chunks), chunks))
        assert np.concatenate(got).tolist() == vals.tolist()
        # A pinned handle keeps its version inside the tasks even after the table switches.
        pinned = t.pin()
        with t.new_version() as w:
            w.put_many(keys, np.zeros(len(keys)))
        res = client.gather(client.map(_pinned_task, [pinned] * len(chunks), chunks, pure=False))
        assert {v for v, _ in res} == {pinned.version}
        assert sum(s for _, s in res) == pytest.approx(float(vals.sum()))
        assert len({w for w in client.run(lambda: 1)}) == 2


def test_quickstart_example_runs() -> None:
    """The newcomer path: local grid, table, numpy load, read back in Dask tasks (a small key count keeps it quick)."""
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "quickstart.py"), "--keys", "50000"],
        capture_output=True,
        check=False,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.rstrip().endswith("ok")
