"""Models fitted in place on a grid table: every pass over the data runs on the servers that hold it (`ramgrid.ops`),
and only partial sums cross the network. The interface follows scikit-learn's (`fit`, `predict`, `coef_`, `n_iter_`).

Rows are f32vec values. `LogisticRegression` reads a `("f32vec", d + 1)` table whose last component is the 0/1
label; `KMeans` reads the first `components` components of each vector (all by default). Each fit pins one version
of the table when it starts and reads only that version, so a table switched during a fit does not mix two datasets.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ramgrid.grid import PinnedTable, Table

__all__ = ["KMeans", "LogisticRegression"]


def _pinned(table: Table | PinnedTable) -> PinnedTable:
    if isinstance(table, PinnedTable):
        return table
    if isinstance(table, Table):
        return table.pin()
    raise TypeError(f"fit takes a ramgrid Table or PinnedTable, not {type(table).__name__}")


def _vector_dim(pin: PinnedTable) -> int:
    d = pin.table().describe()
    if d.get("value_type") != "f32vec":
        raise TypeError(f"table {pin.name!r} holds {d.get('value_type')} values; these models read f32vec rows")
    return int(d["dim"])


class LogisticRegression:
    """Binary logistic regression with an L2 penalty, fitted on a grid table.

    Minimises, like scikit-learn's `LogisticRegression(C=C)`, `mean log-loss + |coef|^2 / (2 C n)` (the intercept
    is not penalised; `C=inf` or `penalty=None`: none). Each objective evaluation is one pushed-down pass
    (`lr_gradient`) over a pinned version. `solver="lbfgs"` uses scipy's L-BFGS-B with scikit-learn's settings;
    `solver="gd"` is plain gradient descent with a fixed `learning_rate` and needs nothing beyond numpy.
    """

    def __init__(
        self,
        C: float = 1.0,
        penalty: str | None = "l2",
        solver: str = "lbfgs",
        max_iter: int = 100,
        tol: float = 1e-4,
        learning_rate: float = 1.0,
        verbose: bool = False,
    ) -> None:
        if penalty not in ("l2", None):
            raise ValueError(f"penalty must be 'l2' or None, not {penalty!r}")
        if solver not in ("lbfgs", "gd"):
            raise ValueError(f"solver must be 'lbfgs' or 'gd', not {solver!r}")
        if not C > 0:
            raise ValueError(f"C must be > 0, not {C}")
        self.C = C
        self.penalty = penalty
        self.solver = solver
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.learning_rate = float(learning_rate)
        self.verbose = verbose

    def _objective(self, pin: PinnedTable, n_rows: int, d: int) -> Any:
        penalise = self.penalty == "l2" and math.isfinite(self.C)
        self.passes_ = 0

        def f(w: np.ndarray) -> tuple[float, np.ndarray]:
            loss, grad, rows = pin.lr_gradient(w)
            self.passes_ += 1
            if rows != n_rows:
                raise RuntimeError(f"a pass read {rows} rows of the pinned version, the first read {n_rows}")
            loss, grad = loss / n_rows, grad / n_rows
            if penalise:
                coef = w[:d]
                loss += float(coef @ coef) / (2.0 * self.C * n_rows)
                grad[:d] += coef / (self.C * n_rows)
            if self.verbose:
                print(f"pass {self.passes_}: loss {loss:.6g} |grad| {np.linalg.norm(grad):.3g}")
            return loss, grad

        return f

    def fit(self, table: Table | PinnedTable) -> LogisticRegression:
        """Fits on every row of `table` (its current version, pinned now, or the given PinnedTable)."""
        pin = _pinned(table)
        dim = _vector_dim(pin)
        if dim < 2:
            raise ValueError("rows need at least one feature and the label")
        d = dim - 1
        started = time.perf_counter()
        w0 = np.zeros(dim)
        _, _, n_rows = pin.lr_gradient(w0)
        if n_rows == 0:
            raise ValueError(f"table {pin.name!r} version {pin.version} has no rows")
        f = self._objective(pin, n_rows, d)
        if self.solver == "lbfgs":
            from scipy.optimize import minimize

            res = minimize(
                f,
                w0,
                method="L-BFGS-B",
                jac=True,
                options={"maxiter": self.max_iter, "maxls": 50, "gtol": self.tol, "ftol": 64 * np.finfo(float).eps},
            )
            w, n_iter, self.loss_ = res.x, int(res.nit), float(res.fun)
        else:
            w, n_iter = w0, 0
            for n_iter in range(1, self.max_iter + 1):
                self.loss_, grad = f(w)
                if np.max(np.abs(grad)) <= self.tol:
                    break
                w = w - self.learning_rate * grad
        self.coef_ = w[:d].reshape(1, d)
        self.intercept_ = np.array([w[d]])
        self.classes_ = np.array([0, 1])
        self.n_iter_ = np.array([n_iter])
        self.n_features_in_ = d
        self.n_rows_ = n_rows
        self.version_ = pin.version
        self.fit_seconds_ = time.perf_counter() - started
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        x = np.asarray(X, dtype=np.float64)
        scores: np.ndarray = x @ self.coef_[0] + self.intercept_[0]
        return scores

    def predict_proba(self, X: Any) -> np.ndarray:
        """`(n, 2)`: the probabilities of label 0 and label 1."""
        p1 = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1.0 - p1, p1])

    def predict(self, X: Any) -> np.ndarray:
        return (self.decision_function(X) > 0).astype(np.int64)

    def score(self, X: Any, y: Any) -> float:
        """Accuracy on `(X, y)`."""
        return float(np.mean(self.predict(X) == np.asarray(y)))


def _kmeans_pp(sample: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur and Vassilvitskii) on `sample`, with scikit-learn's 2 + log k local trials."""
    n = sample.shape[0]
    trials = 2 + int(math.log(k))
    centers = np.empty((k, sample.shape[1]))
    centers[0] = sample[rng.integers(n)]
    closest = ((sample - centers[0]) ** 2).sum(axis=1)
    for c in range(1, k):
        total = closest.sum()
        if total <= 0:
            centers[c:] = sample[rng.integers(n, size=k - c)]
            break
        cand = np.searchsorted(np.cumsum(closest), rng.random(trials) * total).clip(max=n - 1)
        dist = ((sample[None, :, :] - sample[cand][:, None, :]) ** 2).sum(axis=2)
        pots = np.minimum(closest[None, :], dist).sum(axis=1)
        best = int(np.argmin(pots))
        centers[c] = sample[cand[best]]
        closest = np.minimum(closest, dist[best])
    return centers


class KMeans:
    """Lloyd's k-means on a grid table: each iteration is one pushed-down pass (`kmeans_step`) that returns, per
    centroid, the count and sum of the rows nearest to it.

    `init`: a `(k, components)` array, or "k-means++" over a sample of up to `sample_size` rows read with
    `scan()`. Stops when the centroids move less (squared, summed) than `tol` times the mean per-component variance
    of the sample, as scikit-learn does, or after `max_iter` passes. A cluster left empty keeps its centroid.
    """

    def __init__(
        self,
        n_clusters: int = 8,
        init: Any = "k-means++",
        max_iter: int = 300,
        tol: float = 1e-4,
        components: int | None = None,
        sample_size: int = 20_000,
        random_state: int | None = None,
    ) -> None:
        if n_clusters < 1:
            raise ValueError(f"n_clusters must be >= 1, not {n_clusters}")
        self.n_clusters = int(n_clusters)
        self.init = init
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.components = components
        self.sample_size = int(sample_size)
        self.random_state = random_state

    def _sample(self, pin: PinnedTable, comps: int) -> np.ndarray:
        rows: list[np.ndarray] = []
        got = 0
        for _keys, values in pin.scan():  # partitions are hash-spread, so the first chunks are a fair sample
            rows.append(np.asarray(values, dtype=np.float64)[:, :comps])
            got += rows[-1].shape[0]
            if got >= self.sample_size:
                break
        if got == 0:
            raise ValueError(f"table {pin.name!r} version {pin.version} has no rows")
        return np.concatenate(rows)[: self.sample_size]

    def fit(self, table: Table | PinnedTable) -> KMeans:
        pin = _pinned(table)
        dim = _vector_dim(pin)
        comps = dim if self.components is None else int(self.components)
        if not 1 <= comps <= dim:
            raise ValueError(f"components must be in 1..{dim}, not {comps}")
        rng = np.random.default_rng(self.random_state)
        started = time.perf_counter()
        if isinstance(self.init, str):
            if self.init != "k-means++":
                raise ValueError(f"init must be 'k-means++' or an array, not {self.init!r}")
            sample = self._sample(pin, comps)
            centers = _kmeans_pp(sample, self.n_clusters, rng)
            scale = float(np.mean(np.var(sample, axis=0)))
        else:
            centers = np.array(self.init, dtype=np.float64)
            if centers.shape != (self.n_clusters, comps):
                raise ValueError(f"init has shape {centers.shape}, expected {(self.n_clusters, comps)}")
            scale = float(np.mean([pin.var(column=c) for c in range(comps)]))
        threshold = self.tol * scale
        n_iter = 0
        for n_iter in range(1, self.max_iter + 1):
            counts, sums, _ = pin.kmeans_step(centers)
            new = centers.copy()
            filled = counts > 0
            new[filled] = sums[filled] / counts[filled, None]
            shift = float(((new - centers) ** 2).sum())
            centers = new
            if shift <= threshold:
                break
        counts, _, inertia = pin.kmeans_step(centers)
        self.cluster_centers_ = centers
        self.inertia_ = inertia
        self.counts_ = counts
        self.n_iter_ = n_iter
        self.n_features_in_ = comps
        self.version_ = pin.version
        self.fit_seconds_ = time.perf_counter() - started
        return self

    def predict(self, X: Any) -> np.ndarray:
        """The index of the nearest centroid of each row of `X` (its first `components` columns)."""
        x = np.asarray(X, dtype=np.float64)[:, : self.n_features_in_]
        d = ((x[:, None, :] - self.cluster_centers_[None, :, :]) ** 2).sum(axis=2)
        return np.asarray(np.argmin(d, axis=1))
