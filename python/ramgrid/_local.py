"""An embedded cluster on loopback: `ramgrid.local(servers=N)` starts N server processes and stops them on exit.

Each server is `python -m ramgrid._serve --listen 127.0.0.1:0 ...` (the Rust server inside the native module), so
the package needs no separate binary. Cleanup is layered so no server outlives its owner: `close()` / the context
manager, a weakref finalizer that also runs at interpreter exit, and a watchdog inside each server process that
shuts it down when its parent process dies (e.g. killed with SIGKILL, where no Python cleanup can run).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ramgrid._clients import GridConfig, client_for, release_client
from ramgrid.exceptions import RamgridError, ServerStartError
from ramgrid.grid import Grid
from ramgrid.health import group_health
from ramgrid.tls import TLS

if TYPE_CHECKING:
    from ramgrid._native import Client

__all__ = ["LocalGrid", "ServerProcess", "local", "start_servers", "stop_processes"]

_LISTEN_LINE = re.compile(rb"ramgrid-server listening on (\S+)")
# The HTTP listener's address, from the server's start line in its log (text or JSON): stdout keeps its one line.
_HTTP_LOG = re.compile(rb'\bmetrics"?[=:]"([^"\s]+)"')
PARENT_PID_ENV = "RAMGRID_PARENT_PID"
# Environment the servers read that must not leak from the user's shell into an embedded cluster.
_SCRUBBED_ENV = (
    "RAMGRID_LISTEN",
    "RAMGRID_THREADS",
    "RAMGRID_MEMORY",
    "RAMGRID_TABLE_MEMORY",
    "RAMGRID_CLUSTER_SPEC",
    "RAMGRID_JOIN",
    "RAMGRID_TOKEN",
    "RAMGRID_TLS_CERT",
    "RAMGRID_TLS_KEY",
    "RAMGRID_TLS_CLIENT_CA",
    "RAMGRID_TLS_CA",
)


class ServerProcess:
    """One started server: its process, address and log files, and the number its logs and data directory are
    named after (`server{index}.out`, `server-{index}/`), which stays with it when servers before it leave."""

    def __init__(self, proc: subprocess.Popen[bytes], stdout_path: Path, stderr_path: Path, index: int = 0) -> None:
        self.proc = proc
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.index = index
        self.address: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            data = self.stderr_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace").strip()

    def dashboard_url(self, token: str | None = None, tls: bool = False, wait: float = 2.0) -> str | None:
        """The URL of this server's dashboard (docs/dashboard.md), https for a TLS server, with `token` in its
        fragment (which browsers do not send to the server; the page's login script reads it); None when it serves
        no HTTP (or logs below INFO)."""
        deadline = time.monotonic() + wait
        while True:
            with contextlib.suppress(OSError):
                m = _HTTP_LOG.search(self.stderr_path.read_bytes())
                if m:
                    fragment = f"#token={quote(token, safe='')}" if token else ""
                    return f"{'https' if tls else 'http'}://{m.group(1).decode()}/{fragment}"
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return None
            time.sleep(0.02)


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def server_env(token: str | None, parent_watch: bool) -> dict[str, str]:
    """The environment for a server process: the package importable from where this one was imported, the token in
    the environment rather than on the command line (where `ps` shows it), and the parent pid to watch."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    root = _package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if token is not None:
        env["RAMGRID_TOKEN"] = token
    if parent_watch:
        env[PARENT_PID_ENV] = str(os.getpid())
    else:
        env.pop(PARENT_PID_ENV, None)
    return env


def start_servers(
    n: int,
    *,
    memory: str = "256MiB",
    threads: int = 1,
    token: str | None = None,
    log_dir: Path,
    parent_watch: bool = True,
    start_timeout: float = 30.0,
    extra_args: Sequence[str] = (),
    data_dir: Path | None = None,
) -> list[ServerProcess]:
    """Starts `n` servers on loopback ports chosen by the OS and waits for each one's listening line. With
    `data_dir`, server i keeps its snapshots in `data_dir/server-i`; without, its control-plane state (Raft id,
    vote, log) in `log_dir/meta-i`.

    Raises ServerStartError (after stopping the ones that did start) if a server exits or says nothing in time.
    """
    if n < 1:
        raise ValueError("a cluster needs at least one server")
    if threads < 1:
        raise ValueError("threads must be >= 1")
    env = server_env(token, parent_watch)
    args = [sys.executable, "-m", "ramgrid._serve", "--listen", "127.0.0.1:0", "--threads", str(threads)]
    args += ["--table-memory", str(memory), *extra_args, *_http_args(extra_args)]
    started: list[ServerProcess] = []
    # The children keep their own copies of the log descriptors; ours close when the servers have started.
    with contextlib.ExitStack() as files:
        try:
            for i in range(n):
                started.append(_spawn(i, args + _data_args(data_dir, i, log_dir), env, log_dir, files))
            deadline = time.monotonic() + start_timeout
            for i, sp in enumerate(started):
                sp.address = _wait_listening(sp, i, deadline, start_timeout)
        except BaseException:
            stop_processes([sp.proc for sp in started], grace=2.0)
            raise
    return started


def _http_args(extra_args: Sequence[str]) -> list[str]:
    """An HTTP listener (metrics and dashboard) on a free loopback port, unless the caller chose one."""
    chosen = any(a.split("=")[0] in ("--metrics", "--http") for a in extra_args)
    return [] if chosen else ["--http", "127.0.0.1:0"]


def _data_args(data_dir: Path | None, i: int, state_root: Path) -> list[str]:
    """Server i's `--data-dir` flag (created if needed), or else its `--meta-dir` under `state_root`: either way
    its Raft identity and vote survive a restart, so restarting a server never costs the group a voter."""
    if data_dir is None:
        return ["--meta-dir", str(state_root / f"meta-{i}")]
    d = Path(data_dir) / f"server-{i}"
    d.mkdir(parents=True, exist_ok=True)
    return ["--data-dir", str(d)]


def _spawn(i: int, args: list[str], env: dict[str, str], log_dir: Path, files: contextlib.ExitStack) -> ServerProcess:
    out_path, err_path = log_dir / f"server{i}.out", log_dir / f"server{i}.err"
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=files.enter_context(open(out_path, "wb")),  # noqa: SIM115 - closed by the ExitStack
        stderr=files.enter_context(open(err_path, "wb")),  # noqa: SIM115 - closed by the ExitStack
        env=env,
        close_fds=True,
        # Own session: a Ctrl-C in the terminal reaches the owner, which then stops the servers in order,
        # instead of killing the servers under a still-running job.
        start_new_session=True,
    )
    return ServerProcess(proc, out_path, err_path, i)


def _wait_listening(sp: ServerProcess, i: int, deadline: float, start_timeout: float) -> str:
    delay = 0.005
    while True:
        try:
            m = _LISTEN_LINE.search(sp.stdout_path.read_bytes())
        except OSError:
            m = None
        if m:
            return m.group(1).decode()
        rc = sp.proc.poll()
        if rc is not None:
            raise ServerStartError(
                f"ramgrid server {i} (pid {sp.pid}) exited with status {rc} before listening; stderr:\n"
                f"{sp.stderr_tail() or '(empty)'}"
            )
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"ramgrid server {i} (pid {sp.pid}) did not print its listening line within {start_timeout:.0f} s; "
                f"stderr:\n{sp.stderr_tail() or '(empty)'}"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """SIGTERM every live process, wait up to `grace` seconds in all, then SIGKILL the rest. Reaps them all."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _finalize(procs: list[subprocess.Popen[bytes]], config: GridConfig, tmpdir: str | None, pid: int) -> None:
    # A forked child inherits the LocalGrid object but not the servers: only the creating process stops them.
    if os.getpid() != pid:
        return
    with contextlib.suppress(RamgridError):  # servers may be gone already; stopping them matters more
        release_client(config)
    stop_processes(procs)
    if tmpdir:
        shutil.rmtree(tmpdir, ignore_errors=True)


class LocalGrid(Grid):
    """A `Grid` whose servers this process started on loopback. Stops them on `close()`, on leaving a `with`
    block, when garbage-collected, and at interpreter exit. Pickles as a plain `Grid` (the processes stay here).

    Servers are numbered in spec order: `add_server()` appends one, `remove_server(i)` takes server i out (the
    ones after it move down by one), `restart(i)` restarts server i on its address and it repairs itself."""

    def __init__(
        self,
        servers: int = 3,
        memory: str = "256MiB",
        threads: int = 1,
        token: str | None = None,
        *,
        timeout: float = 5.0,
        ack: str = "all",
        near_cache_bytes: int = 0,
        start_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
        data_dir: str | os.PathLike[str] | None = None,
        tls: TLS | None = None,
    ) -> None:
        tmpdir = tempfile.mkdtemp(prefix="ramgrid-local-")
        self._start = {
            "memory": memory,
            "threads": threads,
            "token": token,
            "start_timeout": start_timeout,
            "extra_args": tuple(extra_args),
            "data_dir": None if data_dir is None else Path(data_dir),
        }
        try:
            self._servers = start_servers(servers, log_dir=Path(tmpdir), **self._start)  # type: ignore[arg-type]
        except BaseException:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        self._tmpdir = tmpdir
        addresses = tuple(str(sp.address) for sp in self._servers)
        config = GridConfig(
            servers=addresses, token=token, timeout=timeout, ack=ack, near_cache_bytes=near_cache_bytes, tls=tls
        )
        super().__init__(config)
        # The finalizer stops whatever processes this list holds when it runs (restart(), add_server() and
        # remove_server() keep it equal to the running servers', in place).
        self._procs = [sp.proc for sp in self._servers]
        self._next_index = servers
        self.last_move: dict[str, Any] | None = None
        self._finalizer = weakref.finalize(self, _finalize, self._procs, config, tmpdir, os.getpid())
        try:
            client_for(config).push_spec()
            self._wait_formed(start_timeout)
        except BaseException:
            self._finalizer()
            raise

    @property
    def addresses(self) -> list[str]:
        """Server addresses, in spec order (index i is server i of `kill`, `restart`, `remove_server`)."""
        return [str(sp.address) for sp in self._servers]

    @property
    def spec(self) -> str:
        """The cluster spec as a comma-separated string (for `ramgrid.connect`, RAMGRID_SPEC or `--spec`)."""
        return ",".join(self.servers)

    @property
    def pids(self) -> list[int]:
        return [sp.pid for sp in self._servers]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _client(self) -> Client:
        self._check_open()
        return client_for(self._config)

    def kill(self, i: int) -> None:
        """Kills server `i` with SIGKILL (for failure tests); the spec is unchanged, so its partitions fail over."""
        p = self._servers[i].proc
        if p.poll() is None:
            p.kill()
        p.wait()

    def restart(self, i: int) -> None:
        """Kills server `i` (SIGKILL) and starts a new one on its address with the same flags, plus `--join` of the
        other members: it learns the spec and the tables from them and copies its partitions from their replicas
        before serving them (reads of a partition still being copied go to another replica meanwhile). It starts
        empty, unless the grid has a `data_dir`, from which it first loads the sealed versions of
        `durability="snapshot"` and `"log"` tables and replays the logged writes of `"log"` tables. Returns once it listens; `wait_repaired()` waits for the repair. For failure tests and
        demos."""
        self._check_open()
        self.kill(i)
        sp = self._spawn_server(self._servers[i].index, self.addresses[i], self._join_args(exclude=i))
        self._servers[i] = sp
        self._procs[i] = sp.proc

    def add_server(self) -> str:  # type: ignore[override]
        """Starts one more server (the same flags as the others, its own data directory if the grid has one,
        `--join` of the current members) and moves to it the partitions it gets (`Grid.add_server`); returns its
        address, now the last of `addresses`. The move report is in `last_move`. If the move fails the error is
        raised and the new server stays (running, last of `addresses`): a move that failed after it started is
        finished by asking for it again (`Grid.add_server(address)`), and one that was refused left it unused."""
        self._check_open()
        index = self._next_index
        self._next_index += 1
        sp = self._spawn_server(index, "127.0.0.1:0", self._join_args())
        self._servers.append(sp)
        self._procs.append(sp.proc)
        self.last_move = Grid.add_server(self, str(sp.address))
        return str(sp.address)

    def replace_server(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        """Starts a new server (the same flags, `--join` of the others) and puts it in the place of server `i`
        (`Grid.replace_server`), which is killed first if it still runs: the way back from a server lost for good.
        The new server becomes index `i`; returns the move report."""
        self._check_open()
        dead = self._servers[i]
        self.kill(i)
        index = self._next_index
        self._next_index += 1
        sp = self._spawn_server(index, "127.0.0.1:0", self._join_args(exclude=i))
        self._servers[i] = sp
        self._procs.remove(dead.proc)
        self._procs.append(sp.proc)
        report = Grid.replace_server(self, str(dead.address), str(sp.address))
        self.last_move = report
        return report

    def remove_server(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        """Moves every partition off server `i` (`Grid.remove_server`), then stops it; the servers after it move
        down by one. Returns the move report."""
        self._check_open()
        sp = self._servers[i]
        report = Grid.remove_server(self, str(sp.address))
        self.last_move = report
        stop_processes([sp.proc])
        del self._servers[i]
        self._procs.remove(sp.proc)
        return report

    def wait_repaired(self, timeout: float = 60.0) -> float:
        """Waits until every server answers under one spec (the same nonzero epoch), has learned the tables and
        has no partition left to copy in, and the metadata group is whole again (one leader known to all, every
        server a member in contact with it); returns the seconds waited. Raises RamgridError after `timeout`,
        quoting the last status."""
        started = time.monotonic()
        last: list[dict[str, Any]] = []
        while True:
            try:
                last = self.status()
            except RamgridError as e:
                last = [{"error": str(e)}]
            epochs = {s.get("epoch") for s in last}
            if (
                len(last) == len(self._servers)
                and all(
                    s.get("ok") and s.get("pending_partitions") == 0 and s.get("catalog_learned") == 1 for s in last
                )
                and len(epochs) == 1
                and 0 not in epochs
                and group_health(last)["whole"]
            ):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise RamgridError(f"the local grid did not finish repairing within {timeout:.0f} s: {last}")
            time.sleep(0.05)

    def _wait_formed(self, timeout: float) -> None:
        """Waits until the servers' metadata group has formed: every server a member, one leader known to all
        (docs/control-plane.md). Data is served before that; failure handling starts then."""
        started = time.monotonic()
        n = len(self._servers)
        while True:
            last = self.status()
            leaders = {s.get("meta_leader") for s in last}
            if (
                all(s.get("ok") and s.get("meta_members") == n and s.get("quorum") == "ok" for s in last)
                and len(leaders) == 1
                and "none" not in leaders
            ):
                return
            if time.monotonic() - started > timeout:
                raise RamgridError(f"the local grid's metadata group did not form within {timeout:.0f} s: {last}")
            time.sleep(0.02)

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RamgridError("this local grid is closed")

    def _join_args(self, exclude: int | None = None) -> list[str]:
        members = [a for j, a in enumerate(self.addresses) if j != exclude]
        return ["--join", ",".join(members)] if members else []

    def _spawn_server(self, index: int, listen: str, extra: list[str]) -> ServerProcess:
        start = self._start
        env = server_env(start["token"], True)  # type: ignore[arg-type]
        args = [sys.executable, "-m", "ramgrid._serve", "--listen", listen, "--threads", str(start["threads"])]
        args += ["--table-memory", str(start["memory"]), *start["extra_args"]]  # type: ignore[misc]
        args += _http_args(start["extra_args"])  # type: ignore[arg-type]
        args += _data_args(start["data_dir"], index, Path(self._tmpdir)) + extra  # type: ignore[arg-type]
        with contextlib.ExitStack() as files:
            sp = _spawn(index, args, env, Path(self._tmpdir), files)
            try:
                timeout = float(start["start_timeout"])  # type: ignore[arg-type]
                sp.address = _wait_listening(sp, index, time.monotonic() + timeout, timeout)
            except BaseException:
                stop_processes([sp.proc], grace=2.0)
                raise
        return sp

    @property
    def dashboard_url(self) -> str | None:
        """The live dashboard of the first running server (any server shows the whole cluster), with the token in
        the URL's fragment when the grid has one; None when no server runs or none serves HTTP."""
        for sp in self._servers:
            if sp.proc.poll() is None:
                tls = any(a.split("=")[0] == "--tls-cert" for a in self._start["extra_args"])  # type: ignore[attr-defined]
                return sp.dashboard_url(self._start["token"], tls)  # type: ignore[arg-type]
        return None

    def alive(self) -> list[bool]:
        """Which servers are still running."""
        return [sp.proc.poll() is None for sp in self._servers]

    def server_stderr(self, i: int) -> str:
        """The end of server `i`'s stderr (while the grid is open)."""
        return self._servers[i].stderr_tail()

    def close(self) -> None:
        """Closes connections and stops every server (SIGTERM, then SIGKILL after 5 s)."""
        self._finalizer()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"LocalGrid({self.addresses!r}, {state})"


def local(
    servers: int = 3,
    memory: str = "256MiB",
    threads: int = 1,
    token: str | None = None,
    **options: Any,
) -> LocalGrid:
    """Starts an embedded cluster of `servers` processes on loopback and returns its grid handle.

    `memory` is each server's table memory (e.g. "256MiB"); `threads` its worker threads; `token`, if given, is
    required from clients (the returned handle presents it). Other keyword options: timeout, ack,
    near_cache_bytes, start_timeout, extra_args (more ramgrid-server flags: TLS servers take --tls-cert, --tls-key and
    --tls-ca here), tls (a `ramgrid.TLS` for the returned handle, to reach such servers), data_dir (server i keeps the
    snapshots of `durability="snapshot"` tables, and the snapshots and logs of `"log"` tables, in
    `data_dir/server-i`, so `restart(i)` brings them back). Use it as a context manager, or call `close()`; it
    is also cleaned up at exit. `add_server()`, `remove_server(i)` and `restart(i)` grow, shrink and repair it
    under a running job.
    """
    return LocalGrid(servers, memory, threads, token, **options)
