"""The reference experiment at full size: score the Wikipedia corpus (65 M tokens) with a unigram language model in
ramgrid, beside memcached and a dict, for 1, 2 and 4 servers (issue 4's performance run).

It is `ramgrid demo lm` with benchmark defaults: the corpus is ../shared/data/enwiki-2015-sentences.txt.gz (a
developer's and CI's shared data; give --corpus elsewhere), per-token modes on the first 5,000 sentences,
per-sentence modes on the first 100,000, everything else on all of them, and the report goes to
benchmarks/results/lm_experiment/ (report.md, result.json, the two figures; no scores file). Any other
`ramgrid demo lm` option can be added and overrides these. This is a benchmark, not a test: it asserts nothing
about speed. It takes about a quarter of an hour on a 2-core machine; for a development run take a slice:

    python benchmarks/lm_experiment.py --max-sentences 200000 --out /tmp/lm-dev
    python benchmarks/lm_experiment.py                         # the full run, recorded under benchmarks/results/
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))  # a checkout runs without installing the package

from ramgrid.lm.__main__ import demo_main


def _shown(p: Path) -> str:
    """Relative to the repository root when run from there, so a recorded command reads the same on any machine."""
    return os.path.relpath(p) if Path.cwd().resolve() == ROOT else str(p)


DEFAULTS = {
    "--corpus": _shown(ROOT.parent / "shared" / "data" / "enwiki-2015-sentences.txt.gz"),
    "--per-token-sentences": "5000",
    "--per-sentence-sentences": "100000",
    "--out": _shown(ROOT / "benchmarks" / "results" / "lm_experiment"),
}


def main(argv: list[str]) -> int:
    args = list(argv)
    for flag, value in DEFAULTS.items():
        if flag not in args:
            args += [flag, value]
    if "--no-scores" not in args:
        args.append("--no-scores")  # 3 M scores do not belong in the repository
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    print(f"commit {commit or 'unknown'}; running: python benchmarks/lm_experiment.py {' '.join(args)}", flush=True)
    return demo_main(args, prog="python benchmarks/lm_experiment.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
