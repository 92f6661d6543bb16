"""The unigram language model: a Dask MapReduce job that counts tokens and writes (token, ln p) into a grid table.

Probabilities are natural logarithms (ln, base e) of:

- MLE (the reference experiment's):  p(w) = c(w) / N, where N is the number of tokens in the corpus. A token never
  seen has probability 0, so its log probability is -inf.
- add-k:  p(w) = (c(w) + k) / (N + k (V + 1)), where V is the number of distinct tokens, and every unseen token shares
  the probability of one extra vocabulary entry, <unk>: p(<unk>) = k / (N + k (V + 1)). The V + 1 probabilities sum
  to one.

The job: map tasks tokenise line ranges of the staged corpus and count tokens, splitting their counts into R buckets
by a stable hash of the token (Python's own str hash differs between worker processes) that they spill to files;
R reduce tasks merge one bucket each; then R load tasks turn counts into log probabilities and write them, in parallel, into one open version
of the table, together with the unknown-word entry under `UNK_KEY`. The version is sealed and made current only when
every load task succeeded, so a failed load never becomes visible.
"""

from __future__ import annotations

import math
import os
import pickle
import shutil
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from ramgrid.lm.corpus import CorpusError, StagedCorpus, decode_lines, read_slice, split_tasks, tokenize_lines

if TYPE_CHECKING:
    from distributed import Client

    import ramgrid

__all__ = [
    "UNK_KEY",
    "CountStats",
    "LanguageModel",
    "Smoothing",
    "count_model",
    "count_slice",
    "load_into_grid",
    "log_probs",
    "unk_log_prob",
]

# The key of the unknown-word probability. It contains a space, so no whitespace token can ever be equal to it.
UNK_KEY = " <unk>"
_PUT_BATCH = 100_000


@dataclass(frozen=True)
class Smoothing:
    """`method` is "mle" or "add-k"; `k` is used by add-k only."""

    method: str = "mle"
    k: float = 1.0

    def __post_init__(self) -> None:
        if self.method not in ("mle", "add-k"):
            raise ValueError(f"smoothing must be 'mle' or 'add-k', got {self.method!r}")
        if self.method == "add-k" and not (self.k > 0 and math.isfinite(self.k)):
            raise ValueError(f"add-k smoothing needs a finite k > 0, got {self.k!r}")

    def describe(self) -> str:
        return "maximum likelihood (MLE)" if self.method == "mle" else f"add-k, k = {self.k:g}"


def log_probs(counts: np.ndarray, total: int, vocabulary: int, smoothing: Smoothing) -> np.ndarray:
    """ln p(w) for tokens with the given counts, in a corpus of `total` tokens and `vocabulary` distinct ones."""
    c = np.asarray(counts, dtype=np.float64)
    if smoothing.method == "mle":
        return np.log(c / float(total))
    denom = float(total) + smoothing.k * (vocabulary + 1)
    return np.log((c + smoothing.k) / denom)


def unk_log_prob(total: int, vocabulary: int, smoothing: Smoothing) -> float:
    """ln p(<unk>): the log probability of a token the corpus never had (-inf under MLE)."""
    if smoothing.method == "mle":
        return float("-inf")
    return math.log(smoothing.k / (float(total) + smoothing.k * (vocabulary + 1)))


@dataclass
class CountStats:
    """What the counting job learnt about the corpus (summed over its map tasks, like Hadoop counters)."""

    lines: int = 0
    tokens: int = 0
    dropped_long_tokens: int = 0
    replaced_lines: int = 0  # lines with bytes that are not UTF-8 (replaced with U+FFFD)
    empty_lines: int = 0

    def add(self, other: CountStats) -> None:
        self.lines += other.lines
        self.tokens += other.tokens
        self.dropped_long_tokens += other.dropped_long_tokens
        self.replaced_lines += other.replaced_lines
        self.empty_lines += other.empty_lines


def _bucket_of(token: str, buckets: int) -> int:
    return zlib.crc32(token.encode("utf-8", "surrogatepass")) % buckets


def count_slice(sl: Any, buckets: int) -> tuple[CountStats, list[dict[str, int]]]:
    """Map task: token counts of a slice, split into `buckets` dicts by a stable hash of the token."""
    from ramgrid.lm.score import _gc_paused

    with _gc_paused():
        return _count_slice(sl, buckets)


def _count_slice(sl: Any, buckets: int) -> tuple[CountStats, list[dict[str, int]]]:
    lines, replaced = decode_lines(read_slice(sl))
    sents, dropped = tokenize_lines(lines)
    counts: Counter[str] = Counter(chain.from_iterable(sents))
    stats = CountStats(
        lines=len(lines),
        tokens=sum(map(len, sents)),
        dropped_long_tokens=dropped,
        replaced_lines=replaced,
        empty_lines=sum(1 for s in sents if not s),
    )
    parts: list[dict[str, int]] = [{} for _ in range(buckets)]
    if buckets == 1:
        parts[0] = dict(counts)
    else:
        for tok, c in counts.items():
            parts[_bucket_of(tok, buckets)][tok] = c
    return stats, parts


def _map_to_files(sl: Any, buckets: int, spill: str, index: int) -> tuple[CountStats, list[str]]:
    """Map task of the job: counts a slice and writes bucket r to `spill`/map-INDEX-rR.pkl (the shuffle goes
    through local files, as Hadoop's does, rather than through the Dask scheduler)."""
    stats, parts = count_slice(sl, buckets)
    paths = []
    for r, part in enumerate(parts):
        path = os.path.join(spill, f"map-{index:05d}-r{r:03d}.pkl")
        with open(path, "wb") as f:
            pickle.dump(part, f, protocol=pickle.HIGHEST_PROTOCOL)
        paths.append(path)
    return stats, paths


def _merge_files(paths: list[str]) -> dict[str, int]:
    """Reduce task: one bucket's counts from every map task's file (each file is removed once read)."""
    from ramgrid.lm.score import _gc_paused

    merged: Counter[str] = Counter()
    with _gc_paused():
        for path in paths:
            with open(path, "rb") as f:
                merged.update(pickle.load(f))
            os.remove(path)
    return dict(merged)


def _size(counts: dict[str, int]) -> tuple[int, int]:
    return len(counts), sum(counts.values())


def _finalize(
    counts: dict[str, int], total: int, vocabulary: int, smoothing: Smoothing
) -> tuple[list[str], np.ndarray]:
    keys = list(counts)
    values = log_probs(np.fromiter(counts.values(), dtype=np.int64, count=len(keys)), total, vocabulary, smoothing)
    return keys, values


def _load_part(part: tuple[list[str], np.ndarray], into: ramgrid.VersionPart) -> int:
    """Load task: writes one bucket of the model into the open version `into` (the driver commits it)."""
    keys, values = part
    for lo in range(0, len(keys), _PUT_BATCH):
        into.put_many(keys[lo : lo + _PUT_BATCH], values[lo : lo + _PUT_BATCH])
    return len(keys)


@dataclass
class LanguageModel:
    """A counted model: its statistics, and its parts as Dask futures of (tokens, ln p) per bucket, on the workers.

    `load_into_grid` writes it into a table; the peers (memcached, the dict in each worker) are loaded from the same
    parts, so every source holds the same values.
    """

    smoothing: Smoothing
    total_tokens: int
    vocabulary: int
    unk_log_prob: float
    stats: CountStats
    parts: list[Any] = field(repr=False)
    count_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "log_base": "e (natural log)",
            "smoothing": self.smoothing.method,
            "k": self.smoothing.k if self.smoothing.method == "add-k" else None,
            "total_tokens": self.total_tokens,
            "vocabulary": self.vocabulary,
            "unk_key": UNK_KEY,
            "unk_log_prob": self.unk_log_prob if math.isfinite(self.unk_log_prob) else str(self.unk_log_prob),
            "count_job_s": self.count_s,
            "corpus": {
                "lines": self.stats.lines,
                "tokens": self.stats.tokens,
                "empty_lines": self.stats.empty_lines,
                "dropped_long_tokens": self.stats.dropped_long_tokens,
                "replaced_lines": self.stats.replaced_lines,
            },
        }

    def gather(self, client: Client) -> dict[str, float]:
        """The whole model as a plain dict in this process (token -> ln p), without the unknown-word entry."""
        d: dict[str, float] = {}
        for keys, values in client.gather(self.parts):
            d.update(zip(keys, values.tolist()))
        return d


def count_job(client: Client, corpus: StagedCorpus, lines_per_task: int, buckets: int) -> tuple[CountStats, list[Any]]:
    """Runs the map and reduce stages; returns the corpus statistics and one future of merged counts per bucket.

    Map outputs are spilled next to the staged corpus (workers and driver share the file system, as they do for the
    corpus itself) and removed as the reduce tasks read them."""
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    tasks = split_tasks(corpus.lines, lines_per_task, 2 * workers)
    slices = [corpus.slice(a, n) for a, n in tasks]
    spill = tempfile.mkdtemp(prefix="shuffle-", dir=os.path.dirname(os.path.abspath(corpus.directory)))
    try:
        maps = client.map(
            _map_to_files, slices, [buckets] * len(slices), [spill] * len(slices), range(len(slices)), pure=False
        )
        stats = CountStats()
        files: list[list[str]] = [[] for _ in range(buckets)]
        for st, paths in client.gather(maps):
            stats.add(st)
            for r, path in enumerate(paths):
                files[r].append(path)
        merged = client.map(_merge_files, files, pure=False)
        client.gather(client.map(len, merged, pure=False))  # every spill file read before the directory goes
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    return stats, merged


def count_model(
    client: Client,
    corpus: StagedCorpus,
    smoothing: Smoothing | None = None,
    *,
    lines_per_task: int = 20_000,
    buckets: int | None = None,
) -> LanguageModel:
    """Counts the corpus on Dask and computes ln p for every token. Raises CorpusError when it has no tokens."""
    sm = smoothing or Smoothing()
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    r = buckets or 2 * workers
    t0 = time.perf_counter()
    stats, merged = count_job(client, corpus, lines_per_task, r)
    sizes = client.gather(client.map(_size, merged, pure=False))
    vocabulary = sum(v for v, _ in sizes)
    total = sum(c for _, c in sizes)
    if total != stats.tokens:
        raise RuntimeError(f"the reduce stage counted {total} tokens but the map stage {stats.tokens}")
    if total == 0:
        raise CorpusError(
            f"the corpus has {stats.lines:,} lines but no tokens: a language model needs at least one token"
        )
    parts = client.map(_finalize, merged, total=total, vocabulary=vocabulary, smoothing=sm, pure=False)
    client.gather(client.map(len, parts, pure=False))  # wait, so count_s covers the whole job
    return LanguageModel(
        smoothing=sm,
        total_tokens=total,
        vocabulary=vocabulary,
        unk_log_prob=unk_log_prob(total, vocabulary, sm),
        stats=stats,
        parts=parts,
        count_s=time.perf_counter() - t0,
    )


def load_into_grid(
    client: Client,
    grid: ramgrid.Grid,
    model: LanguageModel,
    table: str = "unigram_lm",
    *,
    partitions: int = 64,
    replication: int = 1,
) -> int:
    """Writes the model into a new version of `table` (created as f64 if missing) from the Dask workers, in parallel,
    and makes it current; returns the version. On any failure the new version is dropped and never seen."""
    from ramgrid.exceptions import TableExists

    try:
        t = grid.create_table(table, partitions=partitions, replication=replication, value_type="f64")
    except TableExists:
        t = grid.table(table)
        vt = t.describe().get("value_type")
        if vt != "f64":
            raise ValueError(f"table {table!r} exists with value type {vt}, not f64") from None
    with t.new_version() as v:
        loaded = client.gather(client.map(_load_part, model.parts, into=v.part(), pure=False))
        if sum(loaded) != model.vocabulary:
            raise RuntimeError(f"loaded {sum(loaded)} tokens, expected {model.vocabulary}")
        v.put_many([UNK_KEY], np.array([model.unk_log_prob]))
        version = v.version
    return version
