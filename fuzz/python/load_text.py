"""Fuzzes the loader's text parsers (python/ramgrid/load/parse.py) with atheris: for arbitrary bytes and
options, the fast path (pyarrow's CSV reader) must either decline (None) or return exactly the rows
of the slow, line-by-line reference path, which must never raise.

    .venv/bin/python fuzz/python/load_text.py fuzz/corpus/load_text -runs=10000000 -max_len=512

The first input byte picks the options (value type, key type, delimiter, key/value columns).
"""

from __future__ import annotations

import math
import sys

import atheris

with atheris.instrument_imports():
    from ramgrid import load

VALUE_TYPES = ("bytes", "i64", "f64")
DELIMITERS = (b"\t", b",", b" ", b"||")


def options(b: int) -> load._Options:
    columns = (None, None) if b & 0x30 == 0 else ((b >> 4) & 1, 1 - ((b >> 4) & 1)) if b & 0x20 == 0 else (0, 2)
    return load._Options(
        delimiter=DELIMITERS[(b >> 2) & 3],
        key_column=columns[0],
        value_column=columns[1],
        value_type=VALUE_TYPES[(b & 3) % 3],
        key_type="int" if b & 0x40 else "str",
        header=False,
        skip_bad_lines=True,
        batch_rows=1 << 16,
        read_block=1 << 20,
        inferred_from="",
    )


def same_value(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def as_list(x: object) -> list:
    if hasattr(x, "to_pylist"):
        return x.to_pylist()
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)


def test_one(data: bytes) -> None:
    if not data:
        return
    opts = options(data[0])
    body = data[1:]
    slow = load._parse_slow(body, opts)
    fast = load._parse_fast(body, opts)
    if fast is None:
        return
    assert not slow.bad, f"fast path accepted a piece the slow path refuses: {body!r} {opts} {slow.bad[:2]}"
    fk, sk = as_list(fast.keys), as_list(slow.keys)
    fv, sv = as_list(fast.values), as_list(slow.values)
    assert fk == sk, f"keys differ: {body!r} {opts}: {fk[:3]} vs {sk[:3]}"
    assert len(fv) == len(sv) and all(same_value(a, b) for a, b in zip(fv, sv)), (
        f"values differ: {body!r} {opts}: {fv[:3]} vs {sv[:3]}"
    )


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
