"""put_many(merge=...): the server merges each value into the stored one under the partition's write lock, so
several processes adding to the same keys at once lose no update; bytes and vector tables refuse merges."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid

pytestmark = pytest.mark.timeout(90)

KEYS = 2000
ROUNDS = 20
WRITERS = 4


def _adder(grid: ramgrid.Grid, name: str, seed: int) -> None:
    t = grid.table(name)
    keys = np.arange(KEYS, dtype=np.int64)
    for r in range(ROUNDS):
        # Each writer adds (seed + 1) to every key per round, the keys in a different order each time.
        order = np.random.default_rng(seed * 1000 + r).permutation(keys)
        t.put_many(order, np.full(KEYS, seed + 1, dtype=np.int64), merge="add")


def test_concurrent_processes_add_exactly(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, replication=2, value_type="i64")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_adder, args=(grid3, table_name, s)) for s in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    want = ROUNDS * sum(s + 1 for s in range(WRITERS))
    got = t.get_many(np.arange(KEYS, dtype=np.int64))
    assert (got == want).all(), f"{int((got != want).sum())} keys wrong"


def test_min_max_and_f64_add(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=4, value_type="f64")
    t.put_many(["a", "b"], np.array([1.5, -2.0]), merge="add")
    t.put_many(["a", "a", "b"], np.array([0.25, 0.25, 1.0]), merge="add")  # a repeated key merges twice
    assert t.get_many(["a", "b"]).tolist() == [2.0, -1.0]
    t.put_many(["a", "b"], np.array([5.0, -3.0]), merge="min")
    assert t.get_many(["a", "b"]).tolist() == [2.0, -3.0]
    t.put_many(["a", "c"], np.array([7.0, 4.0]), merge="max")
    assert t.get_many(["a", "b", "c"]).tolist() == [7.0, -3.0, 4.0]


def test_an_i64_sum_that_would_overflow_is_refused_for_that_key(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=2, value_type="i64")
    t.put_many(["big", "small"], np.array([2**63 - 1, 1], dtype=np.int64))
    with pytest.raises(ramgrid.exceptions.BatchError) as e:
        t.put_many(["big", "small"], np.array([1, 1], dtype=np.int64), merge="add")
    assert [i for i, _ in e.value.failures] == [0]
    assert t.get_many(["big", "small"]).tolist() == [2**63 - 1, 2]


def test_merges_are_refused_on_bytes_and_vector_tables_and_change_nothing(
    grid3: ramgrid.LocalGrid, table_name: str
) -> None:
    b = grid3.create_table(table_name, partitions=2, value_type="bytes")
    b.put_many(["k"], [b"v"])
    with pytest.raises(ValueError, match="i64 or f64"):
        b.put_many(["k"], [b"w"], merge="add")
    assert b.get("k") == b"v"
    v = grid3.create_table(table_name + "_v", partitions=2, value_type=("f32vec", 2))
    with pytest.raises(ValueError, match="i64 or f64"):
        v.put_many(["k"], np.ones((1, 2), dtype=np.float32), merge="max")
    n = grid3.create_table(table_name + "_n", partitions=2, value_type="i64")
    with pytest.raises(ValueError, match="merge must be one of"):
        n.put_many(["k"], np.array([1]), merge="avg")
    assert "k" not in n
