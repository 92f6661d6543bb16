"""Per-item cost of a whole-table scan and filter from Python, against reading the same numpy array in-process.

One local server (`ramgrid.local(servers=1)`), an f64 table of N items (int64 keys), then:

- scan: `for keys, values in table.scan(): ...` touching each chunk's values (a sum);
- filter: `table.filter((lo, hi))` selecting about 10 %;
- in-process peers: `values.sum()` and `values[(values >= lo) & (values < hi)]` over a numpy array of the same N.

It prints ns per item of each and the ratio to its in-process peer. A benchmark, not a test: it asserts nothing.

    python benchmarks/scan.py                # 10 M items
    python benchmarks/scan.py --items 1000000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ramgrid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=10_000_000)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.items
    rng = np.random.default_rng(0)
    keys = np.arange(n, dtype=np.int64)
    vals = rng.random(n)
    lo, hi = 0.45, 0.55
    mem = f"{max(256, n * 64 // (1 << 20))}MiB"
    with ramgrid.local(servers=1, memory=mem, extra_args=["--buffer-memory", "1GiB"]) as g:
        t = g.create_table("bench_scan", partitions=args.partitions, value_type="f64")
        step = 1 << 20
        for i in range(0, n, step):
            t.put_many(keys[i : i + step], vals[i : i + step])

        def best(f: object) -> float:
            times = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                f()  # type: ignore[operator]
                times.append(time.perf_counter() - t0)
            return min(times)

        def scan() -> None:
            total, count = 0.0, 0
            for k, v in t.scan():
                total += float(v.sum())
                count += len(k)
            assert count == n

        def filt() -> None:
            count = 0
            for k, _v in t.filter((lo, hi)):
                count += len(k)

        rows = [
            ("scan (all items)", best(scan), best(lambda: vals.sum())),
            ("filter (~10 %)", best(filt), best(lambda: vals[(vals >= lo) & (vals < hi)])),
        ]
    print(f"{n} f64 items, {args.partitions} partitions, 1 local server, best of {args.rounds}")
    print(f"{'':18} {'ramgrid ns/item':>16} {'numpy ns/item':>14} {'ratio':>8}")
    for name, ours, peer in rows:
        print(f"{name:18} {ours / n * 1e9:16.1f} {peer / n * 1e9:14.2f} {ours / peer:8.0f}x")


if __name__ == "__main__":
    main()
