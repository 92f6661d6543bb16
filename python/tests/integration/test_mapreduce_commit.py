"""A job with an output table and a server SIGKILLed mid-job (issue 11, item 4). Since each partition's primary
orders its writes (issue 25), a write at ack=all waits for the dead server's fail-over and then completes on every
replica of the new spec: the job does not fall back to ack=one, so it has nothing to wait for at its commit. It
completes on the survivors whether the server comes back mid-job or never. (`CommitPending` is still raised when a
job did write at ack=one: tests/unit and the resume path keep it.) The output is checked key by key against a
plain-Python word count of real text."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import _mr_helpers as h
import ramgrid
from ramgrid import mapreduce
from ramgrid.exceptions import RamgridError
from ramgrid.mapreduce.joblog import JobLog

pytestmark = pytest.mark.timeout(120)

LINES = 6000
CHUNK = 32 << 10


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


class _When(threading.Thread):
    """Runs `action` once `ready(log)` is true of the job's log (polled); `fired` says whether it ran."""

    def __init__(self, grid: ramgrid.Grid, job_id: str, ready: Callable[[JobLog], bool], action: Callable[[], None]):
        super().__init__(daemon=True)
        self.log = JobLog(grid.config, job_id)
        self.ready, self.action = ready, action
        self.fired = False
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            try:
                ok = self.ready(self.log)
            except (RamgridError, ValueError):
                ok = False  # the log table is not there yet, or is gone
            if ok:
                try:
                    self.action()
                except (RamgridError, OSError) as e:  # reported by the test
                    self.error = e
                self.fired = True
                return
            time.sleep(0.05)


def _maps_committed(n: int) -> Callable[[JobLog], bool]:
    return lambda log: len(log.committed_maps(10_000)) >= n


def _eventually(check: Callable[[], None], limit: float = 60.0) -> None:
    """Runs `check` until it passes: the fail-over's re-replication (or a rejoin's copy) may still be running."""
    deadline = time.monotonic() + limit
    while True:
        try:
            check()
            return
        except (AssertionError, RamgridError, ValueError):  # ValueError: a rejoining server not in the spec yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _check_output(grid: Any, lines: list[str], version: int | None, live: list[str] | None = None) -> None:
    ref = dict(h.reference_counts(lines))
    t = ramgrid.connect(grid.addresses).table("counts")  # a fresh client: no state from the job
    assert version is not None and t.current_version() == version
    words = sorted(ref)
    assert t.get_many(words).tolist() == [ref[w] for w in words]
    assert t.describe()["versions"][-1]["items"] == len(ref)
    # Every replica holds the output whole: each server's share of the version adds up to twice the keys, and a
    # scan preferring each server in turn (it serves every partition it holds) reads exactly the reference.
    servers = live if live is not None else list(grid.addresses)
    t = ramgrid.connect(servers).table("counts")
    t._client().refresh_spec()
    per_server = [d["tables"]["counts"]["by_version"][version]["items"] for d in t._grid.stats()]
    assert sum(per_server) == 2 * len(ref), per_server
    for server in servers:
        with t.scan(prefer=server) as chunks:
            seen = {k.decode(): v for keys, values in chunks for k, v in zip(keys.to_pylist(), values.tolist())}
        assert seen == ref, server


@pytest.mark.parametrize("reducer", ["general", "sum"])
def test_a_server_killed_mid_job_and_restarted_lets_the_job_switch_its_output(
    lines: list[str], tmp_path: Path, slow: None, reducer: str
) -> None:
    """The general reducer writes the output in its reduce phase; "sum" merges on write. The server is killed after
    three maps and comes back after eight: the job's writes wait for its fail-over, then go on (a task placed beside
    the dead server reads its split from another replica); the server rejoins and copies back what it holds."""
    src = h.write_text(tmp_path / "slice.txt", lines)
    job = f"commit-{reducer}"
    with ramgrid.local(servers=3, memory="256MiB", timeout=2.0) as g:
        killer = _When(g, job, _maps_committed(3), lambda: g.kill(1))
        restarter = _When(g, job, _maps_committed(8), lambda: g.restart(1))
        res = mapreduce.run(
            g,
            src,
            h.slow_count_block,
            h.total if reducer == "general" else "sum",
            vectorised=True,
            chunk_bytes=CHUNK,
            workers=3,
            progress=False,
            job_id=job,
            output="counts",
            output_type="i64",
            commit_timeout=60,
        )
        killer.join(5)
        restarter.join(30)
        assert killer.fired and killer.error is None
        if restarter.fired:  # the job may finish before an eighth map commits after the kill
            assert restarter.error is None
        live = [a for a, up in zip(g.addresses, g.alive(), strict=True) if up]
        _eventually(lambda: _check_output(g, lines, res.version, live=live))
    s = res.summary
    assert s.map_runs == s.map_tasks + s.retries  # maps committed before the kill were not run again


def test_a_server_that_does_not_come_back_does_not_hold_the_commit(
    lines: list[str], tmp_path: Path, slow: None
) -> None:
    # Before, the job wrote at ack=one while the server was down and had to wait at its commit for it to come back
    # (CommitPending after commit_timeout). Its writes now wait for the fail-over and are then on every replica of
    # the new spec, so the job commits on the survivors.
    src = h.write_text(tmp_path / "slice.txt", lines)
    job = "commit-late"
    with ramgrid.local(servers=3, memory="256MiB", timeout=2.0) as g:
        victim = g.addresses[1]
        killer = _When(g, job, _maps_committed(3), lambda: g.kill(1))
        res = mapreduce.run(
            g,
            src,
            h.slow_count_block,
            h.total,
            vectorised=True,
            chunk_bytes=CHUNK,
            workers=3,
            progress=False,
            job_id=job,
            output="counts",
            output_type="i64",
            commit_timeout=2,
        )
        killer.join(5)
        assert killer.fired
        _eventually(lambda: _check_output(g, lines, res.version, live=[a for a in g.addresses if a != victim]))
        assert not JobLog(g.config, job).exists()  # done: the job's tables are dropped


def test_a_commit_timeout_that_is_not_a_number_of_seconds_is_refused(tmp_path: Path) -> None:
    src = h.write_text(tmp_path / "two.txt", ["a b", "b c"])
    with ramgrid.local(servers=1, memory="64MiB") as g:
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match="commit_timeout"):
                mapreduce.run(g, src, h.word_pairs, "sum", output="counts", commit_timeout=bad, progress=False)
        assert g.tables() == []  # refused before anything was created
