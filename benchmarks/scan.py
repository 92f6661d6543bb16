"""Per-item cost of a whole-table scan and filter from Python, against reading the same numpy array in-process.

One local server (`ramgrid.local(servers=1)`), an f64 table of N items (int64 keys), then:

- scan: `for keys, values in table.scan(): ...` touching each chunk's values (a sum);
- filter: `table.filter((lo, hi))` selecting about 10 %;
- in-process peers: `values.sum()` and `values[(values >= lo) & (values < hi)]` over a numpy array of the same N;
- `to_arrow()` beside pyarrow reading a Parquet file of the same keys and values, DuckDB summing that file, and
  DuckDB summing the `to_arrow()` result and the table object itself (its Arrow C stream);
- the same version pinned: `PinnedTable.to_arrow()` read from the server's shared-memory segments (the partitions
  mapped in this process, docs/shared-memory.md), and over TCP (`pin(shared_memory=False)`), the same with the
  filter's `where`, and DuckDB over the pinned table's C stream.

The table is loaded as one sealed version (`new_version()`), so that it can be pinned and mapped.

It prints ns per item of each and the ratio to its in-process peer. A benchmark, not a test: it asserts nothing.

    python benchmarks/scan.py                # 10 M items
    python benchmarks/scan.py --items 1000000
"""

from __future__ import annotations

import argparse
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
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
    mem = f"{max(256, n * 128 // (1 << 20))}MiB"  # the shared segments count a second time (shared-memory.md)
    with ramgrid.local(servers=1, memory=mem, extra_args=["--buffer-memory", "1GiB"]) as g:
        t = g.create_table("bench_scan", partitions=args.partitions, value_type="f64")
        step = 1 << 20
        with t.new_version() as w:
            for i in range(0, n, step):
                w.put_many(keys[i : i + step], vals[i : i + step])
        pinned = t.pin()  # mapped from the server's segments
        mapped = pinned.describe()["shared_memory"]["mapped"]  # type: ignore[index]
        assert len(mapped) == args.partitions, pinned.describe()
        pinned_tcp = t.pin(shared_memory=False)

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
        # Arrow out, beside pyarrow reading a Parquet file of the same columns and DuckDB querying that file.
        with tempfile.TemporaryDirectory() as d:
            path = f"{d}/same.parquet"
            pq.write_table(pa.table({"key": keys, "value": vals}), path)
            t_arrow = best(lambda: t.to_arrow())
            t_pq = best(lambda: pq.read_table(path))
            t_shm = best(lambda: pinned.to_arrow())
            t_pin_tcp = best(lambda: pinned_tcp.to_arrow())
            t_shm_where = best(lambda: pinned.to_arrow(where=(lo, hi)))
            t_tcp_where = best(lambda: pinned_tcp.to_arrow(where=(lo, hi)))
            shm_sum = float(pa.compute.sum(pinned.to_arrow().column("value")).as_py())
            t_duck_pq = best(lambda: duckdb.sql(f"select sum(value) from '{path}'").fetchall())
            arrow_table = t.to_arrow()

            # DuckDB finds a Python variable by its name in the calling function's locals.
            def duck_arrow() -> float:
                tbl = arrow_table  # noqa: F841 (read by DuckDB's replacement scan)
                return float(duckdb.sql("select sum(value) from tbl").fetchall()[0][0])

            def duck_grid() -> float:
                tbl = t  # noqa: F841 (read by DuckDB's replacement scan)
                return float(duckdb.sql("select sum(value) from tbl").fetchall()[0][0])

            def duck_pinned() -> float:
                tbl = pinned  # noqa: F841 (read by DuckDB's replacement scan)
                return float(duckdb.sql("select sum(value) from tbl").fetchall()[0][0])

            answer = duck_arrow()
            t_duck_arrow = best(duck_arrow)
            t_duck_grid = best(duck_grid)
            t_duck_pinned = best(duck_pinned)
        rows.append(("to_arrow()", t_arrow, best(lambda: vals.sum())))
    print(f"{n} f64 items, {args.partitions} partitions, 1 local server, best of {args.rounds}")
    print(f"{'':18} {'ramgrid ns/item':>16} {'numpy ns/item':>14} {'ratio':>8}")
    for name, ours, peer in rows:
        print(f"{name:18} {ours / n * 1e9:16.1f} {peer / n * 1e9:14.2f} {ours / peer:8.0f}x")
    print()

    def ns(seconds: float) -> float:
        return seconds / n * 1e9

    print(f"{'to_arrow() from the grid':44} {ns(t_arrow):8.2f} ns/item")
    print(f"{'pyarrow reading a Parquet of the same data':44} {ns(t_pq):8.2f} ns/item  ({t_arrow / t_pq:.2f}x)")
    print(f"{'DuckDB sum(value) over that Parquet':44} {ns(t_duck_pq):8.2f} ns/item")
    print(f"{'DuckDB sum(value) over to_arrow()':44} {ns(t_duck_arrow):8.2f} ns/item")
    print(f"{'DuckDB sum(value) over the Table (C stream)':44} {ns(t_duck_grid):8.2f} ns/item")
    print(f"{'PinnedTable.to_arrow(), shared memory':44} {ns(t_shm):8.2f} ns/item  ({t_shm / t_pq:.2f}x pyarrow)")
    print(f"{'PinnedTable.to_arrow(), TCP':44} {ns(t_pin_tcp):8.2f} ns/item  ({t_pin_tcp / t_pq:.2f}x pyarrow)")
    print(f"{'DuckDB sum(value) over the PinnedTable':44} {ns(t_duck_pinned):8.2f} ns/item")
    print(f"{'PinnedTable.to_arrow(where=~10 %), shm':44} {ns(t_shm_where):8.2f} ns/item")
    print(f"{'PinnedTable.to_arrow(where=~10 %), TCP':44} {ns(t_tcp_where):8.2f} ns/item")
    print(
        f"sum of the shared-memory table's values: {shm_sum!r}; equal to 1e-9: {abs(shm_sum - vals.sum()) <= 1e-9 * n}"
    )
    print(
        f"DuckDB over to_arrow(): {answer!r}; numpy: {vals.sum()!r}; equal to 1e-9: {abs(answer - vals.sum()) <= 1e-9 * n}"
    )


if __name__ == "__main__":
    main()
