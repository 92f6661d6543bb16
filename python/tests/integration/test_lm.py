"""The language-model experiment against real servers: a model counted on Dask and loaded into the grid, scored in
every mode and from every peer with bit-identical results, bad corpora, and servers killed in the middle of a job."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)
distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install '.[dask]')")

import logging

import ramgrid
from ramgrid.lm.__main__ import demo_main
from ramgrid.lm.corpus import StagedCorpus, stage_corpus, stage_sentences, tokenize
from ramgrid.lm.model import UNK_KEY, LanguageModel, Smoothing, count_model, load_into_grid, log_probs
from ramgrid.lm.peers import (
    MemcachedCluster,
    load_memcached_part,
    mc_key,
    memcached_available,
    memcached_client,
    reset_worker_clients,
)
from ramgrid.lm.score import (
    ScoringFailed,
    SharedModel,
    Source,
    reference_scores,
    run_scoring,
    score_to_file,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
LM1B = REPO_ROOT.parent / "shared" / "data" / "lm1b-heldout-news-sentences.txt.gz"
SLICE = 3000
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.ERROR,
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def lm1b(tmp_path_factory: pytest.TempPathFactory) -> StagedCorpus:
    if not LM1B.exists():
        pytest.skip(f"{LM1B} is absent: the shared test data (../shared/data) is not next to this checkout")
    return stage_corpus(LM1B, tmp_path_factory.mktemp("lm1b"), max_lines=SLICE)


def _scores_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.array_equal(got, want), f"first difference at sentence {int(np.flatnonzero(got != want)[0])}"


def test_lm1b_slice_every_mode_and_peer_matches_a_plain_dict(client: Any, lm1b: StagedCorpus) -> None:
    model = count_model(client, lm1b, lines_per_task=700)
    assert model.stats.lines == SLICE and model.total_tokens == model.stats.tokens > 50_000
    d = model.gather(client)
    assert len(d) == model.vocabulary
    assert sum(np.exp(np.array(list(d.values())))) == pytest.approx(1.0)
    ref = reference_scores(lm1b, d, model.unk_log_prob)
    per_token = 150
    with ramgrid.local(servers=2, memory="64MiB") as grid:
        version = load_into_grid(client, grid, model, "lm", partitions=16)
        assert grid.table("lm").current_version() == version
        assert grid.table("lm").get(UNK_KEY) == float("-inf")
        sources = [
            Source("ramgrid", model.unk_log_prob, table=grid.table("lm").pin(version)),
            Source(
                "ramgrid",
                model.unk_log_prob,
                table=ramgrid.connect(grid.spec, near_cache_bytes=8 << 20).table("lm").pin(version),
                label="ramgrid+near",
            ),
        ]
        runs = []
        for src in sources:
            for mode in ("per-token", "per-sentence", "per-partition", "fused"):
                n = per_token if mode == "per-token" else None
                runs.append(run_scoring(client, lm1b, mode, src, sentences=n, lines_per_task=700))
        dict_model = client.scatter([SharedModel(d)], broadcast=True)[0]
        dsrc = Source("dict", model.unk_log_prob)
        runs.append(run_scoring(client, lm1b, "per-partition", dsrc, model=dict_model, lines_per_task=700))
        runs.append(run_scoring(client, lm1b, "per-token", dsrc, model=dict_model, sentences=per_token))
        noop = run_scoring(client, lm1b, "noop", Source("noop", model.unk_log_prob), lines_per_task=700)
    for r in runs:
        _scores_equal(r.scores, ref[: r.sentences])
        assert r.lookups == r.tokens > 0 and r.lookup_s > 0
    assert noop.lookups == 0 and noop.tokens == model.total_tokens
    part = next(r for r in runs if r.mode == "per-partition")
    assert part.keys < part.tokens  # distinct tokens only
    assert part.extra["workers_used"] == 2
    fused = next(r for r in runs if r.mode == "fused")
    assert fused.keys == part.keys and fused.calls == part.calls  # the same distinct tokens, once per task
    with pytest.raises(ValueError, match="fused mode needs the ramgrid source"):
        run_scoring(client, lm1b, "fused", dsrc, model=dict_model)


def test_mapreduce_count_equals_a_plain_counter(client: Any, lm1b: StagedCorpus) -> None:
    with gzip.open(LM1B, "rb") as f:
        raw = [f.readline().rstrip(b"\n") for _ in range(SLICE)]
    lines = [r.decode("utf-8", "replace") for r in raw]
    want = Counter(t for line in lines for t in tokenize(line))
    with ramgrid.local(servers=2, memory="64MiB") as grid:
        model = count_model(client, lm1b, grid=grid, lines_per_task=700)
        assert grid.tables() == []  # the job dropped its intermediate, result and log tables
    job = model.count_job
    assert job["map_tasks"] >= 4 and job["merged_on_write"] and job["bytes_shuffled"] > 0
    assert model.total_tokens == model.stats.tokens == sum(want.values())
    assert model.vocabulary == len(want)
    assert model.stats.lines == SLICE and model.stats.empty_lines == sum(1 for line in lines if not line.split())
    assert model.stats.dropped_long_tokens == sum(len(line.split()) for line in lines) - sum(want.values())
    # The same counts give bit-identical log probabilities.
    keys = list(want)
    ln_p = log_probs(np.array([want[k] for k in keys]), model.total_tokens, model.vocabulary, model.smoothing)
    assert model.gather(client) == dict(zip(keys, ln_p.tolist()))


@pytest.mark.skipif(not memcached_available(), reason="memcached is not installed (apt-get install memcached)")
def test_memcached_peer_matches_too(client: Any, lm1b: StagedCorpus) -> None:
    model = count_model(client, lm1b, Smoothing("add-k", 0.5), lines_per_task=1000)
    ref = reference_scores(lm1b, model.gather(client), model.unk_log_prob)
    with MemcachedCluster(2, memory_mb=64) as mc:
        servers = tuple(mc.servers)
        assert sum(client.gather(client.map(load_memcached_part, model.parts, servers=servers))) == model.vocabulary
        try:
            memcached_client(servers).set(mc_key(UNK_KEY), repr(model.unk_log_prob).encode(), noreply=False)
        finally:
            reset_worker_clients()  # this process's client
        assert sum(mc.items_per_server()) == model.vocabulary + 1
        src = Source("memcached", model.unk_log_prob, servers=servers)
        for mode, n in (("per-token", 100), ("per-sentence", 1000), ("per-partition", None)):
            r = run_scoring(client, lm1b, mode, src, sentences=n, lines_per_task=1000)
            _scores_equal(r.scores, ref[: r.sentences])


def test_add_k_scores_unseen_tokens_with_unk(client: Any, tmp_path: Path) -> None:
    pytest.importorskip("wordfreq", reason="wordfreq is not installed (pip install wordfreq)")
    from ramgrid.lm.corpus import sample_wordfreq_sentences

    sents, _ = sample_wordfreq_sentences(1500, seed=3)
    train = stage_sentences(sents, tmp_path / "train", "sampled")
    model = count_model(client, train, Smoothing("add-k", 0.1), lines_per_task=400)
    test = stage_sentences(["never-seen-token the", "", sents[0], "zzz qqq"], tmp_path / "test", "unseen")
    d = model.gather(client)
    ref = reference_scores(test, d, model.unk_log_prob)
    assert np.isfinite(ref).all() and ref[1] == 0.0
    assert ref[3] == model.unk_log_prob * 2
    with ramgrid.local(servers=2, memory="64MiB") as grid:
        v = load_into_grid(client, grid, model, "lm_addk", partitions=8)
        src = Source("ramgrid", model.unk_log_prob, table=grid.table("lm_addk").pin(v))
        for mode in ("per-token", "per-sentence", "per-partition"):
            _scores_equal(run_scoring(client, test, mode, src).scores, ref)


def test_non_utf8_bytes_are_replaced_and_counted(client: Any, tmp_path: Path) -> None:
    p = tmp_path / "mixed.txt.gz"
    p.write_bytes(gzip.compress(b"good line here\nbad \xff\xfe bytes\ncaf\xc3\xa9 ok\nmore \x80 bad\n"))
    c = stage_corpus(p, tmp_path / "s")
    model = count_model(client, c, lines_per_task=1)
    assert model.stats.replaced_lines == 2 and model.stats.lines == 4
    d = model.gather(client)
    assert "\ufffd\ufffd" in d and "\ufffd" in d and "café" in d
    with ramgrid.local(servers=1, memory="64MiB") as grid:
        v = load_into_grid(client, grid, model, "lm_utf8", partitions=4)
        src = Source("ramgrid", model.unk_log_prob, table=grid.table("lm_utf8").pin(v))
        _scores_equal(run_scoring(client, c, "per-partition", src).scores, reference_scores(c, d, model.unk_log_prob))


def test_a_failed_load_never_becomes_visible(client: Any, lm1b: StagedCorpus) -> None:
    model = count_model(client, lm1b, lines_per_task=1500)
    bad = client.scatter([(["fine", "k" * 70_000], np.array([-1.0, -2.0]))])[0]  # a key over the 64 KiB limit
    broken = LanguageModel(
        model.smoothing, model.total_tokens, model.vocabulary, model.unk_log_prob, model.stats, [*model.parts, bad]
    )
    with ramgrid.local(servers=2, memory="64MiB") as grid:
        good = load_into_grid(client, grid, model, "lm_v", partitions=8)
        with pytest.raises(Exception, match="(?i)key"):
            load_into_grid(client, grid, broken, "lm_v", partitions=8)
        t = grid.table("lm_v")
        assert t.current_version() == good
        assert t.get("the") == pytest.approx(float(model.gather(client)["the"]))
        assert all(v["version"] <= good or not v["sealed"] for v in t.versions())


def _kill_on_first_result(grid: ramgrid.LocalGrid, index: int, killed_at: list[float]) -> Any:
    def on_progress(done: int, total: int) -> None:
        if not killed_at:
            grid.kill(index)
            killed_at.append(time.time())

    return on_progress


def test_replicated_table_survives_a_server_killed_mid_job(client: Any, lm1b: StagedCorpus) -> None:
    model = count_model(client, lm1b, lines_per_task=1500)
    ref = reference_scores(lm1b, model.gather(client), model.unk_log_prob)
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as grid:
        v = load_into_grid(client, grid, model, "lm_rep", partitions=16, replication=2)
        src = Source("ramgrid", model.unk_log_prob, table=grid.table("lm_rep").pin(v, shared_memory=False))
        killed_at: list[float] = []
        r = run_scoring(
            client, lm1b, "per-sentence", src, lines_per_task=100, on_progress=_kill_on_first_result(grid, 1, killed_at)
        )
        assert grid.alive() == [True, False, True]
    after = sum(t > killed_at[0] for t in r.extra["task_ended_at"])
    assert after >= r.tasks // 2, f"only {after} of {r.tasks} tasks ended after the kill"
    _scores_equal(r.scores, ref)


def test_unreplicated_table_fails_naming_partitions_and_writes_no_scores(
    client: Any, lm1b: StagedCorpus, tmp_path: Path
) -> None:
    model = count_model(client, lm1b, lines_per_task=1500)
    out = tmp_path / "scores.npz"
    out.write_bytes(b"stale")
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as grid:
        v = load_into_grid(client, grid, model, "lm_single", partitions=16, replication=1)
        # Over TCP: a killed server's partitions are then lost to the job (readers that map them from shared memory
        # would keep reading, docs/shared-memory.md).
        src = Source("ramgrid", model.unk_log_prob, table=grid.table("lm_single").pin(v, shared_memory=False))
        killed_at: list[float] = []
        with pytest.raises(ScoringFailed) as e:
            score_to_file(
                client,
                lm1b,
                "per-sentence",
                src,
                out,
                lines_per_task=100,
                on_progress=_kill_on_first_result(grid, 2, killed_at),
            )
    lost = e.value.partitions
    assert lost and set(lost) <= set(range(16)) and len(lost) < 16
    assert f"grid partitions {sorted(lost)}" in str(e.value) or f"grid partitions {lost}" in str(e.value)
    assert "lm_single" in str(e.value) and "No scores were written" in str(e.value)
    assert not out.exists()


def test_demo_main_rejects_bad_corpora(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert demo_main(["--corpus", str(tmp_path / "missing.txt.gz"), "--out", str(out)]) == 2
    assert "corpus not found" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert demo_main(["--corpus", str(empty), "--out", str(out)]) == 2
    assert "is empty" in capsys.readouterr().err
    blank = tmp_path / "blank.txt"
    blank.write_text("   \n\t\n")
    assert demo_main(["--corpus", str(blank), "--out", str(out), "--servers", "1"]) == 2
    assert "no tokens" in capsys.readouterr().err
    assert not (out / "scores.npz").exists()


def test_demo_main_on_sampled_sentences_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("wordfreq", reason="wordfreq is not installed (pip install wordfreq)")
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install matplotlib)")
    out = tmp_path / "out"
    peers = "ramgrid,near,shm,memcached,dict" if shutil.which("memcached") else "ramgrid,near,shm,dict"
    argv = ["--sample-sentences", "1500", "--servers", "2", "--per-token-sentences", "60"]
    argv += ["--per-sentence-sentences", "300", "--lines-per-task", "400", "--peers", peers, "--out", str(out)]
    argv += ["--memory-workers", "2"]  # the memory step with its smaller count only, to keep the test short
    assert demo_main(argv) == 0
    printed = capsys.readouterr().out
    assert "sampled from the English word frequencies in the wordfreq package" in printed
    for name in ("report.md", "result.json", "fig5_latency_throughput.png", "fig6_key_distribution.png", "scores.npz"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "result.json").read_text())
    assert res["corpus"]["source"] == "wordfreq" and res["machine"]["cpu_count"]
    systems = {(r["system"], r["mode"]) for r in res["runs"]}
    assert ("ramgrid", "per-token") in systems and ("noop", "noop") in systems and ("dict", "per-partition") in systems
    assert all(v.startswith("identical") for v in res["reference_check"]["workloads"].values())
    assert [t["servers"] for t in res["summary"]["targets"]] == [2]
    # The memory step: every mode with 2 workers, PSS summed into a host total that counts the segments once.
    mem = {r["mode"]: r for r in res["memory"]["rows"]}
    assert sorted(mem) == ["dict", "shm", "tcp"] and res["memory"]["notes"] == []
    for r in mem.values():
        assert r["workers"] == 2 and len(r["worker_pss"]) == 2 and min(r["worker_pss"]) > 0
        assert r["host"] == r["workers_pss"] + r["servers_pss"] + r["segment_unmapped"]
    assert mem["dict"]["servers_pss"] == 0 and mem["tcp"]["servers_pss"] > 0 and mem["tcp"]["segment_bytes"] == 0
    shm = mem["shm"]
    assert shm["segment_bytes"] > 0 and shm["segment_unmapped"] == 0
    assert shm["segment_pss"] >= shm["segment_bytes"] - 1024 * 64 * 2  # both workers map every page of every segment
    assert "## Memory per host (PSS)" in printed and "| 2 | ramgrid+shm |" in printed
    with np.load(out / "scores.npz") as scores:  # an NpzFile holds its file open until closed
        assert scores["score"].shape == (1500,) and (scores["score"] < 0).all()


def test_lm_score_example_runs() -> None:
    import subprocess
    import sys

    args = [sys.executable, str(REPO_ROOT / "examples" / "lm_score.py"), "--servers", "2", "--max-sentences", "2000"]
    if LM1B.exists():
        args += ["--corpus", str(LM1B)]
    else:
        pytest.importorskip("wordfreq", reason="neither the shared lm1b corpus nor wordfreq is available")
    out = subprocess.run(args, capture_output=True, text=True, timeout=100, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "scored 2,000 sentences" in out.stdout and "least likely" in out.stdout
