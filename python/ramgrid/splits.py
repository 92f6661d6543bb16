"""Input splits: how a file, or a directory of files, is cut into pieces of work that can run anywhere, and how each
piece is read back. Loads (`ramgrid.load`) and MapReduce jobs (`ramgrid.mapreduce`) cut their file inputs alike:

- a plain text file: byte ranges of `chunk_bytes`; a range owns the lines that *start* inside it, so a line that
  crosses a boundary is read whole by the range it starts in and skipped by the next;
- a gzip-compressed text file: one split (a deflate stream cannot be entered in the middle);
- a Parquet file: one split per row group.

A directory's data files are its regular files, except hidden ones and Hadoop/Spark markers (`_SUCCESS`,
`_metadata`). Splits are plain picklable data: they travel to Dask workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ramgrid._gzip import gunzip
from ramgrid.exceptions import LoadError

__all__ = ["FORMATS", "FileSplit", "format_of", "iter_range", "iter_stream", "parquet", "plan_splits", "text_pieces"]

PathLike = Union[str, "os.PathLike[str]"]

TEXT_SUFFIXES = {".txt": "text", ".tsv": "tsv", ".tab": "tsv", ".csv": "csv", "": "text"}
PARQUET_SUFFIXES = {".parquet", ".pq"}
FORMATS = ("text", "tsv", "csv", "parquet")
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class FileSplit:
    """A byte range of a plain text file, a whole compressed text file, or one Parquet row group."""

    kind: str  # "range" (plain text byte range), "stream" (whole compressed text file), "parquet" (one row group)
    path: str
    fmt: str
    start: int = 0
    end: int = 0
    row_group: int = 0
    size: int = 0  # input bytes this split accounts for

    @property
    def owners(self) -> tuple[str, ...]:
        """The servers that hold this split's input: none (a file is read where the task runs)."""
        return ()

    @property
    def label(self) -> str:
        return f"{Path(self.path).name}:{self.start or self.row_group}"


def format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        return fmt
    name = path.name.lower()
    name = name.removesuffix(".gz")
    suffix = Path(name).suffix
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in TEXT_SUFFIXES:
        return TEXT_SUFFIXES[suffix]
    raise ValueError(
        f"cannot tell the format of {path} from its name: pass format= one of {', '.join(FORMATS)} "
        "(.txt/.tsv/.csv[.gz], .parquet, or no suffix for tab-separated text)"
    )


def input_files(path: Path, fmt: str | None) -> list[tuple[Path, str]]:
    if path.is_dir():
        # Hidden files and Hadoop/Spark markers (_SUCCESS, _metadata) are not data.
        entries = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
        if not entries:
            raise LoadError.at(str(path), None, "directory holds no data files")
        return [(p, format_of(p, fmt)) for p in entries]
    if not path.exists():
        raise LoadError.at(str(path), None, "no such file or directory")
    if not path.is_file():
        raise LoadError.at(str(path), None, "not a regular file or directory")
    return [(path, format_of(path, fmt))]


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def plan_splits(path: PathLike, *, format: str | None = None, chunk_bytes: int = 64 << 20) -> list[FileSplit]:
    """The splits `path` (a file, or a directory of data files) is cut into: byte ranges of `chunk_bytes` of plain
    text files, one split per compressed file, one per Parquet row group."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    splits: list[FileSplit] = []
    for p, fmt in input_files(Path(path), format):
        try:
            size = p.stat().st_size
            if fmt == "parquet":
                splits.extend(_parquet_splits(p, size))
            elif size and is_gzip(p):
                splits.append(FileSplit("stream", str(p), fmt, 0, size, size=size))
            else:
                starts = range(0, max(size, 1), chunk_bytes)
                splits.extend(
                    FileSplit("range", str(p), fmt, s, min(s + chunk_bytes, size), size=min(chunk_bytes, size - s))
                    for s in starts
                )
        except OSError as e:
            raise LoadError.at(str(p), None, f"cannot read: {e.strerror or e}") from None
    return splits


def _parquet_splits(p: Path, size: int) -> list[FileSplit]:
    pq = parquet()
    if size and is_gzip(p):
        raise LoadError.at(
            str(p), None, "is gzip-compressed: Parquet files are read as they are (Parquet compresses its own pages)"
        )
    try:
        meta = pq.ParquetFile(str(p)).metadata
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError, its I/O errors OSErrors
        raise LoadError.at(str(p), None, f"not a readable Parquet file: {e}") from None
    total = max(1, meta.num_rows)
    n = meta.num_row_groups
    return [
        FileSplit("parquet", str(p), "parquet", row_group=i, size=size * meta.row_group(i).num_rows // total)
        for i in range(n)
    ]


def parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("loading Parquet needs pyarrow: pip install pyarrow") from e
    return pq


def iter_range(path: str, start: int, end: int, block: int) -> Iterator[tuple[bytes, int]]:
    """Yields (data, offset) pieces made of whole lines: those that start in [start, end). A range that does not
    begin a file skips the line it begins in: that line belongs to the range where it starts."""
    with open(path, "rb") as f:
        pos = start
        if start > 0:
            f.seek(start - 1)
            while True:
                piece = f.read(min(block, 1 << 16))
                if not piece:
                    return
                nl = piece.find(b"\n")
                if nl >= 0:
                    pos += nl
                    break
                pos += len(piece)
            f.seek(pos)
        buf = b""
        while pos + len(buf) < end or (buf and pos < end):
            data = f.read(block)
            if not data:
                if buf:
                    yield buf, pos
                return
            buf += data
            limit = end - pos  # the lines starting at buf[:limit] are ours
            if len(buf) >= limit:
                nl = buf.find(b"\n", limit - 1)
                if nl >= 0:
                    yield buf[: nl + 1], pos
                    return
                continue
            cut = buf.rfind(b"\n")
            if cut >= 0:
                yield buf[: cut + 1], pos
                pos += cut + 1
                buf = buf[cut + 1 :]


def iter_stream(path: str, block: int) -> Iterator[tuple[bytes, int]]:
    """Yields (data, compressed bytes consumed so far) pieces of whole lines of a gzip file, about `block` bytes
    each. Each piece is held back until the next is known, so that the last one carries the file's whole size
    (progress then adds up to it)."""
    size = os.path.getsize(path)
    held: tuple[bytes, int] | None = None
    parts: list[bytes] = []
    have = 0
    for data, mark in gunzip(path, block):
        parts.append(data)
        have += len(data)
        if have < block:
            continue
        buf = b"".join(parts)
        cut = buf.rfind(b"\n")
        if cut < 0:  # a line longer than a block: read on
            parts = [buf]
            continue
        if held is not None:
            yield held
        held, rest = (buf[: cut + 1], mark), buf[cut + 1 :]
        parts, have = [rest], len(rest)
    buf = b"".join(parts)
    if buf:
        if held is not None:
            yield held
        held = (buf, size)
    if held is not None:
        yield held[0], size


def lines_between(path: str, start: int, end: int) -> int:
    """Line ends in bytes [start, end) of a plain file (only needed to name a line in a message)."""
    n = 0
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            data = f.read(min(left, 8 << 20))
            if not data:
                break
            n += data.count(b"\n")
            left -= len(data)
    return n


def text_pieces(split: FileSplit, block: int) -> Iterator[tuple[bytes, int]]:
    """A text split's whole lines, about `block` bytes at a time, as `iter_range` or `iter_stream` yields them."""
    if split.kind == "stream":
        return iter_stream(split.path, block)
    if split.kind == "range":
        return iter_range(split.path, split.start, split.end, block)
    raise ValueError(f"a {split.kind} split holds no text lines")
