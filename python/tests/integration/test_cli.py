"""The `ramgrid` command end to end: cluster up, status, table admin, put, get, stats, down (as subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid

pytestmark = pytest.mark.timeout(90)

PKG_ROOT = str(Path(ramgrid.__file__).resolve().parents[1])


def _env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["RAMGRID_STATE_DIR"] = str(state_dir)
    env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def rg(env: dict[str, str], cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "ramgrid.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if ok:
        assert out.returncode == 0, f"ramgrid {' '.join(args)}: rc={out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def test_cli_cluster_tables_keys(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = _env(state)
    up = rg(env, tmp_path, "cluster", "up", "-n", "2", "--memory", "32MiB")
    try:
        st = json.loads((state / "cluster.json").read_text())
        assert len(st["pids"]) == 2 and st["addresses"][0] in up.stdout
        assert "dashboard: http://127.0.0.1:" in up.stdout
        status = rg(env, tmp_path, "cluster", "status")
        assert status.stdout.count("\tup") == 2
        again = rg(env, tmp_path, "cluster", "up", ok=False)
        assert again.returncode == 2 and "already up" in again.stderr

        rg(env, tmp_path, "table", "create", "scores", "--type", "f64", "--partitions", "8")
        rg(env, tmp_path, "table", "create", "names", "--replication", "2")
        assert [ln.split("\t")[0] for ln in rg(env, tmp_path, "table", "list").stdout.splitlines()] == [
            "names",
            "scores",
        ]
        rg(env, tmp_path, "put", "scores", "42", "2.5", "--int-keys")
        rg(env, tmp_path, "put", "names", "alice", "Alice Liddell")
        assert rg(env, tmp_path, "get", "scores", "42", "--int-keys").stdout == "42\t2.5\n"
        got = rg(env, tmp_path, "get", "names", "alice", "bob", ok=False)
        assert got.returncode == 1 and got.stdout == "alice\tAlice Liddell\nbob\t(missing)\n"
        rg(env, tmp_path, "put", "scores", "43", "4.5", "--int-keys")
        st_lines = rg(env, tmp_path, "table", "stats", "scores").stdout.splitlines()
        assert st_lines[0].split("\t")[:3] == ["column", "count", "sum"]
        assert st_lines[1].split("\t")[:5] == ["0", "2", "7", "2.5", "4.5"], st_lines
        no_stats = rg(env, tmp_path, "table", "stats", "names", ok=False)
        assert no_stats.returncode == 2 and "bytes" in no_stats.stderr
        desc = json.loads(rg(env, tmp_path, "table", "describe", "scores").stdout)
        assert desc["value_type"] == "f64" and desc["partitions"] == 8
        bad = rg(env, tmp_path, "put", "scores", "1", "not-a-number", "--int-keys", ok=False)
        assert bad.returncode == 2 and "f64" in bad.stderr
        stats = json.loads(rg(env, tmp_path, "stats").stdout)
        assert len(stats) == 2
        # Per-table figures of each server (METRICS); summed over the servers they are the traffic above.
        scores = [s["tables"]["scores"] for s in stats]
        assert sum(t["puts"] for t in scores) == 2 and sum(t["items"] for t in scores) == 2
        assert sum(t["hits"] for t in scores) == 1 and sum(t["misses"] for t in scores) == 0
        names = [s["tables"]["names"] for s in stats]
        assert sum(t["puts"] for t in names) == 2  # replication 2: stored on both servers
        assert sum(t["hits"] for t in names) == 1 and sum(t["misses"] for t in names) == 1
        # The spec file written by `cluster up` works with --spec, and a flag beats the environment.
        spec_file = str(state / "cluster.spec")
        env2 = {**env, "RAMGRID_SPEC": "127.0.0.1:1"}
        assert "scores" in rg(env2, tmp_path, "--spec", spec_file, "table", "list").stdout
        rg(env, tmp_path, "table", "drop", "names")
        missing = rg(env, tmp_path, "get", "names", "alice", ok=False)
        assert missing.returncode == 1 and "TableNotFound" in missing.stderr
    finally:
        down = rg(env, tmp_path, "cluster", "down", ok=False)
    assert down.returncode == 0 and "stopped 2" in down.stdout
    assert not (state / "cluster.json").exists()
    assert rg(env, tmp_path, "cluster", "status", ok=False).returncode == 1
    for pid in st["pids"]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            assert stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"), f"server {pid} still running"
        except OSError:
            pass


def test_cli_serve_help_and_bad_flag(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = rg(env, tmp_path, "serve", "--no-such-flag", ok=False)
    assert out.returncode != 0 and "no-such-flag" in (out.stderr + out.stdout)
