"""Hosts as network namespaces (test_hosts.py, root only): one ramgrid server and one Dask worker per host namespace,
the Dask scheduler and this driver in a hub namespace joined to them by a bridge. Prints one JSON line of results.

    python _hosts_scenario.py SERVER_BIN LOGDIR PREFIX      (in the root namespace; builds and removes the namespaces)
    python _hosts_scenario.py drive SPEC_FILE SCHEDULER     (run by the first form inside the hub namespace)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TOKEN = "hosts-namespace-token"
N = 3
PORT = 7001


def _addr(i: int) -> str:
    return f"10.213.0.{i + 1}:{PORT}"


def _wait(addr: str, timeout: float, netns: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    host, port = addr.rsplit(":", 1)
    while True:
        if netns is None:
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
                return
            except OSError:
                pass
        else:
            probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=0.5).close()"
            probed = subprocess.run(
                ["ip", "netns", "exec", netns, sys.executable, "-c", probe], check=False, capture_output=True
            )
            if probed.returncode == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{addr} not reachable")
        time.sleep(0.2)


def setup_and_run(server_bin: str, logdir: Path, prefix: str) -> int:
    import _hosts
    from test_partition import _build, _teardown

    hub = f"{prefix}hub"
    scheduler = "10.213.0.100:8786"
    spec = logdir / "spec"
    spec.write_text("".join(f"{_addr(i)}\n" for i in range(N)))
    procs: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    _build(prefix, N)
    try:
        addrs = [_addr(i) for i in range(N)]
        for i in range(N):
            host_env = _hosts.host_env(addrs[i], addrs, spec, logdir / f"data{i}", TOKEN)
            procs.append(_hosts.start(server_bin, host_env, logdir / f"server{i}.log", netns=f"{prefix}s{i}"))
        with open(logdir / "scheduler.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", hub, sys.executable, "-m", "distributed.cli.dask_scheduler",
                     "--host", "10.213.0.100", "--port", "8786", "--no-dashboard"],
                    env=env, stdout=log, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        _wait(scheduler, 60, netns=hub)
        for i in range(N):
            with open(logdir / f"worker{i}.log", "ab") as log:
                procs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", f"{prefix}s{i}", sys.executable, "-m", "distributed.cli.dask_worker",
                         f"tcp://{scheduler}", "--host", f"10.213.0.{i + 1}", "--nthreads", "1", "--no-nanny",
                         "--no-dashboard"],
                        env=env, stdout=log, stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
        driver = subprocess.run(
            ["ip", "netns", "exec", hub, sys.executable, __file__, "drive", str(spec), scheduler],
            env=env,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        sys.stderr.write(driver.stderr)
        sys.stdout.write(driver.stdout)
        return driver.returncode
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _teardown(prefix, N)


def _local_servers(spec_file: str) -> list[str]:
    import ramgrid

    return ramgrid.connect(spec_file, token=TOKEN).local_servers()


def _read_exact(spec_file: str, n: int) -> bool:
    import numpy as np
    import ramgrid

    keys = np.arange(n, dtype=np.int64)
    return bool(np.array_equal(ramgrid.connect(spec_file, token=TOKEN).table("hosts").get_many(keys), keys * 2))


def drive(spec_file: str, scheduler: str) -> int:
    import numpy as np
    import ramgrid
    from distributed import Client
    from ramgrid.exceptions import AuthError, RamgridError

    addrs = [_addr(i) for i in range(N)]
    for a in addrs:
        _wait(a, 30)
    g = ramgrid.connect(spec_file, token=TOKEN)
    deadline = time.monotonic() + 60
    while True:
        try:
            st = g.status()
            if all(s.get("ok") for s in st) and any(str(s.get("meta_leader", "none")) != "none" for s in st):
                break
        except RamgridError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not form")
        time.sleep(0.2)
    n = 30_000
    t = g.create_table("hosts", partitions=12, replication=2, value_type="i64")
    keys = np.arange(n, dtype=np.int64)
    t.put_many(keys, keys * 2)
    try:
        ramgrid.connect(spec_file).tables()
        no_token_refused = False
    except AuthError:
        no_token_refused = True
    with Client(f"tcp://{scheduler}", timeout=30) as dc:
        dc.wait_for_workers(N, timeout=60)
        local = dc.run(_local_servers, spec_file)
        reads = dc.run(_read_exact, spec_file, n)
    # Each worker listens on its host's address: that host's server is the one it must find, alone.
    expected = {w: [f"{w.split('//')[1].rsplit(':', 1)[0]}:{PORT}"] for w in local}
    status = subprocess.run(
        [sys.executable, "-m", "ramgrid.cli", "cluster", "status", "--spec", spec_file, "--token", TOKEN],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print(
        json.dumps(
            {
                "local": local,
                "expected": expected,
                "reads_exact": all(reads.values()) and len(reads) == N,
                "no_token_refused": no_token_refused,
                "status_rc": status.returncode,
                "status": status.stdout,
                "hub_local": g.local_servers(),
            }
        )
    )
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "drive":
        return drive(argv[1], argv[2])
    return setup_and_run(argv[0], Path(argv[1]), argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
