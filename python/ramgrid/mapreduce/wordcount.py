"""Word count on the grid, and the `ramgrid mapreduce` command.

Tokens are split on whitespace as the reference experiment does (`str.split()` on the text decoded as UTF-8, bad
bytes replaced), so every count here equals `Counter(token for line in lines for token in line.split())`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ramgrid._cmdline import CliError, add_address_options, connect_from_args, run_command

__all__ = ["count_block", "tokens", "wordcount", "write_tsv"]


def tokens(line: str) -> list[str]:
    """The tokeniser: whitespace-separated tokens."""
    return line.split()


def count_block(block: bytes) -> dict[str, int]:
    """Vectorised mapper: the token counts of a block of whole lines (newlines are whitespace, so splitting the
    block is splitting each line)."""
    return Counter(block.decode("utf-8", errors="replace").split())


def word_pairs(line: str) -> Iterator[tuple[str, int]]:
    """Per-record mapper: (token, 1) for each token of a line."""
    for w in line.split():
        yield w, 1


def wordcount(grid: Any, path: str | Path, **options: Any) -> Any:
    """Counts the tokens of a text file or directory on `grid`; returns the job's `JobResult` (`.result`:
    {word: count}, unless `output=` names a table). Options are `ramgrid.mapreduce.run`'s."""
    from ramgrid.mapreduce.job import run

    options.setdefault("vectorised", True)
    mapper = count_block if options["vectorised"] else word_pairs
    return run(grid, str(path), mapper, "sum", **options)


def write_tsv(counts: dict[str, int], out: str | Path) -> int:
    """Writes `word<TAB>count` lines sorted by word; returns the number of lines."""
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(f"{w}\t{counts[w]}\n" for w in sorted(counts))
    return len(counts)


def mapreduce_main(argv: Sequence[str]) -> int:
    """`ramgrid mapreduce wordcount INPUT --out FILE.tsv`: the arguments after `mapreduce`."""
    p = argparse.ArgumentParser(prog="ramgrid mapreduce", description="MapReduce jobs on the grid")
    add_address_options(p, top=True)
    sub = p.add_subparsers(dest="job", metavar="JOB", required=True)
    wc = sub.add_parser("wordcount", help="count whitespace-separated tokens; write word<TAB>count lines")
    wc.add_argument("input", help="a text file (.txt, .gz) or a directory of them")
    wc.add_argument("--out", required=True, help="the TSV file to write")
    wc.add_argument(
        "--local",
        type=int,
        default=0,
        metavar="N",
        help="run on N servers started for the job on loopback (default: the configured cluster, else 2 local)",
    )
    wc.add_argument("--workers", type=int, help="local task threads (default: CPU count)")
    wc.add_argument("--dask", metavar="SCHEDULER", help="run the tasks on this Dask scheduler's workers")
    wc.add_argument("--chunk-mib", type=int, default=64, help="text bytes per map task (default 64)")
    wc.add_argument("--reduce-partitions", type=int, default=16, help="partitions of the shuffle (default 16)")
    wc.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(list(argv))

    def run() -> int:
        if not Path(args.input).exists():
            raise CliError(f"{args.input}: no such file or directory")
        with contextlib.ExitStack() as stack:
            grid = None
            if not args.local:
                try:
                    grid = connect_from_args(args)
                except CliError as e:
                    if "no cluster given" not in str(e):
                        raise
            if grid is None:
                import ramgrid

                grid = stack.enter_context(ramgrid.local(servers=args.local or 2, memory="1GiB"))
            dask_client = None
            if args.dask:
                from distributed import Client

                dask_client = stack.enter_context(Client(args.dask))
            res = wordcount(
                grid,
                args.input,
                dask_client=dask_client,
                workers=args.workers,
                chunk_bytes=max(1, args.chunk_mib) << 20,
                reduce_partitions=args.reduce_partitions,
                progress=not args.no_progress,
            )
            n = write_tsv(res.result, args.out)
            print(f"{n:,} words written to {args.out}", file=sys.stderr)
            print(res.summary, file=sys.stderr)
        return 0

    return run_command(run)
