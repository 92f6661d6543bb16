"""Key and value conversion: numpy and pyarrow arrays become the packed or int64 forms without per-key loops."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ramgrid._keys import convert_keys, convert_values, fit_values, key_count
from ramgrid.exceptions import RamgridError, ValueOutOfRange

pytestmark = pytest.mark.timeout(30)


def unpack(k: Any) -> list[bytes]:
    offsets, data = k
    assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == len(data)
    return [data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def test_lists_pass_through() -> None:
    keys = ["a", b"b", 3]
    assert convert_keys(keys) is keys
    assert convert_keys(("a", "b")) == ["a", "b"]


def test_integer_arrays_become_int64() -> None:
    for dtype in (np.int8, np.int32, np.int64, np.uint16, np.uint64):
        k = convert_keys(np.array([1, 2, 3], dtype=dtype))
        assert isinstance(k, np.ndarray) and k.dtype == np.int64 and k.tolist() == [1, 2, 3]
    strided = np.arange(10, dtype=np.int64)[::2]
    k = convert_keys(strided)
    assert k.flags.c_contiguous and k.tolist() == [0, 2, 4, 6, 8]


def test_int64_array_is_not_copied() -> None:
    a = np.arange(5, dtype=np.int64)
    assert convert_keys(a) is a


def test_bad_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="above"):
        convert_keys(np.array([2**63], dtype=np.uint64))
    with pytest.raises(ValueError, match="one-dimensional"):
        convert_keys(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError):
        convert_keys(np.array([1.5, 2.5]))
    with pytest.raises(TypeError, match="single"):
        convert_keys("abc")


def test_bytes_array_drops_padding_keeps_inner_nul() -> None:
    a = np.array([b"ab", b"a\x00c", b"", b"xyzw"], dtype="S4")
    assert unpack(convert_keys(a)) == [b"ab", b"a\x00c", b"", b"xyzw"]


def test_unicode_array_ascii_and_non_ascii() -> None:
    ascii_ = np.array(["user:1", "u", ""])
    assert unpack(convert_keys(ascii_)) == [b"user:1", b"u", b""]
    mixed = np.array(["héllo", "日本", "x"])
    assert unpack(convert_keys(mixed)) == ["héllo".encode(), "日本".encode(), b"x"]


def test_empty_arrays() -> None:
    for a in (np.array([], dtype="S3"), np.array([], dtype="U3"), pa.array([], type=pa.string())):
        k = convert_keys(a)
        assert key_count(k) == 0 and unpack(k) == []
    assert key_count(convert_keys(np.array([], dtype=np.int64))) == 0


def test_object_array_becomes_list() -> None:
    a = np.array(["a", b"b"], dtype=object)
    assert convert_keys(a) == ["a", b"b"]


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_arrow_variable_width_arrays(typ: Any) -> None:
    vals = ["alpha", "", "gamma", "δ"]
    arr = pa.array(
        [v.encode() if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) else v for v in vals], type=typ
    )
    assert unpack(convert_keys(arr)) == [v.encode() for v in vals]
    # A slice shares the parent's buffers: offsets must be rebased and data cut.
    assert unpack(convert_keys(arr.slice(1, 2))) == [b"", b"gamma"]
    assert unpack(convert_keys(arr.slice(2))) == [b"gamma", "δ".encode()]


def test_arrow_chunked_and_dictionary() -> None:
    ch = pa.chunked_array([["a", "bb"], ["ccc"]])
    assert unpack(convert_keys(ch)) == [b"a", b"bb", b"ccc"]
    d = pa.array(["x", "y", "x"]).dictionary_encode()
    assert unpack(convert_keys(d)) == [b"x", b"y", b"x"]


def test_arrow_integers() -> None:
    k = convert_keys(pa.array([5, 6, 7], type=pa.int64()))
    assert k.dtype == np.int64 and k.tolist() == [5, 6, 7]
    k = convert_keys(pa.array([5, 6], type=pa.int32()))
    assert k.dtype == np.int64 and k.tolist() == [5, 6]


def test_arrow_nulls_are_refused() -> None:
    with pytest.raises(ValueError, match="null"):
        convert_keys(pa.array(["a", None]))


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
        max_size=30,
    )
)
def test_unicode_packing_matches_a_python_loop(strings: list[str]) -> None:
    a = np.array(strings, dtype="U") if strings else np.array([], dtype="U1")
    assert unpack(convert_keys(a)) == [s.encode() for s in strings]
    assert unpack(convert_keys(pa.array(strings, type=pa.string()))) == [s.encode() for s in strings]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.binary(max_size=10).map(lambda b: b.rstrip(b"\x00")), max_size=30))
def test_bytes_packing_matches_a_python_loop(blobs: list[bytes]) -> None:
    a = np.array(blobs, dtype="S") if blobs else np.array([], dtype="S1")
    assert unpack(convert_keys(a)) == blobs


def test_values_conversion() -> None:
    assert convert_values([b"a", "b"]) == [b"a", "b"]
    v = convert_values([1.5, 2.5])
    assert isinstance(v, np.ndarray) and v.tolist() == [1.5, 2.5]
    assert convert_values(np.array([b"x"], dtype="S1")) == [b"x"]
    v = convert_values(pa.array([1.0, 2.0]))
    assert isinstance(v, np.ndarray) and v.tolist() == [1.0, 2.0]
    # pyarrow text and binary values go packed, read from their buffers (a sliced array rebased to 0)
    assert unpack(convert_values(pa.array(["a", "bc", "d"]).slice(1))) == [b"bc", b"d"]
    assert unpack(convert_values(pa.chunked_array([["x"], ["yz"]], pa.large_binary()))) == [b"x", b"yz"]
    assert convert_values(pa.array(["a", None])) == ["a", None]  # left for the binding to refuse by name
    vec = convert_values(pa.array([[1.0, 2.0], [3.0, 4.0]], type=pa.list_(pa.float32(), 2)))
    assert vec.shape == (2, 2)
    with pytest.raises(ValueError, match="null"):
        convert_values(pa.array([1.0, None]))


def test_unaligned_arrays_are_realigned() -> None:
    # Arrays unpickled from a message buffer (Dask, multiprocessing) can start at an odd address.
    buf = bytearray(8 * 10 + 1)
    a = np.frombuffer(buf, dtype=np.int64, offset=1, count=10)
    assert not a.flags.aligned
    k = convert_keys(a)
    assert k.flags.aligned and k.flags.c_contiguous
    v = convert_values(np.frombuffer(bytearray(8 * 4 + 3), dtype=np.float64, offset=3, count=4))
    assert v.flags.aligned


def fit(values: Any, vt: str, dim: int = 0) -> Any:
    return fit_values(convert_values(values), vt, dim, source=values)


def test_fit_values_gives_the_table_dtype_exactly() -> None:
    got = fit(np.array([1, 2**63 - 1], dtype=np.uint64), "i64")
    assert got.dtype == np.int64 and got.tolist() == [1, 2**63 - 1]
    got = fit([2**53 + 1, 2.0, True], "i64")  # numpy would make float64 of this list and round 2**53+1
    assert got.dtype == np.int64 and got.tolist() == [2**53 + 1, 2, 1]
    got = fit(np.array([-(2.0**63), 2.0**62]), "i64")
    assert got.dtype == np.int64 and got.tolist() == [-(2**63), 2**62]
    got = fit(np.array([[1e38, np.inf], [np.nan, -1e-50]]), "f32vec", 2)
    assert got.dtype == np.float32 and got[0, 0] == np.float32(1e38) and np.isinf(got[0, 1]) and np.isnan(got[1, 0])
    assert fit([1, 10**300], "f64").tolist() == [1.0, 1e300]
    assert fit([b"a"], "bytes") == [b"a"]


@pytest.mark.parametrize(
    ("values", "vt", "dim", "index", "value"),
    [
        (np.array([0, 2**64 - 1], dtype=np.uint64), "i64", 0, 1, 2**64 - 1),
        ([0, 0, -(2**63) - 1], "i64", 0, 2, -(2**63) - 1),
        (np.array([0.5]), "i64", 0, 0, 0.5),
        ([1, 2.0, 2.5], "i64", 0, 2, 2.5),
        (np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 4e38]]), "f32vec", 3, 1, 4e38),
        (np.array([1.0, 2.0, -1e39, 0.0]), "f32vec", 2, 1, -1e39),  # flat rows of 2
        ([1.0, 10**400], "f64", 0, 1, 10**400),
    ],
)
def test_fit_values_refuses_the_first_value_that_does_not_fit(
    values: Any, vt: str, dim: int, index: int, value: Any
) -> None:
    with pytest.raises(ValueOutOfRange) as e:
        fit(values, vt, dim)
    assert (e.value.index, e.value.value) == (index, value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, RamgridError)
    assert f"at index {index}" in str(e.value) and f"an {vt} table" in str(e.value)


def test_value_out_of_range_pickles_with_its_attributes() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(ValueOutOfRange("msg", 3, 2**64)))
    assert (str(e), e.index, e.value) == ("msg", 3, 2**64)
