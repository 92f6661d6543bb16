"""MapReduce on the grid against plain-Python references on real text: word count (merged on write, and with a
general reducer into an output table), an inverted index over a table, a reduce-side join, and a forced duplicate
of every map task. The fault tests (server, worker, driver killed) are in test_mapreduce_faults.py."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import _mr_helpers as h
import ramgrid
from ramgrid import mapreduce
from ramgrid.mapreduce.wordcount import count_block

pytestmark = pytest.mark.timeout(60)

LINES = 4000
CHUNK = 64 << 10  # several map tasks from a small slice


@pytest.fixture(scope="module")
def lines() -> list[str]:
    if not h.CORPUS.exists():
        pytest.skip(f"{h.CORPUS} is not there")
    return h.corpus_lines(LINES)


@pytest.fixture(scope="module")
def grid2() -> ramgrid.LocalGrid:
    with ramgrid.local(servers=2, memory="256MiB") as g:
        yield g


def _leftover(grid: ramgrid.Grid, job_id: str) -> list[str]:
    return [t for t in grid.tables() if t.startswith(job_id)]


def test_wordcount_is_merged_on_write_and_exact(grid2: ramgrid.LocalGrid, lines: list[str], tmp_path: Path) -> None:
    src = h.write_text(tmp_path / "slice.txt", lines)
    res = mapreduce.run(
        grid2, src, count_block, "sum", vectorised=True, chunk_bytes=CHUNK, workers=3, progress=False, job_id="wc1"
    )
    assert res.result == dict(h.reference_counts(lines))
    s = res.summary
    assert s.merged_on_write and not s.rebuilt
    assert s.map_tasks > 1 and s.map_runs == s.map_tasks and s.reduce_tasks == 0
    assert s.records_in == len(lines)
    assert s.bytes_shuffled > 0 and set(s.phases) == {"plan", "map", "reduce", "commit"}
    assert _leftover(grid2, "wc1") == []  # intermediate, result and log tables dropped


def test_per_record_mapper_general_reducer_into_an_output_table(
    grid2: ramgrid.LocalGrid, lines: list[str], tmp_path: Path
) -> None:
    src = h.write_text(tmp_path / "slice.txt", lines)
    ref = h.reference_counts(lines)
    res = mapreduce.run(
        grid2,
        src,
        h.word_pairs,
        h.total,
        combiner=h.total,
        output="wc_out",
        output_type="i64",
        reduce_partitions=5,
        chunk_bytes=CHUNK,
        workers=3,
        progress=False,
    )
    assert res.result is None and res.output == "wc_out"
    t = grid2.table("wc_out")
    assert t.current_version() == res.version
    words = sorted(ref)
    assert t.get_many(words).tolist() == [ref[w] for w in words]
    assert t.describe()["versions"][-1]["items"] == len(ref)
    assert res.summary.reduce_tasks == 5 and not res.summary.merged_on_write
    # The combiner ran in the map tasks: fewer pairs were shuffled than the mappers emitted.
    assert res.summary.pairs_combined < res.summary.pairs_out == sum(ref.values())


def test_inverted_index_over_a_table(grid2: ramgrid.LocalGrid, lines: list[str]) -> None:
    docs = lines[:1500]
    t = grid2.create_table("mr_docs", partitions=6, value_type="bytes")
    t.put_many(np.arange(len(docs), dtype=np.int64), [d.encode() for d in docs])
    res = mapreduce.run(grid2, t, h.doc_words, h.posting_list, reduce_partitions=4, workers=2, progress=False)
    ref: dict[str, set[int]] = defaultdict(set)
    for i, d in enumerate(docs):
        for w in d.split():
            ref[w].add(i)
    assert res.result == {w: ",".join(map(str, sorted(ids))).encode() for w, ids in ref.items()}
    assert res.summary.map_tasks == 6  # one per partition


def test_reduce_side_join(grid2: ramgrid.LocalGrid, lines: list[str], tmp_path: Path) -> None:
    # Left: each word's first line in one half of the slice; right: each word's count in the other half.
    first: dict[str, int] = {}
    for i, line in enumerate(lines[:2000]):
        for w in line.split():
            first.setdefault(w, i)
    counts = h.reference_counts(lines[2000:])
    d = tmp_path / "rel"
    d.mkdir()
    h.write_text(d / "left.txt", [f"L\t{w}\t{i}" for w, i in first.items()])
    h.write_text(d / "right.txt", [f"R\t{w}\t{c}" for w, c in counts.items()])
    res = mapreduce.run(grid2, d, h.tagged, h.join, chunk_bytes=16 << 10, workers=3, progress=False)
    got = {k: v for k, v in res.result.items() if v}
    ref = {w: [(str(first[w]), str(counts[w]))] for w in first if w in counts}
    assert got == ref


@pytest.mark.parametrize("reducer", ["sum", "general"])
def test_forced_duplicate_map_tasks_count_once(
    grid2: ramgrid.LocalGrid, lines: list[str], tmp_path: Path, reducer: str
) -> None:
    """Every map task runs twice at once (speculative copies, two attempts writing at the same time): the output
    counts each record once, whichever copy committed, and whatever merges both copies made."""
    src = h.write_text(tmp_path / "slice.txt", lines[:2000])
    red = "sum" if reducer == "sum" else h.total
    res = mapreduce.run(
        grid2, src, h.word_pairs, red, speculative=True, chunk_bytes=CHUNK // 2, workers=4, progress=False
    )
    assert res.result == dict(h.reference_counts(lines[:2000]))
    assert res.summary.map_runs == 2 * res.summary.map_tasks


def test_bad_jobs_are_refused_before_anything_runs(grid2: ramgrid.LocalGrid, tmp_path: Path) -> None:
    src = h.write_text(tmp_path / "x.txt", ["a b"])
    before = set(grid2.tables())
    with pytest.raises(ValueError, match="reducer must be one of"):
        mapreduce.run(grid2, src, h.word_pairs, "avg", progress=False)
    with pytest.raises(ValueError, match="i64 or f64"):
        mapreduce.run(grid2, src, h.word_pairs, "sum", output="o", output_type="bytes", progress=False)
    with pytest.raises(ValueError, match="reduce_partitions"):
        mapreduce.run(grid2, src, h.word_pairs, "sum", reduce_partitions=0, progress=False)
    assert set(grid2.tables()) == before


def test_a_failed_job_keeps_its_tables_until_abandoned(
    grid2: ramgrid.LocalGrid, lines: list[str], tmp_path: Path
) -> None:
    src = h.write_text(tmp_path / "slice.txt", lines[:500])
    out = grid2.create_table("mr_keep", partitions=4, value_type="bytes")
    out.put_many(["old"], [b"1"])
    before = out.current_version()
    with pytest.raises(RuntimeError, match="mapper bug"):
        mapreduce.run(
            grid2, src, h.broken, h.posting_list, output="mr_keep", workers=2, progress=False, job_id="broken1"
        )
    assert sorted(_leftover(grid2, "broken1")) == ["broken1.log", "broken1.marks", "broken1.shuffle"]
    assert out.current_version() == before
    mapreduce.abandon("broken1", grid2)
    assert _leftover(grid2, "broken1") == []
    assert out.current_version() == before and out.get("old") == b"1"
    assert [v["version"] for v in out.versions()] == [before]  # the job's open version was dropped
