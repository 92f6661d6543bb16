"""Soak (slow tier): mixed traffic on both protocols for RAMGRID_SOAK_SECONDS (600 by default), and the
server's RSS stays flat once warmed up. Run with `make soak` (or `pytest -m slow -k soak`).

Traffic, from 6 threads: memcached sets of 10 B-200 KB values over a keyspace that overflows --memory
(eviction), gets and multi-gets, deletes; native puts into an open version, batched gets, and a new
version of a bytes table created, filled, switched and the old one dropped every few seconds. Values are
checked where they must be exact (native tables). RSS is sampled every second; after the first quarter
it may not grow by more than 10% of the configured budgets.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ramgrid

MiB = 1 << 20
SECONDS = float(os.environ.get("RAMGRID_SOAK_SECONDS", "600"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(SECONDS) + 120)]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found")


def test_soak_rss_stays_flat() -> None:
    extra = ("--memory", "64MiB", "--buffer-memory", "32MiB")
    with ramgrid.local(servers=1, memory="256MiB", extra_args=extra) as grid:
        pid = grid._servers[0].pid
        host, _, port = grid.addresses[0].rpartition(":")
        deadline = time.monotonic() + SECONDS
        errors: list[str] = []
        counts = {"mc": 0, "native": 0, "versions": 0}

        def memcached_traffic(seed: int) -> None:
            r = random.Random(seed)
            with socket.create_connection((host, int(port)), timeout=30) as s:
                f = s.makefile("rb")
                while time.monotonic() < deadline:
                    key = b"soak%d" % r.randrange(5000)
                    op = r.random()
                    if op < 0.4:
                        n = r.choice((10, 1000, 50_000, 200_000))
                        s.sendall(b"set %s 0 0 %d\r\n" % (key, n) + b"v" * n + b"\r\n")
                        if f.readline() != b"STORED\r\n":
                            errors.append("set not stored")
                    elif op < 0.9:
                        keys = [b"soak%d" % r.randrange(5000) for _ in range(r.choice((1, 10, 50)))]
                        s.sendall(b"get " + b" ".join(keys) + b"\r\n")
                        while (line := f.readline()) != b"END\r\n":
                            if not line.startswith(b"VALUE"):
                                errors.append(f"bad get reply {line[:40]!r}")
                                return
                            f.read(int(line.split()[3]) + 2)
                    else:
                        s.sendall(b"delete %s\r\n" % key)
                        f.readline()
                    counts["mc"] += 1

        def native_traffic(seed: int) -> None:
            r = np.random.default_rng(seed)
            t = grid.table("nums")
            while time.monotonic() < deadline:
                keys = r.integers(0, 200_000, size=int(r.choice((10, 100, 1000))))
                got = t.get_many(keys)
                if not np.array_equal(got, keys * 2):
                    errors.append("native values not exact")
                    return
                counts["native"] += 1

        def version_churn() -> None:
            t = grid.table("blobs")
            i = 0
            while time.monotonic() < deadline:
                i += 1
                keys = [f"b{j}" for j in range(200)]
                with t.new_version() as v:
                    v.put_many(keys, [bytes([i % 256]) * 20_000 for _ in keys])
                current = t.current_version()
                for info in t.versions():
                    if info["version"] < current - 1:
                        t.drop_version(info["version"])
                if t.get_many(keys[:5]) != [bytes([i % 256]) * 20_000] * 5:
                    errors.append("blob version not exact")
                    return
                counts["versions"] += 1
                time.sleep(0.5)

        nums = grid.create_table("nums", partitions=16, value_type="i64")
        with nums.new_version() as v:
            keys = np.arange(200_000)
            v.put_many(keys, keys * 2)
        grid.create_table("blobs", partitions=4, value_type="bytes")

        threads = [threading.Thread(target=memcached_traffic, args=(i,)) for i in range(3)]
        threads += [threading.Thread(target=native_traffic, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=version_churn))
        for t in threads:
            t.start()
        samples: list[tuple[float, int]] = []
        start = time.monotonic()
        while any(t.is_alive() for t in threads):
            samples.append((time.monotonic() - start, _rss(pid)))
            time.sleep(1.0)
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        warm = [rss for at, rss in samples if at >= SECONDS / 4]
        first, peak, last = warm[0], max(warm), warm[-1]
        print(
            f"soak {SECONDS:.0f} s: {counts}; RSS after warm-up {first / MiB:.0f} MiB, "
            f"peak {peak / MiB:.0f} MiB, end {last / MiB:.0f} MiB"
        )
        budgets = 64 * MiB + 32 * MiB + 256 * MiB
        assert peak - first <= 0.1 * budgets, f"RSS grew {(peak - first) / MiB:.0f} MiB after warm-up"
