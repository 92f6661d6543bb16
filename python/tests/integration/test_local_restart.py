"""LocalGrid.restart(i): a server killed and started again on its address. Without a data directory it comes
back empty and reads go around it to the replicas; with one, snapshot tables come back whole, even after every
server was restarted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import ramgrid

pytestmark = pytest.mark.timeout(90)


def test_a_server_restarted_empty_is_read_around() -> None:
    keys = np.arange(20_000)
    with ramgrid.local(servers=3, memory="64MiB") as g:
        t = g.create_table("t", partitions=16, replication=2, value_type="f64")
        with t.new_version() as v:
            v.put_many(keys, keys * 0.25)
        old_pid = g.pids[1]
        g.restart(1)
        assert g.pids[1] != old_pid and all(g.alive())
        for reader in (t, ramgrid.connect(g.addresses).table("t")):
            assert np.array_equal(reader.get_many(keys), keys * 0.25)


def test_snapshot_tables_survive_restarting_every_server(tmp_path: Path) -> None:
    keys = np.arange(5_000)
    with ramgrid.local(servers=2, memory="64MiB", data_dir=tmp_path) as g:
        t = g.create_table("durable", partitions=8, replication=2, value_type="i64", durability="snapshot")
        with t.new_version() as v:
            v.put_many(keys, keys * 3)
        for i in range(2):
            g.restart(i)
        reader = ramgrid.connect(g.addresses).table("durable")
        assert np.array_equal(reader.get_many(keys), keys * 3)
        assert reader.describe()["durability"] == "snapshot"


def test_the_durable_tables_example_runs() -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[3] / "examples" / "durable_tables.py"
    r = subprocess.run(
        [sys.executable, str(example), "--keys", "5000"], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "reads back exactly" in r.stdout


def test_a_log_table_server_restarted_with_join_reconciles_its_log(tmp_path: Path) -> None:
    """LocalGrid.restart passes --join, not a spec: the server replays its log before it knows which partitions
    have other replicas, and reconciles them when it learns the spec. Writes acknowledged with ack="one" while it
    was down (overwrites, deletes) are then served by it alone."""
    from ramgrid import _native
    from ramgrid.exceptions import PartitionsUnavailable

    parts = 16
    keys = np.arange(20_000, dtype=np.int64)
    with ramgrid.local(servers=3, memory="64MiB", data_dir=tmp_path) as g:
        t = g.create_table("wal", partitions=parts, replication=2, value_type="f64", durability="log")
        t.put_many(keys, keys * 0.5)
        g.kill(1)
        one = ramgrid.connect(g.addresses, ack="one", timeout=2.0)
        one.table("wal").put_many(keys[::2], keys[::2] * 0.5 + 100.0)
        gone = keys[1::4]
        one.table("wal").delete_many(gone)
        one.close()
        want = keys * 0.5
        want[::2] += 100.0
        want[1::4] = -7.0
        g.restart(1)
        g.wait_repaired()
        assert "to reconcile with a replica" in g.server_stderr(1), g.server_stderr(1)
        g.kill(0)
        g.kill(2)
        alone = ramgrid.connect(g.addresses, timeout=2.0).table("wal")
        with pytest.raises(PartitionsUnavailable) as e:
            alone.get_many(keys, default=-7.0)
        part = np.array([_native.partition_of(int(k), parts) for k in keys])
        mine = ~np.isin(part, list(e.value.partitions))
        assert mine.sum() > len(keys) // 3
        assert np.array_equal(alone.get_many(keys[mine], default=-7.0), want[mine])
