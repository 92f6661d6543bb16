"""ramgrid membership: grow a running cluster from 3 to 4 servers while a job reads from it.

    python examples/grow_cluster.py

Three local servers hold a table (replication 2). A reading job runs in a thread, checking every value it gets.
Meanwhile a fourth server is started and added: the partitions it now holds are copied to it from their current
holders while reads and writes go on, and the new partition map takes effect only when every copy is done. The
move report says how much moved; the reader says how many reads it made and that every one was exact.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import ramgrid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=500_000, help="rows in the table (default 500,000)")
    args = parser.parse_args()
    keys = np.arange(args.keys, dtype=np.int64)

    with ramgrid.local(servers=3) as grid:
        table = grid.create_table("scores", partitions=32, replication=2, value_type="f64")
        with table.new_version() as v:
            v.put_many(keys, np.sqrt(keys))
        print(f"{len(grid.servers)} servers, {args.keys:,} keys loaded")

        # The job: its own client (as a job in another process would have), reading random batches.
        job_table = ramgrid.connect(grid.spec).table("scores")
        stop = threading.Event()
        counts = {"reads": 0, "wrong": 0}

        def read() -> None:
            rng = np.random.default_rng(0)
            while not stop.is_set():
                batch = rng.choice(keys, size=1000)
                counts["wrong"] += int(np.count_nonzero(job_table.get_many(batch) != np.sqrt(batch)))
                counts["reads"] += 1

        reader = threading.Thread(target=read)
        reader.start()
        try:
            time.sleep(0.5)
            added = grid.add_server()  # starts a 4th server and moves its partitions to it
            time.sleep(0.5)
        finally:
            stop.set()
            reader.join()

        report = grid.last_move
        assert report is not None
        print(f"added {added}: now {len(grid.servers)} servers")
        print(
            f"move report: {report['partitions_copied']} partitions, {report['bytes_copied'] / 2**20:.1f} MiB "
            f"copied in {report['seconds']:.2f} s"
        )
        for s in grid.status():
            print(f"  {s['server']}: {s['pending_partitions']} partitions pending, {s['copied_partitions']} copied in")
        assert counts["wrong"] == 0
        assert np.array_equal(table.get_many(keys), np.sqrt(keys))
        print(f"the job made {counts['reads']:,} reads during the move: every value exact")


if __name__ == "__main__":
    main()
