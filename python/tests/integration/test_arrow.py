"""Tables out as Arrow (arrow.py) on real servers: `to_arrow`, `scan`/`filter(format="arrow")`, and the Arrow C
stream read by DuckDB, polars and pandas, checked against numpy over the values written."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import ramgrid
from ramgrid.scan import int_keys


@pytest.fixture(scope="module")
def grid() -> Iterator[ramgrid.LocalGrid]:
    with ramgrid.local(servers=2) as g:
        yield g


@pytest.fixture(scope="module")
def f64(grid: ramgrid.LocalGrid) -> tuple[ramgrid.Table, np.ndarray]:
    t = grid.create_table("arrow_f64", value_type="f64", partitions=8)
    v = np.random.default_rng(7).normal(size=50_000)
    v[::1000] = np.inf  # infinities travel as they are
    t.put_many(np.arange(len(v), dtype=np.int64), v)
    return t, v


def test_to_arrow_is_the_table(f64: tuple[ramgrid.Table, np.ndarray]) -> None:
    t, v = f64
    at = t.to_arrow()
    assert at.schema == pa.schema(
        [pa.field("key", pa.large_binary(), nullable=False), pa.field("value", pa.float64(), nullable=False)]
    )
    assert at.num_rows == len(v)
    keys = np.concatenate([int_keys(c) for c in at.column("key").chunks])
    values = at.column("value").to_numpy()
    assert np.array_equal(values, v[keys])
    assert sorted(keys.tolist()) == list(range(len(v)))


def test_where_and_columns_select(f64: tuple[ramgrid.Table, np.ndarray]) -> None:
    t, v = f64
    sel = t.to_arrow(where=(-0.5, 0.5), columns=["value"])
    assert sel.column_names == ["value"]
    assert np.array_equal(np.sort(sel.column("value").to_numpy()), np.sort(v[(v >= -0.5) & (v < 0.5)]))
    assert t.to_arrow(where=(100, 200)).num_rows == 0
    assert t.to_arrow(columns="key").column_names == ["key"]
    for bad in (["value", "value"], ["nope"], []):
        with pytest.raises(ValueError, match="columns"):
            t.to_arrow(columns=bad)


def test_scan_and_filter_yield_record_batches(f64: tuple[ramgrid.Table, np.ndarray]) -> None:
    t, v = f64
    batches = list(t.scan(chunk_items=4096, format="arrow"))
    assert all(isinstance(b, pa.RecordBatch) and b.num_rows <= 4096 for b in batches)
    assert sum(b.num_rows for b in batches) == len(v)
    got = pa.Table.from_batches(list(t.filter((0, 1), format="arrow"))).column("value").to_numpy()
    assert np.array_equal(np.sort(got), np.sort(v[(v >= 0) & (v < 1)]))
    with pytest.raises(ValueError, match="format"):
        t.scan(format="pandas")


def test_duckdb_polars_and_pandas_read_the_table_object(f64: tuple[ramgrid.Table, np.ndarray]) -> None:
    t, v = f64
    finite = v[np.isfinite(v)]
    # DuckDB finds the Python variable `t` and reads it through __arrow_c_stream__.
    n, s, lo = duckdb.sql("select count(*), sum(value) filter (where isfinite(value)), min(value) from t").fetchall()[0]
    assert n == len(v) and s == pytest.approx(finite.sum(), rel=1e-12) and lo == v.min()
    df = pl.from_arrow(t.to_arrow())
    assert isinstance(df, pl.DataFrame)
    assert df.height == len(v)
    assert df.filter(pl.col("value") < 0).height == int((v < 0).sum())
    assert pa.table(t).to_pandas()["value"].sort_values().to_numpy().tolist() == np.sort(v).tolist()


def test_vector_bytes_empty_and_pinned_tables(grid: ramgrid.LocalGrid) -> None:
    vec = grid.create_table("arrow_vec", value_type=("f32vec", 3), partitions=4)
    rows = np.arange(30, dtype=np.float32).reshape(10, 3)
    vec.put_many(np.arange(10, dtype=np.int64), rows)
    at = vec.to_arrow()
    assert at.schema.field("value").type == pa.list_(pa.float32(), 3)
    keys = np.concatenate([int_keys(c) for c in at.column("key").chunks])
    got = np.stack(at.column("value").to_numpy(zero_copy_only=False))
    assert np.array_equal(got, rows[keys])
    assert duckdb.sql("select sum(value[2]) from vec").fetchall()[0][0] == rows[:, 1].sum()

    b = grid.create_table("arrow_bytes", value_type="bytes", partitions=2)
    b.put_many([b"a", b"bb", b"\x00"], [b"", b"two", b"x" * 10_000])
    assert dict(zip(*b.to_arrow().to_pydict().values(), strict=True)) == {
        b"a": b"",
        b"bb": b"two",
        b"\x00": b"x" * 10_000,
    }

    empty = grid.create_table("arrow_empty", value_type="i64")
    assert empty.to_arrow().num_rows == 0
    assert empty.to_arrow().schema.field("value").type == pa.int64()
    assert duckdb.sql("select count(*) from empty").fetchall()[0] == (0,)

    ver = grid.create_table("arrow_versions", value_type="i64", partitions=2)
    ver.put_many(np.arange(5, dtype=np.int64), np.arange(5, dtype=np.int64))
    pinned = ver.pin()
    with ver.new_version() as w:
        w.put_many(np.arange(3, dtype=np.int64), np.full(3, 7, dtype=np.int64))
    assert sorted(pinned.to_arrow().column("value").to_pylist()) == [0, 1, 2, 3, 4]
    assert sorted(ver.to_arrow().column("value").to_pylist()) == [7, 7, 7]
