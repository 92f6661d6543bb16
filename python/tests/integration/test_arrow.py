"""Tables out as Arrow (arrow.py) on real servers: `to_arrow`, `scan`/`filter(format="arrow")`, and the Arrow C
stream read by DuckDB, polars and pandas, checked against numpy over the values written."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# A PinnedTable whose partitions this process maps (docs/shared-memory.md) is read from the mappings: the same table
# as over TCP, with no scan at all.


def _shm_grid(shm_dir: Path, servers: int = 2) -> ramgrid.LocalGrid:
    return ramgrid.local(servers=servers, memory="128MiB", extra_args=["--shm-dir", str(shm_dir)])


N = 3000


def _sealed(g: ramgrid.Grid, name: str, value_type: Any, partitions: int = 8) -> tuple[ramgrid.Table, Any]:
    """A table of one sealed version: keys 0..N-1 but every third (int keys), and their values."""
    t = g.create_table(name, partitions=partitions, value_type=value_type)
    keys = np.array([k for k in range(N) if k % 3], dtype=np.int64)
    if value_type == "i64":
        vals: Any = keys * 7 - 100
    elif value_type == "f64":
        vals = np.where(keys % 11 == 0, np.nan, keys * 0.5)  # NaN travels as it is
    elif value_type == "bytes":
        vals = [bytes([k % 256]) * (k % 40) for k in keys.tolist()]  # some empty
    else:
        vals = np.arange(len(keys) * 3, dtype=np.float32).reshape(-1, 3)
    with t.new_version() as w:
        w.put_many(keys, vals)
    return t, dict(zip(keys.tolist(), vals.tolist() if isinstance(vals, np.ndarray) else vals, strict=True))


def _no_scans(p: ramgrid.PinnedTable) -> ramgrid.PinnedTable:
    """`p` with its TCP scans refused: what reads through them fails the test."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("scanned over TCP")

    p.scan = refused  # type: ignore[method-assign]
    p.filter = refused  # type: ignore[method-assign]
    return p


def _as_dict(at: pa.Table) -> dict[int, Any]:
    keys = np.concatenate([int_keys(c) for c in at.column("key").chunks]) if at.num_rows else np.array([], np.int64)
    return dict(zip(keys.tolist(), at.column("value").to_pylist(), strict=True))


def _equal(a: pa.Table, b: pa.Table) -> bool:
    """Same schema, rows and order (chunks aside), NaN equal to NaN."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        if pa.types.is_floating(x.type):
            if not np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True):
                return False
        elif not x.equals(y):
            return False
    return True


def _same_items(a: Any, b: Any) -> bool:
    """Equal dicts of values, NaN equal to NaN."""

    def nan(x: Any) -> bool:
        return isinstance(x, float) and math.isnan(x)

    return a.keys() == b.keys() and all(a[k] == b[k] or (nan(a[k]) and nan(b[k])) for k in a)


@pytest.mark.parametrize("value_type", ["f64", "i64", "bytes", ("f32vec", 3)])
def test_a_mapped_pinned_table_comes_out_from_shared_memory_equal_to_tcp(shm_dir: Path, value_type: Any) -> None:
    with _shm_grid(shm_dir) as g:
        t, want = _sealed(g, "t", value_type)
        local = _no_scans(t.pin(shared_memory=True))
        remote = t.pin(shared_memory=False)
        assert local.describe()["shared_memory"]["mapped"] == list(range(8))  # type: ignore[index]
        a, b = local.to_arrow(), remote.to_arrow()
        assert a.schema == b.schema == remote.arrow_schema()
        assert _equal(a, b)  # same rows in the same order: each partition in entry order, as its scan visits it
        assert _same_items(_as_dict(a), want)
        if value_type in ("f64", "i64"):
            first = a.column("value").chunks[0]
            assert not first.buffers()[1].is_mutable  # the mapped bytes themselves, read-only
            assert not first.to_numpy().flags.writeable
        # Batches of at most chunk_items rows, through the C stream too; only one column.
        batches = list(local.to_batches(chunk_items=500))
        assert all(bt.num_rows <= 500 for bt in batches) and _equal(pa.Table.from_batches(batches), b)
        assert _equal(pa.table(local), b)
        assert duckdb.sql("select count(*) from local").fetchall()[0][0] == len(want)
        assert _equal(local.to_arrow(columns=["value"]), b.select(["value"]))
        assert _equal(local.to_arrow(columns="key", threads=1), b.select(["key"]))
        # A where clause is tested on the mapped values: the servers' rows, in the same order.
        if value_type != "bytes":
            where: Any = (100, 200) if value_type in ("f64", "i64") else {"column": 1, "lo": 100, "hi": 200}
            sel = local.to_arrow(where=where)
            assert _equal(sel, remote.to_arrow(where=where)) and sel.num_rows > 0
            assert _equal(
                pa.Table.from_batches(list(local.to_batches(where=where, columns=["key"]))), sel.select(["key"])
            )
        # An empty table maps nothing, and comes out as over TCP.
        e = g.create_table("e", partitions=4, value_type=value_type)
        with e.new_version():
            pass
        pe = e.pin()
        assert pe.to_arrow().equals(e.pin(shared_memory=False).to_arrow()) and pe.to_arrow().num_rows == 0
        assert pe.to_arrow().schema == remote.arrow_schema()


def test_partitions_not_mapped_are_scanned_and_the_rest_read_in_place(
    shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ramgrid import _native

    with _shm_grid(shm_dir) as g:
        t, want = _sealed(g, "mixed", "i64")
        # One server's socket gone (as a server on another host): its partitions stay on TCP.
        host, port = g.addresses[1].rsplit(":", 1)
        (shm_dir / f"shm-{host}-{port}.sock").unlink()
        p = t.pin()
        mapped = p.describe()["shared_memory"]["mapped"]  # type: ignore[index]
        assert 0 < len(mapped) < 8
        remote = t.pin(shared_memory=False)
        want_all, want_sel = remote.to_arrow(), remote.to_arrow(where=(0, 5000))
        scanned: list[Any] = []
        native_scan = _native.scan

        def scan(*args: Any, **kwargs: Any) -> Any:
            scanned.append(kwargs.get("partitions", args[7] if len(args) > 7 else None))
            return native_scan(*args, **kwargs)

        monkeypatch.setattr(_native, "scan", scan)
        unmapped = [(q, q + 1) for q in range(8) if q not in mapped]
        assert _equal(p.to_arrow(), want_all)
        assert sorted(scanned) == unmapped
        scanned.clear()
        assert _equal(pa.Table.from_batches(list(p.to_batches(chunk_items=100))), want_all)
        assert sorted(scanned) == unmapped
        scanned.clear()
        assert _equal(p.to_arrow(where=(0, 5000)), want_sel) and 0 < want_sel.num_rows < len(want)
        assert sorted(scanned) == unmapped
        assert _same_items(_as_dict(p.to_arrow()), want)


def test_a_table_out_of_the_mapping_outlives_its_pin_and_a_detach_falls_back_to_tcp(shm_dir: Path) -> None:
    import gc

    with _shm_grid(shm_dir, servers=1) as g:
        t, want = _sealed(g, "held", "f64")
        p = t.pin(shared_memory=True)
        at = p.to_arrow()
        # The last pin of the version collected: the version is detached, but the table's buffers hold the mapping.
        del p
        gc.collect()
        assert g.client_stats()["shm_attached"] == 0
        assert _same_items(_as_dict(at), want)
        # Detached under a pinned handle: to_arrow and to_batches read over TCP, the same table.
        p = t.pin(shared_memory=True)
        c = g._client()
        assert c.shm_detach("held", p.version, p.incarnation)
        assert _equal(p.to_arrow(), t.pin(shared_memory=False).to_arrow())
        assert _same_items(_as_dict(pa.Table.from_batches(list(p.to_batches()))), want)
        # ... and once the version is dropped, the server's clear error.
        with t.new_version() as w:
            w.put_many([1], np.array([1.0]))
        t.drop_version(p.version)
        with pytest.raises(ramgrid.exceptions.VersionNotFound):
            p.to_arrow()
        with pytest.raises(ramgrid.exceptions.VersionNotFound):
            list(p.to_batches())


def test_a_server_restarted_while_mapped_leaves_the_table_its_version(shm_dir: Path) -> None:
    with _shm_grid(shm_dir, servers=1) as g:
        t, want = _sealed(g, "restarted", "bytes")
        p = t.pin(shared_memory=True)
        g.restart(0)
        # The new server has no such table (memory durability): the mapping still holds the pinned version, as
        # lookups through it do (docs/shared-memory.md, rule 5)...
        assert _same_items(_as_dict(p.to_arrow()), want)
        # ...until it is detached: then the server says the table is gone.
        assert g._client().shm_detach("restarted", p.version, p.incarnation)
        with pytest.raises(ramgrid.exceptions.RamgridError, match="restarted"):
            p.to_arrow()


def test_shm_columns_refuses_buffers_it_cannot_write_alone(shm_dir: Path) -> None:
    from ramgrid import _native

    with _shm_grid(shm_dir, servers=1) as g:
        t, _ = _sealed(g, "alloc", "bytes", partitions=2)
        p = t.pin(shared_memory=True)
        c = g._client()
        one = pa.allocate_buffer(1 << 20)
        for bad, why in ((lambda n: one, "overlapping"), (lambda n: b"\0" * n, "writable"), (lambda n: 5, "writable")):
            with pytest.raises(ValueError, match=why):
                _native.shm_columns(c, "alloc", p.version, p.incarnation, [0, 1], bad)
        # Not attached (the current version, 0): None, nothing read.
        assert _native.shm_columns(c, "alloc", 0, 0, [0, 1], pa.allocate_buffer) is None
        # A partition beyond the table's: not mapped.
        rows = _native.shm_columns(c, "alloc", p.version, p.incarnation, [1, 7], pa.allocate_buffer)
        assert rows is not None and rows[0] is not None and rows[1] is None


def test_a_forked_child_reads_over_its_own_client(shm_dir: Path) -> None:
    with _shm_grid(shm_dir, servers=1) as g:
        t, want = _sealed(g, "forked", "i64")
        p = t.pin(shared_memory=True)
        at = p.to_arrow()
        pid = os.fork()
        if pid == 0:  # the child: a client of its own, which maps nothing: over TCP, the same table
            code = 1
            try:
                code = 0 if _equal(p.to_arrow(), at) and _same_items(_as_dict(at), want) else 1
            finally:
                os._exit(code)  # never back into pytest, whatever happened
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _equal(_no_scans(p).to_arrow(), at)


def test_where_is_tested_on_the_mapped_values_as_the_servers_test_it(shm_dir: Path) -> None:
    with _shm_grid(shm_dir, servers=1) as g:
        f = g.create_table("wf", partitions=4, value_type="f64")
        fv = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1.0, 1.5, 2.0, 5e-324, -1.0])
        i = g.create_table("wi", partitions=4, value_type="i64")
        iv = np.array([2**53, 2**53 + 1, 2**53 + 2, -(2**63), 2**63 - 1, 0, 7], dtype=np.int64)
        v = g.create_table("wv", partitions=4, value_type=("f32vec", 2))
        vv = np.array([[0, np.nan], [1, 1e30], [2, -1], [3, 0.5]], dtype=np.float32)
        for t, vals in ((f, fv), (i, iv), (v, vv)):
            with t.new_version() as w:
                w.put_many(np.arange(len(vals), dtype=np.int64), vals)
        cases: list[tuple[ramgrid.Table, Any]] = [
            (f, (0.0, 2.0)),
            (f, (None, None)),
            (f, (-np.inf, 0)),
            (f, (1.5, 1.5)),
            (f, {"lo": 0.0}),
            (i, (2**53 + 1, None)),  # the bound and the values as float64, as the servers compare them
            (i, (None, 2**53 + 2)),
            (i, (-(2**63), 0)),
            (v, {"column": 1, "lo": -1, "hi": 1}),
            (v, {"column": 1, "hi": np.inf}),
            (v, {"column": 0, "lo": 3}),
        ]
        for t, where in cases:
            local = _no_scans(t.pin(shared_memory=True))
            want = t.pin(shared_memory=False).to_arrow(where=where)
            assert _equal(local.to_arrow(where=where), want), (t.name, where)
            assert _equal(pa.Table.from_batches(list(local.to_batches(where=where)), schema=want.schema), want)
        # A predicate that does not fit the table goes to the servers, which refuse it as over TCP.
        b = g.create_table("wb", partitions=2, value_type="bytes")
        with b.new_version() as w:
            w.put_many([1], [b"x"])
        for t, where in ((v, {"column": 2}), (i, {"column": 1}), (b, (0, 1))):
            with pytest.raises((ValueError, ramgrid.exceptions.RamgridError)) as over_tcp:
                t.pin(shared_memory=False).to_arrow(where=where)
            with pytest.raises((ValueError, ramgrid.exceptions.RamgridError)) as mapped:
                t.pin(shared_memory=True).to_arrow(where=where)
            assert type(mapped.value) is type(over_tcp.value) and str(mapped.value) == str(over_tcp.value)
