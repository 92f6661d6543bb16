"""Mappers and reducers for the MapReduce tests, and the plain-Python references they are checked against.

Module-level, so a job's spec pickles them by reference: a driver in a subprocess and the test that resumes its job
find the same functions."""

from __future__ import annotations

import gzip
import itertools
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

CORPUS = Path(os.environ.get("RAMGRID_TEST_CORPUS", "/work/shared/data/lm1b-heldout-news-sentences.txt.gz"))
# The slow mappers sleep this long per call (seconds), so a test can kill something mid-job: set from the
# environment at import (subprocesses, Dask workers) or with `set_delay` (threads in the test's process).
_DELAY = float(os.environ.get("RAMGRID_MR_TEST_DELAY", "0") or 0)


def set_delay(seconds: float) -> None:
    global _DELAY
    _DELAY = seconds


def corpus_lines(n: int) -> list[str]:
    """The first `n` lines of the real corpus (the tests run on a bounded slice)."""
    with gzip.open(CORPUS, "rt", encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


def write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def reference_counts(lines: list[str]) -> Counter[str]:
    return Counter(w for line in lines for w in line.split())


def word_pairs(line: str) -> Iterator[tuple[str, int]]:
    for w in line.split():
        yield w, 1


def slow_count_block(block: bytes) -> dict[str, int]:
    """The word count's vectorised mapper, slowed down by RAMGRID_MR_TEST_DELAY seconds per block."""
    if _DELAY:
        time.sleep(_DELAY)
    return Counter(block.decode("utf-8", errors="replace").split())


def slow_word_pairs(line: str) -> Iterator[tuple[str, int]]:
    if _DELAY:
        time.sleep(_DELAY)
    return word_pairs(line)


def total(key: str, values: list[int]) -> int:
    return sum(values)


def doc_words(key: int, value: bytes) -> Iterator[tuple[str, int]]:
    """Inverted index mapper over a table of line number (int key) -> line (bytes): (word, line) once per word."""
    for w in set(value.decode("utf-8").split()):
        yield w, int.from_bytes(key, "little") if isinstance(key, bytes) else int(key)


def posting_list(word: str, docs: list[int]) -> bytes:
    return ",".join(str(d) for d in sorted(set(docs))).encode()


def tagged(line: str) -> Iterator[tuple[str, tuple[str, str]]]:
    """Reduce-side join mapper: lines "TAG<TAB>key<TAB>value" -> (key, (TAG, value))."""
    tag, key, value = line.split("\t")
    yield key, (tag, value)


def join(key: str, values: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Inner join of the L and R values of a key: every (l, r) pair, sorted."""
    left = sorted(v for t, v in values if t == "L")
    right = sorted(v for t, v in values if t == "R")
    return [(a, b) for a in left for b in right]


def broken(line: str) -> Iterator[tuple[str, int]]:
    """A mapper with a bug: it fails on the first line that has the word "the"."""
    if "the" in line.split():
        raise RuntimeError("mapper bug")
    return word_pairs(line)
