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
