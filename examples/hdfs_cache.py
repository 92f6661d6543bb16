"""ramgrid as a cache in front of HDFS: listings, file status and file blocks served from the grid.

    make hdfs-demo                  # or: python examples/hdfs_cache.py (after make develop build hdfs-jars)

Everything runs on this machine: a real HDFS (Hadoop's MiniDFSCluster with WebHDFS, started here from the jars
`make hdfs-jars` fetched), two ramgrid servers, and a Dask job with two worker processes that read a directory
of CSV files through `ramgrid::webhdfs://...` twice. The second pass is served by the grid: blocks one worker
fetched from HDFS are read by the other from the grid. Then a write through the cache, a change made behind its
back, and a pinned snapshot show the guarantees of docs/fs-cache.md.
"""

from __future__ import annotations

import argparse
import time

import ramgrid
from ramgrid.fs import CachedFileSystem, FileChangedError
from ramgrid.fs.minihdfs import MiniHDFS


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=40, help="CSV files in the directory (default 40)")
    parser.add_argument("--rows", type=int, default=500, help="rows per file (default 500)")
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes (0: threads in this process)")
    args = parser.parse_args(argv)
    out: dict[str, float] = {}

    print("starting a MiniDFSCluster (about 20 s) and 2 ramgrid servers ...", flush=True)
    with MiniHDFS() as hdfs, ramgrid.local(servers=2, extra_args=["--memory", "128MiB"]) as grid:
        hdfs_fs = hdfs.filesystem()  # plain WebHDFS: "another client" that bypasses the cache
        hdfs_fs.makedirs("/data", exist_ok=True)
        for i in range(args.files):
            rows = "".join(f"{i},{j},{(i * j) % 97}\n" for j in range(args.rows))
            hdfs_fs.pipe_file(f"/data/part-{i:04d}.csv", rows.encode())
        hdfs_fs.pipe_file("/data/notes.txt", b"not read before the snapshot\n")
        url = f"ramgrid::{hdfs.url}/data/*.csv"
        opts = {"ramgrid": {"grid": grid.spec}, "webhdfs": {"user": "ramgrid"}}
        print(f"{args.files} files in hdfs:///data; reading {url}")

        import dask
        import dask.dataframe as dd

        cluster = None
        if args.workers:
            from distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True)
            client = Client(cluster)
        try:
            for attempt in (1, 2):
                t = time.perf_counter()
                df = dd.read_csv(url, names=["file", "row", "v"], header=None, storage_options=opts)
                total = int(df["v"].sum().compute(scheduler=None if args.workers else "threads"))
                secs = time.perf_counter() - t
                out[f"dask_pass{attempt}_s"] = secs
                print(f"  Dask pass {attempt}: sum(v) = {total} in {secs:.2f} s")
        finally:
            if cluster is not None:
                client.close()
                cluster.close()
        del dask

        fs = CachedFileSystem(hdfs_fs, grid, skip_instance_cache=True)
        # Listings and reads: the first from HDFS, the next from the grid / near cache.
        for label in ("first in this process", "again"):
            t = time.perf_counter()
            fs.ls("/data")
            fs.cat_file("/data/part-0000.csv")
            print(f"  ls + read, {label}: {1e3 * (time.perf_counter() - t):.2f} ms")
        print(f"  counters: {fs.counters}")

        # A write through the cache is seen at once.
        fs.pipe_file("/data/part-0000.csv", b"0,0,1\n")
        assert fs.cat_file("/data/part-0000.csv") == b"0,0,1\n"
        print("  write through the cache: seen at once")

        # A snapshot pins the state it saw: a cached file reads its pinned bytes after a change by another client;
        # a file changed before its blocks were cached raises FileChangedError; neither ever reads the new bytes.
        snap = fs.snapshot(["/data"])
        before = snap.cat_file("/data/part-0001.csv")
        hdfs_fs.pipe_file("/data/part-0001.csv", b"changed by another client\n")
        hdfs_fs.pipe_file("/data/notes.txt", b"changed by another client\n")
        assert snap.cat_file("/data/part-0001.csv") == before
        try:
            snap.cat_file("/data/notes.txt")
            raise AssertionError("a snapshot read bytes of a changed file")
        except FileChangedError as e:
            print(f"  snapshot: pinned bytes for a cached file; an uncached changed one raises {type(e).__name__}")
        time.sleep(fs.ttl)
        assert fs.cat_file("/data/part-0001.csv") == b"changed by another client\n"
        print(f"  a change by another client: seen by the cache after at most ttl = {fs.ttl} s")
    return out


if __name__ == "__main__":
    main()
