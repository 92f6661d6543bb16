"""The nanny's half of `ramgrid.dask`: a NannyPlugin that runs a ramgrid server as a child of the nanny, and the
handlers through which the scheduler's coordinator (`ramgrid.dask`) starts that server, forms or joins the group with
it, moves its partitions off and stops it.

The server lives in the nanny, not in the worker, because the nanny outlives its worker: a worker restarted by its
nanny (`client.restart()`, a memory limit, a crash) finds its server and the server's data where they were. The
server watches its parent (`ramgrid._serve`), so it goes when the nanny goes, however the nanny ends; and the nanny
restarts a server that exited on its own, on the same address, which then repairs itself from its replicas (or is
added back by the coordinator if the group failed it over meanwhile).

Every grid call made here blocks (a move may copy gigabytes), so it runs in a thread: the nanny keeps answering the
scheduler's heartbeats meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import NannyPlugin
from tornado.ioloop import PeriodicCallback

from ramgrid._clients import GridConfig, client_for, release_client
from ramgrid._local import ServerProcess, _spawn, _wait_listening, server_env, stop_processes
from ramgrid.exceptions import RamgridError
from ramgrid.grid import Grid
from ramgrid.health import group_health

__all__ = ["NAME", "ServerKeeper", "wait_formed"]

logger = logging.getLogger("ramgrid.dask")

NAME = "ramgrid-server"
_HANDLERS = ("serve", "form", "join", "replace", "leave", "stop_server", "ping")
_WATCH_MS = 500
# How long a closing nanny waits for its server's partitions to move off before it stops the server anyway.
_LEAVE_WAIT_S = 30.0
# How long a membership change waits for the metadata group to be whole, and how often it is tried.
_SETTLE_S = 20.0
_MOVE_ATTEMPTS = 3
# A server that exits more often than this is left down (and logged): restarting it again would only spin.
_MAX_RESTARTS = 3
_RESTART_WINDOW_S = 60.0


def wait_formed(grid: Grid, n: int, timeout: float) -> None:
    """Waits until `n` servers form one metadata group: every server a member, one leader known to all
    (docs/control-plane.md), as `LocalGrid` does after its servers start."""
    deadline = time.monotonic() + timeout
    last: list[dict[str, Any]] = []
    while True:
        try:
            last = grid.status()
        except RamgridError as e:
            last = [{"error": str(e)}]
        leaders = {s.get("meta_leader") for s in last}
        if (
            len(last) == n
            and all(s.get("ok") and s.get("meta_members") == n and s.get("quorum") == "ok" for s in last)
            and len(leaders) == 1
            and "none" not in leaders
        ):
            return
        if time.monotonic() > deadline:
            raise RamgridError(f"the servers' metadata group did not form within {timeout:.0f} s: {last}")
        time.sleep(0.05)


def settled(grid: Grid, timeout: float = _SETTLE_S) -> bool:
    """Waits (up to `timeout`) until the metadata group is whole: one leader known to every server that answers,
    each of them a member, the voters in place. A move begun right after another one took a server (a voter,
    perhaps the leader) away may otherwise find the group still electing and be refused (NO_QUORUM)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if group_health(grid.status())["whole"]:
                return True
        except RamgridError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _move(config: GridConfig, move: Callable[[Grid], dict[str, Any]]) -> dict[str, Any]:
    """Runs a membership change once the group is whole, again (up to three times in all) if it is refused for a
    retryable reason (`MoveFailed`, a group still electing: RamgridError, never ValueError)."""
    try:
        for attempt in range(_MOVE_ATTEMPTS):
            grid = Grid(config)
            settled(grid)
            try:
                return move(grid)
            except RamgridError as e:
                if attempt + 1 == _MOVE_ATTEMPTS:
                    raise
                logger.info("ramgrid: a membership change was refused (%s); trying again", e)
                release_client(config)
                time.sleep(1.0)
        raise AssertionError("unreachable")
    finally:
        release_client(config)


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ServerKeeper(NannyPlugin):
    """Keeps one ramgrid server beside a nanny's worker. It carries no settings: the coordinator sends them (token
    included) with each request, so nothing secret sits in the plugin the scheduler stores for new nannies."""

    name = NAME

    def setup(self, nanny: Any) -> None:
        self._nanny = nanny
        self._dir = Path(tempfile.mkdtemp(prefix="ramgrid-dask-"))
        self._server: ServerProcess | None = None
        self._launch: dict[str, Any] = {}
        self._seeds: list[str] = []
        self._starts = 0
        self._restarts: list[float] = []
        self._restarting = False
        self._dashboard: str | None = None
        self._lock = asyncio.Lock()
        for h in _HANDLERS:
            nanny.handlers[f"ramgrid_{h}"] = getattr(self, f"_{h}")
        self._watch = PeriodicCallback(self._check, _WATCH_MS)
        self._watch.start()

    async def teardown(self, nanny: Any) -> None:
        self._watch.stop()
        if self._server is not None:
            # Closing without a retirement (SIGTERM to `dask worker`, a batch job's end): the coordinator moves the
            # partitions off first, through this plugin's handlers. Bounded: the nanny must close all the same.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nanny.scheduler.ramgrid_leaving(nanny=nanny.address), _LEAVE_WAIT_S)
        for h in _HANDLERS:
            nanny.handlers.pop(f"ramgrid_{h}", None)
        async with self._lock:
            await self._stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    # the server process

    def _start(self, listen: str, join: list[str]) -> ServerProcess:
        """Starts the server with the launch settings on `listen`, joining `join`; waits for its listening line."""
        s = self._launch
        args = [sys.executable, "-m", "ramgrid._serve", "--listen", listen, "--threads", str(s["threads"])]
        args += ["--table-memory", str(s["memory"])]
        if s["data_dir"]:
            d = Path(s["data_dir"]) / s["dir_name"]
            d.mkdir(parents=True, exist_ok=True)
            args += ["--data-dir", str(d)]
        else:
            # Its Raft identity and vote survive a restart: a restarted server rejoins as the voter it was.
            args += ["--meta-dir", str(self._dir / "meta")]
        if join:
            args += ["--join", ",".join(join)]
        args += list(s["extra_args"])
        if not any(a.split("=")[0] in ("--metrics", "--http") for a in s["extra_args"]):
            # Its dashboard and metrics on the workers' address too (the token guards them off loopback).
            args += ["--http", f"{listen.rsplit(':', 1)[0]}:0"]
        env = server_env(s["token"], parent_watch=True)
        self._starts += 1
        with contextlib.ExitStack() as files:
            sp = _spawn(self._starts, args, env, self._dir, files)
            timeout = float(s["start_timeout"])
            try:
                sp.address = _wait_listening(sp, self._starts, time.monotonic() + timeout, timeout)
            except BaseException:
                stop_processes([sp.proc], grace=2.0)
                raise
        logger.info("ramgrid server %s started (pid %d) beside %s", sp.address, sp.pid, self._nanny.address)
        self._dashboard = sp.dashboard_url()
        return sp

    async def _stop(self) -> None:
        sp, self._server = self._server, None
        if sp is not None:
            await asyncio.to_thread(stop_processes, [sp.proc])
            logger.info("ramgrid server %s stopped (exit status %s)", sp.address, sp.proc.returncode)

    def _info(self) -> dict[str, Any]:
        sp = self._server
        if sp is None:
            return {"address": None, "pid": None, "alive": False, "dashboard": None}
        return {"address": sp.address, "pid": sp.pid, "alive": sp.proc.poll() is None, "dashboard": self._dashboard}

    def _config(self, seeds: list[str]) -> GridConfig:
        return GridConfig(servers=tuple(seeds), token=self._launch["token"])

    def _own(self) -> str:
        if self._server is None or self._server.address is None:
            raise RamgridError(f"no ramgrid server runs beside {self._nanny.address}")
        return self._server.address

    def _check(self) -> None:
        """Every half second: restart the server if it exited without being asked to."""
        sp = self._server
        if sp is None or self._restarting or sp.proc.poll() is None:
            return
        self._restarting = True
        asyncio.ensure_future(self._restart())

    async def _restart(self) -> None:
        try:
            async with self._lock:
                sp = self._server
                if sp is None or sp.proc.poll() is None:
                    return
                now = time.monotonic()
                self._restarts = [t for t in self._restarts if now - t < _RESTART_WINDOW_S]
                if len(self._restarts) >= _MAX_RESTARTS:
                    logger.error(
                        "ramgrid server %s exited %d times within %.0f s; left down. stderr:\n%s",
                        sp.address,
                        len(self._restarts) + 1,
                        _RESTART_WINDOW_S,
                        sp.stderr_tail(),
                    )
                    self._server = None
                    return
                self._restarts.append(now)
                logger.warning(
                    "ramgrid server %s (pid %d) exited with status %s; restarting it on its address",
                    sp.address,
                    sp.pid,
                    sp.proc.returncode,
                )
                join = [a for a in self._seeds if a != sp.address]
                self._server = new = await asyncio.to_thread(self._start, str(sp.address), join)
            # The coordinator adds it back if the group failed it over while it was down.
            await self._nanny.scheduler.ramgrid_server_restarted(
                nanny=self._nanny.address, pid=new.pid, dashboard=self._dashboard
            )
        except Exception:
            logger.exception("restarting the ramgrid server beside %s failed", self._nanny.address)
        finally:
            self._restarting = False

    # handlers (called by the coordinator on the scheduler, one at a time)

    async def _serve(self, settings: dict[str, Any], host: str, dir_name: str, join: list[str]) -> dict[str, Any]:
        """Starts the server on `host` (the address the workers use) unless one runs; returns its address."""
        async with self._lock:
            if self._server is not None and self._server.proc.poll() is None:
                return self._info()
            self._launch = dict(settings, dir_name=dir_name)
            self._seeds = list(join)
            self._restarts = []
            self._server = await asyncio.to_thread(self._start, _listen(host, int(settings["port"])), list(join))
            return self._info()

    async def _form(self, servers: list[str], timeout: float) -> dict[str, Any]:
        """Makes `servers` (just started, none with a spec) one group: pushes the spec, waits for the group."""
        self._seeds = list(servers)
        config = self._config(servers)

        def form() -> None:
            try:
                client_for(config).push_spec()
                wait_formed(Grid(config), len(servers), timeout)
            finally:
                release_client(config)

        await asyncio.to_thread(form)
        return {"to": list(servers)}

    async def _join(self, seeds: list[str]) -> dict[str, Any]:
        """Adds this server to the group of `seeds` and moves its partitions to it (`Grid.add_server`); a server
        that is a member already (restarted before the group failed it over) is left as it is."""
        own = self._own()
        self._seeds = list(seeds)
        config = self._config([s for s in seeds if s != own] or [own])

        def join(grid: Grid) -> dict[str, Any]:
            try:
                return grid.add_server(own)
            except ValueError as e:
                if "already a member" not in str(e):
                    raise
                return {"to": grid.servers, "already_member": True}

        return await asyncio.to_thread(_move, config, join)

    async def _replace(self, seeds: list[str], old: str) -> dict[str, Any]:
        """Puts this server in the place of `old` (`Grid.replace_server`): `old`'s partitions move here."""
        own = self._own()
        self._seeds = list(seeds)
        config = self._config(seeds)
        return await asyncio.to_thread(_move, config, lambda grid: grid.replace_server(old, own))

    async def _leave(self, seeds: list[str], move: bool) -> dict[str, Any]:
        """Moves this server's partitions to the others (`Grid.remove_server`) if `move`, then stops it. A move that
        fails is reported, and the server stops all the same (its worker is leaving): the group then fails it over
        as a dead server."""
        async with self._lock:
            out: dict[str, Any] = {"report": None, "error": None}
            if self._server is None:
                return out
            if move:
                own = self._own()
                config = self._config([s for s in seeds if s != own] or [own])
                try:
                    out["report"] = await asyncio.to_thread(_move, config, lambda grid: grid.remove_server(own))
                except (RamgridError, ValueError) as e:
                    out["error"] = f"{type(e).__name__}: {e}"
            await self._stop()
            return out

    async def _stop_server(self) -> dict[str, Any]:
        async with self._lock:
            await self._stop()
            return self._info()

    async def _ping(self) -> dict[str, Any]:
        return self._info()


def dir_name(host: str, worker_name: Any | None) -> str:
    """The data directory name of a host's server (`per="host"`) or a worker's (`per="worker"`) under `data_dir`:
    stable across restarts, so a restarted server finds its durable tables."""
    raw = host if worker_name is None else f"{host}-{worker_name}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)
