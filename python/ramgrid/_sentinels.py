"""Sentinels of the read paths in `grid` and `aio`, kept below both so that neither imports the other for them."""

from __future__ import annotations

from typing import Any


class _Raise:
    """Sentinel: no default given, so a missing key raises."""

    def __repr__(self) -> str:
        return "<raise>"


RAISE: Any = _Raise()
