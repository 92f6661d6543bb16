#!/usr/bin/env python3
"""Panda & Sur's memcached experiment, on one host: get latency by value size (4 B to 4 KB) and gets/s against
1 to 16 reader processes, for memcached, ramgrid over TCP and ramgrid through shared memory (docs/shared-memory.md),
all driven by the same Python load generator (one 1-key get per call), plus 1,000-key batches (ns per key) and
1-key gets from Rust (crates/ramgrid-client/examples/shm_get.rs).

    python3 benchmarks/shm_readers.py                       # full run
    python3 benchmarks/shm_readers.py --quick               # smoke run
    python3 benchmarks/shm_readers.py --out benchmarks/results/shm_readers.md
    python3 benchmarks/shm_readers.py --sections get1,batch,rust   # latency rows only (no gets/s, no memory)
    python3 benchmarks/shm_readers.py --sections memory --figures benchmarks/results/shm_readers.json
    python3 benchmarks/shm_readers.py --plot-only benchmarks/results/shm_readers.json   # redraw, measure nothing

With --out X.md the measured figures also go to X.json (--figures names another file; the sections a run measures
replace theirs there, the others stay), and the plots are drawn beside it: X_latency.png (1-key get latency by value
size, log scale) and X_throughput.png (gets/s against reader processes).

Needs target/release/ramgrid-server, the native module (make develop), memcached, and the Rust example
(cargo build --release -p ramgrid-client --example shm_get). A benchmark: prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import ramgrid
from ramgrid._pss import MEMFD_PREFIX, mapping_pss, read_pss, segment_pss

SIZES = (4, 64, 512, 4096)
# The tables: bytes values of each size, and one f64 table (8-byte numbers: a scalar from `get`, a float64 numpy
# array from a batch); memcached holds the same 8 bytes for it.
TABLES: tuple[int | str, ...] = (*SIZES, "f64")
LATENCY_SECTIONS = ("get1", "batch", "rust", "readers")


def cell(pair: list[float] | None, digits: int) -> str:
    """A [wall, CPU] figure as "wall (CPU)"."""
    if pair is None:
        return ""
    wall, cpu = pair
    return f"{wall:,.{digits}f} ({cpu:,.{digits}f})"


def label(size: int | str) -> str:
    return f"{size} B" if isinstance(size, int) else f"{size} (8 B)"


def f64_value(k: int) -> float:
    return k * 0.5 + 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def value(k: int, size: int) -> bytes:
    return (k.to_bytes(4, "little") * (size // 4 + 1))[:size]


def per_call_ns_cpu(f: Any, keys: list[Any], seconds: float) -> tuple[float, float]:
    """(wall, this thread's CPU time) in mean ns per call of f(key) over the keys, cycled, for about `seconds`. The
    CPU time is what a call costs without the scheduler's share of a busy machine; it says nothing of a call that
    waits on another process (TCP, memcached), so it is shown for shared memory only."""
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while True:
        for k in keys:
            f(k)
        n += len(keys)
        el = time.perf_counter() - t0
        if el >= seconds:
            return el * 1e9 / n, (time.thread_time() - c0) * 1e9 / n


def per_call_ns(f: Any, keys: list[Any], seconds: float) -> float:
    """Mean wall ns per call of f(key) over the keys, cycled, for about `seconds`."""
    return per_call_ns_cpu(f, keys, seconds)[0]


def reader(kind: str, target: str, table: str, version: int, nkeys: int, seconds: float, start: Any, q: Any) -> None:
    """One reader process: 1-key gets in a loop from `start` for `seconds`; puts the count."""
    rng = np.random.default_rng(os.getpid())
    ks = rng.integers(0, nkeys, 4096).tolist()
    if kind == "memcached":
        from pymemcache.client.base import Client as Mc

        host, port = target.rsplit(":", 1)
        mc = Mc((host, int(port)))
        names = [f"{table}:{k}".encode() for k in ks]

        def get(i: int) -> Any:
            return mc.get(names[i & 4095])
    else:
        p = ramgrid.connect(target).table(table).pin(version, shared_memory=(kind == "shm"))
        if kind == "shm":
            assert p.describe()["shared_memory"]["mapped"], p.describe()

        def get(i: int) -> Any:
            return p.get(ks[i & 4095])

    get(0)
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for i in range(n, n + 256):
            get(i)
        n += 256
    q.put(n / (time.perf_counter() - t0))


def gets_per_second(kind: str, target: str, table: str, version: int, nkeys: int, procs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    start, q = ctx.Event(), ctx.Queue()
    ps = [
        ctx.Process(target=reader, args=(kind, target, table, version, nkeys, seconds, start, q)) for _ in range(procs)
    ]
    for p in ps:
        p.start()
    time.sleep(1.0 + 0.2 * procs)  # let every process connect and map before the clock starts
    start.set()
    rates = [q.get(timeout=60 + seconds) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    return float(sum(rates))


def holder(kind: str, spec: str, table: str, version: int, nkeys: int, ready: Any, done: Any) -> None:
    """A worker holding the model the way `kind` does, having read every key once; waits for `done`. Reads go 1,000
    keys at a time: the values of a batch are Python objects freed after it, and glibc keeps freed heap for reuse
    (4 MB a batch here; 10,000-key batches left 10-20 MiB of free heap per worker that PSS counts)."""
    keys = np.arange(nkeys, dtype=np.int64)
    segment_bytes = 0
    if kind == "dict":
        t = ramgrid.connect(spec).table(table).pin(version, shared_memory=False)
        model = {}
        for lo in range(0, nkeys, 1_000):
            vals = t.get_many(keys[lo : lo + 1_000])
            model.update(zip(keys[lo : lo + 1_000].tolist(), vals))
        assert len(model) == nkeys
    else:
        p = ramgrid.connect(spec).table(table).pin(version, shared_memory=(kind == "shm"))
        for lo in range(0, nkeys, 1_000):
            p.get_many(keys[lo : lo + 1_000])
        if kind == "shm":
            segment_bytes = int(p.describe()["shared_memory"]["bytes"])
    ready.put((os.getpid(), segment_bytes))
    done.wait()


def _mapping_class(name: str) -> str:
    if name.startswith(MEMFD_PREFIX):
        return "segments"
    if name == "[heap]":
        return "heap"
    if name.startswith("/"):
        return "files"
    return "anon"  # unnamed mappings (pymalloc arenas, large blocks, thread stacks), [stack], [vvar], ...


def memory_per_host(kind: str, g: Any, table: str, version: int, nkeys: int, workers: int) -> dict[str, Any]:
    """Memory with `workers` processes holding the model as `kind`, in bytes: PSS, so shared pages count once. A
    segment's pages are charged to the processes that map it (the server writes it and does not map it), so the
    workers' PSS holds each segment once; pages no measured process maps are added apart (`unmapped`)."""
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=holder, args=(kind, g.spec, table, version, nkeys, ready, done)) for _ in range(workers)]
    for p in ps:
        p.start()
    got = [ready.get(timeout=300) for _ in ps]
    pids = [pid for pid, _ in got]
    segment_bytes = max(seg for _, seg in got)
    pss = [read_pss(pid) for pid in pids]
    where: dict[str, float] = {}
    for pid in pids:
        for name, b in mapping_pss(pid).items():
            where[_mapping_class(name)] = where.get(_mapping_class(name), 0) + b / workers
    server = 0 if kind == "dict" else sum(read_pss(pid).pss for pid in g.pids)
    mapped = segment_pss(pids + list(g.pids)) if kind == "shm" else 0
    done.set()
    for p in ps:
        p.join(timeout=30)
    unmapped = max(0, segment_bytes - mapped)
    unmapped = unmapped if unmapped > 1024 * 16 * workers else 0  # smaps rounds each mapping's PSS down to a KiB
    w = sum(x.pss for x in pss)
    return {
        "workers": workers,
        "mode": kind,
        "workers_pss": w,
        "server_pss": server,
        "segment_bytes": segment_bytes,
        "segment_pss": mapped,
        "unmapped": unmapped,
        "host": w + server + unmapped,
        "per_worker_by_mapping": where,
    }


def memory_section(out: Any, nkeys: int, quick: bool, fig: dict[str, Any]) -> None:
    out("## Memory per host with 2 and 8 worker processes (PSS; a model of 4 KB values, every key read once)")
    out()
    out("A server of its own holding only the model. Workers: the sum of their PSS, in which each shared-memory")
    out("segment counts once (its pages are split between the workers that map it; the server writes it and does not")
    out("map it); host: workers plus the server (none for dict: each worker holds a copy), plus any segment page no")
    out("measured process maps (none: each worker checks every page when it maps a segment).")
    out()
    out("| workers | mode | PSS per worker, MiB | of which segments | workers, MiB | server, MiB | host, MiB |")
    out("|---:|---|---:|---:|---:|---:|---:|")
    # 20,000 values of 4 KB (quick: 5,000): small enough for 8 private copies.
    mem_keys = min(nkeys, 5_000 if quick else 20_000)
    rows = []
    with ramgrid.local(servers=1, memory="1GiB") as g:
        t = g.create_table("model", partitions=16, value_type="bytes")
        with t.new_version() as w:
            for lo in range(0, mem_keys, 5_000):
                ks = list(range(lo, min(mem_keys, lo + 5_000)))
                w.put_many(np.array(ks, dtype=np.int64), [value(k, 4096) for k in ks])
        v = t.current_version()
        for workers in (2, 8):
            for kind in ("dict", "tcp", "shm"):  # tcp before shm: the server makes its segments on the first ask
                r = memory_per_host(kind, g, "model", v, mem_keys, workers)
                rows.append(r)
                seg = r["per_worker_by_mapping"].get("segments", 0) / 2**20
                out(
                    f"| {workers} | {kind} | {r['workers_pss'] / workers / 2**20:,.1f} | "
                    + (f"{seg:,.1f}" if kind == "shm" else "-")
                    + f" | {r['workers_pss'] / 2**20:,.1f} | "
                    + (f"{r['server_pss'] / 2**20:,.1f}" if kind != "dict" else "-")
                    + f" | {r['host'] / 2**20:,.1f} |"
                )
    out()
    classes = ("heap", "anon", "files", "segments")
    out("Where a worker's PSS lies with 8 workers (MiB, mean per worker, by mapping in /proc/PID/smaps):")
    out()
    out("| mode | [heap] (glibc malloc) | anonymous (pymalloc arenas, large blocks, stacks) | files | segments |")
    out("|---|---:|---:|---:|---:|")
    for r in rows:
        if r["workers"] == 8:
            m = r["per_worker_by_mapping"]
            out(f"| {r['mode']} | " + " | ".join(f"{m.get(c, 0) / 2**20:,.1f}" for c in classes) + " |")
    out()
    fig.update({"keys": mem_keys, "value_bytes": 4096, "rows": rows})


def latency_sections(
    out: Any, nkeys: int, secs: float, procs: list[int], mc_port: int, sections: set[str], fig: dict[str, Any]
) -> None:
    import struct

    from pymemcache.client.base import Client as Mc

    g = ramgrid.local(servers=1, memory="2GiB", threads=4)
    addr = g.addresses[0]
    mcc = Mc(("127.0.0.1", mc_port))
    tables: dict[int | str, tuple[str, int]] = {}
    for size in TABLES:
        name = f"v{size}"
        t = g.create_table(name, partitions=16, value_type="f64" if size == "f64" else "bytes")
        with t.new_version() as w:
            for lo in range(0, nkeys, 10_000):
                ks = list(range(lo, min(nkeys, lo + 10_000)))
                if isinstance(size, int):
                    w.put_many(np.array(ks, dtype=np.int64), [value(k, size) for k in ks])
                    mcc.set_many({f"{name}:{k}": value(k, size) for k in ks}, noreply=False)
                else:
                    w.put_many(np.array(ks, dtype=np.int64), np.array([f64_value(k) for k in ks]))
                    mcc.set_many({f"{name}:{k}": struct.pack("<d", f64_value(k)) for k in ks}, noreply=False)
        tables[size] = (name, t.current_version())
    # The figures of each section this run measures replace that section's (`save_figures` keeps the others).
    for key, section in (("get1", "get1"), ("batch", "batch"), ("rust", "rust"), ("gets_per_s", "readers")):
        if section in sections:
            fig[key] = []
    rng = np.random.default_rng(1)
    sample = rng.integers(0, nkeys, 2000).tolist()
    batch = np.asarray(rng.integers(0, nkeys, 1000), dtype=np.int64)
    if "get1" in sections:
        out("## 1-key get latency from Python, by value size (mean ns per call)")
        out()
        out("`PinnedTable.get(key)` over 2,000 random keys, cycled; memcached: pymemcache's `get`.")
        out()
        out(
            "| value | memcached (pymemcache) | ramgrid TCP | ramgrid shared memory | shm, CPU time"
            " | memcached / shm | TCP / shm |"
        )
        out("|---:|---:|---:|---:|---:|---:|---:|")
        for size in TABLES:
            name, v = tables[size]
            names = [f"{name}:{k}".encode() for k in sample]
            m = per_call_ns(mcc.get, names, secs)
            tcp = g.table(name).pin(v, shared_memory=False)
            shm = g.table(name).pin(v, shared_memory=True)
            r_tcp = per_call_ns(tcp.get, sample, secs)
            r_shm, c_shm = per_call_ns_cpu(shm.get, sample, secs)
            out(
                f"| {label(size)} | {m:,.0f} | {r_tcp:,.0f} | {r_shm:,.0f} | {c_shm:,.0f} | {m / r_shm:,.0f}x"
                f" | {r_tcp / r_shm:,.0f}x |"
            )
            fig["get1"].append({"size": size, "memcached": m, "tcp": r_tcp, "shm": r_shm, "shm_cpu": c_shm})
        out()
    if "batch" in sections:
        out("## 1,000-key batch from Python (ns per key)")
        out()
        out(
            "`PinnedTable.lookup(keys)` of an int64 numpy array (bytes tables: a list of bytes out; f64: a float64 array)."
        )
        out()
        out("| value | memcached get_many | ramgrid TCP | ramgrid shared memory | shm, CPU time | TCP / shm |")
        out("|---:|---:|---:|---:|---:|---:|")
        for size in TABLES:
            name, v = tables[size]
            names = [f"{name}:{k}" for k in batch.tolist()]
            m = per_call_ns(mcc.get_many, [names], secs) / 1000
            tcp = g.table(name).pin(v, shared_memory=False)
            shm = g.table(name).pin(v, shared_memory=True)
            r_tcp = per_call_ns(tcp.lookup, [batch], secs) / 1000
            r_shm, c_shm = (x / 1000 for x in per_call_ns_cpu(shm.lookup, [batch], secs))
            out(f"| {label(size)} | {m:,.0f} | {r_tcp:,.1f} | {r_shm:,.1f} | {c_shm:,.1f} | {r_tcp / r_shm:,.1f}x |")
            fig["batch"].append({"size": size, "memcached": m, "tcp": r_tcp, "shm": r_shm, "shm_cpu": c_shm})
        out()
    ex = REPO / "target/release/examples/shm_get"
    if "rust" in sections and ex.exists():
        out("## From Rust (crates/ramgrid-client/examples/shm_get.rs)")
        out()
        out("tcp and shm: `Client::get_into` (shm: the version attached); reader: a `ShmReader` handle's `get_into`,")
        out("and `get_wire` (the value borrowed from the mapping, as Python's `get` uses it). 1-key gets cycle over")
        out("2,000 keys (as from Python), and over every key of the table in turn (each get then waits on memory).")
        out("Each cell: wall ns (this thread's CPU time in ns).")
        out()
        out(
            "| value | mode | 1-key get, ns | 1-key `get_wire`, ns | 1-key get, every key, ns | 1,000-key batch, ns per key |"
        )
        out("|---:|---|---:|---:|---:|---:|")
        import json

        for size in TABLES:
            name, v = tables[size]
            res = subprocess.run(
                [str(ex), addr, name, str(v), str(nkeys), str(secs)], capture_output=True, text=True, check=True
            )
            for row in map(json.loads, res.stdout.splitlines()):
                cells = [cell(row[f], 0) for f in ("get1_ns", "wire1_ns", "get1_all_ns")]
                cells.append(cell(row["batch1000_ns_per_key"], 1))
                out(f"| {label(size)} | {row['mode']} | " + " | ".join(cells) + " |")
                fig["rust"].append({"size": size, **row})
        out()
    if "readers" not in sections:
        g.close()
        return
    out("## Gets/s against reader processes (1-key gets, 4 B and 4 KB values)")
    out()
    out("| value | readers | memcached | ramgrid TCP | ramgrid shared memory |")
    out("|---:|---:|---:|---:|---:|")
    for size in (4, 4096):
        name, v = tables[size]
        for n in procs:
            row = [
                gets_per_second("memcached", f"127.0.0.1:{mc_port}", name, v, nkeys, n, secs),
                gets_per_second("tcp", g.spec, name, v, nkeys, n, secs),
                gets_per_second("shm", g.spec, name, v, nkeys, n, secs),
            ]
            out(f"| {size} B | {n} | " + " | ".join(f"{r:,.0f}" for r in row) + " |")
            fig["gets_per_s"].append({"size": size, "readers": n, "memcached": row[0], "tcp": row[1], "shm": row[2]})
    out()
    g.close()


COLORS = {"memcached": "#c0504d", "tcp": "#4f81bd", "shm": "#8064a2"}
LABELS = {"memcached": "memcached (pymemcache)", "tcp": "ramgrid TCP", "shm": "ramgrid shared memory"}


def plot_figures(figs: dict[str, Any], json_path: Path) -> list[Path]:
    """The latency and gets/s plots (like Panda & Sur's slides) from the figures, beside `json_path`:
    <stem>_latency.png and <stem>_throughput.png. Nothing is drawn for a file without latency figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = figs.get("latency") or {}
    get1 = [r for r in lat.get("get1") or [] if isinstance(r["size"], int)]  # bytes values by size (not f64)
    if not get1:
        return []
    where = f"{lat.get('machine', '')}; {lat.get('command', '')}".strip("; ")
    written = []
    sizes = sorted(r["size"] for r in get1)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for k in ("memcached", "tcp", "shm"):
        pts = sorted((r["size"], r[k]) for r in get1)
        ax.plot([a for a, _ in pts], [b / 1e3 for _, b in pts], marker="o", color=COLORS[k], label=LABELS[k])
    for k, label_, style in (("tcp", "TCP", "--"), ("shm", "shared memory", "--"), ("reader", "reader handle", ":")):
        # Rust rows: [wall, CPU] ns per call; the wall time is plotted.
        pts = sorted(
            (r["size"], r["get1_ns"][0] if isinstance(r["get1_ns"], list) else r["get1_ns"])
            for r in lat.get("rust") or []
            if r["mode"] == k and isinstance(r["size"], int)
        )
        if pts:
            ax.plot(
                [a for a, _ in pts],
                [b / 1e3 for _, b in pts],
                marker="s",
                linestyle=style,
                color=COLORS["shm" if k == "reader" else k],
                label=f"ramgrid {label_}, from Rust",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([f"{x} B" if x < 1024 else f"{x // 1024} KB" for x in sizes])
    ax.set_xlabel("value size")
    ax.set_ylabel("1-key get latency, µs (mean, log scale)")
    ax.set_title("Get latency by value size: one process, one key per call")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, where, fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    p = json_path.with_name(json_path.stem + "_latency.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    rows = lat.get("gets_per_s") or []
    if rows:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for size, style, mark in ((4, "-", "o"), (4096, "--", "s")):
            pts = sorted((r for r in rows if r["size"] == size), key=lambda r: r["readers"])
            if not pts:
                continue
            for k in ("memcached", "tcp", "shm"):
                ax.plot(
                    [r["readers"] for r in pts],
                    [r[k] for r in pts],
                    marker=mark,
                    linestyle=style,
                    color=COLORS[k],
                    label=f"{LABELS[k]}, {size if size < 1024 else size // 1024} {'B' if size < 1024 else 'KB'}",
                )
        cores = lat.get("cpus")
        if cores:
            ax.axvline(cores, color="gray", linewidth=0.8, linestyle=":", label=f"{cores} cores on this machine")
        readers = sorted({r["readers"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(readers)
        ax.set_xticklabels([str(x) for x in readers])
        ax.set_xlabel("reader processes")
        ax.set_ylabel("1-key gets per second, all readers (log scale)")
        ax.set_title("Gets/s against reader processes")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.text(0.01, 0.01, where, fontsize=6, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        p = json_path.with_name(json_path.stem + "_throughput.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


def save_figures(figs: dict[str, Any], json_path: Path) -> None:
    """Writes the figures of this run's sections into `json_path`, keeping the other sections already there (a run of
    the memory section alone keeps the latency figures the plots were drawn from)."""
    import json

    old = json.loads(json_path.read_text()) if json_path.exists() else {}
    for section, figures in figs.items():
        old[section] = {**old.get(section, {}), **figures}
    json_path.write_text(json.dumps(old, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keys", type=int, help="keys per table (default 100,000; quick 10,000)")
    ap.add_argument("--seconds", type=float, help="seconds per measurement (default 2; quick 0.5)")
    ap.add_argument("--procs", default="1,2,4,8,16", help="reader process counts")
    ap.add_argument("--out", type=Path, help="write the results as markdown here")
    ap.add_argument(
        "--sections",
        default="latency,memory",
        help="comma-separated: get1, batch, rust, readers (gets/s), memory; latency = get1,batch,rust,readers",
    )
    ap.add_argument(
        "--figures",
        type=Path,
        help="JSON of the measured figures, the plots beside it (default: --out with .json; the sections this run "
        "measures replace theirs in an existing file)",
    )
    ap.add_argument(
        "--plot-only",
        type=Path,
        metavar="JSON",
        help="measure nothing: draw the plots again from a saved JSON of the figures (beside it)",
    )
    args = ap.parse_args()
    if args.plot_only:
        import json

        for p in plot_figures(json.loads(args.plot_only.read_text()), args.plot_only):
            print(f"wrote {p}")
        return
    nkeys = args.keys or (10_000 if args.quick else 100_000)
    secs = args.seconds or (0.5 if args.quick else 2.0)
    procs = [int(x) for x in args.procs.split(",")]
    sections = set(args.sections.split(","))
    if "latency" in sections:
        sections |= set(LATENCY_SECTIONS)
    unknown = sections - {"latency", "memory", *LATENCY_SECTIONS}
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    mc_bin = shutil.which("memcached") or "/usr/bin/memcached"
    mc_port = free_port()
    mc_args = [mc_bin, "-p", str(mc_port), "-U", "0", "-l", "127.0.0.1", "-m", "2048", "-t", "4"]
    mc = subprocess.Popen(mc_args + (["-u", "root"] if os.geteuid() == 0 else []))
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", mc_port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or mc.poll() is not None:
                raise RuntimeError("memcached did not start") from None
            time.sleep(0.05)
    lines: list[str] = []
    figs: dict[str, Any] = {}

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    try:
        cpu = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in ln
            ),
            platform.processor(),
        )
        out("# Colocated readers: memcached, ramgrid over TCP, ramgrid through shared memory")
        out()
        cmd = " ".join(["python3", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
        out(f"Command: `{cmd}`")
        out(
            f"Machine: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}; {nkeys} keys per table, 16 partitions,"
        )
        out("one ramgrid server (4 threads) and one memcached (-t 4) on the same host; the same Python load generator.")
        out()
        run = {
            "command": cmd,
            "machine": f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}",
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        if sections & set(LATENCY_SECTIONS):
            figs["latency"] = {**run, "keys": nkeys, "seconds": secs}
        if "memory" in sections:
            figs["memory"] = dict(run)
        if sections & set(LATENCY_SECTIONS):
            latency_sections(out, nkeys, secs, procs, mc_port, sections, figs["latency"])
        if "memory" in sections:
            memory_section(out, nkeys, args.quick, figs.setdefault("memory", {}))
    finally:
        mc.terminate()
        mc.wait(timeout=10)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    json_path = args.figures or (args.out.with_suffix(".json") if args.out else None)
    if json_path:
        save_figures(figs, json_path)
        import json

        for p in plot_figures(json.loads(json_path.read_text()), json_path):
            print(f"wrote {p}")


if __name__ == "__main__":
    main()
