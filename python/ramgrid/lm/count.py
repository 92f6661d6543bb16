"""The model's counting job: a word count on `ramgrid.mapreduce`, with the experiment's tokeniser and statistics.

The job reads the staged corpus files (one map task per byte range of whole lines, run on the Dask workers), counts
tokens as the experiment tokenises them (`decode_lines`, then `tokenize_lines`: invalid UTF-8 replaced, tokens over
100 characters dropped), and sums the counts with the store's merge on write (reducer "sum"), so no reduce phase
runs. The corpus statistics (`CountStats`) travel with the counts, under keys that begin with a space: a token never
contains whitespace, so no token can be one of them, and summing them is how the statistics of the map tasks add
up. The driver takes them out of the result, which leaves exactly the token counts.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from itertools import chain
from typing import TYPE_CHECKING, Any

from ramgrid.lm.corpus import CorpusError, CorpusSlice, StagedCorpus, decode_lines, read_slice, tokenize_lines

if TYPE_CHECKING:
    import ramgrid

__all__ = ["CountStats", "count_block", "count_lines", "count_slice", "run_count_job"]


@dataclass
class CountStats:
    """What the counting job learnt about the corpus (summed over its map tasks, like Hadoop counters)."""

    lines: int = 0
    tokens: int = 0
    dropped_long_tokens: int = 0
    replaced_lines: int = 0  # lines with bytes that are not UTF-8 (replaced with U+FFFD)
    empty_lines: int = 0

    def add(self, other: CountStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


# The key each statistic is counted under in the job's output: " lines", " tokens", ... (never a token: see above).
_STAT_KEYS = {f.name: " " + f.name for f in fields(CountStats)}


def count_lines(raw: Sequence[bytes]) -> tuple[CountStats, Counter[str]]:
    """Token counts of raw lines (without terminators), and their statistics."""
    lines, replaced = decode_lines(raw)
    sents, dropped = tokenize_lines(lines)
    counts: Counter[str] = Counter(chain.from_iterable(sents))
    stats = CountStats(
        lines=len(lines),
        tokens=sum(map(len, sents)),
        dropped_long_tokens=dropped,
        replaced_lines=replaced,
        empty_lines=sum(1 for s in sents if not s),
    )
    return stats, counts


def count_slice(sl: CorpusSlice) -> tuple[CountStats, dict[str, int]]:
    """Token counts of a slice of a staged corpus (the plain-Python count the job must equal)."""
    stats, counts = count_lines(read_slice(sl))
    return stats, dict(counts)


def count_block(block: bytes) -> dict[str, int]:
    """The job's vectorised mapper: token counts of a block of whole lines, with the statistics under their keys."""
    from ramgrid.lm.score import _gc_paused

    lines = block.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the terminator of the last line, not an empty line
    with _gc_paused():
        stats, counts = count_lines(lines)
    out: dict[str, int] = dict(counts)
    for name, key in _STAT_KEYS.items():
        out[key] = getattr(stats, name)
    return out


def _chunk_bytes(corpus: StagedCorpus, lines_per_task: int, min_tasks: int) -> int:
    """Bytes per map task for about `lines_per_task` lines each, and at least `min_tasks` tasks."""
    per_line = corpus.bytes / max(corpus.lines, 1)
    chunk = max(1, round(per_line * max(lines_per_task, 1)))
    return max(1, min(chunk, math.ceil(corpus.bytes / max(min_tasks, 1))))


def run_count_job(
    client: Any, grid: ramgrid.Grid, corpus: StagedCorpus, lines_per_task: int
) -> tuple[CountStats, dict[str, int], dict[str, Any]]:
    """Runs the count on `grid` with map tasks on the Dask `client`'s workers; returns the statistics, the token
    counts and the job's summary (as a dict). Raises CorpusError when the job did not read the whole staged corpus
    (a file added to or changed in its directory)."""
    from ramgrid import mapreduce

    workers = max(1, len(client.scheduler_info().get("workers", {})))
    res = mapreduce.run(
        grid,
        corpus.directory,
        count_block,
        "sum",
        vectorised=True,
        dask_client=client,
        format="text",
        chunk_bytes=_chunk_bytes(corpus, lines_per_task, 2 * workers),
        progress=False,
    )
    counts: dict[str, int] = res.result or {}
    stats = CountStats(**{name: int(counts.pop(key, 0)) for name, key in _STAT_KEYS.items()})
    if stats.lines != corpus.lines:
        raise CorpusError(
            f"the count job read {stats.lines:,} lines from {corpus.directory}, but {corpus.lines:,} were staged there"
        )
    return stats, counts, asdict(res.summary)
