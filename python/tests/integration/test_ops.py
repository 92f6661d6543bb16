"""Operators run by the servers (`ramgrid.ops`) against numpy on the same data, over several partition counts and
replication factors, on real server processes; bad input refused with a clear error; a killed replica."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid import _native
from ramgrid.ops import Where

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("partitions", "replication", "seed"), [(1, 1, 0), (7, 2, 1), (64, 3, 2)])
def test_scalar_operators_match_numpy(
    grid3: ramgrid.LocalGrid, table_name: str, partitions: int, replication: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20_000))
    xs = rng.normal(1e3, 250.0, n)
    t = grid3.create_table(table_name, partitions=partitions, replication=replication, value_type="f64")
    t.put_many(np.arange(n, dtype=np.int64), xs)
    assert t.count() == n
    lo, hi = np.quantile(xs, [0.2, 0.7])
    sel = xs[(xs >= lo) & (xs < hi)]
    assert t.count(where=(lo, hi)) == sel.size
    assert t.count(where=Where(lo=lo)) == int((xs >= lo).sum())
    assert t.count(where={"hi": hi}) == int((xs < hi).sum())
    s = t.stats(where=(lo, hi))
    assert s.count == sel.size and s.min == sel.min() and s.max == sel.max()
    assert math.isclose(s.sum, sel.sum(), rel_tol=1e-12)
    assert math.isclose(s.mean, sel.mean(), rel_tol=1e-12)
    assert math.isclose(s.var(), sel.var(), rel_tol=1e-9) and math.isclose(s.var(ddof=1), sel.var(ddof=1), rel_tol=1e-9)
    assert math.isclose(t.std(), xs.std(), rel_tol=1e-9)
    assert t.min() == xs.min() and t.max() == xs.max() and math.isclose(t.sum(), xs.sum(), rel_tol=1e-12)
    edges = np.array([-np.inf, 500.0, 900.0, 1000.0, 1100.0, np.inf])[1:-1]
    counts, got_edges = t.histogram(edges)
    np.testing.assert_array_equal(counts, np.histogram(xs, edges)[0])
    np.testing.assert_array_equal(got_edges, edges)
    counts, even = t.histogram(17)
    ref, ref_edges = np.histogram(xs, 17)
    np.testing.assert_allclose(even, ref_edges)
    np.testing.assert_array_equal(counts, ref)
    counts, _ = t.histogram(5, range=(900.0, 1100.0), where=(950.0, None))
    np.testing.assert_array_equal(counts, np.histogram(xs[xs >= 950.0], 5, range=(900.0, 1100.0))[0])


def test_i64_and_vector_columns(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    rng = np.random.default_rng(7)
    ints = rng.integers(-(2**40), 2**40, 3000)
    ti = grid3.create_table(table_name, partitions=16, value_type="i64")
    ti.put_many(np.arange(ints.size, dtype=np.int64), ints)
    assert ti.sum() == float(ints.sum()) and ti.min() == ints.min() and ti.count(where=(0, None)) == (ints >= 0).sum()
    rows = rng.normal(size=(4000, 6)).astype(np.float32)
    tv = grid3.create_table(table_name + "_v", partitions=16, replication=2, value_type=("f32vec", 6))
    tv.put_many(np.arange(rows.shape[0], dtype=np.int64), rows)
    col = rows[:, 4].astype(np.float64)
    assert math.isclose(tv.mean(column=4), col.mean(), rel_tol=1e-9, abs_tol=1e-12)
    assert tv.count(where=Where(lo=0.5, column=2)) == int((rows[:, 2] >= 0.5).sum())
    s = tv.stats(column=1, where={"column": 3, "lo": -1.0, "hi": 1.0})
    m = (rows[:, 3] >= -1.0) & (rows[:, 3] < 1.0)
    assert s.count == int(m.sum()) and math.isclose(s.sum, float(rows[m, 1].astype(np.float64).sum()), rel_tol=1e-9)
    # A pinned version answers for that version after the table moves on.
    pin = tv.pin()
    with tv.new_version() as v:
        v.put_many(np.arange(10, dtype=np.int64), rows[:10])
    assert tv.count() == 10 and pin.count() == rows.shape[0]
    assert pin.stats(column=4).version == pin.version


def test_empty_tables_and_nothing_selected(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, value_type="f64")
    assert t.count() == 0
    assert math.isnan(t.mean()) and math.isnan(t.min()) and math.isnan(t.var())
    assert t.histogram([0.0, 1.0])[0].tolist() == [0]
    t.put_many([1, 2], np.array([1.0, 2.0]))
    assert t.count(where=(5.0, 6.0)) == 0 and math.isnan(t.max(where=(5.0, 6.0)))


def test_bad_operators_are_refused_and_change_nothing(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=4, value_type="f64")
    t.put_many([1, 2, 3], np.array([1.0, 2.0, 3.0]))
    b = grid3.create_table(table_name + "_b", partitions=4, value_type="bytes")
    b.put("k", b"v")
    v = grid3.create_table(table_name + "_v", partitions=4, value_type=("f32vec", 3))
    v.put_many([1], np.ones((1, 3), dtype=np.float32))
    cases = [
        (lambda: t.histogram([1.0, 1.0, 2.0]), "increase strictly"),
        (lambda: t.histogram([0.0, np.nan]), "finite"),
        (lambda: t.lr_gradient([0.0, 0.0]), "f32vec"),
        (lambda: v.lr_gradient([0.0, 0.0]), "2 weights"),
        (lambda: v.lr_gradient([0.0, np.nan, 0.0]), "finite"),
        (lambda: v.lr_gradient([0.0, np.inf, 0.0]), "finite"),
        (lambda: v.count(where=Where(column=3)), "component 3"),
        (lambda: t.count(where=Where(column=1)), "component 1"),
        (lambda: b.sum(), "bytes"),
        (lambda: v.kmeans_step(np.zeros((2, 4))), "4 components"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):  # the servers' BAD_REQUEST is an invalid argument
            call()
    with pytest.raises(ValueError, match="unknown operator"):
        _native.run_op(t._client(), t.name, 0, 0, "median")
    with pytest.raises(ValueError, match="NaN"):
        t.count(where=(np.nan, 1.0))
    assert t.count() == 3 and t.sum() == 6.0 and b.get("k") == b"v"


def test_operators_fail_over_to_a_live_replica() -> None:
    with ramgrid.local(servers=3, memory="64MiB") as g:
        t = g.create_table("fo", partitions=32, replication=2, value_type="f64")
        xs = np.arange(50_000, dtype=np.float64)
        t.put_many(np.arange(xs.size, dtype=np.int64), xs)
        pin = t.pin()
        g.kill(1)
        for _ in range(3):  # every replica choice of the spread rule meets the dead server once
            assert pin.count() == xs.size and pin.sum() == xs.sum()


def test_operators_during_writes_see_whole_values(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    """A writer overwrites every value with one of two constants; a sum of a partition is one moment of it, so the
    total is always a combination of whole values."""
    import threading

    t = grid3.create_table(table_name, partitions=8, value_type="i64")
    n = 20_000
    keys = np.arange(n, dtype=np.int64)
    t.put_many(keys, np.ones(n, dtype=np.int64))
    stop = threading.Event()

    def write() -> None:
        flip = 0
        while not stop.is_set():
            flip ^= 1
            t.put_many(keys, np.full(n, 1 + 999 * flip, dtype=np.int64))

    th = threading.Thread(target=write)
    th.start()
    try:
        for _ in range(30):
            s = t.stats()
            assert s.count == n and s.min in (1, 1000) and s.max in (1, 1000)
            assert (s.sum - n) % 999 == 0
    finally:
        stop.set()
        th.join(10)
