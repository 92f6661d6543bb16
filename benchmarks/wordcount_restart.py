"""What a server killed and restarted costs a word count that writes an output table (issue 11, item 4).

Three servers (the job's tables at replication 2), map and reduce tasks on threads, the counts merged on write into
a new version of an output table. The same job runs three times on a fresh grid each time: undisturbed; with server 1
SIGKILLed once a quarter of the map tasks are committed and restarted on its address once the driver waits for it at
its commit; and killed at a quarter, restarted at half, while map tasks still write (the tasks that wrote at ack=one
then run again at ack=all, and the output is rebuilt from the shuffle). Each run's output version is checked, on
every replica (a scan preferring each server), equal to a plain multiprocessing count of the same text.

    python benchmarks/wordcount_restart.py --limit-mb 16 --chunk-mib 1 --out benchmarks/results/wordcount_restart.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wordcount import CORPUS, floor, stage


def _log(grid: Any, job_id: str) -> Any:
    from ramgrid.mapreduce.joblog import JobLog

    return JobLog(grid.config, job_id)


def _committed(grid: Any, job_id: str) -> int:
    try:
        return len(_log(grid, job_id).committed_maps(100_000))
    except Exception:  # noqa: BLE001 (the log table is not there yet, or is gone)
        return 0


def _waiting(grid: Any, job_id: str) -> bool:
    try:
        return bool(_log(grid, job_id).waiting())
    except Exception:  # noqa: BLE001
        return False


def _when(ready: Callable[[], bool], action: Callable[[], None]) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if ready():
                action()
                return
            time.sleep(0.02)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


def run(path: Path, chunk: int, workers: int, mode: str, tasks: int) -> tuple[Any, float, list[dict[str, int]]]:
    import ramgrid
    from ramgrid import mapreduce
    from ramgrid.mapreduce.wordcount import count_block

    job_id = f"restart{int(time.time() * 1000)}"
    with ramgrid.local(servers=3, memory="2GiB", timeout=2.0) as grid:
        watchers = []
        if mode != "undisturbed":
            watchers.append(_when(lambda: _committed(grid, job_id) >= max(1, tasks // 4), lambda: grid.kill(1)))
            if mode == "at-commit":
                watchers.append(_when(lambda: _waiting(grid, job_id), lambda: grid.restart(1)))
            else:
                watchers.append(_when(lambda: _committed(grid, job_id) >= max(2, tasks // 2), lambda: grid.restart(1)))
        t0 = time.perf_counter()
        res = mapreduce.run(
            grid,
            path,
            count_block,
            "sum",
            vectorised=True,
            chunk_bytes=chunk,
            workers=workers,
            progress=False,
            job_id=job_id,
            output="counts",
        )
        total = time.perf_counter() - t0
        for w in watchers:
            w.join(timeout=5)
        reader = ramgrid.connect(grid.addresses).table("counts")
        assert reader.current_version() == res.version
        copies = []
        for server in grid.addresses:
            with reader.scan(prefer=server) as chunks:
                copies.append(
                    {k.decode(): int(v) for keys, values in chunks for k, v in zip(keys.to_pylist(), values.tolist())}
                )
    return res.summary, total, copies


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=str(CORPUS))
    p.add_argument("--limit-mb", type=int, default=16)
    p.add_argument("--chunk-mib", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()

    chunk = args.chunk_mib << 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="wordcount-restart-") as tmp:
        text = Path(tmp) / "corpus.txt"
        size = stage(Path(args.input), text, args.limit_mb)
        ref, _ = floor(text, chunk, args.workers)
        tasks = 0
        for mode in ("undisturbed", "at-commit", "mid-map"):
            s, t, copies = run(text, chunk, args.workers, mode, tasks)
            tasks = tasks or s.map_tasks
            for i, c in enumerate(copies):
                assert c == ref, f"{mode}: the output read preferring server {i} differs from the reference"
            rows.append((mode, s, t))

    labels = {
        "undisturbed": "undisturbed",
        "at-commit": f"server 1 killed at {max(1, tasks // 4)} maps, restarted when the driver waits",
        "mid-map": f"server 1 killed at {max(1, tasks // 4)} maps, restarted at {max(2, tasks // 2)}",
    }
    lines = [
        "# Word count into an output table with a server killed and restarted",
        "",
        f"Command: `{shlex.join(['python', *sys.argv])}`",
        "",
        (
            f"Input: {size / 2**20:.0f} MiB of `{Path(args.input).name}`, {tasks} map tasks of {args.chunk_mib} MiB, "
            f"3 servers (job tables at replication 2), {args.workers} task threads, reducer sum merged on write into "
            "a new version of `counts`; every run's output, read from each server, equals a plain multiprocessing "
            "count."
        ),
        "",
        "| run | seconds | map runs / tasks | written again | rebuilt | phases (s) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for mode, s, t in rows:
        phases = ", ".join(f"{k} {v:.2f}" for k, v in s.phases.items())
        lines.append(
            f"| {labels[mode]} | {t:.2f} | {s.map_runs} / {s.map_tasks} | {s.rewritten} | {s.rebuilt} | {phases} |"
        )
    lines.append("")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
