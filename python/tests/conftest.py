"""Shared fixtures: memcached-protocol servers (ramgrid-server, or a real memcached to prove expectations)
started on a free loopback port and stopped after, plus a raw-socket client.

Which server the memcached-protocol tests target is chosen with RAMGRID_TEST_TARGET:
``ramgrid`` (default), ``memcached`` (starts /usr/bin/memcached, or $MEMCACHED), or ``both``.
The ramgrid binary is not built here: run ``cargo build --release -p ramgrid-server`` first
(the newer of target/release and target/debug is used; RAMGRID_SERVER_BIN overrides both).
"""

from __future__ import annotations

import itertools
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SOCKET_TIMEOUT_S = 2.0
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0

_TARGETS = {"ramgrid": ["ramgrid"], "memcached": ["memcached"], "both": ["ramgrid", "memcached"]}
_target_env = os.environ.get("RAMGRID_TEST_TARGET", "ramgrid")
if _target_env not in _TARGETS:
    raise pytest.UsageError(f"RAMGRID_TEST_TARGET must be one of {sorted(_TARGETS)}, got {_target_env!r}")
TARGETS = _TARGETS[_target_env]

_unique = itertools.count()


def parse_size(text: str) -> int:
    """'64MiB' -> bytes (the units ramgrid-server accepts: B, KiB, MiB, GiB, and k/m/g)."""
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?|[kmg]|B)?", text.strip())
    if not m:
        raise ValueError(f"bad size {text!r}")
    unit = (m.group(2) or "B")[0].upper()
    return int(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server child process on loopback. `stop()` (or the fixture's teardown) ends it."""

    def __init__(self, kind: str, proc: subprocess.Popen[bytes], port: int, stderr: tempfile.SpooledTemporaryFile):
        self.kind = kind
        self.proc = proc
        self.host = "127.0.0.1"
        self.port = port
        self._stderr = stderr

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_bytes(self) -> int:
        """Resident set size from /proc (Linux)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS not found")

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-8000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Sends `sig` and waits; returns the exit code, or None if it had to be killed."""
        code: int | None = self.proc.poll()
        if code is None:
            self.proc.send_signal(sig)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                code = None
        if self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()
        return code


def _read_first_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            break
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                break
            line += chunk
    return line


def _wait_connectable(port: int, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def start_ramgrid(
    binary: Path,
    *,
    memory: str = "64MiB",
    threads: int = 2,
    max_item_size: str | None = None,
    max_conns: int | None = None,
    no_evict: bool = False,
    extra: tuple[str, ...] = (),
) -> ServerProcess:
    args = [str(binary), "--listen", "127.0.0.1:0", "--threads", str(threads), "--memory", memory]
    if max_item_size:
        args += ["--max-item-size", max_item_size]
    if max_conns is not None:
        args += ["--max-conns", str(max_conns)]
    if no_evict:
        args.append("--no-evict")
    args += list(extra)
    # Closed by ServerProcess.stop(): it lives as long as the server.
    stderr = tempfile.SpooledTemporaryFile(max_size=1 << 20)  # noqa: SIM115
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, bufsize=0)
    first = _read_first_line(proc, START_TIMEOUT_S)
    m = re.fullmatch(rb"ramgrid-server listening on 127\.0\.0\.1:(\d+)\r?\n", first)
    if not m:
        server = ServerProcess("ramgrid", proc, 0, stderr)
        text = server.stderr_text()
        server.stop(signal.SIGKILL)
        pytest.fail(f"ramgrid-server did not announce its port (first stdout line {first!r}); stderr:\n{text}")
    return ServerProcess("ramgrid", proc, int(m.group(1)), stderr)


def start_memcached(
    *,
    memory: str = "64MiB",
    threads: int = 2,
    max_item_size: str | None = None,
    max_conns: int | None = None,
    no_evict: bool = False,
    extra: tuple[str, ...] = (),
) -> ServerProcess:
    """A real memcached with the options translated from ramgrid's flags (`extra`: memcached's own)."""
    exe = os.environ.get("MEMCACHED") or shutil.which("memcached")
    if not exe:
        pytest.fail("memcached not found: install it (make setup) or set MEMCACHED=/path/to/memcached")
    port = free_port()
    args = [exe, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", str(max(1, parse_size(memory) >> 20))]
    if os.geteuid() == 0:
        args += ["-u", "root"]
    if max_conns is not None:
        # memcached counts its own descriptors (listener, std streams, thread pipes) against -c, and
        # cannot start with -c 10 and several threads; with one thread it keeps about 12 for itself.
        args += ["-c", str(max_conns + 12), "-t", "1"]
    else:
        args += ["-t", str(threads)]
    if max_item_size:
        args += ["-I", str(parse_size(max_item_size))]
    if no_evict:
        args.append("-M")
    args += list(extra)
    stderr = tempfile.SpooledTemporaryFile(max_size=1 << 20)  # noqa: SIM115 - closed by ServerProcess.stop()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    server = ServerProcess("memcached", proc, port, stderr)
    if not _wait_connectable(port, proc, START_TIMEOUT_S):
        text = server.stderr_text()
        server.stop(signal.SIGKILL)
        pytest.fail(f"memcached did not start ({' '.join(args)}):\n{text}")
    return server


@pytest.fixture(scope="session")
def ramgrid_server_bin() -> Path:
    """The ramgrid-server binary to test (built beforehand, never by the tests)."""
    override = os.environ.get("RAMGRID_SERVER_BIN")
    if override:
        path = Path(override)
        if not path.is_file():
            pytest.fail(f"RAMGRID_SERVER_BIN={override} does not exist")
        return path
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR") or REPO_ROOT / "target")
    built = [
        p for p in (target_dir / "release" / "ramgrid-server", target_dir / "debug" / "ramgrid-server") if p.is_file()
    ]
    if built:
        # The most recent build: a release binary left over from before the last change would
        # otherwise be tested instead of the code as it is (release wins a tie).
        return max(built, key=lambda p: p.stat().st_mtime)
    pytest.fail(
        f"no ramgrid-server binary under {target_dir}/release or {target_dir}/debug: "
        "run `cargo build --release -p ramgrid-server` (or `make build`) first"
    )


@pytest.fixture(scope="session")
def ramgrid_server(ramgrid_server_bin: Path) -> Iterator[str]:
    """One ramgrid-server (64 MiB, 2 threads) shared by the session; yields "host:port"."""
    server = start_ramgrid(ramgrid_server_bin)
    yield server.addr
    server.stop()


@pytest.fixture(scope="module")
def start_server(ramgrid_server_bin: Path) -> Iterator[Callable[..., ServerProcess]]:
    """start_server("ramgrid" | "memcached", **opts) -> a server of that kind, stopped after the module."""
    servers: list[ServerProcess] = []

    def start(kind: str, **opts: object) -> ServerProcess:
        if kind == "ramgrid":
            server = start_ramgrid(ramgrid_server_bin, **opts)  # type: ignore[arg-type]
        else:
            server = start_memcached(**opts)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session", params=TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    """Which implementation the memcached-protocol tests run against (see RAMGRID_TEST_TARGET)."""
    return request.param


@pytest.fixture
def server_factory(target: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., ServerProcess]]:
    """Starts servers of the target kind with the given limits; all are stopped after the test.

    Keyword arguments: memory, threads, max_item_size, max_conns, no_evict (ramgrid's flag names).
    """
    started: list[ServerProcess] = []

    def start(**opts: object) -> ServerProcess:
        if target == "ramgrid":
            server = start_ramgrid(request.getfixturevalue("ramgrid_server_bin"), **opts)  # type: ignore[arg-type]
        else:
            server = start_memcached(**opts)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def mc_server(target: str, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A default-configured server of the target kind (64 MiB, 1 MiB items), shared by the session.
    Tests keep apart by using their own keys (see `unique_key`)."""
    if target == "ramgrid":
        server = start_ramgrid(request.getfixturevalue("ramgrid_server_bin"))
    else:
        server = start_memcached()
    yield server
    server.stop()


@pytest.fixture
def unique_key(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Returns keys no other test uses: unique_key("a") -> "<test name>_<n>_a"."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]

    def make(suffix: str = "") -> str:
        return f"{base}_{next(_unique)}_{suffix}"

    return make


class RawConn:
    """A plain TCP client for bytes the libraries cannot send (meta commands, bad input)."""

    def __init__(self, host: str, port: int, timeout: float = SOCKET_TIMEOUT_S):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError(f"server closed the connection (unread: {self.buf[:200]!r})")
        self.buf += chunk

    def read_until(self, end: bytes) -> bytes:
        """Reads up to and including `end`."""
        while (i := self.buf.find(end)) < 0:
            self._fill()
        out, self.buf = self.buf[: i + len(end)], self.buf[i + len(end) :]
        return out

    def readline(self) -> bytes:
        return self.read_until(b"\r\n")

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def call(self, data: bytes, end: bytes = b"\r\n") -> bytes:
        """Sends `data` and reads the reply up to `end`."""
        self.send(data)
        return self.read_until(end)

    def closed_by_peer(self) -> bool:
        """True if the server closes the connection (EOF or reset) before sending anything more."""
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return not self.buf
                self.buf += chunk
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_connect() -> Iterator[Callable[..., RawConn]]:
    """raw_connect(server_or_addr) -> RawConn; every connection is closed after the test."""
    conns: list[RawConn] = []

    def connect(server: ServerProcess | str, timeout: float = SOCKET_TIMEOUT_S) -> RawConn:
        if isinstance(server, str):
            host, _, port = server.rpartition(":")
            conn = RawConn(host, int(port), timeout)
        else:
            conn = RawConn(server.host, server.port, timeout)
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()
