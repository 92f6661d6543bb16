"""Several hosts, as docs/deploy.md runs them (issue 13, item 5): one server per host, each started with the systemd
unit's command and the example environment file, from one spec file; `ramgrid cluster status` against them; a
client that knows one member; each host's Dask worker finding its own server.

Hosts stand as distinct loopback addresses (127.0.0.2-4, the same port on each, as on real hosts), and, where the
test runs as root, as network namespaces of their own on a private bridge (non-loopback addresses: the token is
required there; `_hosts_scenario.py`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ramgrid._native", reason="build it with `maturin develop --release`")

import _hosts
import ramgrid
from ramgrid.exceptions import AuthError, RamgridError

pytestmark = pytest.mark.timeout(150)

TOKEN = "hosts-test-token"
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PKG_ROOT = str(Path(ramgrid.__file__).resolve().parents[1])


def _port_free_on_all() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((HOSTS[0], 0))
            port = s.getsockname()[1]
        try:
            for h in HOSTS[1:]:
                with socket.socket() as s:
                    s.bind((h, port))
        except OSError:
            continue
        return int(port)
    raise RuntimeError("no port free on every test host address")


class Hosts:
    def __init__(self, server_bin: Path, tmp: Path) -> None:
        port = _port_free_on_all()
        self.addrs = [f"{h}:{port}" for h in HOSTS]
        self.tmp = tmp
        self.spec = tmp / "spec"
        self.spec.write_text("# the cluster\n" + "".join(f"{a}\n" for a in self.addrs))
        self.bin = server_bin
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for a in self.addrs:
                self.start(a)
            for a in self.addrs:
                _hosts.wait_port(a, self.procs[a])
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        for p in self.procs.values():
            _hosts.stop(p, signal.SIGKILL)

    def env(self, addr: str) -> dict[str, str]:
        data = self.tmp / f"data-{addr.replace(':', '-')}"
        return _hosts.host_env(addr, self.addrs, self.spec, data, TOKEN)

    def start(self, addr: str) -> None:
        self.procs[addr] = _hosts.start(self.bin, self.env(addr), self.tmp / f"{addr.replace(':', '-')}.log")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.tmp.glob("*.log"))


@pytest.fixture
def hosts(ramgrid_server_bin: Path, tmp_path: Path) -> Iterator[Hosts]:
    h = Hosts(ramgrid_server_bin, tmp_path)
    try:
        yield h
    finally:
        h.kill()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["RAMGRID_TOKEN"] = TOKEN
    return subprocess.run(
        [sys.executable, "-m", "ramgrid.cli", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _settled(g: ramgrid.Grid, n: int) -> bool:
    try:
        st = g.status()
    except RamgridError:
        return False
    return (
        len(st) == n
        and all(s.get("ok") for s in st)
        and all(int(s.get("pending_partitions") or 0) == 0 for s in st)
        and all(int(s.get("catalog_learned") or 0) == 1 for s in st)
        and all(str(s.get("meta_leader", "none")) != "none" and s.get("quorum") == "ok" for s in st)
        and all(int(s.get("meta_members") or 0) == n for s in st)
        and len({s.get("epoch") for s in st}) == 1
    )


def test_servers_started_from_the_unit_serve_one_cluster_that_survives_a_host_restart(hosts: Hosts) -> None:
    # The unit starts the binary with no flags: every setting comes from the environment file.
    assert _hosts.unit_command("/x") == ["/x"]
    # A client needs one member and the token; it learns the rest of the spec from the servers.
    g = ramgrid.connect([hosts.addrs[1]], token=TOKEN)
    _hosts.until("the cluster forms", lambda: _settled(g, 3), 60)
    assert g.servers == hosts.addrs
    assert g.local_servers() == hosts.addrs  # every loopback address is this machine's
    # `stats` (memcached text protocol) authenticates with the token first; it used to fail on any server with one.
    stats = g.stats()
    assert [s["server"] for s in stats] == hosts.addrs and all("tables" in s for s in stats), stats

    out = _cli("cluster", "status", "--spec", str(hosts.spec))
    assert out.returncode == 0, out.stdout + out.stderr + hosts.logs()
    lines = out.stdout.splitlines()
    assert lines[0].startswith("metadata group: leader "), out.stdout
    assert (
        lines[1]
        == f"3 of 3 voters answer, leader {lines[0].split()[3].rstrip(',')}; tolerates 1 more failure; full service"
    )
    assert [ln.split("\t")[0] for ln in lines[2:5]] == hosts.addrs, out.stdout
    assert "leader" in out.stdout and "pending partitions 0" in out.stdout

    # A durable table with two replicas, loaded as a sealed version.
    t = g.create_table("deploy", partitions=16, replication=2, value_type="f64", durability="snapshot")
    keys = np.arange(20_000, dtype=np.int64)
    with t.new_version() as w:
        w.put_many(keys, keys * 0.5)
    assert np.array_equal(t.get_many(keys), keys * 0.5)

    # A host's server dies (systemd restarts it with the same command): reads stay exact meanwhile and after.
    victim = hosts.addrs[2]
    hosts.procs[victim].kill()
    hosts.procs[victim].wait(timeout=10)
    assert np.array_equal(t.get_many(keys), keys * 0.5)
    hosts.start(victim)
    _hosts.wait_port(victim, hosts.procs[victim])
    _hosts.until("the restarted host is back and repaired", lambda: _settled(g, 3), 90)
    assert g.servers == hosts.addrs
    # The other replica holder of some partitions goes: what is read now comes from the restarted host too.
    other = hosts.addrs[0]
    assert _hosts.stop(hosts.procs[other]) == 0  # SIGTERM: a clean stop, exit status 0
    assert np.array_equal(t.get_many(keys), keys * 0.5), hosts.logs()


def test_the_token_is_required_and_the_local_server_override_is_honoured(
    hosts: Hosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = ramgrid.connect(hosts.addrs, token=TOKEN)
    _hosts.until("the cluster forms", lambda: _settled(g, 3), 60)
    with pytest.raises(AuthError):
        ramgrid.connect(hosts.addrs, token="wrong-token").tables()
    bad = _cli("cluster", "status", "--spec", ",".join(hosts.addrs), "--token", "wrong-token")
    assert bad.returncode != 0
    monkeypatch.setenv("RAMGRID_LOCAL_SERVERS", hosts.addrs[1])
    assert g.local_servers() == [hosts.addrs[1]]


def test_each_hosts_worker_finds_its_own_server_in_network_namespaces(ramgrid_server_bin: Path, tmp_path: Path) -> None:
    """Hosts as network namespaces (root only): one server and one Dask worker per host, the scheduler and the
    driver on a hub; each worker's `local_servers()` is exactly its own host's server."""
    from test_partition import _netns_possible

    why = _netns_possible()
    if why:
        pytest.skip(why)
    scenario = Path(__file__).with_name("_hosts_scenario.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["PYTHONPATH"] = os.pathsep.join([PKG_ROOT, str(scenario.parent)])
    out = subprocess.run(
        [sys.executable, str(scenario), str(ramgrid_server_bin), str(tmp_path), f"rh{os.getpid() % 100000}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in tmp_path.glob("*.log"))
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{logs}"
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(result, indent=1))
    assert len(result["local"]) == 3 and result["local"] == result["expected"], result
    assert result["hub_local"] == [], result  # the driver's host runs no server
    assert result["reads_exact"], result
    assert result["no_token_refused"], result
    assert result["status_rc"] == 0, result


def test_hosts_restarted_with_the_first_spec_file_after_a_removal_follow_the_cluster(hosts: Hosts) -> None:
    # The spec file only starts a cluster; a host restarted later (same unit, same file) must take the spec the
    # cluster has since agreed on, not the file's. Before this was fixed, the restarted server installed the stale
    # file and every read failed with "cluster spec kept changing".
    g = ramgrid.connect(hosts.addrs, token=TOKEN)
    _hosts.until("the cluster forms", lambda: _settled(g, 3), 60)
    t = g.create_table("moved", partitions=8, replication=2, value_type="i64", durability="snapshot")
    keys = np.arange(5_000, dtype=np.int64)
    with t.new_version() as w:
        w.put_many(keys, keys)
    removed = hosts.addrs[2]
    g.remove_server(removed)
    _hosts.stop(hosts.procs[removed])
    members = hosts.addrs[:2]
    assert g.servers == members
    for a in [members[0], removed]:  # a member restarted, and the removed host started again by its unit
        _hosts.stop(hosts.procs[a])
        hosts.start(a)
        _hosts.wait_port(a, hosts.procs[a])
    _hosts.until("the restarted member is repaired", lambda: _settled(g, 2), 60)
    # Both members run one spec of exactly them (a member that took long to restart may have been failed over and
    # come back, which changes the order, not the members).
    specs = {s["servers"] for s in g.status()}
    assert len(specs) == 1 and sorted(specs.pop().split(",")) == sorted(members)
    assert np.array_equal(t.get_many(keys), keys), hosts.logs()
    _hosts.stop(hosts.procs[members[1]])  # what is read now comes from the restarted member alone
    assert np.array_equal(t.get_many(keys), keys), hosts.logs()
    assert "the --cluster-spec file is not installed" in (hosts.tmp / f"{removed.replace(':', '-')}.log").read_text()
