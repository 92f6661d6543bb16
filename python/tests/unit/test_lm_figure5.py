"""Figure 5 of the experiment's report: every system's per-token latency and throughput can be read, even when one is
hundreds of times faster than the others (issue 28: on a linear axis the fastest flattened the rest to nothing)."""

from __future__ import annotations

from typing import Any

import pytest
from ramgrid.lm.report import derive, figure5

pytestmark = pytest.mark.timeout(60)
plt = pytest.importorskip("matplotlib.pyplot", reason="matplotlib is not installed (pip install matplotlib)")

# system: (seconds inside lookups, wall seconds) for 100,000 per-token lookups; the shared-memory reader is ~300x
# faster than memcached, as in benchmarks/results/lm_experiment.
SPEEDS = {"memcached": (20.0, 10.5), "ramgrid": (10.0, 5.5), "ramgrid+near": (5.0, 3.0), "ramgrid+shm": (0.06, 0.53)}


def _run(servers: Any, system: str, mode: str, lookup_s: float, wall_s: float) -> dict[str, Any]:
    return {
        "servers": servers,
        "system": system,
        "mode": mode,
        "sentences": 100,
        "tokens": 100_000,
        "lookups": 0 if mode == "noop" else 100_000,
        "calls": 100_000,
        "keys": 500,
        "lookup_s": lookup_s,
        "wall_s": wall_s,
        "tasks": 4,
        "extra": {},
    }


def _summary(per_token: bool) -> dict[str, Any]:
    runs = []
    for n in (1, 2, 4):
        runs.append(_run(n, "noop", "noop", 0.0, 0.5))
        for system, (lookup_s, wall_s) in SPEEDS.items():
            runs.append(_run(n, system, "per-partition", lookup_s / 100, wall_s / 10 + 0.05))
            if per_token:
                runs.append(_run(n, system, "per-token", lookup_s * n**0.5, wall_s * n**0.5))
    runs.append(_run(None, "dict", "per-partition", 0.01, 0.06))
    return derive({"runs": runs})


def _bar_heights_in_axes(ax: Any) -> list[float]:
    """Where each bar's top sits in the panel, from 0 (bottom) to 1 (top)."""
    to_axes = ax.transAxes.inverted()
    return [to_axes.transform(ax.transData.transform((b.get_x(), b.get_height())))[1] for b in ax.patches]


def test_per_token_panels_show_every_system_on_a_log_axis() -> None:
    fig = figure5(_summary(per_token=True))
    try:
        lat, thr, e2e = fig.axes
        for ax in (lat, thr, e2e):
            assert ax.get_yscale() == "log"
        for ax in (lat, thr):
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
            labels = ax.get_legend_handles_labels()[1]
            assert set(SPEEDS) <= set(labels)
            tops = _bar_heights_in_axes(ax)
            assert len(tops) == len(SPEEDS) * 3
            # Every bar is clearly above the bottom and below the top: the smallest is not flattened by the largest.
            assert all(0.1 < y < 0.95 for y in tops), tops
            # ... and each is labelled with its value.
            assert len(ax.texts) == len(tops)
    finally:
        plt.close(fig)


def test_without_per_token_runs_only_the_end_to_end_panel_is_drawn() -> None:
    fig = figure5(_summary(per_token=False))
    try:
        (e2e,) = fig.axes
        assert e2e.get_title() == "All modes, end to end"
        assert len(e2e.get_lines()) == len(SPEEDS) + 1  # each system's per-partition line and the dict's
    finally:
        plt.close(fig)


def test_no_server_counts_no_figure() -> None:
    assert figure5(derive({"runs": [_run(None, "dict", "per-partition", 0.01, 0.06)]})) is None
