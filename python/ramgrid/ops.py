"""Operators run by the servers where the data lives: count, sum, min, max, mean, var, histogram, and the
logistic-regression and k-means steps `ramgrid.ml` builds on.

Each call runs one operator over every partition of one version of the table (the current one for a `Table`, the
pinned one for a `PinnedTable`); each server answers one partial result per partition it holds, and the client merges
them. The result is exact or the call raises: a partition whose server changed hands or epoch during its pass is asked
again, and partitions no replica could answer raise `PartitionsUnavailable` naming them (docs/operators.md).
Values are read from the typed columns on the servers; nothing but the partials crosses the network.

A predicate `where` selects values `lo <= v < hi` of one column: `(lo, hi)` (either may be None for unbounded),
`{"column": c, "lo": lo, "hi": hi}`, or a `Where`. On an f32vec table `column` names the vector component.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np

if TYPE_CHECKING:
    from ramgrid._native import Client

__all__ = ["Stats", "Where"]


@dataclass(frozen=True)
class Where:
    """Selects the values `lo <= v < hi` of one column (a vector component for f32vec tables)."""

    lo: float = -math.inf
    hi: float = math.inf
    column: int = 0


WhereLike = Union[Where, tuple[Any, Any], dict[str, Any], None]


def _where(where: WhereLike) -> tuple[int, float, float] | None:
    if where is None:
        return None
    if isinstance(where, Where):
        w = where
    elif isinstance(where, dict):
        unknown = set(where) - {"lo", "hi", "column"}
        if unknown:
            raise ValueError(f"where: unknown keys {sorted(unknown)} (lo, hi, column)")
        w = Where(
            -math.inf if where.get("lo") is None else float(where["lo"]),
            math.inf if where.get("hi") is None else float(where["hi"]),
            int(where.get("column", 0)),
        )
    elif isinstance(where, (tuple, list)) and len(where) == 2:
        lo, hi = where
        w = Where(-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))
    else:
        raise ValueError(f"where must be (lo, hi), a dict or a Where (selects lo <= value < hi), not {where!r}")
    if math.isnan(w.lo) or math.isnan(w.hi):
        raise ValueError("where: a bound is NaN")
    if w.column < 0:
        raise ValueError(f"where: column {w.column} is negative")
    return (w.column, w.lo, w.hi)


@dataclass(frozen=True)
class Stats:
    """Summary statistics of one column over a whole table version (population variance unless `ddof` is given)."""

    count: int
    sum: float
    min: float
    max: float
    mean: float
    m2: float
    version: int

    def var(self, ddof: int = 0) -> float:
        """Variance with `ddof` delta degrees of freedom, as numpy's (nan when count <= ddof)."""
        return self.m2 / (self.count - ddof) if self.count > ddof else math.nan

    def std(self, ddof: int = 0) -> float:
        return math.sqrt(self.var(ddof))


class _Operators:
    """Operator methods of `Table` and `PinnedTable` (see the module)."""

    name: str
    _read_version: int
    _read_incarnation: int

    if TYPE_CHECKING:

        def _client(self) -> Client: ...  # the handle classes' (`_Reader._client`)

    def _run(self, op: str, **params: Any) -> dict[str, Any]:
        from ramgrid._native import run_op

        result: dict[str, Any] = run_op(
            self._client(), self.name, self._read_version, self._read_incarnation, op, **params
        )
        return result

    def count(self, where: WhereLike = None) -> int:
        """Items in the table version, or those whose value satisfies `where`."""
        return int(self._run("count", predicate=_where(where))["count"])

    def stats(self, column: int = 0, where: WhereLike = None) -> Stats:
        """Count, sum, min, max, mean and squared deviations of one numeric column in one pass (partials merged
        with Chan et al.'s update, so the variance does not cancel). Empty: count 0, min +inf, max -inf."""
        r = self._run("stats", column=int(column), predicate=_where(where))
        return Stats(
            int(r["count"]), r["sum"], r["min"], r["max"], r["mean"] if r["count"] else math.nan, r["m2"], r["version"]
        )

    def sum(self, column: int = 0, where: WhereLike = None) -> float:
        return self.stats(column, where).sum

    def min(self, column: int = 0, where: WhereLike = None) -> float:
        """The smallest value (nan when nothing is selected)."""
        s = self.stats(column, where)
        return s.min if s.count else math.nan

    def max(self, column: int = 0, where: WhereLike = None) -> float:
        """The largest value (nan when nothing is selected)."""
        s = self.stats(column, where)
        return s.max if s.count else math.nan

    def mean(self, column: int = 0, where: WhereLike = None) -> float:
        return self.stats(column, where).mean

    def var(self, column: int = 0, where: WhereLike = None, ddof: int = 0) -> float:
        return self.stats(column, where).var(ddof)

    def std(self, column: int = 0, where: WhereLike = None, ddof: int = 0) -> float:
        return self.stats(column, where).std(ddof)

    def histogram(
        self,
        bins: Any = 10,
        range: tuple[float, float] | None = None,
        column: int = 0,
        where: WhereLike = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(counts, edges)` as `numpy.histogram`: `bins` is the edges (strictly increasing) or a number of equal
        bins over `range` (default: the column's min and max, found by one more pass). Bins are half-open
        `[e_i, e_i+1)` except the last, which includes its right edge; values outside the edges are not counted."""
        if np.ndim(bins) == 0:
            n = int(bins)
            if n < 1:
                raise ValueError(f"bins must be >= 1, not {n}")
            if range is None:
                s = self.stats(column, where)
                lo, hi = (0.0, 1.0) if s.count == 0 else (s.min, s.max)
            else:
                lo, hi = float(range[0]), float(range[1])
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise ValueError(f"histogram range must be finite with lo <= hi, not ({lo}, {hi})")
            if lo == hi:
                lo, hi = lo - 0.5, hi + 0.5
            edges = np.linspace(lo, hi, n + 1)
        else:
            edges = np.asarray(bins, dtype=np.float64)
        r = self._run("histogram", column=int(column), predicate=_where(where), edges=edges.tolist())
        return np.asarray(r["counts"], dtype=np.int64), edges

    def lr_gradient(self, weights: Any, l2: float = 0.0) -> tuple[float, np.ndarray, int]:
        """`(loss, gradient, rows)`: the summed logistic loss and its gradient over every row of an f32vec table
        whose last component is the 0/1 label; `weights` are the coefficients then the intercept. `l2` adds
        `l2/2 * |coef|^2` once (not on the intercept). What `ramgrid.ml.LogisticRegression` iterates on."""
        w = np.asarray(weights, dtype=np.float64).ravel()
        r = self._run("lr_gradient", weights=w.tolist(), l2=float(l2))
        return float(r["loss"]), np.asarray(r["gradient"]), int(r["rows"])

    def kmeans_step(self, centroids: Any) -> tuple[np.ndarray, np.ndarray, float]:
        """`(counts, sums, inertia)` of one Lloyd step over an f32vec table: per centroid (rows of `centroids`, over
        the first `centroids.shape[1]` components) the rows nearest to it and their sum, and the summed squared
        distance of every row to its nearest centroid."""
        c = np.asarray(centroids, dtype=np.float64)
        if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] < 1:
            raise ValueError(f"centroids must be a (k, components) array, not shape {c.shape}")
        r = self._run("kmeans_step", components=int(c.shape[1]), centroids=c.ravel().tolist())
        k, d = c.shape
        return np.asarray(r["counts"]), np.asarray(r["sums"]).reshape(k, d), float(r["inertia"])
