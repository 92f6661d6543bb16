"""Sequences of single faults that must heal without a person (issue 24), with real processes, in the default
in-memory mode and with `--data-dir`: restart then kill (after `wait_repaired()`, and within a second), two
restarts in a row, the leader restarted, a majority lost (pinned reads go on, writes are refused with NO_QUORUM
naming the missing voters, and all resumes when a voter comes back), and a server added while a member is down. Each prints how long reads and writes were unavailable after the last fault
(`pytest -s` shows it; docs/control-plane.md, "Sequences of faults").

The servers run with `--failure-timeout-ms 2000` so a failover takes about 2 s."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import ramgrid
from ramgrid._wire import partition_of
from ramgrid.exceptions import RamgridError

pytestmark = pytest.mark.timeout(120)

FAILURE_TIMEOUT = ["--failure-timeout-ms", "2000"]
KEYS = np.arange(5_000, dtype=np.int64)
HEAL_WITHIN = 30.0


@pytest.fixture(params=["memory", "data_dir"])
def grid(request: Any) -> Iterator[Any]:
    kw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        if request.param == "data_dir":
            kw["data_dir"] = d
        with ramgrid.local(servers=3, memory="64MiB", extra_args=FAILURE_TIMEOUT, **kw) as g:
            yield g


def _table(g: Any) -> Any:
    t = g.create_table("seq", partitions=16, replication=2, value_type="i64")
    t.put_many(KEYS, KEYS * 2)
    return t


def _leader(g: Any) -> str:
    leader = g.health()["leader"]
    assert leader is not None, g.status()
    return str(leader)


def _heals(what: str, t: Any) -> tuple[float, float]:
    """Seconds until every key reads back exact, and until a write is acknowledged; fails after HEAL_WITHIN."""
    start = time.monotonic()
    read_ok = write_ok = None
    last: Exception | None = None
    while read_ok is None or write_ok is None:
        now = time.monotonic() - start
        assert now < HEAL_WITHIN, (
            f"{what}: not healed within {HEAL_WITHIN} s (read {read_ok}, write {write_ok}): {last}"
        )
        if read_ok is None:
            try:
                assert (t.get_many(KEYS) == KEYS * 2).all()
                read_ok = time.monotonic() - start
            except RamgridError as e:
                last = e
        if write_ok is None:
            try:
                t.put_many(KEYS[:100], KEYS[:100] * 2)
                write_ok = time.monotonic() - start
            except RamgridError as e:
                last = e
        time.sleep(0.05)
    print(f"\n{what}: reads back after {read_ok:.2f} s, writes after {write_ok:.2f} s")
    return read_ok, write_ok


def _sequence(g: Any, steps: Callable[[], None], what: str) -> None:
    t = _table(g)
    steps()
    _heals(what, t)
    # Healed means the group too: one leader, every live server a member, able to change the catalog.
    t2 = g.create_table("after", partitions=4, replication=2, value_type="i64")
    t2.put_many(KEYS[:10], KEYS[:10])
    assert (t2.get_many(KEYS[:10]) == KEYS[:10]).all()


def test_restart_wait_repaired_then_kill(grid: Any) -> None:
    def steps() -> None:
        grid.restart(0)
        grid.wait_repaired()
        grid.kill(1)

    _sequence(grid, steps, "restart, wait_repaired, kill")


def test_restart_then_kill_within_a_second(grid: Any) -> None:
    def steps() -> None:
        grid.restart(0)
        time.sleep(0.5)
        grid.kill(1)

    _sequence(grid, steps, "restart, kill 0.5 s later")


def test_two_restarts_in_a_row(grid: Any) -> None:
    def steps() -> None:
        grid.restart(0)
        grid.restart(1)
        grid.wait_repaired()

    _sequence(grid, steps, "two restarts in a row")


def test_the_leader_restarted(grid: Any) -> None:
    def steps() -> None:
        grid.wait_repaired()
        grid.restart(grid.addresses.index(_leader(grid)))

    _sequence(grid, steps, "leader restarted")


def test_without_a_majority_pinned_reads_go_on_and_writes_are_refused(grid: Any) -> None:
    t = grid.create_table("nomaj", partitions=16, replication=3, value_type="i64")
    with t.new_version() as v:
        v.put_many(KEYS, KEYS * 2)
    version = t.current_version()
    live = grid.create_table("nomaj_open", partitions=16, replication=3, value_type="i64")
    live.put_many(KEYS, KEYS * 2)
    single = grid.create_table("single", partitions=8, replication=1, value_type="i64")
    on_dead = [p for p, o in enumerate(single.owners()) if o[0] in (grid.addresses[1], grid.addresses[2])]
    grid.wait_repaired()
    grid.kill(1)
    grid.kill(2)
    start = time.monotonic()
    pinned = t.pin(version)
    # Sealed, pinned: served by the one live replica, with or without a group.
    assert (pinned.get_many(KEYS) == KEYS * 2).all()
    time.sleep(3.0)  # past the lease: the survivor knows it has no majority
    assert (pinned.get_many(KEYS) == KEYS * 2).all()
    missing = {grid.addresses[1], grid.addresses[2]}
    with pytest.raises(RamgridError, match="NO_QUORUM") as e:
        live.put_many(KEYS[:10], KEYS[:10])
    assert any(a in str(e.value) for a in missing), str(e.value)
    # Keys whose primaries are all dead wait for a fail-over that cannot come without a majority: refused as
    # NO_QUORUM too (within twice the failure timeout), not as unreachable partitions after the whole wait.
    primaries = [o[0] for o in live.owners()]
    orphans = np.array(
        [k for k in KEYS if primaries[partition_of(int(k).to_bytes(8, "little", signed=True), 16)] in missing][:10]
    )
    waited = time.monotonic()
    with pytest.raises(RamgridError, match="NO_QUORUM"):
        live.put_many(orphans, orphans)
    assert time.monotonic() - waited < 15.0
    print(
        f"\nno majority: pinned reads served throughout ({time.monotonic() - start:.1f} s), writes refused: {e.value}"
    )
    health = grid.health()
    assert health["mode"].startswith("degraded") and health["tolerates"] == -1, health
    assert set(health["voters"]) - set(health["voters_alive"]) == missing, health
    # The data that cannot be read now is named: the one-replica table's partitions on the dead servers.
    assert health["unavailable"] == {"single": on_dead}, health
    # One voter back with its state directory: a majority again, and everything resumes by itself.
    grid.restart(1)
    _heals("no majority, one voter back", live)
    assert grid.health()["mode"] == "full service"


def test_cluster_recover_rebuilds_the_group_from_the_survivor_and_a_dead_voter_rejoins_it(grid: Any) -> None:
    """Two of three voters die for good: `recover` rebuilds the group from the survivor, reports the partitions no
    live server holds, and brings writes and catalog changes back; a dead voter restarted later with its old state
    directory (a group given up) is reset by the new leader and joins."""
    whole = grid.create_table("whole", partitions=16, replication=3, value_type="i64")
    whole.put_many(KEYS, KEYS * 2)
    single = grid.create_table("single", partitions=8, replication=1, value_type="i64")
    single.put_many(KEYS, KEYS)
    dead = {grid.addresses[1], grid.addresses[2]}
    on_dead = [p for p, o in enumerate(single.owners()) if o[0] in dead]
    grid.wait_repaired()
    with pytest.raises(ValueError, match="nothing to recover"):
        grid.recover()  # a majority answers
    grid.kill(1)
    grid.kill(2)
    time.sleep(3.0)  # past the lease: the survivor knows it has no majority
    with pytest.raises(RamgridError, match="NO_QUORUM"):
        whole.put_many(KEYS[:10], KEYS[:10] * 2)
    start = time.monotonic()
    report = grid.recover()
    print(f"\nrecover: {report} in {time.monotonic() - start:.2f} s")
    assert report["leader"] == grid.addresses[0] and report["joined"] == [], report
    assert set(report["dead"]) == dead and report["unsettled"] == [], report
    assert report["lost"] == {"single": on_dead}, report
    with pytest.raises(ValueError, match="nothing to recover"):
        grid.recover()  # done: the new group has its majority
    _heals("majority lost for good, recovered", whole)
    health = grid.health()
    assert health["leader"] == grid.addresses[0] and health["mode"] == "full service", health
    after = grid.create_table("after", partitions=4, replication=1, value_type="i64")
    after.put_many(KEYS[:10], KEYS[:10])
    # The lost partitions stay unavailable (never served empty), shown stranded: nothing holds them to copy from.
    with pytest.raises(RamgridError, match="unavailable|REPAIRING"):
        single.get_many(KEYS)
    survivor = next(s for s in grid.status() if s["server"] == grid.addresses[0])
    # At least the lost ones. Sometimes one more: the first fail-over's map may give one of the survivor's own R=1
    # partitions to the other dead server (not failed over yet), and the second gives it back, empty (noted in
    # docs/control-plane.md; the map balances, it does not only move a dead server's partitions).
    repairing = {int(p) for p in str(survivor.get("repairing")).rsplit(" ", 1)[-1].split(",")}
    assert set(on_dead) <= repairing and survivor.get("stranded_partitions") == len(repairing) < 8, (on_dead, survivor)
    # The operator's remedy for lost data: drop (or reload) the table. Until then no rejoin begins.
    grid.drop_table("single")
    # A dead voter comes back from its state directory: reset by the new leader, it joins and rejoins the spec.
    grid.restart(1)
    deadline = time.monotonic() + HEAL_WITHIN
    while True:  # (not wait_repaired: server 2 stays dead, and the local grid counts it)
        status = {s["server"]: s for s in grid.status()}
        back = status.get(grid.addresses[1], {})
        if (
            back.get("quorum") == "ok"
            and back.get("meta_generation") == report["generation"]
            and grid.addresses[1] in str(back.get("servers"))
            and back.get("pending_partitions") == 0
            and grid.addresses[1] in grid.health()["voters_alive"]  # promoted once it has caught up
        ):
            break
        assert time.monotonic() < deadline, (status, grid.health())
        time.sleep(0.2)
    assert (whole.get_many(KEYS) == KEYS * 2).all()


def test_cluster_recover_with_a_learner_alive_it_joins_the_new_group() -> None:
    """Four servers, three voters: two voters die for good. The survivors are a voter and a learner; `recover`
    rebuilds the group from the one that applied the most and the other joins it (RECOVER join)."""
    with ramgrid.local(servers=4, memory="64MiB", extra_args=FAILURE_TIMEOUT) as g:
        t = g.create_table("whole", partitions=16, replication=3, value_type="i64")
        t.put_many(KEYS, KEYS * 2)
        g.wait_repaired()
        voters = g.health()["voters"]
        doomed = [i for i, a in enumerate(g.addresses) if a in voters][:2]
        live = {a for i, a in enumerate(g.addresses) if i not in doomed}
        for i in doomed:
            g.kill(i)
        time.sleep(3.0)
        report = g.recover()
        assert {report["leader"], *report["joined"]} == live and report["unsettled"] == [], report
        assert set(report["dead"]) == {g.addresses[i] for i in doomed}, report
        _heals("two of three voters lost, a learner alive, recovered", t)
        health = g.health()
        assert set(health["voters_alive"]) == live, health


def test_a_version_made_right_after_a_fail_over(grid: Any) -> None:
    """A client whose last call predates a fail-over makes a new version at once: the version operations reach every
    server of the spec, so a server that cannot be reached makes the client refresh its spec and go on without it
    (it raised ConnectionFailed before)."""
    t = grid.create_table("vers", partitions=8, replication=2, value_type="i64")
    with t.new_version() as v:
        v.put_many(KEYS, KEYS)
    grid.wait_repaired()
    grid.kill(2)
    time.sleep(3.5)  # failed over (2 s), and this client has not asked anyone since
    with t.new_version() as v:
        v.put_many(KEYS, KEYS * 2)
    assert (t.get_many(KEYS) == KEYS * 2).all()


def test_adding_a_server_while_a_member_is_down_waits_for_its_fail_over(grid: Any) -> None:
    t = _table(grid)
    grid.kill(2)
    addr = grid.add_server()  # not a usage error: the move waits for the fail-over, then goes on without it
    assert addr in grid.last_move["to"] and grid.addresses[2] not in grid.last_move["to"], grid.last_move
    _heals("add_server with a member down", t)


def test_pause_past_the_timeout_then_kill_and_restart_another(grid: Any) -> None:
    """The sequence a Jepsen-style nemesis found never healing (issue 24): one server paused past the failure
    timeout (failed over), then another killed and restarted while it is still paused; then it resumes."""
    t = _table(grid)
    grid.wait_repaired()
    paused = next(i for i, a in enumerate(grid.addresses) if a != _leader(grid))
    other = next(i for i in range(3) if i != paused)
    pid = grid.pids[paused]
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(3.0)  # past the 2 s failure timeout: failed over
        grid.restart(other)
        _heals("paused past the timeout, another restarted", t)
    finally:
        os.kill(pid, signal.SIGCONT)
    grid.wait_repaired()
    _heals("the paused one resumed and rejoined", t)


def test_kill_during_a_move(grid: Any) -> None:
    """A server of the cluster dies while a server is being added: the move is undone or finished, the dead one
    is failed over, and the cluster serves every key without a person."""
    import threading

    t = _table(grid)
    grid.wait_repaired()
    victim = next(i for i, a in enumerate(grid.addresses) if a != _leader(grid))
    outcome: list[str] = []

    def add() -> None:
        try:
            grid.add_server()
            outcome.append("added")
        except RamgridError as e:
            outcome.append(f"failed: {type(e).__name__}: {e}")

    th = threading.Thread(target=add)
    th.start()
    time.sleep(0.3)
    grid.kill(victim)
    th.join(timeout=90)
    assert outcome, "add_server did not return"
    print(f"\nadd_server while a member died: {outcome[0][:200]}")
    _heals("kill during a move", t)


def test_a_rolling_restart_keeps_the_group_able_to_lose_one_more(grid: Any) -> None:
    """Server by server, each restarted and repaired before the next: at every step the group has its three voters
    (the restarted one kept its Raft identity) and tolerates one more failure."""
    t = _table(grid)
    grid.wait_repaired()
    for i in range(3):
        grid.restart(i)
        grid.wait_repaired()
        h = grid.health()
        assert h["tolerates"] == 1 and len(h["voters"]) == 3 and h["mode"] == "full service", (i, h)
    assert (t.get_many(KEYS) == KEYS * 2).all()


def test_a_server_lost_for_good_is_replaced_in_one_call(grid: Any) -> None:
    """A server dies for good; `replace_server` waits for its fail-over and puts a new, empty one in its place: the
    new one holds partitions, the group is whole again with three voters, and every key reads back."""
    t = _table(grid)
    grid.wait_repaired()
    dead = grid.addresses[2]
    grid.kill(2)
    report = grid.replace_server(2)
    assert dead not in report["to"] and grid.addresses[2] in report["to"], report
    grid.wait_repaired()
    h = grid.health()
    assert h["tolerates"] == 1 and grid.addresses[2] in h["voters"], h
    assert (t.get_many(KEYS) == KEYS * 2).all()
    print(f"\nreplace a dead server: {report['partitions_copied']} partitions copied in {report['seconds']:.2f} s")
