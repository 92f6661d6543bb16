"""Engine adapters: one small interface over the ways ramgrid runs a job's tasks (local threads, a Dask cluster).

Loads (`ramgrid.load`) and MapReduce jobs (`ramgrid.mapreduce`) are written against `Engine`: `submit` a task,
wait for tasks `as_completed`, `cancel` the rest. `submit` takes a locality hint, `where`: the address of the grid
server whose data the task reads or writes most. The thread engine runs every task in this process and ignores it;
the Dask engine runs the task on the worker paired with that server, and elsewhere if that worker is gone.

Pairing workers with servers (`DaskEngine.pairing`): each worker reports the servers local to its host
(`ramgrid.hosts.local_servers`: addresses this machine owns, or `RAMGRID_LOCAL_SERVERS`). A server is then paired
with one of the workers it is local to, spreading the servers of a host over that host's workers in turn (sorted
by address, so every run pairs the same way). With one server and one worker per host, each worker gets its own
server; on one machine (the local cluster: every server on loopback) server i goes to worker i mod W. A server
local to no worker has no pair, and its tasks run wherever Dask puts them.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["DaskEngine", "Engine", "ThreadEngine", "engine_for", "pair_servers"]


class Engine(Protocol):
    """What a job needs from the thing that runs its tasks."""

    #: How many tasks can run at once (a hint for sizing work).
    parallelism: int

    def submit(self, fn: Callable[..., Any], /, *args: Any, where: str | None = None, name: str = "task") -> Any:
        """Starts `fn(*args)`; returns a future (`.result()` waits and returns or raises). `where`: the server
        address whose paired worker should run it (a hint). `name`: a label for the engine's dashboard."""
        ...

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        """Yields the futures as they finish."""
        ...

    def cancel(self, futures: Iterable[Any]) -> None:
        """Cancels those not started; a running task is not interrupted (see `cancel_event`)."""
        ...

    @property
    def cancel_event(self) -> threading.Event | None:
        """For in-process engines: an event set by `cancel`, which long tasks may poll between batches."""
        ...


class ThreadEngine:
    """Runs tasks on a pool of threads in this process. Use as a context manager, or call `close()`: closing waits
    for every task, so none still writes after the caller moved on (aborted a version, dropped a table)."""

    def __init__(self, workers: int | None = None) -> None:
        self.parallelism = int(workers or max(2, os.cpu_count() or 1))
        if self.parallelism < 1:
            raise ValueError("workers must be >= 1")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.parallelism, thread_name_prefix="ramgrid-task"
        )
        self._cancel = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, where: str | None = None, name: str = "task") -> Any:
        return self._pool.submit(fn, *args)

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        return concurrent.futures.as_completed(list(futures))

    def cancel(self, futures: Iterable[Any]) -> None:
        self._cancel.set()
        for f in futures:
            f.cancel()

    @property
    def cancel_event(self) -> threading.Event:
        return self._cancel

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ThreadEngine(workers={self.parallelism})"


def _local_servers_here(servers: Sequence[str]) -> list[str]:
    """Run on a Dask worker: the members of `servers` local to its host."""
    from ramgrid.hosts import local_servers

    return local_servers(servers)


# The name under which `ramgrid.dask` registers its scheduler plugin, which knows the worker beside each server it
# started. Looked up by name, not imported: the engines sit below the handles that module is built on.
DASK_COORDINATOR = "ramgrid-coordinator"


def _owners_on_scheduler(dask_scheduler: Any) -> dict[str, str]:
    plugin = dask_scheduler.plugins.get(DASK_COORDINATOR)
    return {} if plugin is None or getattr(plugin, "stopped", True) else dict(plugin.owners())


def _started_beside(client: Any, servers: Sequence[str]) -> dict[str, str]:
    """Server -> worker for the members of `servers` that `ramgrid.dask` started beside a worker of this cluster."""
    try:
        beside = client.run_on_scheduler(_owners_on_scheduler)
    except Exception:  # noqa: BLE001 - a scheduler without ramgrid installed runs no grid of ramgrid.dask's
        return {}
    return {s: w for s, w in beside.items() if s in servers}


def pair_servers(local: dict[str, list[str]], servers: Sequence[str]) -> dict[str, str]:
    """The pairing rule (module docstring): `local` maps each worker address to the servers local to it; returns
    server address -> worker address for every server local to some worker."""
    workers = sorted(local)
    load = dict.fromkeys(workers, 0)
    out: dict[str, str] = {}
    for s in servers:
        cands = [w for w in workers if s in local[w]]
        if not cands:
            continue
        w = min(cands, key=lambda w: (load[w], workers.index(w)))
        out[s] = w
        load[w] += 1
    return out


class DaskEngine:
    """Runs tasks on a `distributed.Client`'s workers. A task submitted with `where=server` is pinned to the worker
    paired with that server, with other workers allowed (so a dead worker's tasks are retried elsewhere by Dask)."""

    def __init__(self, client: Any, servers: Sequence[str] | None = None) -> None:
        self.client = client
        self._tag = uuid.uuid4().hex[:12]
        self._n = 0
        self._lock = threading.Lock()
        info = client.scheduler_info()
        workers = info.get("workers", {})
        self.parallelism = max(1, sum(int(w.get("nthreads", 1)) for w in workers.values()))
        self.pairing: dict[str, str] = {}
        if servers:
            local = client.run(_local_servers_here, list(servers))
            self.pairing = pair_servers({w: list(v) for w, v in local.items()}, list(servers))
            self.pairing.update(_started_beside(client, servers))

    def submit(self, fn: Callable[..., Any], /, *args: Any, where: str | None = None, name: str = "task") -> Any:
        with self._lock:
            self._n += 1
            key = f"ramgrid-{name}-{self._tag}-{self._n}"
        worker = self.pairing.get(where) if where is not None else None
        if worker is None:
            return self.client.submit(fn, *args, key=key, pure=False)
        return self.client.submit(fn, *args, key=key, pure=False, workers=[worker], allow_other_workers=True)

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        from distributed import as_completed

        return iter(as_completed(list(futures)))

    def cancel(self, futures: Iterable[Any]) -> None:
        self.client.cancel(list(futures))

    @property
    def cancel_event(self) -> None:
        return None

    def close(self) -> None:
        """The Dask client belongs to the caller: nothing to close."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DaskEngine({self.client!r}, paired={len(self.pairing)})"


def engine_for(
    dask_client: Any = None, workers: int | None = None, servers: Sequence[str] | None = None
) -> ThreadEngine | DaskEngine:
    """The engine a job runs on: Dask when a `distributed.Client` is given (paired with `servers`), else threads."""
    if dask_client is not None:
        return DaskEngine(dask_client, servers)
    return ThreadEngine(workers)
