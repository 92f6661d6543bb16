"""`ramgrid demo lm` (also `python -m ramgrid.lm`): the reference experiment on an embedded local grid.

Scores a corpus with a unigram language model whose log probabilities live in the grid, for 1, 2 and 4 servers,
beside memcached and a dict, and writes Table 1, Figures 5 and 6 and a JSON result to --out.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence

__all__ = ["build_parser", "demo_main"]


def _positive(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _non_negative(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _servers(s: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of server counts, got {s!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"server counts must be >= 1, got {s!r}")
    return v


def _worker_counts(s: str) -> tuple[int, ...]:
    if s.strip().lower() in ("none", "0", ""):
        return ()
    try:
        v = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of worker counts or 'none', got {s!r}") from None
    if not v or min(v) < 1 or max(v) > 64:
        raise argparse.ArgumentTypeError(f"worker counts must be 1 to 64, got {s!r}")
    return tuple(sorted(set(v)))


def _names(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(s: str) -> tuple[str, ...]:
        v = tuple(x.strip() for x in s.split(",") if x.strip())
        bad = [x for x in v if x not in allowed]
        if bad or not v:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}; got {s!r}")
        return v

    return parse


def build_parser(prog: str = "ramgrid demo lm") -> argparse.ArgumentParser:
    from ramgrid.lm.experiment import LOOKUP_MODES, PEERS

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[1].replace("\n", " "))
    c = p.add_argument_group("corpus")
    c.add_argument(
        "--corpus",
        metavar="PATH",
        help="one sentence per line, plain or .gz (default: sample sentences "
        "from the wordfreq package's English word frequencies)",
    )
    c.add_argument("--max-sentences", type=_positive, metavar="N", help="use only the first N sentences")
    c.add_argument(
        "--sample-sentences",
        type=_positive,
        default=100_000,
        metavar="N",
        help="sentences to sample when no corpus is given (default 100000)",
    )
    c.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    m = p.add_argument_group("model")
    m.add_argument("--smoothing", choices=("mle", "add-k"), default="mle", help="default mle, as the paper")
    m.add_argument("--k", type=float, default=1.0, help="k of add-k smoothing (default 1)")
    r = p.add_argument_group("runs")
    r.add_argument("--servers", type=_servers, default=(1, 2, 4), help="server counts to run (default 1,2,4)")
    r.add_argument(
        "--modes",
        type=_names(LOOKUP_MODES),
        default=LOOKUP_MODES,
        help="lookup modes (default per-token,per-sentence,per-partition,fused; fused runs for ramgrid only); "
        "NoOp always runs",
    )
    r.add_argument(
        "--peers",
        type=_names(PEERS),
        default=PEERS,
        help="systems to run (default ramgrid,near,shm,memcached,dict; near = ramgrid with its near cache, shm = ramgrid read from shared memory in each worker)",
    )
    r.add_argument(
        "--per-token-sentences",
        type=_positive,
        default=2_000,
        metavar="N",
        help="per-token modes score only the first N sentences (default 2000)",
    )
    r.add_argument(
        "--per-sentence-sentences",
        type=_non_negative,
        default=20_000,
        metavar="N",
        help="per-sentence modes score only the first N sentences (default 20000; 0 = all)",
    )
    r.add_argument(
        "--repeat", type=_positive, default=1, help="run each measurement N times and report the median (default 1)"
    )
    r.add_argument("--workers", type=_positive, default=2, help="Dask worker processes (default 2)")
    r.add_argument("--threads-per-worker", type=_positive, default=1)
    r.add_argument(
        "--memory-workers",
        type=_worker_counts,
        default=(2, 8),
        metavar="N,N",
        help="measure the memory per host (PSS) of the dict, TCP and shared-memory modes with these numbers of worker "
        "processes, once, on the first server count (default 2,8; none skips it)",
    )
    r.add_argument(
        "--lines-per-task",
        type=_positive,
        default=20_000,
        metavar="N",
        help="sentences per Dask task, i.e. per partition (default 20000)",
    )
    g = p.add_argument_group("servers")
    g.add_argument("--grid-partitions", type=_positive, default=64, help="partitions of the grid table (default 64)")
    g.add_argument("--replication", type=_positive, default=1, help="replicas per partition (default 1)")
    g.add_argument("--server-memory", default="1GiB", help="table memory per ramgrid server (default 1GiB)")
    g.add_argument("--memcached-mb", type=_positive, default=1024, help="memory per memcached server (default 1024)")
    g.add_argument(
        "--server-threads", type=_positive, default=1, help="threads per ramgrid and per memcached server (default 1)"
    )
    g.add_argument(
        "--memcached-hasher",
        choices=("crc32", "rendezvous"),
        default="crc32",
        help="how the memcached client maps keys to servers: crc32 mod n (default; spymemcached's shape) or "
        "pymemcache's default rendezvous hash (pure Python, several µs per key per server)",
    )
    g.add_argument("--near-cache-mb", type=_positive, default=256, help="near cache per worker (default 256)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="out/lm", metavar="DIR", help="where the report goes (default ./out/lm)")
    o.add_argument("--work-dir", metavar="DIR", help="scratch space for the staged corpus (default: system temp)")
    o.add_argument("--no-scores", action="store_true", help="do not write scores.npz")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG figures (no matplotlib needed)")
    o.add_argument("--quiet", action="store_true", help="print only the final tables")
    o.add_argument(
        "--report-only",
        metavar="RESULT_JSON",
        help="run nothing: write the report (into --out) again from a result.json of an earlier run",
    )
    return p


def demo_main(argv: Sequence[str] | None = None, prog: str = "ramgrid demo lm") -> int:
    """Entry point of `ramgrid demo lm`. Returns the exit status: 0 done, 1 the experiment failed, 2 bad input."""
    from ramgrid.exceptions import RamgridError
    from ramgrid.lm.corpus import CorpusError
    from ramgrid.lm.experiment import ExperimentConfig, ExperimentError, run_experiment
    from ramgrid.lm.model import Smoothing
    from ramgrid.lm.peers import MemcachedError
    from ramgrid.lm.report import write_report
    from ramgrid.lm.score import ScoringFailed

    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(args_list)
    try:
        Smoothing(args.smoothing, args.k)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = ExperimentConfig(
        corpus=args.corpus,
        max_sentences=args.max_sentences,
        sample_sentences=args.sample_sentences,
        seed=args.seed,
        smoothing=args.smoothing,
        k=args.k,
        servers=args.servers,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_workers=args.memory_workers,
        lines_per_task=args.lines_per_task,
        per_token_sentences=args.per_token_sentences,
        per_sentence_sentences=args.per_sentence_sentences,
        modes=args.modes,
        peers=args.peers,
        near_cache_mb=args.near_cache_mb,
        grid_partitions=args.grid_partitions,
        replication=args.replication,
        server_memory=args.server_memory,
        server_threads=args.server_threads,
        memcached_mb=args.memcached_mb,
        memcached_hasher=args.memcached_hasher,
        repeat=args.repeat,
        out=args.out,
        work_dir=args.work_dir,
        write_scores=not args.no_scores,
        argv=args_list,
        command=shlex.join([*prog.split(), *args_list]),
    )
    if args.report_only:
        import json

        with open(args.report_only, encoding="utf-8") as f:
            saved = json.load(f)
        files = write_report(saved, args.out, plots=not args.no_plots)
        print("wrote " + ", ".join(files.values()))
        return 0
    t0 = time.perf_counter()
    try:
        result = run_experiment(cfg, quiet=args.quiet)
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ScoringFailed, ExperimentError, MemcachedError, RamgridError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result["timings_s"]["total"] = time.perf_counter() - t0
    files = write_report(result, cfg.out, plots=not args.no_plots)
    print()
    with open(files["report"], encoding="utf-8") as f:
        print(f.read())
    print("wrote " + ", ".join(files.values()) + (f", {result['scores_file']}" if "scores_file" in result else ""))
    return 0


if __name__ == "__main__":
    sys.exit(demo_main())
