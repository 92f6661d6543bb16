"""Panthera's two experiments against a real HDFS (MiniDFSCluster, WebHDFS), uncached vs ramgrid vs fsspec's caches.

    .venv/bin/python benchmarks/hdfs_cache.py [--repeat 200] [--small-files 1000] [--out FILE]

One MiniDFSCluster and one ramgrid.local(servers=2) for the whole run. (1) `ls` of a 100-file directory and (2) a
whole read of a 1 MB file, each repeated `--repeat` times after one warm-up, with: plain WebHDFS (uncached);
ramgrid.fs (this process's near caches on: the steady state of one worker); ramgrid.fs "grid only" (near caches
off: what another worker pays for an entry or block that one worker fetched); fsspec blockcache and simplecache
(local disk, per process; they do not cache listings). Figures: mean, p99 and standard deviation in ms.
(3) A Dask LocalCluster with 2 worker processes reads the same `--small-files` files twice; in pass 2 each file is
read by the other worker than in pass 1, so a cached block can only come from the grid. (4) What a miss costs: first reads of `--cold-files` distinct small files, uncached vs ramgrid (interleaved files
of one directory). Printed as markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

import fsspec
import ramgrid
from ramgrid.fs import CachedFileSystem
from ramgrid.fs.minihdfs import MiniHDFS


def timed(fn: Any, n: int) -> list[float]:
    fn()  # warm-up (fills the caches)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def summary(ms: list[float]) -> tuple[float, float, float]:
    s = sorted(ms)
    return statistics.fmean(ms), s[min(len(s) - 1, int(0.99 * len(s)))], statistics.pstdev(ms)


def read_files(fs: Any, paths: list[str]) -> dict[str, int]:
    """A Dask task: read every file whole; return this task's block counters (ramgrid) and its byte count."""
    before = dict(getattr(fs, "counters", {}))
    n = sum(len(fs.cat_file(p)) for p in paths)
    after = getattr(fs, "counters", {})
    out = {k: after[k] - before.get(k, 0) for k in after}
    out["bytes"] = n
    return out


def dask_job(make_fs: Any, paths: list[str]) -> list[tuple[float, dict[str, int]]]:
    from distributed import Client, LocalCluster

    results = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster, Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        halves = [paths[: len(paths) // 2], paths[len(paths) // 2 :]]
        fs = make_fs()
        for rnd in (0, 1):
            t0 = time.perf_counter()
            futs = []
            for w, half in enumerate(halves):
                worker = workers[(w + rnd) % 2]  # pass 2: each half is read by the other worker
                for i in range(0, len(half), 50):
                    futs.append(client.submit(read_files, fs, half[i : i + 50], workers=[worker], pure=False))
            counts: dict[str, int] = {}
            for r in client.gather(futs):
                for k, v in r.items():
                    counts[k] = counts.get(k, 0) + v
            results.append((time.perf_counter() - t0, counts))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--small-files", type=int, default=1000)
    parser.add_argument("--cold-files", type=int, default=200, help="distinct files read once each (misses)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    lines = [f"command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}", ""]

    with MiniHDFS() as hdfs, ramgrid.local(servers=2, extra_args=["--memory", "256MiB"]) as grid:
        hdfs_fs = hdfs.filesystem()
        hdfs_fs.makedirs("/bench/list", exist_ok=True)
        for i in range(100):
            hdfs_fs.pipe_file(f"/bench/list/f{i:03d}", b"x" * 100)
        payload = bytes(range(256)) * 4096  # 1 MiB
        hdfs_fs.pipe_file("/bench/1mb.bin", payload)
        tmp = tempfile.mkdtemp(prefix="rg-fsspec-cache-")
        systems = {
            "uncached (WebHDFS)": hdfs_fs,
            "ramgrid": CachedFileSystem(hdfs_fs, grid, skip_instance_cache=True, table="bench_meta"),
            "ramgrid, grid only": CachedFileSystem(
                hdfs_fs, grid, skip_instance_cache=True, table="bench_meta", near_ttl=0, near_cache_bytes=0
            ),
            "fsspec blockcache": fsspec.filesystem(
                "blockcache", fs=hdfs_fs, cache_storage=f"{tmp}/b", skip_instance_cache=True
            ),
            "fsspec simplecache": fsspec.filesystem(
                "simplecache", fs=hdfs_fs, cache_storage=f"{tmp}/s", skip_instance_cache=True
            ),
        }
        lines += [
            "| system | ls 100 files: mean ms | p99 | stddev | read 1 MB: mean ms | p99 | stddev |",
            "|---|---|---|---|---|---|---|",
        ]
        base: dict[str, float] = {}
        for name, fs in systems.items():
            ls = summary(timed(lambda fs=fs: fs.ls("/bench/list", detail=True), args.repeat))
            assert fs.cat_file("/bench/1mb.bin") == payload
            rd = summary(timed(lambda fs=fs: fs.cat_file("/bench/1mb.bin"), args.repeat))
            if not base:
                base = {"ls": ls[0], "rd": rd[0]}
            cut = f" ({100 * (1 - ls[0] / base['ls']):+.1f}%)" if name != "uncached (WebHDFS)" else ""
            cut_rd = f" ({100 * (1 - rd[0] / base['rd']):+.1f}%)" if name != "uncached (WebHDFS)" else ""
            lines.append(
                f"| {name} | {ls[0]:.3f}{cut} | {ls[1]:.3f} | {ls[2]:.3f} | {rd[0]:.3f}{cut_rd} | {rd[1]:.3f} | {rd[2]:.3f} |"
            )
            print(lines[-1], flush=True)
        lines += ["", "(%) = latency reduction of the mean against uncached", ""]

        # What the cache costs when it cannot help: every read a miss (distinct files never read before).
        hdfs_fs.makedirs("/bench/cold", exist_ok=True)
        cold = [f"/bench/cold/c{i:04d}" for i in range(2 * args.cold_files)]
        for p in cold:
            hdfs_fs.pipe_file(p, b"y" * 100)
        miss_fs = CachedFileSystem(hdfs_fs, grid, skip_instance_cache=True, table="bench_cold")
        lines += ["| first reads (all misses), 100-byte files | mean ms | p99 | stddev |", "|---|---|---|---|"]
        for name, fs, files in (("uncached", hdfs_fs, cold[::2]), ("ramgrid", miss_fs, cold[1::2])):
            it = iter(files)
            st = summary(timed(lambda fs=fs, it=it: fs.cat_file(next(it)), len(files) - 1))
            lines.append(f"| {name} | {st[0]:.3f} | {st[1]:.3f} | {st[2]:.3f} |")
            print(lines[-1], flush=True)
        lines.append("")

        hdfs_fs.makedirs("/bench/small", exist_ok=True)
        paths = [f"/bench/small/s{i:05d}.txt" for i in range(args.small_files)]
        for i, p in enumerate(paths):
            hdfs_fs.pipe_file(p, f"file {i}\n".encode() * 20)
        jobs = {
            "uncached": lambda: hdfs.filesystem(),
            "ramgrid": lambda: CachedFileSystem(hdfs.filesystem(), grid, skip_instance_cache=True, table="bench_dask"),
        }
        lines += [
            f"Dask, 2 worker processes, {args.small_files} small files read twice (pass 2: each file by the other worker)",
            "",
            "| system | pass 1 s | pass 2 s | pass 2 blocks from grid | pass 2 blocks from HDFS |",
            "|---|---|---|---|---|",
        ]
        for name, make in jobs.items():
            (t1, _c1), (t2, c2) = dask_job(make, paths)
            lines.append(f"| {name} | {t1:.2f} | {t2:.2f} | {c2.get('block_grid', '-')} | {c2.get('block_fs', '-')} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
