"""Partitions and bytes a move copies: 4 -> 5 -> 4 servers on a local grid, against the least any map could
move and against the obvious alternative (reloading the table from its source onto the new cluster).

    .venv/bin/python benchmarks/rebalance.py [--keys 2000000] [--partitions 64] [--out FILE]

The least: adding a 5th server to 4 (or removing it), with replication R and P partitions per version, the
server that joins (leaves) must receive (give away) R*P/5 replica copies of each version; a map could move
nothing else. The peer is a reload: every key written again with put_many, ack=all (what a cluster without
moves would do after a change).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import ramgrid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--replication", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    keys = np.arange(a.keys, dtype=np.int64)
    vals = keys.astype(np.float64) * 0.5
    with ramgrid.local(servers=4, memory="2GiB") as g:
        t = g.create_table("bench", partitions=a.partitions, replication=a.replication, value_type="f64")
        t.put_many(keys[:100_000], vals[:100_000])  # the open head (version 1) holds some too
        started = time.perf_counter()
        with t.new_version() as v:  # a sealed version, current
            v.put_many(keys, vals)
        load_s = time.perf_counter() - started
        versions = 2
        least = math.ceil(a.replication * a.partitions / 5) * versions
        say(f"table: {a.keys:,} f64 keys, {a.partitions} partitions, replication {a.replication}, {versions} versions")
        say(f"peer: reload of every key (put_many, ack=all) onto 4 servers: {load_s:.2f} s")
        grown = g.add_server()
        r = g.last_move
        say(
            f"4 -> 5: {r['partitions_copied']} partition copies (least possible {least}), "
            f"{r['bytes_copied'] / 1e6:.1f} MB, {r['seconds']:.2f} s; move/reload time "
            f"{r['seconds'] / load_s:.2f}"
        )
        assert np.array_equal(t.get_many(keys), vals)
        r = g.remove_server(g.addresses.index(grown))
        say(
            f"5 -> 4: {r['partitions_copied']} partition copies (least possible {least}), "
            f"{r['bytes_copied'] / 1e6:.1f} MB, {r['seconds']:.2f} s; move/reload time "
            f"{r['seconds'] / load_s:.2f}"
        )
        assert np.array_equal(t.get_many(keys), vals)
        say("every key read back exactly after each move")
    if a.out:
        with open(a.out, "w") as f:
            f.write("$ .venv/bin/python benchmarks/rebalance.py " + f"--keys {a.keys} --out {a.out}\n")
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
