"""Jepsen-style histories: client processes write and read a few keys of a 3-server grid while a nemesis pauses,
kills and restarts servers; every operation is recorded with its invoke and return times and its outcome, and
Porcupine (tools/porcupine, a small Go program) judges whether the history is linearizable, key by key.

    python -m ramgrid.testing.jepsen --seconds 20 --clients 5 --nemesis pause,kill,restart --model register --out DIR

What is recorded (docs/jepsen.md has the format and how to read the verdict):

- Each client process does at most `ops_per_client` single-key operations, at most `rate` a second, until its
  deadline: `put_many` of one key with a value no other operation writes (model "register"), or
  `put_many(merge="add")` of a delta (model "counter"), or a version switch (model "switch": each key has a table
  of its own; a write makes a new version holding the key with the version's number as its value and commits it,
  so the register's value is the version current), or `lookup` of one key (an unpinned read of the current
  version). Times are `time.monotonic_ns()`
  (CLOCK_MONOTONIC, one clock for every process of the host).
- An operation's status is `ok` (it returned), `fail` (it definitely did nothing) or `info` (indeterminate: a
  timeout, a broken connection, a partial acknowledgement). The client gives no definite refusal for a write that
  reached the servers (a replica that refused may be the only one: others may have stored it, rule 8 in
  docs/client.md), so only a write refused before anything was sent counts as `fail`; every other error is
  `info`. After an `info` the client goes on as a new process id (Jepsen's rule: the old one may still be
  acting), so one process never has two operations open.
- The nemesis does one fault at a time, and after each waits (bounded) until every server is back in the spec
  with nothing left to copy: replication 2 survives one lost replica, not two.

At the end the harness reads every key from each of its replicas separately (a raw GET to that server alone,
`ramgrid._wire`) and reports whether they agree. It reports; the tests (python/tests/integration/test_jepsen.py)
assert.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["JepsenConfig", "JepsenResult", "checker_binary", "main", "run_checker", "run_jepsen"]

NEMESES = ("pause", "kill", "restart")
MODELS = {"register": "put", "counter": "add", "switch": "switch"}
# The checker's model for each: a switch writes a register whose value is the version made current.
CHECKER_MODELS = {"register": "register", "counter": "counter", "switch": "register"}
REPO_ROOT = Path(__file__).resolve().parents[3]
TABLE = "jepsen"
PARTITIONS = 8


@dataclass
class JepsenConfig:
    """One run. Every loop is bounded by a count and by `seconds`."""

    out: Path
    seconds: float = 20.0
    clients: int = 5
    keys: int = 3
    model: str = "register"
    nemesis: tuple[str, ...] = ()
    seed: int = 0
    ops_per_client: int = 20_000
    # Operations a second per client at most (0: back to back). Back to back, 3 clients do about 10,000 a second on
    # a 2-core machine; a rate keeps a long run's history small enough to check quickly.
    rate: float = 200.0
    # Servers fail a member over after this; 4 s as in the chaos test, so that the lease (3 s) outlasts a
    # re-election (about 2.6 s) and a paused leader does not make the others refuse (ARCHITECTURE, lease).
    failure_timeout_ms: int = 4000
    nemesis_events: int = 20
    data_dir: Path | None = None
    request_timeout: float = 1.0
    call_timeout: float = 4.0
    check_timeout: float = 60.0
    shrink_timeout: float = 30.0

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.model not in MODELS:
            raise ValueError(f"model is one of {sorted(MODELS)}, got {self.model!r}")
        bad = [n for n in self.nemesis if n not in NEMESES]
        if bad:
            raise ValueError(f"unknown nemesis {bad}: choose from {', '.join(NEMESES)}")
        if self.clients < 1 or self.keys < 1 or self.seconds <= 0:
            raise ValueError("clients, keys and seconds must be positive")
        if self.data_dir is not None:
            if self.model == "counter":
                # The data directory makes the table a log one, and log tables refuse merges (protocol-native 7.3).
                raise ValueError("the counter model needs merges, which log tables refuse: run it without a data dir")
            self.data_dir = Path(self.data_dir)
            if self.data_dir.exists() and any(self.data_dir.iterdir()):
                # A table left by an earlier run would be loaded: the keys would not start missing.
                raise ValueError(f"the data directory {self.data_dir} must be empty or absent")


@dataclass
class JepsenResult:
    """What a run found: `verdict` is the checker's JSON (verdict ok / illegal / unknown, illegal_keys, ...)."""

    history: Path
    verdict: dict[str, Any]
    ops: dict[str, int]
    nemesis: list[dict[str, Any]]
    convergence: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def linearizable(self) -> bool:
        return self.verdict.get("verdict") == "ok"

    @property
    def converged(self) -> bool:
        return bool(self.convergence.get("agree")) and not self.convergence.get("disagree")


# -- the checker ---------------------------------------------------------------------------------------------------


def checker_binary(build_dir: Path | None = None) -> Path:
    """The Go checker, built from tools/porcupine into target/porcupine/ when missing or older than its sources.
    Raises RuntimeError when `go` or the sources are missing."""
    src = Path(os.environ.get("RAMGRID_PORCUPINE_SRC", REPO_ROOT / "tools" / "porcupine"))
    if not (src / "go.mod").is_file():
        raise RuntimeError(f"the history checker's sources are not at {src} (set RAMGRID_PORCUPINE_SRC)")
    out_dir = build_dir or REPO_ROOT / "target" / "porcupine"
    binary = out_dir / "porcupine"
    sources = [p for p in src.iterdir() if p.name in ("go.mod", "go.sum") or p.suffix == ".go"]
    newest = max(p.stat().st_mtime for p in sources)
    if binary.is_file() and binary.stat().st_mtime >= newest:
        return binary
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "the history checker (tools/porcupine) is a Go program and `go` is not on PATH: install Go 1.21 or "
            "later (https://go.dev/dl/); it fetches github.com/anishathalye/porcupine through the Go module proxy"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".porcupine.{os.getpid()}"
    done = subprocess.run(
        [go, "build", "-o", str(tmp), "."], cwd=src, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"`go build` of {src} failed:\n{done.stderr.strip()}")
    os.replace(tmp, binary)  # atomic: a concurrent run sees the old binary or the new one, never half of one
    return binary


def run_checker(
    history: Path,
    model: str,
    out: Path,
    *,
    timeout: float = 60.0,
    shrink_timeout: float = 30.0,
) -> dict[str, Any]:
    """Runs the checker on `history`; returns its verdict (plus "exit"). A violation leaves `out`/violation.html
    (Porcupine's visualisation) and `out`/witness.jsonl (the first illegal key's ops, shrunk). RuntimeError when
    the checker itself fails (exit 2: a bad history, a bad flag)."""
    binary = checker_binary()
    for stale in ("violation.html", "witness.jsonl"):  # an earlier run's, which this verdict would not explain
        (out / stale).unlink(missing_ok=True)
    cmd = [str(binary), "-model", model, "-timeout", f"{timeout:g}s", "-shrink-timeout", f"{shrink_timeout:g}s"]
    cmd += ["-html", str(out / "violation.html"), "-witness", str(out / "witness.jsonl"), str(history)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * 2 + shrink_timeout + 60, check=False)
    lines = done.stdout.strip().splitlines()
    try:
        verdict: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"the checker said nothing usable (exit {done.returncode}): {done.stderr.strip()}") from None
    if done.returncode not in (0, 1, 3):
        raise RuntimeError(f"the checker failed (exit {done.returncode}): {verdict.get('error')} {done.stderr}")
    verdict["exit"] = done.returncode
    return verdict


# -- client processes ----------------------------------------------------------------------------------------------


def _client_main(args: dict[str, Any], ready: Any, go: Any) -> None:
    """One client process: says it is ready, waits for the go, then does random single-key operations until its deadline or
    its count, appending each finished one to its own history file (flushed, so a crash loses nothing done)."""
    import numpy as np

    import ramgrid
    from ramgrid.exceptions import RamgridError, ValueOutOfRange

    grid = ramgrid.connect(
        args["servers"],
        timeout=args["request_timeout"],
        call_timeout=args["call_timeout"],
        connect_timeout=0.5,
        ack="all",
    )
    table = grid.table(TABLE)
    rng = random.Random(args["seed"])
    keys: list[str] = args["keys"]
    cid, nclients, write = int(args["client"]), int(args["clients"]), MODELS[args["model"]]
    tables = {k: grid.table(table_of(args["model"], k)) for k in keys}
    process = cid
    grid.status()  # connects before the start, so the first operation's time is not the connection's
    ready.put(cid)
    if not go.wait(timeout=120):
        raise RuntimeError("no go from the harness within 120 s")
    slot = time.monotonic_ns()
    deadline = slot + int(args["seconds"] * 1e9)
    gap = int(1e9 / args["rate"]) if args["rate"] > 0 else 0
    with open(args["path"], "w") as f:
        for seq in range(int(args["ops"])):
            if gap:  # the op's slot, jittered so that clients do not move in step; no catching up after a stall
                slot = max(slot + gap, time.monotonic_ns() - gap)
                wait = slot + rng.randrange(gap) - time.monotonic_ns()
                if wait > 0:
                    time.sleep(wait / 1e9)
            if time.monotonic_ns() >= deadline:
                break
            key = rng.choice(keys)
            rec: dict[str, Any] = {"process": process, "client": cid, "key": key, "value": None, "output": None}
            status, err = "ok", None
            if rng.random() < 0.5:
                rec["f"] = "get"
                rec["call"] = time.monotonic_ns()
                try:
                    values, found = tables[key].lookup([key])
                    rec["return"] = time.monotonic_ns()
                    rec["output"] = int(values[0]) if bool(found[0]) else None
                except RamgridError as e:
                    # A read changes nothing: the checker drops it whatever its status; info is the honest one.
                    rec["return"], status, err = None, "info", f"{type(e).__name__}: {e}"
            elif write == "switch":
                rec["f"] = "put"
                rec["call"] = time.monotonic_ns()
                status, err = _switch(tables[key], key, rec, seq)
            else:
                # Unique per operation: client id in the high digits, so a read names the write it saw.
                value = cid * 1_000_000_000 + seq + 1 if write == "put" else rng.randint(1, 9)
                rec["f"], rec["value"] = write, value
                rec["call"] = time.monotonic_ns()
                try:
                    merge = "store" if write == "put" else "add"
                    table.put_many([key], np.array([value], dtype=np.int64), merge=merge)
                    rec["return"] = time.monotonic_ns()
                except ValueOutOfRange as e:
                    rec["return"], status, err = time.monotonic_ns(), "fail", f"{type(e).__name__}: {e}"
                except RamgridError as e:
                    rec["return"], status, err = None, "info", f"{type(e).__name__}: {e}"
            rec["status"] = status
            if err is not None:
                rec["error"] = err[:300]
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if status == "info":
                process += nclients
                # Back off: during a fault every write fails until the fail-over, and each indeterminate write
                # stays open to the end of the history, which the checker pays for (docs/jepsen.md).
                time.sleep(min(rng.uniform(0.1, 0.5), max(0.0, (deadline - time.monotonic_ns()) / 1e9)))
    grid.close()


def table_of(model: str, key: str) -> str:
    """The table `key` lives in: one shared table, or one per key for version switches."""
    return f"{TABLE}-{key}" if model == "switch" else TABLE


def _switch(table: Any, key: str, rec: dict[str, Any], seq: int) -> tuple[str, str | None]:
    """One version switch of `table`: a new version holding `key` = the version's number, committed. Returns (status,
    error): `fail` when it failed before the commit (no version was made current), `info` when the commit failed
    (it may have switched some servers' view). Every 20th switch drops versions well behind, so that a long run
    does not pile them up; a drop that fails (the version is in use, a server is away) is left for later."""
    import numpy as np

    from ramgrid.exceptions import RamgridError

    try:
        w = table.new_version().begin()
    except RamgridError as e:
        # No version number yet; the checker drops a failed op, but reads its value (no version is ever 0).
        rec["return"], rec["value"] = time.monotonic_ns(), 0
        return "fail", f"{type(e).__name__}: {e}"
    rec["value"] = w.version
    try:
        w.put_many([key], np.array([w.version], dtype=np.int64))
    except RamgridError as e:
        rec["return"] = time.monotonic_ns()
        with contextlib.suppress(RamgridError):
            w.abort()
        return "fail", f"{type(e).__name__}: {e}"
    try:
        w.commit()
        rec["return"] = time.monotonic_ns()
    except (RamgridError, ValueError) as e:
        rec["return"] = None
        return "info", f"{type(e).__name__}: {e}"
    if seq % 20 == 0:
        with contextlib.suppress(RamgridError):
            for v in table.versions():
                if v["version"] < w.version - 20:  # (the current one is refused: it stays)
                    table.drop_version(v["version"])
    return "ok", None


# -- the nemesis ---------------------------------------------------------------------------------------------------


class Nemesis(threading.Thread):
    """One fault at a time, at random, until `deadline` or `limit` faults: `pause` (SIGSTOP, then SIGCONT after a
    hold shorter or longer than the failure timeout), `kill` (SIGKILL, down for a while, then `restart`) and
    `restart` (SIGKILL and start again at once). After each fault it waits (bounded) until the cluster is whole.
    Every fault is recorded with its start and end times; `stop()` ends the current hold early."""

    def __init__(
        self, grid: Any, kinds: Sequence[str], seed: int, deadline: float, limit: int, failure_timeout: float
    ) -> None:
        super().__init__(name="jepsen-nemesis", daemon=True)
        self.grid, self.kinds, self.rng = grid, list(kinds), random.Random(seed)
        self.deadline, self.limit, self.failure_timeout = deadline, limit, failure_timeout
        self.events: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _hold(self, seconds: float) -> None:
        self._halt.wait(max(0.0, min(seconds, self._left())))

    def run(self) -> None:
        try:
            while len(self.events) < self.limit and not self._halt.is_set():
                self._hold(self.rng.uniform(0.5, 2.0))
                if self._halt.is_set() or self._left() < 1.0:
                    break
                kind = self.rng.choice(self.kinds)
                i = self.rng.randrange(len(self.grid.pids))
                getattr(self, f"_{kind}")(i)
                if not self._wait_whole():
                    break
        except Exception as e:  # noqa: BLE001 - reported by the harness, never lost in a thread
            self.error = e
        finally:
            self.resume_all()

    def resume_all(self) -> None:
        for pid in self.grid.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _record(self, kind: str, i: int, start: int, detail: str) -> None:
        event = {"f": "nemesis", "nemesis": kind, "server": i, "call": start, "return": time.monotonic_ns()}
        self.events.append(event | {"status": "ok", "detail": detail, "process": -1, "key": ""})

    def _duration(self) -> float:
        """Shorter than the failure timeout (no fail-over) or longer (a fail-over, then a rejoin), evenly. Longer
        by 1 to 3.5 s: a paused leader is failed over only after a new one is elected (up to about 2.6 s)."""
        ft = self.failure_timeout
        return self.rng.uniform(0.2, 0.6) * ft if self.rng.random() < 0.5 else ft + self.rng.uniform(1.0, 3.5)

    def _pause(self, i: int) -> None:
        pid, hold = self.grid.pids[i], self._duration()
        start = time.monotonic_ns()
        os.kill(pid, signal.SIGSTOP)
        try:
            self._hold(hold)
        finally:
            os.kill(pid, signal.SIGCONT)
        self._record("pause", i, start, f"pause server {i} ({hold:.1f} s planned)")

    def _kill(self, i: int) -> None:
        down = self._duration()
        start = time.monotonic_ns()
        self.grid.kill(i)
        try:
            self._hold(down)
        finally:
            self.grid.restart(i)
        self._record("kill", i, start, f"kill server {i}, restart after {down:.1f} s planned")

    def _restart(self, i: int) -> None:
        start = time.monotonic_ns()
        self.grid.restart(i)
        self._record("restart", i, start, f"restart server {i}")

    def _wait_whole(self) -> bool:
        """Until every server is in the spec and nothing is pending (True), or the run's time is up (False). The
        wait is noted on the fault's event: `whole_after_ms`, or `not_whole` when the time ran out."""
        start = time.monotonic()
        ok = wait_whole(self.grid, max(0.0, self._left()))
        event = self.events[-1]
        if ok:
            event["whole_after_ms"] = round((time.monotonic() - start) * 1000)
        else:
            event["not_whole"] = True
            event["detail"] += "; the cluster was not whole again by the end of the run"
        return ok


def not_whole_why(grid: Any) -> str:
    """What `wait_whole` found missing, per server: for the run's notes."""
    from ramgrid.exceptions import RamgridError

    try:
        st = grid.status()
    except RamgridError as e:
        return f"status failed: {e}"
    want = set(grid.addresses)
    why = []
    for s in st:
        missing = []
        if not s.get("ok"):
            missing.append(f"no answer ({s.get('error')})")
        else:
            servers = set(str(s.get("servers", "")).split(","))
            if servers != want:
                missing.append(f"spec lacks {sorted(want - servers)}")
            if s.get("pending_partitions") != 0:
                missing.append(f"{s.get('pending_partitions')} partitions to copy ({s.get('last_error')})")
            if s.get("catalog_learned") != 1:
                missing.append("tables not learned")
            if s.get("quorum") != "ok":
                missing.append(f"quorum {s.get('quorum')}")
        if missing:
            why.append(f"{s.get('server')}: {', '.join(missing)}")
    return "; ".join(why) or "whole now"


def keep_server_logs(grid: Any, to: Path) -> None:
    """Copies each server's stdout and stderr under `to` (server logs outlive the grid's own folder), with every
    server's status at the end in `status.json`."""
    from ramgrid.exceptions import RamgridError

    to.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(RamgridError):
        (to / "status.json").write_text(json.dumps(grid.status(), indent=1, default=str) + "\n")
    for i, sp in enumerate(getattr(grid, "_servers", [])):
        for path in (sp.stdout_path, sp.stderr_path):
            with contextlib.suppress(OSError):
                shutil.copyfile(path, to / f"server{i}{path.suffix}")


def wait_whole(grid: Any, timeout: float) -> bool:
    """Whether, within `timeout`, every server answers with every address in its spec, has learned the tables, has
    nothing left to copy in and serves (its lease holds: a server resumed after a pause refuses with NO_QUORUM
    until it has caught up)."""
    from ramgrid.exceptions import RamgridError

    deadline = time.monotonic() + timeout
    want = set(grid.addresses)
    while True:
        try:
            st = grid.status()
        except RamgridError:
            st = []
        if st and all(
            s.get("ok")
            and set(str(s.get("servers", "")).split(",")) == want
            and s.get("pending_partitions") == 0
            and s.get("catalog_learned") == 1
            and s.get("quorum") == "ok"
            for s in st
        ):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# -- reading each replica ------------------------------------------------------------------------------------------


def _recv_frame(s: socket.socket) -> dict[str, Any]:
    from ramgrid import _wire

    buf = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
        try:
            _, _, _, fields = _wire.decode_message(buf)
            return fields
        except _wire.WireError as e:
            if e.code != "incomplete":
                raise


def replica_get(
    address: str, key: str, partition: int, token: str | None = None, timeout: float = 2.0, table: str = TABLE
) -> Any:
    """What server `address` alone holds for `key` of the table: an int, None (missing), or a string naming what
    it answered instead (REPAIRING, NOT_OWNER, an error). A raw GET (docs/protocol-native.md), so no client
    failover or replica choice stands between the question and that server."""
    from ramgrid import _wire

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            hello = {"protocol_version": 1, "token_hex": (token or "").encode().hex(), "client_name": "jepsen"}
            s.sendall(_wire.encode_message("HELLO", 1, hello))
            reply = _recv_frame(s)
            if reply["status"] != "OK":
                return f"HELLO {reply['status']}"
            group = {"partition": partition, "keys_hex": [key.encode().hex()]}
            get = {"table": table, "version": 0, "epoch": int(reply["epoch"]), "incarnation": 0, "groups": [group]}
            s.sendall(_wire.encode_message("GET", 2, get))
            reply = _recv_frame(s)
    except (OSError, _wire.WireError) as e:
        return f"error: {type(e).__name__}: {e}"
    if reply["status"] != "OK":
        return f"{reply['status']} {reply.get('message', '')}".strip()
    if reply["statuses"][0] == "NOT_FOUND":
        return None
    if reply["statuses"][0] != "OK":
        return f"key {reply['statuses'][0]}"
    return int(reply["values"][0])


_TRANSIENT = ("NO_QUORUM", "REPAIRING", "WRONG_EPOCH", "error:")


def _settled_get(
    address: str, key: str, partition: int, token: str | None, patience: float = 10.0, table: str = TABLE
) -> Any:
    """`replica_get`, asked again for up to `patience` seconds while the answer is a refusal that passes (a server
    catching up, copying, on an older spec, or not accepting connections yet)."""
    deadline = time.monotonic() + patience
    while True:
        got = replica_get(address, key, partition, token, table=table)
        if not (isinstance(got, str) and got.startswith(_TRANSIENT)) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def convergence(grid: Any, keys: Sequence[str], model: str = "register") -> dict[str, Any]:
    """Each key read from each of its replicas alone: {"replicas": {key: {address: value}}, "agree": [keys],
    "disagree": [keys]}. A replica that answers anything but a value or a miss makes its key disagree."""
    from ramgrid import _native

    out: dict[str, Any] = {"replicas": {}, "agree": [], "disagree": []}
    for key in keys:
        name = table_of(model, key)
        table = grid.table(name)
        table.lookup([key])  # a read first, so the client routes by the spec the servers hold now
        owners = table.owners()
        p = _native.partition_of(key, PARTITIONS)
        seen = {addr: _settled_get(addr, key, p, grid.config.token, table=name) for addr in owners[p]}
        out["replicas"][key] = seen
        values = list(seen.values())
        same = all(not isinstance(v, str) for v in values) and all(v == values[0] for v in values)
        out["agree" if same else "disagree"].append(key)
    return out


# -- the run -------------------------------------------------------------------------------------------------------


def run_jepsen(cfg: JepsenConfig) -> JepsenResult:
    """Starts the grid, runs the clients and the nemesis, checks the history, reads every replica; returns what it
    found (and writes out/history.jsonl, out/summary.json, and on a violation violation.html and witness.jsonl)."""
    import ramgrid

    cfg.out.mkdir(parents=True, exist_ok=True)
    checker_binary()  # before the servers start: a missing Go fails at once
    started = time.monotonic()
    keys = [f"k{i}" for i in range(cfg.keys)]
    notes: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="ramgrid-jepsen-"))
    extra = ("--failure-timeout-ms", str(cfg.failure_timeout_ms))
    data_dir = None if cfg.data_dir is None else Path(cfg.data_dir)
    nemesis: Nemesis | None = None
    try:
        with ramgrid.local(servers=3, memory="64MiB", extra_args=extra, data_dir=data_dir) as grid:
            durability = "log" if data_dir is not None else "memory"
            for name in {table_of(cfg.model, k) for k in keys}:
                grid.create_table(name, partitions=PARTITIONS, replication=2, value_type="i64", durability=durability)
            ctx = multiprocessing.get_context("spawn")
            ready, go = ctx.Queue(), ctx.Event()
            procs = []
            for c in range(cfg.clients):
                args = {
                    "servers": list(grid.addresses),
                    "client": c,
                    "clients": cfg.clients,
                    "keys": keys,
                    "model": cfg.model,
                    "seed": cfg.seed * 1000 + c,
                    "ops": cfg.ops_per_client,
                    "rate": cfg.rate,
                    "seconds": cfg.seconds,
                    "path": str(work / f"client{c}.jsonl"),
                    "request_timeout": cfg.request_timeout,
                    "call_timeout": cfg.call_timeout,
                }
                p = ctx.Process(target=_client_main, args=(args, ready, go), name=f"jepsen-client-{c}")
                p.start()
                procs.append(p)
            try:
                _wait_ready(procs, ready, timeout=120)
                go.set()
                if cfg.nemesis:
                    nemesis = Nemesis(
                        grid,
                        cfg.nemesis,
                        cfg.seed,
                        time.monotonic() + cfg.seconds,
                        cfg.nemesis_events,
                        cfg.failure_timeout_ms / 1000,
                    )
                    nemesis.start()
                # A client's last call may take its whole call timeout, and connecting to a paused server more.
                join_by = time.monotonic() + cfg.seconds + cfg.call_timeout + 30
                for p in procs:
                    p.join(max(0.0, join_by - time.monotonic()))
            finally:
                if nemesis is not None:
                    nemesis.stop()
                    nemesis.join(60)
                    nemesis.resume_all()
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                        p.join(5)
            failed = [p.name for p in procs if p.exitcode != 0]
            if failed:
                codes = [p.exitcode for p in procs]
                raise RuntimeError(f"client processes failed or ran over: {failed} (exit codes {codes})")
            if nemesis is not None and nemesis.is_alive():
                raise RuntimeError("the nemesis did not finish within 60 s of being stopped")
            if nemesis is not None and nemesis.error is not None:
                raise RuntimeError(f"the nemesis failed: {nemesis.error!r}") from nemesis.error
            if not wait_whole(grid, 60.0):
                notes.append(
                    "the cluster was not whole 60 s after the run: replicas read as they were; " + not_whole_why(grid)
                )
            keep_server_logs(grid, cfg.out / "logs")
            conv = convergence(grid, keys, cfg.model)
        events = nemesis.events if nemesis is not None else []
        history = cfg.out / "history.jsonl"
        ops = _write_history(history, [work / f"client{c}.jsonl" for c in range(cfg.clients)], events)
        verdict = run_checker(
            history, CHECKER_MODELS[cfg.model], cfg.out, timeout=cfg.check_timeout, shrink_timeout=cfg.shrink_timeout
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = JepsenResult(history, verdict, ops, events, conv, time.monotonic() - started, notes)
    summary = asdict(result) | {"config": {k: str(v) for k, v in asdict(cfg).items()}}
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return result


def _wait_ready(procs: Sequence[Any], ready: Any, timeout: float) -> None:
    """Until every client process has connected; a client that died meanwhile fails the run at once."""
    import queue

    deadline = time.monotonic() + timeout
    waiting = len(procs)
    while waiting:
        dead = [p.name for p in procs if p.exitcode is not None]
        if dead:
            raise RuntimeError(f"client processes exited before the start: {dead}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{waiting} client processes not ready within {timeout:.0f} s")
        with contextlib.suppress(queue.Empty):
            ready.get(timeout=0.2)
            waiting -= 1


def _write_history(path: Path, parts: Sequence[Path], events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Every client's records and the nemesis events in one file, by call time; returns the records per status."""
    records = list(events)
    for part in parts:
        with open(part) as f:
            records += [json.loads(line) for line in f if line.strip()]
    records.sort(key=lambda r: r["call"])
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    counts = Counter(r["status"] for r in records if r["f"] != "nemesis")
    return {s: counts.get(s, 0) for s in ("ok", "fail", "info")}


def summary_text(cfg: JepsenConfig, r: JepsenResult) -> str:
    v = r.verdict
    kinds = Counter(e["nemesis"] for e in r.nemesis)
    kinds_text = ", ".join(f"{k} {n}" for k, n in kinds.items())
    lines = [
        (
            f"ramgrid jepsen: model {cfg.model}, {cfg.clients} clients, {cfg.keys} keys, {cfg.seconds:g} s, "
            f"nemesis {','.join(cfg.nemesis) or 'none'} ({r.seconds:.1f} s in all)"
        ),
        (
            f"ops: {r.ops['ok']} ok, {r.ops['fail']} failed, {r.ops['info']} indeterminate "
            f"({v.get('checked_ops')} checked, {v.get('dropped_reads')} reads without a value dropped)"
        ),
        f"nemesis: {sum(kinds.values())} faults" + (f" ({kinds_text})" if kinds else ""),
    ]
    verdict = f"verdict: {v.get('verdict')} over {v.get('keys')} keys in {v.get('elapsed_ms')} ms"
    if v.get("illegal_keys"):
        verdict += f"; illegal keys {', '.join(v['illegal_keys'])}"
    if v.get("unknown_keys"):
        verdict += f"; unknown (timed out) keys {', '.join(v['unknown_keys'])}"
    lines.append(verdict)
    if v.get("visualization"):
        lines.append(f"  visualisation: {v['visualization']}")
    if v.get("witness"):
        lines.append(
            f"  witness: {v['witness']} ({v['witness_ops']} of key {v['witness_key']}'s {v['witness_from']} ops)"
        )
    c = r.convergence
    line = f"convergence: replicas agree on {len(c['agree'])} of {len(c['agree']) + len(c['disagree'])} keys"
    lines.append(line)
    for k in c["disagree"]:
        lines.append(f"  {k}: " + ", ".join(f"{a}={val}" for a, val in c["replicas"][k].items()))
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"history: {r.history}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ramgrid.testing.jepsen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the clients run (default 20)")
    ap.add_argument("--clients", type=int, default=5, help="client processes (default 5)")
    ap.add_argument("--keys", type=int, default=3, help="keys they share (default 3)")
    ap.add_argument("--nemesis", default="", help=f"comma-separated faults among {','.join(NEMESES)} (default none)")
    ap.add_argument("--model", choices=sorted(MODELS), default="register")
    ap.add_argument("--out", type=Path, required=True, help="directory for the history, verdict and witness")
    ap.add_argument("--data-dir", type=Path, default=None, help="servers keep their data here (a log table)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops-per-client", type=int, default=20_000, help="a bound besides the time (default 20000)")
    ap.add_argument("--rate", type=float, default=200.0, help="ops a second per client at most, 0: no limit (200)")
    ap.add_argument("--failure-timeout-ms", type=int, default=4000)
    ap.add_argument("--check-timeout", type=float, default=60.0, help="seconds for the checker (then: unknown)")
    ap.add_argument("--shrink-timeout", type=float, default=30.0, help="seconds for shrinking a violation (30)")
    a = ap.parse_args(argv)
    cfg = JepsenConfig(
        out=a.out,
        seconds=a.seconds,
        clients=a.clients,
        keys=a.keys,
        model=a.model,
        nemesis=tuple(n for n in a.nemesis.split(",") if n and n != "none"),
        seed=a.seed,
        ops_per_client=a.ops_per_client,
        rate=a.rate,
        failure_timeout_ms=a.failure_timeout_ms,
        data_dir=a.data_dir,
        check_timeout=a.check_timeout,
        shrink_timeout=a.shrink_timeout,
    )
    result = run_jepsen(cfg)
    print(summary_text(cfg, result))
    return int(result.verdict.get("exit", 2))


if __name__ == "__main__":
    sys.exit(main())
