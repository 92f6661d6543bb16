"""Many batches in flight from one Python thread: sequential `get_many` vs pipelined `get_many_batches` vs asyncio.

Same keys (int64 ids) and 8-byte values (float64) as `native_batch.py`, same run, for batches of 10 and 100:

- ramgrid sequential: `Table.get_many` in a loop (one round trip per batch: the "before");
- ramgrid pipelined: `Table.get_many_batches(batches, depth=D)` (up to D batches in flight per connection);
- ramgrid asyncio: C tasks on one event loop, each awaiting `get_many_async` in a loop (the client's I/O thread keeps
  up to 32 batches in flight);
- memcached: pymemcache `get_many` in a loop (one round trip per call; pymemcache has no pipelined batch path);
- ramgrid pinned: the same keys in a sealed version, pinned with `shared_memory=False` (TCP) and `True` (read in
  place from the servers' segments on this host), sequential and pipelined (with `--pinned`, on by default).

Each row reports keys/s (wall clock), server CPU per key (utime+stime of the server processes from /proc/PID/stat,
divided by keys served) and this process's CPU per key. A benchmark, not a test: it asserts nothing about speed.

    python benchmarks/pipelined_batches.py --out benchmarks/results/pipelined_batches.txt
    python benchmarks/pipelined_batches.py --quick     # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import shlex
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ramgrid
from native_batch import proc_cpu_seconds, start_memcached

Row = tuple[str, str, int, str, float, float | None, float]


def timed(
    run: Callable[[float], int], duration: float, pids: Sequence[int], batch: int
) -> tuple[float, float | None, float]:
    """Runs `run(deadline)` (it returns the batches it read); returns keys/s, server ns/key, client ns/key."""
    srv0 = proc_cpu_seconds(pids) if pids else 0.0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    n = run(t0 + duration)
    wall = time.perf_counter() - t0
    keys = n * batch
    srv = (proc_cpu_seconds(pids) - srv0) / keys * 1e9 if pids else None
    return keys / wall, srv, (time.process_time() - cpu0) / keys * 1e9


def sequential(get: Callable[[object], object], batches: list) -> Callable[[float], int]:
    def run(deadline: float) -> int:
        i = 0
        while i < 16 or (i & 15) or time.perf_counter() < deadline:
            get(batches[i % len(batches)])
            i += 1
        return i

    return run


def pipelined(t: ramgrid.Table | ramgrid.PinnedTable, batches: list, depth: int) -> Callable[[float], int]:
    def run(deadline: float) -> int:
        i = 0
        # 512 batches per pipeline, then check the clock (the source is consumed as results are taken).
        while i < 512 or time.perf_counter() < deadline:
            for _ in t.get_many_batches(itertools.islice(itertools.cycle(batches), i, i + 512), depth=depth):
                i += 1
        return i

    return run


def with_asyncio(t: ramgrid.Table, batches: list, tasks: int) -> Callable[[float], int]:
    def run(deadline: float) -> int:
        async def worker(k: int, counts: list[int]) -> None:
            i = k
            while counts[k] < 16 or time.perf_counter() < deadline:
                await t.get_many_async(batches[i % len(batches)])
                i += tasks
                counts[k] += 1

        async def main() -> int:
            counts = [0] * tasks
            await asyncio.gather(*(worker(k, counts) for k in range(tasks)))
            return sum(counts)

        return asyncio.run(main())

    return run


def run(args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    rng = np.random.default_rng(42)
    n = args.keys
    ids = np.unique(rng.integers(0, 2**62, size=int(n * 1.01)))[:n]
    rng.shuffle(ids)
    vals = rng.random(n)
    pools = {b: rng.integers(0, n, size=(max(64, 200_000 // b), b)) for b in args.batches}
    rows: list[Row] = []
    notes: list[str] = []

    mc_proc = None
    try:
        from pymemcache.client.base import Client as McClient

        mc_proc, port = start_memcached()
        mc = McClient(("127.0.0.1", port), connect_timeout=2, timeout=10, no_delay=True)
        skeys = [str(k) for k in ids.tolist()]
        packed = [struct.pack("<d", v) for v in vals.tolist()]
        for lo in range(0, n, 1000):
            mc.set_many(dict(zip(skeys[lo : lo + 1000], packed[lo : lo + 1000])), noreply=False)
        for b in args.batches:
            lists = [[skeys[i] for i in ix] for ix in pools[b]]
            r = timed(sequential(mc.get_many, lists), args.duration, [mc_proc.pid], b)
            rows.append(("memcached/pymemcache", "1", b, "sequential", *r))
            print(f"  memcached batch {b}: {r[0]:,.0f} keys/s", file=sys.stderr)
        mc.close()
    except (ImportError, FileNotFoundError, RuntimeError) as e:
        notes.append(f"memcached rows skipped: {e}")
    finally:
        if mc_proc is not None:
            mc_proc.terminate()
            mc_proc.wait()
            if mc_proc.stderr:
                mc_proc.stderr.close()

    for s in args.servers:
        replication = min(2, s)
        with ramgrid.local(servers=s, memory=f"{max(64, (n * 400) >> 20)}MiB", threads=1) as grid:
            t = grid.create_table("bench", partitions=64, replication=replication, value_type="f64")
            for lo in range(0, n, 100_000):
                t.put_many(ids[lo : lo + 100_000], vals[lo : lo + 100_000])
            servers = f"{s} (R={replication})"
            for b in args.batches:
                arrays = [np.ascontiguousarray(ids[ix]) for ix in pools[b]]
                # Exactness before speed: every mode returns the stored values.
                want = [vals[ix] for ix in pools[b][:64]]
                for got, w in zip(t.get_many_batches(arrays[:64], depth=8), want, strict=True):
                    np.testing.assert_array_equal(got, w)
                modes: list[tuple[str, Callable[[float], int]]] = [("sequential", sequential(t.get_many, arrays))]
                modes += [(f"pipelined depth {d}", pipelined(t, arrays, d)) for d in args.depths]
                modes += [(f"asyncio {c} tasks", with_asyncio(t, arrays, c)) for c in args.tasks]
                if args.pinned:
                    modes += _pinned_modes(grid, ids, vals, arrays, pools[b][:64], replication, max(args.depths))
                for mode, fn in modes:
                    fn(time.perf_counter() + 0.05)  # warm up
                    r = timed(fn, args.duration, grid.pids, b)
                    rows.append(("ramgrid", servers, b, mode, *r))
                    print(
                        f"  ramgrid x{s} batch {b} {mode}: {r[0]:,.0f} keys/s, srv {r[1]:.0f} ns/key", file=sys.stderr
                    )
    return rows, notes


def _pinned_modes(
    grid: ramgrid.Grid,
    ids: np.ndarray,
    vals: np.ndarray,
    arrays: list[np.ndarray],
    check: np.ndarray,
    replication: int,
    depth: int,
) -> list[tuple[str, Callable[[float], int]]]:
    """Sequential and pipelined reads of a sealed, pinned copy of the table: over TCP, and in place from shared
    memory (the servers run on this host)."""
    t = grid.create_table("bench_sealed", partitions=64, replication=replication, value_type="f64", exist_ok=True)
    if not t.versions() or not any(v.get("sealed") for v in t.versions()):
        with t.new_version() as w:
            for lo in range(0, len(ids), 100_000):
                w.put_many(ids[lo : lo + 100_000], vals[lo : lo + 100_000])
    modes: list[tuple[str, Callable[[float], int]]] = []
    for label, shm in (("TCP", False), ("shm", True)):
        p = t.pin(shared_memory=shm)
        for got, ix in zip(p.get_many_batches(arrays[: len(check)], depth=8), check, strict=True):
            np.testing.assert_array_equal(got, vals[ix])
        modes.append((f"pinned {label} sequential", sequential(p.get_many, arrays)))
        modes.append((f"pinned {label} pipel. {depth}", pipelined(p, arrays, depth)))
    return modes


def fmt_table(rows: list[Row]) -> str:
    base = {(r[1], r[2]): r[4] for r in rows if r[0] == "ramgrid" and r[3] == "sequential"}
    head = (
        f"{'system':<21}{'servers':>9}{'batch':>7}  {'mode':<22}{'keys/s':>12}{'srv ns/key':>12}"
        f"{'client ns/key':>15}{'x sequential':>14}"
    )
    lines = [head, "-" * len(head)]
    for system, servers, batch, mode, kps, srv, cli in rows:
        ratio = f"{kps / base[(servers, batch)]:.2f}" if (servers, batch) in base else "-"
        srvs = f"{srv:,.0f}" if srv is not None else "-"
        lines.append(f"{system:<21}{servers:>9}{batch:>7}  {mode:<22}{kps:>12,.0f}{srvs:>12}{cli:>15,.0f}{ratio:>14}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 100k keys, 0.3 s per row")
    p.add_argument("--keys", type=int, default=None, help="keys loaded (default 1,000,000; --quick 100,000)")
    p.add_argument("--duration", type=float, default=None, help="seconds per row (default 2; --quick 0.3)")
    p.add_argument("--servers", default="1,2", help="ramgrid cluster sizes (default 1,2; replication 2 where >1)")
    p.add_argument("--batches", default="10,100", help="batch sizes (default 10,100)")
    p.add_argument("--depths", default="8,32", help="pipeline depths (default 8,32)")
    p.add_argument("--tasks", default="64", help="asyncio task counts (default 64)")
    p.add_argument(
        "--pinned",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also read a sealed, pinned copy over TCP and from shared memory (default on)",
    )
    p.add_argument("--out", help="also write the table, with the command line, to this file")
    args = p.parse_args(argv)
    args.keys = args.keys or (100_000 if args.quick else 1_000_000)
    args.duration = args.duration or (0.3 if args.quick else 2.0)
    for name in ("servers", "batches", "depths", "tasks"):
        setattr(args, name, [int(x) for x in getattr(args, name).split(",")])
    cmd = "python " + " ".join(
        shlex.quote(a) for a in [os.path.relpath(__file__)] + list(sys.argv[1:] if argv is None else argv)
    )
    rows, notes = run(args)
    header = [
        f"# {cmd}",
        (
            f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {platform.node()}; {os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}; numpy {np.__version__}"
        ),
        (
            f"# {args.keys:,} keys (int64 ids, float64 values), {args.duration} s per row, one Python thread; ramgrid "
            "servers run one thread each, 64 partitions; memcached -t 1 (pymemcache: one round trip per get_many)."
        ),
        "# srv ns/key: server-process CPU (utime+stime) per key served; client ns/key: this process's CPU per key.",
    ]
    text = "\n".join(header + [fmt_table(rows)] + [f"# note: {n}" for n in notes]) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
