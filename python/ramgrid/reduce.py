"""Fused lookup-reduce on f64 tables: `table.lookup_reduce(records)` turns a batch of records into one value each.

The work happens in the Rust client with the GIL released: records (texts split on whitespace by the language-model
experiment's rule, or token lists) become their distinct tokens, each looked up once in one batched read per server,
then each record is reduced:

- ``sum``: `math.fsum` of its tokens' values, bit for bit (correctly rounded, so the order does not matter);
- ``mean``: that sum divided by the number of values (NaN for a record with none);
- ``max``: the largest value (NaN if any value is NaN, and for a record with none).

A token the table does not hold takes `default` (e.g. the unknown-word log probability), or, with ``default=None``,
is left out of its record's reduction (a mean then divides by the tokens found). Either way it is counted in
`misses`. A sum that `math.fsum` would refuse (an intermediate overflow, or both inf and -inf) raises ValueError
naming the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ramgrid._native import Client

__all__ = ["REDUCTIONS", "TOKENIZERS", "LookupReduced"]

REDUCTIONS = ("sum", "mean", "max")
TOKENIZERS = ("whitespace", "none")


@dataclass(frozen=True)
class LookupReduced:
    """The result of `lookup_reduce`, one entry per record in the records' order."""

    values: np.ndarray  # float64: the reduced value of each record
    misses: np.ndarray  # int64: tokens of each record the table does not hold
    counts: np.ndarray  # int64: tokens of each record (found or not; long tokens dropped by the tokeniser excluded)
    version: int  # the table version read
    distinct: int  # distinct tokens in the batch (each looked up once)
    dropped: int  # tokens dropped for being longer than 100 characters (texts only)

    def __len__(self) -> int:
        return int(self.values.size)


def _records(records: Any, tokenize: str) -> Any:
    """The records in a form the native function takes: a list, or the packed (offsets, offsets, bytes) tuple."""
    if isinstance(records, list):
        return records
    if tokenize == "none" and isinstance(records, tuple) and len(records) == 3:
        rec, tok, data = records
        return (
            np.ascontiguousarray(rec, dtype=np.int64),
            np.ascontiguousarray(tok, dtype=np.int64),
            bytes(data) if not isinstance(data, bytes) else data,
        )
    if isinstance(records, np.ndarray):
        return records.tolist()
    if isinstance(records, (str, bytes)):
        raise TypeError("records must be a sequence of records, not one str or bytes (wrap it in a list)")
    if isinstance(records, Sequence):
        return list(records)
    raise TypeError(f"records must be a list of texts or token lists, not {type(records).__name__}")


class _Reduce:
    """`lookup_reduce` for Table and PinnedTable (mixed in beside `_Reader`, which supplies the client, the name and
    the version and incarnation read)."""

    name: str
    _read_version: int = 0
    _read_incarnation: int = 0

    if TYPE_CHECKING:

        def _client(self) -> Client: ...

    def lookup_reduce(
        self,
        records: Any,
        reduce: str = "sum",
        default: float | None = None,
        tokenize: str = "whitespace",
    ) -> LookupReduced:
        """One value per record from the tokens' values in this f64 table (see the module's docstring).

        `records`: with ``tokenize="whitespace"`` a list of str or bytes texts (bytes that are not UTF-8 are replaced
        with U+FFFD, as the language-model corpus reader does), split like `str.split()` with tokens over 100
        characters dropped; with ``tokenize="none"`` a list of token lists (str or bytes tokens, used as given) or a
        packed ``(record_offsets, token_offsets, data)`` tuple. Raises ValueError for a table that does not hold
        f64 values, TableNotFound for a missing table, PartitionsUnavailable when no replica of some partition
        answers; nothing is changed by a failed call.
        """
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
        if tokenize not in TOKENIZERS:
            raise ValueError(f"tokenize must be one of {', '.join(TOKENIZERS)}, got {tokenize!r}")
        if default is not None:
            if isinstance(default, bool) or not isinstance(default, (int, float, np.floating, np.integer)):
                raise TypeError(f"default must be a number or None, not {type(default).__name__}")
            default = float(default)
        from ramgrid._clients import native

        values, misses, counts, version, distinct, dropped = native().lookup_reduce(
            self._client(),
            self.name,
            _records(records, tokenize),
            self._read_version,
            self._read_incarnation,
            reduce,
            default,
            tokenize,
        )
        return LookupReduced(values, misses, counts, int(version), int(distinct), int(dropped))
