"""Metadata operation latency before and after the metadata Raft group (issue 16), two builds in one run.

    .venv/bin/python benchmarks/metadata_before_after.py [--rounds 3] [--ops 20] [--out FILE]
        [--before-python /work/venv-before/bin/python] [--before-src /work/wt-before/python]
        [--after-python /work/main/.venv/bin/python] [--after-src /work/main/python]

"before" is a build of 4cb09f3 (the parent of 24e2436, the last commit without the Raft group), "after" the current
main. Each round runs one child process per build (the build's Python, PYTHONPATH at its python/ folder, so its
servers run that build too), alternating which build goes first. A child starts ramgrid.local(servers=3), waits 1 s,
does one untimed create/version/drop, then times `ops` of each: create_table (8 partitions, replication 2), a new
version written and committed on an i64 table, drop_table; then the same against ramgrid.local(servers=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD_OPS = ("create_table", "new_version+commit", "drop_table")


def _timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(servers: int, n: int) -> dict[str, list[float]]:
    import ramgrid

    rep = min(2, servers)
    with ramgrid.local(servers=servers, memory="256MiB") as g:
        time.sleep(1.0)
        t = g.create_table("v", partitions=8, replication=rep, value_type="i64")

        def switch(i: int) -> None:
            with t.new_version() as v:
                v.put_many([i], [i])

        g.create_table("warm", partitions=8, replication=rep)
        switch(0)
        g.drop_table("warm")
        create = _timed(lambda i: g.create_table(f"m{i}", partitions=8, replication=rep), n)
        versions = _timed(switch, n)
        drop = _timed(lambda i: g.drop_table(f"m{i}"), n)
    return dict(zip(CHILD_OPS, (create, versions, drop)))


def _pct(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[int(len(ms) * 0.9)]


def _fmt(ms: list[float]) -> str:
    med, p90 = _pct(ms)
    return f"median {med:.2f} ms, p90 {p90:.2f} ms (n={len(ms)})"


def _rev(src: str) -> str:
    r = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True)
    return r.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=20)
    ap.add_argument("--before-python", default="/work/venv-before/bin/python")
    ap.add_argument("--before-src", default="/work/wt-before/python")
    ap.add_argument("--after-python", default="/work/main/.venv/bin/python")
    ap.add_argument("--after-src", default="/work/main/python")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps({str(s): measure(s, a.child) for s in (3, 1)}))
        return
    builds = {"before": (a.before_python, a.before_src), "after": (a.after_python, a.after_src)}
    got: dict[str, dict[str, dict[str, list[float]]]] = {b: {} for b in builds}
    for r in range(a.rounds):
        for b in list(builds)[:: 1 if r % 2 == 0 else -1]:
            py, src = builds[b]
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run(
                [py, __file__, "--child", str(a.ops)], check=False, env=env, capture_output=True, text=True, timeout=600
            )
            if out.returncode:
                sys.exit(f"{b} child failed ({out.returncode}):\n{out.stderr}")
            for servers, ops in json.loads(out.stdout.strip().splitlines()[-1]).items():
                for op, ms in ops.items():
                    got[b].setdefault(servers, {}).setdefault(op, []).extend(ms)
            print(f"round {r + 1}: {b} done", file=sys.stderr, flush=True)
    lines = [f"{b}: {_rev(src)} ({py}, PYTHONPATH={src})" for b, (py, src) in builds.items()]
    lines.append(f"{a.rounds} rounds x {a.ops} ops per build and grid size, builds alternated, one child per round")
    for servers, label in (("3", "3 servers, replication 2"), ("1", "1 server, replication 1")):
        lines.append(f"metadata operations, {label}:")
        for op in CHILD_OPS:
            before, after = got["before"][servers][op], got["after"][servers][op]
            (mb, pb), (ma, pa) = _pct(before), _pct(after)
            lines.append(f"  {op:<20} before {_fmt(before)}")
            lines.append(f"  {'':<20} after  {_fmt(after)}  after/before: median {ma / mb:.2f}x, p90 {pa / pb:.2f}x")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"$ .venv/bin/python benchmarks/metadata_before_after.py --rounds {a.rounds} --ops {a.ops}\n")
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
