"""Log tables (docs/durability.md): on servers started with --data-dir, every PUT and DELETE of
an open version of a durability="log" table is in its write-ahead log, fsynced, before it is acknowledged. Servers
killed with SIGKILL while writers run and started again on the same data dirs serve every acknowledged key exactly
(deleted keys absent), each of the two replicas on its own; a write the log cannot take (the file size limit standing
in for a full disk) is refused with the data directory's error, not acknowledged."""

from __future__ import annotations

import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ramgrid
from ramgrid import _native
from ramgrid._local import server_env
from ramgrid.exceptions import PartitionsUnavailable

pytestmark = pytest.mark.timeout(180)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """Servers on fixed loopback ports, each with its own data dir and the same spec file, that a test can SIGKILL
    and start again on the same address (optionally under a file size limit)."""

    def __init__(self, root: Path, n: int, threads: int = 2) -> None:
        self.root = root
        self.threads = threads
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.spec_file = root / "spec"
        self.spec_file.write_text("".join(f"server {a}\n" for a in self.addrs))
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.starts = [0] * n

    def data_dir(self, i: int) -> Path:
        return self.root / f"data{i}"

    def stderr(self, i: int) -> str:
        return (self.root / f"server{i}-{self.starts[i]}.err").read_text(errors="replace")

    def start(self, i: int, fsize_limit: int | None = None) -> None:
        self.starts[i] += 1
        args = [sys.executable, "-m", "ramgrid._serve", "--listen", self.addrs[i], "--threads", str(self.threads)]
        args += ["--table-memory", "1GiB", "--cluster-spec", str(self.spec_file), "--data-dir", str(self.data_dir(i))]
        out_path = self.root / f"server{i}-{self.starts[i]}.out"
        out = open(out_path, "wb")  # noqa: SIM115 - the child keeps its own copy
        err = open(self.root / f"server{i}-{self.starts[i]}.err", "wb")  # noqa: SIM115
        env = server_env(None, parent_watch=False)
        # Under a file size limit a write past it fails with EFBIG (a full disk, unprivileged) once SIGXFSZ is
        # ignored: the child inherits our ignored disposition (restore_signals=False), then gets the limit.
        old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN) if fsize_limit is not None else None
        try:
            proc = subprocess.Popen(
                args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, restore_signals=fsize_limit is None
            )
        finally:
            if old is not None:
                signal.signal(signal.SIGXFSZ, old)
        if fsize_limit is not None:
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
        self.procs[i] = proc
        out.close()
        err.close()
        deadline = time.monotonic() + 30
        while b"listening on" not in out_path.read_bytes():
            proc = self.procs[i]
            assert proc is not None
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {i} did not start: {self.stderr(i)}")
            time.sleep(0.01)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def grid(c: Cluster, ack: str = "all") -> ramgrid.Grid:
    return ramgrid.connect(c.addrs, timeout=2.0, call_timeout=5.0, ack=ack)


def wait_repaired(c: Cluster, up: list[int], timeout: float = 30.0) -> None:
    """Waits until every server in `up` has no partition left to copy in (or to reconcile with a replica after
    replaying its logs), has caught up with the metadata group (a server restarted from its data directory serves
    nothing before: what it holds may be behind) and, if another server is up, has learned the tables from it."""
    deadline = time.monotonic() + timeout
    g = grid(c)
    try:
        while True:
            status = {s["server"]: s for s in g.status()}
            mine = [status.get(c.addrs[i], {}) for i in up]
            learned = len(up) == 1 or all(s.get("catalog_learned") == 1 for s in mine)
            caught_up = all(s.get("quorum") in ("ok", "no-group") for s in mine)
            if learned and caught_up and all(s.get("ok") and s.get("pending_partitions") == 0 for s in mine):
                return
            assert time.monotonic() < deadline, f"not repaired within {timeout} s: {mine}"
            time.sleep(0.05)
    finally:
        g.close()


def read_alone(c: Cluster, keys: np.ndarray, want: dict[int, float], partitions: int) -> int:
    """With every server but one down, reads `keys` through the client: the partitions the live server holds must
    read exactly as `want` (absent keys as misses), the others must fail as unavailable (never as misses). Returns
    the number of keys checked."""
    g = grid(c)
    try:
        t = g.table(g.tables()[0])
        with pytest.raises(PartitionsUnavailable) as e:
            t.get_many(keys, default=-7.0)
        lost = set(e.value.partitions)
        part = np.array([_native.partition_of(int(k), partitions) for k in keys])
        mine = keys[~np.isin(part, list(lost))]
        assert len(mine) > len(keys) // 3, (len(mine), lost)
        got = t.get_many(mine, default=-7.0)
        expected = np.array([want.get(int(k), -7.0) for k in mine])
        bad = np.flatnonzero(got != expected)
        assert not len(bad), f"{len(bad)} keys wrong, e.g. key {mine[bad[0]]}: {got[bad[0]]} != {expected[bad[0]]}"
        return len(mine)
    finally:
        g.close()


def values_of(keys: np.ndarray) -> np.ndarray:
    return keys * 0.5 + 1.0


def test_acknowledged_writes_survive_sigkill_of_every_replica(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 2)
    try:
        for i in range(2):
            c.start(i)
        g = grid(c)
        t = g.create_table("live", partitions=16, replication=2, value_type="f64", durability="log")
        assert t.describe()["durability"] == "log"
        acked: list[np.ndarray] = []  # put batches acknowledged by both replicas (ack=all)
        deleted: list[np.ndarray] = []  # delete batches acknowledged
        unknown: list[np.ndarray] = []  # batches in flight at the kill: either outcome is allowed
        lock = threading.Lock()
        stop = threading.Event()
        batch = 500

        def writer(w: int) -> None:
            wg = grid(c)
            tt = wg.table("live")
            n = 0
            while not stop.is_set():
                keys = np.arange(batch, dtype=np.int64) + (w * 10_000_000 + n * batch)
                n += 1
                try:
                    tt.put_many(keys, values_of(keys))
                except ramgrid.RamgridError:
                    with lock:
                        unknown.append(keys)
                    return
                with lock:
                    acked.append(keys)
                if n % 4 == 0:
                    gone = keys[::7]
                    try:
                        tt.delete_many(gone)
                    except ramgrid.RamgridError:
                        with lock:
                            unknown.append(gone)
                        return
                    with lock:
                        deleted.append(gone)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with lock:
                if sum(len(a) for a in acked) >= 40_000:
                    break
            time.sleep(0.05)
        # Real kill -9 of both replicas while the writers are mid-stream.
        c.kill(0)
        c.kill(1)
        stop.set()
        for th in threads:
            th.join(timeout=30)
        g.close()
        assert sum(len(a) for a in acked) >= 10_000, "too few writes acknowledged to test anything"
        print(
            f"acked {sum(len(a) for a in acked)} keys, deleted {sum(len(d) for d in deleted)}, in doubt {sum(len(u) for u in unknown)}"
        )

        all_keys = np.concatenate(acked)
        gone = np.concatenate(deleted) if deleted else np.array([], dtype=np.int64)
        doubt = np.concatenate(unknown) if unknown else np.array([], dtype=np.int64)
        gone_set, doubt_set = set(gone.tolist()), set(doubt.tolist())
        present = np.array([k for k in all_keys.tolist() if k not in gone_set and k not in doubt_set], dtype=np.int64)
        absent = np.array([k for k in gone.tolist() if k not in doubt_set], dtype=np.int64)

        for i in range(2):
            c.start(i)
            assert "replayed from their logs" in c.stderr(i), c.stderr(i)
        # Restarted from their data directories, they serve once they have caught up with the group (both are
        # needed for its majority) and reconciled their logs with each other.
        wait_repaired(c, [0, 1])

        def check() -> None:
            g = grid(c)
            t = g.table("live")
            assert t.describe()["durability"] == "log"
            got = t.get_many(present)
            assert np.array_equal(got, values_of(present))
            if len(absent):
                assert np.array_equal(t.get_many(absent, default=-7.0), np.full(len(absent), -7.0))
            g.close()

        check()  # both replicas up
        # A restarted replica whose peer serves copies its partitions from it (reconciling its log) before it
        # serves them; its peer goes down only once that is done, or reads would wait for its next repair pass.
        wait_repaired(c, [0, 1])
        c.kill(0)
        check()  # replica 1 alone
        c.start(0)
        wait_repaired(c, [0, 1])
        c.kill(1)
        check()  # replica 0 alone
        c.start(1)
        # The replayed version still takes writes, logged as before.
        g = grid(c)
        g.table("live").put_many(np.array([-1]), np.array([3.25]))
        g.close()
        c.kill(0)
        c.start(0)
        g = grid(c)
        assert g.table("live").get(-1) == 3.25
        g.close()
    finally:
        c.close()


def test_a_full_disk_refuses_the_write_and_acknowledged_ones_survive(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 1, threads=1)
    try:
        c.start(0, fsize_limit=1 << 20)
        g = grid(c)
        t = g.create_table("full", partitions=4, value_type="bytes", durability="log")
        with pytest.raises(ValueError, match='"log"'):
            g.create_table("bad", durability="disk")
        acked: list[int] = []
        refused = None
        for n in range(200):
            keys = list(range(n * 100, n * 100 + 100))
            try:
                t.put_many(keys, [b"v%d-" % k + b"x" * 100 for k in keys])
            except ramgrid.RamgridError as e:
                refused = e
                break
            acked.extend(keys)
        assert refused is not None, "the file size limit was never reached"
        msg = str(refused)
        assert "data directory" in msg and "cannot append to" in msg and "v1.log" in msg, msg
        assert acked, "no write fitted under the limit"
        # The log has failed: later writes are refused too, before anything is applied.
        with pytest.raises(ramgrid.RamgridError, match="data directory"):
            t.put(10**9, b"late")
        g.close()
        c.kill(0)
        c.start(0)
        g = grid(c)
        t = g.table("full")
        assert t.get_many(acked) == [b"v%d-" % k + b"x" * 100 for k in acked]
        assert t.get(10**9, default=None) is None
        t.put(10**9, b"after")  # writes work again once the disk has room
        assert t.get(10**9) == b"after"
        g.close()
    finally:
        c.close()


def test_a_restarted_server_reconciles_its_replayed_log_with_a_live_replica(tmp_path: Path) -> None:
    """ack="one" writes (puts, overwrites, deletes) acknowledged while a server was down are not in its log; restarted
    on its data dir it must not serve its replay as it is, but copy what a live replica holds (keeping what was
    written to it since), log that copy, and so serve every key exactly on its own, now and after another restart.
    A whole-cluster restart then serves every acknowledged write."""
    parts = 16
    c = Cluster(tmp_path, 3)
    try:
        for i in range(3):
            c.start(i)
        g = grid(c)
        t = g.create_table("rec", partitions=parts, replication=2, value_type="f64", durability="log")
        keys = np.arange(30_000, dtype=np.int64)
        t.put_many(keys, values_of(keys))
        want = {int(k): float(v) for k, v in zip(keys, values_of(keys))}
        g.close()

        c.kill(0)
        g1 = grid(c, ack="one")
        t1 = g1.table("rec")
        changed = keys[::3]
        t1.put_many(changed, values_of(changed) + 100.0)  # overwrites server 0 has not seen
        gone = keys[1::5]
        t1.delete_many(gone)  # deletes server 0 has not seen
        fresh = np.arange(50_000, 55_000, dtype=np.int64)
        t1.put_many(fresh, values_of(fresh))  # keys server 0 never had
        g1.close()
        want.update({int(k): float(v) for k, v in zip(changed, values_of(changed) + 100.0)})
        for k in gone.tolist():
            want.pop(int(k), None)
        want.update({int(k): float(v) for k, v in zip(fresh, values_of(fresh))})
        every = np.concatenate([keys, fresh])

        c.start(0)
        err = c.stderr(0)
        assert "replayed from their logs" in err and "to reconcile with a replica" in err, err
        wait_repaired(c, [0, 1, 2])
        assert "dropped here" in c.stderr(0), c.stderr(0)  # the deletes it missed
        g = grid(c)
        got = g.table("rec").get_many(every, default=-7.0)
        assert np.array_equal(got, np.array([want.get(int(k), -7.0) for k in every]))
        g.close()

        # Server 0 alone: what it serves is the replica's copy, not its stale replay.
        c.kill(1)
        c.kill(2)
        assert read_alone(c, every, want, parts) > 0
        # Its log took the copy (deletions included): restarted with no replica up, it serves its replay as it is.
        c.kill(0)
        c.start(0)
        wait_repaired(c, [0])
        assert "served as replayed from this server's log" in c.stderr(0), c.stderr(0)
        read_alone(c, every, want, parts)

        # A whole-cluster restart: every log replayed, every replica serves, every acknowledged write is there.
        c.kill(0)
        for i in range(3):
            c.start(i)
        wait_repaired(c, [0, 1, 2])
        g = grid(c)
        got = g.table("rec").get_many(every, default=-7.0)
        assert np.array_equal(got, np.array([want.get(int(k), -7.0) for k in every]))
        g.close()
    finally:
        c.close()


def test_a_damaged_log_is_set_aside_and_its_version_copied_from_a_replica(tmp_path: Path) -> None:
    """A log damaged in the middle (not a torn tail) is not replayed: it is set aside, its version is refused on
    that server while no replica can give it (reads fail, never misses), and copied from a replica as soon as one
    is up; the copy goes into a new log, so a later restart serves it on its own."""
    parts = 8
    c = Cluster(tmp_path, 2)
    try:
        for i in range(2):
            c.start(i)
        g = grid(c)
        t = g.create_table("dmg", partitions=parts, replication=2, value_type="f64", durability="log")
        keys = np.arange(20_000, dtype=np.int64)
        for chunk in np.array_split(keys, 10):  # several records
            t.put_many(chunk, values_of(chunk))
        g.close()
        want = {int(k): float(v) for k, v in zip(keys, values_of(keys))}
        c.kill(0)
        c.kill(1)
        [log] = list(c.data_dir(0).glob("tables/dmg-*/v1.log"))
        data = bytearray(log.read_bytes())
        data[len(data) // 2] ^= 0xFF
        log.write_bytes(bytes(data))

        # No replica up: the version is refused here, never served short.
        c.start(0)
        err = c.stderr(0)
        assert "set aside" in err and "v1.log.corrupt" in err, err
        g = grid(c)
        with pytest.raises(ramgrid.RamgridError):
            g.table("dmg").get_many(keys, default=-7.0)
        g.close()
        assert (log.parent / "v1.log.corrupt").exists()

        # The replica comes back: server 0 copies the version from it.
        c.start(1)
        wait_repaired(c, [0, 1])
        c.kill(1)
        assert read_alone_all(c, keys, want)
        # The copy is in server 0's new log: a restart replays it and copies nothing. Alone, the restarted server
        # serves nothing: without its peer the group has no majority, so it cannot know that what it holds is
        # current (a switch committed while it was down, say). With its peer back, both serve the version.
        c.kill(0)
        c.start(0)
        assert "copy from (its log was damaged)" not in c.stderr(0), c.stderr(0)
        g = grid(c)
        with pytest.raises(ramgrid.RamgridError, match="NO_QUORUM"):
            g.table("dmg").get_many(keys[:10])
        g.close()
        c.start(1)
        wait_repaired(c, [0, 1])
        assert read_alone_all(c, keys, want)  # (both up: every key exactly)
    finally:
        c.close()


def read_alone_all(c: Cluster, keys: np.ndarray, want: dict[int, float]) -> bool:
    """Replication 2 on 2 servers: the one up (or both) holds every partition and must serve every key exactly."""
    g = grid(c)
    try:
        got = g.table("dmg").get_many(keys, default=-7.0)
        return bool(np.array_equal(got, np.array([want.get(int(k), -7.0) for k in keys])))
    finally:
        g.close()


def test_a_data_dir_from_another_grid_is_not_served(tmp_path: Path) -> None:
    """A server restarted on the data dir of a server of another grid, whose table of the same name is another
    incarnation with another value type: requests name the incarnation, so the foreign table answers none of them
    (reads go to the other replica); the repair thread replaces it with this grid's incarnation, copied from the
    replicas, and the server then serves this grid's values on its own."""
    parts = 8
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Cluster(tmp_path / "a", 3)
    b = Cluster(tmp_path / "b", 1)
    try:
        for i in range(3):
            a.start(i)
        b.start(0)
        keys = np.arange(20_000, dtype=np.int64)
        ga = grid(a)
        ta = ga.create_table("t", partitions=parts, replication=2, value_type="f64", durability="log")
        ta.put_many(keys, values_of(keys))
        ga.close()
        gb = grid(b)
        tb = gb.create_table("t", partitions=parts, value_type="i64", durability="log")
        tb.put_many(keys, keys * 7)
        gb.close()
        b.kill(0)

        # Server 0 of grid a comes back with grid b's data dir.
        a.kill(0)
        shutil.rmtree(a.data_dir(0))
        shutil.copytree(b.data_dir(0), a.data_dir(0))
        a.start(0)
        g = grid(a)
        got = g.table("t").get_many(keys, default=-7.0)
        assert np.array_equal(got, values_of(keys))
        g.close()
        wait_repaired(a, [0, 1, 2])
        err = a.stderr(0)
        assert "replacing it" in err, err
        a.kill(1)
        a.kill(2)
        want = {int(k): float(v) for k, v in zip(keys, values_of(keys))}
        read_alone(a, keys, want, parts)
        # The foreign table's directory is gone; this grid's is on disk (its log took the copy).
        dirs = sorted(p.name for p in (a.data_dir(0) / "tables").iterdir())
        assert len(dirs) == 1 and dirs[0] == next((a.data_dir(1) / "tables").iterdir()).name, dirs
        a.kill(0)
        a.start(0)
        wait_repaired(a, [0])
        read_alone(a, keys, want, parts)
    finally:
        a.close()
        b.close()


def test_a_full_disk_refuses_a_seal_and_keeps_the_sealed_versions(tmp_path: Path) -> None:
    """A snapshot seal whose image cannot be written (the file size limit standing in for a full disk) is refused
    with the data directory's error naming the file; the version is not sealed (the writer drops it), the previous
    version stays current and exact, and a restart serves exactly what was sealed before, nothing of the failed
    version."""
    c = Cluster(tmp_path, 1, threads=1)
    try:
        c.start(0, fsize_limit=1 << 20)
        g = grid(c)
        t = g.create_table("snap", partitions=2, value_type="bytes", durability="snapshot")
        small = list(range(500))
        with t.new_version() as v:
            v.put_many(small, [b"s%d" % k for k in small])
        big = list(range(4000))
        w = t.new_version()
        w.begin()
        w.put_many(big, [b"b%d-" % k + b"x" * 1000 for k in big])  # about 2 MB per partition image
        with pytest.raises(ramgrid.RamgridError) as e:
            w.commit()
        msg = str(e.value)
        assert "data directory" in msg and "cannot write" in msg and ".img" in msg, msg
        assert t.current_version() == 2
        assert [x["version"] for x in t.versions() if x["sealed"]] == [2]
        assert t.get_many(small) == [b"s%d" % k for k in small]
        g.close()
        c.kill(0)
        c.start(0)  # no limit now
        g = grid(c)
        t = g.table("snap")
        assert t.current_version() == 2
        assert t.get_many(small) == [b"s%d" % k for k in small]
        assert 3 not in [x["version"] for x in t.versions()]
        assert not list(c.data_dir(0).glob("tables/snap-*/v3"))
        g.close()
    finally:
        c.close()
