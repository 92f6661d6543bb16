"""Replicated writes from Python: each partition's primary orders its writes and forwards them to the other
replicas (docs/replication.md); what does that cost, beside memcached under the same load?

Same keys (int64 ids) and 8-byte values (float64) for every system, in the same run, batches of 100 and 1,000 keys
from one Python thread and from four:

- ramgrid R=2: `put_many` on an f64 table with replication 2 on 3 local servers (the primary forwards to the
  backup and answers once both applied the batch);
- ramgrid R=1: the same table with replication 1 (no forward): what the ordering and the forward add;
- memcached x2: pymemcache `set_many` of the same ids to two memcached processes one after the other (the obvious
  way to keep two copies with memcached: the client writes both, and nothing orders concurrent writers);
- memcached x1: `set_many` to one memcached.

Reports keys/s and per-batch latency p50/p99, with keys/s as a ratio to the memcached x2 row of the same batch size
and threads. This is a benchmark, not a test: it asserts nothing about speed.

    python benchmarks/replicated_writes.py                 # 2 s per row
    python benchmarks/replicated_writes.py --quick         # 0.5 s per row
    python benchmarks/replicated_writes.py --out benchmarks/results/replicated_writes.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import ramgrid
from native_batch import start_memcached


@dataclass
class Row:
    system: str
    batch: int
    threads: int
    keys_per_s: float
    p50_ms: float
    p99_ms: float


def measure(system: str, batch: int, threads: int, write: Callable[[np.ndarray, np.ndarray], None], secs: float) -> Row:
    rng = np.random.default_rng(batch * 10 + threads)
    lat: list[float] = []
    done = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + secs

    def run(seed: int) -> None:
        local: list[float] = []
        n = 0
        r = np.random.default_rng(seed)
        while time.perf_counter() < stop:
            keys = r.integers(0, 1_000_000, batch, dtype=np.int64)
            vals = keys.astype(np.float64) * 0.5
            t0 = time.perf_counter()
            write(keys, vals)
            local.append(time.perf_counter() - t0)
            n += batch
        with lock:
            lat.extend(local)
            done[0] += n

    t0 = time.perf_counter()
    ths = [threading.Thread(target=run, args=(int(rng.integers(1 << 30)),)) for _ in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    a = np.array(lat) * 1000
    return Row(system, batch, threads, done[0] / wall, float(np.percentile(a, 50)), float(np.percentile(a, 99)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--label", default="ramgrid", help="the name of this build in the rows (e.g. before/after)")
    ap.add_argument("--no-memcached", action="store_true")
    args = ap.parse_args()
    secs = 0.5 if args.quick else 2.0
    rows: list[Row] = []
    plan = [(b, t) for b in (1, 100, 1000) for t in (1, 4)]
    with ramgrid.local(servers=3, memory="256MiB") as g:
        for r in (2, 1):
            t = g.create_table(f"w{r}", partitions=32, replication=r, value_type="f64")
            w = t.new_version().begin()
            for b, th in plan:
                rows.append(measure(f"{args.label} R={r}", b, th, w.put_many, secs))
                print(f"  {rows[-1]}", file=sys.stderr)
            if r == 2:
                # Reads of the open version just written: the default mode, and the relaxed one where there is one.
                rows.append(measure(f"{args.label} get", 1000, 1, lambda k, v, w=w: w.get_many(k, default=0.0), secs))
                try:
                    relaxed = ramgrid.connect(g.addresses, consistency="replica").table(t.name).pin(w.version)
                except TypeError:  # a build before the read modes: its reads of open versions spread already
                    relaxed = None
                if relaxed is not None:
                    rows.append(
                        measure(
                            f"{args.label} get rel", 1000, 1, lambda k, v, r=relaxed: r.get_many(k, default=0.0), secs
                        )
                    )
    procs = []
    try:
        if args.no_memcached:
            raise ImportError("--no-memcached")
        from pymemcache.client.base import Client as Mc

        ports = []
        for _ in range(2):
            p, port = start_memcached()
            procs.append(p)
            ports.append(port)

        local = threading.local()

        def clients() -> list[Mc]:
            if not hasattr(local, "c"):
                local.c = [Mc(("127.0.0.1", port), no_delay=True) for port in ports]
            return list(local.c)

        def mc_write(copies: int) -> Callable[[np.ndarray, np.ndarray], None]:
            def write(keys: np.ndarray, vals: np.ndarray) -> None:
                items = {str(int(k)): v.tobytes() for k, v in zip(keys, vals, strict=True)}
                for c in clients()[:copies]:
                    failed = c.set_many(items, noreply=False)
                    if failed:
                        raise RuntimeError(f"memcached refused {len(failed)} keys")

            return write

        for copies in (2, 1):
            for b, th in plan:
                rows.append(measure(f"memcached x{copies}", b, th, mc_write(copies), secs))
                print(f"  {rows[-1]}", file=sys.stderr)
    except (ImportError, FileNotFoundError, RuntimeError) as e:
        print(f"memcached rows skipped: {e}", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()

    peer = {(r.batch, r.threads): r.keys_per_s for r in rows if r.system == "memcached x2"}
    lines = [
        f"# python {' '.join(shlex.quote(a) for a in ['benchmarks/replicated_writes.py', *sys.argv[1:]])}",
        (
            f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {platform.node() or 'host'}; "
            f"{os.cpu_count()} CPUs; Python {platform.python_version()}; numpy {np.__version__}"
        ),
        (
            "# 3 local ramgrid servers (2 threads each), 32 partitions, f64 values; memcached -t 1 each; "
            f"{secs} s per row; keys drawn from 1M ids."
        ),
        f"{'system':<14}{'batch':>6}{'threads':>8}{'keys/s':>13}{'p50 ms':>9}{'p99 ms':>9}{'x memcached x2':>16}",
    ]
    for r in rows:
        ratio = r.keys_per_s / peer[(r.batch, r.threads)] if (r.batch, r.threads) in peer else float("nan")
        lines.append(
            f"{r.system:<14}{r.batch:>6}{r.threads:>8}{r.keys_per_s:>13,.0f}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
            f"{ratio:>16.2f}"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
