"""A grid started by the Dask cluster (`ramgrid.dask.start`) against one started by the driver (`ramgrid.local`), on
the same Dask workers in one run (issue 27): the time from `start()` to a usable grid for 2 and 4 workers, a word
count, and the language-model steps of the reference experiment (count the model with MapReduce, load it into the
grid from the workers, score the corpus per partition).

    python benchmarks/dask_grid.py --limit-mb 8 --sentences 50000 --out benchmarks/results/dask_grid.md

Both grids have one server per worker process, on this machine (`per="worker"`). "usable" is `start()` returning
plus a first write and read from a task; `ramgrid.local` is timed the same way. Each job's result is checked equal
on both grids (the word counts, and every sentence's score).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wordcount import CORPUS as WIKI
from wordcount import stage

NEWS = Path(__file__).resolve().parents[2] / "shared" / "data" / "lm1b-heldout-news-sentences.txt.gz"


def _probe(name: str) -> float:
    """A task: one write and one read through the grid of the cluster it runs on."""
    import ramgrid.dask

    t = ramgrid.dask.get_grid().table(name)
    t.put_many(np.arange(10), np.arange(10.0))
    return float(t.get_many(np.arange(10)).sum())


def _probe_grid(grid: Any, name: str) -> float:
    t = grid.table(name)
    t.put_many(np.arange(10), np.arange(10.0))
    return float(t.get_many(np.arange(10)).sum())


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _lm(client: Any, grid: Any, corpus: Any) -> tuple[dict[str, float], np.ndarray]:
    from ramgrid.lm import Source, count_model, load_into_grid, run_scoring

    model, count_s = _timed(lambda: count_model(client, corpus, grid=grid))
    version, load_s = _timed(lambda: load_into_grid(client, grid, model, "lm", replication=1))
    pinned = grid.table("lm").pin(version, shared_memory=False)
    run, score_s = _timed(
        lambda: run_scoring(client, corpus, "per-partition", Source("ramgrid", model.unk_log_prob, table=pinned))
    )
    return {"count": count_s, "load": load_s, "score": score_s}, run.scores


def measure(workers: int, text: Path, corpus: Any, memory: str, repeat: int) -> list[dict[str, Any]]:
    import ramgrid
    import ramgrid.dask
    from distributed import Client, LocalCluster
    from ramgrid import mapreduce
    from ramgrid.mapreduce.wordcount import count_block

    rows: list[dict[str, Any]] = []
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        kinds = {
            "ramgrid.dask": lambda: ramgrid.dask.start(client, memory=memory, threads=1, per="worker"),
            "ramgrid.local": lambda: ramgrid.local(servers=workers, memory=memory, threads=1),
        }
        results: dict[str, Any] = {}
        for i in range(repeat):
            # Alternate which grid goes first: the second run finds the workers warm.
            for kind in sorted(kinds, reverse=bool(i % 2)):
                t0 = time.perf_counter()
                grid = kinds[kind]()
                started = time.perf_counter() - t0
                grid.create_table("probe", partitions=8, value_type="f64")
                if kind == "ramgrid.dask":
                    got = client.submit(_probe, "probe", pure=False).result()
                else:
                    got = client.submit(_probe_grid, grid, "probe", pure=False).result()
                usable = time.perf_counter() - t0
                assert got == 45.0
                wc, wc_s = _timed(
                    lambda g=grid: mapreduce.run(
                        g, text, count_block, "sum", vectorised=True, chunk_bytes=1 << 20, dask_client=client,
                        progress=False,
                    )
                )  # fmt: skip
                lm, scores = _lm(client, grid, corpus)
                results[kind] = (wc.result, scores)
                _, stop_s = _timed(
                    lambda g=grid, k=kind: ramgrid.dask.stop(client) if k == "ramgrid.dask" else g.close()
                )
                row = {"start_s": started, "usable_s": usable, "wordcount_s": wc_s, "stop_s": stop_s}
                row.update({f"lm_{k}_s": v for k, v in lm.items()})
                rows.append({"workers": workers, "grid": kind, **row})
            (wc_a, sc_a), (wc_b, sc_b) = results.values()
            same = wc_a == wc_b and np.array_equal(sc_a, sc_b)
            for r in rows[-2:]:
                r["same_results"] = same
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--limit-mb", type=int, default=8, help="MiB of the Wikipedia sentences to count (default 8)")
    ap.add_argument("--sentences", type=int, default=50_000, help="news sentences for the LM steps (default 50,000)")
    ap.add_argument("--memory", default="512MiB", help="table memory per server")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each grid per worker count; medians shown")
    ap.add_argument("--out", help="write the table here (markdown)")
    args = ap.parse_args()

    from ramgrid.lm import stage_corpus

    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "wiki.txt"
        size = stage(WIKI, text, args.limit_mb)
        news = Path(tmp) / "news.txt"
        with gzip.open(NEWS, "rt", encoding="utf-8", errors="replace") as f:
            news.write_text("".join(itertools.islice(f, args.sentences)), encoding="utf-8")
        corpus = stage_corpus(news, Path(tmp) / "staged")
        rows = [r for n in args.workers for r in measure(n, text, corpus, args.memory, args.repeat)]

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    lines = [
        "# The grid started by the Dask cluster beside the grid started by the driver",
        "",
        f"Command: `python {shlex.join(sys.argv)}` (commit {commit.stdout.strip() or '?'})",
        "",
        (
            f"Inputs: word count over {size / (1 << 20):.1f} MiB of `{WIKI.name}` (1 MiB tasks); LM steps over "
            f"{corpus.lines:,} sentences of `{NEWS.name}` (count with MapReduce, load from the workers, score per "
            "partition). One server per Dask worker process, all on this machine; each pair of rows ran on the same "
            "LocalCluster."
        ),
        "",
        "| workers | grid | start (s) | usable (s) | word count (s) | LM count / load / score (s) | stop (s) | same results |",
        "|---:|---|---:|---:|---:|---|---:|---|",
    ]
    for n in args.workers:
        for kind in ("ramgrid.dask", "ramgrid.local"):
            rs = [r for r in rows if r["workers"] == n and r["grid"] == kind]

            def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
                return float(np.median([r[key] for r in rs]))

            lines.append(
                f"| {n} | {kind} | {med('start_s'):.2f} | {med('usable_s'):.2f} | {med('wordcount_s'):.2f} | "
                f"{med('lm_count_s'):.2f} / {med('lm_load_s'):.2f} / {med('lm_score_s'):.2f} | {med('stop_s'):.2f} | "
                f"{all(r['same_results'] for r in rs)} |"
            )
    lines += ["", f"Medians of {args.repeat} runs of each; the two grids' runs alternate which goes first."]
    out = "\n".join(lines) + "\n"
    print(out)
    if args.out:
        Path(args.out).write_text(out)


if __name__ == "__main__":
    main()
