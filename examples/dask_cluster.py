"""A grid started by the Dask cluster itself: `ramgrid.dask.start(client)` runs a server beside the workers, tasks find
it with `ramgrid.dask.get_grid()`, and it follows the cluster as workers come and go.

    pip install '.[dask]'                       # from the repository root
    python examples/dask_cluster.py             # a LocalCluster on this machine
    python examples/dask_cluster.py --scheduler tcp://10.0.0.1:8786   # the same code on a running cluster

On a LocalCluster every worker is on one host, so the example asks for a server per worker (`per="worker"`); on a
real cluster it starts one per host. The workers need ramgrid installed (docs/deploy.md, "Started by Dask").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ramgrid.dask


def write_part(table: str, keys: np.ndarray) -> int:
    """A task: writes its keys' values into the grid of the cluster it runs on."""
    ramgrid.dask.get_grid().table(table).put_many(keys, np.sqrt(keys))
    return len(keys)


def read_part(table: str, keys: np.ndarray) -> float:
    """A task: reads its keys back and sums them."""
    return float(ramgrid.dask.get_grid().table(table).get_many(keys).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheduler", help="a running Dask scheduler's address (default: a LocalCluster)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster workers (default 2)")
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()

    from dask.distributed import Client, LocalCluster

    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address="127.0.0.1:0")
        client = Client(cluster)
    try:
        t0 = time.perf_counter()
        grid = ramgrid.dask.start(client, memory="256MiB", replication=2, per="host" if args.scheduler else "worker")
        print(f"grid of {len(grid.servers)} servers ready in {time.perf_counter() - t0:.1f} s: {grid.servers}")
        for server, worker in ramgrid.dask.owners(client).items():
            print(f"  {server} beside {worker}")

        grid.create_table("demo", partitions=32, value_type="f64")  # replication 2, the grid's default
        keys = np.arange(args.keys, dtype=np.int64)
        parts = np.array_split(keys, 16)
        written = sum(client.gather(client.map(write_part, ["demo"] * len(parts), parts, pure=False)))
        total = sum(client.gather(client.map(read_part, ["demo"] * len(parts), parts, pure=False)))
        assert written == len(keys) and np.isclose(total, np.sqrt(keys).sum())
        print(f"{written:,} keys written and read back by tasks")

        if cluster is not None:
            # One more worker: its server joins the group and takes a share of the partitions.
            cluster.scale(args.workers + 1)
            client.wait_for_workers(args.workers + 1)
            deadline = time.monotonic() + 60
            while len(ramgrid.dask.get_grid(client).servers) < args.workers + 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            print(f"scaled up: {ramgrid.dask.get_grid(client).servers}")
            # Retiring a worker moves its server's partitions to the others first.
            server, worker = min(ramgrid.dask.owners(client).items())
            client.retire_workers([worker])
            print(f"retired {worker}: {server} left, servers now {ramgrid.dask.get_grid(client).servers}")
            total = sum(client.gather(client.map(read_part, ["demo"] * len(parts), parts, pure=False)))
            assert np.isclose(total, np.sqrt(keys).sum())
            print("every key still there")
        else:
            ramgrid.dask.stop(client)  # a remote cluster outlives this script: its servers should not
    finally:
        client.close()
        if cluster is not None:
            cluster.close()  # stops every server with the workers
    print("ok")


if __name__ == "__main__":
    main()
