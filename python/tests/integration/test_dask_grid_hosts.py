"""`ramgrid.dask` across hosts (root only): the Dask scheduler and this test's driver in a hub network namespace, each
worker host in a namespace of its own, joined by a bridge, so every host has its own address. The driver starts the
grid, loads a table, reads it from tasks, runs a MapReduce job, adds a host, retires one, kills one, and closes the
cluster; the test checks each step's outcome and that no process is left in any namespace.

    python test_dask_grid_hosts.py drive PREFIX LOGDIR     (run by the test inside the hub namespace)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _until import until

SCHEDULER_IP = "10.213.0.100"
HOSTS = 4
FAST = ("--failure-timeout-ms", "2000")


def _host_ip(i: int) -> str:
    return f"10.213.0.{i + 1}"


def _pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True, text=True, timeout=10)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_grid_follows_dask_workers_on_hosts_of_their_own(tmp_path: Path) -> None:
    pytest.importorskip("ramgrid._native", reason="ramgrid._native is not importable: build it with `make develop`")
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    from test_partition import _build, _netns_possible, _teardown

    why = _netns_possible()
    if why:
        pytest.skip(why)
    prefix = f"rd{os.getpid() % 100000}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)])
    try:
        _build(prefix, HOSTS)
        out = subprocess.run(
            ["ip", "netns", "exec", f"{prefix}hub", sys.executable, __file__, "drive", prefix, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=270,
            check=False,
        )
        left = {ns: _pids(ns) for ns in [f"{prefix}s{i}" for i in range(HOSTS)] + [f"{prefix}hub"]}
    finally:
        _teardown(prefix, HOSTS)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(tmp_path.glob("*.log")))
    # The driver's own traceback, ahead of the Dask client's noise as it closes.
    tb = out.stderr[out.stderr.find("Traceback") :][:4000] if "Traceback" in out.stderr else out.stderr[-4000:]
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{tb}\n{logs}"
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(res, indent=1))
    # One server per host, on the host's own address, beside that host's worker.
    assert sorted(a.rsplit(":", 1)[0] for a in res["servers"]) == [_host_ip(i) for i in range(3)], res
    assert all(s.rsplit(":", 1)[0] == w.split("//")[1].rsplit(":", 1)[0] for s, w in res["owners"].items()), res
    assert all(v == [k] for k, v in res["local"].items()), res  # each worker's local server is its host's own
    assert res["load_rows"] == res["keys"] and res["task_reads_exact"], res
    assert res["wordcount_exact"], res
    # The added host's server joined and took partitions; the retired host's partitions moved off first.
    assert res["added"].rsplit(":", 1)[0] == _host_ip(3) and res["added_holds"] > 0, res
    assert res["retired"] not in res["after_retire"] and res["reads_after_retire_exact"], res
    assert res["retired_host_processes"] == [], res
    # A killed host is failed over; reads stay exact on the survivors (replication 2).
    assert res["killed"] not in res["after_kill"] and res["reads_after_kill_exact"], res
    # Closing the cluster left no process in any namespace, no server socket (but the killed one's: SIGKILL gives
    # it no chance; the next server on that address replaces it), and nothing in /dev/shm but Python's
    # multiprocessing semaphores (the killed host's nanny leaks its own; any process on this machine may make them).
    assert res["processes_after_close"] == {}, res
    assert left == {ns: [] for ns in left}, left
    assert res["sockets_left"] == [], res
    assert [f for f in res["dev_shm_new"] if not f.startswith("sem.mp-")] == [], res


# The driver, inside the hub namespace.


def _spawn(ns: str | None, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, *args] if ns is None else ["ip", "netns", "exec", ns, sys.executable, *args]
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _worker(prefix: str, i: int, scheduler: str, logdir: Path) -> subprocess.Popen[bytes]:
    args = ["-m", "distributed.cli.dask_worker", scheduler, "--host", _host_ip(i), "--name", f"host{i}"]
    args += ["--nthreads", "1", "--no-dashboard", "--death-timeout", "60"]
    return _spawn(f"{prefix}s{i}", args, logdir / f"worker{i}.log")


def _shm_socket(addr: str) -> Path:
    """The server's shared-memory socket (docs/shared-memory.md, `--shm-dir auto`)."""
    host, port = addr.rsplit(":", 1)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) / "ramgrid" if xdg else Path(f"/tmp/ramgrid-{os.getuid()}")
    return base / f"shm-{host}-{port}.sock"


def _read_sum(name: str, n: int) -> int:
    import numpy as np
    import ramgrid.dask

    return int(ramgrid.dask.get_grid().table(name).get_many(np.arange(n, dtype=np.int64)).sum())


def _local() -> list[str]:
    import ramgrid.dask

    return ramgrid.dask.get_grid().local_servers()


def drive(prefix: str, logdir: Path) -> int:
    import numpy as np
    import ramgrid.dask
    from distributed import Client
    from ramgrid import mapreduce
    from ramgrid.load import load_table
    from ramgrid.mapreduce.wordcount import count_block

    scheduler = f"tcp://{SCHEDULER_IP}:8786"
    shm_before = set(os.listdir("/dev/shm"))
    procs = [
        _spawn(
            None,
            ["-m", "distributed.cli.dask_scheduler", "--host", SCHEDULER_IP, "--port", "8786", "--no-dashboard"],
            logdir / "scheduler.log",
        )
    ]
    res: dict[str, Any] = {}
    try:
        procs += [_worker(prefix, i, scheduler, logdir) for i in range(3)]
        client = Client(scheduler, timeout=60)
        client.wait_for_workers(3, timeout=90)

        t0 = time.perf_counter()
        grid = ramgrid.dask.start(client, memory="64MiB", threads=1, replication=2, extra_args=FAST)
        res["start_s"] = round(time.perf_counter() - t0, 2)
        res["servers"] = grid.servers
        seen = set(grid.servers)
        res["owners"] = ramgrid.dask.owners(client)
        res["local"] = {s: client.submit(_local, workers=[w], pure=False).result() for s, w in res["owners"].items()}

        # A load through the workers, then reads from tasks.
        n = 20_000
        src = logdir / "kv.tsv"
        src.write_text("".join(f"{k}\t{k * 3}\n" for k in range(n)))
        report = load_table(
            grid, "kv", src, key_type="int", value_type="i64", replication=2, dask_client=client, progress=False
        )
        res["keys"], res["load_rows"] = n, int(report.rows)
        want = 3 * n * (n - 1) // 2
        sums = [client.submit(_read_sum, "kv", n, workers=[w], pure=False).result() for w in res["owners"].values()]
        res["task_reads_exact"] = sums == [want] * len(sums)

        # A MapReduce job on the workers.
        words = logdir / "words.txt"
        lines = [f"w{i % 7} w{i % 3} ramgrid" for i in range(3000)]
        words.write_text("\n".join(lines) + "\n")
        job = mapreduce.run(grid, words, count_block, "sum", vectorised=True, dask_client=client, progress=False)
        res["wordcount_exact"] = dict(job.result) == dict(Counter(" ".join(lines).split()))

        # A host added: its server joins and takes partitions.
        procs.append(_worker(prefix, 3, scheduler, logdir))
        client.wait_for_workers(4, timeout=90)

        def on_new_host() -> list[str]:
            return [s for s in ramgrid.dask.get_grid(client).servers if s.startswith(_host_ip(3) + ":")]

        added = until("a server on the new host", on_new_host, 90)[0]
        res["added"] = added
        seen.add(added)
        res["added_holds"] = sum(added in r for r in ramgrid.dask.get_grid(client).table("kv").owners())

        # A host retired: its partitions move off before its server stops; its processes all end.
        owners = ramgrid.dask.owners(client)
        retired = next(s for s in owners if s.startswith(_host_ip(0) + ":"))
        res["retired"] = retired
        client.retire_workers([owners[retired]])
        res["after_retire"] = ramgrid.dask.get_grid(client).servers
        res["reads_after_retire_exact"] = int(grid.table("kv").get_many(np.arange(n)).sum()) == want
        deadline = time.monotonic() + 60
        while _pids(f"{prefix}s0") and time.monotonic() < deadline:
            time.sleep(0.2)
        res["retired_host_processes"] = _pids(f"{prefix}s0")

        # A host killed (every process in its namespace): the group (three servers now) fails its server over.
        killed = next(s for s in ramgrid.dask.get_grid(client).servers if s.startswith(_host_ip(1) + ":"))
        res["killed"] = killed
        for pid in _pids(f"{prefix}s1"):
            os.kill(pid, 9)

        def failed_over() -> bool:
            st = [s for s in grid.status() if s.get("ok")]
            return bool(st) and all(killed not in str(s.get("servers")) for s in st)

        until("the killed host's fail-over", failed_over, 60)
        # Then the re-replication: until it is done, some partitions may be refused as REPAIRING.
        t_kill = time.monotonic()
        until("the repair", lambda: all(s.get("pending_partitions") == 0 for s in grid.status() if s.get("ok")), 60)
        res["repaired_after_failover_s"] = round(time.monotonic() - t_kill, 2)
        res["after_kill"] = next(s for s in grid.status() if s.get("ok"))["servers"]
        survivor = next(w for s, w in ramgrid.dask.owners(client).items() if s != killed)
        got = client.submit(_read_sum, "kv", n, workers=[survivor], pure=False).result()
        res["reads_after_kill_exact"] = got == want and int(grid.table("kv").get_many(np.arange(n)).sum()) == want

        # Close: the scheduler and every worker go, and with them every server.
        client.shutdown()
        client.close()
        hosts = [f"{prefix}s{i}" for i in range(HOSTS)]
        until("every process in the host namespaces to end", lambda: not any(_pids(ns) for ns in hosts), 60)
        res["processes_after_close"] = {ns: _pids(ns) for ns in hosts if _pids(ns)}
        res["dev_shm_new"] = sorted(set(os.listdir("/dev/shm")) - shm_before)
        res["sockets_left"] = [a for a in seen if a != killed and _shm_socket(a).exists()]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    assert sys.argv[1] == "drive", sys.argv
    sys.exit(drive(sys.argv[2], Path(sys.argv[3])))
