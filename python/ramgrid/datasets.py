"""Readers for the public datasets the examples, tests and benchmarks of `ramgrid.ml` use, and a loader that puts
`(X, y)` into an f32vec table in the layout the models read (features, then the 0/1 label as the last component).

The files are not shipped: pass their path (the project's tests look in `../shared/data`). `synthetic_classification`
makes a dataset from numpy alone, for machines without them.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["load_kdd99", "load_skin", "put_labelled_rows", "standardize", "synthetic_classification"]


def load_kdd99(path: str | Path, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """KDD Cup 1999 (10 % sample): the 38 numeric features as float64 and the label 1 for an attack, 0 for
    `normal.` (the 3 categorical columns are dropped)."""
    x: list[list[float]] = []
    y: list[int] = []
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.rstrip().split(",")
            if len(parts) != 42:
                raise ValueError(f"{path}: line {len(x) + 1} has {len(parts)} fields, expected 42")
            x.append([float(v) for i, v in enumerate(parts[:41]) if i not in (1, 2, 3)])
            y.append(0 if parts[41] == "normal." else 1)
            if rows is not None and len(x) >= rows:
                break
    return np.array(x), np.array(y, dtype=np.int64)


def load_skin(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """UCI Skin Segmentation: B, G, R as float64 and the label 1 for skin, 0 for non-skin."""
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, dtype=np.float64)
    return data[:, :3], (data[:, 3] == 1).astype(np.int64)


def standardize(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance per column (constant columns stay 0)."""
    sd = x.std(axis=0)
    out: np.ndarray = (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    return out


def synthetic_classification(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` rows of `d` standard-normal features labelled by a noisy linear rule (about 90 % separable)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = (x @ w + 0.5 + rng.normal(scale=0.5 * np.linalg.norm(w), size=n) > 0).astype(np.int64)
    return x, y


def put_labelled_rows(table: Any, x: np.ndarray, y: np.ndarray, chunk: int = 100_000) -> None:
    """Writes row `i` as key `i` with the value `(x[i], y[i])` in float32 to an f32vec table of dim `d + 1`."""
    rows = np.empty((x.shape[0], x.shape[1] + 1), dtype=np.float32)
    rows[:, :-1] = x
    rows[:, -1] = y
    for start in range(0, rows.shape[0], chunk):
        end = min(start + chunk, rows.shape[0])
        table.put_many(np.arange(start, end, dtype=np.int64), rows[start:end])
