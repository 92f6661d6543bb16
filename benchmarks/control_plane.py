"""The control plane's figures on a local grid (3 servers, replication 2): how long a killed server takes to be
failed over and writes to flow again, how fast the lost replicas are rebuilt, the share of write batches
acknowledged while servers die, and what a metadata operation costs now that it is a Raft proposal.

    .venv/bin/python benchmarks/control_plane.py [--kills 4] [--keys 1000000] [--failure-timeout-ms 2000] [--out FILE]

Peers, measured in the same run: a metadata operation against a single server (a group of one: no replication of
the proposal), and a write batch with no failure (the availability baseline is 100 %).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import numpy as np
import ramgrid


def _timed(fn: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _fmt(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"median {statistics.median(ms):.2f} ms, p90 {ms[int(len(ms) * 0.9)]:.2f} ms (n={len(ms)})"


def metadata_latency(servers: int, n: int) -> dict[str, list[float]]:
    with ramgrid.local(servers=servers, memory="256MiB") as g:
        create = _timed(lambda i: g.create_table(f"m{i}", partitions=8, replication=min(2, servers)), n)
        t = g.create_table("v", partitions=8, replication=min(2, servers), value_type="i64")

        def switch(i: int) -> None:
            with t.new_version() as v:
                v.put_many([i], [i])

        versions = _timed(switch, n)
        # Each step alone: numbering a version (a proposal on every server in a group), and a switch between two
        # sealed versions (one proposal, installed by every server).
        c = g._client()
        made = [int(c.create_version("v")) for _ in range(1)]
        number = _timed(lambda i: made.append(int(c.create_version("v"))), n)
        for v in made[-2:]:
            c.seal_version("v", v)
        a, b = made[-2:]
        set_current = _timed(lambda i: c.set_current("v", a if i % 2 else b), n)
        drop = _timed(lambda i: g.drop_table(f"m{i}"), n)
    return {
        "create_table": create,
        "new_version+commit": versions,
        "create_version": number,
        "set_current": set_current,
        "drop_table": drop,
    }


def failovers(kills: int, keys: int, failure_timeout_ms: int, say: Any) -> None:
    extra = ["--failure-timeout-ms", str(failure_timeout_ms)]
    with ramgrid.local(servers=3, memory="2GiB", extra_args=extra) as g:
        t = g.create_table("fo", partitions=32, replication=2, value_type="i64")
        base = np.arange(keys, dtype=np.int64)
        t.put_many(base, base)
        stop = threading.Event()
        book = {"acked": 0, "failed": 0, "last_ok": time.monotonic()}
        lock = threading.Lock()

        def writer() -> None:
            w = ramgrid.connect(g.spec, ack="all", call_timeout=10.0).table("fo")
            k = keys
            while not stop.is_set():
                ks = np.arange(k, k + 200, dtype=np.int64)
                try:
                    w.put_many(ks, ks)
                    with lock:
                        book["acked"] += 1
                        book["last_ok"] = time.monotonic()
                    k += 200
                except ramgrid.RamgridError:
                    with lock:
                        book["failed"] += 1
                    time.sleep(0.02)

        th = threading.Thread(target=writer, daemon=True)
        th.start()
        detect, flowing, rebuild_s, rebuild_bytes = [], [], [], []
        try:
            for _ in range(kills):
                time.sleep(1.0)
                st = [s for s in g.status() if s.get("ok")]
                leader = st[0]["meta_leader"].split(" ")[0]
                victim = next(i for i, a in enumerate(g.addresses) if a != leader)
                addr = g.addresses[victim]
                copied_before = sum(int(s.get("copied_bytes", 0)) for s in st)
                g.kill(victim)
                t0 = time.monotonic()
                while any(addr in s.get("servers", "").split(",") for s in g.status() if s.get("ok")):
                    time.sleep(0.02)
                detect.append(time.monotonic() - t0)
                with lock:
                    mark = book["acked"]
                while True:
                    with lock:
                        if book["acked"] > mark:
                            break
                    time.sleep(0.005)
                flowing.append(time.monotonic() - t0)
                # The survivors rebuild replication 2 (the new replicas copy in what the dead one held).
                r0 = time.monotonic()
                while any(s.get("pending_partitions") for s in g.status() if s.get("ok")):
                    time.sleep(0.02)
                rebuild_s.append(time.monotonic() - r0)
                copied_after = sum(int(s.get("copied_bytes", 0)) for s in g.status() if s.get("ok"))
                rebuild_bytes.append(copied_after - copied_before)
                # Back on its address, empty: it rejoins and copies in what it now holds.
                g.restart(victim)
                while not all(
                    addr in s.get("servers", "").split(",") and not s.get("pending_partitions")
                    for s in g.status()
                    if s.get("ok")
                ):
                    time.sleep(0.05)
        finally:
            stop.set()
            th.join(timeout=30)
        got = ramgrid.connect(g.spec).table("fo").get_many(base)
        assert (got == base).all(), "a value read back wrong"
        total = book["acked"] + book["failed"]
        say(f"failure timeout {failure_timeout_ms} ms, {kills} kills of a non-leader server, {keys:,} base keys")
        say(f"  failed over after: mean {statistics.fmean(detect):.2f} s, max {max(detect):.2f} s")
        say(f"  writes flowing again after: mean {statistics.fmean(flowing):.2f} s, max {max(flowing):.2f} s")
        gb = [b / 1e9 for b in rebuild_bytes]
        rate = sum(gb) / max(sum(rebuild_s), 1e-9)
        say(
            f"  replication 2 restored: {sum(rebuild_bytes) / 1e6:.1f} MB copied in {sum(rebuild_s):.2f} s "
            f"({rate:.2f} GB/s, {1 / rate if rate else float('inf'):.2f} s per GB)"
        )
        say(
            f"  write batches (200 keys, ack=all): {book['acked']} acknowledged, {book['failed']} refused "
            f"({100 * book['acked'] / max(total, 1):.2f} % acknowledged over the whole run, detection windows included)"
        )
        say("  every base key read back exactly afterwards")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--ops", type=int, default=30)
    ap.add_argument("--failure-timeout-ms", type=int, default=2000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--metadata-only", action="store_true", help="skip the fail-over runs")
    a = ap.parse_args()
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    for servers in (3, 1):
        lat = metadata_latency(servers, a.ops)
        label = "3 servers (a Raft group of 3)" if servers == 3 else "1 server (peer: a group of one)"
        say(f"metadata operations, {label}:")
        for op, ms in lat.items():
            say(f"  {op:<20} {_fmt(ms)}")
    if not a.metadata_only:
        failovers(a.kills, a.keys, a.failure_timeout_ms, say)
    if a.out:
        with open(a.out, "w") as f:
            f.write(
                f"$ .venv/bin/python benchmarks/control_plane.py --kills {a.kills} --keys {a.keys} "
                f"--failure-timeout-ms {a.failure_timeout_ms}\n"
            )
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
