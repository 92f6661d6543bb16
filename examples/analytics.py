"""ramgrid analytics: count, statistics, a histogram, a logistic regression and k-means computed by the servers
where the data lives, each checked against numpy or scikit-learn on the same rows.

    pip install ".[ml]" scikit-learn   # from the repository root (builds the Rust core with maturin)
    python examples/analytics.py                                   # synthetic rows, made with numpy
    python examples/analytics.py --kdd ../shared/data/kddcup99-10percent.csv.gz   # KDD Cup 99, normal vs attack

Only partial results cross the network: per partition a count, a sum, a gradient; the rows stay on the servers.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import ramgrid
from ramgrid.datasets import load_kdd99, put_labelled_rows, standardize, synthetic_classification
from ramgrid.ml import KMeans, LogisticRegression


def timed(what: str, f, *args, **kwargs):
    t0 = time.perf_counter()
    out = f(*args, **kwargs)
    print(f"  {what:<34} {1e3 * (time.perf_counter() - t0):8.1f} ms")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kdd", type=Path, help="kddcup99-10percent.csv.gz (else synthetic rows)")
    parser.add_argument("--rows", type=int, default=200_000, help="rows to use (default 200,000)")
    parser.add_argument("--servers", type=int, default=3)
    args = parser.parse_args()

    if args.kdd:
        x, y = load_kdd99(args.kdd, rows=args.rows)
        x, source = standardize(x), f"KDD Cup 99 ({args.kdd.name})"
    else:
        x, y = synthetic_classification(args.rows, 10, seed=0)
        source = "synthetic (numpy)"
    x = x.astype(np.float32)
    print(f"{x.shape[0]:,} rows of {x.shape[1]} features, {y.mean():.1%} labelled 1: {source}")

    with ramgrid.local(servers=args.servers) as grid:
        # One f32vec row per key: the features, then the label as the last component.
        table = grid.create_table("rows", partitions=64, replication=2, value_type=("f32vec", x.shape[1] + 1))
        timed("load", put_labelled_rows, table, x, y)
        pin = table.pin()  # every pass below reads this version, whatever is written meanwhile

        print("at the servers:")
        n = timed("count()", pin.count)
        positives = timed("count(where label >= 0.5)", pin.count, where={"column": x.shape[1], "lo": 0.5})
        s = timed("stats(column=0)", pin.stats, column=0)
        counts, edges = timed("histogram(column=0, bins=8)", pin.histogram, 8, column=0)
        assert n == x.shape[0] and positives == int(y.sum())
        col = x[:, 0].astype(np.float64)
        assert np.isclose(s.mean, col.mean()) and np.isclose(s.std(), col.std())
        assert (counts == np.histogram(col, edges)[0]).all()
        print(f"  column 0: mean {s.mean:.4f} std {s.std():.4f} min {s.min:.3f} max {s.max:.3f} (numpy agrees)")
        print(f"  histogram: {counts.tolist()}")

        lr = timed("LogisticRegression().fit", LogisticRegression(C=1.0).fit, pin)
        km = timed("KMeans(4).fit (features only)", KMeans(4, components=x.shape[1], random_state=0).fit, pin)

    print("the same on this process, for comparison:")
    from sklearn.cluster import KMeans as SkKMeans
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression

    x64 = x.astype(np.float64)
    ref = timed("sklearn LogisticRegression().fit", SkLogisticRegression(C=1.0).fit, x64, y)
    init = km.cluster_centers_
    sk = timed("sklearn KMeans(4).fit (our init)", SkKMeans(4, init=init, n_init=1).fit, x64)
    print(f"logistic regression: accuracy {lr.score(x64, y):.4f} (scikit-learn {ref.score(x64, y):.4f}),")
    print(f"  largest coefficient gap {np.abs(lr.coef_ - ref.coef_).max():.2e}, {lr.n_iter_[0]} L-BFGS iterations")
    print(
        f"k-means: inertia {km.inertia_:.6g} (scikit-learn from the same start {sk.inertia_:.6g}), {km.n_iter_} passes"
    )


if __name__ == "__main__":
    main()
