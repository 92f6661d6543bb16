"""Batched lookups from Python: ramgrid's native protocol vs memcached (pymemcache get_many) vs a Python dict.

Same keys (int64 ids) and 8-byte values (float64) for every system, in the same run:

- ramgrid: `Table.get_many(int64 array)` on an f64 table, against 1, 2 and 4 local servers (one thread each);
- memcached: pymemcache `get_many` of the same ids as decimal strings, against one memcached (-t 1);
- dict: a Python loop `[d[k] for k in batch]` over the same ids (the ceiling when the data fits in one process).

For each batch size it reports keys/s, per-batch latency p50/p99, server CPU per key (utime+stime of the server
processes from /proc/PID/stat, divided by keys served) and client-process CPU per key (Python plus the native
client), with keys/s as a ratio to the memcached row of the same batch size. This is a benchmark, not a test: it
asserts nothing about speed.

    python benchmarks/native_batch.py            # 1M keys, 2 s per measurement
    python benchmarks/native_batch.py --quick    # 100k keys, short: a smoke run
    python benchmarks/native_batch.py --out benchmarks/results/native_batch.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# OpenBLAS worker threads spin in this process after numpy starts them and would be billed to every row's client
# CPU; nothing here uses BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import ramgrid

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the given processes (all their threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / CLK_TCK


@dataclass
class Row:
    system: str
    servers: str
    batch: int
    keys_per_s: float
    p50_us: float
    p99_us: float
    server_ns_per_key: float | None
    client_ns_per_key: float
    note: str = ""


def measure(
    system: str,
    servers: str,
    batch: int,
    batches: list,
    run_one: Callable[[object], object],
    duration: float,
    server_pids: Sequence[int],
    min_batches: int,
) -> Row:
    """Runs `run_one` over `batches` (cycled) for about `duration` seconds after a short warm-up."""
    for b in batches[: min(len(batches), 20)]:
        run_one(b)
    lat = []
    nb = len(batches)
    i = 0
    srv0 = proc_cpu_seconds(server_pids) if server_pids else 0.0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + duration
    perf = time.perf_counter_ns
    while True:
        b = batches[i % nb]
        s = perf()
        run_one(b)
        lat.append(perf() - s)
        i += 1
        if i >= min_batches and (i & 15) == 0 and time.perf_counter() >= deadline:
            break
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    srv = proc_cpu_seconds(server_pids) - srv0 if server_pids else None
    keys = i * batch
    arr = np.array(lat, dtype=np.float64) / 1000.0
    return Row(
        system,
        servers,
        batch,
        keys / wall,
        float(np.percentile(arr, 50)),
        float(np.percentile(arr, 99)),
        None if srv is None else srv / keys * 1e9,
        cpu / keys * 1e9,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_memcached() -> tuple[subprocess.Popen, int]:
    exe = shutil.which("memcached")
    if exe is None:
        raise FileNotFoundError("memcached is not installed")
    port = free_port()
    cmd = [exe, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", "1", "-m", "1024"]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]  # memcached refuses to run as root without naming the user
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"memcached exited: {proc.stderr.read().decode() if proc.stderr else ''}") from None
            time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise RuntimeError("memcached did not start listening within 10 s")


def batch_indices(n_keys: int, batch: int, total_keys: int, rng: np.random.Generator) -> np.ndarray:
    n_batches = max(8, min(2000, total_keys // batch))
    return rng.integers(0, n_keys, size=(n_batches, batch))


def dict_rows(ids: np.ndarray, vals: np.ndarray, pools: dict[int, np.ndarray], args: argparse.Namespace) -> list[Row]:
    d = dict(zip(ids.tolist(), vals.tolist()))

    def lookup(keys: list[int]) -> list[float]:
        return [d[k] for k in keys]

    rows = []
    for b in args.batches:
        lists = [ids[ix].tolist() for ix in pools[b]]
        rows.append(measure("dict", "-", b, lists, lookup, args.duration, [], 5))
        print(f"  dict batch {b}: {rows[-1].keys_per_s:,.0f} keys/s", file=sys.stderr)
    return rows


def run(args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    rng = np.random.default_rng(42)
    n = args.keys
    # Spread ids over the int64 range, as real ids are, rather than 0..n-1.
    ids = np.unique(rng.integers(0, 2**62, size=int(n * 1.01)))[:n]
    rng.shuffle(ids)
    vals = rng.random(n)
    rows: list[Row] = []
    notes: list[str] = []
    pools = {b: batch_indices(n, b, args.pool_keys, rng) for b in args.batches}

    # dict: the ceiling when everything fits in one process.
    rows += dict_rows(ids, vals, pools, args)

    # memcached through pymemcache.
    mc_proc = None
    try:
        from pymemcache.client.base import Client as McClient

        mc_proc, port = start_memcached()
        mc = McClient(("127.0.0.1", port), connect_timeout=2, timeout=10, no_delay=True)
        skeys = [str(k) for k in ids.tolist()]
        packed = [struct.pack("<d", v) for v in vals.tolist()]
        t0 = time.perf_counter()
        for lo in range(0, n, 1000):
            failed = mc.set_many(dict(zip(skeys[lo : lo + 1000], packed[lo : lo + 1000])), noreply=False)
            if failed:
                raise RuntimeError(f"memcached refused {len(failed)} keys (out of memory?)")
        print(f"  memcached: loaded {n:,} keys in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for b in args.batches:
            lists = [[skeys[i] for i in ix] for ix in pools[b]]
            row = measure("memcached/pymemcache", "1", b, lists, mc.get_many, args.duration, [mc_proc.pid], 5)
            rows.append(row)
            print(f"  memcached batch {b}: {row.keys_per_s:,.0f} keys/s", file=sys.stderr)
        check = mc.get_many(lists[0])
        if len(check) != len(set(lists[0])):
            notes.append("memcached missed keys in the check batch (evictions?)")
        mc.close()
    except (ImportError, FileNotFoundError, RuntimeError) as e:
        notes.append(f"memcached row skipped: {e}")
    finally:
        if mc_proc is not None:
            mc_proc.terminate()
            mc_proc.wait()
            if mc_proc.stderr:
                mc_proc.stderr.close()

    # ramgrid against 1, 2, 4 servers.
    memory = f"{max(64, (n * 200) >> 20)}MiB"
    for s in args.servers:
        with ramgrid.local(servers=s, memory=memory, threads=1) as grid:
            t = grid.create_table("bench", partitions=64, value_type="f64")
            t0 = time.perf_counter()
            for lo in range(0, n, 100_000):
                t.put_many(ids[lo : lo + 100_000], vals[lo : lo + 100_000])
            print(f"  ramgrid x{s}: loaded {n:,} keys in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
            sample = pools[args.batches[-1]][0]
            if not np.array_equal(t.get_many(ids[sample]), vals[sample]):
                raise SystemExit("ramgrid returned wrong values")
            for b in args.batches:
                arrays = [np.ascontiguousarray(ids[ix]) for ix in pools[b]]
                row = measure("ramgrid", str(s), b, arrays, t.get_many, args.duration, grid.pids, 5)
                rows.append(row)
                print(f"  ramgrid x{s} batch {b}: {row.keys_per_s:,.0f} keys/s", file=sys.stderr)
    return rows, notes


def fmt_table(rows: list[Row]) -> str:
    mc = {r.batch: r.keys_per_s for r in rows if r.system.startswith("memcached")}
    head = (
        f"{'system':<22}{'servers':>8}{'batch':>7}{'keys/s':>14}{'p50 us':>10}{'p99 us':>10}"
        f"{'srv ns/key':>12}{'client ns/key':>15}{'x memcached':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r.keys_per_s / mc[r.batch]:.2f}" if r.batch in mc else "-"
        srv = f"{r.server_ns_per_key:,.0f}" if r.server_ns_per_key is not None else "-"
        lines.append(
            f"{r.system:<22}{r.servers:>8}{r.batch:>7}{r.keys_per_s:>14,.0f}{r.p50_us:>10.1f}{r.p99_us:>10.1f}"
            f"{srv:>12}{r.client_ns_per_key:>15,.0f}{ratio:>13}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 100k keys, 0.3 s per measurement")
    p.add_argument("--keys", type=int, default=None, help="keys loaded (default 1,000,000; --quick 100,000)")
    p.add_argument("--duration", type=float, default=None, help="seconds per measurement (default 2; --quick 0.3)")
    p.add_argument("--servers", default="1,2,4", help="ramgrid cluster sizes (default 1,2,4)")
    p.add_argument("--batches", default="1,10,100,1000", help="batch sizes (default 1,10,100,1000)")
    p.add_argument("--out", help="also write the table, with the command line, to this file")
    args = p.parse_args(argv)
    args.keys = args.keys or (100_000 if args.quick else 1_000_000)
    args.duration = args.duration or (0.3 if args.quick else 2.0)
    args.servers = [int(x) for x in args.servers.split(",")]
    args.batches = [int(x) for x in args.batches.split(",")]
    args.pool_keys = 200_000 if args.quick else 2_000_000
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
            f"# {args.keys:,} keys (int64 ids, 8-byte float64 values), {args.duration} s per row; ramgrid servers run one "
            "thread each; memcached -t 1; keys/s is wall-clock from one Python thread."
        ),
        (
            "# srv ns/key: server-process CPU (utime+stime) per key served; client ns/key: this process's CPU per key "
            "(Python plus the native client). pymemcache returns raw bytes (no float decode); ramgrid returns a float64 array."
        ),
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
