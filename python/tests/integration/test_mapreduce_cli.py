"""`ramgrid mapreduce wordcount` and examples/wordcount.py on a fresh grid: their TSV equals a plain-Python count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import _mr_helpers as h

REPO_ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    if not h.CORPUS.exists():
        pytest.skip(f"{h.CORPUS} is not there")
    lines = h.corpus_lines(3000)
    src = h.write_text(tmp_path_factory.mktemp("wc") / "slice.txt", lines)
    return src, dict(h.reference_counts(lines))


def _tsv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        word, count = line.split("\t")
        assert word not in out
        out[word] = int(count)
    return out


def test_the_command_writes_word_tab_count(sample: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    src, ref = sample
    out = tmp_path / "counts.tsv"
    cmd = [sys.executable, "-m", "ramgrid.cli", "mapreduce", "wordcount", str(src), "--out", str(out)]
    r = subprocess.run(
        [*cmd, "--local", "2", "--chunk-mib", "1", "--no-progress"], capture_output=True, timeout=100, check=False
    )
    assert r.returncode == 0, r.stderr.decode()
    assert _tsv(out) == ref
    assert f"{len(ref):,} words written" in r.stderr.decode()


def test_the_command_refuses_a_missing_input(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ramgrid.cli", "mapreduce", "wordcount", str(tmp_path / "nope.txt")]
    r = subprocess.run(
        [*cmd, "--out", str(tmp_path / "o.tsv"), "--local", "1"], capture_output=True, timeout=100, check=False
    )
    assert r.returncode != 0 and "no such file" in r.stderr.decode()
    assert not (tmp_path / "o.tsv").exists()


def test_the_example_runs(sample: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    src, ref = sample
    out = tmp_path / "counts.tsv"
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "wordcount.py"), str(src), "--out", str(out), "--servers", "1"],
        capture_output=True,
        check=False,
        timeout=100,
    )
    assert r.returncode == 0, r.stderr.decode()
    assert _tsv(out) == ref
