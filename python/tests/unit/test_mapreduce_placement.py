"""Where map tasks run (Horcrux's load balancer): a table whose partitions' primaries crowd on one server still
spreads its map tasks over the replicas, and a retry moves to the next replica."""

from __future__ import annotations

from collections import Counter

from ramgrid.mapreduce.job import place_map_task


def test_a_skewed_table_spreads_its_maps_over_the_replicas() -> None:
    # 12 partitions: every primary on A (the skew), replicas on B and C in turn.
    owners = [("A", "B" if p % 2 else "C") for p in range(12)]
    load: dict[str, int] = {}
    placed = Counter(place_map_task(o, 0, load) for o in owners)
    # Primaries only would give A all 12; balanced, no server runs more than its fair share plus one.
    assert placed["A"] <= 12 // 3 + 1 and placed["B"] > 0 and placed["C"] > 0, placed
    assert sum(placed.values()) == 12
    # Every task runs on one of its own partition's replicas, and its scan prefers that replica, so it reads from
    # the server it was placed beside (counted per server in tests/integration/test_mapreduce_local_reads.py).
    load = {}
    assert all(place_map_task(o, 0, load) in o for o in owners)


def test_an_even_table_keeps_each_task_on_its_primary() -> None:
    servers = ["A", "B", "C"]
    owners = [(servers[p % 3], servers[(p + 1) % 3]) for p in range(9)]
    load: dict[str, int] = {}
    assert [place_map_task(o, 0, load) for o in owners] == [o[0] for o in owners]


def test_a_retry_goes_to_the_next_replica_and_files_have_no_place() -> None:
    load: dict[str, int] = {}
    assert place_map_task(("A", "B"), 1, load) == "B"
    assert place_map_task(("A", "B"), 2, load) == "A"
    assert place_map_task((), 0, load) is None
