"""Server memory under the hardening issue's scenarios, beside the configured limits (and memcached's
RSS under the same memcached-protocol load, as the peer).

    .venv/bin/python benchmarks/memory_budget.py [--out benchmarks/results/memory_budget.md]

Scenarios (each on a fresh server, defaults unless named):
1. native: one 100 MB GET of a bytes table (100 x 1 MB); 4 concurrent readers of it; 8 clients that
   pipeline large GETs and never read, while a well-behaved client's 1000-key i64 gets are timed;
2. memcached protocol: 8 and 32 connections setting and getting 100 KB-1 MB values under
   `--memory 64MiB`, for ramgrid (default `--buffer-memory 64MiB`, and 4 MiB) and memcached `-m 64`.
RSS is sampled every 20 ms; "growth" is over the RSS before the scenario.
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import ramgrid
from ramgrid import _wire

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "target" / "release" / "ramgrid-server"


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


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


def native_scenarios(lines: list[str]) -> None:
    with ramgrid.local(servers=1, memory="1GiB") as grid:
        pid = grid._servers[0].pid
        addr = grid.addresses[0]
        big = grid.create_table("big", partitions=1, replication=1, value_type="bytes")
        keys = [f"k{i}" for i in range(100)]
        values = [bytes([i]) * MiB for i in range(100)]
        with big.new_version() as v:
            v.put_many(keys, values)
        small = grid.create_table("small", partitions=1, replication=1, value_type="i64")
        with small.new_version() as v:
            v.put_many(np.arange(1000), np.arange(1000))

        def scenario(name: str, run) -> None:
            base = rss(pid)
            s = Sampler(pid)
            extra = run()
            peak = s.stop()
            time.sleep(0.5)
            after = rss(pid)
            lines.append(
                f"| {name} | +{(peak - base) / MiB:.0f} | +{(after - base) / MiB:.0f} | 64 (--buffer-memory) | {extra} |"
            )

        def one_get() -> str:
            assert big.get_many(keys) == values
            return "exact"

        def four_readers() -> str:
            ok = []
            ts = [
                threading.Thread(
                    target=lambda: ok.append(ramgrid.connect([addr]).table("big").get_many(keys) == values)
                )
                for _ in range(4)
            ]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return "exact" if all(ok) and len(ok) == 4 else "WRONG"

        def stuck_clients() -> str:
            host, _, port = addr.rpartition(":")
            socks = []
            body = {"table": "big", "version": 0, "epoch": 0, "incarnation": 0}
            for _ in range(8):
                s = socket.create_connection((host, int(port)))
                body["epoch"] = _hello(s)
                frames = b"".join(
                    _wire.encode_message(
                        "GET",
                        2 + i,
                        {
                            **body,
                            "groups": [
                                {"partition": 0, "keys_hex": [k.encode().hex() for k in keys[i * 12 : i * 12 + 12]]}
                            ],
                        },
                    )
                    for i in range(8)
                )
                s.sendall(frames)
                socks.append(s)
            lat = []
            t_end = time.monotonic() + 3.0
            while time.monotonic() < t_end:
                t0 = time.perf_counter()
                small.get_many(np.arange(1000))
                lat.append(time.perf_counter() - t0)
            for s in socks:
                s.close()
            lat.sort()
            return f"well-behaved 1000-key gets meanwhile: p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms, max {lat[-1] * 1e3:.2f} ms"

        scenario("native: one 100 MB GET", one_get)
        scenario("native: 4 concurrent 100 MB readers", four_readers)
        scenario("native: 8 clients pipelining ~12 MB GETs, never reading", stuck_clients)


def memcached_load(port: int, nconn: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds

    def worker(i: int) -> None:
        r = random.Random(i)
        with socket.create_connection(("127.0.0.1", port)) as s:
            f = s.makefile("rb")
            while time.monotonic() < deadline:
                k = b"k%d" % r.randrange(2000)
                n = r.randrange(100_000, 1_000_000)
                if r.random() < 0.5:
                    s.sendall(b"set %s 0 0 %d\r\n" % (k, n) + b"x" * n + b"\r\n")
                    f.readline()
                else:
                    s.sendall(b"get %s\r\n" % k)
                    line = f.readline()
                    if line.startswith(b"VALUE"):
                        f.read(int(line.split()[3]) + 2)
                        f.readline()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(nconn)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def start(args: list[str], announce: bool) -> tuple[subprocess.Popen, int]:
    if announce:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = p.stdout.readline().decode()
        return p, int(line.rsplit(":", 1)[1])
    port = int(args[args.index("-p") + 1])
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.05)
    return p, port


def memcached_scenarios(lines: list[str], seconds: float) -> None:
    mc = shutil.which("memcached")
    for nconn in (8, 32):
        servers = [
            ("ramgrid", [str(SERVER), "--listen", "127.0.0.1:0", "--threads", "2", "--memory", "64MiB"], "64 + 64"),
            (
                "ramgrid --buffer-memory 4MiB",
                [
                    str(SERVER),
                    "--listen",
                    "127.0.0.1:0",
                    "--threads",
                    "2",
                    "--memory",
                    "64MiB",
                    "--buffer-memory",
                    "4MiB",
                ],
                "64 + 4",
            ),
        ]
        if mc:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                free = s.getsockname()[1]
            servers.append(
                (
                    "memcached -m 64",
                    [mc, "-l", "127.0.0.1", "-p", str(free), "-U", "0", "-m", "64", "-t", "2", "-u", "root"],
                    "64",
                )
            )
        for name, args, limit in servers:
            p, port = start(args, announce=name.startswith("ramgrid"))
            base = rss(p.pid)
            s = Sampler(p.pid)
            memcached_load(port, nconn, seconds)
            peak = s.stop()
            time.sleep(0.5)
            after = rss(p.pid)
            lines.append(
                f"| {name}, {nconn} conns, 100 KB-1 MB values | {peak / MiB:.0f} | {after / MiB:.0f} | {limit} | idle {base / MiB:.0f} MiB |"
            )
            p.terminate()
            p.wait(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each memcached-protocol run")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    lines = [
        "| native scenario | peak growth MiB | growth after MiB | limit MiB | notes |",
        "|---|---|---|---|---|",
    ]
    native_scenarios(lines)
    lines += [
        "",
        "| memcached-protocol scenario | peak RSS MiB | RSS after MiB | limits MiB (items + buffers) | notes |",
        "|---|---|---|---|---|",
    ]
    memcached_scenarios(lines, a.seconds)
    text = "\n".join(lines)
    print(text)
    if a.out:
        cmd = "python3 " + " ".join(["benchmarks/memory_budget.py", *sys.argv[1:]])
        a.out.write_text(
            f"# Memory under load\n\nCommand: `{cmd}` (2-core VM, {time.strftime('%Y-%m-%d')})\n\n{text}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
