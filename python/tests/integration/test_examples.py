"""The side-resource examples run on small slices and give correct results: the grid join equals the engine's merge,
and EM with parameters in the grid reads only pinned versions and matches a numpy reference."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)
pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install '.[dask]')")
pytest.importorskip("pandas", reason="the join example needs pandas (pip install 'dask[dataframe]')")

REPO_ROOT = Path(__file__).resolve().parents[3]
DATA = REPO_ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.timeout(120)


def _example(name: str) -> ModuleType:
    """Imports examples/NAME.py as module NAME. Dask pickles the examples' map functions by reference, so the
    worker processes must import the module too: they are spawned with this process's sys.path."""
    examples = str(REPO_ROOT / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def join() -> ModuleType:
    return _example("join_enrich")


@pytest.fixture(scope="module")
def em() -> ModuleType:
    return _example("em_iterations")


@pytest.mark.parametrize(
    "scheduler",
    ["threads", pytest.param("distributed", marks=pytest.mark.slow)],  # worker processes: ~7 s
)
def test_join_on_generated_clicks(join: ModuleType, scheduler: str, capsys: pytest.CaptureFixture[str]) -> None:
    res = join.main(
        [
            "--synthetic",
            "--rows",
            "30000",
            "--users",
            "5000",
            "--repeat",
            "1",
            "--partitions",
            "4",
            "--scheduler",
            scheduler,
        ]
    )
    assert res["identical"] and res["rows"] == 30000
    out = res["result"]
    # Independently of both joins: every known user got the values derived from its id, unknown ones the defaults.
    known = out["user_id"].to_numpy() < 5000
    age, score = join.user_side(out["user_id"].to_numpy()[known])
    assert np.array_equal(out["age"].to_numpy()[known], age)
    assert np.array_equal(out["score"].to_numpy()[known], score)
    assert (out["age"].to_numpy()[~known] == -1).all() and np.isnan(out["score"].to_numpy()[~known]).all()
    assert 0 < res["misses"] == int((~known).sum())
    assert "outputs identical: yes" in capsys.readouterr().out


@pytest.mark.skipif(not (DATA / "kddcup99-10percent.csv.gz").exists(), reason="no ../shared/data KDD Cup 99 file")
def test_join_on_kdd_slice(join: ModuleType) -> None:
    res = join.main(["--rows", "20000", "--repeat", "1", "--scheduler", "threads"])
    assert res["identical"] and res["rows"] == 20000
    out = res["result"]
    for service, risk in zip(out["service"].head(500), out["risk"].head(500)):
        expected = join.kdd_side(str(service))
        assert np.isnan(risk) if expected is None else risk == expected[0]


def test_em_reads_pinned_versions_and_matches_numpy(em: ModuleType) -> None:
    res = em.main(["--synthetic", "--rows", "20000", "--iterations", "6", "--chunks", "4", "--interfere"])
    hist = res["history"]
    assert len(hist) == 6
    for h in hist:
        # Every task read the version pinned for its iteration, never the decoy that was current meanwhile.
        assert h["versions_read"] == [h["version"]] and h["tags_read"] == [h["iteration"]]
        assert h["decoy"] is not None and h["decoy"] > h["version"]
    lls = [h["loglik"] for h in hist]
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(lls, lls[1:])), lls  # EM never lowers the likelihood
    assert lls[-1] > lls[0]
    ref = res["reference"]
    np.testing.assert_allclose(lls, ref["logliks"], rtol=1e-9)
    for name in ("w", "mu", "var"):
        np.testing.assert_allclose(res[name], ref[name], rtol=1e-7, atol=1e-12)
    assert res["tag"] == 6


@pytest.mark.skipif(not (DATA / "uci-skin-segmentation.tsv.gz").exists(), reason="no ../shared/data skin file")
def test_em_on_skin_slice(em: ModuleType) -> None:
    res = em.main(["--rows", "30000", "--iterations", "4", "--scheduler", "threads"])
    assert res["pinned_ok"]
    assert max(res["relative_diffs"].values()) < 1e-7


def test_the_survive_failures_example_runs() -> None:
    import subprocess

    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "survive_failures.py")],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "a write is refused" in r.stdout and "NO_QUORUM" in r.stdout, r.stdout
