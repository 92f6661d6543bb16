"""The experiment's report: the paper's Table 1 for 1, 2 and 4 servers, the peers side by side, Figures 5 and 6.

Definitions, as in the reference experiment (Lin et al., section 5.2):

- running time: wall time of the scoring job, from submitting its tasks to having every result;
- Σ latency: time spent inside lookup calls, summed over all tasks (a Hadoop counter, so it exceeds the running
  time when tasks run in parallel); average latency = Σ latency / lookups (one lookup = one token resolved; for
  batched modes, the per-token share of a batch's round trip);
- NoOp: running time of the same job on the same sentences with a constant instead of each lookup;
- throughput (paper) = lookups / (running time - NoOp time); end-to-end throughput = lookups / running time.

`write_report` writes report.md, result.json, fig5_latency_throughput.png and fig6_key_distribution.png.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["derive", "figure5", "format_markdown", "plot_figures", "write_report"]

SYSTEM_ORDER = ("memcached", "ramgrid", "ramgrid+near", "ramgrid+shm", "dict")
MODE_ORDER = ("per-token", "per-sentence", "per-partition", "fused")
# Modes memcached and the dict do not have: compared with their batched (per-partition) mode.
_PEER_MODE = {"fused": "per-partition"}
TARGET_E2E = 2_000_000
TARGET_VS_MEMCACHED = 10.0
TARGET_VS_DICT = 0.3
TARGET_FUSED_VS_MEMCACHED = 10.0  # issue 10: fused vs memcached batched (per-partition), end to end
TARGET_FUSED_VS_DICT = 2.0  # issue 10: fused vs the dict in each worker (per-partition), end to end


def _rate(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M/s"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k/s"
    return f"{x:.0f} /s"


def _secs(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x >= 3600:
        return f"{int(x // 3600)}h {int(x % 3600 // 60):02d}m"
    if x >= 100:
        return f"{int(x // 60)}m {x % 60:04.1f}s"
    return f"{x:.2f} s"


def _lat(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    if x >= 1e-6:
        return f"{x * 1e6:.2f} µs"
    return f"{x * 1e9:.0f} ns"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2f}x" if x < 10 else f"{x:.0f}x"


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Adds the computed figures (NoOp, throughputs, ratios, targets) to each run and returns the summary tables."""
    runs = result.get("runs", [])
    noop: dict[tuple[Any, int], float] = {}
    for r in runs:
        if r["mode"] == "noop":
            noop[(r["servers"], r["sentences"])] = r["wall_s"]
    first_servers = next((r["servers"] for r in runs if r["servers"] is not None), None)
    rows = []
    for r in runs:
        if r["mode"] == "noop":
            continue
        key_servers = r["servers"] if r["servers"] is not None else first_servers
        nt = noop.get((key_servers, r["sentences"]))
        lookups = r["lookups"]
        over = r["wall_s"] - nt if nt is not None else None
        r["noop_s"] = nt
        r["avg_latency_s"] = r["lookup_s"] / lookups if lookups else None
        r["avg_call_latency_s"] = r["lookup_s"] / r["calls"] if r["calls"] else None
        r["throughput_paper"] = lookups / over if over is not None and over > 0 else None
        r["throughput_e2e"] = lookups / r["wall_s"] if r["wall_s"] > 0 else None
        rows.append(r)

    def find(servers: Any, system: str, mode: str) -> dict[str, Any] | None:
        return next((x for x in rows if x["servers"] == servers and x["system"] == system and x["mode"] == mode), None)

    dict_rows = {x["mode"]: x for x in rows if x["system"] == "dict"}
    for r in rows:
        s = r["servers"]
        mc_same = find(s, "memcached", _PEER_MODE.get(r["mode"], r["mode"])) if s is not None else None
        mc_tok = find(s, "memcached", "per-token") if s is not None else None
        d = dict_rows.get(r["mode"]) or dict_rows.get("per-partition")
        r["x_memcached_same_mode"] = _div(r["throughput_e2e"], mc_same["throughput_e2e"] if mc_same else None)
        r["x_memcached_per_token"] = _div(r["throughput_e2e"], mc_tok["throughput_e2e"] if mc_tok else None)
        r["x_dict"] = _div(r["throughput_e2e"], d["throughput_e2e"] if d else None)
    servers = sorted({r["servers"] for r in rows if r["servers"] is not None})
    targets = []
    for s in servers:
        rg = find(s, "ramgrid", "per-partition")
        mc = find(s, "memcached", "per-partition")
        d = dict_rows.get("per-partition")
        if rg is None:
            continue
        e2e = rg["throughput_e2e"]
        vs_mc = _div(e2e, mc["throughput_e2e"] if mc else None)
        vs_d = _div(e2e, d["throughput_e2e"] if d else None)
        targets.append(
            {
                "servers": s,
                "ramgrid_batched_e2e": e2e,
                "meets_2M": e2e is not None and e2e >= TARGET_E2E,
                "x_memcached_batched": vs_mc,
                "meets_10x_memcached": vs_mc is not None and vs_mc >= TARGET_VS_MEMCACHED,
                "x_dict": vs_d,
                "meets_0.3x_dict": vs_d is not None and vs_d >= TARGET_VS_DICT,
            }
        )
    fused_targets = []
    for s in servers:
        fu = find(s, "ramgrid", "fused")
        if fu is None:
            continue
        mc = find(s, "memcached", "per-partition")
        d = dict_rows.get("per-partition")
        vs_mc = _div(fu["throughput_e2e"], mc["throughput_e2e"] if mc else None)
        vs_d = _div(fu["throughput_e2e"], d["throughput_e2e"] if d else None)
        fused_targets.append(
            {
                "servers": s,
                "ramgrid_fused_e2e": fu["throughput_e2e"],
                "x_memcached_batched": vs_mc,
                "meets_10x_memcached": vs_mc is not None and vs_mc >= TARGET_FUSED_VS_MEMCACHED,
                "x_dict": vs_d,
                "meets_2x_dict": vs_d is not None and vs_d >= TARGET_FUSED_VS_DICT,
            }
        )
    summary = {"rows": rows, "targets": targets, "fused_targets": fused_targets, "servers": servers}
    result["summary"] = {"targets": targets, "fused_targets": fused_targets}
    return summary


def _div(a: float | None, b: Any) -> float | None:
    if a is None or not isinstance(b, (int, float)) or b == 0:
        return None
    return a / b


def _sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r: dict[str, Any]) -> tuple[int, int, int]:
        m = MODE_ORDER.index(r["mode"]) if r["mode"] in MODE_ORDER else 9
        s = SYSTEM_ORDER.index(r["system"]) if r["system"] in SYSTEM_ORDER else 9
        return (m, s, r["servers"] or 0)

    return sorted(rows, key=key)


def _where_time_goes(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in _sorted_rows(rows):
        task_s = (r.get("extra") or {}).get("task_s_sum")
        if r["mode"] not in ("per-partition", "fused") or not task_s:
            continue
        share = r["lookup_s"] / task_s if task_s else 0.0
        per_key = r["lookup_s"] / r["keys"] if r["keys"] else None
        out.append(
            f"| {r['system']} | {r['mode']} | {r['servers'] if r['servers'] is not None else '-'} | {_secs(task_s)} | "
            f"{_secs(r['lookup_s'])} | {100 * share:.0f}% | {r['keys']:,} | {_lat(per_key)} |"
        )
    return out


_MEMORY_SYSTEM = {"dict": "dict", "tcp": "ramgrid", "shm": "ramgrid+shm"}


def _mib(x: float) -> str:
    return f"{x / 2**20:,.1f} MiB"


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    """The memory step's table (ramgrid.lm.memory): PSS per host for each mode and worker count."""
    rows = memory.get("rows") or []
    lines = ["## Memory per host (PSS)", ""]
    servers = memory.get("servers", 0)
    lines.append(
        "Fresh worker processes take the model each mode's way, score one slice of the corpus (per-partition) and "
        "hold what scoring left them while their PSS is read from /proc/PID/smaps_rollup. PSS splits a page shared "
        "by several processes between them, so the sums count it once. dict: a copy of the model in every worker, no "
        f"server; ramgrid: a pinned table read over TCP, the model in the {servers} server{'s' if servers != 1 else ''}; "
        "ramgrid+shm: the "
        "version mapped from the servers' sealed segments. The server writes a segment and does not map it, so its "
        'pages are shared by the workers that map it and counted once in their column ("segments"). Host = '
        "workers + servers + segment pages no measured process maps (none here unless shown). Bare processes: a "
        "Dask worker adds its own runtime, the same in every mode."
    )
    lines.append("")
    lines.append("| Workers | System | PSS per worker | of which segments | Workers | Servers | Host |")
    lines.append("|---:|---|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["workers"], list(_MEMORY_SYSTEM).index(r["mode"]))):
        w = r["workers"]
        seg = r.get("segment_pss", 0) / w
        lines.append(
            f"| {w} | {_MEMORY_SYSTEM.get(r['mode'], r['mode'])} | {_mib(r['workers_pss'] / w)} | "
            f"{_mib(seg) if r['mode'] == 'shm' else '-'} | {_mib(r['workers_pss'])} | "
            f"{_mib(r['servers_pss']) if r['mode'] != 'dict' else '-'} | {_mib(r['host'])}"
            + (f" (+{_mib(r['segment_unmapped'])} unmapped)" if r.get("segment_unmapped") else "")
            + " |"
        )
    for w in sorted({r["workers"] for r in rows}):
        by = {r["mode"]: r["host"] for r in rows if r["workers"] == w}
        if "shm" in by and "dict" in by and by["shm"]:
            tcp = f", {_mib(by['tcp'])} over TCP" if "tcp" in by else ""
            lines.append("")
            lines.append(
                f"With {w} workers the shared-memory mode costs the host {_mib(by['shm'])} against {_mib(by['dict'])} "
                f"for a dict in every worker ({by['dict'] / by['shm']:.2f}x){tcp}."
            )
    for note in memory.get("notes", []):
        lines.append("")
        lines.append(f"Note: {note}.")
    lines.append("")
    return lines


def _load_note(machine: dict[str, Any]) -> str:
    a, b = machine.get("load_average_at_start"), machine.get("load_average_at_end")
    if not a or not b:
        return ""
    return f" Load average (1 min) {a[0]:.1f} at the start, {b[0]:.1f} at the end."


def format_markdown(result: dict[str, Any], summary: dict[str, Any]) -> str:
    corpus = result.get("corpus", {})
    model = result.get("model", {})
    machine = result.get("machine", {})
    lines = ["# Unigram language-model scoring: ramgrid vs memcached vs a dict (after Lin et al., Table 1)", ""]
    commit = machine.get("commit")
    lines.append(f"Command: `{result.get('command', '')}`" + (f" (commit {commit})" if commit else ""))
    lines.append("")
    lines.append(
        f"Corpus: {corpus.get('description', '?')}. {corpus.get('lines', 0):,} sentences, "
        f"{corpus.get('tokens', 0):,} tokens, {corpus.get('vocabulary', 0):,} distinct; "
        f"{corpus.get('dropped_long_tokens', 0):,} tokens over 100 characters dropped; "
        f"{corpus.get('replaced_lines', 0):,} lines with bytes that are not UTF-8 (replaced)."
    )
    k = f", k = {model.get('k')}" if model.get("smoothing") == "add-k" else ""
    job = model.get("count_job") or {}
    how = (
        f" ({job.get('map_tasks', 0)} map tasks, {job.get('bytes_shuffled', 0) / 2**20:,.1f} MiB shuffled through the "
        "grid; " + ", ".join(f"{p} {s:.1f} s" for p, s in job.get("phases", {}).items()) + ")"
        if job
        else ""
    )
    lines.append(
        f"Model: natural-log probabilities, {model.get('smoothing', '?')}{k}; counted with ramgrid.mapreduce on Dask "
        f"in {model.get('count_job_s', 0):.1f} s{how}."
    )
    lines.append(
        f"Machine: {machine.get('cpu_count')} cores ({machine.get('cpu_model', '?')}), "
        f"{machine.get('memory_gib', '?')} GiB; {machine.get('memcached', '?')}; Python {machine.get('python')}; "
        f"Dask {machine.get('distributed', '?')}, {result.get('config', {}).get('workers')} worker processes. "
        "Servers, Dask workers and the driver share these cores." + _load_note(machine)
    )
    cfg = result.get("config", {})
    if result.get("memcached_command"):
        lines.append(
            f"Peers: `{result['memcached_command']}` per server, read with pymemcache's HashClient (keys to servers by "
            f"{cfg.get('memcached_hasher', 'crc32')}); ramgrid: `ramgrid.local(servers=n)`, "
            f"{cfg.get('server_threads')} thread and {cfg.get('server_memory')} per server, a {cfg.get('grid_partitions')}"
            f"-partition f64 table; near cache {cfg.get('near_cache_mb')} MiB per worker; dict: the whole model in each "
            "worker."
        )
    wl = result.get("workloads", {})
    lines.append(
        f"Workloads: per-token modes on the first {wl.get('per_token', 0):,} sentences, per-sentence on "
        f"{wl.get('per_sentence', 0):,}, per-partition, fused and the dict on all {wl.get('full', 0):,}. "
        "NoOp is measured on each workload."
    )
    if int(cfg.get("repeat") or 1) > 1:
        lines.append(f"Each run was repeated {cfg['repeat']} times; the tables show the run with the median time.")
    for note in result.get("notes", []):
        lines.append(f"Note: {note}.")
    lines.append("")
    lines.append("## Table 1: the paper's columns, for each system and lookup mode")
    lines.append("")
    lines.append(
        "| System | Mode | Servers | Sentences | Lookups | Running time | Σ latency | Avg. latency | NoOp | "
        "Throughput (paper) | End to end |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in _sorted_rows(summary["rows"]):
        lines.append(
            f"| {r['system']} | {r['mode']} | {r['servers'] if r['servers'] is not None else '-'} | "
            f"{r['sentences']:,} | {r['lookups']:,} | {_secs(r['wall_s'])} | {_secs(r['lookup_s'])} | "
            f"{_lat(r['avg_latency_s'])} | {_secs(r['noop_s'])} | {_rate(r['throughput_paper'])} | "
            f"{_rate(r['throughput_e2e'])} |"
        )
    lines.append("")
    lines.append(
        "Throughput (paper) = lookups / (running time - NoOp); n/a where the difference is within noise "
        "(not above zero). Avg. latency is per token; batched modes share one round trip among many tokens "
        "(and per-partition sends each distinct token once: see keys sent below)."
    )
    lines.append("")
    lines.append("## Peers: lookups per second end to end, and ratios")
    lines.append("")
    lines.append(
        "| Mode | Servers | System | End to end | × memcached, same mode (fused: per-partition) | "
        "× memcached per-token (paper's "
        "architecture) | × dict | Calls | Keys sent |"
    )
    lines.append("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in _sorted_rows(summary["rows"]):
        lines.append(
            f"| {r['mode']} | {r['servers'] if r['servers'] is not None else '-'} | {r['system']} | "
            f"{_rate(r['throughput_e2e'])} | {_ratio(r['x_memcached_same_mode'])} | "
            f"{_ratio(r['x_memcached_per_token'])} | {_ratio(r['x_dict'])} | {r['calls']:,} | {r['keys']:,} |"
        )
    lines.append("")
    if summary["targets"]:
        lines.append("## Targets (issue 4): ramgrid batched (per-partition, no near cache), end to end")
        lines.append("")
        lines.append("| Servers | Lookups/s | ≥ 2 M/s | × memcached batched | ≥ 10x | × dict | ≥ 0.3x |")
        lines.append("|---:|---:|:-:|---:|:-:|---:|:-:|")
        for t in summary["targets"]:
            lines.append(
                f"| {t['servers']} | {_rate(t['ramgrid_batched_e2e'])} | {'yes' if t['meets_2M'] else 'no'} | "
                f"{_ratio(t['x_memcached_batched'])} | {'yes' if t['meets_10x_memcached'] else 'no'} | "
                f"{_ratio(t['x_dict'])} | {'yes' if t['meets_0.3x_dict'] else 'no'} |"
            )
        lines.append("")
    if summary.get("fused_targets"):
        lines.append(
            "## Targets (issue 10): ramgrid fused lookup-reduce, end to end, against memcached batched "
            "(per-partition) and the dict (per-partition)"
        )
        lines.append("")
        lines.append("| Servers | Lookups/s | × memcached batched | ≥ 10x | × dict | ≥ 2x |")
        lines.append("|---:|---:|---:|:-:|---:|:-:|")
        for t in summary["fused_targets"]:
            lines.append(
                f"| {t['servers']} | {_rate(t['ramgrid_fused_e2e'])} | {_ratio(t['x_memcached_batched'])} | "
                f"{'yes' if t['meets_10x_memcached'] else 'no'} | {_ratio(t['x_dict'])} | "
                f"{'yes' if t['meets_2x_dict'] else 'no'} |"
            )
        lines.append("")
    time_rows = _where_time_goes(summary["rows"])
    if time_rows:
        lines.append("## Where the time goes (per-partition and fused runs)")
        lines.append("")
        lines.append(
            "Task time summed over all tasks, split into time inside lookup calls (Σ latency) and the rest (reading, "
            "tokenising, deduplicating, summing, Dask); NoOp's task time is the part every mode pays. The fused "
            "mode's Σ latency is its whole fused call (decoding, tokenising and summing happen inside it)."
        )
        lines.append("")
        lines.append(
            "| System | Mode | Servers | Task time | Σ latency | Share in lookups | Keys sent | Time per key sent |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
        lines.extend(time_rows)
        lines.append("")
    if result.get("memory"):
        lines.extend(_memory_lines(result["memory"]))
    lines.append("## Loads and key distribution (Figure 6)")
    lines.append("")
    for ld in result.get("loads", []):
        s = ld["servers"] if ld["servers"] is not None else "-"
        lines.append(f"- {ld['system']}, {s} servers: {_secs(ld['load_s'])} ({ld['what']})")
    for d in result.get("distribution", []):
        total = sum(d["items"]) or 1
        shares = ", ".join(f"{100 * i / total:.1f}%" for i in d["items"])
        lines.append(
            f"- {d['system']} on {d['servers']} servers, keys per server ({d['how']}): "
            f"{', '.join(f'{i:,}' for i in d['items'])} ({shares})"
        )
    lines.append("")
    chk = result.get("reference_check", {})
    if chk:
        lines.append("## Checks")
        lines.append("")
        lines.append("Every run of a workload gave bit-identical scores (math.fsum of the tokens' ln p).")
        for n, verdict in chk.get("workloads", {}).items():
            lines.append(f"- first {int(n):,} sentences: {verdict}")
        lines.append("")
    figs = result.get("figures", {})
    if figs:
        lines.append("## Figures")
        lines.append("")
        for name, path in figs.items():
            lines.append(f"![{name}]({Path(path).name})")
        lines.append("")
    return "\n".join(lines)


_COLORS = {
    "memcached": "#c0504d",
    "ramgrid": "#4f81bd",
    "ramgrid+near": "#9bbb59",
    "ramgrid+shm": "#8064a2",
    "dict": "#7f7f7f",
}
_PEERS = ("memcached", "ramgrid", "ramgrid+near", "ramgrid+shm")


def _find(rows: list[dict[str, Any]], servers: Any, system: str, mode: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["servers"] == servers and r["system"] == system and r["mode"] == mode), None)


def _log_bars(ax: Any, servers: list[int], series: list[tuple[str, list[float | None]]], fmt: Any) -> None:
    """Grouped bars on a log axis, each labelled with its value: the systems differ by up to three orders of
    magnitude, so on a linear axis the fastest flattens the others to nothing (issue 28)."""
    width = 0.8 / max(len(series), 1)
    values = [v for _, vs in series for v in vs if v]
    for i, (system, vs) in enumerate(series):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(servers))]
        hs = [v if v else float("nan") for v in vs]
        ax.bar(xs, hs, width, color=_COLORS[system], alpha=0.75, label=system)
        for x, v in zip(xs, vs):
            if v:
                ax.annotate(
                    fmt(v),
                    (x, v),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=6.5,
                    rotation=90,
                )
    ax.set_yscale("log")
    if values:
        # Room below the smallest bar (so it shows) and above the largest (for its label).
        ax.set_ylim(min(values) / 3, max(values) * 12)
    ax.set_xticks(range(len(servers)))
    ax.set_xticklabels([str(s) for s in servers])
    ax.set_xlabel("servers")
    ax.grid(True, axis="y", which="major", alpha=0.3)


def figure5(summary: dict[str, Any]) -> Any:
    """Figure 5 as a matplotlib Figure (None without server counts): per-token latency and the paper's throughput
    per system as log-scale bars (when per-token runs were made), and every mode's end-to-end throughput."""
    import matplotlib.pyplot as plt

    rows, servers = summary["rows"], summary["servers"]
    if not servers:
        return None
    token = [s for s in _PEERS if any(_find(rows, n, s, "per-token") for n in servers)]
    panels = 3 if token else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.3 * panels, 6.3), squeeze=False)
    if token:
        ax_lat, ax_thr, ax3 = axes[0]
        pts = {s: [_find(rows, n, s, "per-token") for n in servers] for s in token}
        d = _find(rows, None, "dict", "per-token")
        _log_bars(
            ax_lat,
            servers,
            [(s, [p["avg_latency_s"] * 1e6 if p and p["avg_latency_s"] else None for p in pts[s]]) for s in token],
            lambda v: f"{v:.3g}",
        )
        if d and d["avg_latency_s"]:
            ax_lat.axhline(d["avg_latency_s"] * 1e6, color=_COLORS["dict"], linestyle="-.", label="dict in each worker")
        ax_lat.set_ylabel("average latency per lookup (µs, log scale)")
        ax_lat.set_title("Per-token lookups: latency")
        ax_lat.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
        _log_bars(
            ax_thr,
            servers,
            [(s, [p["throughput_paper"] if p else None for p in pts[s]]) for s in token],
            _rate,
        )
        if d and d["throughput_paper"]:
            ax_thr.axhline(d["throughput_paper"], color=_COLORS["dict"], linestyle="-.", label="dict in each worker")
        ax_thr.set_ylabel("throughput, paper's definition (lookups/s, log scale)")
        ax_thr.set_title("Per-token lookups: throughput (paper)")
        ax_thr.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    else:
        (ax3,) = axes[0]
    styles = {"per-token": ":", "per-sentence": "--", "per-partition": "-", "fused": (0, (5, 1, 1, 1))}
    for system in _PEERS:
        for mode in MODE_ORDER:
            mpts = [_find(rows, n, system, mode) for n in servers]
            if not any(mpts):
                continue
            ax3.plot(
                servers,
                [p["throughput_e2e"] if p else float("nan") for p in mpts],
                marker="o",
                linestyle=styles[mode],
                color=_COLORS[system],
                label=f"{system} {mode}",
            )
    d = _find(rows, None, "dict", "per-partition")
    if d and d["throughput_e2e"]:
        ax3.axhline(
            d["throughput_e2e"], color=_COLORS["dict"], linestyle="-.", label="dict in each worker (per-partition)"
        )
    ax3.set_yscale("log")
    ax3.set_xticks(servers)
    ax3.set_xlabel("servers")
    ax3.set_ylabel("lookups/s end to end (log scale)")
    ax3.set_title("All modes, end to end")
    ax3.grid(True, which="both", alpha=0.3)
    ax3.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3 if token else 2)
    fig.suptitle("Figure 5: latency and throughput against cluster size", fontsize=12)
    fig.tight_layout()
    return fig


def plot_figures(result: dict[str, Any], summary: dict[str, Any], out: Path) -> dict[str, str]:
    """Figure 5 (per-token latency and throughput, every mode end to end, against servers) and Figure 6 (keys per
    server) as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: dict[str, str] = {}
    fig = figure5(summary)
    if fig is not None:
        p = out / "fig5_latency_throughput.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files["figure5"] = str(p)
    dist = result.get("distribution", [])
    if dist:
        counts = sorted({d["servers"] for d in dist})
        if len(counts) > 1:
            counts = [c for c in counts if c > 1]  # one server holds everything: nothing to show
        fig, axes = plt.subplots(1, len(counts), figsize=(4 + 3 * len(counts), 4), squeeze=False)
        for ax, n in zip(axes[0], counts):
            ds = [d for d in dist if d["servers"] == n]
            width = 0.8 / max(len(ds), 1)
            for i, d in enumerate(ds):
                total = sum(d["items"]) or 1
                ax.bar(
                    [j - 0.4 + width * (i + 0.5) for j in range(n)],
                    [100 * x / total for x in d["items"]],
                    width,
                    label=d["system"],
                    color={"ramgrid": "#4f81bd", "memcached": "#c0504d"}.get(d["system"]),
                )
            ax.axhline(100 / n, color="black", linewidth=0.8, linestyle="--", label="even share")
            ax.set_xticks(range(n))
            ax.set_xticklabels([str(j) for j in range(n)])
            ax.set_xlabel("server")
            ax.set_ylabel("share of keys (%)")
            ax.set_title(f"{n} server{'s' if n > 1 else ''}")
            ax.set_ylim(0, 110)
            ax.legend(fontsize=8)
        fig.suptitle("Figure 6: distribution of (token, ln p) pairs across servers", fontsize=12)
        fig.tight_layout()
        p = out / "fig6_key_distribution.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files["figure6"] = str(p)
    return files


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _jsonable(x.item())
    return x


def write_report(result: dict[str, Any], out: str | Path, *, plots: bool = True) -> dict[str, str]:
    """Writes the Markdown report, the figures and the JSON result into `out`; returns their paths."""
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    summary = derive(result)
    files: dict[str, str] = {}
    if plots:
        try:
            result["figures"] = plot_figures(result, summary, o)
            files.update(result["figures"])
        except ImportError:
            result.setdefault("notes", []).append("matplotlib is not installed, so no figures (pip install matplotlib)")
    md = format_markdown(result, summary)
    (o / "report.md").write_text(md + "\n", encoding="utf-8")
    files["report"] = str(o / "report.md")
    (o / "result.json").write_text(json.dumps(_jsonable(result), indent=1) + "\n", encoding="utf-8")
    files["json"] = str(o / "result.json")
    return files
