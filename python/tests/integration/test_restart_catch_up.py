"""A server restarted from its data directory serves nothing the group has moved past (issue 25, item 3): found by
the Jepsen switch model, a read of the version current before the restart, ~40 ms after it, before the server had
heard from the leader. Now a restarted member starts catching up (NO_QUORUM) and re-applies its committed metadata
at once, so each answer it gives alone is a refusal or the version the group switched to."""

from __future__ import annotations

import tempfile
import time

import numpy as np
import pytest
import ramgrid
from ramgrid import _native
from ramgrid.testing.jepsen import replica_get

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4


@pytest.mark.parametrize("durability", ["snapshot", "log"])
def test_a_restarted_server_never_answers_with_the_version_switched_away_while_it_was_down(durability: str) -> None:
    with (
        tempfile.TemporaryDirectory() as d,
        ramgrid.local(servers=3, memory="64MiB", data_dir=d, extra_args=["--failure-timeout-ms", "2000"]) as g,
    ):
        t = g.create_table("sw", partitions=PARTITIONS, replication=3, value_type="i64", durability=durability)
        with t.new_version() as v:
            v.put_many(["k"], np.array([1]))
        g.wait_repaired()
        g.kill(0)
        _until_failed_over(g, g.addresses[0])
        with t.new_version() as v:
            v.put_many(["k"], np.array([2]))
        assert t.lookup(["k"])[0][0] == 2
        g.restart(0)
        address, p = g.addresses[0], _native.partition_of("k", PARTITIONS)
        answers: list[object] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = replica_get(address, "k", p, table="sw")
            if not answers or answers[-1] != got:
                answers.append(got)
            if got == 2:
                break
            time.sleep(0.002)
        assert 1 not in answers, answers
        assert answers[-1] == 2, answers


def _until_failed_over(g: ramgrid.LocalGrid, dead: str) -> None:
    """Until the live servers' spec no longer lists `dead` (version operations need every server of the spec)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        live = [s for s in g.status() if s.get("ok")]
        if live and all(dead not in str(s.get("servers", "")) for s in live):
            return
        time.sleep(0.05)
    raise AssertionError(f"{dead} was not failed over within 30 s")
