"""The grid on a Dask cluster: `start(client)` runs a ramgrid server beside the workers of every host, and the grid
follows the cluster as workers come and go.

    from dask.distributed import Client
    import ramgrid.dask

    client = Client("tcp://scheduler:8786")            # or Client(LocalCluster(...))
    grid = ramgrid.dask.start(client, memory="4GiB")    # one server per worker host, one group, a fresh token
    grid.create_table("scores", value_type="f64")

    def task(keys):
        return ramgrid.dask.get_grid().table("scores").get_many(keys)   # inside a task: no handle passed around

How it is built (two Dask plugins):

- A scheduler plugin, the coordinator (here), decides: which worker hosts (or workers, `per="worker"`) need a
  server, when a server joins the group and when its partitions move off. It holds the token and the member list,
  serves them to `get_grid()`, and does one membership change at a time. It is a scheduler plugin because only the
  scheduler sees the whole cluster: every worker arriving and leaving, and a retirement before it happens.
- A nanny plugin (`ramgrid._dask_server`) runs the server as the nanny's child, on the address the host's workers
  use, and makes the grid calls the coordinator asks for. A nanny, not a worker, because it outlives its worker: a
  worker restarted by its nanny keeps its server and the server's data. Workers therefore need nannies (the default
  of `dask worker`, `LocalCluster(processes=True)`, dask-jobqueue and dask-kubernetes).

Following the cluster: a worker host added (`cluster.scale`, adaptive scaling) gets a server started with `--join`
of the members and added with `Grid.add_server`, which moves its share of partitions to it. A retirement
(`client.retire_workers`, a scale-down, adaptive scaling; all of them call the scheduler's `retire_workers` handler,
which the coordinator wraps: Dask has no plugin hook that runs before a retirement) first moves the partitions off the
leaving hosts' servers (`Grid.remove_server`) and stops them, then lets Dask retire the workers; when every server
leaves at once (the cluster closes) nothing is moved. A nanny that closes on its own (`dask worker` on SIGTERM, a
batch job's end) asks the coordinator for the same move before its server stops (for up to 30 s). A host that dies is
failed over by the servers' control plane like any server. The nanny restarts a server that exited on its own;
closing the cluster (or `stop(client)`) stops every server, and a server never outlives its nanny.

Tasks find their grid with `get_grid()`: it asks the scheduler once per worker process for the token and members, so
no handle needs to be passed around; jobs that take `dask_client=` pair their tasks with the servers as usual
(`ramgrid.engines`), and `owners(client)` gives the exact server -> worker pairing this module made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ramgrid._clients import GridConfig, _existing_client
from ramgrid.engines import DASK_COORDINATOR
from ramgrid.exceptions import RamgridError
from ramgrid.grid import Grid, Table

try:
    from distributed import get_worker
    from distributed.core import Status
    from distributed.diagnostics.plugin import SchedulerPlugin
    from distributed.utils import sync
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("ramgrid.dask needs dask.distributed: pip install 'ramgrid[dask]'") from e

from ramgrid import _dask_server

__all__ = ["COORDINATOR", "DaskGrid", "get_grid", "owners", "start", "stop"]

logger = logging.getLogger("ramgrid.dask")

COORDINATOR = DASK_COORDINATOR
_PER = ("host", "worker")
# Arguments of Scheduler.workers_to_close, which a retire_workers call without workers or names passes on.
_WORKERS_TO_CLOSE = ("memory_ratio", "n", "key", "minimum", "target", "attribute")
# After a failed attempt to bring the servers in line with the workers, the next one comes this much later.
_RETRY_S = 5.0
# A worker in these states gets no server (it is leaving, or gone).
_LEAVING = (Status.closing_gracefully, Status.closing, Status.closed, Status.failed)


class DaskGrid(Grid):
    """The `Grid` of a Dask cluster's servers. Tables it creates get the `replication` given to `start()` unless told
    otherwise (at most one replica per server: a one-host cluster makes replication-1 tables)."""

    def __init__(self, config: GridConfig, replication: int = 1, dashboards: Sequence[str] = ()) -> None:
        super().__init__(config)
        self.replication = int(replication)
        self.dashboards = tuple(dashboards)

    @property
    def dashboard_url(self) -> str | None:
        """The live dashboard (docs/dashboard.md) of the first server, with the grid's token in the URL fragment
        (browsers do not send it; the page's login script reads it). Every server's page shows the whole cluster;
        `dashboards` lists them all (without the token). None if no server reported one."""
        if not self.dashboards:
            return None
        token = self.config.token
        return self.dashboards[0] + (f"#token={quote(token, safe='')}" if token else "")

    def create_table(
        self, name: str, partitions: int = 64, replication: int | None = None, *args: Any, **kwargs: Any
    ) -> Table:
        if replication is None:
            replication = max(1, min(self.replication, len(self._client().servers())))
        return super().create_table(name, partitions, replication, *args, **kwargs)

    def __reduce__(self) -> Any:
        _, (config,) = super().__reduce__()
        return (DaskGrid, (config, self.replication, self.dashboards))

    def __repr__(self) -> str:
        return f"DaskGrid({self.servers!r}, replication={self.replication})"


@dataclass
class _Member:
    """A running server: the nanny it lives in, the host it serves, its address."""

    nanny: str
    host: str
    address: str
    pid: int
    dashboard: str | None = None


@dataclass(frozen=True)
class _Settings:
    token: str = field(repr=False)
    memory: str
    threads: int
    replication: int
    data_dir: str | None
    per: str
    port: int
    start_timeout: float
    extra_args: tuple[str, ...]

    def launch(self) -> dict[str, Any]:
        """What a nanny needs to start a server (sent with each request; msgpack-friendly)."""
        return {
            "token": self.token,
            "memory": self.memory,
            "threads": self.threads,
            "data_dir": self.data_dir,
            "port": self.port,
            "start_timeout": self.start_timeout,
            "extra_args": list(self.extra_args),
        }


class _Coordinator(SchedulerPlugin):
    """The scheduler's half (module docstring). Its state lives in the scheduler process; every change to the group
    runs under one lock, from one background loop (`_run`) woken by the cluster's events, or from a retirement."""

    name = COORDINATOR

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.members: dict[str, _Member] = {}  # by nanny address
        self.spec: list[str] = []  # the group's spec as the last change reported it
        self.error: str | None = None
        self.stopped = False
        self._retiring: set[str] = set()  # workers being retired
        self._closing: set[str] = set()  # nannies closing on their own (never back: a new nanny has a new address)
        self._rejoin: set[str] = set()
        self._warned: set[str] = set()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._original_retire = scheduler.handlers["retire_workers"]
        scheduler.handlers["retire_workers"] = self._retire_workers
        scheduler.handlers["ramgrid_server_restarted"] = self._server_restarted
        scheduler.handlers["ramgrid_config"] = self.config
        scheduler.handlers["ramgrid_leaving"] = self._nanny_leaving
        self._loop = asyncio.ensure_future(self._run())
        self._poke()

    # Dask's events

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self._poke()

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any) -> None:
        self._retiring.discard(worker)
        self._poke()

    async def before_close(self) -> None:
        await self.shutdown()

    # state served to clients and tasks

    def config(self) -> dict[str, Any]:
        """The grid's seeds (its members in spec order), token and table replication."""
        order = {a: i for i, a in enumerate(self.spec)}
        members = sorted(self.members.values(), key=lambda m: (order.get(m.address, len(order)), m.address))
        return {
            "servers": [m.address for m in members],
            "token": self.settings.token,
            "replication": self.settings.replication,
            "dashboards": [m.dashboard for m in members if m.dashboard],
        }

    def owners(self) -> dict[str, str]:
        """Server address -> the address of the worker beside it (its nanny's worker)."""
        by_nanny = {ws.nanny: ws.address for ws in self.scheduler.workers.values() if ws.nanny}
        return {m.address: by_nanny[m.nanny] for m in self.members.values() if m.nanny in by_nanny}

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Waits until every worker host (or worker) that should have a server has one in the group."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await asyncio.wait_for(self._settled.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise RamgridError(
                    f"the ramgrid servers did not start within {timeout:.0f} s "
                    f"({len(self.members)} running; last error: {self.error})"
                ) from None
            if self.error:
                raise RamgridError(f"starting the ramgrid servers failed: {self.error}")
            if self.members and not self._missing():
                return self.config()
            self._poke()
            await asyncio.sleep(0.05)

    # the loop that brings the group in line with the workers

    def _poke(self) -> None:
        if not self.stopped:
            self._settled.clear()
            self._wake.set()

    async def _run(self) -> None:
        while not self.stopped:
            await self._wake.wait()
            self._wake.clear()
            try:
                async with self._lock:
                    if self.stopped:
                        return
                    await self._reconcile()
                self.error = None
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                logger.exception("ramgrid coordinator: bringing the servers in line with the workers failed")
                asyncio.get_running_loop().call_later(_RETRY_S, self._poke)
            if not self._wake.is_set():
                self._settled.set()

    def _wanted(self) -> dict[str, tuple[str, str, Any]]:
        """Who should run a server: key (a host, or a nanny with `per="worker"`) -> (nanny, host, worker name). A
        host's server goes to the nanny that has it already, else to the first of its nannies by address."""
        by_key: dict[str, list[Any]] = {}
        for ws in self.scheduler.workers.values():
            if ws.address in self._retiring or ws.status in _LEAVING or ws.nanny in self._closing:
                continue
            if not ws.nanny:
                if ws.address not in self._warned:
                    self._warned.add(ws.address)
                    logger.warning("worker %s has no nanny: ramgrid starts no server for it", ws.address)
                continue
            by_key.setdefault(ws.host if self.settings.per == "host" else ws.nanny, []).append(ws)
        out: dict[str, tuple[str, str, Any]] = {}
        for key, wss in by_key.items():
            running = [ws for ws in wss if ws.nanny in self.members]
            ws = running[0] if running else min(wss, key=lambda w: w.nanny)
            out[key] = (ws.nanny, ws.host, None if self.settings.per == "host" else ws.name)
        return out

    def _has(self, key: str) -> bool:
        if self.settings.per == "host":
            return any(m.host == key for m in self.members.values())
        return key in self.members

    def _missing(self) -> list[tuple[str, str, Any]]:
        return [v for k, v in self._wanted().items() if not self._has(k)]

    async def _call(self, nanny: str, op: str, wait: float | None = None, **kwargs: Any) -> Any:
        """Request `op` of the nanny's ServerKeeper, waiting up to `wait` seconds (None: as long as it takes)."""
        coro = getattr(self.scheduler.rpc(nanny), f"ramgrid_{op}")(**kwargs)
        return await (coro if wait is None else asyncio.wait_for(coro, wait))

    async def _reconcile(self) -> None:
        # Members whose nanny left the cluster: gone, unless the nanny still answers (it is restarting its worker).
        nannies = {ws.nanny for ws in self.scheduler.workers.values() if ws.nanny}
        for nanny, m in list(self.members.items()):
            if nanny in nannies:
                continue
            try:
                alive = isinstance(await self._call(nanny, "ping", wait=5), dict)  # None: the plugin is gone
            except Exception:  # noqa: BLE001 - any failure to reach it: it is gone (its server with it)
                alive = False
            if not alive:
                logger.warning("ramgrid server %s left with its nanny %s; the group fails it over", m.address, nanny)
                del self.members[nanny]
        for nanny in sorted(self._rejoin):
            self._rejoin.discard(nanny)
            if nanny in self.members:
                await self._add(self.members[nanny], restarted=True)
        missing = self._missing()
        if not missing:
            return
        if not self.members:
            await self._form(missing)
        else:
            for nanny, host, name in missing:
                m = await self._serve(nanny, host, name, self.config()["servers"])
                await self._add(m)

    async def _serve(self, nanny: str, host: str, name: Any, join: list[str]) -> _Member:
        dir_name = _dask_server.dir_name(host, name)
        info = await self._call(
            nanny, "serve", settings=self.settings.launch(), host=host, dir_name=dir_name, join=join
        )
        if not isinstance(info, dict):  # the nanny answers an unknown request with nothing: it is closing
            raise RamgridError(f"the nanny {nanny} runs no ramgrid plugin (closing?)")
        return _Member(
            nanny=nanny, host=host, address=str(info["address"]), pid=int(info["pid"]), dashboard=info.get("dashboard")
        )

    async def _form(self, missing: list[tuple[str, str, Any]]) -> None:
        """The first servers: started at once, then made one group (the spec pushed to all, as `ramgrid.local`)."""
        got = await asyncio.gather(*(self._serve(n, h, name, []) for n, h, name in missing), return_exceptions=True)
        started = [m for m in got if isinstance(m, _Member)]
        failed = [e for e in got if isinstance(e, BaseException)]
        if failed:
            await asyncio.gather(*(self._call(m.nanny, "stop_server") for m in started), return_exceptions=True)
            raise failed[0]
        addresses = [m.address for m in started]
        await self._call(started[0].nanny, "form", servers=addresses, timeout=self.settings.start_timeout)
        self.spec = addresses
        self.members.update((m.nanny, m) for m in started)
        logger.info("ramgrid group formed: %s", ", ".join(addresses))

    async def _add(self, m: _Member, restarted: bool = False) -> None:
        """Adds a started server to the group (its partitions move to it). A restarted sole member is given its
        spec again instead: there is no group to join."""
        others = [a for a in self.config()["servers"] if a != m.address]
        if not others:
            report = await self._call(m.nanny, "form", servers=[m.address], timeout=self.settings.start_timeout)
        else:
            report = await self._call(m.nanny, "join", seeds=others)
        self.spec = list(report.get("to") or self.spec)
        self.members[m.nanny] = m
        if not report.get("already_member"):
            logger.info(
                "ramgrid server %s %s the group (%s partitions copied)",
                m.address,
                "rejoined" if restarted else "joined",
                report.get("partitions_copied", 0),
            )

    async def _server_restarted(self, nanny: str, pid: int, dashboard: str | None = None) -> None:
        """A nanny restarted its server: make sure it is a member again (the group may have failed it over)."""
        m = self.members.get(nanny)
        if m is not None:
            m.pid = int(pid)
            m.dashboard = dashboard
        self._rejoin.add(nanny)
        self._poke()

    # retirement

    async def _retire_workers(
        self, workers: list[str] | None = None, names: list[Any] | None = None, **kwargs: Any
    ) -> Any:
        """Scheduler.retire_workers, with the partitions of the leaving servers moved off first (module docstring)."""
        original = self._original_retire
        if self.stopped or (workers is not None and names is not None):
            return await original(workers=workers, names=names, **kwargs)
        sched = self.scheduler
        if names is not None:
            wanted = {str(n) for n in names}
            addrs = [ws.address for ws in sched.workers.values() if str(ws.name) in wanted]
        elif workers is not None:
            # Addresses, or names: SpecCluster's scale-down passes its workers' names here.
            by_name = {str(ws.name): ws.address for ws in sched.workers.values()}
            addrs = [
                a if a in sched.workers else by_name[str(a)] for a in workers if a in sched.workers or str(a) in by_name
            ]
        else:
            # Choose here, and retire exactly those: asked again, the scheduler might choose others.
            picks = {k: kwargs.pop(k) for k in _WORKERS_TO_CLOSE if k in kwargs}
            addrs = workers = list(sched.workers_to_close(**picks))
        self._retiring.update(addrs)
        refused = set(addrs)
        try:
            async with self._lock:
                await self._drain({sched.workers[a].nanny for a in addrs if a in sched.workers})
            result = await original(workers=workers, names=names, **kwargs)
            # Only a worker that Dask itself declined to retire (its data had nowhere to go) stays and gets a server
            # again; the others stay marked until they are removed (SpecCluster passes names as `workers`, which
            # Dask ignores, and closes those workers itself right after).
            refused = {a for a in addrs if a not in result and (names is not None or a in (workers or ()))}
            return result
        finally:
            self._retiring.difference_update(refused)
            self._poke()

    async def _nanny_leaving(self, nanny: str) -> None:
        """A nanny closes without a retirement (`dask worker` stopped by SIGTERM, a batch job at its end): its
        server's partitions move off first, as in a retirement. Asked by the nanny's plugin as it closes."""
        if self.stopped or nanny not in self.members:
            return
        self._closing.add(nanny)
        async with self._lock:
            await self._drain({nanny})

    async def _drain(self, leaving_nannies: set[str]) -> None:
        """Moves the partitions off the servers of the leaving nannies, then stops them. With `per="host"`, a host
        that keeps other workers keeps a server: a new one beside one of them takes the leaving one's place."""
        wss = self.scheduler.workers
        staying_ws = [
            ws
            for ws in wss.values()
            if ws.address not in self._retiring and ws.nanny and ws.nanny not in leaving_nannies
        ]
        leave: list[_Member] = []
        handover: list[tuple[_Member, str]] = []  # (leaving member, nanny of a staying worker on its host)
        for m in self.members.values():
            if m.nanny not in leaving_nannies:
                continue
            heirs = sorted(ws.nanny for ws in staying_ws if ws.host == m.host)
            if self.settings.per == "host" and heirs:
                handover.append((m, heirs[0]))
            else:
                leave.append(m)
        if not leave and not handover:
            return
        staying = [m for m in self.members.values() if m not in leave and all(m is not h for h, _ in handover)]
        if not staying and not handover:
            # Every server leaves (the cluster is closing): there is nowhere to move anything.
            await asyncio.gather(*(self._call(m.nanny, "stop_server") for m in leave), return_exceptions=True)
            for m in leave:
                self.members.pop(m.nanny, None)
            logger.info("ramgrid: every server left with its workers")
            return
        for old, heir in handover:
            try:
                # Its own data directory: the leaving server still runs in the host's one.
                new = await self._serve(heir, old.host, heir.rsplit(":", 1)[-1], self.config()["servers"])
                report = await self._call(heir, "replace", seeds=self.config()["servers"], old=old.address)
                self.spec = list(report.get("to") or self.spec)
                self.members.pop(old.nanny, None)
                self.members[heir] = new
                logger.info("ramgrid server %s took the place of %s (its worker retires)", new.address, old.address)
            except Exception:
                logger.exception("ramgrid: handing %s over on its host failed; it leaves as a dead server", old.address)
            with contextlib.suppress(Exception):
                await self._call(old.nanny, "stop_server")
            self.members.pop(old.nanny, None)
        for m in leave:
            self.members.pop(m.nanny, None)
            seeds = self.config()["servers"]
            try:
                out = await self._call(m.nanny, "leave", seeds=seeds, move=bool(seeds))
            except Exception as e:  # noqa: BLE001 - the worker leaves all the same
                logger.warning("ramgrid server %s: leaving failed (%s); the group fails it over", m.address, e)
                continue
            if out.get("error"):
                logger.warning("ramgrid server %s stopped without moving its partitions: %s", m.address, out["error"])
            elif out.get("report"):
                self.spec = list(out["report"].get("to") or self.spec)
                logger.info(
                    "ramgrid server %s left the group (%s partitions moved)",
                    m.address,
                    out["report"].get("partitions_copied"),
                )

    # the end

    async def shutdown(self) -> None:
        """Stops every server and gives the scheduler its handlers back. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        self._loop.cancel()
        self._settled.set()
        if self.scheduler.handlers.get("retire_workers") == self._retire_workers:
            self.scheduler.handlers["retire_workers"] = self._original_retire
        for h in ("ramgrid_server_restarted", "ramgrid_config", "ramgrid_leaving"):
            self.scheduler.handlers.pop(h, None)
        async with self._lock:
            members, self.members = list(self.members.values()), {}
            await asyncio.gather(
                *(self._call(m.nanny, "stop_server", wait=30) for m in members), return_exceptions=True
            )


# the public functions


def start(
    client: Any,
    memory: str = "1GiB",
    threads: int = 2,
    replication: int = 1,
    data_dir: str | os.PathLike[str] | None = None,
    per: str = "host",
    *,
    port: int = 0,
    timeout: float = 120.0,
    extra_args: tuple[str, ...] | list[str] = (),
) -> DaskGrid:
    """Starts a ramgrid server beside the workers of every host of `client`'s cluster (`per="worker"`: beside every
    worker) and returns the grid, whose servers follow the cluster from then on (module docstring).

    `memory`: each server's table memory ("4GiB"); `threads`: its worker threads; `replication`: the replication of
    tables the returned grid (and `get_grid()`) creates unless told otherwise; `data_dir`: a directory on each host
    for durable tables (`durability="snapshot"`/`"log"`), one subdirectory per server, kept across restarts;
    `port`: the servers' port (0: any free one; a fixed port needs `per="host"`); `extra_args`: more
    `ramgrid-server` flags. Every server listens on the address its host's workers use and requires a token made
    here, which tasks and `get_grid(client)` get from the scheduler.

    Raises ValueError for bad arguments, a cluster without workers or without nannies, or one that runs a grid
    already; RamgridError if the servers did not start (nothing is left running then).
    """
    if per not in _PER:
        raise ValueError(f"per must be 'host' or 'worker', got {per!r}")
    if replication < 1 or threads < 1:
        raise ValueError("replication and threads must be >= 1")
    if not 0 <= port < 65536:
        raise ValueError(f"port must be in 0..65535, got {port}")
    if port and per == "worker":
        raise ValueError("a fixed port needs per='host': the servers of one host's workers would share it")
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    if not workers:
        raise ValueError(
            "the cluster has no workers yet: start ramgrid once some have joined (client.wait_for_workers)"
        )
    if not any(w.get("nanny") for w in workers.values()):
        raise ValueError(
            "the cluster's workers run without nannies; ramgrid.dask runs its servers in the nannies "
            "(use LocalCluster(processes=True), or `dask worker` without --no-nanny)"
        )
    if client.run_on_scheduler(_running_on_scheduler):
        raise ValueError(
            "a ramgrid grid runs on this cluster already: get_grid(client) returns it, stop(client) stops it"
        )
    settings = _Settings(
        token=secrets.token_hex(32),
        memory=str(memory),
        threads=int(threads),
        replication=int(replication),
        data_dir=None if data_dir is None else str(data_dir),
        per=per,
        port=int(port),
        start_timeout=float(min(timeout, 60.0)),
        extra_args=tuple(str(a) for a in extra_args),
    )
    try:
        # The nannies' handlers first: the coordinator starts servers through them as soon as it starts.
        client.register_plugin(_dask_server.ServerKeeper(), name=_dask_server.NAME)
        client.register_plugin(_Coordinator(settings), name=COORDINATOR)
        config = client.run_on_scheduler(_wait_ready_on_scheduler, timeout=timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            stop(client)
        raise
    return _grid(config)


def get_grid(client: Any = None) -> DaskGrid:
    """The grid `start()` started on a cluster. Inside a task, with no argument: the grid of the cluster the task
    runs on. From the driver: `get_grid(client)` (no argument: Dask's default client). Raises RamgridError if the
    cluster runs no grid."""
    if client is None:
        try:
            worker = get_worker()
        except ValueError:
            worker = None
        if worker is not None:
            return _grid_in_worker(worker)
        from distributed import default_client

        client = default_client()
    config = client.run_on_scheduler(_config_on_scheduler)
    if config is None:
        raise RamgridError("no ramgrid grid runs on this Dask cluster: ramgrid.dask.start(client) starts one")
    return _grid(config)


def owners(client: Any) -> dict[str, str]:
    """Server address -> the worker beside it, for the grid `start()` started on `client`'s cluster ({} if none)."""
    return dict(client.run_on_scheduler(_owners_on_scheduler))


def stop(client: Any) -> None:
    """Stops every server of the cluster's grid (its data goes with them) and removes the plugins. Does nothing on
    a cluster that runs no grid."""
    client.run_on_scheduler(_stop_on_scheduler)
    with contextlib.suppress(Exception):  # not registered (start failed early): nothing to remove
        client.unregister_worker_plugin(_dask_server.NAME, nanny=True)
    client.run(_forget_in_worker)


def _grid(config: dict[str, Any]) -> DaskGrid:
    if not config["servers"]:
        raise RamgridError("the cluster's ramgrid grid has no running server")
    return DaskGrid(
        GridConfig(servers=tuple(config["servers"]), token=config["token"]),
        config["replication"],
        config.get("dashboards", ()),
    )


# Per worker process: the grid of each scheduler's cluster, as last fetched.
_task_grids: dict[str, DaskGrid] = {}


def _grid_in_worker(worker: Any) -> DaskGrid:
    key = str(worker.scheduler.address)
    grid = _task_grids.get(key)
    # Fetched again only when this process holds no client for it (first use, or closed): a live client follows
    # the group's membership by itself, while a stale seed list could name servers that have all left.
    if grid is None or _existing_client(grid.config) is None:
        try:
            config = sync(worker.loop, worker.scheduler.ramgrid_config)
        except Exception as e:  # noqa: BLE001 - the scheduler unreachable or refusing: say what it said
            raise RamgridError(
                f"no ramgrid grid runs on this Dask cluster ({e}): ramgrid.dask.start(client) starts one"
            ) from None
        if config is None:  # a scheduler without the coordinator answers an unknown request with nothing
            raise RamgridError("no ramgrid grid runs on this Dask cluster: ramgrid.dask.start(client) starts one")
        grid = _task_grids[key] = _grid(config)
    return grid


def _forget_in_worker(dask_worker: Any) -> None:
    """Run on every worker by `stop()`: tasks must not find the stopped grid's handle."""
    grid = _task_grids.pop(str(dask_worker.scheduler.address), None)
    if grid is not None:
        grid.close()


# Run on the scheduler (client.run_on_scheduler).


def _coordinator(dask_scheduler: Any) -> _Coordinator | None:
    plugin = dask_scheduler.plugins.get(COORDINATOR)
    return plugin if isinstance(plugin, _Coordinator) and not plugin.stopped else None


def _running_on_scheduler(dask_scheduler: Any) -> bool:
    return _coordinator(dask_scheduler) is not None


async def _wait_ready_on_scheduler(dask_scheduler: Any, timeout: float) -> dict[str, Any]:
    plugin = _coordinator(dask_scheduler)
    if plugin is None:
        raise RamgridError("the ramgrid coordinator did not start on the scheduler")
    return await plugin.wait_ready(timeout)


def _config_on_scheduler(dask_scheduler: Any) -> dict[str, Any] | None:
    plugin = _coordinator(dask_scheduler)
    return None if plugin is None else plugin.config()


def _owners_on_scheduler(dask_scheduler: Any) -> dict[str, str]:
    plugin = _coordinator(dask_scheduler)
    return {} if plugin is None else plugin.owners()


async def _stop_on_scheduler(dask_scheduler: Any) -> None:
    plugin = dask_scheduler.plugins.get(COORDINATOR)
    if isinstance(plugin, _Coordinator):
        await plugin.shutdown()
        dask_scheduler.remove_plugin(name=COORDINATOR)
