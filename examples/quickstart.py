"""ramgrid quickstart: start a local grid, load numpy arrays into a table, read them back inside Dask tasks.

    pip install ".[dask]"          # from the repository root (builds the Rust core with maturin)
    python examples/quickstart.py

Everything runs on this machine: three ramgrid server processes on loopback, and a Dask LocalCluster whose worker
processes read the table through a handle that was pickled to them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ramgrid


def score_chunk(table: ramgrid.Table, user_ids: np.ndarray) -> float:
    """A Dask task: look up a batch of keys in the grid (one round trip per server) and reduce them."""
    return float(table.get_many(user_ids).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="rows to load (default 1,000,000)")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes")
    args = parser.parse_args()

    from dask.distributed import Client, LocalCluster

    with ramgrid.local(servers=args.servers) as grid:
        print(f"local grid: {args.servers} servers at {grid.spec}")

        # A side resource: a float64 value per int64 key, split into 64 partitions over the servers.
        table = grid.create_table("user_scores", partitions=64, value_type="f64")
        user_ids = np.arange(args.keys, dtype=np.int64)
        scores = np.random.default_rng(0).random(args.keys)
        t0 = time.perf_counter()
        for lo in range(0, args.keys, 100_000):
            table.put_many(user_ids[lo : lo + 100_000], scores[lo : lo + 100_000])
        print(f"loaded {args.keys:,} keys in {time.perf_counter() - t0:.2f} s")

        # Read a few back here...
        sample = np.array([0, 1, args.keys - 1])
        print("sample:", dict(zip(sample.tolist(), table.get_many(sample).round(4).tolist())))

        # ...and everywhere in Dask tasks: the table handle pickles its configuration and reconnects in each worker.
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # the scheduler's HTTP endpoint on a free port, without a dashboard
                scheduler_kwargs={"dashboard": False},
            ) as cluster,
            Client(cluster) as client,
        ):
            chunks = np.array_split(user_ids, 16)
            t0 = time.perf_counter()
            total = sum(client.gather(client.map(score_chunk, [table] * len(chunks), chunks)))
            elapsed = time.perf_counter() - t0
        expected = float(scores.sum())
        print(f"Dask tasks read {args.keys:,} keys in {elapsed:.2f} s: sum {total:.6f} (expected {expected:.6f})")
        if not np.isclose(total, expected):
            raise SystemExit("the values read back differ from the values loaded")
        print("ok")


if __name__ == "__main__":
    main()
