"""Turns user key and value containers into the forms the native module takes, without a Python loop per key.

The native module accepts keys as a list of str/bytes/int, a 1-D int64 array, or a packed `(offsets, data)` pair
(see `_native.pyi`). Lists pass through untouched: the binding reads them in Rust, which is faster than packing
them here. Arrays are where a per-key Python loop would cost most, so numpy and pyarrow arrays are converted with
vectorised operations or by reading their buffers directly.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, NoReturn, Union

import numpy as np

from ramgrid.exceptions import ValueOutOfRange

Packed = tuple[np.ndarray, bytes]
NativeKeys = Union[list[Any], np.ndarray, Packed]

__all__ = ["NativeKeys", "convert_keys", "convert_values", "fit_values", "key_count"]

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _pyarrow() -> Any:
    """Returns the pyarrow module if it is already imported, so plain numpy users never pay for importing it."""
    import sys

    return sys.modules.get("pyarrow")


def _is_arrow(obj: Any) -> bool:
    pa = _pyarrow()
    return pa is not None and isinstance(obj, (pa.Array, pa.ChunkedArray))


def convert_keys(keys: Any) -> NativeKeys:
    """Returns `keys` in a form `_native.Client` accepts.

    - list / tuple of str, bytes or int (numpy integer scalars count as ints): passed through (a tuple becomes a list).
    - numpy integer array: int64 (other integer dtypes are converted; a negative value in an unsigned array
      cannot occur, and uint64 values above 2**63-1 are refused rather than wrapped).
    - numpy 'S' (bytes) or 'U' (str) array: packed `(offsets, data)`, trailing NUL padding removed.
    - numpy object array or numpy 2's StringDType: converted to a list.
    - pyarrow string / large_string / binary / large_binary arrays: packed from their offset and data buffers;
      pyarrow integer arrays: int64 numpy (zero-copy for int64 without nulls). Null keys are refused.
    """
    if isinstance(keys, list):
        return keys
    if isinstance(keys, tuple):
        return list(keys)
    if isinstance(keys, np.ndarray):
        return _convert_numpy_keys(keys)
    if _is_arrow(keys):
        return _convert_arrow_keys(keys)
    if isinstance(keys, (str, bytes, int)):
        raise TypeError(f"keys must be a sequence of keys, not a single {type(keys).__name__}: wrap it in a list")
    if isinstance(keys, Sequence) or hasattr(keys, "__iter__"):
        return list(keys)
    raise TypeError(f"unsupported key container {type(keys).__name__}: use a list, a numpy array or a pyarrow array")


def _native_ready(arr: np.ndarray, dtype: Any = None) -> np.ndarray:
    """The array as the native module reads it: C-contiguous and aligned, copied only if it is not already.

    Arrays that arrive by pickle (Dask, multiprocessing) can sit at an unaligned address inside a message buffer;
    the binding reads them as a typed slice, which must be aligned.
    """
    return np.require(arr, dtype=dtype, requirements=("C", "A"))


def key_count(keys: NativeKeys) -> int:
    """The number of keys in a converted key container."""
    if isinstance(keys, tuple):
        return len(keys[0]) - 1
    return len(keys)


def _convert_numpy_keys(arr: np.ndarray) -> NativeKeys:
    if arr.ndim != 1:
        raise ValueError(f"key arrays must be one-dimensional, got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind == "i":
        return _native_ready(arr, np.int64)
    if kind == "u":
        if arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise ValueError("uint64 keys above 2**63-1 cannot be represented as int64 keys")
        return _native_ready(arr, np.int64)
    if kind == "b":
        raise TypeError("boolean arrays are not keys")
    if kind == "S":
        return _pack_fixed_bytes(arr)
    if kind == "U":
        return _pack_fixed_unicode(arr)
    if kind == "O" or kind == "T":
        return list(arr.tolist())
    raise TypeError(f"unsupported key dtype {arr.dtype}: keys are int64, str or bytes")


def _pack_fixed_bytes(arr: np.ndarray) -> Packed:
    """Packs an 'S' array: each row of the (n, itemsize) byte matrix keeps its first str_len bytes.

    numpy stores 'S' values NUL-padded and already drops trailing NULs when reading them back, so str_len (the
    length up to the last non-NUL byte) is exactly the value a Python loop would see.
    """
    n = arr.shape[0]
    width = arr.dtype.itemsize
    lengths = np.char.str_len(arr).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if width == 0 or n == 0:
        return offsets, b""
    matrix = np.ascontiguousarray(arr).view(np.uint8).reshape(n, width)
    mask = np.arange(width) < lengths[:, None]
    return offsets, matrix[mask].tobytes()


def _pack_fixed_unicode(arr: np.ndarray) -> Packed:
    """Packs a 'U' array as UTF-8. ASCII-only arrays (the common case for ids) are narrowed from UCS-4 code points
    to bytes directly; anything else goes through numpy's vectorised encoder."""
    n = arr.shape[0]
    width = arr.dtype.itemsize // 4
    if n == 0 or width == 0:
        return np.zeros(n + 1, dtype=np.int64), b""
    codes = np.ascontiguousarray(arr).view(np.uint32).reshape(n, width)
    if int(codes.max()) < 128:
        lengths = np.char.str_len(arr).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        mask = np.arange(width) < lengths[:, None]
        return offsets, codes[mask].astype(np.uint8).tobytes()
    return _pack_fixed_bytes(np.char.encode(arr, "utf-8"))


def _convert_arrow_keys(arr: Any) -> NativeKeys:
    pa = _pyarrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        raise ValueError(f"key array has {arr.null_count} null(s); null is not a key")
    t = arr.type
    if pa.types.is_integer(t):
        if not pa.types.is_int64(t):
            arr = arr.cast(pa.int64())
        return _native_ready(arr.to_numpy(zero_copy_only=False), np.int64)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return _pack_arrow_buffers(arr, np.int32)
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return _pack_arrow_buffers(arr, np.int64)
    if hasattr(pa.types, "is_string_view") and (pa.types.is_string_view(t) or pa.types.is_binary_view(t)):
        return _pack_arrow_buffers(arr.cast(pa.large_binary()), np.int64)
    if pa.types.is_dictionary(t):
        return _convert_arrow_keys(arr.dictionary_decode())
    raise TypeError(f"unsupported pyarrow key type {t}: use int64, string or binary")


def _pack_arrow_buffers(arr: Any, offset_dtype: type) -> Packed:
    """Reads an arrow variable-width array's offsets and data buffers; a sliced array is rebased to start at 0."""
    n = len(arr)
    buffers = arr.buffers()
    offsets_buf, data_buf = buffers[1], buffers[2]
    if offsets_buf is None or n == 0:
        return np.zeros(n + 1, dtype=np.int64), b""
    raw: np.ndarray = np.frombuffer(offsets_buf, dtype=offset_dtype)[arr.offset : arr.offset + n + 1]
    start, end = int(raw[0]), int(raw[-1])
    offsets = raw.astype(np.int64)
    if start:
        offsets -= start
    data = b"" if data_buf is None or end == start else data_buf.slice(start, end - start).to_pybytes()
    return offsets, data


def convert_values(values: Any) -> Any:
    """Returns put values in a form `_native.Client.put_many` accepts: a numpy array for numeric and vector tables,
    a list of bytes/str or packed `(offsets, data)` (from a pyarrow string or binary array without nulls, read from
    its buffers) for bytes tables. The table's type decides in the native layer; here the container does."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind in "SUOT":
            return values.tolist()
        return _native_ready(values)
    if _is_arrow(values):
        pa = _pyarrow()
        t = values.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            if values.null_count:
                return values.to_pylist()  # a None among them: the binding names it
            if isinstance(values, pa.ChunkedArray):
                values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
            wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            return _pack_arrow_buffers(values, np.int64 if wide else np.int32)
        if values.null_count:
            raise ValueError(f"value array has {values.null_count} null(s); store a sentinel instead")
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            return _native_ready(np.stack(values.to_numpy(zero_copy_only=False)))
        return _native_ready(values.to_numpy(zero_copy_only=False))
    if isinstance(values, (list, tuple)):
        if len(values) and isinstance(values[0], (bytes, bytearray, memoryview, str)):
            return list(values)
        return _native_ready(np.asarray(values))
    if isinstance(values, (str, bytes)):
        raise TypeError(f"values must be a sequence of values, not a single {type(values).__name__}")
    return _native_ready(np.asarray(values))


def fit_values(values: Any, value_type: str, dim: int, source: Any = None) -> Any:
    """Returns `values` (as `convert_values` made them) in exactly the table's dtype, or raises ValueOutOfRange naming
    the first value that does not fit, so that a call stores all of its values or none. `source` is what the caller
    passed: a list's Python ints are checked exactly rather than through the float64 array numpy makes of a list
    that mixes ints and floats.

    - i64: ints within int64 (uint64 above 2**63-1 and larger Python ints are refused, never wrapped); floats only
      if they are integers (1.0 is 1; 2.5, nan and inf are refused, never truncated), as the loader does.
    - f32vec: a finite value whose magnitude float32 cannot hold (it would become inf) is refused; nan and inf
      given as such are kept, and other values are rounded to float32 as before.
    - f64: a number float64 cannot hold (a Python int above ~1.8e308) is refused.

    Anything else (bytes tables, containers of the wrong kind) is returned unchanged for the binding to judge.
    """
    if value_type == "bytes":
        return values
    if isinstance(values, list):  # an object array became a list: its numbers are checked like a list's
        source, values = values, np.asarray(values)
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "biufO":
        return values
    if value_type == "i64":
        return _fit_i64(values, source)
    if value_type == "f32vec":
        return _fit_float(values, np.float32, value_type, max(dim, 1))
    return _fit_float(values, np.float64, value_type, 1)


def _refuse(value_type: str, index: int, value: Any, why: str, element: int | None = None) -> NoReturn:
    if isinstance(value, np.generic):
        value = value.item()
    where = f"index {index}" if element is None else f"index {index} (element {element} of its vector)"
    raise ValueOutOfRange(
        f"value {value!r} at {where} does not fit an {value_type} table: it {why}; nothing was stored", index, value
    )


def _fit_i64(arr: np.ndarray, source: Any) -> Any:
    kind = arr.dtype.kind
    if kind in "bi":
        return arr
    if kind == "u":
        if arr.dtype.itemsize == 8 and arr.size:
            bad = np.flatnonzero(arr > _I64_MAX)
            if bad.size:
                _refuse("i64", int(bad[0]), arr.flat[bad[0]], "is above the int64 maximum 2**63-1")
        return _native_ready(arr, np.int64)
    if kind == "O" or isinstance(source, (list, tuple)):
        return _fit_i64_objects(source if isinstance(source, (list, tuple)) else arr.tolist())
    # Floats: integers within [-2**63, 2**63) only (2.0**63 is the first float past the maximum).
    ok = np.isfinite(arr) & (arr == np.trunc(arr)) & (arr >= -(2.0**63)) & (arr < 2.0**63)
    bad = np.flatnonzero(~ok)
    if bad.size:
        x = arr.flat[bad[0]]
        why = "is outside the int64 range" if np.isfinite(x) and x == np.trunc(x) else "is not an integer"
        _refuse("i64", int(bad[0]), x, why)
    return _native_ready(arr.astype(np.int64))


def _fit_i64_objects(items: Sequence[Any]) -> Any:
    out = np.empty(len(items), dtype=np.int64)
    for i, x in enumerate(items):
        if isinstance(x, numbers.Integral):
            y = int(x)
        elif isinstance(x, numbers.Real):
            f = float(x)
            if not f.is_integer():
                _refuse("i64", i, x, "is not an integer")
            y = int(f)
        else:
            return np.asarray(items)  # not a number: the binding refuses it as before
        if not _I64_MIN <= y <= _I64_MAX:
            _refuse("i64", i, x, "is outside the int64 range [-2**63, 2**63-1]")
        out[i] = y
    return out


def _fit_float(arr: np.ndarray, target: Any, value_type: str, dim: int) -> Any:
    if arr.dtype.kind == "O":
        items = arr.ravel().tolist()
        flat = np.empty(len(items), dtype=np.float64)
        for i, x in enumerate(items):
            try:
                flat[i] = float(x)
            except OverflowError:
                _refuse(value_type, i // dim, x, "is beyond the float64 range", i % dim if dim > 1 else None)
            except (TypeError, ValueError):
                return arr  # not a number: the binding refuses it as before
        arr = flat.reshape(arr.shape)
    if arr.dtype.kind != "f" or arr.dtype.itemsize <= np.dtype(target).itemsize:
        return arr  # ints, and floats no wider than the target, always fit
    with np.errstate(over="ignore"):
        narrow = arr.astype(target)
    bad = np.flatnonzero(np.isfinite(arr) & ~np.isfinite(narrow))
    if bad.size:
        j = int(bad[0])
        limit = float(np.finfo(target).max)
        _refuse(
            value_type,
            j // dim,
            arr.flat[j],
            f"is finite but beyond the {np.dtype(target).name} range (magnitude up to {limit:.8g}) and would become inf",
            j % dim if dim > 1 else None,
        )
    return _native_ready(narrow)
