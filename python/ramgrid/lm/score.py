"""The scoring job: map over line ranges of the corpus on Dask, look up every token's ln p, emit (sentence id, score).

A sentence's score is `math.fsum` of its tokens' log probabilities (a token the model lacks gets the unknown-word
value). fsum is correctly rounded whatever the order or grouping of the additions, so every mode and every peer
gives bit-identical scores as long as it finds the same per-token values; the tests hold them to that.

Modes (how a task asks for values):

- ``per-token``: one synchronous lookup per token, the reference experiment's architecture.
- ``per-sentence``: one batch per sentence.
- ``per-partition``: one batch per task (a line range of a few thousand sentences), each distinct token once.
- ``fused``: the task hands its raw lines to the grid client's fused lookup-reduce (`PinnedTable.lookup_reduce`),
  which decodes, tokenises (the same rule as corpus.py), looks each distinct token up once and sums each sentence
  with an exact fsum in Rust, without the GIL; the scores come back as one array. ramgrid source only. Its lookup
  time is the whole fused call, tokenising and summing included.
- ``noop``: no lookup; a constant per token. Its running time is the job's own overhead (reading, decoding,
  tokenising, Dask), which the paper subtracts to get the lookup throughput.

Sources (what answers the lookups): ``ramgrid`` (a pinned table, with or without the near cache), ``memcached``
(pymemcache over real memcached servers), ``dict`` (the whole model in a dict in each worker: the ceiling when it
fits in memory). Each task counts, like a Hadoop counter, its lookups (tokens resolved), calls (requests made),
keys (keys sent) and the time spent inside lookup calls; the driver sums them.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ramgrid.exceptions import RamgridError
from ramgrid.lm.corpus import CorpusSlice, StagedCorpus, decode_lines, read_slice, split_tasks, tokenize_lines

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "MODES",
    "SOURCES",
    "LookupFailed",
    "RunResult",
    "ScoringFailed",
    "SharedModel",
    "Source",
    "reference_scores",
    "run_scoring",
    "score_slice",
    "score_to_file",
    "write_scores",
]

MODES = ("per-token", "per-sentence", "per-partition", "fused", "noop")
SOURCES = ("ramgrid", "memcached", "dict", "noop")
NOOP_VALUE = -1.0
_GRID_BATCH = 250_000  # keys per get_many: bounds the size of one request frame


class LookupFailed(RamgridError):
    """A scoring task could not look its tokens up. Crosses from the Dask worker to the driver by pickling."""

    def __init__(self, message: str, partitions: list[int] | None = None) -> None:
        super().__init__(message)
        self.partitions = list(partitions or [])

    def __reduce__(self) -> Any:
        return (LookupFailed, (str(self.args[0]) if self.args else "", self.partitions))


class ScoringFailed(RamgridError):
    """The scoring job failed; no scores were written. `partitions` names the grid partitions that had no live
    replica, when that was the cause."""

    def __init__(self, message: str, partitions: list[int] | None = None) -> None:
        super().__init__(message)
        self.partitions = list(partitions or [])


class SharedModel:
    """The whole model as a dict, wrapped so that Dask sends it as one pickle. (Dask serialises a bare dict entry by
    entry, which takes seconds for a few hundred thousand tokens.) Broadcast it with
    `client.scatter([SharedModel(d)], broadcast=True)[0]` and pass the future as `model` to the dict source."""

    __slots__ = ("values",)

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def __sizeof__(self) -> int:  # what Dask's memory accounting sees: about 100 bytes per entry
        return sys.getsizeof(self.values) + 100 * len(self.values)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector. Tokenising allocates a list per sentence, and every few hundred lists the
    collector would walk the heap, which in a worker holding a model dict doubles the cost of a task. Tasks create
    no reference cycles, so nothing is lost; collection resumes afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True)
class Source:
    """What scoring tasks look tokens up in. `table` is a PinnedTable for "ramgrid"; `servers` the memcached
    servers for "memcached". The model dict for "dict" travels separately (a Dask future broadcast to workers)."""

    kind: str
    unk: float
    table: Any = None
    servers: tuple[tuple[str, int], ...] = ()
    label: str = ""
    hasher: str = "crc32"  # memcached: how the client maps keys to servers (see peers.Crc32ModuloHash)

    def __post_init__(self) -> None:
        if self.kind not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.kind!r}")

    @property
    def name(self) -> str:
        return self.label or self.kind


def _lookups(
    source: Source, model: dict[str, float] | None
) -> tuple[Callable[[str], float], Callable[[list[str]], list[float]]]:
    """(one token -> value, list of tokens -> list of values) for a source, inside a worker."""
    unk = source.unk
    if source.kind == "ramgrid":
        table = source.table

        def one(tok: str) -> float:
            return float(table.get(tok, default=unk))

        def many(toks: list[str]) -> list[float]:
            if len(toks) <= _GRID_BATCH:
                return list(table.get_many(toks, default=unk).tolist())
            out: list[float] = []
            for lo in range(0, len(toks), _GRID_BATCH):
                out.extend(table.get_many(toks[lo : lo + _GRID_BATCH], default=unk).tolist())
            return out

        return one, many
    if source.kind == "memcached":
        from ramgrid.lm.peers import MEMCACHED_BATCH, mc_key, memcached_client

        mc = memcached_client(source.servers, source.hasher)

        def one_mc(tok: str) -> float:
            v = mc.get(mc_key(tok))
            return unk if v is None else float(v)

        def many_mc(toks: list[str]) -> list[float]:
            keys = [mc_key(t) for t in toks]
            got: dict[bytes, bytes] = {}
            for lo in range(0, len(keys), MEMCACHED_BATCH):
                got.update(mc.get_many(keys[lo : lo + MEMCACHED_BATCH]))
            return [unk if v is None else float(v) for v in map(got.get, keys)]

        return one_mc, many_mc
    if source.kind == "dict":
        if model is None:
            raise LookupFailed("the dict source needs the model dict in the worker")
        get = model.get

        def one_d(tok: str) -> float:
            return get(tok, unk)

        def many_d(toks: list[str]) -> list[float]:
            return list(map(get, toks, repeat(unk)))

        return one_d, many_d
    raise LookupFailed(f"source {source.kind!r} has no lookups")


def _describe_failure(e: BaseException, source: Source, sl: CorpusSlice) -> LookupFailed:
    where = f"sentences {sl.first}..{sl.first + sl.count - 1}"
    parts = [int(p) for p in getattr(e, "partitions", None) or []]
    if source.kind == "ramgrid":
        tname = getattr(source.table, "name", "?")
        version = getattr(source.table, "version", "?")
        if parts:
            msg = (
                f"grid partitions {parts} of table {tname!r} (version {version}) have no live replica, so the "
                f"lookups for {where} cannot be answered ({type(e).__name__}: {e})"
            )
        else:
            msg = f"looking up {where} in table {tname!r} (version {version}) failed: {type(e).__name__}: {e}"
    else:
        msg = f"looking up {where} in {source.name} failed: {type(e).__name__}: {e}"
    return LookupFailed(msg, parts)


def score_slice(sl: CorpusSlice, mode: str, source: Source, model: Any = None) -> dict[str, Any]:
    """Scoring task for one line range. Returns the scores (one per line, in order) and the task's counters.
    `model` is the dict source's model: a SharedModel or a plain dict."""
    with _gc_paused():
        return _score_slice(sl, mode, source, model.values if isinstance(model, SharedModel) else model)


def _score_slice(sl: CorpusSlice, mode: str, source: Source, model: dict[str, float] | None) -> dict[str, Any]:
    t_start = time.perf_counter()
    if mode == "fused" and source.kind != "noop":
        return _score_slice_fused(sl, source, t_start)
    lines, _ = decode_lines(read_slice(sl))
    sents, _ = tokenize_lines(lines)
    tokens = sum(map(len, sents))
    fsum = math.fsum
    ns = 0
    calls = 0
    keys_sent = 0
    pc = time.perf_counter_ns
    try:
        if mode == "noop" or source.kind == "noop":
            scores = [fsum(repeat(NOOP_VALUE, len(s))) for s in sents]
        else:
            one, many = _lookups(source, model)
            if mode == "per-token":
                scores = []
                for s in sents:
                    vals = []
                    for tok in s:
                        t0 = pc()
                        v = one(tok)
                        ns += pc() - t0
                        vals.append(v)
                    scores.append(fsum(vals))
                calls = keys_sent = tokens
            elif mode == "per-sentence":
                scores = []
                for s in sents:
                    if not s:
                        scores.append(0.0)
                        continue
                    t0 = pc()
                    vals = many(s)
                    ns += pc() - t0
                    calls += 1
                    scores.append(fsum(vals))
                keys_sent = tokens
            elif mode == "per-partition":
                # Each distinct token once, then a dict local to the task for the per-token pass. The dict source
                # does the same (a lookup in a dict of millions of keys misses the CPU caches more than this does).
                uniq = list(dict.fromkeys(chain.from_iterable(sents)))
                t0 = pc()
                vals = many(uniq) if uniq else []
                ns += pc() - t0
                calls, keys_sent = (1 if uniq else 0), len(uniq)
                value_of = dict(zip(uniq, vals)).__getitem__
                scores = [fsum(map(value_of, s)) for s in sents]
            else:
                raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    except LookupFailed:
        raise
    except Exception as e:  # every lookup failure is reported the same way, with where it happened
        if isinstance(e, (RamgridError, OSError)) or type(e).__module__.startswith("pymemcache"):
            raise _describe_failure(e, source, sl) from None
        raise
    return {
        "first": sl.first,
        "scores": np.asarray(scores, dtype=np.float64),
        "sentences": len(sents),
        "tokens": tokens,
        "lookups": 0 if mode == "noop" else tokens,
        "calls": calls,
        "keys": keys_sent,
        "lookup_s": ns / 1e9,
        "task_s": time.perf_counter() - t_start,
        "ended_at": time.time(),  # wall clock, to order tasks against events in the driver (same machine)
        "worker_pid": os.getpid(),
    }


def _score_slice_fused(sl: CorpusSlice, source: Source, t_start: float) -> dict[str, Any]:
    """The fused mode: raw lines in, scores out, all in the Rust client (decode, tokenise, dedupe, look up, fsum)."""
    if source.kind != "ramgrid":
        raise ValueError(f"the fused mode needs the ramgrid source, not {source.name!r}")
    raw = read_slice(sl)
    t0 = time.perf_counter_ns()
    try:
        r = source.table.lookup_reduce(raw, reduce="sum", default=source.unk)
    except (RamgridError, OSError) as e:
        raise _describe_failure(e, source, sl) from None
    ns = time.perf_counter_ns() - t0
    tokens = int(r.counts.sum())
    return {
        "first": sl.first,
        "scores": r.values,
        "sentences": len(raw),
        "tokens": tokens,
        "lookups": tokens,
        "calls": 1 if r.distinct else 0,
        "keys": r.distinct,
        "lookup_s": ns / 1e9,
        "task_s": time.perf_counter() - t_start,
        "ended_at": time.time(),
        "worker_pid": os.getpid(),
    }


@dataclass
class RunResult:
    """One scoring run: the scores (index = sentence id) and the job's summed counters."""

    mode: str
    source: str
    sentences: int
    tokens: int
    lookups: int
    calls: int
    keys: int
    lookup_s: float
    wall_s: float
    tasks: int
    scores: np.ndarray = field(repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "scores"}
        return d


def run_scoring(
    client: Client,
    corpus: StagedCorpus,
    mode: str,
    source: Source,
    *,
    sentences: int | None = None,
    lines_per_task: int = 20_000,
    model: Any = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Scores the first `sentences` lines of the corpus (all by default) with `mode` against `source`.

    The running time is measured from submitting the tasks to having every result in the driver. A task that fails
    stops the job: the others are cancelled and ScoringFailed says which grid partitions (or which server) failed.
    `on_progress(done, total)` is called in the driver as each task's result arrives.
    """
    from distributed import as_completed

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "fused" and source.kind not in ("ramgrid", "noop"):
        raise ValueError(f"the fused mode needs the ramgrid source, not {source.name!r}")
    n = corpus.lines if sentences is None else min(int(sentences), corpus.lines)
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    ranges = split_tasks(n, lines_per_task, 2 * workers)
    slices = [corpus.slice(a, c) for a, c in ranges]
    t0 = time.perf_counter()
    futures = client.map(score_slice, slices, mode=mode, source=source, model=model, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[dict[str, Any] | None] = [None] * len(futures)
    done = 0
    try:
        for fut in as_completed(futures):
            try:
                res = fut.result()
            except LookupFailed as e:
                raise ScoringFailed(
                    f"the scoring job ({mode}, {source.name}) failed: {e}. No scores were written.", e.partitions
                ) from None
            results[index[fut.key]] = res
            done += 1
            if on_progress is not None:
                on_progress(done, len(futures))
    except BaseException:
        client.cancel(futures)
        raise
    wall = time.perf_counter() - t0
    rs = [r for r in results if r is not None]
    scores = np.concatenate([r["scores"] for r in rs]) if rs else np.zeros(0)
    if scores.size != n:
        raise RuntimeError(f"the job returned {scores.size} scores for {n} sentences")
    return RunResult(
        mode=mode,
        source=source.name,
        sentences=n,
        tokens=sum(r["tokens"] for r in rs),
        lookups=sum(r["lookups"] for r in rs),
        calls=sum(r["calls"] for r in rs),
        keys=sum(r["keys"] for r in rs),
        lookup_s=sum(r["lookup_s"] for r in rs),
        wall_s=wall,
        tasks=len(rs),
        scores=scores,
        extra={
            "task_s_sum": sum(r["task_s"] for r in rs),
            "workers_used": len({r["worker_pid"] for r in rs}),
            "task_ended_at": [r["ended_at"] for r in rs],
        },
    )


def reference_scores(
    corpus: StagedCorpus, model: dict[str, float], unk: float, sentences: int | None = None
) -> np.ndarray:
    """Scores computed in this process with a plain dict, with none of the job machinery: the tests' reference."""
    n = corpus.lines if sentences is None else min(sentences, corpus.lines)
    with _gc_paused():
        lines, _ = decode_lines(read_slice(corpus.slice(0, n)))
        sents, _ = tokenize_lines(lines)
        return np.array([math.fsum(model.get(t, unk) for t in s) for s in sents], dtype=np.float64)


def write_scores(path: str | os.PathLike[str], scores: np.ndarray) -> Path:
    """Writes (sentence id, score) as `.npz` (arrays `sentence_id`, `score`) atomically: a reader sees the whole file
    or none."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, sentence_id=np.arange(scores.size, dtype=np.int64), score=scores)
    os.replace(tmp, p)
    return p


def score_to_file(
    client: Client, corpus: StagedCorpus, mode: str, source: Source, path: str | os.PathLike[str], **kwargs: Any
) -> RunResult:
    """Runs the scoring job and writes its (sentence id, score) pairs to `path` (see `write_scores`) only when every
    task succeeded. A file already at `path` is removed first, so a failed job never leaves scores that look like
    its own. Keyword arguments go to `run_scoring`."""
    Path(path).unlink(missing_ok=True)
    result = run_scoring(client, corpus, mode, source, **kwargs)
    write_scores(path, result.scores)
    return result
