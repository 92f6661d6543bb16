"""Fused lookup-reduce against real servers: bit for bit the plain-Python scores of the language-model experiment
(math.fsum of the tokens' ln p, the unknown-word value for a miss), on the lm1b sample and on a generated corpus,
with misses, token lists, bad input, and servers killed in the middle of a batch."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ramgrid.exceptions import PartitionsUnavailable, TableNotFound
from ramgrid.lm.corpus import decode_lines, read_slice, stage_corpus, stage_sentences, tokenize, tokenize_lines
from ramgrid.lm.score import reference_scores

REPO_ROOT = Path(__file__).resolve().parents[3]
LM1B = REPO_ROOT.parent / "shared" / "data" / "lm1b-heldout-news-sentences.txt.gz"
UNK = -17.25
pytestmark = pytest.mark.timeout(120)

# Every character str.split() splits on, and look-alikes it does not.
SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2005\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_SPACES = "\u200b\u180e\ufeff\u2060\u00e9\u2027\u2030\U0001f600"


def _generated_sentences(n: int, seed: int) -> tuple[list[str], list[str]]:
    """Sentences over a Zipf-ish vocabulary with every kind of whitespace, tokens of 100 and 101 characters, and
    multi-byte characters; returns (sentences, vocabulary)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(400)] + ["é" * 100, "é" * 101, "a" * 101, "x\u200by", "\U0001f600" * 3, "<s>"]
    vocab += [f"{c}{i}" for i, c in enumerate(NOT_SPACES)]
    sents = []
    for _ in range(n):
        k = min(int(rng.expovariate(1 / 12)), 60)
        # Mostly the head of the vocabulary, sometimes anything (so the long and odd tokens turn up).
        toks = [
            rng.choice(vocab) if rng.random() < 0.05 else vocab[min(int(rng.paretovariate(0.9)) - 1, 399)]
            for _ in range(k)
        ]
        seps = [rng.choice(" " * 20 + SPACES) * rng.choice((1, 1, 1, 2)) for _ in range(k + 1)]
        sents.append("".join(s + t for s, t in zip(seps, toks)) + seps[-1])
    return sents, vocab


def _python_scores(texts: list[str], model: dict[str, float], unk: float | None, how: str = "sum") -> np.ndarray:
    out = []
    for t in texts:
        toks = tokenize(t)
        vals = [model[x] for x in toks if x in model] if unk is None else [model.get(x, unk) for x in toks]
        if how == "sum":
            out.append(math.fsum(vals))
        elif how == "mean":
            out.append(math.fsum(vals) / len(vals) if vals else math.nan)
        else:
            out.append(max(vals) if vals else math.nan)
    return np.array(out, dtype=np.float64)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float64 and got.shape == want.shape
    # Bit for bit; every NaN is the same "no value" (their payloads are not compared).
    nan = np.isnan(got)
    assert (nan == np.isnan(want)).all(), f"NaN at {np.flatnonzero(nan != np.isnan(want))[:5]}"
    bad = np.flatnonzero((got.view(np.int64) != want.view(np.int64)) & ~nan)
    assert bad.size == 0, f"first difference at record {bad[0]}: {got[bad[0]]!r} vs {want[bad[0]]!r}"


@pytest.fixture(scope="module")
def grid() -> Iterator[ramgrid.LocalGrid]:
    with ramgrid.local(servers=2, memory="64MiB") as g:
        yield g


def _load(grid: Any, name: str, model: dict[str, float], replication: int = 1) -> Any:
    t = grid.create_table(name, partitions=16, replication=replication, value_type="f64")
    keys = list(model)
    t.put_many(keys, np.array([model[k] for k in keys], dtype=np.float64))
    return t


def test_generated_corpus_matches_plain_python_with_misses(grid: Any, tmp_path: Path) -> None:
    sents, vocab = _generated_sentences(3000, seed=1)
    rng = random.Random(2)
    # Values that make a plain or Kahan sum differ from fsum; every 7th token is left out of the table (a miss).
    model = {
        w: rng.choice((1e16, -1e16, 1.0, 1e-16, 0.1, 3.3e-5)) * rng.uniform(0.5, 2) * rng.choice((-1, 1))
        for i, w in enumerate(vocab)
        if i % 7 != 3
    }
    t = _load(grid, "gen", model)
    pinned = t.pin()
    want = _python_scores(sents, model, UNK)
    r = pinned.lookup_reduce(sents, default=UNK)
    _same(r.values, want)
    assert r.misses.sum() > 0 and r.version == pinned.version
    assert (r.counts == [len(tokenize(s)) for s in sents]).all()
    assert (r.misses == [sum(x not in model for x in tokenize(s)) for s in sents]).all()
    assert r.distinct == len({x for s in sents for x in tokenize(s)})
    assert r.dropped == sum(len(s.split()) - len(tokenize(s)) for s in sents) > 0
    # The same texts as UTF-8 bytes, and through the experiment's reference (staged corpus, dict, fsum).
    _same(t.lookup_reduce([s.encode() for s in sents], default=UNK).values, want)
    staged = stage_sentences([s.replace("\n", " ").replace("\r", " ") for s in sents], tmp_path / "c", "gen")
    raw = read_slice(staged.slice(0, staged.lines))
    _same(pinned.lookup_reduce(raw, default=UNK).values, reference_scores(staged, model, UNK))
    # Misses skipped, and the other reductions.
    _same(t.lookup_reduce(sents).values, _python_scores(sents, model, None))
    for how in ("mean", "max"):
        _same(t.lookup_reduce(sents, reduce=how, default=UNK).values, _python_scores(sents, model, UNK, how))
        _same(t.lookup_reduce(sents, reduce=how).values, _python_scores(sents, model, None, how))


def test_lm1b_sample_matches_reference_scores(grid: Any, tmp_path: Path) -> None:
    if not LM1B.exists():
        pytest.skip(f"{LM1B} is absent: the shared test data (../shared/data) is not next to this checkout")
    corpus = stage_corpus(LM1B, tmp_path / "lm1b")
    lines, _ = decode_lines(read_slice(corpus.slice(0, corpus.lines)))
    sents, _ = tokenize_lines(lines)
    counts = Counter(t for s in sents for t in s)
    total = sum(counts.values())
    model = {w: math.log(c / total) for w, c in counts.items()}
    unk = math.log(0.5 / total)
    t = _load(grid, "lm1b", model)
    want = reference_scores(corpus, model, unk)
    raw = read_slice(corpus.slice(0, corpus.lines))
    r = t.pin().lookup_reduce(raw, default=unk)
    _same(r.values, want)
    assert r.misses.sum() == 0 and r.counts.sum() == total and corpus.lines == 24_321
    # A model without the rarer half of the vocabulary: misses take the unknown-word value.
    rare = {w for w, c in counts.items() if c == 1}
    part = {w: v for w, v in model.items() if w not in rare}
    t2 = _load(grid, "lm1b_part", part)
    r2 = t2.lookup_reduce(raw, default=unk)
    _same(r2.values, reference_scores(corpus, part, unk))
    assert r2.misses.sum() == len(rare)


def test_token_lists_and_packed_records(grid: Any) -> None:
    model = {"a": 0.1, "b": 0.2, "c c": 1e16, "d": -1e16}
    t = _load(grid, "lists", model)
    lists = [["a", "b", "a"], [], ["c c", "a", "d"], [b"b", "zz"]]
    want = np.array([math.fsum([0.1, 0.2, 0.1]), 0.0, math.fsum([1e16, 0.1, -1e16]), 0.2 + UNK])
    r = t.lookup_reduce(lists, default=UNK, tokenize="none")
    _same(r.values, want)
    assert r.misses.tolist() == [0, 0, 0, 1] and r.counts.tolist() == [3, 0, 3, 2]
    toks = [x.encode() if isinstance(x, str) else x for rec in lists for x in rec]
    tok_off = np.cumsum([0] + [len(x) for x in toks]).astype(np.int64)
    rec_off = np.cumsum([0] + [len(rec) for rec in lists]).astype(np.int64)
    _same(t.lookup_reduce((rec_off, tok_off, b"".join(toks)), default=UNK, tokenize="none").values, want)
    assert t.lookup_reduce([], default=UNK).values.size == 0


def test_bad_input_is_refused_clearly(grid: Any, table_name: str) -> None:
    t = _load(grid, table_name, {"a": 1.0})
    i64 = grid.create_table(table_name + "_i", partitions=4, value_type="i64")
    i64.put_many(["a"], np.array([1]))
    with pytest.raises(ValueError, match="f64"):
        i64.lookup_reduce(["a"])
    with pytest.raises(ValueError, match="reduce must be"):
        t.lookup_reduce(["a"], reduce="median")
    with pytest.raises(ValueError, match="tokenize must be"):
        t.lookup_reduce(["a"], tokenize="nltk")
    with pytest.raises(TypeError, match="token lists need"):
        t.lookup_reduce([["a"]])
    with pytest.raises(TypeError, match="str or bytes"):
        t.lookup_reduce(["a", 3])
    with pytest.raises(TypeError, match="one str"):
        t.lookup_reduce("a b")
    with pytest.raises(TypeError, match="default"):
        t.lookup_reduce(["a"], default="x")
    with pytest.raises(ValueError, match="record offsets"):
        t.lookup_reduce((np.array([0, 2]), np.array([0, 1]), b"a"), tokenize="none")
    # fsum's refusals, naming the record.
    big = _load(grid, table_name + "_big", {"big": 1e308, "inf": math.inf, "ninf": -math.inf})
    with pytest.raises(ValueError, match="record 1: intermediate overflow"):
        big.lookup_reduce(["big", "big big"])
    with pytest.raises(ValueError, match="record 0: -inf \\+ inf"):
        big.lookup_reduce(["inf ninf"])
    # A dropped table, and a pinned version of a table dropped and created again under its name.
    pinned = t.pin()
    grid.drop_table(table_name)
    with pytest.raises(TableNotFound):
        t.lookup_reduce(["a"])
    _load(grid, table_name, {"a": 2.0})
    with pytest.raises(TableNotFound):
        pinned.lookup_reduce(["a"])
    assert t.lookup_reduce(["a a"]).values.tolist() == [4.0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        st.text(alphabet=st.sampled_from(list("ab\u00e9\U0001f600" + SPACES + NOT_SPACES)), max_size=30), max_size=8
    ),
    values=st.lists(
        st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300), min_size=8, max_size=8
    ),
)
def test_any_text_and_values_match_python(grid: Any, texts: list[str], values: list[float]) -> None:
    """Tokenising and summing agree with str.split() + math.fsum on arbitrary texts and values."""
    toks = sorted({x for s in texts for x in s.split()})[:8]
    model = dict(zip(toks, values))
    name = "prop"
    if name not in grid.tables():
        grid.create_table(name, partitions=4, value_type="f64")
    t = grid.table(name)
    old = t.current_version()
    w = t.new_version().begin()
    if model:
        w.put_many(list(model), np.array(list(model.values())))
    w.commit()
    t.drop_version(old)
    try:
        want = _python_scores(texts, model, UNK)
    except OverflowError:
        return  # fsum refuses; covered by test_bad_input_is_refused_clearly
    _same(t.lookup_reduce(texts, default=UNK).values, want)
    _same(t.lookup_reduce([x.encode() for x in texts], default=UNK).values, want)


def test_invalid_utf8_is_replaced_like_the_corpus_reader(grid: Any) -> None:
    raw = [b"ab\xff\xfe c\xed\xa0\x80d \xf0\x9f\x98 e\xe2\x82", b"\xc0\xaf z", "é".encode() * 101 + b"\xff q"]
    lines, replaced = decode_lines(raw)
    assert replaced == 3
    model = {x: float(i) for i, x in enumerate(sorted({x for s in lines for x in tokenize(s)}))}
    t = _load(grid, "utf8", model)
    _same(t.lookup_reduce(raw, default=UNK).values, _python_scores(lines, model, UNK))


def _kill_mid_batch(replication: int) -> tuple[list[BaseException], int, np.ndarray, Any]:
    sents, vocab = _generated_sentences(20_000, seed=3)
    model = {w: 0.5 * i - 3.0 for i, w in enumerate(vocab)}
    want = _python_scores(sents, model, UNK)
    errors: list[BaseException] = []
    rounds = [0]
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        t = _load(g, "rep", model, replication=replication).pin()
        killed = threading.Event()

        def reader() -> None:
            try:
                for _ in range(500):  # bounded even if the kill never comes
                    _same(t.lookup_reduce(sents, default=UNK).values, want)
                    rounds[0] += 1
                    if killed.is_set() and rounds[0] > 8:
                        return
            except BaseException as e:  # noqa: BLE001 - re-raised by the test
                errors.append(e)

        th = threading.Thread(target=reader)
        th.start()
        while rounds[0] < 2 and th.is_alive():
            th.join(0.01)
        g.kill(1)
        killed.set()
        th.join(60)
        assert not th.is_alive()
        after = None
        if replication == 1:
            with pytest.raises(PartitionsUnavailable) as e:
                t.lookup_reduce(sents, default=UNK)
            after = e.value
        else:
            _same(t.lookup_reduce(sents, default=UNK).values, want)
    return errors, rounds[0], want, after


def test_server_killed_mid_batch_at_replication_2_still_answers_exactly() -> None:
    errors, rounds, _, _ = _kill_mid_batch(2)
    assert not errors, errors[0]
    assert rounds > 8


def test_server_killed_at_replication_1_raises_naming_partitions() -> None:
    errors, _, _, after = _kill_mid_batch(1)
    assert len(errors) == 1 and isinstance(errors[0], PartitionsUnavailable), errors
    assert after.partitions and "partition" in str(after)
