"""Corpora for the language-model experiment: stage a corpus into line-range files, split it into tasks, tokenise.

A corpus is one sentence per line (plain text or gzip, detected by its magic bytes). Staging copies its lines once,
unchanged, into files of a few MiB in a scratch directory, the way the reference experiment first copied its corpus
into HDFS: every later job reads line ranges from those files in parallel instead of decompressing one gzip stream.
A sentence's id is its 0-based line number in the corpus; blank lines are sentences with no tokens.

Tokenisation is the reference experiment's: split on whitespace (Python's `str.split()`, which includes Unicode
whitespace), then drop tokens longer than 100 characters. Bytes that are not UTF-8 are replaced with U+FFFD and the
lines that needed it are counted.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ramgrid.exceptions import RamgridError

__all__ = [
    "MAX_TOKEN_CHARS",
    "CorpusError",
    "CorpusSlice",
    "StagedCorpus",
    "decode_lines",
    "read_slice",
    "sample_wordfreq_sentences",
    "split_tasks",
    "stage_corpus",
    "stage_sentences",
    "tokenize",
    "tokenize_lines",
]

MAX_TOKEN_CHARS = 100
_BLOCK = 4 << 20  # bytes read per step while staging; also about the size of one staged file
_GZIP_MAGIC = b"\x1f\x8b"


class CorpusError(RamgridError, ValueError):
    """The corpus cannot be used: missing, unreadable, not gzip where it claims to be, or empty."""


def tokenize(line: str) -> list[str]:
    """Whitespace tokens of one sentence, without those longer than 100 characters."""
    toks = line.split()
    if len(line) > MAX_TOKEN_CHARS and toks and max(map(len, toks)) > MAX_TOKEN_CHARS:
        toks = [t for t in toks if len(t) <= MAX_TOKEN_CHARS]
    return toks


def tokenize_lines(lines: Sequence[str]) -> tuple[list[list[str]], int]:
    """Tokens of each line, and how many tokens were dropped for being longer than 100 characters."""
    sents = [line.split() for line in lines]
    dropped = 0
    # A token over the limit can only be in a line over the limit, so most lines skip the per-token check.
    for i, line in enumerate(lines):
        if len(line) > MAX_TOKEN_CHARS:
            s = sents[i]
            if s and max(map(len, s)) > MAX_TOKEN_CHARS:
                kept = [t for t in s if len(t) <= MAX_TOKEN_CHARS]
                dropped += len(s) - len(kept)
                sents[i] = kept
    return sents, dropped


def decode_lines(raw: Sequence[bytes]) -> tuple[list[str], int]:
    """Decodes lines as UTF-8, replacing invalid bytes with U+FFFD; returns the lines and how many needed it."""
    joined = b"\n".join(raw)
    try:
        text = joined.decode("utf-8")
        replaced = 0
    except UnicodeDecodeError:
        text = joined.decode("utf-8", "replace")
        replaced = 0
        for line in raw:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                replaced += 1
    lines = text.split("\n") if raw else []
    # An invalid byte never swallows the b"\n" that follows it, so the split gives back exactly len(raw) lines.
    assert len(lines) == len(raw)
    return lines, replaced


@dataclass(frozen=True)
class CorpusSlice:
    """A task's share of a staged corpus: lines [first, first + count) of the corpus, read from `files`.

    `files` holds (path, first line in the corpus, line count) for each staged file the range touches.
    """

    first: int
    count: int
    files: tuple[tuple[str, int, int], ...]


@dataclass
class StagedCorpus:
    """A corpus copied into line-range files under `directory`, with what is known about it before any job runs."""

    directory: str
    source: str  # "file" or "wordfreq"
    description: str  # one line for people: where the sentences came from
    path: str | None  # the corpus file, when source == "file"
    lines: int
    bytes: int
    files: list[tuple[str, int, int]] = field(default_factory=list)  # (path, first line, line count)
    truncated: bool = False  # --max-sentences stopped the copy before the end of the corpus
    sampling: dict[str, Any] | None = None

    def slice(self, first: int, count: int) -> CorpusSlice:
        """The lines [first, first + count) as a task's input."""
        end = first + count
        touched = tuple(f for f in self.files if f[1] < end and f[1] + f[2] > first)
        return CorpusSlice(first, count, touched)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("files")
        d["staged_files"] = len(self.files)
        return d


def read_slice(sl: CorpusSlice) -> list[bytes]:
    """The raw lines of a slice, in order (without their line terminators)."""
    out: list[bytes] = []
    for path, file_first, file_count in sl.files:
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if len(lines) != file_count:
            raise CorpusError(f"staged file {path} has {len(lines)} lines, expected {file_count}: it changed")
        lo = max(sl.first - file_first, 0)
        hi = min(sl.first + sl.count - file_first, file_count)
        out.extend(lines[lo:hi])
    return out


def split_tasks(total_lines: int, lines_per_task: int, min_tasks: int) -> list[tuple[int, int]]:
    """(first, count) line ranges covering [0, total_lines): about `lines_per_task` each, at least `min_tasks` of
    them (so every worker gets work on a small slice), never an empty one."""
    if total_lines <= 0:
        return []
    n = max(math.ceil(total_lines / max(lines_per_task, 1)), min_tasks)
    n = min(n, total_lines)
    bounds = np.linspace(0, total_lines, n + 1).round().astype(np.int64)
    return [(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _open_corpus(path: Path) -> Any:
    try:
        f = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except FileNotFoundError:
        raise CorpusError(f"corpus not found: {path}") from None
    except IsADirectoryError:
        raise CorpusError(f"corpus {path} is a directory; give a file with one sentence per line") from None
    except OSError as e:
        raise CorpusError(f"corpus {path} cannot be read: {e.strerror or e}") from None
    try:
        magic = f.read(2)
        f.seek(0)
    except OSError as e:
        f.close()
        raise CorpusError(f"corpus {path} cannot be read: {e.strerror or e}") from None
    if magic == _GZIP_MAGIC:
        # GzipFile does not close a file object it was given, so it opens the path itself.
        f.close()
        return gzip.open(path, "rb")
    return f


class _Stager:
    """Writes lines into numbered files of about `_BLOCK` bytes, recording each file's first line and line count."""

    def __init__(self, directory: Path, max_lines: int | None) -> None:
        self.directory = directory
        self.max_lines = max_lines
        self.files: list[tuple[str, int, int]] = []
        self.lines = 0
        self.bytes = 0
        self.full = False

    def add(self, chunk: bytes) -> None:
        """Adds whole lines (chunk ends with b"\\n")."""
        if self.full or not chunk:
            return
        n = chunk.count(b"\n")
        if self.max_lines is not None and self.lines + n >= self.max_lines:
            keep = self.max_lines - self.lines
            end = -1
            for _ in range(keep):
                end = chunk.index(b"\n", end + 1)
            chunk, n = chunk[: end + 1], keep
            self.full = True
        if n == 0:
            return
        path = self.directory / f"part-{len(self.files):05d}.txt"
        path.write_bytes(chunk)
        self.files.append((str(path), self.lines, n))
        self.lines += n
        self.bytes += len(chunk)


def stage_corpus(
    path: str | os.PathLike[str], directory: str | os.PathLike[str], max_lines: int | None = None
) -> StagedCorpus:
    """Copies the corpus at `path` (plain or gzip) into `directory`, at most `max_lines` lines.

    Raises CorpusError for a missing, unreadable, corrupt or empty corpus.
    """
    p = Path(path)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    st = _Stager(d, max_lines)
    f = _open_corpus(p)
    try:
        tail = b""
        while not st.full:
            try:
                block = f.read(_BLOCK)
            except (OSError, EOFError, zlib.error) as e:
                raise CorpusError(f"corpus {p} cannot be read (corrupt or truncated gzip?): {e}") from None
            if not block:
                break
            block = tail + block
            cut = block.rfind(b"\n") + 1
            tail = block[cut:]
            st.add(block[:cut])
        if tail and not st.full:
            st.add(tail + b"\n")  # a last line without a terminator is still a sentence
    finally:
        f.close()
    if st.lines == 0:
        raise CorpusError(f"corpus {p} is empty (no lines)")
    return StagedCorpus(
        directory=str(d),
        source="file",
        description=f"corpus file {p}" + (f" (first {st.lines:,} lines)" if st.full else ""),
        path=str(p),
        lines=st.lines,
        bytes=st.bytes,
        files=st.files,
        truncated=st.full,
    )


def stage_sentences(
    sentences: Iterator[str] | Sequence[str], directory: str | os.PathLike[str], description: str
) -> StagedCorpus:
    """Stages sentences given in memory (e.g. sampled ones)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    st = _Stager(d, None)
    buf: list[bytes] = []
    size = 0
    for s in sentences:
        b = s.encode("utf-8") + b"\n"
        buf.append(b)
        size += len(b)
        if size >= _BLOCK:
            st.add(b"".join(buf))
            buf, size = [], 0
    st.add(b"".join(buf))
    if st.lines == 0:
        raise CorpusError("no sentences to stage")
    return StagedCorpus(
        directory=str(d),
        source="memory",
        description=description,
        path=None,
        lines=st.lines,
        bytes=st.bytes,
        files=st.files,
    )


def sample_wordfreq_sentences(
    n: int, *, seed: int = 0, vocabulary: int = 50_000, mean_length: float = 22.0
) -> tuple[list[str], dict[str, Any]]:
    """`n` synthetic English sentences drawn from the word frequencies shipped in the `wordfreq` package.

    Words are the `vocabulary` most frequent English words (wordfreq's "best" list, words with a letter only), drawn
    independently with probability proportional to their frequency (a Zipf-shaped unigram distribution). Sentence
    lengths follow a gamma distribution with mean `mean_length` (shape 3, a right-skewed spread like news text). The
    first word is capitalised and each sentence ends with a " ." token. Returns the sentences and a description of
    the sampling (for the report).
    """
    try:
        import wordfreq
    except ImportError:
        raise CorpusError(
            "no corpus given and the `wordfreq` package is not installed: pip install wordfreq, or pass --corpus PATH"
        ) from None
    if n < 1:
        raise CorpusError("the number of sampled sentences must be >= 1")
    freqs = wordfreq.get_frequency_dict("en", wordlist="best")
    words: list[str] = []
    weights: list[float] = []
    for w, fr in freqs.items():  # ordered from most to least frequent
        if any(c.isalpha() for c in w) and not any(c.isspace() for c in w):
            words.append(w)
            weights.append(fr)
            if len(words) == vocabulary:
                break
    p = np.asarray(weights, dtype=np.float64)
    p /= p.sum()
    rng = np.random.default_rng(seed)
    shape = 3.0
    lengths = np.maximum(1, np.rint(rng.gamma(shape, (mean_length - 1) / shape, size=n))).astype(np.int64)
    idx = rng.choice(len(words), size=int(lengths.sum()), p=p)
    vocab = np.asarray(words, dtype=object)
    drawn = vocab[idx].tolist()
    out: list[str] = []
    pos = 0
    for length in lengths.tolist():
        sent = drawn[pos : pos + length]
        pos += length
        sent[0] = sent[0][:1].upper() + sent[0][1:]
        sent.append(".")
        out.append(" ".join(sent))
    info = {
        "package": "wordfreq",
        "package_version": getattr(wordfreq, "__version__", "unknown"),
        "language": "en",
        "wordlist": "best",
        "vocabulary": len(words),
        "sentences": n,
        "seed": seed,
        "length_distribution": f"1 + gamma(shape {shape:g}, mean {mean_length:g}) words, plus a final '.'",
    }
    return out, info


def manifest(staged: StagedCorpus) -> str:
    """The staged corpus as JSON (kept beside the files, for people looking at a scratch directory)."""
    return json.dumps({**staged.summary(), "files": staged.files}, indent=1)
