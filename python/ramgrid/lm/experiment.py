"""The reference experiment, end to end: stage a corpus, build the model on Dask, then score it against ramgrid,
memcached and a dict for 1, 2 and 4 servers, and hand every figure to the report.

Runs, for each server count n:
  - ramgrid (no near cache) and ramgrid with the near cache: per-token, per-sentence, per-partition, and fused
    (the client's lookup-reduce in Rust: raw lines in, sentence scores out);
  - memcached (n servers, pymemcache HashClient): per-token, per-sentence, per-partition (it has no fused mode);
  - NoOp on every workload (the job's own overhead, subtracted for the paper's throughput);
and once, as the ceiling: a dict in each worker (per-token and per-partition); and once, on the first server count's
grid before its runs, the memory each way of holding the model costs per host with 2 and 8 worker processes (PSS:
ramgrid.lm.memory).

Per-token modes run on the first `per_token_sentences` sentences only (they are slow by design); per-sentence modes
on the first `per_sentence_sentences` (all by default). Every run of a workload must give bit-identical scores; the
experiment fails otherwise. Before each run the workers drop their clients, so connections are opened and near
caches filled inside the measured time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ramgrid.exceptions import RamgridError
from ramgrid.lm.corpus import StagedCorpus, sample_wordfreq_sentences, stage_corpus, stage_sentences
from ramgrid.lm.model import UNK_KEY, LanguageModel, Smoothing, count_model, load_into_grid
from ramgrid.lm.peers import (
    MemcachedCluster,
    load_memcached_part,
    mc_key,
    memcached_available,
    memcached_client,
    memcached_version,
    reset_worker_clients,
)
from ramgrid.lm.score import RunResult, SharedModel, Source, reference_scores, run_scoring, write_scores

__all__ = ["ExperimentConfig", "ExperimentError", "prepare_corpus", "run_experiment"]

LOOKUP_MODES = ("per-token", "per-sentence", "per-partition", "fused")
GRID_ONLY_MODES = ("fused",)  # modes only the ramgrid client offers: the other peers skip them
PEERS = ("ramgrid", "near", "shm", "memcached", "dict")
TABLE = "unigram_lm"


class ExperimentError(RamgridError):
    """The experiment found a result it cannot stand behind (e.g. two modes disagreeing on a score)."""


@dataclass
class ExperimentConfig:
    corpus: str | None = None
    max_sentences: int | None = None
    sample_sentences: int = 100_000
    seed: int = 0
    smoothing: str = "mle"
    k: float = 1.0
    servers: tuple[int, ...] = (1, 2, 4)
    workers: int = 2
    threads_per_worker: int = 1
    lines_per_task: int = 20_000
    per_token_sentences: int = 2_000
    per_sentence_sentences: int | None = 20_000  # None or 0: all
    modes: tuple[str, ...] = LOOKUP_MODES
    peers: tuple[str, ...] = PEERS
    near_cache_mb: int = 256
    memory_workers: tuple[int, ...] = (2, 8)  # worker counts of the memory step (ramgrid.lm.memory); () skips it
    grid_partitions: int = 64
    replication: int = 1
    server_memory: str = "1GiB"
    server_threads: int = 1
    memcached_mb: int = 1024
    memcached_hasher: str = "crc32"
    reference_max_sentences: int = 300_000
    repeat: int = 1
    out: str = "out/lm"
    work_dir: str | None = None
    write_scores: bool = True
    argv: list[str] = field(default_factory=list)
    command: str = ""  # how it was started, for the report (demo_main fills it in)


def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, flush=True)


def prepare_corpus(cfg: ExperimentConfig, directory: str) -> StagedCorpus:
    """Stages the corpus file, or, with none given, sentences sampled from wordfreq."""
    if cfg.corpus:
        return stage_corpus(cfg.corpus, directory, cfg.max_sentences)
    n = cfg.sample_sentences if cfg.max_sentences is None else min(cfg.sample_sentences, cfg.max_sentences)
    sents, info = sample_wordfreq_sentences(n, seed=cfg.seed)
    desc = (
        f"no --corpus given: {n:,} synthetic sentences sampled from the English word frequencies in the wordfreq "
        f"package (top {info['vocabulary']:,} words, seed {cfg.seed}); not real text"
    )
    staged = stage_sentences(sents, directory, desc)
    staged.source = "wordfreq"
    staged.sampling = info
    return staged


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "processor": platform.processor() or platform.machine(),
    }
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = list(os.getloadavg())
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    import ramgrid

    info["ramgrid"] = ramgrid.__version__
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        repo = Path(ramgrid.__file__).resolve().parents[2]
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=False
        )
        if out.returncode == 0:
            info["commit"] = out.stdout.strip()
    info["memcached"] = memcached_version()
    with contextlib.suppress(ImportError):
        import dask
        import distributed

        info["dask"] = dask.__version__
        info["distributed"] = distributed.__version__
    with contextlib.suppress(ImportError):
        import pymemcache

        info["pymemcache"] = pymemcache.__version__
    return info


@dataclass
class Workloads:
    """Sentence counts of the three workloads (first N lines of the corpus)."""

    full: int
    per_token: int
    per_sentence: int

    def for_mode(self, mode: str) -> int:
        return {"per-token": self.per_token, "per-sentence": self.per_sentence}.get(mode, self.full)

    def distinct(self, modes: Sequence[str]) -> list[int]:
        return sorted({self.for_mode(m) for m in modes} | {self.full})


class _Runner:
    """Runs and records scoring jobs, checking that every run of a workload gives the same scores."""

    def __init__(self, client: Any, corpus: StagedCorpus, cfg: ExperimentConfig, quiet: bool) -> None:
        self.client = client
        self.corpus = corpus
        self.cfg = cfg
        self.quiet = quiet
        self.records: list[dict[str, Any]] = []
        self.first_scores: dict[int, tuple[str, np.ndarray]] = {}
        self.headline: np.ndarray | None = None
        self.model_dict: dict[str, float] = {}
        self.work = ""
        self.memory: dict[str, Any] | None = None  # the memory step's result (ramgrid.lm.memory)

    def run(
        self,
        servers: int | None,
        system: str,
        mode: str,
        source: Source,
        sentences: int,
        reset_configs: Sequence[Any] = (),
        model: Any = None,
    ) -> RunResult:
        tries = []
        for _ in range(max(1, self.cfg.repeat)):
            self.client.run(reset_worker_clients, list(reset_configs))
            tries.append(
                run_scoring(
                    self.client,
                    self.corpus,
                    mode,
                    source,
                    sentences=sentences,
                    lines_per_task=self.cfg.lines_per_task,
                    model=model,
                )
            )
        # The median run by wall time stands for all (the machine is shared, so single runs are noisy).
        r = sorted(tries, key=lambda t: t.wall_s)[len(tries) // 2]
        r.extra["wall_s_all"] = [t.wall_s for t in tries]
        r.extra.pop("task_ended_at", None)
        for t in tries:
            if mode != "noop" and not np.array_equal(t.scores, r.scores):
                raise ExperimentError(f"{system} {mode}: repeated runs gave different scores")
        label = f"{system} {mode}"
        if mode != "noop":
            seen = self.first_scores.get(r.sentences)
            if seen is None:
                self.first_scores[r.sentences] = (label, r.scores)
            elif not np.array_equal(r.scores, seen[1]):
                bad = int(np.flatnonzero(r.scores != seen[1])[0])
                raise ExperimentError(
                    f"{label} ({servers} servers) disagrees with {seen[0]} on sentence {bad}: "
                    f"{r.scores[bad]!r} vs {seen[1][bad]!r}"
                )
            # The scores written out: ramgrid per-partition's, or fused's when per-partition did not run.
            if system == "ramgrid" and (mode == "per-partition" or (mode == "fused" and self.headline is None)):
                self.headline = r.scores
        rec = {"servers": servers, "system": system, **r.to_dict()}
        self.records.append(rec)
        rate = f"{r.lookups / r.wall_s:,.0f} lookups/s end to end" if r.lookups else "(overhead only)"
        _say(self.quiet, f"  {system:<16} {mode:<14} {r.sentences:>10,} sentences  {r.wall_s:8.2f} s  {rate}")
        return r


def _grid_items_per_server(grid: Any, keys: list[str]) -> list[int]:
    """Keys held by each server as primary replica, computed from the client's partition map (the servers' own
    statistics do not break table items down by server)."""
    from ramgrid import _native

    client = grid._client()
    owners = client.partition_owners(TABLE)
    parts = len(owners)
    index = {addr: i for i, addr in enumerate(client.servers())}
    pof = _native.partition_of
    per_part = np.bincount(np.fromiter((pof(k, parts) for k in keys), dtype=np.int64, count=len(keys)), minlength=parts)
    out = [0] * len(index)
    for p, reps in enumerate(owners):
        out[index[reps[0]]] += int(per_part[p])
    return out


def _load_memcached(client: Any, mc: MemcachedCluster, model: LanguageModel, hasher: str) -> float:
    t0 = time.perf_counter()
    servers = tuple(mc.servers)
    loaded = client.gather(client.map(load_memcached_part, model.parts, servers=servers, hasher=hasher, pure=False))
    try:
        memcached_client(servers, hasher).set(mc_key(UNK_KEY), repr(model.unk_log_prob).encode(), noreply=False)
    finally:
        reset_worker_clients()  # the driver's connections; the workers' are reset before each run
    elapsed = time.perf_counter() - t0
    items = sum(mc.items_per_server())
    if sum(loaded) != model.vocabulary or items != model.vocabulary + 1:
        raise ExperimentError(
            f"memcached holds {items} items after loading {sum(loaded)} of {model.vocabulary} tokens (+1 <unk>): "
            "it evicted or refused some; give it more memory (--memcached-mb)"
        )
    return elapsed


def run_experiment(cfg: ExperimentConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Runs everything and returns the result dict the report is made from (see report.py)."""
    from distributed import Client, LocalCluster

    import ramgrid

    for m in cfg.modes:
        if m not in LOOKUP_MODES:
            raise ValueError(f"modes are {', '.join(LOOKUP_MODES)}; got {m!r}")
    for p in cfg.peers:
        if p not in PEERS:
            raise ValueError(f"peers are {', '.join(PEERS)}; got {p!r}")
    peers = list(cfg.peers)
    notes: list[str] = []
    if "memcached" in peers and not memcached_available():
        peers.remove("memcached")
        notes.append("memcached is not installed: the memcached peer was skipped (apt-get install memcached)")
        _say(quiet, "note: " + notes[-1])
    smoothing = Smoothing(cfg.smoothing, cfg.k)
    result: dict[str, Any] = {
        "command": cfg.command or shlex.join(["ramgrid demo lm", *cfg.argv]),
        "argv": list(cfg.argv),
        "config": asdict(cfg),
        "machine": machine_info(),
        "notes": notes,
        "timings_s": {},
    }
    work = tempfile.mkdtemp(prefix="ramgrid-lm-", dir=cfg.work_dir)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    scores_path = out / "scores.npz"
    scores_path.unlink(missing_ok=True)  # a stale file from an earlier run must not pass for this run's output
    try:
        t0 = time.perf_counter()
        corpus = prepare_corpus(cfg, str(Path(work) / "corpus"))
        result["timings_s"]["stage_corpus"] = time.perf_counter() - t0
        _say(quiet, f"corpus: {corpus.description}")
        _say(
            quiet,
            f"  {corpus.lines:,} sentences, {corpus.bytes / 2**20:,.1f} MiB, staged in "
            f"{result['timings_s']['stage_corpus']:.1f} s into {len(corpus.files)} files",
        )
        wl = Workloads(
            full=corpus.lines,
            per_token=min(cfg.per_token_sentences, corpus.lines),
            per_sentence=corpus.lines
            if not cfg.per_sentence_sentences
            else min(cfg.per_sentence_sentences, corpus.lines),
        )
        result["workloads"] = asdict(wl)
        t0 = time.perf_counter()
        with (
            LocalCluster(
                n_workers=cfg.workers,
                threads_per_worker=cfg.threads_per_worker,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                # The scheduler's HTTP endpoint still starts without a dashboard: keep it on loopback, any port.
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster) as client,
        ):
            result["timings_s"]["dask_start"] = time.perf_counter() - t0
            _say(
                quiet,
                f"dask: LocalCluster, {cfg.workers} worker processes x {cfg.threads_per_worker} thread, "
                f"started in {result['timings_s']['dask_start']:.1f} s",
            )
            # The count is a MapReduce job on a grid of its own, stopped before the measured grids start.
            with ramgrid.local(servers=2, memory=cfg.server_memory, threads=cfg.server_threads) as count_grid:
                model = count_model(client, corpus, smoothing, grid=count_grid, lines_per_task=cfg.lines_per_task)
            result["model"] = model.to_dict()
            st = model.stats
            _say(
                quiet,
                f"model: {model.vocabulary:,} distinct tokens of {model.total_tokens:,}, ln p, "
                f"{smoothing.describe()}; counted in {model.count_s:.1f} s",
            )
            job = model.count_job
            _say(
                quiet,
                f"  count job: {job['map_tasks']} map tasks on ramgrid.mapreduce, "
                f"{job['bytes_shuffled'] / 2**20:,.1f} MiB shuffled; "
                + ", ".join(f"{k} {v:.1f} s" for k, v in job["phases"].items()),
            )
            _say(
                quiet,
                f"  dropped {st.dropped_long_tokens:,} tokens longer than 100 characters; "
                f"{st.replaced_lines:,} lines had bytes that are not UTF-8 (replaced)",
            )
            result["corpus"] = {**corpus.summary(), **model.to_dict()["corpus"], "vocabulary": model.vocabulary}
            t0 = time.perf_counter()
            model_dict = model.gather(client)
            result["timings_s"]["gather_model"] = time.perf_counter() - t0
            ref_n = max(wl.distinct(cfg.modes))
            if ref_n <= cfg.reference_max_sentences:
                t0 = time.perf_counter()
                ref = reference_scores(corpus, model_dict, model.unk_log_prob, ref_n)
                result["timings_s"]["reference"] = time.perf_counter() - t0
            else:
                ref = None
            runner = _Runner(client, corpus, cfg, quiet)
            runner.model_dict = model_dict
            runner.work = work
            loads: list[dict[str, Any]] = []
            distribution: list[dict[str, Any]] = []
            keys = list(model_dict)
            if "dict" in peers:
                t0 = time.perf_counter()
                dict_future = client.scatter([SharedModel(model_dict)], broadcast=True)[0]
                dict_s = time.perf_counter() - t0
                loads.append(
                    {
                        "servers": None,
                        "system": "dict",
                        "load_s": dict_s,
                        "what": "model dict broadcast to every worker",
                    }
                )
            for n in cfg.servers:
                _say(quiet, f"--- {n} server{'s' if n > 1 else ''} ---")
                _run_ramgrid(runner, client, cfg, peers, wl, n, model, keys, loads, distribution, quiet)
                if "memcached" in peers:
                    with MemcachedCluster(n, memory_mb=cfg.memcached_mb, threads=cfg.server_threads) as mc:
                        load_s = _load_memcached(client, mc, model, cfg.memcached_hasher)
                        loads.append(
                            {
                                "servers": n,
                                "system": "memcached",
                                "load_s": load_s,
                                "what": f"{model.vocabulary + 1:,} keys, parallel set_many from the workers",
                            }
                        )
                        distribution.append(
                            {
                                "servers": n,
                                "system": "memcached",
                                "items": mc.items_per_server(),
                                "how": "curr_items from each server's stats",
                            }
                        )
                        result.setdefault("memcached_command", mc.command)
                        src = Source(
                            "memcached", model.unk_log_prob, servers=tuple(mc.servers), hasher=cfg.memcached_hasher
                        )
                        for mode in cfg.modes:
                            if mode not in GRID_ONLY_MODES:
                                runner.run(n, "memcached", mode, src, wl.for_mode(mode))
                for w in wl.distinct(cfg.modes):
                    runner.run(n, "noop", "noop", Source("noop", model.unk_log_prob), w)
                if "dict" in peers and n == cfg.servers[0]:
                    src = Source("dict", model.unk_log_prob)
                    for mode in ("per-token", "per-partition"):
                        if mode in cfg.modes or mode == "per-partition":
                            runner.run(None, "dict", mode, src, wl.for_mode(mode), model=dict_future)
            with contextlib.suppress(OSError):
                result["machine"]["load_average_at_end"] = list(os.getloadavg())
            result["runs"] = runner.records
            if runner.memory is not None:
                result["memory"] = runner.memory
            result["loads"] = loads
            result["distribution"] = distribution
            result["reference_check"] = _check_reference(runner, ref)
            if cfg.write_scores and runner.headline is not None:
                write_scores(scores_path, runner.headline)
                result["scores_file"] = str(scores_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _run_ramgrid(
    runner: _Runner,
    client: Any,
    cfg: ExperimentConfig,
    peers: Sequence[str],
    wl: Workloads,
    n: int,
    model: LanguageModel,
    keys: list[str],
    loads: list[dict[str, Any]],
    distribution: list[dict[str, Any]],
    quiet: bool,
) -> None:
    import ramgrid

    if not {"ramgrid", "near", "shm"} & set(peers):
        return
    with ramgrid.local(servers=n, memory=cfg.server_memory, threads=cfg.server_threads) as grid:
        t0 = time.perf_counter()
        version = load_into_grid(
            client, grid, model, TABLE, partitions=cfg.grid_partitions, replication=min(cfg.replication, n)
        )
        load_s = time.perf_counter() - t0
        loads.append(
            {
                "servers": n,
                "system": "ramgrid",
                "load_s": load_s,
                "what": f"{model.vocabulary + 1:,} keys into a new version, parallel from the workers",
            }
        )
        distribution.append(
            {
                "servers": n,
                "system": "ramgrid",
                "items": _grid_items_per_server(grid, keys + [UNK_KEY]),
                "how": "primary replica of each key's partition (partition map)",
            }
        )
        if n == cfg.servers[0] and cfg.memory_workers:
            # Before anything in this process or the Dask workers maps the version (see ramgrid.lm.memory).
            runner.memory = _measure_memory(runner, grid, cfg, peers, model, version, quiet)
        # TCP rows read over TCP even though the servers are on this host; the shared-memory row maps the
        # version in each worker process (docs/shared-memory.md).
        plain = grid.table(TABLE).pin(version, shared_memory=False)
        near_grid = ramgrid.connect(grid.spec, near_cache_bytes=cfg.near_cache_mb << 20)
        near = near_grid.table(TABLE).pin(version, shared_memory=False)
        shm = grid.table(TABLE).pin(version, shared_memory=True) if "shm" in peers else plain
        configs = [grid.config, near_grid.config]
        rows = (("ramgrid", plain, "ramgrid"), ("ramgrid+near", near, "near"), ("ramgrid+shm", shm, "shm"))
        for system, table, peer in rows:
            if peer not in peers:
                continue
            src = Source("ramgrid", model.unk_log_prob, table=table, label=system)
            for mode in cfg.modes:
                runner.run(n, system, mode, src, wl.for_mode(mode), reset_configs=configs)
        client.run(reset_worker_clients, configs)  # before the servers stop: no worker keeps dead connections


def _measure_memory(
    runner: _Runner,
    grid: Any,
    cfg: ExperimentConfig,
    peers: Sequence[str],
    model: LanguageModel,
    version: int,
    quiet: bool,
) -> dict[str, Any] | None:
    from ramgrid.lm.corpus import split_tasks
    from ramgrid.lm.memory import measure_memory

    modes = [m for m, peer in (("dict", "dict"), ("tcp", "ramgrid"), ("shm", "shm")) if peer in peers]
    if not modes:
        return None
    corpus = runner.corpus
    slices = [corpus.slice(a, c) for a, c in split_tasks(corpus.lines, cfg.lines_per_task, 1)]
    _say(quiet, f"memory per host ({', '.join(modes)}; {', '.join(map(str, cfg.memory_workers))} worker processes):")
    mem = measure_memory(
        grid,
        TABLE,
        version,
        SharedModel(runner.model_dict),
        model.unk_log_prob,
        slices,
        modes=modes,
        worker_counts=cfg.memory_workers,
        work_dir=runner.work,
    )
    for r in mem["rows"]:
        _say(
            quiet,
            f"  {r['mode']:<5} {r['workers']} workers: {r['workers_pss'] / 2**20:8.1f} MiB in the workers, "
            f"{r['servers_pss'] / 2**20:7.1f} MiB in the servers, {r['host'] / 2**20:8.1f} MiB per host",
        )
    for note in mem["notes"]:
        _say(quiet, "  note: " + note)
    _say(quiet, f"  measured in {mem['seconds']:.1f} s")
    return mem


def _check_reference(runner: _Runner, ref: np.ndarray | None) -> dict[str, Any]:
    """Every workload's scores against the plain-dict reference computed in the driver (when it was computed)."""
    out: dict[str, Any] = {"identical_across_runs": True, "workloads": {}}
    for n, (label, scores) in sorted(runner.first_scores.items()):
        if ref is None or n > ref.size:
            out["workloads"][str(n)] = "not checked against the driver reference (workload too large)"
            continue
        same = bool(np.array_equal(scores, ref[:n]))
        out["workloads"][str(n)] = "identical to the plain-dict reference" if same else "DIFFERENT from the reference"
        if not same:
            raise ExperimentError(f"{label} scores differ from the plain-dict reference on the first {n} sentences")
    return out
