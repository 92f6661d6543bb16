"""The experiment's report: the paper's throughput definitions, ratios to the peers, and the files it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ramgrid.lm.report import derive, format_markdown, write_report

pytestmark = pytest.mark.timeout(60)


def _run(
    servers: Any, system: str, mode: str, wall: float, lookups: int = 1000, sentences: int = 100
) -> dict[str, Any]:
    return {
        "servers": servers,
        "system": system,
        "mode": mode,
        "sentences": sentences,
        "tokens": 1000,
        "lookups": 0 if mode == "noop" else lookups,
        "calls": 10,
        "keys": 500,
        "lookup_s": 0.5,
        "wall_s": wall,
        "tasks": 4,
        "extra": {},
    }


def _result() -> dict[str, Any]:
    runs = []
    for n in (1, 2):
        runs += [
            _run(n, "noop", "noop", 0.5),
            _run(n, "memcached", "per-token", 10.5),
            _run(n, "memcached", "per-partition", 2.5),
            _run(n, "ramgrid", "per-partition", 0.75),
        ]
    runs.append(_run(None, "dict", "per-partition", 0.6))
    return {
        "command": "ramgrid demo lm --test",
        "config": {"workers": 2},
        "machine": {"cpu_count": 2},
        "corpus": {"description": "unit", "lines": 100, "tokens": 1000},
        "model": {"smoothing": "mle"},
        "workloads": {"full": 100, "per_token": 100, "per_sentence": 100},
        "runs": runs,
        "loads": [{"servers": 2, "system": "ramgrid", "load_s": 0.1, "what": "x"}],
        "distribution": [
            {"servers": 2, "system": "ramgrid", "items": [40, 60], "how": "map"},
            {"servers": 2, "system": "memcached", "items": [55, 45], "how": "stats"},
        ],
        "timings_s": {},
    }


def test_paper_throughput_subtracts_noop_and_ratios_use_the_same_server_count() -> None:
    result = _result()
    summary = derive(result)
    rg = next(r for r in summary["rows"] if r["system"] == "ramgrid" and r["servers"] == 2)
    assert rg["noop_s"] == 0.5
    assert rg["throughput_paper"] == pytest.approx(1000 / 0.25)
    assert rg["throughput_e2e"] == pytest.approx(1000 / 0.75)
    assert rg["avg_latency_s"] == pytest.approx(0.5 / 1000)
    assert rg["x_memcached_same_mode"] == pytest.approx(2.5 / 0.75)
    assert rg["x_memcached_per_token"] == pytest.approx(10.5 / 0.75)
    assert rg["x_dict"] == pytest.approx(0.6 / 0.75)
    t = summary["targets"][-1]
    assert t["servers"] == 2 and not t["meets_2M"] and not t["meets_10x_memcached"] and t["meets_0.3x_dict"]
    d = next(r for r in summary["rows"] if r["system"] == "dict")
    assert d["noop_s"] == 0.5  # the dict runs once; it is measured against the first server count's NoOp


def test_markdown_has_the_papers_columns() -> None:
    result = _result()
    md = format_markdown(result, derive(result))
    for col in ("Servers", "Running time", "Σ latency", "Avg. latency", "NoOp", "Throughput (paper)"):
        assert col in md
    assert "ramgrid demo lm --test" in md
    assert "40, 60 (40.0%, 60.0%)" in md


def test_write_report_writes_markdown_json_and_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install matplotlib)")
    files = write_report(_result(), tmp_path)
    assert {Path(p).name for p in files.values()} == {
        "report.md",
        "result.json",
        "fig5_latency_throughput.png",
        "fig6_key_distribution.png",
    }
    for p in files.values():
        assert Path(p).stat().st_size > 0
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["summary"]["targets"][0]["servers"] == 1
    assert (tmp_path / "fig5_latency_throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_fused_mode_is_compared_with_memcached_batched_and_the_dict() -> None:
    result = _result()
    result["runs"].append(_run(2, "ramgrid", "fused", 0.2))
    summary = derive(result)
    fu = next(r for r in summary["rows"] if r["mode"] == "fused")
    # memcached has no fused mode: its batched (per-partition) run is the peer, as is the dict's.
    assert fu["x_memcached_same_mode"] == pytest.approx(2.5 / 0.2)
    assert fu["x_dict"] == pytest.approx(0.6 / 0.2)
    (t,) = summary["fused_targets"]
    assert t["servers"] == 2 and t["meets_10x_memcached"] and t["meets_2x_dict"]
    md = format_markdown(result, summary)
    assert "| fused | 2 | ramgrid |" in md
    assert "Targets (issue 10)" in md and "| 2 | 5.0 k/s | 12x | yes | 3.00x | yes |" in md
    # The per-partition targets are unchanged by the extra run.
    assert [x["servers"] for x in summary["targets"]] == [1, 2]


def _mem_row(workers: int, mode: str, per_worker_mib: float, servers_mib: float, shmem_mib: float = 0.0) -> Any:
    mib = 2**20
    return {
        "workers": workers,
        "mode": mode,
        "worker_pss": [int(per_worker_mib * mib)] * workers,
        "worker_shmem_pss": [int(shmem_mib * mib)] * workers,
        "workers_pss": int(per_worker_mib * mib) * workers,
        "servers_pss": int(servers_mib * mib),
        "segment_bytes": int(shmem_mib * workers * mib),
        "segment_pss": int(shmem_mib * workers * mib),
        "segment_unmapped": 0,
        "host": int(per_worker_mib * mib) * workers + int(servers_mib * mib),
    }


def test_memory_section_shows_each_mode_per_host_and_the_ratio_to_the_dict() -> None:
    result = _result()
    result["memory"] = {
        "rows": [
            _mem_row(8, "shm", 40.0, 100.0, shmem_mib=10.0),
            _mem_row(8, "dict", 200.0, 0.0),
            _mem_row(8, "tcp", 30.0, 100.0),
        ],
        "notes": ["memory of the x mode not measured: because"],
        "servers": 1,
    }
    md = format_markdown(result, derive(result))
    assert "## Memory per host (PSS)" in md
    lines = md.splitlines()
    start = lines.index("| Workers | System | PSS per worker | of which segments | Workers | Servers | Host |")
    assert lines[start + 2 : start + 5] == [
        "| 8 | dict | 200.0 MiB | - | 1,600.0 MiB | - | 1,600.0 MiB |",
        "| 8 | ramgrid | 30.0 MiB | - | 240.0 MiB | 100.0 MiB | 340.0 MiB |",
        "| 8 | ramgrid+shm | 40.0 MiB | 10.0 MiB | 320.0 MiB | 100.0 MiB | 420.0 MiB |",
    ]
    assert "costs the host 420.0 MiB against 1,600.0 MiB for a dict in every worker (3.81x), 340.0 MiB over TCP" in md
    assert "Note: memory of the x mode not measured: because." in md
    assert "## Memory per host" not in format_markdown(_result(), derive(_result()))
