"""Servers come and go under a running job: a LocalGrid grown 3 -> 4 and shrunk back, a server restarted (it
repairs itself from its peers, `--join`), and the `ramgrid cluster add/remove/status` commands. Reads stay exact
and no acknowledged write is lost (docs/membership.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ramgrid
from _jobs import Jobs, check_all, load
from ramgrid._local import start_servers, stop_processes

pytestmark = pytest.mark.timeout(60)

BASE_KEYS = 20_000


def _assert_clean(jobs: Jobs) -> None:
    b = jobs.books
    assert not jobs.crashed, jobs.crashed
    assert not b.wrong, b.wrong[:5]
    assert not b.read_errors, b.read_errors[:5]
    assert b.reads > 0 and b.batches_acked > 0


def test_grow_and_shrink_under_a_running_job() -> None:
    with ramgrid.local(servers=3, memory="64MiB") as g:
        t = g.create_table("grow", partitions=16, replication=2, value_type="i64")
        base = load(t, BASE_KEYS)
        jobs = Jobs(g.spec, "grow", BASE_KEYS).start()
        try:
            time.sleep(0.5)
            added = g.add_server()
            grown = g.last_move
            assert g.servers == g.addresses and g.servers[-1] == added and len(g.servers) == 4
            assert grown is not None and grown["to"] == g.servers and grown["partitions_copied"] > 0
            time.sleep(0.5)
            shrunk = g.remove_server(3)
            assert shrunk["from"] == grown["to"] and shrunk["to"] == grown["from"] and g.servers == grown["from"]
            assert shrunk["partitions_copied"] > 0 and shrunk["bytes_copied"] > 0
            time.sleep(0.5)
        finally:
            books = jobs.stop()
        _assert_clean(jobs)
        assert len(g.alive()) == 3 and all(g.alive())
        assert len(g._procs) == 3  # the finalizer stops exactly the running servers
        check_all(g.spec, "grow", np.concatenate([base, books.acked_keys()]))
        # The grid's own handle (and one unpickled from it) now name the three servers that remain.
        assert repr(g).startswith(f"LocalGrid({g.servers!r}")
        import pickle

        assert pickle.loads(pickle.dumps(g)).servers == g.servers


def test_a_restarted_server_repairs_then_another_may_die() -> None:
    with ramgrid.local(servers=3, memory="64MiB") as g:
        t = g.create_table("repair", partitions=16, replication=2, value_type="i64")
        base = load(t, BASE_KEYS)
        jobs = Jobs(g.spec, "repair", BASE_KEYS).start()
        try:
            time.sleep(0.5)
            g.restart(1)
            # Poll the servers' own status until nothing is pending: then server 1 holds its partitions again.
            deadline = time.monotonic() + 30
            while True:
                st = g.status()
                if (
                    all(s["ok"] and s["pending_partitions"] == 0 and s["catalog_learned"] == 1 for s in st)
                    and len({s["epoch"] for s in st}) == 1
                ):
                    break
                assert time.monotonic() < deadline, st
                time.sleep(0.05)
            assert st[1]["copied_partitions"] > 0, st[1]  # the new process copied its partitions in
            time.sleep(0.5)
        finally:
            books = jobs.stop()
        _assert_clean(jobs)
        everything = np.concatenate([base, books.acked_keys()])
        # With server 2 gone, partitions replicated on (1, 2) are served by the repaired server 1 alone.
        g.kill(2)
        check_all(g.spec, "repair", everything)


def test_a_joining_server_killed_mid_copy_restarts_and_the_move_completes() -> None:
    """SIGKILL of the server being added while it copies its partitions in: the move does not complete without it
    (old holders keep serving exact reads), its restart (`--join`, empty) learns the move's spec and copies every
    partition again, the move then completes, every key of both versions reads exactly, and a second move (taking
    it out again) is not blocked by the first."""
    with ramgrid.local(servers=3, memory="512MiB") as g:
        t = g.create_table("mid", partitions=32, replication=2, value_type="bytes")
        keys = np.arange(30_000, dtype=np.int64)
        head = [b"h%d-" % k + b"x" * 1000 for k in keys.tolist()]
        for at in range(0, len(keys), 5_000):
            t.put_many(keys[at : at + 5_000], head[at : at + 5_000])
        with t.new_version() as v:
            for at in range(0, len(keys), 5_000):
                v.put_many(keys[at : at + 5_000], [b"s%d" % k for k in keys[at : at + 5_000].tolist()])
        sealed = [b"s%d" % k for k in keys.tolist()]
        outcome: dict[str, object] = {}

        def add() -> None:
            try:
                outcome["added"] = g.add_server()
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                outcome["error"] = e

        th = threading.Thread(target=add)
        th.start()
        deadline = time.monotonic() + 30
        while len(g.alive()) < 4 or "repair: copied" not in g.server_stderr(3):
            assert th.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.002)
        before_kill = g.server_stderr(3).count("repair: copied")
        g.kill(3)  # mid-copy: at least one partition in, the move not complete
        assert th.is_alive(), "the move completed before the kill; the test needs more data"
        assert t.pin(1).get_many(keys) == head  # the old holders serve every read meanwhile
        g.restart(3)
        th.join(timeout=40)
        assert not th.is_alive() and "error" not in outcome, outcome
        g.wait_repaired()
        st = g.status()
        assert len(st) == 4 and st[3]["copied_partitions"] > 0, st
        # It restarted empty and copied every partition again: the kill came before the last copy.
        assert before_kill < st[3]["copied_partitions"], (before_kill, st[3])
        assert t.get_many(keys) == sealed and t.pin(1).get_many(keys) == head
        # No move is left in progress: the next one runs.
        g.remove_server(3)
        assert len(g.servers) == 3
        assert t.get_many(keys) == sealed and t.pin(1).get_many(keys) == head


PKG_ROOT = str(Path(ramgrid.__file__).resolve().parents[1])


def _rg(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "ramgrid.cli", *args], env=env, capture_output=True, text=True, timeout=40, check=False
    )
    assert out.returncode == 0, f"ramgrid {' '.join(args)}: rc={out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def test_cli_cluster_add_status_remove(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["RAMGRID_STATE_DIR"] = str(tmp_path / "state")
    env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    up = _rg(env, "cluster", "up", "-n", "3", "--memory", "32MiB")
    extra = []
    try:
        members = up.stdout.split("export RAMGRID_SPEC=")[1].split()[0]
        _rg(env, "table", "create", "t", "--type", "i64", "--replication", "2", "--partitions", "8")
        for k in (0, 7, 14):
            _rg(env, "put", "t", str(k), str(k * 5), "--int-keys")
        extra = start_servers(1, memory="32MiB", log_dir=tmp_path, extra_args=["--join", members])
        new = str(extra[0].address)
        added = _rg(env, "cluster", "add", new)
        assert f"added {new}" in added.stdout and f"servers: {members},{new}" in added.stdout
        status = _rg(env, "cluster", "status")
        lines = [ln for ln in status.stdout.splitlines() if "\tepoch " in ln]
        assert len(lines) == 4 and lines[-1].startswith(new), status.stdout
        assert all("pending partitions 0" in ln for ln in lines), status.stdout
        assert status.stdout.count("\tup") == 3  # the pid lines of `cluster up` stay
        removed = _rg(env, "cluster", "remove", new)
        assert f"removed {new}" in removed.stdout and f"servers: {members}\n" in removed.stdout
        got = _rg(env, "get", "t", "0", "7", "14", "--int-keys")
        assert got.stdout.split() == ["0", "0", "7", "35", "14", "70"]
        # `cluster replace DEAD NEW`: here a live member retired, its partitions moved to the new server in its place.
        first = members.split(",")[0]
        (tmp_path / "r").mkdir()
        extra += start_servers(1, memory="32MiB", log_dir=tmp_path / "r", extra_args=["--join", members])
        repl = str(extra[-1].address)
        replaced = _rg(env, "cluster", "replace", first, repl)
        assert f"replaced by {repl} {first}" in replaced.stdout, replaced.stdout
        assert f"servers: {','.join([repl, *members.split(',')[1:]])}\n" in replaced.stdout, replaced.stdout
        got = _rg(env, "get", "t", "0", "7", "14", "--int-keys")
        assert got.stdout.split() == ["0", "0", "7", "35", "14", "70"]
    finally:
        stop_processes([sp.proc for sp in extra])
        _rg(env, "cluster", "down")


def test_the_grow_cluster_example_runs() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "grow_cluster.py"
    r = subprocess.run(
        [sys.executable, str(example), "--keys", "50000"], capture_output=True, text=True, timeout=50, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "now 4 servers" in r.stdout and "every value exact" in r.stdout
