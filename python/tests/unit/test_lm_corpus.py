"""The language-model corpus: tokenising as the reference experiment did, UTF-8 replacement counting, staging
plain and gzip corpora into line-range files, and the errors for corpora that cannot be used."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ramgrid.lm import corpus as corpus_mod
from ramgrid.lm.corpus import (
    CorpusError,
    decode_lines,
    read_slice,
    split_tasks,
    stage_corpus,
    stage_sentences,
    tokenize,
    tokenize_lines,
)

pytestmark = pytest.mark.timeout(30)


def test_tokenize_splits_on_any_whitespace() -> None:
    assert tokenize("The  cat\tsat\r") == ["The", "cat", "sat"]
    assert tokenize("a\u00a0b\u2009c") == ["a", "b", "c"]  # Unicode spaces split too (str.split semantics)
    assert tokenize("   ") == []
    assert tokenize("") == []


def test_tokens_longer_than_100_characters_are_dropped() -> None:
    ok, long = "x" * 100, "y" * 101
    assert tokenize(f"a {ok} {long} b") == ["a", ok, "b"]
    sents, dropped = tokenize_lines([f"{long} {long} c", "d e", ok])
    assert sents == [["c"], ["d", "e"], [ok]]
    assert dropped == 2


def test_decode_counts_lines_with_invalid_utf8() -> None:
    raw = [b"caf\xc3\xa9 ok", b"bad \xff byte", b"\xfe\xfe twice", "valid \ufffd kept".encode()]
    lines, replaced = decode_lines(raw)
    assert replaced == 2  # a U+FFFD that was in the text all along is not a replacement
    assert lines == ["café ok", "bad \ufffd byte", "\ufffd\ufffd twice", "valid \ufffd kept"]
    assert decode_lines([]) == ([], 0)


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20))
@settings(max_examples=100, deadline=None)
def test_decode_keeps_one_line_per_raw_line(raw: list[bytes]) -> None:
    lines, replaced = decode_lines(raw)
    assert lines == [r.decode("utf-8", "replace") for r in raw]
    assert replaced == sum(1 for r in raw if r.decode("utf-8", "replace").encode("utf-8", "surrogatepass") != r)


@given(st.integers(0, 5000), st.integers(1, 700), st.integers(1, 8))
def test_split_tasks_covers_every_line_once(total: int, per_task: int, min_tasks: int) -> None:
    ranges = split_tasks(total, per_task, min_tasks)
    assert sum(c for _, c in ranges) == total
    pos = 0
    for first, count in ranges:
        assert first == pos and count > 0
        pos += count
    if total:
        assert len(ranges) >= min(min_tasks, total)


def _all_lines(staged: corpus_mod.StagedCorpus) -> list[bytes]:
    return read_slice(staged.slice(0, staged.lines))


def test_plain_and_gzip_stage_the_same_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus_mod, "_BLOCK", 64)  # many small staged files, so slices cross file boundaries
    lines = [f"sentence {i} " + "w" * (i % 17) for i in range(300)] + ["", "last without newline"]
    text = "\n".join(lines).encode()
    plain, gz = tmp_path / "c.txt", tmp_path / "c.txt.gz"
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text))
    a = stage_corpus(plain, tmp_path / "a")
    b = stage_corpus(gz, tmp_path / "b")
    assert a.lines == b.lines == len(lines)
    assert len(a.files) > 5
    assert _all_lines(a) == _all_lines(b) == [s.encode() for s in lines]
    got = read_slice(a.slice(37, 101))
    assert got == [s.encode() for s in lines[37:138]]


def test_max_lines_stops_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus_mod, "_BLOCK", 50)
    p = tmp_path / "c.txt"
    p.write_text("".join(f"line {i}\n" for i in range(100)))
    s = stage_corpus(p, tmp_path / "s", max_lines=42)
    assert s.lines == 42 and s.truncated
    assert _all_lines(s)[-1] == b"line 41"


def test_unusable_corpora_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="corpus not found"):
        stage_corpus(tmp_path / "nope.txt", tmp_path / "s1")
    with pytest.raises(CorpusError, match="is a directory"):
        stage_corpus(tmp_path, tmp_path / "s2")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(CorpusError, match="is empty"):
        stage_corpus(empty, tmp_path / "s3")
    empty_gz = tmp_path / "empty.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    with pytest.raises(CorpusError, match="is empty"):
        stage_corpus(empty_gz, tmp_path / "s4")
    bad_gz = tmp_path / "bad.gz"
    bad_gz.write_bytes(gzip.compress(b"a b c\n" * 1000)[:40])
    with pytest.raises(CorpusError, match="cannot be read"):
        stage_corpus(bad_gz, tmp_path / "s5")


def test_stage_sentences_from_memory(tmp_path: Path) -> None:
    s = stage_sentences(["a b", "c"], tmp_path / "m", "two sentences")
    assert s.lines == 2 and _all_lines(s) == [b"a b", b"c"]
    with pytest.raises(CorpusError):
        stage_sentences([], tmp_path / "m2", "none")


def test_wordfreq_sampling_is_seeded_and_english() -> None:
    pytest.importorskip("wordfreq", reason="wordfreq is not installed (pip install wordfreq)")
    a, info = corpus_mod.sample_wordfreq_sentences(300, seed=7, vocabulary=5000)
    b, _ = corpus_mod.sample_wordfreq_sentences(300, seed=7, vocabulary=5000)
    c, _ = corpus_mod.sample_wordfreq_sentences(300, seed=8, vocabulary=5000)
    assert a == b and a != c and len(a) == 300
    assert info["vocabulary"] == 5000 and info["seed"] == 7
    tokens = [t for s in a for t in tokenize(s)]
    assert all(s.endswith(" .") for s in a)
    assert "the" in tokens  # the most frequent English word shows up in 300 sentences
    assert 10 < len(tokens) / len(a) < 40
