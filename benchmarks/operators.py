"""Operators at the data (issue 10): ns per object per server for count and sum with a predicate, the
logistic-regression gradient and an empty table's answer, beside the peers measured in the same run:

- a streaming read of the same bytes in this process (numpy's sum over the array: the memory-bandwidth bound);
- the same computation by numpy in this process on the same rows (the gradient: X @ w, sigmoid, X.T @ err);
- RAMCloud's published figures (235 ns/object for count, 1014 ns/object for the LR gradient, a 350 ms floor);
- a whole LogisticRegression fit on KDD Cup 99 against scikit-learn's lbfgs (when --kdd is given).

One server process with one worker thread holds every table, so ns/object is per server (and per core).

    .venv/bin/python benchmarks/operators.py --out benchmarks/results/operators.txt \
        --kdd ../shared/data/kddcup99-10percent.csv.gz
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import ramgrid
from ramgrid.datasets import load_kdd99, put_labelled_rows, standardize

LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def best(f: Callable[[], Any], rounds: int) -> float:
    """The fastest of `rounds` runs, in seconds (the least disturbed by the other tenants of the machine)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def load(table: Any, values: np.ndarray, chunk: int = 200_000) -> None:
    for lo in range(0, values.shape[0], chunk):
        hi = min(lo + chunk, values.shape[0])
        table.put_many(np.arange(lo, hi, dtype=np.int64), values[lo:hi])


def row(what: str, seconds: float, n: int, peer: float | None = None, peer_name: str = "") -> None:
    ratio = f"  {seconds / peer:5.2f}x {peer_name}" if peer else ""
    say(f"{what:<46} {seconds * 1e3:9.2f} ms {seconds * 1e9 / n:8.2f} ns/object{ratio}")


EDGES = np.linspace(-4.0, 4.0, 17)


def aggregates(table: Any, n: int, stream: float, rounds: int) -> None:
    """Every aggregate over `table` (n f64 values), with and without a predicate, beside the streaming read."""
    where = (0.0, 1.0)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("count(where=(0, 1))", lambda: table.count(where=where)),
        ("sum()", lambda: table.sum()),
        ("sum(where=(0, 1))", lambda: table.sum(where=where)),
        ("stats() (count..var)", lambda: table.stats()),
        ("stats(where=(0, 1))", lambda: table.stats(where=where)),
        ("histogram(16 bins)", lambda: table.histogram(EDGES)),
        ("histogram(16 bins, where=(0, 1))", lambda: table.histogram(EDGES, where=where)),
        ("top_k(10)", lambda: table.top_k(10)),
        ("top_k(10, where=(0, 1))", lambda: table.top_k(10, where=where)),
    ]
    for name, call in calls:
        row(f"{name} at the server", best(call, rounds), n, stream, "the streaming read")


def numpy_gradient(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    z = x @ w[:-1] + w[-1]
    p = 1.0 / (1.0 + np.exp(-z))
    loss = float(np.sum(np.logaddexp(0.0, z) - y * z))
    err = (p - y).astype(np.float32)
    return loss, np.append(x.T @ err, err.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scalars", type=int, default=10_000_000, help="f64 values (default 10 M)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="1 KB rows, 256 floats (default 1 M)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kdd", type=Path, help="kddcup99-10percent.csv.gz for the whole-fit comparison")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    gib = (args.scalars * 40 + args.rows * 1100) / 2**30 + 1
    say(f"# {' '.join(sys.argv)}")
    say(f"# one server, one worker thread (then two); best of {args.rounds}; {time.strftime('%Y-%m-%d %H:%M')}")
    with ramgrid.local(servers=1, memory=f"{int(gib * 1024)}MiB", threads=1) as grid:
        xs = rng.normal(0.0, 1.0, args.scalars)
        scalars = grid.create_table("scalars", partitions=64, value_type="f64")
        load(scalars, xs)
        empty = grid.create_table("empty", partitions=64, value_type="f64")
        n = args.scalars
        say(f"\n## {n:,} f64 values")
        stream = best(lambda: xs.sum(), args.rounds)
        row("streaming read (numpy sum, this process)", stream, n)
        row("numpy count of 0 <= v < 1 (this process)", best(lambda: ((xs >= 0) & (xs < 1)).sum(), args.rounds), n)
        row("numpy histogram, 16 bins (this process)", best(lambda: np.histogram(xs, EDGES), args.rounds), n)
        aggregates(scalars, n, stream, args.rounds)
        t_empty = best(lambda: empty.count(), args.rounds * 4)
        say(f"{'empty table count() beside them':<46} {t_empty * 1e3:9.3f} ms  (RAMCloud: a 350 ms floor)")

        d = 256
        m = args.rows
        x = rng.normal(size=(m, d - 1)).astype(np.float32)
        w_true = rng.normal(size=d - 1)
        y = (x @ w_true + rng.normal(size=m) > 0).astype(np.float32)
        rows = grid.create_table("rows", partitions=64, value_type=("f32vec", d))
        put_labelled_rows(rows, x, y)
        say(f"\n## {m:,} rows of {d} f32 (1 KB each)")
        flat = np.concatenate([x, y[:, None]], axis=1)
        stream = best(lambda: flat.sum(), args.rounds)
        row("streaming read (numpy sum, this process)", stream, m)
        row(
            "count(where component 0 >= 0) at the server",
            best(lambda: rows.count(where={"column": 0, "lo": 0.0}), args.rounds),
            m,
            stream,
            "the streaming read",
        )
        row(
            "sum(column 0) at the server",
            best(lambda: rows.sum(column=0), args.rounds),
            m,
            stream,
            "the streaming read",
        )
        w = rng.normal(scale=0.01, size=d)
        t_np = best(lambda: numpy_gradient(x, y, w), args.rounds)
        row("numpy LR gradient+loss (this process)", t_np, m)
        t_lr = best(lambda: rows.lr_gradient(w), args.rounds)
        row("lr_gradient at the server", t_lr, m, stream, "the streaming read")
        say(f"{'':<46} {t_lr / t_np:9.2f}x numpy's; RAMCloud 1014 ns/object: {1014 / (t_lr * 1e9 / m):.1f}x faster")
        loss_np, g_np = numpy_gradient(x, y, w)
        loss, g, _ = rows.lr_gradient(w)
        say(
            f"{'':<46} agreement: loss rel. diff {abs(loss - loss_np) / abs(loss_np):.1e}, "
            f"gradient max rel. diff {np.abs(g - g_np).max() / np.abs(g_np).max():.1e}"
        )

        if args.kdd:
            from ramgrid.ml import LogisticRegression
            from sklearn.linear_model import LogisticRegression as SkLogisticRegression

            kx, ky = load_kdd99(args.kdd)
            kx = standardize(kx).astype(np.float32)
            kdd = grid.create_table("kdd", partitions=64, value_type=("f32vec", kx.shape[1] + 1))
            put_labelled_rows(kdd, kx, ky)
            say(f"\n## LogisticRegression fit on KDD Cup 99: {kx.shape[0]:,} rows, {kx.shape[1]} features")
            x64 = kx.astype(np.float64)
            t0 = time.perf_counter()
            ref = SkLogisticRegression(C=1.0, max_iter=200).fit(x64, ky)
            t_sk = time.perf_counter() - t0
            ours = LogisticRegression(C=1.0, max_iter=200).fit(kdd)
            say(
                f"{'scikit-learn lbfgs (this process)':<46} {t_sk:9.3f} s  accuracy {ref.score(x64, ky):.5f} "
                f"iterations {ref.n_iter_[0]}"
            )
            say(
                f"{'ramgrid.ml.LogisticRegression (at the server)':<46} {ours.fit_seconds_:9.3f} s  accuracy "
                f"{ours.score(x64, ky):.5f} iterations {ours.n_iter_[0]} passes {ours.passes_}  "
                f"{t_sk / ours.fit_seconds_:.2f}x scikit-learn's speed"
            )

    # The same aggregates on a server with 2 worker threads: one call's partitions run side by side.
    with ramgrid.local(servers=1, memory=f"{int(args.scalars * 40 / 2**20) + 512}MiB", threads=2) as grid:
        scalars = grid.create_table("scalars", partitions=64, value_type="f64")
        load(scalars, xs)
        say(f"\n## {n:,} f64 values, one server with 2 worker threads")
        stream = best(lambda: xs.sum(), args.rounds)
        row("streaming read (numpy sum, this process)", stream, n)
        aggregates(scalars, n, stream, args.rounds)
    if args.out:
        args.out.write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
