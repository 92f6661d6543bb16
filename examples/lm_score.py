"""Score sentences with a unigram language model kept in ramgrid, from Dask tasks: the reference experiment in brief.

    python examples/lm_score.py                                   # sentences sampled from wordfreq's English
    python examples/lm_score.py --corpus sentences.txt.gz         # one sentence per line, plain or gzip

Steps: start a local grid and a Dask LocalCluster; count the corpus's tokens on Dask; load (token, ln p) into a grid
table as a new version; score every sentence in Dask tasks that look up each task's distinct tokens in one batch.
`ramgrid demo lm` runs the full experiment (every lookup mode, memcached and dict peers, 1/2/4 servers, report).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import numpy as np
import ramgrid
from distributed import Client, LocalCluster
from ramgrid.lm import Smoothing, Source, count_model, load_into_grid, run_scoring, stage_corpus
from ramgrid.lm.corpus import read_slice, sample_wordfreq_sentences, stage_sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="one sentence per line (default: 20,000 sentences sampled from wordfreq)")
    parser.add_argument("--max-sentences", type=int, help="use only the first N sentences of the corpus")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as scratch,
        ramgrid.local(servers=args.servers, memory="512MiB") as grid,
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        # 1. The corpus, copied into line-range files that the tasks read in parallel.
        if args.corpus:
            corpus = stage_corpus(args.corpus, scratch, args.max_sentences)
        else:
            sentences, _ = sample_wordfreq_sentences(args.max_sentences or 20_000, seed=0)
            corpus = stage_sentences(sentences, scratch, "sampled from wordfreq's English word frequencies")
            print("no --corpus given: scoring synthetic sentences sampled from wordfreq's English word frequencies")

        # 2. The model: token counts from a MapReduce job on the grid and the Dask workers, then ln p with add-one
        # smoothing, loaded as a new version of a table.
        model = count_model(client, corpus, Smoothing("add-k", k=1.0), grid=grid)
        version = load_into_grid(client, grid, model, "unigrams")
        print(f"model: {model.vocabulary:,} distinct tokens of {model.total_tokens:,}, loaded as version {version}")

        # 3. Scoring: every task reads the same pinned version, whatever happens to the table meanwhile.
        table = grid.table("unigrams").pin(version)
        t0 = time.perf_counter()
        result = run_scoring(client, corpus, "per-partition", Source("ramgrid", model.unk_log_prob, table=table))
        elapsed = time.perf_counter() - t0
        print(
            f"scored {result.sentences:,} sentences ({result.lookups:,} token lookups) in {elapsed:.2f} s: "
            f"{result.lookups / elapsed:,.0f} lookups/s"
        )

        # The sentence ids are line numbers; show the most and the least likely of the first thousand.
        first = result.scores[:1000]
        lines = read_slice(corpus.slice(0, first.size))
        for label, i in (("most likely", int(np.argmax(first))), ("least likely", int(np.argmin(first)))):
            text = lines[i].decode("utf-8", "replace")
            print(f"{label}: sentence {i}, ln p = {first[i]:.2f}: {text[:90]}")


if __name__ == "__main__":
    main()
