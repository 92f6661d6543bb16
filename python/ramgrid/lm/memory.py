"""The experiment's memory step: what holding the model costs per host with W worker processes, for each way a worker
can hold it, as PSS (ramgrid._pss), so that pages shared between processes count once.

Modes:

- ``dict``: each worker holds the whole model as a dict (a `SharedModel` unpickled, as Dask delivers the broadcast
  one): a copy per worker, no server;
- ``tcp``: each worker holds a pinned table read over TCP (`shared_memory=False`): a client, its connections, and
  what a scoring task leaves behind; the servers hold the model;
- ``shm``: each worker maps the pinned version from shared memory (`shared_memory=True`, docs/shared-memory.md); the
  servers hold the model and, once asked, one sealed segment per partition.

For each mode and each worker count the step starts that many fresh processes (spawned, like Dask's worker
processes); each takes the model the mode's way, scores one slice of the corpus in the per-partition mode (the
scoring task itself, `score.score_slice`), then holds everything while its PSS is read from /proc/PID/smaps_rollup.
The workers are bare processes: a Dask worker adds its own runtime, the same in every mode.

Host total = the workers' PSS + the servers' PSS (none for dict) + segment pages that none of them maps. A segment's
pages are charged, in equal shares, to the processes that map them; the server writes a segment through its
descriptor and does not map it, so the shares are the workers', and they add up to the segment once. Every reader
checks the whole segment when it maps it, so every page is mapped and the last term is zero; it is computed from the
segments' size (`describe()`) and reported, so a page no measured process maps would still be counted, and none
twice. The step runs before any other process of the experiment (the driver, the Dask workers) maps the version, and
the TCP mode is measured before the shared-memory mode makes the segments.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import pickle
import queue
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ramgrid._pss import read_pss, segment_pss

__all__ = ["MEMORY_MODES", "measure_memory"]

MEMORY_MODES = ("dict", "tcp", "shm")
_HOLD_TIMEOUT_S = 600.0  # a holder whose driver vanished exits after this long
_START_TIMEOUT_S = 300.0


def _holder(
    mode: str, grid: Any, table: str, version: int, model_path: str, unk: float, sl: Any, go: Any, q: Any, done: Any
) -> None:
    """One worker: waits for `go`, takes the model the mode's way, scores its slice, reports, holds until `done`."""
    from ramgrid.lm.score import Source, score_slice

    if not go.wait(_HOLD_TIMEOUT_S) or done.is_set():
        return  # not needed (the step ended before this worker's turn) or the driver is gone
    try:
        segment_bytes, segments = 0, 0
        if mode == "dict":
            with open(model_path, "rb") as f:
                model = pickle.load(f)
            source = Source("dict", unk)
        else:
            model = None
            pinned = grid.table(table).pin(version, shared_memory=(mode == "shm"))
            if mode == "shm":
                shm = pinned.describe()["shared_memory"]
                segment_bytes, segments = int(shm["bytes"]), len(shm["mapped"])
            source = Source("ramgrid", unk, table=pinned, label=mode)
        res = score_slice(sl, "per-partition", source, model)
        del res
        gc.collect()
        q.put((os.getpid(), segment_bytes, segments, None))
    except Exception as e:  # noqa: BLE001 - reported to the driver, which notes it and goes on without this mode
        q.put((os.getpid(), 0, 0, f"{type(e).__name__}: {e}"))
        return
    done.wait(_HOLD_TIMEOUT_S)


def _measure_mode(
    mode: str,
    counts: Sequence[int],
    grid: Any,
    table: str,
    version: int,
    model_path: str,
    unk: float,
    slices: Sequence[Any],
    server_pids: Sequence[int],
) -> list[dict[str, Any]]:
    """Starts max(counts) processes and lets them take the model in groups, measuring after each count."""
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    most = max(counts)
    gos = [ctx.Event() for _ in range(most)]
    procs = [
        ctx.Process(
            target=_holder,
            args=(mode, grid, table, version, model_path, unk, slices[i % len(slices)], gos[i], q, done),
            daemon=True,
        )
        for i in range(most)
    ]
    rows: list[dict[str, Any]] = []
    try:
        for p in procs:
            p.start()
        pids: list[int] = []
        segment_bytes, segments = 0, 0
        for w in sorted(counts):
            for i in range(len(pids), w):
                gos[i].set()
            for _ in range(w - len(pids)):
                try:
                    pid, seg, nseg, err = q.get(timeout=_START_TIMEOUT_S)
                except queue.Empty:
                    raise RuntimeError(f"a {mode} worker did not report within {_START_TIMEOUT_S:.0f} s") from None
                if err is not None:
                    raise RuntimeError(f"a {mode} worker failed: {err}")
                pids.append(pid)
                segment_bytes, segments = max(segment_bytes, seg), max(segments, nseg)
            workers = [read_pss(pid) for pid in pids]
            servers = [read_pss(pid) for pid in server_pids] if mode != "dict" else []
            mapped = segment_pss(pids + list(server_pids)) if mode == "shm" else 0
            # smaps shows each mapping's PSS rounded down to a KiB: a shortfall within that rounding (a KiB per
            # segment per process) is not an unmapped page.
            unmapped = max(0, segment_bytes - mapped)
            unmapped = unmapped if unmapped > 1024 * segments * len(pids) else 0
            w_pss = sum(x.pss for x in workers)
            s_pss = sum(x.pss for x in servers)
            rows.append(
                {
                    "workers": w,
                    "mode": mode,
                    "worker_pss": [x.pss for x in workers],
                    "worker_shmem_pss": [x.pss_shmem for x in workers],
                    "workers_pss": w_pss,
                    "servers_pss": s_pss,
                    "segment_bytes": segment_bytes,
                    "segment_pss": mapped,
                    "segment_unmapped": unmapped,
                    "host": w_pss + s_pss + unmapped,
                }
            )
    finally:
        done.set()
        for g in gos:
            g.set()  # holders still waiting to start exit at once
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    return rows


def measure_memory(
    grid: Any,
    table: str,
    version: int,
    model: Any,
    unk: float,
    slices: Sequence[Any],
    *,
    modes: Sequence[str] = MEMORY_MODES,
    worker_counts: Sequence[int] = (2, 8),
    work_dir: str,
) -> dict[str, Any]:
    """Measures each mode with each worker count (see the module docstring). `grid` is the experiment's grid (a
    `LocalGrid`: its server processes are measured), `model` the `SharedModel` of the dict mode, `slices` the corpus
    slices the workers score (worker i scores slice i modulo their number). Returns {"rows", "notes", "seconds",
    "how"}; a mode that fails is left out with a note."""
    for m in modes:
        if m not in MEMORY_MODES:
            raise ValueError(f"memory modes are {', '.join(MEMORY_MODES)}; got {m!r}")
    if not worker_counts or min(worker_counts) < 1:
        raise ValueError(f"worker counts must be >= 1, got {list(worker_counts)}")
    if not slices:
        raise ValueError("no corpus slices to score")
    t0 = time.perf_counter()
    model_path = str(Path(work_dir) / "memory-model.pickle")
    if "dict" in modes:
        with open(model_path, "wb") as f:
            pickle.dump(model, f, protocol=pickle.HIGHEST_PROTOCOL)
    server_pids = list(getattr(grid, "pids", []))
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        # Order matters: TCP is measured before the shared-memory mode makes the servers' segments.
        for mode in [m for m in MEMORY_MODES if m in modes]:
            try:
                rows.extend(
                    _measure_mode(mode, worker_counts, grid, table, version, model_path, unk, slices, server_pids)
                )
            except (RuntimeError, OSError) as e:
                notes.append(f"memory of the {mode} mode not measured: {e}")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(model_path)
    return {
        "rows": rows,
        "notes": notes,
        "seconds": time.perf_counter() - t0,
        "servers": len(server_pids),
        "how": (
            "PSS from /proc/PID/smaps_rollup; host = workers + servers (none for dict) + segment pages no measured "
            "process maps; a segment's pages are shared by the workers that map it (the server does not map it)"
        ),
    }
