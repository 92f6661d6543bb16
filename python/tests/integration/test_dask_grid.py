"""`ramgrid.dask` on a LocalCluster of worker processes: the servers start beside the workers, tasks find the grid
with `get_grid()`, the grid follows `scale` and `retire_workers`, survives worker and server restarts, and closing
the cluster leaves no server process, socket or shared-memory file behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ramgrid._native", reason="ramgrid._native is not importable: build it with `make develop`")
distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install '.[dask]')")

import ramgrid
import ramgrid.dask
from _until import until
from ramgrid.engines import DaskEngine

REPO_ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(150)
# Short failure timeout: a server killed in a test is failed over in 2 s rather than 5.
FAST = ("--failure-timeout-ms", "2000")


@contextmanager
def cluster(n: int, **options: Any) -> Iterator[tuple[Any, Any]]:
    with (
        distributed.LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
            **options,
        ) as c,
        distributed.Client(c) as client,
    ):
        yield c, client


def members(client: Any) -> dict[str, int]:
    """Server address -> pid, as the coordinator on the scheduler knows them."""

    def run(dask_scheduler: Any) -> dict[str, int]:
        plugin = dask_scheduler.plugins.get(ramgrid.dask.COORDINATOR)
        return {} if plugin is None else {m.address: m.pid for m in plugin.members.values()}

    return dict(client.run_on_scheduler(run))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def shm_socket(addr: str) -> Path:
    host, port = addr.rsplit(":", 1)
    base = Path(os.environ["XDG_RUNTIME_DIR"]) / "ramgrid" if os.environ.get("XDG_RUNTIME_DIR") else None
    return (base or Path(f"/tmp/ramgrid-{os.getuid()}")) / f"shm-{host}-{port}.sock"


def dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def dashboard_json(url: str, token: str | None) -> tuple[int, Any]:
    """(HTTP status, parsed JSON or None) of a dashboard API request, with `token` as its Bearer header."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None


# Tasks (run on the workers; they take no grid handle).


def write_task(name: str, keys: np.ndarray) -> int:
    ramgrid.dask.get_grid().table(name).put_many(keys, keys * 0.5)
    return len(keys)


def read_task(name: str, keys: np.ndarray) -> float:
    return float(ramgrid.dask.get_grid().table(name).get_many(keys).sum())


def local_task() -> list[str]:
    return ramgrid.dask.get_grid().local_servers()


def test_servers_follow_the_workers_and_leave_nothing_behind() -> None:
    shm_before = dev_shm()
    seen: dict[str, int] = {}
    keys = np.arange(20_000, dtype=np.int64)
    expected = float((keys * 0.5).sum())
    with cluster(2) as (c, client):
        grid = ramgrid.dask.start(client, memory="64MiB", threads=1, replication=2, per="worker", extra_args=FAST)
        seen.update(members(client))
        assert len(seen) == 2 and sorted(grid.servers) == sorted(seen)
        assert all(alive(p) for p in seen.values())
        pairs = ramgrid.dask.owners(client)
        assert sorted(pairs) == sorted(seen) and len(set(pairs.values())) == 2  # one server beside each worker
        assert DaskEngine(client, grid.servers).pairing == pairs  # jobs run a server's tasks beside it

        # Tasks write and read through get_grid(); the driver reads the same values.
        t = grid.create_table("scores", partitions=8, value_type="f64")
        assert t.describe()["replication"] == 2  # the grid's default replication
        chunks = np.array_split(keys, 8)
        assert sum(client.gather(client.map(write_task, ["scores"] * 8, chunks, pure=False))) == len(keys)
        assert sum(client.gather(client.map(read_task, ["scores"] * 8, chunks, pure=False))) == expected
        assert float(t.get_many(keys).sum()) == expected
        for w in client.scheduler_info()["workers"]:  # every worker has its server on its host
            assert client.submit(local_task, workers=[w], pure=False).result()

        # Each server's dashboard shows the whole grid, behind the grid's token (in the URL's fragment).
        url = ramgrid.dask.get_grid(client).dashboard_url
        assert url is not None and "#token=" in url
        base, token = url.split("#token=")
        assert dashboard_json(base + "api/cluster", None)[0] == 401
        code, status = dashboard_json(base + "api/cluster", urllib.parse.unquote(token))
        assert code == 200 and sorted(m["addr"] for m in status["members"]) == sorted(seen)

        # Workers added by scale() get servers that join (one at a time) and take partitions.
        c.scale(4)
        client.wait_for_workers(4, timeout=60)
        until("four servers", lambda: len(members(client)) == 4)
        new = set(members(client)) - set(seen)
        seen.update(members(client))
        until("the new servers in the spec", lambda: new <= set(ramgrid.dask.get_grid(client).servers))
        holders = {a for replicas in ramgrid.dask.get_grid(client).table("scores").owners() for a in replicas}
        assert new <= holders
        assert float(t.get_many(keys).sum()) == expected

        # A scale-down (SpecCluster retires by name) moves the leaving server's partitions off first.
        c.scale(3)
        until("three servers", lambda: len(members(client)) == 3 and len(ramgrid.dask.get_grid(client).servers) == 3)
        gone = (set(seen) - set(members(client))).pop()
        until("the scaled-down server's exit", lambda: not alive(seen[gone]), 30)
        assert not any(gone in r for r in ramgrid.dask.get_grid(client).table("scores").owners())
        assert float(ramgrid.dask.get_grid(client).table("scores").get_many(keys).sum()) == expected

        # Retiring a worker moves its server's partitions off before the server stops.
        leaving, worker = min(ramgrid.dask.owners(client).items())
        client.retire_workers([worker])
        assert leaving not in members(client)
        until("the retired server's exit", lambda: not alive(seen[leaving]), 30)
        after = ramgrid.dask.get_grid(client)
        assert leaving not in after.servers and len(after.servers) == 2
        assert not any(leaving in r for r in after.table("scores").owners())
        assert float(after.table("scores").get_many(keys).sum()) == expected
        assert sum(client.gather(client.map(read_task, ["scores"] * 8, chunks, pure=False))) == expected

        # A nanny that closes on its own (as `dask worker` does on SIGTERM) moves its server's partitions off too.
        closing, worker = min(ramgrid.dask.owners(client).items())
        [nanny] = [n for n in c.workers.values() if n.worker_address == worker]
        c.sync(nanny.close)
        assert not alive(seen[closing]) and list(members(client)) == [a for a in after.servers if a != closing]
        last = ramgrid.dask.get_grid(client)
        assert last.servers == list(members(client))
        assert float(last.table("scores").get_many(keys).sum()) == expected
        addresses = list(seen)
    # Closing the cluster stopped every server; nothing of theirs is left.
    until("every server's exit", lambda: not any(alive(p) for p in seen.values()), 30)
    assert not [a for a in addresses if shm_socket(a).exists()]
    # ramgrid's segments are memfds, never files; Python's multiprocessing semaphores may come and go meanwhile.
    assert not {f for f in dev_shm() - shm_before if not f.startswith("sem.mp-")}


def test_worker_and_server_restarts_keep_the_grid(tmp_path: Path) -> None:
    keys = np.arange(5_000, dtype=np.int64)
    expected = float((keys * 0.5).sum())
    with cluster(2) as (_, client):
        grid = ramgrid.dask.start(
            client, memory="64MiB", threads=1, replication=2, per="worker", extra_args=FAST, data_dir=tmp_path
        )
        # Each server keeps its durable tables in a directory of its own, named after its host and worker.
        assert sorted(p.name for p in tmp_path.iterdir()) == ["127.0.0.1-0", "127.0.0.1-1"]
        t = grid.create_table("r", partitions=8, value_type="f64", durability="snapshot")
        with t.new_version() as v:
            v.put_many(keys, keys * 0.5)
        before = members(client)

        # Workers restarted by their nannies keep their servers (and data); their tasks find the grid again.
        client.restart()
        assert members(client) == before
        assert client.submit(read_task, "r", keys, pure=False).result() == expected

        # A server that dies is restarted by its nanny on its address and rejoins; reads stay exact.
        addr, pid = min(before.items())
        os.kill(pid, signal.SIGKILL)
        until("the restarted server", lambda: members(client).get(addr, pid) != pid)
        until(
            "the group whole again",
            lambda: (
                all(s.get("ok") and s.get("pending_partitions") == 0 for s in grid.status())
                and addr in ramgrid.dask.get_grid(client).servers
            ),
        )
        assert float(grid.table("r").get_many(keys).sum()) == expected
        assert client.submit(read_task, "r", keys, pure=False).result() == expected
        pids = list(members(client).values())
        ramgrid.dask.stop(client)
        until("the servers' exit", lambda: not any(alive(p) for p in pids), 30)
        with pytest.raises(ramgrid.RamgridError, match="no ramgrid grid"):
            ramgrid.dask.get_grid(client)
        with pytest.raises(ramgrid.RamgridError, match="no ramgrid grid"):
            client.submit(local_task, pure=False).result()


def test_one_server_per_host_is_handed_over_when_its_worker_retires() -> None:
    # On one machine per="host" means one server for every worker; retiring the worker beside it hands the server's
    # place (and data) to a new server beside a worker that stays.
    keys = np.arange(2_000, dtype=np.int64)
    with cluster(2) as (_, client):
        grid = ramgrid.dask.start(client, memory="64MiB", threads=1)
        [(addr, pid)] = members(client).items()
        grid.create_table("h", partitions=4, value_type="f64").put_many(keys, keys * 0.5)
        client.retire_workers([ramgrid.dask.owners(client)[addr]])
        [(new, _)] = members(client).items()
        assert new != addr and ramgrid.dask.get_grid(client).servers == [new]
        until("the old server's exit", lambda: not alive(pid), 30)
        assert float(ramgrid.dask.get_grid(client).table("h").get_many(keys).sum()) == float((keys * 0.5).sum())


def test_closing_a_client_that_owns_its_cluster_stops_the_servers() -> None:
    client = distributed.Client(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0"
    )
    pids: list[int] = []
    try:
        ramgrid.dask.start(client, memory="32MiB", threads=1, per="worker")
        pids += members(client).values()
        assert len(pids) == 2 and all(alive(p) for p in pids)
    finally:
        client.close()  # closes the LocalCluster it made, and with it the servers
    until("the servers' exit", lambda: not any(alive(p) for p in pids), 30)


def test_bad_starts_are_refused_and_change_nothing() -> None:
    with cluster(1) as (_, client):
        with pytest.raises(ValueError, match="per must be"):
            ramgrid.dask.start(client, per="rack")
        with pytest.raises(ValueError, match="fixed port"):
            ramgrid.dask.start(client, per="worker", port=7000)
        assert members(client) == {}
        ramgrid.dask.start(client, memory="32MiB", threads=1)
        with pytest.raises(ValueError, match="runs on this cluster already"):
            ramgrid.dask.start(client)
        assert len(members(client)) == 1
        ramgrid.dask.stop(client)
        # A server that cannot start (a flag the server refuses) fails start() and leaves nothing running.
        with pytest.raises(ramgrid.RamgridError, match="starting the ramgrid servers failed"):
            ramgrid.dask.start(client, memory="32MiB", threads=1, extra_args=("--no-such-flag",))
        assert members(client) == {}
    with (
        distributed.LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as c,
        distributed.Client(c) as client,
        pytest.raises(ValueError, match="without nannies"),
    ):
        ramgrid.dask.start(client)


def test_dask_cluster_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "dask_cluster.py"), "--workers", "2", "--keys", "20000"],
        capture_output=True,
        check=False,
        text=True,
        timeout=140,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.rstrip().endswith("ok")
