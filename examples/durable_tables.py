"""ramgrid durable tables: a table that outlives its servers, and a server that comes back empty.

    python examples/durable_tables.py

Three local servers, each with its own data directory. A `durability="snapshot"` table is written, sealed (which
writes each server's partitions to its disk before the seal is acknowledged) and made current; then every server is
killed and started again, and the table reads back exactly, with no reload. A `durability="memory"` table beside it
shows the other case: after one server restarts empty, reads go to the replicas that still hold its partitions.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import ramgrid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000, help="rows per table (default 200,000)")
    args = parser.parse_args()
    keys = np.arange(args.keys, dtype=np.int64)

    with tempfile.TemporaryDirectory(prefix="ramgrid-data-") as data, ramgrid.local(servers=3, data_dir=data) as grid:
        durable = grid.create_table("durable", partitions=16, replication=2, value_type="f64", durability="snapshot")
        volatile = grid.create_table("volatile", partitions=16, replication=2, value_type="f64")
        for table in (durable, volatile):
            with table.new_version() as v:  # sealed (and, for "durable", on disk) before it becomes current
                v.put_many(keys, np.sqrt(keys))
        print(f"loaded {args.keys:,} keys into each table; data directories under {data}")

        # One server restarts empty for the memory table: its partitions are read from their other replicas.
        grid.restart(0)
        assert np.array_equal(volatile.get_many(keys), np.sqrt(keys))
        print("server 0 restarted: the memory table still reads exactly (from the replicas)")

        # Every server restarts: the snapshot table comes back from the disks.
        started = time.perf_counter()
        for i in range(3):
            grid.restart(i)
        elapsed = time.perf_counter() - started
        got = ramgrid.connect(grid.addresses).table("durable").get_many(keys)
        assert np.array_equal(got, np.sqrt(keys))
        print(f"all 3 servers restarted in {elapsed:.2f} s: the snapshot table reads back exactly, no reload")


if __name__ == "__main__":
    main()
