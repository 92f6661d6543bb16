"""Handles across processes (pickle, fork, spawn, forkserver, Dask) and the embedded cluster's process hygiene."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import ServerStartError

pytestmark = pytest.mark.timeout(90)

# Python 3.12+ warns when forking a process that has threads (Dask's leftovers, pytest plugins); these tests fork on
# purpose, with a client that holds no threads.
FORK_OK = pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning")


def _sum_chunk(args: tuple[ramgrid.Table, np.ndarray]) -> tuple[int, float]:
    table, keys = args
    return os.getpid(), float(table.get_many(keys).sum())


@pytest.fixture(scope="module")
def loaded(grid3: ramgrid.LocalGrid) -> tuple[ramgrid.Table, np.ndarray, np.ndarray]:
    t = grid3.create_table(f"mp_{os.getpid()}", partitions=16, value_type="f64", exist_ok=True)
    keys = np.arange(4000, dtype=np.int64)
    vals = keys * 0.25
    t.put_many(keys, vals)
    return t, keys, vals


@FORK_OK
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("handle", ["table", "pinned"])
def test_pool_reads_through_pickled_handles(
    loaded: tuple[ramgrid.Table, np.ndarray, np.ndarray], method: str, handle: str
) -> None:
    t, keys, vals = loaded
    h = t if handle == "table" else t.pin()
    # The parent has used its client, so a forked child inherits live connections it must not reuse.
    assert t.get_many(keys[:10]).tolist() == vals[:10].tolist()
    chunks = np.array_split(keys, 8)
    with mp.get_context(method).Pool(2) as pool:
        results = pool.map(_sum_chunk, [(h, c) for c in chunks])
    assert {pid for pid, _ in results}.isdisjoint({os.getpid()})
    assert sum(s for _, s in results) == pytest.approx(float(vals.sum()))
    # The parent's connections still work after the children used theirs.
    assert t.get_many(keys[-5:]).tolist() == vals[-5:].tolist()


@FORK_OK
def test_fork_child_uses_own_connections(loaded: tuple[ramgrid.Table, np.ndarray, np.ndarray]) -> None:
    t, keys, vals = loaded
    t.get_many(keys[:5])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ok = float(t.get_many(keys).sum()) == float(vals.sum())
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert float(t.get_many(keys).sum()) == float(vals.sum())


def test_local_grid_pickles_as_a_plain_grid(grid3: ramgrid.LocalGrid) -> None:
    g = pickle.loads(pickle.dumps(grid3))
    assert type(g) is ramgrid.Grid and g.servers == grid3.addresses
    assert b"Popen" not in pickle.dumps(grid3)


def _child_script(body: str) -> list[str]:
    code = "import os, sys, time, ramgrid\n" + textwrap.dedent(body)
    return [sys.executable, "-c", code]


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_dead(pids: list[int], limit: float = 15.0) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _dead(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if not _dead(p)]


def _pids_from(proc: subprocess.Popen) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), line
    return [int(x) for x in line.split()[1:]]


def test_no_orphans_when_owner_exits_without_closing() -> None:
    script = _child_script(
        """
        g = ramgrid.local(servers=2, memory="16MiB")
        print("PIDS", *g.pids, flush=True)
        g.create_table("t")
        # exits without close(): the finalizer must stop the servers
        """
    )
    with subprocess.Popen(script, stdout=subprocess.PIPE, text=True) as proc:
        pids = _pids_from(proc)
        assert proc.wait(timeout=30) == 0
    assert _wait_dead(pids, 1.0) == []  # stopped and reaped before the owner exited


def test_no_orphans_when_owner_is_killed() -> None:
    script = _child_script(
        """
        g = ramgrid.local(servers=2, memory="16MiB")
        print("PIDS", *g.pids, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen(script, stdout=subprocess.PIPE, text=True) as proc:
        try:
            pids = _pids_from(proc)
            assert not any(_dead(p) for p in pids)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            assert _wait_dead(pids) == [], "servers outlived their SIGKILLed owner"
        finally:
            if proc.poll() is None:
                proc.kill()


def test_close_stops_servers_and_handles_refuse() -> None:
    g = ramgrid.local(servers=2, memory="16MiB")
    pids = g.pids
    g.close()
    assert g.closed and _wait_dead(pids, 1.0) == []
    with pytest.raises(ramgrid.RamgridError, match="closed"):
        g.tables()
    g.close()  # idempotent


def test_server_that_fails_to_start_is_reported_with_stderr() -> None:
    with pytest.raises(ServerStartError) as e:
        ramgrid.local(servers=2, extra_args=["--no-such-flag"], start_timeout=20)
    msg = str(e.value)
    assert "no-such-flag" in msg and "exited with status" in msg


def test_kill_then_close_is_clean() -> None:
    with ramgrid.local(servers=2, memory="16MiB") as g:
        g.kill(0)
        assert g.alive() == [False, True]
    assert _wait_dead(g.pids, 1.0) == []
