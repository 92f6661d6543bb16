"""Tables of every value type on a 3-server embedded cluster: round trips with lists, numpy and pyarrow inputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import pyarrow as pa
import ramgrid
from ramgrid.exceptions import KeysNotFound, TableExists, TableNotFound

pytestmark = pytest.mark.timeout(60)


def test_f64_table_numpy_and_arrow(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=16, value_type="f64")
    keys = np.arange(5000, dtype=np.int64) * 7919
    vals = np.sqrt(keys.astype(np.float64))
    t.put_many(keys, vals)
    got = t.get_many(keys[::-1])
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    np.testing.assert_array_equal(got, vals[::-1])
    # The same items through pyarrow and through a list of Python ints.
    np.testing.assert_array_equal(t.get_many(pa.array(keys[:100])), vals[:100])
    np.testing.assert_array_equal(t.get_many(keys[:50].tolist()), vals[:50])
    assert t.get(int(keys[3])) == vals[3]
    # Keys at an unaligned address, as arrays unpickled from a message buffer can be.
    buf = bytearray(8 * 100 + 1)
    odd = np.frombuffer(buf, dtype=np.int64, offset=1, count=100)
    odd[:] = keys[:100]
    np.testing.assert_array_equal(t.get_many(odd), vals[:100])
    assert table_name in grid3.tables()


def test_numpy_integer_scalars_are_int_keys(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    # Iterating over a key array gives numpy scalars; each addresses the same item as the Python int.
    t = grid3.create_table(table_name, partitions=8, value_type="f64")
    keys = np.arange(100, dtype=np.int64) * 31
    t.put_many(keys, keys * 0.5)
    for k in keys[:5]:
        assert t.get(k) == t[int(k)] == float(k) * 0.5 and k in t
    assert t.get(np.int32(31)) == t.get(np.uint64(31)) == 15.5
    assert t.get_many([np.int16(62), 93, np.int64(124)]).tolist() == [31.0, 46.5, 62.0]
    t.put(np.int64(7), 3.5)
    t[np.uint8(8)] = 4.5
    assert t.get_many([7, 8]).tolist() == [3.5, 4.5]
    p = t.pin()
    assert p.get(np.int64(62)) == p[np.int32(62)] == 31.0 and np.int64(62) in p
    with pytest.raises(TypeError, match="keys must be str, bytes or int, not float"):
        t.get(np.float64(31.0))
    with pytest.raises(OverflowError):
        t.get(np.uint64(2**64 - 1))


def test_i64_table(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="i64")
    keys = np.array(["a", "bb", "ccc", "é"])
    t.put_many(keys, np.array([1, -2, 2**62, 0], dtype=np.int64))
    got = t.get_many(pa.array(["ccc", "a", "é"]))
    assert got.dtype == np.int64 and got.tolist() == [2**62, 1, 0]


def test_bytes_table_with_string_arrays(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="bytes")
    n = 2000
    keys = np.array([f"user:{i}" for i in range(n)])
    vals = [f"payload {i}".encode() * (i % 5) for i in range(n)]
    t.put_many(keys, vals)
    assert t.get_many(keys) == vals
    assert t.get_many(keys.astype("S")) == vals  # 'S' keys address the same items as 'U' keys
    assert t.get_many(pa.array(keys.tolist(), type=pa.large_string())) == vals
    assert t.get_many(pa.array([k.encode() for k in keys.tolist()], type=pa.binary())) == vals
    t["x"] = "text value"
    assert t["x"] == b"text value"


def test_f32vec_table(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type=("f32vec", 4), replication=2)
    keys = np.arange(300, dtype=np.int64)
    vals = np.random.default_rng(1).random((300, 4), dtype=np.float32)
    t.put_many(keys, vals)
    got = t.get_many(keys)
    assert got.dtype == np.float32 and got.shape == (300, 4)
    np.testing.assert_array_equal(got, vals)
    d = t.describe()
    assert d["value_type"] == "f32vec" and d["dim"] == 4 and d["replication"] == 2


def test_missing_keys_and_deletes(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="f64")
    t.put_many(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(KeysNotFound) as e:
        t.get_many(np.array([1, 42, 3]))
    assert e.value.indices == [1]
    v = t.get_many(np.array([1, 42]), default=-1.0)
    assert v.tolist() == [1.0, -1.0]
    assert t.delete_many(np.array([1, 2, 99])) == 2
    assert 1 not in t and 3 in t


def test_admin_errors(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    grid3.create_table(table_name)
    with pytest.raises(TableExists):
        grid3.create_table(table_name)
    assert grid3.create_table(table_name, exist_ok=True).name == table_name
    grid3.drop_table(table_name)
    assert table_name not in grid3.tables()
    with pytest.raises(TableNotFound):
        grid3.table(table_name).get_many([1])


def test_describe_counts_items_and_stats(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, replication=2, value_type="i64")
    t.put_many(np.arange(1000), np.arange(1000))
    d = t.describe()
    assert d["partitions"] == 8 and d["current_version"] == 1
    assert sum(v["items"] for v in d["versions"]) == 1000  # summed over primaries: replicas are not counted twice
    stats = grid3.stats()
    assert len(stats) == 3
