"""A load's types from its input: the value type from the first rows of the first file (or a Parquet value
column's type), and the key type of a Parquet key column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ramgrid import splits
from ramgrid._gzip import gunzip
from ramgrid.exceptions import LoadError
from ramgrid.load.parquet import _parquet_columns
from ramgrid.load.parse import _parse_slow, _parse_value, _text_options
from ramgrid.splits import PathLike

_INFER_ROWS = 1000


def infer_value_type(
    path: PathLike,
    *,
    format: str | None = None,
    delimiter: str | None = None,
    key_column: Any = None,
    value_column: Any = None,
    header: bool = False,
    rows: int = _INFER_ROWS,
) -> str | tuple[str, int]:
    """The value type of the first rows of the first file: "i64" if every value is an integer, "f64" if every value
    is a number, else "bytes". For Parquet, from the value column's type (a fixed-size float list gives
    ("f32vec", dim))."""
    files = splits.input_files(Path(path), format)
    p, fmt = files[0]
    if fmt == "parquet":
        return _infer_parquet(p, key_column, value_column)
    opts = _text_options(fmt, delimiter, key_column, value_column, "bytes", "str", header, True, 10_000, 1 << 20, "")
    sample = _head_lines(p, rows + (1 if header else 0))
    if header:
        nl = sample.find(b"\n")
        sample = b"" if nl < 0 else sample[nl + 1 :]
    parsed = _parse_slow(sample, opts)
    vals = [v.strip() for v in parsed.values]
    if not vals:
        return "bytes"
    if all(_parse_value(v, "i64")[1] == "" for v in vals):
        return "i64"
    if all(_parse_value(v, "f64")[1] == "" for v in vals):
        return "f64"
    return "bytes"


def _head_lines(p: Path, n: int) -> bytes:
    try:
        if splits.is_gzip(p):
            out, lines = [], 0
            for data, _ in gunzip(str(p), 1 << 16):
                out.append(data)
                lines += data.count(b"\n")
                if lines >= n:
                    break
            head = b"".join(out)
            end = -1
            for _ in range(n):
                end = head.find(b"\n", end + 1)
                if end < 0:
                    return head
            return head[: end + 1]
        with open(p, "rb") as f:
            return b"".join(line for line, _ in zip(f, range(n)))
    except OSError as e:
        raise LoadError.at(str(p), None, f"cannot read: {e}") from None


def _infer_parquet(p: Path, key_column: Any, value_column: Any) -> str | tuple[str, int]:
    import pyarrow as pa

    pf = splits.parquet().ParquetFile(str(p))
    opts = _text_options("parquet", None, key_column, value_column, "bytes", "str", False, True, 1, 1, "")
    _, vname = _parquet_columns(pf.schema_arrow, opts, str(p))
    t = pf.schema_arrow.field(vname).type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "i64"
    if pa.types.is_floating(t):
        return "f64"
    if pa.types.is_fixed_size_list(t) and pa.types.is_floating(t.value_type):
        return ("f32vec", int(t.list_size))
    return "bytes"


def _infer_key_type(path: Path, fmt: str, key_column: Any, value_column: Any) -> str:
    if fmt != "parquet":
        return "str"
    import pyarrow as pa

    pf = splits.parquet().ParquetFile(str(path))
    opts = _text_options("parquet", None, key_column, value_column, "bytes", "str", False, True, 1, 1, "")
    kname, _ = _parquet_columns(pf.schema_arrow, opts, str(path))
    return "int" if pa.types.is_integer(pf.schema_arrow.field(kname).type) else "str"
