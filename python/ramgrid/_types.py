"""Value types: the one place the Python package parses and spells them.

A table's value type is given as "bytes", "i64", "f64", ("f32vec", dim) or, where a string is needed (the CLI's
`--type`, load options), "f32vec:dim"; `create_table` also takes value_type="f32vec" with dim=N. All are normalised
here to (name, dim), dim 0 unless "f32vec". The native module takes that pair and checks it again with the Rust
client's parser (`ramgrid_client::parse_type`, the one on the Rust side), which also bounds the dimension.
"""

from __future__ import annotations

from typing import Union

# The protocol's value type names (docs/protocol-native.md), as the Rust client spells them.
VALUE_TYPES = ("bytes", "i64", "f64", "f32vec")

ValueTypeLike = Union[str, tuple[str, int]]


def parse_value_type(value_type: ValueTypeLike, dim: int = 0) -> tuple[str, int]:
    """(name, dim) for any accepted spelling; ValueError naming the accepted ones otherwise."""
    if isinstance(value_type, tuple):
        if len(value_type) != 2 or value_type[0] != "f32vec":
            raise ValueError(f"tuple value types are ('f32vec', dim), got {value_type!r}")
        vt, d = "f32vec", _dim(value_type[1], value_type)
    else:
        vt, d = str(value_type), dim
        if vt.startswith("f32vec:"):
            vt, d = "f32vec", _dim(vt.split(":", 1)[1], value_type)
    if vt not in VALUE_TYPES:
        raise ValueError(f"value_type must be 'bytes', 'i64', 'f64' or ('f32vec', dim), got {value_type!r}")
    if vt == "f32vec" and d <= 0:
        raise ValueError("an f32vec table needs a dimension > 0: value_type=('f32vec', dim)")
    if vt != "f32vec":
        d = 0
    return vt, d


def spell_value_type(name: str, dim: int = 0) -> str:
    """The one-string spelling of a value type: its name, or "f32vec:dim" for vectors."""
    return f"f32vec:{int(dim)}" if name == "f32vec" else name


def _dim(text: str | int, value_type: object) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"an f32vec dimension must be an integer, got {value_type!r}") from None
