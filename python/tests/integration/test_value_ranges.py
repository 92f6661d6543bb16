"""Values that do not fit the table's type are refused, naming the first one, and nothing of the call is stored:
no uint64 wrapping to a negative int64, no float64 overflowing to float32 inf, no float truncated to an int."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import ValueOutOfRange

pytestmark = pytest.mark.timeout(60)


def _refused(excinfo: pytest.ExceptionInfo[BaseException], index: int, shown: str) -> None:
    e = excinfo.value
    assert isinstance(e, ValueOutOfRange) and isinstance(e, ValueError) and isinstance(e, ramgrid.RamgridError)
    assert f"index {index}" in str(e) and shown in str(e), str(e)
    assert "nothing was stored" in str(e)
    assert getattr(e, "index", None) == index


@pytest.mark.parametrize(
    ("values", "index", "shown"),
    [
        (np.array([1, 2**64 - 1], dtype=np.uint64), 1, "18446744073709551615"),
        (np.array([2**63, 1], dtype=np.uint64), 0, "9223372036854775808"),
        ([5, 2**63], 1, "9223372036854775808"),
        ([5, -(2**63) - 1], 1, "-9223372036854775809"),
        ([1, 10**30], 1, "1000000000000000000000000000000"),
        ([1.0, 2.5], 1, "2.5"),
        (np.array([3.0, math.nan]), 1, "nan"),
        (np.array([1.0, math.inf]), 1, "inf"),
        (np.array([0.0, 2.0**63]), 1, "9.223372036854776e+18"),
    ],
    ids=["u64-max", "u64-2^63", "int-2^63", "int-below-min", "int-10^30", "float-2.5", "nan", "inf", "float-2^63"],
)
def test_i64_table_refuses_values_outside_int64(
    grid3: ramgrid.LocalGrid, table_name: str, values: object, index: int, shown: str
) -> None:
    t = grid3.create_table(table_name, value_type="i64")
    with pytest.raises(ValueError) as e:
        t.put_many(["a", "b"], values)
    _refused(e, index, shown)
    assert "a" not in t and "b" not in t  # nothing of the call was stored


def test_i64_table_takes_integral_floats_and_the_int64_extremes(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    # As the loader does: a float with no fractional part is the integer it names.
    t = grid3.create_table(table_name, value_type="i64")
    t.put_many(["a", "b"], [1.0, -2.0])
    t.put_many(["c", "d"], np.array([2**63 - 1, 0], dtype=np.uint64))
    t.put_many(["e", "f"], [-(2**63), 2**63 - 1])
    t.put_many(["g"], [2**53 + 1])  # a Python int is taken exactly, never through a float
    got = t.get_many(["a", "b", "c", "d", "e", "f", "g"])
    assert got.dtype == np.int64
    assert got.tolist() == [1, -2, 2**63 - 1, 0, -(2**63), 2**63 - 1, 2**53 + 1]


def test_single_put_is_checked_too(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="i64")
    with pytest.raises(ValueError) as e:
        t.put("a", np.uint64(2**64 - 1))
    _refused(e, 0, "18446744073709551615")
    assert "a" not in t


def test_f32vec_table_refuses_finite_values_beyond_float32(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type=("f32vec", 2))
    vals = np.array([[0.5, 1.0], [2.0, 1e300], [-1e300, 0.0]])
    with pytest.raises(ValueError) as e:
        t.put_many(["a", "b", "c"], vals)
    _refused(e, 1, "1e+300")
    assert "a" not in t and "b" not in t and "c" not in t
    with pytest.raises(ValueError) as e:
        t.put_many(["a"], [[-3.5e38, 0.0]])
    _refused(e, 0, "-3.5e+38")


def test_f32vec_table_keeps_explicit_inf_and_nan_and_rounds_the_rest(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type=("f32vec", 2))
    biggest = float(np.finfo(np.float32).max)
    t.put_many(["a", "b"], np.array([[math.inf, math.nan], [biggest, 0.1]]))
    got = t.get_many(["a", "b"])
    assert got.dtype == np.float32
    assert math.isinf(got[0, 0]) and got[0, 0] > 0 and math.isnan(got[0, 1])
    assert got[1].tolist() == [np.float32(biggest), np.float32(0.1)]


def test_f64_table_refuses_ints_beyond_float64(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, value_type="f64")
    with pytest.raises(ValueError) as e:
        t.put_many(["a", "b"], [1, 10**400])
    _refused(e, 1, "1000000000")
    assert "a" not in t
    t.put_many(["a", "b"], np.array([2**64 - 1, 3], dtype=np.uint64))  # in range: fits (rounded)
    assert t.get_many(["a", "b"]).tolist() == [float(2**64 - 1), 3.0]
