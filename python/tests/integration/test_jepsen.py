"""Histories checked for linearizability (issue 25, item 5): client processes write and read the same few keys of a
3-server grid, Porcupine (tools/porcupine) judges the history key by key, and each key is read from each of its
replicas alone at the end (`ramgrid.testing.jepsen`, docs/jepsen.md).

The first short run has no nemesis, so whatever it finds is the write path's own doing (before each partition's
primary ordered its writes, replicas applied two concurrent writes of a key in different orders, and it found that
every time). The second pauses, kills and restarts servers while the clients run, in memory and with a data
directory; the long runs are in the slow tier (docs/replication.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from ramgrid.testing import jepsen

needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="the history checker is a Go program: no `go` on PATH")


def _report(r: jepsen.JepsenResult) -> str:
    v = r.verdict
    return (
        f"verdict {v['verdict']}, illegal keys {v['illegal_keys']}, ops {r.ops}, witness {v.get('witness')}, "
        f"convergence {r.convergence}"
    )


def _sane(r: jepsen.JepsenResult) -> None:
    """What the run itself must have done for its verdict to mean anything (pytest.fail: never an expected
    failure)."""
    if r.verdict["verdict"] == "unknown":
        pytest.fail(f"the checker ran out of time: {r.verdict}")
    if r.ops["ok"] < 50:
        pytest.fail(f"too few operations completed to judge anything: {r.ops}")


@needs_go
@pytest.mark.timeout(150)
def test_concurrent_writers_of_the_same_keys_are_linearizable(tmp_path: Path) -> None:
    # Back to back (rate 0): three clients on two keys overlap their writes all the time; bounded by count first
    # (3,000 ops each, about a second on an idle machine), by time on a busy one.
    cfg = jepsen.JepsenConfig(
        out=tmp_path, seconds=8.0, clients=3, keys=2, model="register", seed=1, rate=0, ops_per_client=3000
    )
    r = jepsen.run_jepsen(cfg)
    print(jepsen.summary_text(cfg, r))
    _sane(r)
    assert r.linearizable and r.converged, _report(r)


@needs_go
@pytest.mark.timeout(200)
@pytest.mark.parametrize("durable", [False, True], ids=["memory", "data-dir"])
def test_linearizable_under_a_short_nemesis(tmp_path: Path, durable: bool) -> None:
    cfg = jepsen.JepsenConfig(
        out=tmp_path / "out",
        seconds=12.0,
        clients=4,
        keys=2,
        nemesis=("pause", "kill", "restart"),
        seed=7,
        data_dir=tmp_path / "data" if durable else None,
    )
    r = jepsen.run_jepsen(cfg)
    print(jepsen.summary_text(cfg, r))
    _sane(r)
    if not r.nemesis:
        pytest.fail("the nemesis did nothing")
    assert r.linearizable and r.converged, _report(r)


@needs_go
@pytest.mark.timeout(200)
def test_version_switches_and_unpinned_reads_are_linearizable_under_restarts(tmp_path: Path) -> None:
    # Each write is a version switch (new version, commit); reads are unpinned. Once a switch returned, no read that
    # began later may return an older version from any server, a restarted one included (issue 25, item 3).
    cfg = jepsen.JepsenConfig(
        out=tmp_path / "out",
        seconds=12.0,
        clients=4,
        keys=2,
        model="switch",
        nemesis=("pause", "restart"),
        seed=3,
        rate=20,
    )
    r = jepsen.run_jepsen(cfg)
    print(jepsen.summary_text(cfg, r))
    _sane(r)
    if not r.nemesis:
        pytest.fail("the nemesis did nothing")
    writes = [json.loads(line) for line in r.history.read_text().splitlines()]
    assert sum(1 for w in writes if w.get("f") == "put" and w.get("status") == "ok") >= 5, r.ops
    assert r.linearizable and r.converged, _report(r)


@needs_go
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_linearizable_under_a_nemesis(tmp_path: Path) -> None:
    cfg = jepsen.JepsenConfig(
        out=tmp_path, seconds=30.0, clients=4, keys=3, nemesis=("pause", "kill", "restart"), seed=2
    )
    r = jepsen.run_jepsen(cfg)
    print(jepsen.summary_text(cfg, r))
    _sane(r)
    if not r.nemesis:
        pytest.fail("the nemesis did nothing")
    assert r.linearizable and r.converged, _report(r)


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _op(process: int, f: str, call: int, ret: int | None, value: int | None = None, output: int | None = None) -> Any:
    """A hand-made record of key "k"; no return time means indeterminate."""
    rec = {"process": process, "client": process, "key": "k", "f": f, "value": value, "output": output, "call": call}
    return rec | {"return": ret, "status": "ok" if ret is not None else "info"}


@needs_go
def test_checker_flags_a_stale_read_and_shrinks_it(tmp_path: Path) -> None:
    # Put 1 and put 2 are acknowledged one after the other; a read that begins after both sees 1: illegal. The
    # reads and writes around it are noise the witness must lose, and it must keep both puts (without them the
    # read would be illegal for another reason).
    history = [_op(9, "put", 0, 10, value=1), _op(9, "put", 20, 30, value=2), _op(1, "get", 40, 50, output=1)]
    history += [_op(2, "get", 60 + 20 * i, 70 + 20 * i, output=2) for i in range(20)]
    history += [_op(3, "put", 1000, None, value=3), _op(4, "get", 1010, 1020, output=3)]
    out = tmp_path / "out"
    out.mkdir()
    v = jepsen.run_checker(_write(tmp_path / "h.jsonl", history), "register", out)
    assert v["verdict"] == "illegal" and v["exit"] == 1 and v["illegal_keys"] == ["k"], v
    assert v["ops"] == {"ok": 24, "fail": 0, "info": 1}, v
    assert (out / "violation.html").stat().st_size > 0
    witness = [json.loads(line) for line in (out / "witness.jsonl").read_text().splitlines()]
    assert len(witness) == v["witness_ops"] == 3, witness
    assert {(w["f"], w["value"], w["output"]) for w in witness} == {
        ("put", 1, None),
        ("put", 2, None),
        ("get", None, 1),
    }

    # The same writes with the read seeing 2 is legal, and so is an indeterminate put seen late.
    history[2] = _op(1, "get", 40, 50, output=2)
    v = jepsen.run_checker(_write(tmp_path / "h2.jsonl", history), "register", out)
    assert v["verdict"] == "ok" and v["exit"] == 0, v


@needs_go
def test_checker_counter_model(tmp_path: Path) -> None:
    ok = [_op(0, "add", 0, 10, value=1), _op(1, "add", 5, None, value=2), _op(2, "get", 20, 30, output=1)]
    ok += [_op(2, "get", 40, 50, output=3)]
    v = jepsen.run_checker(_write(tmp_path / "ok.jsonl", ok), "counter", tmp_path)
    assert v["verdict"] == "ok", v
    # The indeterminate add seen, then unseen.
    bad = ok[:2] + [_op(2, "get", 20, 30, output=3), _op(2, "get", 40, 50, output=1)]
    v = jepsen.run_checker(_write(tmp_path / "bad.jsonl", bad), "counter", tmp_path)
    assert v["verdict"] == "illegal", v


@needs_go
def test_checker_refuses_a_malformed_history(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="unknown op"):
        jepsen.run_checker(_write(tmp_path / "bad.jsonl", [{"f": "frob", "call": 0}]), "register", tmp_path)
