"""A job with an output table and a server SIGKILLed mid-job (issue 11, item 4): the job waits at its commit for the
server to come back and repair itself, then seals and switches its output version; if it does not come back within
`commit_timeout`, the job fails with `CommitPending` naming it, and `resume` later only seals and switches. The output
is checked key by key against a plain-Python word count of real text."""

from __future__ import annotations

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
from ramgrid.exceptions import CommitPending, RamgridError
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


def _waiting(log: JobLog) -> bool:
    return bool(log.waiting())


def _check_output(grid: ramgrid.Grid, lines: list[str], version: int | None) -> None:
    ref = dict(h.reference_counts(lines))
    t = ramgrid.connect(grid.addresses).table("counts")  # a fresh client: no state from the job
    assert version is not None and t.current_version() == version
    words = sorted(ref)
    assert t.get_many(words).tolist() == [ref[w] for w in words]
    assert t.describe()["versions"][-1]["items"] == len(ref)
    # Every replica holds the output whole: each server's share of the version adds up to twice the keys, and a
    # scan preferring each server in turn (it serves every partition it holds) reads exactly the reference.
    per_server = [d["tables"]["counts"]["by_version"][version]["items"] for d in grid.stats()]
    assert sum(per_server) == 2 * len(ref), per_server
    for server in grid.addresses:
        with t.scan(prefer=server) as chunks:
            seen = {k.decode(): v for keys, values in chunks for k, v in zip(keys.to_pylist(), values.tolist())}
        assert seen == ref, server


@pytest.mark.parametrize("restart", ["at-commit", "mid-map"])
@pytest.mark.parametrize("reducer", ["general", "sum"])
def test_a_server_killed_mid_job_and_restarted_lets_the_job_switch_its_output(
    lines: list[str], tmp_path: Path, slow: None, reducer: str, restart: str
) -> None:
    """The general reducer writes the output in its reduce phase (at ack=one while the server is down); "sum" merges
    on write (at ack=one after the kill), and a merge the kill cut makes the job rebuild its output in a new version,
    which waits for the server as the commit does. The server comes back while the driver waits for it (the driver
    notes in its log the servers it waits for), or while map tasks still write at ack=one: those run again at
    ack=all once every server answers, so the server that came back holds their writes."""
    src = h.write_text(tmp_path / "slice.txt", lines)
    job = f"commit-{reducer}-{restart}"
    with ramgrid.local(servers=3, memory="256MiB", timeout=2.0) as g:
        killer = _When(g, job, _maps_committed(3), lambda: g.kill(1))
        when = _waiting if restart == "at-commit" else _maps_committed(8)
        restarter = _When(g, job, when, lambda: g.restart(1))
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
        restarter.join(5)
        assert killer.fired and restarter.fired and killer.error is None and restarter.error is None
        assert all(g.alive())
        _check_output(g, lines, res.version)
    s = res.summary
    assert s.ack == "one"  # the job went on while the server was down
    assert s.map_runs == s.map_tasks + s.retries  # maps committed before the kill were not run again


def test_a_server_that_does_not_come_back_fails_the_commit_clearly_and_resume_switches(
    lines: list[str], tmp_path: Path, slow: None
) -> None:
    src = h.write_text(tmp_path / "slice.txt", lines)
    job = "commit-late"
    with ramgrid.local(servers=3, memory="256MiB", timeout=2.0) as g:
        victim = g.addresses[1]
        killer = _When(g, job, _maps_committed(3), lambda: g.kill(1))
        with pytest.raises(CommitPending) as err:
            mapreduce.run(
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
        e = err.value
        assert e.servers == (victim,) and e.job_id == job
        assert victim in str(e) and f"resume({job!r}, grid)" in str(e) and "down" in str(e)
        # Nothing switched: the job's version is open, its log says all work is done.
        log = JobLog(g.config, job)
        spec = log.spec()
        assert log.state() == "commit" and log.waiting() == [victim]
        assert g.table("counts").current_version() != spec.output_version
        with pytest.raises(CommitPending):  # still down: resume fails the same way, in its bound
            mapreduce.resume(job, g, workers=3, progress=False, commit_timeout=0.5)

        g.restart(1)
        res = mapreduce.resume(job, g, workers=3, progress=False)
        assert res.version == spec.output_version
        _check_output(g, lines, res.version)
        assert not JobLog(g.config, job).exists()  # done: the job's tables are dropped
    s = res.summary
    # Only the seal and the switch: no task ran again.
    assert s.map_runs == 0 and s.reduce_tasks == 0 and s.retries == 0
    assert s.maps_resumed == s.map_tasks > 0


def test_a_commit_timeout_that_is_not_a_number_of_seconds_is_refused(tmp_path: Path) -> None:
    src = h.write_text(tmp_path / "two.txt", ["a b", "b c"])
    with ramgrid.local(servers=1, memory="64MiB") as g:
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match="commit_timeout"):
                mapreduce.run(g, src, h.word_pairs, "sum", output="counts", commit_timeout=bad, progress=False)
        assert g.tables() == []  # refused before anything was created
