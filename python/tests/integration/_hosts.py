"""Servers started the way docs/deploy.md starts them on real hosts: the systemd unit's command line, with the
settings of the example environment file (deploy/ramgrid.env) and a per-host override of the address, spec, join
list and data directory. Shared by test_hosts.py (hosts on distinct loopback addresses) and _hosts_scenario.py
(hosts in network namespaces)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
UNIT = REPO / "deploy" / "ramgrid-server.service"
ENV_FILE = REPO / "deploy" / "ramgrid.env"


def unit_command(server_bin: str | os.PathLike[str]) -> list[str]:
    """The unit's ExecStart, with the installed binary's path replaced by the one built here."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line.removeprefix("ExecStart="))
            assert argv[0] == "/usr/local/bin/ramgrid-server", argv
            return [str(server_bin), *argv[1:]]
    raise AssertionError(f"no ExecStart in {UNIT}")


def env_file() -> dict[str, str]:
    """deploy/ramgrid.env as systemd reads it (KEY=VALUE lines; # comments)."""
    out: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def host_env(
    addr: str, members: Sequence[str], spec_file: Path, data_dir: Path, token: str, **overrides: str
) -> dict[str, str]:
    """The example environment file made for one host of a test cluster: its address, the others to join, a small
    memory budget, the test's token, no metrics endpoint (its port would clash between hosts)."""
    env = env_file()
    env.update(
        RAMGRID_LISTEN=addr,
        RAMGRID_CLUSTER_SPEC=str(spec_file),
        RAMGRID_JOIN=",".join(m for m in members if m != addr),
        RAMGRID_DATA_DIR=str(data_dir),
        RAMGRID_TOKEN=token,
        RAMGRID_TABLE_MEMORY="256MiB",
        RAMGRID_MEMORY="32MiB",
        RAMGRID_THREADS="1",
        RAMGRID_FAILURE_TIMEOUT_MS="2000",
    )
    env.pop("RAMGRID_METRICS")
    env.update(overrides)
    return env


def start(
    server_bin: str | os.PathLike[str],
    env: Mapping[str, str],
    log: Path,
    netns: str | None = None,
) -> subprocess.Popen[bytes]:
    """Starts one host's server as systemd would (the unit's command, the host's environment), optionally inside
    a network namespace; stdout and stderr go to `log`."""
    argv = unit_command(server_bin)
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    full = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    full.update(env)
    with open(log, "ab") as f:
        return subprocess.Popen(argv, env=full, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_port(addr: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {addr} exited with {proc.returncode}")
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    """Stops a server as systemd does (SIGTERM, then SIGKILL after TimeoutStopSec); returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return int(proc.returncode)


def until(what: str, cond: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)
