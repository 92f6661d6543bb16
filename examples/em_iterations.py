"""EM for a Gaussian mixture where the parameters live in the grid: every iteration's map tasks read the PINNED
current version, and the driver writes the next parameters as a NEW VERSION that becomes current all at once.

    python examples/em_iterations.py                      # UCI skin segmentation (../shared/data) if present
    python examples/em_iterations.py --synthetic --rows 500000 --iterations 20
    python examples/em_iterations.py --interfere          # also commit a decoy version while each iteration runs

Each iteration: the driver pins version v (the parameters of iteration t), the Dask tasks compute the E-step's
sufficient statistics over their chunk of the data (reading the parameters from the grid through the pinned handle,
and reporting the version and iteration tag they read), the driver sums them, runs the M-step and commits version
v+1. With --interfere the driver commits a decoy version of NaN parameters right after pinning, before the tasks
run: tasks that read "the current version" would see the decoy, pinned ones never do, and the result is unchanged.
The run is compared with a plain numpy implementation of the same EM on the whole data set.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ramgrid

REPO_ROOT = Path(__file__).resolve().parents[1]
SKIN_PATH = REPO_ROOT.parent / "shared" / "data" / "uci-skin-segmentation.tsv.gz"
VAR_FLOOR = 1e-6  # keeps a component from collapsing onto one point


# ---------------------------------------------------------------------------------------------------------------
# parameters <-> the flat vector stored in the grid (key i -> float64), plus the iteration tag


def pack(w: np.ndarray, mu: np.ndarray, var: np.ndarray, iteration: int) -> np.ndarray:
    return np.concatenate([w, mu.ravel(), var.ravel(), [float(iteration)]])


def unpack(theta: np.ndarray, k: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    w = theta[:k]
    mu = theta[k : k + k * d].reshape(k, d)
    var = theta[k + k * d : k + 2 * k * d].reshape(k, d)
    return w, mu, var, int(theta[-1])


def n_params(k: int, d: int) -> int:
    return k + 2 * k * d + 1


def _log_joint(x: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """log(w_k) + log N(x | mu_k, diag var_k) for every row and component: shape (n, k)."""
    d = x.shape[1]
    diff2 = (x[:, None, :] - mu[None, :, :]) ** 2 / var[None, :, :]
    return np.log(w)[None, :] - 0.5 * (d * np.log(2 * np.pi) + np.log(var).sum(axis=1)[None, :] + diff2.sum(axis=2))


def _logsumexp(a: np.ndarray) -> np.ndarray:
    m = a.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(a - m).sum(axis=1, keepdims=True)))[:, 0]


# ---------------------------------------------------------------------------------------------------------------
# the map task and the driver's M-step


def e_step(chunk: np.ndarray, params: ramgrid.PinnedTable, k: int) -> dict[str, Any]:
    """A map task: read the pinned parameters from the grid, return this chunk's sufficient statistics."""
    d = chunk.shape[1]
    theta = params.get_many(np.arange(n_params(k, d), dtype=np.int64))
    w, mu, var, tag = unpack(theta, k, d)
    lj = _log_joint(chunk, w, mu, var)
    norm = _logsumexp(lj)
    r = np.exp(lj - norm[:, None])
    return {
        "version": params.version,  # the version this task was handed
        "tag": tag,  # the iteration whose parameters it actually read
        "n": r.sum(axis=0),
        "s1": r.T @ chunk,
        "s2": r.T @ (chunk * chunk),
        "loglik": float(norm.sum()),
        "rows": len(chunk),
    }


def m_step(stats: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    n = sum(s["n"] for s in stats)
    s1 = sum(s["s1"] for s in stats)
    s2 = sum(s["s2"] for s in stats)
    rows = sum(s["rows"] for s in stats)
    mu = s1 / n[:, None]
    var = np.maximum(s2 / n[:, None] - mu * mu, VAR_FLOOR)
    return n / rows, mu, var, float(sum(s["loglik"] for s in stats))


def initial_params(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mu = x[rng.choice(len(x), size=k, replace=False)].copy()
    var = np.tile(x.var(axis=0) + VAR_FLOOR, (k, 1))
    return np.full(k, 1.0 / k), mu, var


def reference_em(x: np.ndarray, k: int, iterations: int, seed: int) -> dict[str, Any]:
    """The same EM in plain numpy over the whole data set, with textbook (two-pass) variance updates."""
    w, mu, var = initial_params(x, k, seed)
    logliks = []
    for _ in range(iterations):
        lj = _log_joint(x, w, mu, var)
        norm = _logsumexp(lj)
        logliks.append(float(norm.sum()))
        r = np.exp(lj - norm[:, None])
        nk = r.sum(axis=0)
        mu = (r.T @ x) / nk[:, None]
        var = np.maximum(
            np.stack([(r[:, j, None] * (x - mu[j]) ** 2).sum(axis=0) / nk[j] for j in range(k)]), VAR_FLOOR
        )
        w = nk / len(x)
    return {"w": w, "mu": mu, "var": var, "logliks": logliks}


# ---------------------------------------------------------------------------------------------------------------
# data


def load_skin(path: Path, rows: int | None) -> np.ndarray:
    """B, G, R of the UCI skin segmentation data, scaled to [0, 1] (the label column is not used)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = np.loadtxt(f, dtype=np.float64, usecols=(0, 1, 2), max_rows=rows)
    return data / 255.0


def synthetic(rows: int, seed: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = np.array([[0.2, 0.3, 0.4], [0.7, 0.6, 0.5], [0.4, 0.8, 0.2]])
    scales = np.array([[0.05, 0.08, 0.04], [0.1, 0.05, 0.07], [0.06, 0.06, 0.1]])
    comp = rng.choice(3, size=rows, p=[0.5, 0.3, 0.2])
    return means[comp] + rng.standard_normal((rows, 3)) * scales[comp]


# ---------------------------------------------------------------------------------------------------------------


class _Engine:
    """Runs the map step on a Dask LocalCluster (data chunks scattered once) or on a local Dask scheduler."""

    def __init__(self, args: argparse.Namespace, chunks: list[np.ndarray], stack: contextlib.ExitStack) -> None:
        self.scheduler = args.scheduler
        self.client: Any = None
        self.chunks: list[Any] = chunks
        if args.scheduler == "distributed":
            from distributed import Client, LocalCluster

            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=args.workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address="127.0.0.1:0",
                    scheduler_kwargs={"dashboard": False},
                )
            )
            self.client = stack.enter_context(Client(cluster))
            self.chunks = self.client.scatter(chunks)  # the data stays on the workers across iterations

    def map(self, params: ramgrid.PinnedTable, k: int) -> list[dict[str, Any]]:
        if self.client is not None:
            futures = [self.client.submit(e_step, c, params, k, pure=False) for c in self.chunks]
            return list(self.client.gather(futures))
        import dask

        tasks = [dask.delayed(e_step)(c, params, k) for c in self.chunks]
        return list(dask.compute(*tasks, scheduler=self.scheduler))


def run(
    grid: ramgrid.Grid,
    x: np.ndarray,
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    log: Any = print,
) -> dict[str, Any]:
    k, d = args.components, x.shape[1]
    chunks = np.array_split(x, args.chunks)
    engine = _Engine(args, chunks, stack)
    table = grid.create_table("em_params", partitions=4, value_type="f64", exist_ok=False)
    keys = np.arange(n_params(k, d), dtype=np.int64)
    w, mu, var = initial_params(x, k, args.seed)
    with table.new_version() as v:
        v.put_many(keys, pack(w, mu, var, 0))
    table.drop_version(1)  # the empty version a new table opens with
    history: list[dict[str, Any]] = []
    log(f"{'iter':>4} {'version':>7} {'log-likelihood':>16} {'change':>12} {'seconds':>8}")
    for it in range(args.iterations):
        t0 = time.perf_counter()
        pinned = table.pin()
        decoy = None
        if args.interfere:
            with table.new_version() as dv:  # what a careless concurrent writer would do
                dv.put_many(keys, np.full(len(keys), np.nan))
            decoy = dv.version
        stats = engine.map(pinned, k)
        w, mu, var, loglik = m_step(stats)
        with table.new_version() as nv:
            nv.put_many(keys, pack(w, mu, var, it + 1))
        # Versions nobody reads any more: the one this iteration read and the decoy.
        for old in (pinned.version, decoy):
            if old is not None:
                table.drop_version(old)
        change = loglik - history[-1]["loglik"] if history else float("nan")
        history.append(
            {
                "iteration": it,
                "version": pinned.version,
                "versions_read": sorted({s["version"] for s in stats}),
                "tags_read": sorted({s["tag"] for s in stats}),
                "decoy": decoy,
                "loglik": loglik,
            }
        )
        log(f"{it:>4} {pinned.version:>7} {loglik:>16.6f} {change:>12.6f} {time.perf_counter() - t0:>8.3f}")
    final = unpack(table.get_many(keys), k, d)
    return {"w": final[0], "mu": final[1], "var": final[2], "tag": final[3], "history": history}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help=f"B G R label TSV[.gz] (default: {SKIN_PATH} when present)")
    p.add_argument("--synthetic", action="store_true", help="use generated 3-D data even if the UCI data is present")
    p.add_argument("--rows", type=int, help="rows to use (default: all of the UCI data, 200,000 generated)")
    p.add_argument("--components", type=int, default=3, help="mixture components (default 3)")
    p.add_argument("--iterations", type=int, default=10, help="EM iterations (default 10)")
    p.add_argument("--chunks", type=int, default=8, help="map tasks per iteration (default 8)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--interfere", action="store_true", help="commit a decoy version while each iteration runs")
    p.add_argument("--servers", type=int, default=2, help="ramgrid servers (default 2)")
    p.add_argument("--workers", type=int, default=2, help="Dask worker processes (default 2)")
    p.add_argument("--scheduler", choices=("distributed", "threads", "sync"), default="distributed")
    args = p.parse_args(argv)

    data = args.data if args.data is not None else (SKIN_PATH if SKIN_PATH.exists() and not args.synthetic else None)
    if data is not None:
        if not data.exists():
            p.error(f"--data {data}: no such file")
        x = load_skin(data, args.rows)
        name = f"{data.name} ({len(x):,} rows, B/G/R scaled to [0, 1])"
    else:
        print("no UCI skin data found (or --synthetic): using generated data", file=sys.stderr)
        x = synthetic(args.rows or 200_000)
        name = f"generated 3-component data ({len(x):,} rows)"
    print(
        f"em_iterations: {args.components}-component diagonal Gaussian mixture on {name}, "
        f"{args.iterations} iterations, {args.chunks} map tasks each, Dask scheduler {args.scheduler}"
        + (", with a decoy version committed during every iteration" if args.interfere else "")
    )

    with ramgrid.local(servers=args.servers, memory="64MiB") as grid, contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        result = run(grid, x, args, stack)
        seconds = time.perf_counter() - t0
    ref = reference_em(x, args.components, args.iterations, args.seed)
    diffs = {
        name: float(np.max(np.abs(result[name] - ref[name]) / np.maximum(np.abs(ref[name]), 1e-12)))
        for name in ("w", "mu", "var")
    }
    ll_diff = max(abs(h["loglik"] - r) / abs(r) for h, r in zip(result["history"], ref["logliks"]))
    lls = [h["loglik"] for h in result["history"]]
    print(f"  log-likelihood {lls[0]:.4f} -> {lls[-1]:.4f} over {len(lls)} iterations in {seconds:.2f} s")
    print(
        "  largest relative difference from the numpy reference: "
        + ", ".join(f"{n} {v:.2e}" for n, v in diffs.items())
        + f", log-likelihood {ll_diff:.2e}"
    )
    pinned_ok = all(
        h["versions_read"] == [h["version"]] and h["tags_read"] == [h["iteration"]] for h in result["history"]
    )
    print(f"  every task read exactly its iteration's pinned version: {'yes' if pinned_ok else 'NO'}")
    result.update(
        {"reference": ref, "relative_diffs": diffs, "loglik_diff": ll_diff, "pinned_ok": pinned_ok, "seconds": seconds}
    )
    return result


if __name__ == "__main__":
    res = main()
    ok = res["pinned_ok"] and max(res["relative_diffs"].values()) < 1e-6
    sys.exit(0 if ok else 1)
