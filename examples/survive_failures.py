"""ramgrid's control plane: what a 3-server grid does when servers die, and how it comes back.

    python examples/survive_failures.py

Three local servers (replication 2, a failure timeout of 2 s) hold a table. The example then:

1. restarts a server and waits until it is whole again: the restarted server keeps its Raft vote (its state
   directory), copies its partitions back, and the group again tolerates one more failure;
2. kills a server: reads go on from the other replicas at once, writes come back once the dead one is failed over;
3. replaces the dead server with a new one in one call (`replace_server`);
4. loses two of three servers at once: no majority, so the grid degrades instead of stopping: a pinned version is
   still read exactly, writes are refused with NO_QUORUM naming the missing voters; restarting one brings it all
   back.

`grid.health()` is printed after each step (`ramgrid cluster status` shows the same line).
"""

from __future__ import annotations

import time

import numpy as np
import ramgrid
from ramgrid.health import summary

KEYS = np.arange(100_000, dtype=np.int64)


def until_writes_work(table: ramgrid.Table, limit: float = 30.0) -> float:
    """Seconds until a write is acknowledged again."""
    start = time.monotonic()
    while True:
        try:
            table.put_many(KEYS[:100], KEYS[:100] * 2.0)
            return time.monotonic() - start
        except ramgrid.RamgridError:
            if time.monotonic() - start > limit:
                raise
            time.sleep(0.05)


def main() -> None:
    with ramgrid.local(servers=3, memory="128MiB", extra_args=["--failure-timeout-ms", "2000"]) as grid:
        table = grid.create_table("scores", partitions=16, replication=2, value_type="f64")
        table.put_many(KEYS, KEYS * 2.0)
        print("started:", summary(grid.health()))

        # 1. A restart: same voter, partitions copied back from the other replicas.
        grid.restart(0)
        waited = grid.wait_repaired()
        print(f"1. restarted server 0, whole again after {waited:.2f} s:", summary(grid.health()))

        # 2. A server dies: reads never stop, writes wait for its fail-over.
        grid.kill(1)
        assert (table.get_many(KEYS) == KEYS * 2.0).all()
        print(f"2. killed server 1: reads exact at once; writes back after {until_writes_work(table):.2f} s")

        # 3. It is gone for good: a new server takes its place.
        report = grid.replace_server(1)
        grid.wait_repaired()
        print(
            f"3. replaced it with {grid.addresses[1]}: {report['partitions_copied']} partitions copied in "
            f"{report['seconds']:.2f} s;",
            summary(grid.health()),
        )

        # 4. Two of three at once: no majority. Pinned (sealed) data is still served; writes are refused.
        # (replication 3, so that the one survivor holds every partition)
        pinned_table = grid.create_table("pinned", partitions=16, replication=3, value_type="f64")
        with pinned_table.new_version() as v:
            v.put_many(KEYS, KEYS * 3.0)
        pinned = pinned_table.pin()
        live = grid.create_table("live", partitions=16, replication=3, value_type="f64")
        live.put_many(KEYS, KEYS * 2.0)
        grid.wait_repaired()
        grid.kill(1)
        grid.kill(2)
        time.sleep(2.5)  # past the servers' lease: the survivor knows it has no majority
        assert (pinned.get_many(KEYS) == KEYS * 3.0).all()
        try:
            live.put_many(KEYS[:10], KEYS[:10] * 2.0)
            raise AssertionError("a write was acknowledged without a majority")
        except ramgrid.RamgridError as e:
            print(f"4. killed servers 1 and 2: pinned reads exact; a write is refused: {str(e)[:160]}...")
        print("  ", summary(grid.health()).replace("\n", "\n   "))
        grid.restart(1)  # a voter back, with its Raft state: a majority again
        print(f"   restarted server 1: writes back after {until_writes_work(live):.2f} s")
        print("  ", summary(grid.health()).replace("\n", "\n   "))


if __name__ == "__main__":
    main()
