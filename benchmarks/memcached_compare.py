#!/usr/bin/env python3
"""Compare ramgrid with memcached on the same machine, with the same load generator and settings.

Starts memcached and ramgrid-server with the same worker threads and memory, loads the same keys into
each, then runs ramgrid-bench against each in turn, interleaved, for several rounds, and prints the
median of each figure over the rounds, side by side, with the ratios ramgrid / memcached.

    python3 benchmarks/memcached_compare.py                 # full run (1M keys, 3 rounds, 5 s each)
    python3 benchmarks/memcached_compare.py --quick         # smoke check (100k keys, 1 round, 2 s)
    python3 benchmarks/memcached_compare.py --out benchmarks/results/memcached-compare-DATE.md

Both servers are killed on exit, including on Ctrl-C and on errors.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (row id, description, ramgrid-bench flags). ops/s counts requests: a multi-get of K keys is one.
ROWS = [
    ("get", "get, 1 key", ["--workload", "get"]),
    ("get-pipelined", "get, pipelined x16", ["--workload", "get-pipelined", "--depth", "16"]),
    ("multiget-10", "multi-get, 10 keys", ["--workload", "multiget", "--keys-per-get", "10"]),
    ("multiget-100", "multi-get, 100 keys", ["--workload", "multiget", "--keys-per-get", "100"]),
    # The meta protocol's multi-get: `mg <key> v k q` per key, then `mn`, in one write.
    ("meta-multiget-10", "meta multi-get, 10 keys", ["--workload", "meta-multiget", "--keys-per-get", "10"]),
    ("meta-multiget-100", "meta multi-get, 100 keys", ["--workload", "meta-multiget", "--keys-per-get", "100"]),
    # ramgrid's native protocol (no memcached peer): int64 keys of an f64 table, via the Rust cluster client.
    ("native-get-100", "native get, 100 keys (rg only)", ["--workload", "native-get", "--keys-per-get", "100"]),
    ("set", "set, 1 key", ["--workload", "set"]),
]
SERVERS = ("memcached", "ramgrid")
# Rows only ramgrid can run (its native protocol); memcached's columns stay empty for them.
RAMGRID_ONLY = {"native-get-100"}
START_TIMEOUT_S = 15.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, help="keys loaded and queried (default 1,000,000; quick 100,000)")
    p.add_argument("--rounds", type=int, help="interleaved rounds; the median is reported (default 3; quick 1)")
    p.add_argument("--duration", type=float, help="measured seconds per run (default 5; quick 2)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per run (default 1; quick 0.5)")
    p.add_argument("--quick", action="store_true", help="smoke check: 100k keys, 1 round, 2 s per run")
    p.add_argument("--server-threads", type=int, default=2, help="worker threads of each server (default 2)")
    p.add_argument("--memory-mb", type=int, default=1024, help="memory limit of each server in MiB (default 1024)")
    p.add_argument("--connections", type=int, default=50, help="client connections (default 50)")
    p.add_argument("--client-threads", type=int, default=1, help="load generator threads (default 1)")
    p.add_argument("--key-size", type=int, default=14, help="key length in bytes (default 14)")
    p.add_argument("--value-size", type=int, default=8, help="value length in bytes (default 8)")
    p.add_argument(
        "--rows", default=",".join(r[0] for r in ROWS), help="comma-separated rows to run (default all: %(default)s)"
    )
    p.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help="comma-separated servers to run (default both; one alone is for checking the script)",
    )
    p.add_argument("--memcached", default="memcached", help="memcached binary (default: from PATH)")
    p.add_argument("--no-build", action="store_true", help="do not run cargo build first")
    p.add_argument(
        "--ramgrid-binary",
        type=Path,
        help="ramgrid-server to measure instead of this checkout's (e.g. an older build, for a before/after)",
    )
    p.add_argument("--out", type=Path, help="also write the report here (and the raw runs to the same name .json)")
    a = p.parse_args()
    a.keys = a.keys or (100_000 if a.quick else 1_000_000)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.duration = a.duration or (2.0 if a.quick else 5.0)
    a.warmup = a.warmup if a.warmup is not None else (0.5 if a.quick else 1.0)
    rows = {r[0]: r for r in ROWS}
    a.rows = [rows[r] for r in _split(a.rows, rows, "--rows")]
    a.servers = _split(a.servers, SERVERS, "--servers")
    return a


def _split(text: str, allowed, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        sys.exit(f"{flag}: unknown {bad or 'empty list'}; choose from {', '.join(allowed)}")
    return items


# --- processes --------------------------------------------------------------------------------------

_children: list[subprocess.Popen] = []


def _stop_children() -> None:
    """Terminates every server we started, then kills what did not stop."""
    for child in _children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + 5
    for child in _children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    _children.clear()


def _on_signal(signum, _frame) -> None:
    # Turn SIGTERM/SIGHUP into an exception so the finally blocks and atexit run.
    raise SystemExit(128 + signum)


def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    child = subprocess.Popen(cmd, **kw)
    _children.append(child)
    return child


def stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if child in _children:
        _children.remove(child)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_version(port: int, child: subprocess.Popen, name: str) -> None:
    """Waits until the server answers `version`, or fails if it exits or takes too long."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"{name} exited with status {child.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"version\r\n")
                if s.recv(256).startswith(b"VERSION"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not answer on port {port} within {START_TIMEOUT_S} s")


def start_memcached(a: argparse.Namespace) -> tuple[subprocess.Popen, str, list[str]]:
    port = free_port()
    cmd = [
        a.memcached,
        "-l",
        "127.0.0.1",
        "-p",
        str(port),
        "-t",
        str(a.server_threads),
        "-m",
        str(a.memory_mb),
        "-U",
        "0",
        "-c",
        str(max(1024, 2 * a.connections)),
    ]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]  # memcached refuses to run as root unless told which user to be
    child = spawn(cmd, stdout=subprocess.DEVNULL)
    wait_for_version(port, child, "memcached")
    return child, f"127.0.0.1:{port}", cmd


def start_ramgrid(a: argparse.Namespace, binary: Path) -> tuple[subprocess.Popen, str, list[str]]:
    cmd = [str(binary), "--listen", "127.0.0.1:0", "--threads", str(a.server_threads), "--memory", f"{a.memory_mb}MiB"]
    child = spawn(cmd, stdout=subprocess.PIPE, text=True)
    # The server prints exactly one line, `ramgrid-server listening on ADDR`, once it accepts.
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(child.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    line = first[0].strip() if first else ""
    prefix = "ramgrid-server listening on "
    if not line.startswith(prefix):
        raise RuntimeError(f"ramgrid-server did not report its address (status {child.poll()}, said {line!r})")
    # Keep draining stdout so the server never blocks on a full pipe.
    threading.Thread(target=lambda: child.stdout.read(), daemon=True).start()
    return child, line[len(prefix) :], cmd


# --- build and run ----------------------------------------------------------------------------------


def target_dir() -> Path:
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(json.loads(meta.stdout)["target_directory"])


def build(a: argparse.Namespace) -> tuple[Path, Path]:
    release = target_dir() / "release"
    bench, server = release / "ramgrid-bench", release / "ramgrid-server"
    wanted = ["-p", "ramgrid-bench"] + (["-p", "ramgrid-server"] if "ramgrid" in a.servers else [])
    missing = not bench.exists() or ("ramgrid" in a.servers and not server.exists())
    if missing or not a.no_build:
        # cargo is a no-op when the binaries are current, and stale binaries would measure old code.
        subprocess.run(["cargo", "build", "--release", *wanted], cwd=REPO, check=True)
    return bench, server


def bench_run(a: argparse.Namespace, bench: Path, addr: str, pid: int, flags: list[str], measured: bool = True) -> dict:
    cmd = [
        str(bench),
        "--server",
        addr,
        "--server-pid",
        str(pid),
        "--json",
        "--connections",
        str(a.connections),
        "--threads",
        str(a.client_threads),
        "--key-count",
        str(a.keys),
        "--key-size",
        str(a.key_size),
        "--value-size",
        str(a.value_size),
        *flags,
    ]
    if measured:
        cmd += ["--duration", str(a.duration), "--warmup", str(a.warmup)]
    limit = a.warmup + a.duration + 60 if measured else 600
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=limit)
    if done.returncode != 0:
        raise RuntimeError(f"ramgrid-bench failed ({done.returncode}): {done.stderr.strip()}\n  {shlex.join(cmd)}")
    return json.loads(done.stdout)


# --- report -----------------------------------------------------------------------------------------


def median(runs: list[dict], field: str) -> float | None:
    values = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def ratio(rg: float | None, mc: float | None) -> float | None:
    return rg / mc if rg is not None and mc else None


def report(a: argparse.Namespace, runs: dict, loads: dict, header: list[str]) -> str:
    lines = list(header)
    lines.append("")
    cols = [
        "row",
        "mc ops/s",
        "rg ops/s",
        "rg/mc",
        "mc p99 us",
        "rg p99 us",
        "mc ns/key",
        "rg ns/key",
        "keys/cpu-s rg/mc",
    ]
    table = [cols]
    notes = []
    for row_id, desc, _ in a.rows:
        mc, rg = runs.get(("memcached", row_id), []), runs.get(("ramgrid", row_id), [])
        mc_ops, rg_ops = median(mc, "ops_per_s"), median(rg, "ops_per_s")
        mc_ns, rg_ns = median(mc, "server_cpu_ns_per_key"), median(rg, "server_cpu_ns_per_key")
        table.append(
            [
                desc,
                fmt(mc_ops, ",.0f"),
                fmt(rg_ops, ",.0f"),
                fmt(ratio(rg_ops, mc_ops), ".2f"),
                fmt(median(mc, "p99_us"), ",.0f"),
                fmt(median(rg, "p99_us"), ",.0f"),
                fmt(mc_ns, ",.0f"),
                fmt(rg_ns, ",.0f"),
                # keys per server-CPU-second is 1e9 / ns-per-key, so its ratio is the inverse one.
                fmt(ratio(mc_ns, rg_ns), ".2f"),
            ]
        )
        for server, rs in (("memcached", mc), ("ramgrid", rg)):
            hits = median(rs, "hit_ratio")
            if hits is not None and hits < 0.999:
                notes.append(f"note: {server} {row_id}: hit ratio {hits:.3f} (all keys were loaded)")
    widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
    for n, r in enumerate(table):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    for server, load in loads.items():
        lines.append(
            f"load into {server}: {load['keys']:,} keys in {load['window_s']:.2f} s "
            f"({load['keys_per_s']:,.0f} sets/s, server CPU {fmt(load['server_cpu_ns_per_key'], ',.0f')} ns/key)"
        )
    lines += notes
    lines.append("")
    lines.append(
        "ops/s: requests per second (a multi-get of K keys is one request, and so is a meta multi-get of K `mg` "
        "commands and an `mn`; a pipelined get is one per key)."
    )
    lines.append("p99: of the round trip of one batch (one request, 16 pipelined gets, or one multi-get).")
    lines.append("ns/key: server CPU (user+system, from /proc) per key over the measured window.")
    if any(r[0] in RAMGRID_ONLY for r in a.rows):
        lines.append(
            "native get: one client thread per connection, each with its own ramgrid client; the table "
            "(64 partitions) is loaded by the run itself, keys drawn uniformly from it."
        )
    lines.append(f"Figures are medians over {a.rounds} interleaved round(s); client and servers share this machine.")
    return "\n".join(lines)


def machine_header(a: argparse.Namespace, cmdline: str, server_cmds: dict) -> list[str]:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    mc_version = subprocess.run([a.memcached, "-V"], check=False, capture_output=True, text=True).stdout.strip()
    header = [
        f"# ramgrid vs memcached, {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"command: {cmdline}",
        f"commit: {commit}; {mc_version or 'memcached'}; {os.cpu_count()} CPUs ({cpu}); {platform.platform()}",
        (
            f"keys: {a.keys:,} x {a.key_size} B, values {a.value_size} B; {a.connections} connections, "
            f"{a.client_threads} client thread(s); {a.rounds} round(s) of {a.duration:g} s (+{a.warmup:g} s warm-up)"
        ),
    ]
    header += [f"{name}: {shlex.join(cmd)}" for name, cmd in server_cmds.items()]
    return header


def main() -> int:
    a = parse_args()
    cmdline = shlex.join([sys.executable, *sys.argv])
    # Restore Ctrl-C even when started with SIGINT ignored (as background jobs of scripts are).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    atexit.register(_stop_children)
    bench, server_bin = build(a)
    if a.ramgrid_binary:
        server_bin = a.ramgrid_binary.resolve()

    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    server_cmds: dict[str, list[str]] = {}
    runs: dict[tuple[str, str], list[dict]] = {}
    loads: dict[str, dict] = {}
    try:
        for name in a.servers:
            child, addr, cmd = start_memcached(a) if name == "memcached" else start_ramgrid(a, server_bin)
            servers[name], server_cmds[name] = (child, addr), cmd
            print(f"started {name} on {addr} (pid {child.pid})", file=sys.stderr)
            load = bench_run(a, bench, addr, child.pid, ["--workload", "load"], measured=False)
            if load["keys"] != a.keys:
                raise RuntimeError(f"loading {name}: wrote {load['keys']} keys, expected {a.keys}")
            loads[name] = load
            print(f"loaded {load['keys']:,} keys into {name} in {load['window_s']:.2f} s", file=sys.stderr)
        for rnd in range(a.rounds):
            # Alternate which server goes first, so drift in the machine's load favours neither.
            order = a.servers if rnd % 2 == 0 else list(reversed(a.servers))
            for row_id, _, flags in a.rows:
                for name in order:
                    if name != "ramgrid" and row_id in RAMGRID_ONLY:
                        continue
                    child, addr = servers[name]
                    if child.poll() is not None:
                        raise RuntimeError(f"{name} exited with status {child.returncode}")
                    result = bench_run(a, bench, addr, child.pid, flags + ["--seed", str(rnd + 1)])
                    result["server_name"], result["row"], result["round"] = name, row_id, rnd
                    runs.setdefault((name, row_id), []).append(result)
                    print(
                        f"round {rnd + 1}/{a.rounds} {row_id:<14} {name:<9} "
                        f"{result['ops_per_s']:>12,.0f} ops/s  p99 {result['p99_us']:>8,.0f} us",
                        file=sys.stderr,
                    )
    finally:
        for child, _ in servers.values():
            stop(child)
        _stop_children()

    text = report(a, runs, loads, machine_header(a, cmdline, server_cmds))
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
        raw = {"command": cmdline, "loads": loads, "runs": [r for rs in runs.values() for r in rs]}
        raw_path = a.out.with_suffix(".runs.json" if a.out.suffix == ".json" else ".json")
        raw_path.write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {a.out} and {raw_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except (RuntimeError, subprocess.SubprocessError) as e:
        print(f"memcached_compare: error: {e}", file=sys.stderr)
        sys.exit(1)
