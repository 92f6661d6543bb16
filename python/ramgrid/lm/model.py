"""The unigram language model: token counts from a MapReduce job on the grid, turned into (token, ln p) and written
into a grid table.

Probabilities are natural logarithms (ln, base e) of:

- MLE (the reference experiment's):  p(w) = c(w) / N, where N is the number of tokens in the corpus. A token never
  seen has probability 0, so its log probability is -inf.
- add-k:  p(w) = (c(w) + k) / (N + k (V + 1)), where V is the number of distinct tokens, and every unseen token shares
  the probability of one extra vocabulary entry, <unk>: p(<unk>) = k / (N + k (V + 1)). The V + 1 probabilities sum
  to one.

Counting is a word count on `ramgrid.mapreduce` (`ramgrid.lm.count`): map tasks on the Dask workers tokenise byte
ranges of the staged corpus, and the store sums their counts on write. The driver turns the counts into log
probabilities and scatters them to the workers in parts; load tasks then write the parts, in parallel, into one open
version of the table, together with the unknown-word entry under `UNK_KEY`. The version is sealed and made current
only when every load task succeeded, so a failed load never becomes visible.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ramgrid.lm.corpus import CorpusError, StagedCorpus
from ramgrid.lm.count import CountStats, count_slice, run_count_job

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


def _load_part(part: tuple[list[str], np.ndarray], into: ramgrid.VersionPart) -> int:
    """Load task: writes one bucket of the model into the open version `into` (the driver commits it)."""
    keys, values = part
    for lo in range(0, len(keys), _PUT_BATCH):
        into.put_many(keys[lo : lo + _PUT_BATCH], values[lo : lo + _PUT_BATCH])
    return len(keys)


@dataclass
class LanguageModel:
    """A counted model: its statistics, and its parts as Dask futures of (tokens, ln p), on the workers.

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
    count_job: dict[str, Any] = field(default_factory=dict, repr=False)  # the job's summary (mapreduce.Summary)

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
            "count_job": self.count_job,
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


def count_model(
    client: Client,
    corpus: StagedCorpus,
    smoothing: Smoothing | None = None,
    *,
    grid: ramgrid.Grid | None = None,
    lines_per_task: int = 20_000,
    buckets: int | None = None,
) -> LanguageModel:
    """Counts the corpus with a MapReduce job on `grid` (`ramgrid.lm.count`; None: a local grid of two servers,
    started for the job) and the Dask `client`'s workers, then computes ln p for every token and scatters the model
    to the workers in `buckets` parts (default: two per worker). Raises CorpusError when the corpus has no tokens."""
    import ramgrid

    sm = smoothing or Smoothing()
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    t0 = time.perf_counter()
    if grid is None:
        with ramgrid.local(servers=2, memory="1GiB") as g:
            stats, counts, job = run_count_job(client, g, corpus, lines_per_task)
    else:
        stats, counts, job = run_count_job(client, grid, corpus, lines_per_task)
    vocabulary = len(counts)
    total = sum(counts.values())
    if total != stats.tokens:
        raise RuntimeError(f"the job counted {total} tokens under their keys but {stats.tokens} in its statistics")
    if total == 0:
        raise CorpusError(
            f"the corpus has {stats.lines:,} lines but no tokens: a language model needs at least one token"
        )
    keys = list(counts)
    values = log_probs(np.fromiter(counts.values(), dtype=np.int64, count=vocabulary), total, vocabulary, sm)
    step = -(-vocabulary // (buckets or 2 * workers))
    parts = client.scatter([(keys[i : i + step], values[i : i + step]) for i in range(0, vocabulary, step)])
    return LanguageModel(
        smoothing=sm,
        total_tokens=total,
        vocabulary=vocabulary,
        unk_log_prob=unk_log_prob(total, vocabulary, sm),
        stats=stats,
        parts=parts,
        count_s=time.perf_counter() - t0,
        count_job=job,
    )


def load_into_grid(
    client: Client,
    grid: ramgrid.Grid,
    model: LanguageModel,
    table: str = "unigram_lm",
    *,
    partitions: int = 64,
    replication: int | None = None,
) -> int:
    """Writes the model into a new version of `table` (created as f64 if missing) from the Dask workers, in parallel,
    and makes it current; returns the version. On any failure the new version is dropped and never seen."""
    from ramgrid.exceptions import TableExists

    try:
        # None: the grid's default (1, or what `ramgrid.dask.start(replication=)` gave its grid).
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
