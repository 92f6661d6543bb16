"""Reading gzip files for loads: decompressed pieces with the compressed offset reached, and damage reported as a
LoadError naming the file and the compressed byte where reading broke."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import Any

from ramgrid.exceptions import LoadError

_GZIP_READ = 64 << 10  # compressed bytes handed to zlib at a time


def gunzip(path: str, block: int) -> Iterator[tuple[bytes, int]]:
    """Yields (up to `block` decompressed bytes, compressed bytes consumed so far) of a gzip file, member after
    member, as `gzip` reads it (concatenated members; NUL padding between or after them is skipped).

    Damage raises LoadError naming the file and the compressed byte offset where reading broke: for a corrupt
    stream the byte at which zlib failed (found by feeding the failing input again, in halves, to copies of the
    decompressor taken before it), for a truncated one the end of the file. `gzip.GzipFile` is not used because it
    names neither, raises a bare zlib.error for some damage, and only knows the offset of its read-ahead buffer."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        d = zlib.decompressobj(wbits=31)  # the gzip wrapper: zlib checks each member's header, CRC-32 and length
        started = False  # whether `d` has been given bytes of its member
        pending = b""  # input `d` has not taken yet; it begins at file offset `at`
        at = 0
        full = False  # the last call stopped at `block` bytes of output: zlib may hold more without more input
        while True:
            if not pending and not full:
                pending = f.read(_GZIP_READ)
                if not pending:
                    if started and not d.eof:
                        raise LoadError.at(
                            path, None, f"gzip data ends at compressed byte {size} inside a member (truncated file)"
                        )
                    return
            if d.eof:
                zeros = len(pending) - len(pending.lstrip(b"\0"))
                at, pending = at + zeros, pending[zeros:]
                if not pending:
                    continue
                d, started = zlib.decompressobj(wbits=31), False
            saved = d.copy()
            try:
                out = d.decompress(pending, block)
            except zlib.error as e:
                bad = at + _failing_byte(saved, pending)
                reason = f"corrupt gzip data at compressed byte {bad} of {size}: {_zlib_reason(e)}"
                raise LoadError.at(path, None, reason) from None
            started = True
            rest = d.unused_data if d.eof else d.unconsumed_tail
            at, pending = at + len(pending) - len(rest), rest
            full = len(out) >= block and not d.eof
            if out:
                yield out, at


def _failing_byte(saved: Any, data: bytes) -> int:
    """The index in `data` of the byte at which a decompressor in state `saved` fails: the shortest failing prefix
    (a prefix that stops before the damage only leaves zlib waiting for more, so failing is monotonic)."""
    lo, hi = 1, len(data)  # the whole of `data` fails
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            saved.copy().decompress(data[:mid])
            lo = mid + 1
        except zlib.error:
            hi = mid
    return lo - 1


def _zlib_reason(e: zlib.error) -> str:
    reason = str(e).rpartition(": ")[2]  # "Error -3 while decompressing data: invalid block type"
    return {
        "incorrect data check": "the data does not match its CRC-32 checksum (damaged somewhere in this member)",
        "incorrect length check": "the data does not match its recorded length",
        "incorrect header check": "not the start of a gzip member",
    }.get(reason, reason)
