"""The server's memory stays within its stated budget under large requests and replies.

RSS bound (docs/memory.md): items within `--memory`, tables within
`--table-memory`, connection buffers within `--buffer-memory` (plus each connection's small base
and the growth slack of replies being composed), and memory given back after a burst.
Each case here failed before the buffer budget existed (see the closing note of the hardening issue
for the figures).
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ramgrid
from ramgrid import _wire

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


def _sample_rss(server: Any, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], server.rss_bytes())
        time.sleep(0.02)


def test_memcached_large_values_stay_within_memory_plus_buffers(start_server: Callable[..., Any]) -> None:
    server = start_server("ramgrid", memory="64MiB", extra=("--buffer-memory", "4MiB"))
    idle = server.rss_bytes()
    deadline = time.monotonic() + 4.0
    errors: list[str] = []

    def client(seed: int) -> None:
        r = random.Random(seed)
        with socket.create_connection((server.host, server.port), timeout=30) as s:
            f = s.makefile("rb")
            for _ in range(400):
                if time.monotonic() > deadline:
                    return
                key = b"k%d" % r.randrange(200)
                n = r.randrange(100_000, 1_000_000)
                if r.random() < 0.5:
                    s.sendall(b"set %s 0 0 %d\r\n" % (key, n) + bytes([65 + n % 26]) * n + b"\r\n")
                    line = f.readline()
                    if line != b"STORED\r\n":
                        errors.append(line.decode(errors="replace"))
                else:
                    s.sendall(b"get %s\r\n" % key)
                    line = f.readline()
                    if line.startswith(b"VALUE"):
                        size = int(line.split()[3])
                        value = f.read(size + 2)
                        if value[:-2] != bytes([65 + size % 26]) * size:
                            errors.append(f"wrong value for {key!r}")
                        line = f.readline()
                    if line != b"END\r\n":
                        errors.append(line.decode(errors="replace"))

    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_sample_rss, args=(server, stop, peak))
    sampler.start()
    clients = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(60)
    stop.set()
    sampler.join()
    assert not errors, errors[:5]
    time.sleep(0.3)
    after = server.rss_bytes()
    print(f"memcached 32 conns: idle {idle / MiB:.0f} MiB, peak {peak[0] / MiB:.0f}, after {after / MiB:.0f}")
    budget = 64 * MiB + 4 * MiB
    assert peak[0] - idle <= budget * 1.1, f"peak RSS {peak[0] / MiB:.0f} MiB, idle {idle / MiB:.0f} MiB"
    assert after - idle <= 64 * MiB * 1.1, f"RSS {after / MiB:.0f} MiB after the burst"


def _native_conn(addr: str) -> tuple[socket.socket, int]:
    """A native connection past HELLO, and the server's epoch."""
    host, _, port = addr.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s, _hello(s)


def _hello(s: socket.socket) -> int:
    """Sends HELLO on a native connection and returns the server's epoch from its reply."""
    s.sendall(_wire.encode_message("HELLO", 1, {"protocol_version": 1, "token_hex": "", "client_name": "stuck"}))
    buf = b""
    while True:
        buf += s.recv(1 << 16)
        try:
            _, _, _, fields = _wire.decode_message(buf)
            return int(fields["epoch"])
        except _wire.WireError as e:
            if e.code != "incomplete":
                raise


class _Pid:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS not found")


@pytest.fixture(scope="module")
def budget_grid() -> Any:
    extra = ("--buffer-memory", "32MiB", "--write-timeout-secs", "60", "--memory", "16MiB")
    with ramgrid.local(servers=1, memory="512MiB", extra_args=extra) as g:
        yield g


def test_native_large_gets_stay_within_the_buffer_budget(budget_grid: Any) -> None:
    grid = budget_grid
    server = _Pid(grid._servers[0].pid)
    addr = grid.addresses[0]
    big = grid.create_table("big", partitions=1, replication=1, value_type="bytes")
    keys = [f"k{i}" for i in range(100)]
    values = [bytes([i]) * MiB for i in range(100)]
    with big.new_version() as v:
        v.put_many(keys, values)
    small = grid.create_table("small", partitions=1, replication=1, value_type="i64")
    with small.new_version() as v:
        v.put_many(np.arange(1000), np.arange(1000) * 3)
    loaded = server.rss_bytes()

    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_sample_rss, args=(server, stop, peak))
    sampler.start()
    try:
        # Four readers of the whole 100 MB table at once: exact values, and the server composes
        # no more than its budget allows (the client asks for fewer keys when told TOO_LARGE).
        wrong: list[int] = []

        def reader() -> None:
            got = ramgrid.connect([addr]).table("big").get_many(keys)
            wrong.extend(i for i, g in enumerate(got) if g != values[i])

        readers = [threading.Thread(target=reader) for _ in range(4)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(60)
        assert not wrong
        readers_peak = peak[0]

        # Eight clients pipeline large GETs and never read their replies.
        stuck = []
        for _ in range(8):
            s, epoch = _native_conn(addr)
            stuck.append(s)
            get_body = {"table": "big", "version": 0, "epoch": epoch, "incarnation": 0}
            frames = b""
            for i in range(10):
                group = {"partition": 0, "keys_hex": [k.encode().hex() for k in keys[i * 7 : i * 7 + 7]]}
                frames += _wire.encode_message("GET", 2 + i, {**get_body, "groups": [group]})
            group = {"partition": 0, "keys_hex": [k.encode().hex() for k in keys]}
            frames += _wire.encode_message("GET", 20, {**get_body, "groups": [group]})
            s.sendall(frames)
        time.sleep(1.0)
        # Meanwhile a well-behaved client is served, with exact values.
        got = grid.table("small").get_many(np.arange(1000))
        assert np.array_equal(got, np.arange(1000) * 3)
        stuck_peak = peak[0]
        # The first stuck client's first reply is a real value-carrying GET reply (status OK), not a
        # refusal: the scenario did make the server compose large replies.
        head = b""
        while len(head) < 17:
            head += stuck[0].recv(17 - len(head))
        assert head[16] == 0, f"first GET reply has status {head[16]}"
        for s in stuck:
            s.close()
    finally:
        stop.set()
        sampler.join()
    # Budget 32 MiB; slack for replies being composed (two worker threads) and allocator rounding.
    bound = 32 * MiB + 2 * 8 * MiB + 16 * MiB
    assert readers_peak - loaded <= bound, f"4 readers: +{(readers_peak - loaded) / MiB:.0f} MiB"
    assert stuck_peak - loaded <= bound, f"8 stuck clients: +{(stuck_peak - loaded) / MiB:.0f} MiB"
    time.sleep(0.5)
    after = server.rss_bytes()
    print(
        f"native: loaded {loaded / MiB:.0f} MiB, 4 readers peak {readers_peak / MiB:.0f}, "
        f"8 stuck peak {stuck_peak / MiB:.0f}, after {after / MiB:.0f}"
    )
    assert after - loaded <= 16 * MiB, f"+{(after - loaded) / MiB:.0f} MiB after the burst"
