"""The control plane with real processes: the servers' metadata Raft group forms by itself, a server that dies or
is paused (SIGSTOP) is failed over within the bound and writes flow again, it rejoins when it answers and serves
nothing it missed, and the Raft leader's death elects another that goes on changing the catalog
(docs/control-plane.md).

The servers run with `--failure-timeout-ms 2000` (a lease of 1 s) so the tests are short; the default is 5 s."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest
import ramgrid
from _jobs import Jobs, check_all, load, value_of
from ramgrid.exceptions import TableExists
from ramgrid.grid import _put

pytestmark = pytest.mark.timeout(90)

FAILURE_TIMEOUT = ["--failure-timeout-ms", "2000"]
BASE_KEYS = 20_000


def _status(g: Any) -> list[dict[str, Any]]:
    return [s for s in g.status() if s.get("ok")]


def _wait(what: str, cond: Any, timeout: float = 30.0) -> float:
    """Polls `cond()` until it is truthy; returns the seconds it took."""
    start = time.monotonic()
    while True:
        got = cond()
        if got:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def _leader(g: Any) -> str:
    """The address every live server names as the group's leader."""
    leaders = {s.get("meta_leader", "none").split(" ")[0] for s in _status(g)}
    assert len(leaders) == 1, leaders
    return leaders.pop()


def _grid(n: int = 3) -> Any:
    return ramgrid.local(servers=n, memory="64MiB", extra_args=FAILURE_TIMEOUT)


def test_the_group_forms_by_itself_and_status_shows_it() -> None:
    with _grid() as g:
        # Formed: one leader known to all, three members that are all voters, every server serving. Each holds
        # in its own moment (the leader adds the others as learners, then promotes them), so they are waited for
        # together.
        def formed() -> bool:
            st = _status(g)
            return (
                len(st) == 3
                and len({s.get("meta_leader") for s in st} - {"none"}) == 1
                and all(s["meta_members"] == 3 and s["quorum"] == "ok" for s in st)
                and all(s["meta_member"].count("voter") == 3 for s in st)
            )

        _wait("the group formed", formed)
        assert _leader(g) in g.addresses


def test_a_spec_pushed_by_a_stale_client_does_not_overwrite_the_agreed_one() -> None:
    with _grid() as g:
        _wait("a leader", lambda: all(s.get("meta_leader", "none") != "none" for s in _status(g)))
        # A client that believes in two of the three servers pushes its spec: refused, nothing changes.
        stale = ramgrid.connect(",".join(g.addresses[:2]))
        with pytest.raises(ramgrid.RamgridError, match="agreed on another spec|WRONG_EPOCH"):
            stale._client().push_spec()
        assert {s["servers"] for s in _status(g)} == {",".join(g.addresses)}


def test_a_killed_server_is_failed_over_writes_resume_and_it_rejoins() -> None:
    with _grid() as g:
        t = g.create_table("fo", partitions=16, replication=2, value_type="i64")
        base = load(t, BASE_KEYS)
        victim = next(i for i, a in enumerate(g.addresses) if a != _leader(g))
        addr = g.addresses[victim]
        jobs = Jobs(g.spec, "fo", BASE_KEYS).start()
        try:
            time.sleep(0.3)
            g.kill(victim)
            killed = time.monotonic()
            # The leader takes it out of the spec; its partitions get new replicas that copy from the survivors.
            _wait("failed over", lambda: all(addr not in s["servers"].split(",") for s in _status(g)))
            failed_over = time.monotonic() - killed
            acked_before = jobs.books.batches_acked
            _wait("writes flowing", lambda: jobs.books.batches_acked > acked_before + 3)
            flowing = time.monotonic() - killed
            # Back on its address, empty: it rejoins through repair.
            g.restart(victim)
            _wait("rejoined", lambda: all(addr in s["servers"].split(",") for s in _status(g)), timeout=30)
            _wait(
                "repaired",
                lambda: (st := _status(g)) and len(st) == 3 and all(s["pending_partitions"] == 0 for s in st),
            )
            time.sleep(0.3)
        finally:
            books = jobs.stop()
        print(f"failed over after {failed_over:.2f} s, writes flowing after {flowing:.2f} s")
        assert not jobs.crashed and not books.wrong, (jobs.crashed, books.wrong[:5])
        assert failed_over < 2.0 + 5.0, failed_over  # the bound (2 s) plus slack for a loaded machine
        assert any(s["failovers"] >= 1 for s in _status(g)) and any(s["rejoins"] >= 1 for s in _status(g))
        check_all(g.spec, "fo", np.concatenate([base, books.acked_keys()]))


@pytest.mark.parametrize("who", ["follower", "leader"])
def test_a_paused_server_is_failed_over_and_serves_nothing_stale_when_resumed(who: str) -> None:
    with _grid() as g:
        t = g.create_table("pause", partitions=16, replication=2, value_type="i64")
        keys = np.arange(BASE_KEYS, dtype=np.int64)
        t.put_many(keys, keys)
        leader = _leader(g)
        victim = next(i for i, a in enumerate(g.addresses) if (a == leader) == (who == "leader"))
        addr = g.addresses[victim]
        old_spec = g.spec
        pid = g.pids[victim]
        os.kill(pid, signal.SIGSTOP)
        try:
            _wait("failed over", lambda: all(addr not in s["servers"].split(",") for s in _status(g)))
            # New values while it sleeps: it holds the old ones for half the keys.
            deadline = time.monotonic() + 20
            while True:
                try:
                    t.put_many(keys, keys + 1_000_000)
                    break
                except ramgrid.RamgridError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
        finally:
            os.kill(pid, signal.SIGCONT)
        # A reader that still routes by the old spec (which includes the paused server) reads right away: every
        # value is the new one or the read is refused, never an old one.
        stale_reader = ramgrid.connect(old_spec, ack="one").table("pause")
        end = time.monotonic() + 3
        reads = 0
        while time.monotonic() < end:
            try:
                got = stale_reader.get_many(keys[:2000])
            except ramgrid.RamgridError:
                continue
            reads += 1
            assert (got == keys[:2000] + 1_000_000).all(), "a resumed server served a value it missed"
        assert reads > 0
        _wait("rejoined", lambda: all(addr in s["servers"].split(",") for s in _status(g)))
        _wait("repaired", lambda: all(s["pending_partitions"] == 0 for s in _status(g)))
        got = t.get_many(keys)
        assert (got == keys + 1_000_000).all()


def test_the_leader_killed_another_is_elected_and_the_catalog_changes_go_on() -> None:
    with _grid() as g:
        t = g.create_table("lead", partitions=8, replication=2, value_type="i64")
        base = load(t, 5_000)
        leader = _leader(g)
        i = g.addresses.index(leader)
        g.kill(i)
        killed = time.monotonic()
        others = [a for a in g.addresses if a != leader]

        def new_leader() -> bool:
            st = [s for s in _status(g) if s["server"] in others]
            names = {s.get("meta_leader", "none").split(" ")[0] for s in st}
            return len(st) == 2 and len(names) == 1 and names.pop() in others

        _wait("a new leader", new_leader)
        print(f"new leader after {time.monotonic() - killed:.2f} s")
        # The catalog changes again: a table created, a version loaded and switched, writes acknowledged.
        _wait("failed over", lambda: all(leader not in s["servers"].split(",") for s in _status(g)))
        t2 = g.create_table("after", partitions=8, replication=2, value_type="i64")
        load(t2, 1_000)
        with t.new_version() as v:
            v.put_many(base, value_of(base))
        check_all(g.spec, "lead", base)
        check_all(g.spec, "after", np.arange(1_000, dtype=np.int64))


def _create_racing(spec: str, name: str, dim: int, start: Any, outcomes: list[str]) -> None:
    c = ramgrid.connect(spec)  # each its own client, as two jobs would be
    start.wait()
    try:
        c.create_table(name, partitions=8, replication=2, value_type=("f32vec", dim))
        outcomes.append(f"won {dim}")
    except TableExists:
        outcomes.append("exists")


def test_two_clients_creating_one_table_at_once_one_wins_everywhere() -> None:
    import threading

    with _grid() as g:
        for round_ in range(5):
            name = f"race{round_}"
            outcomes: list[str] = []
            start = threading.Barrier(2)
            threads = [threading.Thread(target=_create_racing, args=(g.spec, name, d, start, outcomes)) for d in (2, 3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            winners = [o for o in outcomes if o.startswith("won")]
            assert len(outcomes) == 2 and len(winners) == 1, outcomes
            dim = int(winners[0].split()[1])
            # Every server holds the winner's table, and it works.
            t = ramgrid.connect(g.spec).table(name)
            t.put_many([b"k"], np.ones((1, dim), dtype=np.float32))
            assert t.get_many([b"k"]).shape == (1, dim)


def test_voters_removed_one_after_another_by_moves_keep_the_group_alive() -> None:
    with _grid(4) as g:
        t = g.create_table("voters", partitions=8, replication=2, value_type="i64")
        base = load(t, 5_000)
        for _ in range(2):
            st = _status(g)
            voters = [m.split(" ")[0] for m in st[0]["meta_member"].split("; ") if m.endswith(" voter")]
            leader = _leader(g)
            # A voter that is not the leader, removed by a move and stopped at once.
            victim = next(v for v in voters if v != leader and v in g.addresses)
            g.remove_server(g.addresses.index(victim))
        # The group still commits: a table is created and written, every key reads back.
        t2 = g.create_table("after", partitions=8, replication=2, value_type="i64")
        load(t2, 1_000)
        check_all(g.spec, "voters", base)
        check_all(g.spec, "after", np.arange(1_000, dtype=np.int64))


def _native_call(addr: str, opcode: str, fields: dict[str, Any]) -> dict[str, Any]:
    """One native request to one server (past HELLO; local grids have no token); its reply's fields."""
    import socket

    from ramgrid import _wire

    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as s:
        replies = []
        s.sendall(_wire.encode_message("HELLO", 1, {"protocol_version": 1, "token_hex": "", "client_name": "t"}))
        s.sendall(_wire.encode_message(opcode, 2, fields))
        buf = b""
        while len(replies) < 2:
            chunk = s.recv(65536)
            assert chunk, "server closed the connection"
            buf += chunk
            while True:
                try:
                    used = _wire.parse_frame(buf, 1 << 24)[4]
                except _wire.WireError as e:
                    if e.code != "incomplete":
                        raise
                    break
                replies.append(_wire.decode_message(buf[:used])[3])
                buf = buf[used:]
        return replies[1]


def _currents(g: Any, name: str) -> list[int]:
    """The current version of `name` on each server, asked of each alone."""
    return [int(_native_call(a, "DESCRIBE_TABLE", {"name": name})["table"]["current_version"]) for a in g.addresses]


def test_a_switch_sent_to_one_server_is_installed_on_every_server() -> None:
    """The current version is the group's: SET_CURRENT sent to a single server (as a client that died after its
    first request would leave it) is committed and installed by every server, in commit order."""
    with _grid() as g:
        t = g.create_table("sw", partitions=8, replication=2, value_type="i64")
        base = load(t, 2_000)
        before = _currents(g, "sw")
        assert len(set(before)) == 1 and before[0] > 0, before
        c = g._client()
        v2 = int(c.create_version("sw"))
        c.seal_version("sw", v2)  # empty: a switch to it is plain to see
        reply = _native_call(g.addresses[2], "SET_CURRENT", {"table": "sw", "version": v2})
        assert reply["status"] == "OK", reply
        _wait("every server switched", lambda: _currents(g, "sw") == [v2] * 3, timeout=10)
        # Then another, through another server: the last committed switch wins everywhere.
        v3 = int(c.create_version("sw"))
        _put(c, "sw", base, value_of(base), v3)
        c.seal_version("sw", v3)
        assert _native_call(g.addresses[0], "SET_CURRENT", {"table": "sw", "version": v3})["status"] == "OK"
        _wait("every server switched again", lambda: _currents(g, "sw") == [v3] * 3, timeout=10)
        check_all(g.spec, "sw", base)
        # A version that is not sealed everywhere is refused, and nothing switches.
        v4 = int(c.create_version("sw"))
        assert (
            _native_call(g.addresses[1], "SET_CURRENT", {"table": "sw", "version": v4})["status"]
            == "VERSION_NOT_SEALED"
        )
        assert _currents(g, "sw") == [v3] * 3


def _new_versions(spec: str, name: str, keys: Any, rounds: int, start: Any, got: list[int], errors: list[str]) -> None:
    t = ramgrid.connect(spec).table(name)
    start.wait()
    for _ in range(rounds):
        try:
            with t.new_version() as v:
                v.put_many(keys, value_of(keys) + v.version)
            got.append(v.version)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(repr(e))


def test_two_clients_creating_versions_at_once_never_share_a_number() -> None:
    """Each version number names one content: of two clients that choose the same number, the group gives it to
    the first committed and the other takes the next, on every server."""
    import threading

    with _grid() as g:
        g.create_table("vr", partitions=8, replication=2, value_type="i64")
        keys = np.arange(500, dtype=np.int64)
        got: list[int] = []
        errors: list[str] = []
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=_new_versions, args=(g.spec, "vr", keys, 4, start, got, errors)) for _ in range(2)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors, errors
        assert len(got) == 8 and len(set(got)) == 8, got
        # Every server agrees on the current version, and it holds that version's own values.
        currents = _currents(g, "vr")
        assert len(set(currents)) == 1, currents
        cur = currents[0]
        assert ramgrid.connect(g.spec).table("vr").get_many(keys).tolist() == (value_of(keys) + cur).tolist()


def test_cluster_status_shows_a_repair_in_progress() -> None:
    """A learner restarted empty while a voter (the only other replica of some of its partitions) is paused: the
    repair copies what the live servers give and waits for the rest, and `ramgrid cluster status` shows it in
    progress (partitions still pending, bytes copied); once the voter resumes the repair ends. A long failure
    timeout keeps the paused voter in the spec, so nothing is failed over meanwhile."""
    import subprocess
    import sys

    from ramgrid.cli import _role

    with ramgrid.local(servers=4, memory="64MiB", extra_args=["--failure-timeout-ms", "60000"]) as g:
        t = g.create_table("rep", partitions=32, replication=2, value_type="i64")
        keys = np.arange(40_000, dtype=np.int64)
        t.put_many(keys, keys * 3)
        _wait("a learner among the members", lambda: any(_role(s) == "learner" for s in _status(g)))
        roles = {s["server"]: _role(s) for s in _status(g)}
        learner = next(i for i, a in enumerate(g.addresses) if roles[a] == "learner")
        voter = next(i for i, a in enumerate(g.addresses) if roles[a] == "voter")
        pid = g.pids[voter]
        os.kill(pid, signal.SIGSTOP)
        try:
            g.restart(learner)
            addr = g.addresses[learner]
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
            env["RAMGRID_SPEC"] = g.spec
            shown: list[str] = []

            def in_progress() -> bool:
                out = subprocess.run(
                    [sys.executable, "-m", "ramgrid.cli", "cluster", "status"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=40,
                    check=False,
                ).stdout
                line = next((ln for ln in out.splitlines() if ln.startswith(addr + "\t")), "")
                pending = line.split("pending partitions ")[1].split("\t")[0] if "pending partitions" in line else "0"
                shown[:] = [out]
                return int(pending) > 0 and " 0 bytes" not in line.split("copied ")[1]

            _wait("a repair in progress in `ramgrid cluster status`", in_progress, timeout=40)
        finally:
            os.kill(pid, signal.SIGCONT)
        g.wait_repaired(timeout=40)
        assert all(s["pending_partitions"] == 0 for s in _status(g))
        assert (t.get_many(keys) == keys * 3).all()
        assert "pending partitions" in shown[0]


def test_a_switch_is_installed_on_every_server_when_the_call_returns() -> None:
    """Committing a version returns once every server serves it as current, so the previous version can be dropped
    at once (a server that had the switch committed but not yet applied answered early, and refused that drop)."""
    with _grid() as g:
        t = g.create_table("installed", partitions=8, replication=2, value_type="i64")
        with t.new_version() as v:
            v.put_many([1], [0])
        prev = t.current_version()
        t.drop_version(1)
        for i in range(1, 16):
            with t.new_version() as v:
                v.put_many([1], [i])
            t.drop_version(prev)  # refused ("version N is current") by a server that had not installed the switch
            prev = t.current_version()
            assert t.get(1) == i
