"""Re-replication speed (issue 24, item 6): how fast the survivors restore replication 2 after a server dies, and
how fast a restarted server copies back everything it holds, in seconds per GB copied, with a reader and a writer
running against the grid the whole time.

    .venv/bin/python benchmarks/rereplication.py --keys 400000 --value-bytes 1024

The grid: 3 local servers, one table of `--partitions` partitions, R=2, bytes values. Two phases, each timed from
the moment the servers start copying (the dead server is failed over; the restarted one listens) until no server
has a partition pending; the bytes are those the servers report as copied (CLUSTER_STATUS copied_bytes). The
figures include the repair thread's wake-up and the status polling (20 ms), so they are a lower bound on speed.
Results: benchmarks/results/rereplication.txt, each run with its command."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import numpy as np
import ramgrid


def copied(g: Any) -> int:
    return sum(int(s.get("copied_bytes", 0)) for s in g.status() if s.get("ok"))


def pending(g: Any) -> bool:
    return any(s.get("pending_partitions") for s in g.status() if s.get("ok"))


def load(t: Any, keys: int, value_bytes: int) -> None:
    rng = np.random.default_rng(1)
    step = 20_000
    for lo in range(0, keys, step):
        ks = np.arange(lo, min(lo + step, keys), dtype=np.int64)
        blob = rng.bytes(value_bytes)
        t.put_many(ks, [blob] * len(ks))


def traffic(spec: str, keys: int, stop: threading.Event, book: dict[str, int]) -> list[threading.Thread]:
    """A reader (1,000-key batches) and a writer (100-key batches) until `stop`; counts what succeeded."""

    def reader() -> None:
        t = ramgrid.connect(spec, call_timeout=10.0).table("rr")
        rng = np.random.default_rng(2)
        while not stop.is_set():
            try:
                t.get_many(rng.integers(0, keys, 1_000, dtype=np.int64))
                book["reads"] += 1
            except ramgrid.RamgridError:
                book["read_errors"] += 1
                time.sleep(0.02)

    def writer() -> None:
        t = ramgrid.connect(spec, call_timeout=10.0).table("rr")
        k = keys
        while not stop.is_set():
            ks = np.arange(k, k + 100, dtype=np.int64)
            try:
                t.put_many(ks, [b"w" * 64] * 100)
                book["writes"] += 1
                k += 100
            except ramgrid.RamgridError:
                book["write_errors"] += 1
                time.sleep(0.02)

    threads = [threading.Thread(target=f, daemon=True) for f in (reader, writer)]
    for th in threads:
        th.start()
    return threads


def timed_copy(g: Any, before: int, start: float) -> tuple[float, int]:
    while pending(g):
        time.sleep(0.02)
    return time.monotonic() - start, copied(g) - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=400_000)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--failure-timeout-ms", type=int, default=2000)
    args = ap.parse_args()
    extra = ["--failure-timeout-ms", str(args.failure_timeout_ms)]
    with ramgrid.local(servers=3, memory="6GiB", extra_args=extra) as g:
        t = g.create_table("rr", partitions=args.partitions, replication=2, value_type="bytes")
        load(t, args.keys, args.value_bytes)
        g.wait_repaired()
        print(f"3 servers, R=2, {args.partitions} partitions, {args.keys:,} keys of {args.value_bytes} bytes")
        stop = threading.Event()
        book = dict.fromkeys(("reads", "read_errors", "writes", "write_errors"), 0)
        threads = traffic(g.spec, args.keys, stop, book)
        try:
            st = [s for s in g.status() if s.get("ok")]
            leader = st[0]["meta_leader"].split(" ")[0]
            victim = next(i for i, a in enumerate(g.addresses) if a != leader)
            addr = g.addresses[victim]
            before = copied(g)
            g.kill(victim)
            while any(addr in s.get("servers", "").split(",") for s in g.status() if s.get("ok")):
                time.sleep(0.02)
            secs, nbytes = timed_copy(g, before, time.monotonic())
            print(
                f"  failed over, survivors restore R=2: {nbytes / 1e6:.1f} MB in {secs:.2f} s = {secs / (nbytes / 1e9):.2f} s per GB"
            )
            before = copied(g)
            g.restart(victim)  # returns once it listens: from then on it learns the catalog and copies
            start = time.monotonic()
            g.wait_repaired(timeout=600)
            secs = time.monotonic() - start
            nbytes = copied(g) - before
            print(
                f"  restarted server copies back its share: {nbytes / 1e6:.1f} MB in {secs:.2f} s = {secs / (nbytes / 1e9):.2f} s per GB"
            )
        finally:
            stop.set()
            for th in threads:
                th.join(timeout=30)
        print(
            f"  meanwhile: {book['reads']} read batches ({book['read_errors']} failed), "
            f"{book['writes']} write batches ({book['write_errors']} failed)"
        )


if __name__ == "__main__":
    main()
