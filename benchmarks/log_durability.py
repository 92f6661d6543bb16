"""What durability="log" costs: PUT throughput of the same load on a memory table and on a log table, and the time a
restarting server takes to replay logs, per GB.

One server (`--threads 2`, a fresh `--data-dir` under `--dir`) holds a durability="memory" table and a
durability="log" table, both f64 with 64 partitions. For each (writers, keys per PUT) pair, `writers` processes
each put batches of that many keys into one table for `--seconds`, then into the other (same load, same run,
alternating which goes first); the script prints keys/s and PUTs/s for both and their ratio. With one key per PUT
every request waits for its own fdatasync; with several writers the group commit lets them share one: the last
column is the server's `log_commits / log_syncs` over the log run (requests made durable per fdatasync).

Replay: a log table gets `--mb` MB of f64 values (small ops: the per-key cost dominates) and a second one `--mb` MB of
1000-byte values (bytes dominate), all in open version 1; the server is killed with SIGKILL and started again, and
the script prints the replay line each table logged (records, bytes, ms), seconds per GB of log, and the time from
spawn to listening. It then checks a sample of keys. A benchmark, not a test: it prints figures.

    python benchmarks/log_durability.py
    python benchmarks/log_durability.py --out benchmarks/results/log_durability.txt
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _server
import ramgrid
from _server import free_port


def spawn(addr: str, data: Path, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """Starts the server; returns it and the seconds until it listened."""
    return _server.spawn(addr, data, log, "8GiB")


def writer(addr: str, table: str, w: int, batch: int, seconds: float, start: float) -> tuple[int, int]:
    """Puts batches of `batch` keys until `seconds` have passed since `start`; returns (keys, puts)."""
    g = ramgrid.connect([addr], timeout=10.0, call_timeout=60.0)
    t = g.table(table)
    base = np.arange(batch, dtype=np.int64)
    vals = base * 0.5
    keys_done = puts = 0
    while time.time() < start:
        time.sleep(0.001)
    end = start + seconds
    while time.time() < end:
        t.put_many(base + (w << 40) + keys_done, vals)
        keys_done += batch
        puts += 1
    g.close()
    return keys_done, puts


def run_load(addr: str, table: str, writers: int, batch: int, seconds: float) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(writers) as pool:
        start = time.time() + 2.0  # every process connected before the clock starts
        res = pool.starmap(writer, [(addr, table, w, batch, seconds, start) for w in range(writers)])
    keys = sum(r[0] for r in res)
    puts = sum(r[1] for r in res)
    return keys / seconds, puts / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per load run")
    ap.add_argument("--mb", type=int, default=200, help="MB of values per replay table")
    ap.add_argument("--dir", type=Path, default=None, help="where the data dir goes (default: the system temp dir)")
    ap.add_argument("--out", type=Path, help="also write the report here")
    a = ap.parse_args()

    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
    say(f"$ python {' '.join(shlex.quote(x) for x in sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="ramgrid-wal-bench-", dir=a.dir) as tmp:
        root = Path(tmp)
        fs = subprocess.run(
            ["stat", "-f", "-c", "%T", str(root)], check=False, capture_output=True, text=True
        ).stdout.strip()
        say(f"# data dir on {fs} ({root}); server --threads 2; fsync policy: always (group commit)")
        addr = f"127.0.0.1:{free_port()}"
        proc, _ = spawn(addr, root / "data", root / "first")
        try:
            g = ramgrid.connect([addr], timeout=60.0, call_timeout=600.0)
            g.create_table("mem", partitions=64, value_type="f64", durability="memory")
            g.create_table("log", partitions=64, value_type="f64", durability="log")
            say("")
            say("PUT throughput, same load on both tables (f64 values, 64 partitions):")
            head = f"{'writers':>7} {'keys/PUT':>8} | {'memory keys/s':>13} {'PUTs/s':>8} | {'log keys/s':>11} {'PUTs/s':>8}"
            say(f"{head} | log/mem | PUTs/fsync")

            def log_counters() -> tuple[int, int]:
                st = g.stats()[0]
                return int(st["log_commits"]), int(st["log_syncs"])

            flip = False
            for writers, batch in [(1, 1), (8, 1), (1, 1000), (8, 1000), (4, 100_000)]:
                order = ["log", "mem"] if flip else ["mem", "log"]
                flip = not flip
                r = {}
                per_sync = 0.0
                for t in order:
                    c0, s0 = log_counters()
                    r[t] = run_load(addr, t, writers, batch, a.seconds)
                    if t == "log":
                        c1, s1 = log_counters()
                        per_sync = (c1 - c0) / max(s1 - s0, 1)
                (mk, mp_), (lk, lp) = r["mem"], r["log"]
                say(
                    f"{writers:>7} {batch:>8} | {mk:>13,.0f} {mp_:>8,.0f} | {lk:>11,.0f} {lp:>8,.0f} |"
                    f" {lk / mk:>7.2f} | {per_sync:>10.1f}"
                )
            g.drop_table("mem")
            g.drop_table("log")

            say("")
            n_f64 = a.mb * 1_000_000 // 8
            n_bytes = a.mb * 1_000
            small = g.create_table("replay_f64", partitions=64, value_type="f64", durability="log")
            big = g.create_table("replay_bytes", partitions=64, value_type="bytes", durability="log")
            t0 = time.perf_counter()
            step = 200_000
            for lo in range(0, n_f64, step):
                k = np.arange(lo, min(lo + step, n_f64), dtype=np.int64)
                small.put_many(k, k * 0.25)
            blob = b"x" * 990
            for lo in range(0, n_bytes, 2_000):
                ks = list(range(lo, min(lo + 2_000, n_bytes)))
                big.put_many(ks, [b"%010d" % k + blob for k in ks])
            say(
                f"wrote {n_f64:,} f64 keys and {n_bytes:,} 1000-byte values into open versions in {time.perf_counter() - t0:.1f} s"
            )
            g.close()
        finally:
            proc.kill()
            proc.wait()
        logs = sorted((root / "data").glob("tables/*/v*.log"))
        say(
            "logs on disk: "
            + ", ".join(f"{p.parent.name.split('-')[0]}/{p.name} {p.stat().st_size / 1e6:.0f} MB" for p in logs)
        )

        proc, secs = spawn(addr, root / "data", root / "second")
        try:
            err = (root / "second.err").read_text()
            total_bytes = total_ms = 0.0
            for line in err.splitlines():
                if "loaded table" in line:
                    say("server: " + line.split("ramgrid-server: ", 1)[-1])
                    m = re.search(r"\((\d+) records, (\d+) bytes\), (\d+) ms", line)
                    if m:
                        b, ms = int(m.group(2)), int(m.group(3))
                        total_bytes += b
                        total_ms += ms
                        say(f"  -> {ms / 1e3 / (b / 1e9):.2f} s per GB of log")
            say(
                f"restart after SIGKILL: listening {secs:.2f} s after spawn; replay {total_ms / 1e3 / (total_bytes / 1e9):.2f} s per GB over both logs"
            )
            g = ramgrid.connect([addr], timeout=60.0, call_timeout=600.0)
            rng = np.random.default_rng(1)
            k = rng.integers(0, n_f64, 10_000)
            assert np.array_equal(g.table("replay_f64").get_many(k), k * 0.25)
            kb = rng.integers(0, n_bytes, 1_000).tolist()
            assert g.table("replay_bytes").get_many(kb) == [b"%010d" % x + blob for x in kb]
            say("sample of 11,000 keys read back exactly")
            g.close()
        finally:
            proc.kill()
            proc.wait()
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
