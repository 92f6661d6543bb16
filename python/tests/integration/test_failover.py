"""Servers killed with SIGKILL: replicated tables keep answering in full; unreplicated ones name what is lost."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid import _native
from ramgrid.exceptions import ConnectionFailed, PartitionsUnavailable, ServerRefused

pytestmark = pytest.mark.timeout(90)

N_KEYS = 20_000
PARTITIONS = 32


def test_replicated_reads_survive_a_kill_mid_run() -> None:
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        t = g.create_table("rep", partitions=PARTITIONS, replication=2, value_type="f64")
        keys = np.arange(N_KEYS, dtype=np.int64)
        vals = keys * 0.5
        t.put_many(keys, vals)
        rounds_after_kill = 20
        killed = threading.Event()
        errors: list[BaseException] = []
        done_rounds = [0, 0]  # before, after the kill

        def reader() -> None:
            try:
                after = 0
                for _ in range(2000):  # bounded even if the kill never comes
                    got = t.get_many(keys)
                    np.testing.assert_array_equal(got, vals)
                    if killed.is_set():
                        after += 1
                        if after >= rounds_after_kill:
                            break
                    else:
                        done_rounds[0] += 1
                done_rounds[1] = after
            except BaseException as e:  # noqa: BLE001 - anything the reader hits is re-raised by the main thread
                errors.append(e)

        th = threading.Thread(target=reader)
        th.start()
        while done_rounds[0] < 3 and th.is_alive():
            th.join(0.01)
        g.kill(1)
        killed.set()
        th.join(60)
        assert not th.is_alive()
        assert not errors, errors[0]
        assert done_rounds[1] == rounds_after_kill
        assert g.alive() == [True, False, True]
        # A fresh batch through a fresh connection pool also gets everything.
        np.testing.assert_array_equal(ramgrid.connect(g.spec, timeout=2.0).table("rep").get_many(keys), vals)


def test_unreplicated_reads_name_the_lost_partitions() -> None:
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        t = g.create_table("single", partitions=PARTITIONS, replication=1, value_type="i64")
        keys = np.arange(3000, dtype=np.int64)
        t.put_many(keys, keys)
        g.kill(2)
        with pytest.raises(PartitionsUnavailable) as e:
            t.get_many(keys)
        lost = set(e.value.partitions)
        assert lost and lost <= set(range(PARTITIONS)) and len(lost) < PARTITIONS
        assert str(min(lost)) in str(e.value)
        part = np.array([_native.partition_of(int(k), PARTITIONS) for k in keys])
        assert set(part.tolist()) >= lost  # the keys really fall in the lost partitions
        alive = keys[~np.isin(part, list(lost))]
        dead = keys[np.isin(part, list(lost))]
        assert len(alive) and len(dead)
        # Keys of surviving partitions are served; keys of lost ones never come back as silent misses.
        assert t.get_many(alive).tolist() == alive.tolist()
        with pytest.raises(PartitionsUnavailable):
            t.lookup(dead[:10])
        # A write waits (unsent) for the dead primary's fail-over or return, within the call's time: here 1 s.
        impatient = ramgrid.connect(g.addresses, timeout=2.0, call_timeout=1.0).table("single")
        with pytest.raises(PartitionsUnavailable):
            impatient.put_many(dead[:10], dead[:10])


def test_describe_and_current_version_answer_after_a_kill() -> None:
    """The issue: after any kill, describe() and current_version() raised ConnectionFailed instead of asking the live
    servers. They answer from the servers that are up and name the one that is not."""
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        t = g.create_table("meta", partitions=12, replication=2, value_type="i64")
        keys = np.arange(500, dtype=np.int64)
        t.put_many(keys, keys)
        with t.new_version() as w:
            w.put_many(keys, keys * 2)
        assert t.current_version() == 2
        g.kill(1)
        assert t.current_version() == 2
        d = t.describe()
        assert d["current_version"] == 2 and d["replication"] == 2
        assert d["unreachable"] == [g.addresses[1]]
        assert [v["version"] for v in d["versions"]] == [1, 2]
        assert "meta" in g.tables()
        # A process that never talked to the cluster before (fresh client, nothing known down) answers too.
        fresh = ramgrid.connect(g.spec, timeout=2.0).table("meta")
        assert fresh.current_version() == 2
        assert fresh.describe()["unreachable"] == [g.addresses[1]]


def test_a_server_at_its_connection_limit_raises_server_refused() -> None:
    """A native client refused for too many connections gets ServerRefused (a ConnectionFailed) naming the reason,
    not a protocol error about a bad magic byte."""
    with ramgrid.local(servers=1, memory="64MiB", extra_args=["--max-conns", "1"]) as g:
        g.create_table("one", partitions=4, value_type="i64")  # this handle's pooled connection is the one allowed
        other = ramgrid.connect(g.spec, timeout=2.0)
        with pytest.raises(ServerRefused, match="too many open connections") as e:
            other.tables()
        assert isinstance(e.value, ConnectionFailed)
