"""Word count with ramgrid MapReduce: map tasks count their part of a text file, the grid merges the counts on
write, and the result comes back as a dict (or goes to a TSV file).

    pip install .                  # from the repository root (builds the Rust core with maturin)
    python examples/wordcount.py                         # a slice of the news corpus, or a built-in text
    python examples/wordcount.py FILE.txt --out counts.tsv --servers 4 --dask

Everything runs on this machine: ramgrid servers on loopback and the job's tasks on threads (or, with --dask, on
a Dask LocalCluster whose workers are paired with the servers). The same job from the command line:
`ramgrid mapreduce wordcount FILE.txt --out counts.tsv`.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import tempfile
from collections import Counter
from pathlib import Path

import ramgrid
from ramgrid import mapreduce
from ramgrid.mapreduce.wordcount import count_block, write_tsv

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "lm1b-heldout-news-sentences.txt.gz"
FALLBACK = """the quick brown fox jumps over the lazy dog
a grid of servers holds the counts and the grid merges them
"""


def sample_text(dest: Path, lines: int) -> Path:
    """A plain-text input: the first `lines` lines of the news corpus if it is there, else a small built-in text."""
    if CORPUS.exists():
        with gzip.open(CORPUS, "rt", encoding="utf-8", errors="replace") as f:
            dest.write_text("".join(itertools.islice(f, lines)), encoding="utf-8")
    else:
        dest.write_text(FALLBACK * 100, encoding="utf-8")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", nargs="?", help="a text file or directory (default: a sample)")
    parser.add_argument("--out", help="write word<TAB>count lines here")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--lines", type=int, default=50_000, help="lines of the sample (default 50,000)")
    parser.add_argument("--dask", action="store_true", help="run the tasks on a Dask LocalCluster")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, ramgrid.local(servers=args.servers) as grid:
        src = Path(args.input) if args.input else sample_text(Path(tmp) / "sample.txt", args.lines)
        dask_client = None
        if args.dask:
            from dask.distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=args.servers, threads_per_worker=1, dashboard_address="127.0.0.1:0")
            dask_client = Client(cluster)
        try:
            res = mapreduce.run(
                grid, src, count_block, "sum", vectorised=True, chunk_bytes=1 << 20, dask_client=dask_client
            )
        finally:
            if dask_client is not None:
                dask_client.close()
                cluster.close()
        print(res.summary)
        counts = res.result
        print("most common:", Counter(counts).most_common(5))
        if args.out:
            print(f"{write_tsv(counts, args.out):,} words written to {args.out}")


if __name__ == "__main__":
    main()
