"""MapReduce under faults, with real processes killed mid-job: a server (replication 2), a Dask worker, the driver
(then `resume`). Each job's output is checked exactly against a plain-Python word count of real text."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import _mr_helpers as h
import ramgrid
from ramgrid import mapreduce
from ramgrid.mapreduce.joblog import JobLog

pytestmark = pytest.mark.timeout(180)

LINES = 8000
CHUNK = 32 << 10
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def lines() -> list[str]:
    if not h.CORPUS.exists():
        pytest.skip(f"{h.CORPUS} is not there")
    return h.corpus_lines(LINES)


@pytest.fixture
def slow() -> Iterator[None]:
    h.set_delay(0.05)
    yield
    h.set_delay(0.0)


def _committed(grid: ramgrid.Grid, job_id: str, tasks: int) -> int:
    try:
        return len(JobLog(grid.config, job_id).committed_maps(tasks))
    except (ramgrid.exceptions.RamgridError, ValueError):
        return 0


class _When(threading.Thread):
    """Runs `action` once `n` map tasks of the job are committed in its log (polled); `at` is how many were."""

    def __init__(self, grid: ramgrid.Grid, job_id: str, n: int, action: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.grid, self.job_id, self.n, self.action = grid, job_id, n, action
        self.at = -1
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = _committed(self.grid, self.job_id, 10_000)
            if done >= self.n:
                self.action()
                self.at = done
                return
            time.sleep(0.05)


@pytest.mark.parametrize("reducer", ["sum", "general"])
def test_a_server_killed_mid_job_loses_nothing(lines: list[str], tmp_path: Path, slow: None, reducer: str) -> None:
    """With "sum" the store merges on write (a merge cut by the kill makes the job rebuild from the shuffle); with
    a general reducer the reduce tasks read every committed map output, some from the surviving replica."""
    src = h.write_text(tmp_path / "slice.txt", lines)
    with ramgrid.local(servers=3, memory="256MiB", timeout=2.0) as g:
        watcher = _When(g, "kill1", 3, lambda: g.kill(1))
        res = mapreduce.run(
            g,
            src,
            h.slow_count_block,
            "sum" if reducer == "sum" else h.total,
            vectorised=True,
            chunk_bytes=CHUNK,
            workers=3,
            progress=False,
            job_id="kill1",
        )
        watcher.join(5)
        assert not g.alive()[1]
    assert res.result == dict(h.reference_counts(lines))
    s = res.summary
    assert 3 <= watcher.at < s.map_tasks  # killed mid-job
    # Map tasks committed before the kill were not run again: only failed runs were retried, and the reduce read
    # the committed output from the surviving replica.
    assert s.map_runs == s.map_tasks + s.retries


@pytest.mark.slow
def test_a_dask_worker_killed_mid_job_loses_nothing(
    lines: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("RAMGRID_MR_TEST_DELAY", "0.05")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    src = h.write_text(tmp_path / "slice.txt", lines)
    with (
        ramgrid.local(servers=2, memory="256MiB") as g,
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = list(client.run(os.getpid).values())
        watcher = _When(g, "kill2", 3, lambda: os.kill(pids[0], signal.SIGKILL))
        res = mapreduce.run(
            g,
            src,
            h.slow_count_block,
            h.total,
            combiner=h.total,
            vectorised=True,
            chunk_bytes=CHUNK,
            dask_client=client,
            progress=False,
            job_id="kill2",
        )
        watcher.join(5)
    assert 3 <= watcher.at < res.summary.map_tasks  # killed mid-job
    assert res.result == dict(h.reference_counts(lines))


_DRIVER = """
import sys
import ramgrid
from ramgrid import mapreduce
import _mr_helpers as h
g = ramgrid.connect(sys.argv[1])
general = sys.argv[5] == "general"
mapreduce.run(g, sys.argv[2], h.slow_count_block, h.total if general else "sum", vectorised=True,
              chunk_bytes=int(sys.argv[3]), workers=2, progress=False, job_id=sys.argv[4],
              output="counts" if general else None, output_type="i64")
print("finished", flush=True)
"""


@pytest.mark.parametrize("reducer", ["sum", "general"])
def test_resume_after_the_driver_is_killed(lines: list[str], tmp_path: Path, reducer: str) -> None:
    """ "sum" returns its result (merged on write); the general reducer writes a new version of an output table,
    which the resumed driver adopts and switches."""
    src = h.write_text(tmp_path / "slice.txt", lines)
    env = dict(
        os.environ,
        RAMGRID_MR_TEST_DELAY="0.1",
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    with ramgrid.local(servers=2, memory="256MiB") as g:
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, ",".join(g.servers), str(src), str(CHUNK), "resume1", reducer], env=env
        )
        try:
            deadline = time.monotonic() + 120
            while _committed(g, "resume1", 10_000) < 3:
                assert driver.poll() is None, "the driver ended before it could be killed"
                assert time.monotonic() < deadline
                time.sleep(0.05)
            driver.kill()
            driver.wait(10)
        finally:
            if driver.poll() is None:
                driver.kill()
        done_before = _committed(g, "resume1", 10_000)
        res = mapreduce.resume("resume1", g, workers=3, progress=False)
        ref = dict(h.reference_counts(lines))
        if reducer == "general":
            t = g.table("counts")
            assert res.result is None and t.current_version() == res.version
            words = sorted(ref)
            assert t.get_many(words).tolist() == [ref[w] for w in words]
            assert t.describe()["versions"][-1]["items"] == len(ref)
        else:
            assert res.result == ref
    assert res.summary.map_tasks > res.summary.maps_resumed == done_before >= 3
    assert res.summary.map_runs == res.summary.map_tasks - done_before + res.summary.retries
