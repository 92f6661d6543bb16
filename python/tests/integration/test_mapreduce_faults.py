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

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

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


def _when_committed(grid: ramgrid.Grid, job_id: str, n: int, action: Callable[[], None]) -> threading.Thread:
    """Runs `action` once `n` map tasks of the job are committed in its log (polled)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _committed(grid, job_id, 10_000) >= n:
                action()
                return
            time.sleep(0.05)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


def test_a_server_killed_mid_job_loses_nothing(lines: list[str], tmp_path: Path, slow: None) -> None:
    src = h.write_text(tmp_path / "slice.txt", lines)
    with ramgrid.local(servers=3, memory="256MiB", timeout=2.0) as g:
        watcher = _when_committed(g, "kill1", 3, lambda: g.kill(1))
        res = mapreduce.run(
            g,
            src,
            h.slow_count_block,
            "sum",
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
    # Map tasks committed before the kill were not run again: only failed runs were retried, and the reduce read
    # the committed output from the surviving replica.
    assert s.map_runs == s.map_tasks + s.retries


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
        watcher = _when_committed(g, "kill2", 3, lambda: os.kill(pids[0], signal.SIGKILL))
        res = mapreduce.run(
            g,
            src,
            h.slow_word_pairs,
            h.total,
            combiner=h.total,
            chunk_bytes=CHUNK,
            dask_client=client,
            progress=False,
            job_id="kill2",
        )
        watcher.join(5)
    assert res.result == dict(h.reference_counts(lines))


_DRIVER = """
import sys
import ramgrid
from ramgrid import mapreduce
import _mr_helpers as h
g = ramgrid.connect(sys.argv[1])
mapreduce.run(g, sys.argv[2], h.slow_count_block, "sum", vectorised=True, chunk_bytes=int(sys.argv[3]),
              workers=2, progress=False, job_id=sys.argv[4])
print("finished", flush=True)
"""


def test_resume_after_the_driver_is_killed(lines: list[str], tmp_path: Path) -> None:
    src = h.write_text(tmp_path / "slice.txt", lines)
    env = dict(
        os.environ,
        RAMGRID_MR_TEST_DELAY="0.1",
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    with ramgrid.local(servers=2, memory="256MiB") as g:
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, ",".join(g.servers), str(src), str(CHUNK), "resume1"], env=env
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
    assert res.result == dict(h.reference_counts(lines))
    assert res.summary.maps_resumed == done_before >= 3
    assert res.summary.map_runs == res.summary.map_tasks - done_before + res.summary.retries
