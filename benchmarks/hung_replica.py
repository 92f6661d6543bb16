"""Read latency while one of three replicas hangs (SIGSTOP), beside the same loop with every server running.

A local grid of three servers holds a table with replication 2. One Python thread runs `get_many` batches in a loop
for a fixed time, first with every server running (the peer row), then with one server stopped by SIGSTOP: its
sockets stay open and the kernel still accepts connections, but nothing answers, like a hung machine. Every batch is
checked value by value. It prints per-call latency p50/p99/max, the calls over 1 s, and the time spent in calls over
100 ms. This is a benchmark, not a test: it asserts nothing about speed (it does stop if a value comes back wrong).

    python benchmarks/hung_replica.py
    python benchmarks/hung_replica.py --seconds 8 --out benchmarks/results/hung_replica.txt
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import ramgrid

ROOT = Path(__file__).resolve().parents[1]


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (state T in /proc): kill() returns before they all are."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for t in tasks:
        try:
            state = (t / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state != "T":
            return False
    return True


def run_loop(table: ramgrid.Table, keys: np.ndarray, expect: np.ndarray, seconds: float, batch: int) -> list[float]:
    """get_many of `batch` keys (a different slice each call) for `seconds`; returns each call's latency in s."""
    times: list[float] = []
    rng = np.random.default_rng(7)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = int(rng.integers(0, len(keys) - batch))
        t0 = time.perf_counter()
        got = table.get_many(keys[start : start + batch])
        times.append(time.perf_counter() - t0)
        if not np.array_equal(got, expect[start : start + batch]):
            raise SystemExit(f"wrong values in the batch at {start}")
    return times


def row(name: str, times: list[float]) -> str:
    t = np.array(times)
    p50, p99 = np.percentile(t, [50, 99])
    slow = int((t > 1.0).sum())
    stalled = float(t[t > 0.1].sum())
    return (
        f"{name:<22} {len(t):>7,} {p50 * 1e3:>9.3f} {p99 * 1e3:>9.3f} {t.max() * 1e3:>10.1f} {slow:>8} {stalled:>11.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each loop (default 8)")
    ap.add_argument("--keys", type=int, default=100_000, help="keys in the table (default 100k)")
    ap.add_argument("--batch", type=int, default=1000, help="keys per get_many (default 1000)")
    ap.add_argument("--timeout", type=float, default=5.0, help="the client's request timeout in s (default 5)")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()

    lines: list[str] = []

    def emit(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    emit("# python " + shlex.join(["benchmarks/hung_replica.py", *sys.argv[1:]]))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    emit(f"# {now}; commit {commit}; {platform.node()}; {os.cpu_count()} CPUs; Python {platform.python_version()}")
    emit(
        f"# 3 local servers (1 thread each), table of {args.keys:,} int64 keys -> f64, replication 2; one Python "
        f"thread, get_many of {args.batch} keys per call, {args.seconds:g} s per row; request timeout {args.timeout:g} s"
    )
    emit("# stopped: one server SIGSTOPped for the whole row (sockets open, no answers); every value checked")
    emit(f"{'row':<22} {'calls':>7} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>10} {'over 1 s':>8} {'s in >100ms':>11}")
    emit("-" * 82)

    with ramgrid.local(servers=3, memory="256MiB", timeout=args.timeout) as g:
        t = g.create_table("hung", partitions=48, replication=2, value_type="f64")
        keys = np.arange(args.keys, dtype=np.int64)
        vals = keys * 0.5
        t.put_many(keys, vals)
        run_loop(t, keys, vals, 1.0, args.batch)  # warm-up: connections and latency samples
        emit(row("all servers running", run_loop(t, keys, vals, args.seconds, args.batch)))
        victim = g.pids[1]
        os.kill(victim, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5
            while not all_threads_stopped(victim) and time.monotonic() < deadline:
                time.sleep(0.001)
            emit(row("1 of 3 stopped", run_loop(t, keys, vals, args.seconds, args.batch)))
        finally:
            os.kill(victim, signal.SIGCONT)
        emit(row("resumed", run_loop(t, keys, vals, args.seconds, args.batch)))

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
