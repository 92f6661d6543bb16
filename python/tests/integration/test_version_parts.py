"""Parallel writers into one version (`VersionWriter.part()`): processes write through pickled parts, the driver
commits or aborts; a part cannot write once the version is committed or dropped."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import VersionNotFound, VersionSealed

pytestmark = pytest.mark.timeout(120)


def _fill(part: ramgrid.VersionPart, lo: int, hi: int) -> int:
    keys = np.arange(lo, hi, dtype=np.int64)
    part.put_many(keys, keys * 2)
    return hi - lo


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_processes_fill_one_version_and_the_driver_commits(
    grid3: ramgrid.LocalGrid, table_name: str, method: str
) -> None:
    t = grid3.create_table(table_name, partitions=16, replication=2, value_type="i64")
    t.put_many([0], [-1])
    before = t.current_version()
    with t.new_version() as v:
        part = v.part()
        assert pickle.loads(pickle.dumps(part)).version == v.version
        with mp.get_context(method).Pool(3) as pool:
            written = pool.starmap(_fill, [(part, i * 10_000, (i + 1) * 10_000) for i in range(6)])
        assert sum(written) == 60_000
        assert t.current_version() == before and t.get(0) == -1  # invisible until the commit
        assert part.get(59_999) == 119_998  # the part reads the open version
    keys = np.arange(60_000, dtype=np.int64)
    assert (t.get_many(keys) == keys * 2).all() and t.current_version() == v.version


def test_dask_tasks_fill_one_version(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    distributed = pytest.importorskip("distributed")
    t = grid3.create_table(table_name, partitions=8, value_type="i64")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
        t.new_version() as v,
    ):
        futures = client.map(_fill, [v.part()] * 4, [0, 5_000, 10_000, 15_000], [5_000, 10_000, 15_000, 20_000])
        assert sum(client.gather(futures)) == 20_000
    keys = np.arange(20_000, dtype=np.int64)
    assert (t.get_many(keys) == keys * 2).all()


def test_a_part_cannot_write_after_the_commit_or_the_abort(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=4, value_type="i64")
    with t.new_version() as v:
        part = v.part()
        part.put_many([1], [1])
    with pytest.raises(VersionSealed):
        part.put_many([2], [2])
    w = t.new_version().begin()
    late = w.part()
    w.abort()
    with pytest.raises(VersionNotFound):
        late.put_many([3], [3])
    with pytest.raises(ramgrid.RamgridError, match="aborted"):
        w.part()
    assert t.get_many([1, 2, 3], default=0).tolist() == [1, 0, 0]
    with pytest.raises(TypeError, match=r"writer\.part\(\)"):
        pickle.dumps(t.new_version())
