"""Text lines into keys and values: the options a load parses with, the reference parser (line by line, in Python,
the one that knows line numbers) and the fast path (pyarrow's CSV parser), which gives the same rows or none.

A line is the key, the delimiter and the value, unless `key_column` / `value_column` pick fields of a line split at
every delimiter; keys are raw bytes or int64 (`key_type="int"`); values i64, f64 or raw bytes. No quoting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


# The client refuses a whole batch with a longer key, so such a key is caught here, as a bad line.
MAX_KEY_BYTES = 65535


@dataclass(frozen=True)
class _Options:
    delimiter: bytes
    key_column: Any  # int field index for text, column name or index for Parquet; None = default
    value_column: Any
    value_type: str
    key_type: str  # "str" (raw bytes) or "int" (int64 keys)
    header: bool
    skip_bad_lines: bool
    batch_rows: int
    read_block: int
    inferred_from: str  # non-empty when value_type was inferred: a hint for error messages


def _text_options(
    fmt: str,
    delimiter: str | None,
    key_column: Any,
    value_column: Any,
    value_type: str,
    key_type: str,
    header: bool,
    skip_bad_lines: bool,
    batch_rows: int,
    read_block: int,
    inferred_from: str,
) -> _Options:
    if fmt == "parquet":
        d = b"\t"
    else:
        d = (delimiter if delimiter is not None else ("," if fmt == "csv" else "\t")).encode()
        if not d or b"\n" in d or b"\r" in d:
            raise ValueError(f"delimiter must be a non-empty string without line breaks, got {delimiter!r}")
        if key_column is not None or value_column is not None:
            key_column = 0 if key_column is None else key_column
            value_column = 1 if value_column is None else value_column
            if not (isinstance(key_column, int) and isinstance(value_column, int)) or min(key_column, value_column) < 0:
                raise ValueError("for text files key_column and value_column are 0-based field indices")
            if key_column == value_column:
                raise ValueError("key_column and value_column must differ")
    return _Options(
        d, key_column, value_column, value_type, key_type, header, skip_bad_lines, batch_rows, read_block, inferred_from
    )


class _Rows:
    """Parsed rows of one piece: keys, values and, from the slow path, each row's line index within the piece."""

    def __init__(self, keys: Any, values: Any, lines: list[int] | None, bad: list[tuple[int, str]]) -> None:
        self.keys = keys
        self.values = values
        self.lines = lines
        self.bad = bad

    def __len__(self) -> int:
        return len(self.values)


def _hint(opts: _Options) -> str:
    return (
        f" (value type {opts.value_type} was inferred from {opts.inferred_from}; pass value_type=)"
        if (opts.inferred_from)
        else ""
    )


def _parse_value(v: bytes, vt: str) -> tuple[Any, str]:
    """Returns (value, "") or (None, reason)."""
    if vt == "bytes":
        return v, ""
    if vt == "i64":
        try:
            x = int(v)
        except ValueError:
            return None, f"value {_show(v)} is not an integer"
        if not _I64_MIN <= x <= _I64_MAX:
            return None, f"value {_show(v)} is outside the int64 range"
        return x, ""
    try:
        return float(v), ""
    except ValueError:
        return None, f"value {_show(v)} is not a number"


def _parse_key(k: bytes, key_type: str) -> tuple[Any, str]:
    if not k:
        return None, "empty key"
    if key_type == "str":
        if len(k) > MAX_KEY_BYTES:
            return None, f"key is {len(k)} bytes long; the limit is {MAX_KEY_BYTES}"
        return k, ""
    try:
        x = int(k)
    except ValueError:
        return None, f"key {_show(k)} is not an integer (key_type='int')"
    if not _I64_MIN <= x <= _I64_MAX:
        return None, f"key {_show(k)} is outside the int64 range"
    return x, ""


def _show(b: bytes, limit: int = 40) -> str:
    s = repr(b[:limit])[1:]  # repr of bytes without the b prefix
    return s + ("..." if len(b) > limit else "")


def _parse_slow(data: bytes, opts: _Options) -> _Rows:
    """Line by line, in Python: the reference semantics, and the path that knows line numbers."""
    d = opts.delimiter
    kc, vc = opts.key_column, opts.value_column
    need = max(kc, vc) + 1 if kc is not None else 0
    keys: list[Any] = []
    values: list[Any] = []
    lines: list[int] = []
    bad: list[tuple[int, str]] = []
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    for i, line in enumerate(parts):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            continue
        if kc is None:
            k, sep, v = line.partition(d)
            if not sep:
                bad.append((i, f"no delimiter {d.decode('latin-1')!r} in the line"))
                continue
        else:
            fields = line.split(d)
            if len(fields) < need:
                bad.append((i, f"expected at least {need} fields, got {len(fields)}"))
                continue
            k, v = fields[kc], fields[vc]
        key, why = _parse_key(k, opts.key_type)
        if why:
            bad.append((i, why))
            continue
        value, why = _parse_value(v, opts.value_type)
        if why:
            bad.append((i, why + _hint(opts)))
            continue
        keys.append(key)
        values.append(value)
        lines.append(i)
    return _Rows(_key_array(keys, opts.key_type), _value_array(values, opts.value_type), lines, bad)


def _key_array(keys: list[Any], key_type: str) -> Any:
    return np.array(keys, dtype=np.int64) if key_type == "int" else keys


def _value_array(values: list[Any], vt: str) -> Any:
    if vt == "i64":
        return np.array(values, dtype=np.int64)
    if vt == "f64":
        return np.array(values, dtype=np.float64)
    return values


def _parse_fast(data: bytes, opts: _Options) -> _Rows | None:
    """pyarrow's CSV parser, or None when it is unavailable or the piece needs the slow path (a bad line, a "\\r",
    an empty key): whenever this returns rows they are exactly the rows `_parse_slow` would return."""
    if len(opts.delimiter) != 1 or b"\r" in data or not data.strip(b"\n"):
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pcsv
    except ImportError:
        return None
    kc = 0 if opts.key_column is None else opts.key_column
    vc = 1 if opts.value_column is None else opts.value_column
    vtype = {"i64": pa.int64(), "f64": pa.float64()}.get(opts.value_type, pa.binary())
    ktype = pa.int64() if opts.key_type == "int" else pa.binary()
    kname, vname = f"f{kc}", f"f{vc}"
    try:
        table = pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(autogenerate_column_names=True, use_threads=False),
            parse_options=pcsv.ParseOptions(
                delimiter=opts.delimiter.decode("latin-1"),
                quote_char=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={kname: ktype, vname: vtype},
                # Without chosen columns a line is "key<delimiter>rest": every row must then have exactly two fields.
                include_columns=[kname, vname] if opts.key_column is not None else [],
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowKeyError, KeyError):
        return None
    if opts.key_column is None and table.num_columns != 2:
        return None
    keys = table.column(kname).combine_chunks()
    values = table.column(vname).combine_chunks()
    if opts.key_type == "str" and len(keys):
        lengths = pc.min_max(pc.binary_length(keys)).as_py()
        if lengths["min"] == 0 or lengths["max"] > MAX_KEY_BYTES:
            return None
    if opts.value_type in ("i64", "f64"):
        return _Rows(keys, values.to_numpy(), None, [])
    return _Rows(keys, values, None, [])
