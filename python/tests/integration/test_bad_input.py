"""Bad input: wrong tokens are refused before any data is touched; over-limit keys fail alone in their batch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import AuthError, BatchError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def secured() -> Iterator[ramgrid.LocalGrid]:
    with ramgrid.local(servers=2, memory="32MiB", token="right-token") as g:
        yield g


def test_right_token_works(secured: ramgrid.LocalGrid) -> None:
    t = secured.create_table("sec", value_type="i64", exist_ok=True)
    t.put_many([1, 2], np.array([10, 20]))
    assert t.get_many([1, 2]).tolist() == [10, 20]


@pytest.mark.parametrize("token", ["wrong-token", None])
def test_wrong_or_missing_token_is_refused(secured: ramgrid.LocalGrid, token: str) -> None:
    secured.create_table("sec2", value_type="i64", exist_ok=True).put_many([1], np.array([7]))
    bad = ramgrid.connect(secured.spec, token=token)
    with pytest.raises(AuthError):
        bad.table("sec2").get_many([1])
    with pytest.raises(AuthError):
        bad.table("sec2").put_many([1], np.array([666]))
    with pytest.raises(AuthError):
        bad.drop_table("sec2")
    assert secured.table("sec2").get(1) == 7  # nothing was touched


def test_oversize_key_fails_alone(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="bytes")
    keys = ["a", "k" * 65_536, "c", "d"]
    with pytest.raises(BatchError) as e:
        t.put_many(keys, [b"1", b"2", b"3", b"4"])
    assert [i for i, _ in e.value.failures] == [1]
    assert t.get_many(["a", "c", "d"]) == [b"1", b"3", b"4"]


def test_oversize_value_fails_alone(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="bytes")
    big = b"x" * (8 << 20)
    with pytest.raises(BatchError) as e:
        t.put_many(["a", "b", "c"], [b"1", big, b"3"])
    assert [i for i, _ in e.value.failures] == [1]
    assert t.get_many(["a", "c"]) == [b"1", b"3"]
    assert "b" not in t


def test_wrong_value_shape_is_refused(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type=("f32vec", 3))
    with pytest.raises((ValueError, TypeError, ramgrid.RamgridError)):
        t.put_many(np.arange(2), np.zeros((2, 4), dtype=np.float32))
