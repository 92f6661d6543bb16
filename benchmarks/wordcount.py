"""Word count of the Wikipedia corpus: ramgrid MapReduce (1, 2, 4 servers) against the multiprocessing floor, Dask
bag, Dask dataframe, PySpark local and Hadoop's LocalJobRunner, in one run, on the same plain-text input and the
same tokeniser (`str.split()`; the Hadoop mapper splits on exactly the characters `str.isspace()` accepts).

    .venv/bin/python benchmarks/wordcount.py --limit-mb 64 --out benchmarks/results/wordcount.md

The corpus is gzip; a gzip file cannot be split, so the first `--limit-mb` MiB of its text (all of it with 0) are
written to a plain file first (not timed), which every engine then reads in byte ranges of `--chunk-mib`. Every
engine's counts are checked equal to the floor's. PySpark (`local[--procs]`) and Hadoop (scripts/hadoop, jars
fetched with Maven on first use) run only when pyspark, java, javac and mvn are there; otherwise the report says
why they were skipped (benchmarks/_peers.py).
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shlex
import sys
import tempfile
import time
from collections import Counter
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import _peers

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "enwiki-2015-sentences.txt.gz"


def stage(src: Path, dest: Path, limit_mb: int) -> int:
    """Writes the first `limit_mb` MiB of `src`'s text (whole lines) to `dest`; returns its size."""
    limit = limit_mb << 20 if limit_mb else 1 << 62
    n = 0
    with gzip.open(src, "rb") as f, open(dest, "wb") as out:
        for line in f:
            if n + len(line) > limit:
                break
            out.write(line)
            n += len(line)
    return n


def _count_range(args: tuple[str, int, int]) -> Counter[str]:
    from ramgrid.splits import iter_range

    path, start, end = args
    c: Counter[str] = Counter()
    for piece, _ in iter_range(path, start, end, 8 << 20):
        c.update(piece.decode("utf-8", errors="replace").split())
    return c


def floor(path: Path, chunk: int, procs: int) -> tuple[dict[str, int], dict[str, float]]:
    """Each process counts its byte ranges with the same tokeniser; the parent merges the Counters."""
    from ramgrid.splits import plan_splits

    t0 = time.perf_counter()
    tasks = [(t.path, t.start, t.end) for t in plan_splits(path, chunk_bytes=chunk)]
    total: Counter[str] = Counter()
    with get_context("fork").Pool(procs) as pool:
        parts = pool.map(_count_range, tasks)
    t_map = time.perf_counter() - t0
    for c in parts:
        total.update(c)
    return dict(total), {"map": t_map, "merge": time.perf_counter() - t0 - t_map}


def dask_bag(path: Path, chunk: int, client: Any) -> tuple[dict[str, int], dict[str, float]]:
    import dask.bag as db

    t0 = time.perf_counter()
    freq = db.read_text(str(path), blocksize=chunk, encoding="utf-8", errors="replace").str.split().flatten()
    out = dict(freq.frequencies().compute())
    return out, {"total": time.perf_counter() - t0}


def dask_dataframe(path: Path, chunk: int, client: Any) -> tuple[dict[str, int], dict[str, float]]:
    import csv

    import dask.dataframe as dd

    t0 = time.perf_counter()
    df = dd.read_csv(
        str(path),
        sep="\x01",
        header=None,
        names=["line"],
        blocksize=chunk,
        quoting=csv.QUOTE_NONE,
        dtype=str,
        encoding="utf-8",
        encoding_errors="replace",
        skip_blank_lines=True,
        keep_default_na=False,
        na_filter=False,
    )
    counts = df.line.str.split().explode().dropna().value_counts().compute()
    return {str(k): int(v) for k, v in counts.items()}, {"total": time.perf_counter() - t0}


def ramgrid_mr(path: Path, chunk: int, client: Any, servers: int) -> tuple[dict[str, int], dict[str, float], Any]:
    import ramgrid
    from ramgrid import mapreduce
    from ramgrid.mapreduce.wordcount import count_block

    with ramgrid.local(servers=servers, memory="2GiB") as grid:
        t0 = time.perf_counter()
        res = mapreduce.run(
            grid, path, count_block, "sum", vectorised=True, chunk_bytes=chunk, dask_client=client, progress=False
        )
        total = time.perf_counter() - t0
    phases = dict(res.summary.phases)
    phases["total"] = total
    return res.result, phases, res.summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=str(CORPUS))
    p.add_argument("--limit-mb", type=int, default=64, help="MiB of text to count (0 = the whole corpus)")
    p.add_argument("--chunk-mib", type=int, default=16, help="bytes per map task")
    p.add_argument("--procs", type=int, default=os.cpu_count() or 2, help="worker processes for every engine")
    p.add_argument("--servers", default="1,2,4", help="ramgrid cluster sizes")
    p.add_argument(
        "--engines", default="bag,dataframe,ramgrid,spark,hadoop", help="which besides the floor (default: all)"
    )
    p.add_argument("--out", help="write the report (markdown) here")
    args = p.parse_args()

    from dask.distributed import Client, LocalCluster

    chunk = args.chunk_mib << 20
    rows: list[tuple[str, float, str, str]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="wordcount-") as tmp:
        text = Path(tmp) / "corpus.txt"
        size = stage(Path(args.input), text, args.limit_mb)
        print(f"staged {size / 2**20:.0f} MiB of text", file=sys.stderr)

        ref, ph = floor(text, chunk, args.procs)
        rows.append(("multiprocessing floor", ph["map"] + ph["merge"], _fmt(ph), "-"))
        print(rows[-1], file=sys.stderr)
        tokens = sum(ref.values())

        engines = set(args.engines.split(","))
        with (
            LocalCluster(
                n_workers=args.procs, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
            ) as cluster,
            Client(cluster) as client,
        ):
            for key, name, fn in (
                ("bag", "Dask bag (read_text, frequencies)", dask_bag),
                ("dataframe", "Dask dataframe", dask_dataframe),
            ):
                if key not in engines:
                    skipped.append(f"{name}: not run (--engines)")
                    continue
                got, ph = fn(text, chunk, client)
                _check(name, got, ref)
                rows.append((name, ph["total"], "-", "-"))
                print(rows[-1], file=sys.stderr)
            for n in [int(x) for x in args.servers.split(",") if x] if "ramgrid" in engines else []:
                got, ph, summary = ramgrid_mr(text, chunk, client, n)
                _check(f"ramgrid {n}", got, ref)
                shuffled = f"{summary.bytes_shuffled / 2**20:.1f} MiB ({summary.pairs_combined:,} pairs)"
                rows.append((f"ramgrid MapReduce, {n} server(s)", ph["total"], _fmt(ph), shuffled))
                print(rows[-1], file=sys.stderr)
        for key, name in (
            ("spark", f"PySpark local[{args.procs}] (RDD, reduceByKey)"),
            ("hadoop", "Hadoop LocalJobRunner"),
        ):
            if key not in engines:
                skipped.append(f"{name}: not run (--engines)")
                continue
            try:
                if key == "spark":
                    got, ph = _peers.spark_local(text, chunk, args.procs)
                else:
                    got, ph = _peers.hadoop_local(text, chunk, args.procs, Path(tmp))
            except _peers.Skipped as e:
                skipped.append(f"{name}: skipped ({e})")
                continue
            _check(name, got, ref)
            counted = {k: v for k, v in ph.items() if "not counted" not in k}
            rows.append((name, sum(counted.values()), _fmt(ph), "-"))
            print(rows[-1], file=sys.stderr)

    base = rows[0][1]
    lines = [
        "# Word count: ramgrid MapReduce against the multiprocessing floor, Dask, PySpark and Hadoop",
        "",
        f"Command: `{shlex.join([sys.executable.split('/')[-1], *sys.argv])}`",
        "",
        (
            f"Input: the first {size / 2**20:.0f} MiB of `{Path(args.input).name}` staged as plain text, "
            f"{tokens:,} tokens, {len(ref):,} distinct; {args.chunk_mib} MiB per task, {args.procs} worker processes "
            f"for every engine, on {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}). "
            "Every engine's counts equal the floor's."
        ),
        "",
        "| engine | seconds | vs floor | phases (s) | shuffled |",
        "|---|---:|---:|---|---|",
    ]
    lines += [f"| {n} | {t:.2f} | {t / base:.2f}x | {ph} | {sh} |" for n, t, ph, sh in rows]
    lines += ["", *[f"- {s}" for s in skipped], ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


def _fmt(ph: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in ph.items() if k != "total")


def _check(name: str, got: dict[str, int], ref: dict[str, int]) -> None:
    if got != ref:
        diff = sum(1 for k in set(got) | set(ref) if got.get(k) != ref.get(k))
        raise SystemExit(f"{name}: counts differ from the floor's for {diff} words")


if __name__ == "__main__":
    sys.exit(main())
