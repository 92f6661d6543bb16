"""Language-model math (MLE and add-k in natural log), the counting map task, and the memcached peer's key mapping."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ramgrid.lm.corpus import stage_sentences
from ramgrid.lm.count import count_block, count_slice
from ramgrid.lm.model import Smoothing, log_probs, unk_log_prob
from ramgrid.lm.peers import Crc32ModuloHash, mc_key

pytestmark = pytest.mark.timeout(30)


def test_mle_is_the_log_of_relative_counts() -> None:
    lp = log_probs(np.array([1, 3]), total=4, vocabulary=2, smoothing=Smoothing("mle"))
    assert lp.tolist() == [math.log(0.25), math.log(0.75)]
    assert unk_log_prob(4, 2, Smoothing("mle")) == float("-inf")


def test_add_k_by_hand() -> None:
    # counts 1 and 3, N = 4, V = 2, k = 1: denominator 4 + 1 * (2 + 1) = 7.
    sm = Smoothing("add-k", 1.0)
    lp = log_probs(np.array([1, 3]), total=4, vocabulary=2, smoothing=sm)
    assert lp.tolist() == [math.log(2 / 7), math.log(4 / 7)]
    assert unk_log_prob(4, 2, sm) == math.log(1 / 7)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50), st.floats(0.01, 5.0))
def test_add_k_probabilities_with_unk_sum_to_one(counts: list[int], k: float) -> None:
    sm = Smoothing("add-k", k)
    n, v = sum(counts), len(counts)
    total = math.fsum(np.exp(log_probs(np.array(counts), n, v, sm)).tolist()) + math.exp(unk_log_prob(n, v, sm))
    assert total == pytest.approx(1.0, rel=1e-12)


def test_smoothing_is_validated() -> None:
    with pytest.raises(ValueError, match="mle"):
        Smoothing("kneser-ney")
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="k > 0"):
            Smoothing("add-k", bad)


def test_count_slice_counts_tokens_and_statistics(tmp_path: Path) -> None:
    s = stage_sentences(["a b a", "", "c " + "z" * 101 + " a"], tmp_path / "c", "test")
    stats, counts = count_slice(s.slice(0, s.lines))
    assert (stats.lines, stats.tokens, stats.empty_lines, stats.dropped_long_tokens) == (3, 5, 1, 1)
    assert counts == {"a": 3, "b": 1, "c": 1}


def test_count_block_carries_the_statistics_under_keys_no_token_can_be() -> None:
    block = b"a b a\n\nc " + b"z" * 101 + b" a\nbad \xff\n\n"
    out = count_block(block)
    stats = {k: v for k, v in out.items() if k.startswith(" ")}
    assert stats == {" lines": 5, " tokens": 7, " empty_lines": 2, " dropped_long_tokens": 1, " replaced_lines": 1}
    assert {k: v for k, v in out.items() if not k.startswith(" ")} == {"a": 3, "b": 1, "c": 1, "bad": 1, "\ufffd": 1}
    # The last line of a file may lack its terminator; it is still one line.
    assert count_block(b"x y")[" lines"] == 1 and count_block(b"")[" lines"] == 0


def test_memcached_keys_are_valid_and_distinct() -> None:
    assert mc_key("hello") == b"hello"
    assert mc_key("café") == "café".encode()
    assert mc_key("é" * 125) == ("é" * 125).encode()  # 250 bytes of UTF-8: still a plain key
    odd = [" <unk>", "a\x01b", "%41", "é" * 126, "x" * 251, "\x7f"]
    keys = [mc_key(t) for t in odd]
    assert len(set(keys)) == len(keys)
    for k in keys:
        assert k.startswith(b"%") and len(k) <= 250
        assert all(0x21 <= c < 0x7F for c in k)
    assert mc_key("%41") != b"%41"  # a token that looks like a digest key is hashed too, so it cannot collide


def test_crc32_hasher_is_stable() -> None:
    h = Crc32ModuloHash()
    for node in ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"):
        h.add_node(node)
    assert h.nodes == ["127.0.0.1:1", "127.0.0.1:2"]
    picks = {h.get_node(f"k{i}".encode()) for i in range(100)}
    assert picks == set(h.nodes)
    assert h.get_node(b"abc") == h.get_node("abc")
