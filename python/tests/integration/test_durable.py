"""Durable tables (docs/durability.md): a server started with --data-dir writes each sealed
version of a durability="snapshot" table to disk before it acknowledges the seal, and a server killed with SIGKILL
and started again on the same address with the same data dir serves those versions exactly, with no reload. A
damaged snapshot file is reported and its partition refused (never read as missing); dropped versions and tables
stay dropped."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ramgrid
from ramgrid._local import server_env

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """Two servers on fixed loopback ports, each with its own data dir and the same spec file, that a test can
    SIGKILL and start again on the same address."""

    def __init__(self, root: Path, n: int = 2) -> None:
        self.root = root
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.spec_file = root / "spec"
        self.spec_file.write_text("".join(f"server {a}\n" for a in self.addrs))
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        for i in range(n):
            self.start(i)

    def data_dir(self, i: int) -> Path:
        return self.root / f"data{i}"

    def stderr(self, i: int) -> str:
        return (self.root / f"server{i}.err").read_text(errors="replace")

    def start(self, i: int) -> None:
        args = [sys.executable, "-m", "ramgrid._serve", "--listen", self.addrs[i], "--threads", "1"]
        args += ["--table-memory", "1GiB", "--cluster-spec", str(self.spec_file), "--data-dir", str(self.data_dir(i))]
        out = open(self.root / f"server{i}.out", "wb")  # noqa: SIM115 - the child keeps its own copy
        err = open(self.root / f"server{i}.err", "wb")  # noqa: SIM115
        env = server_env(None, parent_watch=False)
        self.procs[i] = subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        out.close()
        err.close()
        deadline = time.monotonic() + 30
        while b"listening on" not in (self.root / f"server{i}.out").read_bytes():
            proc = self.procs[i]
            assert proc is not None
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {i} did not start: {self.stderr(i)}")
            time.sleep(0.01)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.kill()
        proc.wait()

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start(i)

    def close(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def grid(c: Cluster) -> ramgrid.Grid:
    return ramgrid.connect(c.addrs, timeout=2.0, call_timeout=10.0)


def test_a_sealed_version_survives_sigkill_and_restart_exactly(cluster: Cluster) -> None:
    g = grid(cluster)
    f = g.create_table("scores", partitions=16, value_type="f64", durability="snapshot")
    b = g.create_table("names", partitions=8, value_type="bytes", durability="snapshot")
    v32 = g.create_table("vecs", partitions=4, value_type=("f32vec", 3), durability="snapshot")
    mem = g.create_table("scratch", partitions=4, value_type="i64")
    keys = np.arange(20_000)
    with f.new_version() as v:
        v.put_many(keys, keys * 0.5)
    with f.new_version() as v:  # version 3 replaces 2; 2 stays readable by number
        v.put_many(keys, keys * 0.25)
    names = {f"k{i}".encode(): f"value-{i}-{'x' * (i % 50)}".encode() for i in range(5_000)}
    with b.new_version() as v:
        v.put_many(list(names), list(names.values()))
    vecs = np.arange(3_000 * 3, dtype=np.float32).reshape(3_000, 3)
    with v32.new_version() as v:
        v.put_many(np.arange(3_000), vecs)
    mem.put_many(np.arange(10), np.arange(10))
    g.close()

    for i in range(2):
        cluster.restart(i)
        assert "loaded table" in cluster.stderr(i), cluster.stderr(i)
        # A rolling restart: the next server goes down only once this one learned the memory table from its peer
        # (else neither would know it; the assertion on "scratch" below depends on it).
        wait_repaired(cluster, copied=False)

    g = grid(cluster)
    f, b, v32 = g.table("scores"), g.table("names"), g.table("vecs")
    assert f.current_version() == 3
    assert np.array_equal(f.get_many(keys), keys * 0.25)
    assert np.array_equal(f.pin(2).get_many(keys), keys * 0.5)
    got = b.get_many(list(names))
    assert got == list(names.values())
    assert np.array_equal(v32.get_many(np.arange(3_000)), vecs)
    assert f.describe()["high_water"] == 3
    # A table with durability "memory" keeps no data across restarts: in this rolling restart
    # each server learned the table back from the other one, but its partitions (replication 1)
    # had no other copy, so they are refused as being repaired, never read as missing.
    assert "scratch" in g.tables()
    with pytest.raises(ramgrid.RamgridError):
        g.table("scratch").get_many(np.arange(10), default=-1)
    g.close()


def test_a_corrupt_snapshot_is_reported_and_its_partition_refused(cluster: Cluster) -> None:
    g = grid(cluster)
    t = g.create_table("t", partitions=8, value_type="i64", durability="snapshot")
    keys = np.arange(4_000)
    with t.new_version() as v:
        v.put_many(keys, keys * 3)
    g.close()
    images = sorted(cluster.data_dir(0).glob("tables/t-*/v2/p*.img"))
    assert images, "server 0 wrote no snapshot"
    victim = images[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    cluster.restart(0)
    err = cluster.stderr(0)
    assert str(victim) in err and "partition refused" in err, err

    g = grid(cluster)
    t = g.table("t")
    # Even with a default for misses, the call fails: a refused partition is never read as missing.
    with pytest.raises(ramgrid.RamgridError):
        t.get_many(keys, default=-1)
    g.close()


def wait_repaired(c: Cluster, timeout: float = 30.0, copied: bool = True) -> None:
    """Waits until every server has learned the tables from its peers and (with `copied`) has nothing pending."""
    deadline = time.monotonic() + timeout
    g = grid(c)
    try:
        while True:
            status = g.status()
            if all(
                s.get("ok") and s.get("catalog_learned") == 1 and (not copied or s.get("pending_partitions") == 0)
                for s in status
            ):
                return
            assert time.monotonic() < deadline, f"not repaired within {timeout} s: {status}"
            time.sleep(0.05)
    finally:
        g.close()


def test_a_corrupt_snapshot_is_repaired_from_the_second_replica(cluster: Cluster) -> None:
    """Replication 2: the partition whose image fails validation at the restart is refused (REPAIRING) and copied
    from the other replica; afterwards the restarted server alone serves every key of every version exactly."""
    g = grid(cluster)
    t = g.create_table("r", partitions=8, replication=2, value_type="i64", durability="snapshot")
    keys = np.arange(20_000)
    with t.new_version() as v:
        v.put_many(keys, keys * 3)
    with t.new_version() as v:
        v.put_many(keys, keys * 5)
    g.close()
    images = sorted(cluster.data_dir(0).glob("tables/r-*/v2/p*.img"))
    assert len(images) == 8, images
    victim = images[3]
    data = bytearray(victim.read_bytes())
    for at in (len(data) // 3, len(data) // 2):  # flip bytes inside the sections, not just the header
        data[at] ^= 0x5A
    victim.write_bytes(bytes(data))
    cluster.restart(0)
    err = cluster.stderr(0)
    assert str(victim) in err and "partition refused" in err, err
    wait_repaired(cluster)
    deadline = time.monotonic() + 10  # the line follows the copy's write to disk
    while "repair: copied r v2 (sealed) partition 3" not in cluster.stderr(0):
        assert time.monotonic() < deadline, cluster.stderr(0)
        time.sleep(0.01)
    # Server 0 alone (it holds every partition): both versions exact, no partition refused.
    cluster.kill(1)
    g = grid(cluster)
    t = g.table("r")
    assert np.array_equal(t.pin(2).get_many(keys), keys * 3)
    assert np.array_equal(t.get_many(keys), keys * 5)
    g.close()
    # The copy was written over the damaged file: restarted with no replica up, server 0 loads it.
    cluster.restart(0)
    assert "partition refused" not in cluster.stderr(0), cluster.stderr(0)
    g = grid(cluster)
    assert np.array_equal(g.table("r").pin(2).get_many(keys), keys * 3)
    assert np.array_equal(g.table("r").get_many(keys), keys * 5)
    g.close()


def test_dropped_versions_and_tables_stay_dropped(cluster: Cluster) -> None:
    g = grid(cluster)
    t = g.create_table("keep", partitions=4, value_type="i64", durability="snapshot")
    keys = np.arange(1_000)
    with t.new_version() as v:
        v.put_many(keys, keys)
    with t.new_version() as v:
        v.put_many(keys, keys + 1)
    t.drop_version(2)
    gone = g.create_table("gone", partitions=4, value_type="i64", durability="snapshot")
    with gone.new_version() as v:
        v.put_many(keys, keys)
    g.drop_table("gone")
    g.close()
    for i in range(2):
        cluster.restart(i)
        # A rolling restart: the next server goes down only once this one learned the open head from its peer
        # (else neither would know it, and the head, not on disk, would be lost by design). With replication 1
        # nobody can copy its partitions back: they stay refused, never read as empty.
        wait_repaired(cluster, copied=False)
    g = grid(cluster)
    assert "gone" not in g.tables()
    t = g.table("keep")
    # Version 2 stays dropped; the open head (1) is not on disk but each server of this rolling
    # restart copied it back from the other.
    assert [x["version"] for x in t.versions()] == [1, 3]
    assert np.array_equal(t.get_many(keys), keys + 1)
    assert not list(cluster.data_dir(0).glob("tables/gone-*"))
    g.close()
