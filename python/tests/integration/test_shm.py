"""Shared memory (docs/shared-memory.md) with real server processes: a pinned version's partitions are mapped from
the servers on this host and read in place. Reads equal the TCP path for every value type and missing keys; a
request without the token or from another Unix user is refused; a version dropped while mapped, a reader killed
while mapped, a server restarted while mapped, a segment whose checksum does not match, and a client that finds
no server on its host (forced remote) each behave as the design says."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ramgrid
from ramgrid.exceptions import RamgridError

pytestmark = pytest.mark.timeout(120)

N = 2000
MAGIC = b"RGSHM\0\0\x01"


def _grid(shm_dir: Path, servers: int = 2, **options: Any) -> ramgrid.LocalGrid:
    extra = list(options.pop("extra_args", ())) + ["--shm-dir", str(shm_dir)]
    return ramgrid.local(servers=servers, memory="128MiB", extra_args=extra, **options)


def _fill(g: ramgrid.Grid, name: str, value_type: Any, partitions: int = 8) -> ramgrid.Table:
    t = g.create_table(name, partitions=partitions, value_type=value_type)
    keys = np.array([k for k in range(N) if k % 3], dtype=np.int64)
    with t.new_version() as w:
        if value_type == "i64":
            w.put_many(keys, keys * 7 - 100)
        elif value_type == "f64":
            w.put_many(keys, keys * 0.5)
        elif value_type == "bytes":
            w.put_many(keys, [bytes([k % 256]) * (k % 40) for k in keys.tolist()])
        else:
            w.put_many(keys, np.arange(len(keys) * 4, dtype=np.float32).reshape(-1, 4))
    return t


def _same(a: tuple[Any, np.ndarray], b: tuple[Any, np.ndarray]) -> bool:
    (va, fa), (vb, fb) = a, b
    if not np.array_equal(fa, fb):
        return False
    if isinstance(va, list):
        return va == vb
    return bool(np.array_equal(va, vb))


ALL_KEYS = np.arange(-5, N + 5, dtype=np.int64)


@pytest.mark.parametrize("value_type", ["bytes", "i64", "f64", ("f32vec", 4)])
def test_reads_equal_tcp_for_every_value_type_and_missing_keys(shm_dir: Path, value_type: Any) -> None:
    with _grid(shm_dir) as g:
        t = _fill(g, "t", value_type)
        local = t.pin(shared_memory=True)
        remote = t.pin(shared_memory=False)
        d = local.describe()["shared_memory"]
        assert d is not None and d["mapped"] == list(range(8)) and len(d["servers"]) == 2
        assert remote.describe()["shared_memory"] is None
        before = g.client_stats()
        assert _same(local.lookup(ALL_KEYS), remote.lookup(ALL_KEYS))
        after = g.client_stats()
        found = int(remote.lookup(ALL_KEYS)[1].sum())
        assert after["shm_hits"] - before["shm_hits"] == found
        assert after["shm_misses"] - before["shm_misses"] == len(ALL_KEYS) - found
        # One key, and single-key reads through the handle.
        for k in (1, 3, N - 1):
            assert _same(local.lookup([k]), remote.lookup([k]))
        # The default (None) maps where it applies.
        assert t.pin().describe()["shared_memory"]["mapped"] == list(range(8))  # type: ignore[index]


def test_pipelined_and_async_reads_use_the_mapping_unless_told_not_to(shm_dir: Path) -> None:
    with _grid(shm_dir) as g:
        t = _fill(g, "piped", "i64")
        local = t.pin(shared_memory=True)
        remote = t.pin(shared_memory=False)
        batches = [ALL_KEYS[i : i + 300] for i in range(0, len(ALL_KEYS), 300)]
        want = [remote.lookup(b) for b in batches]
        found = sum(int(f.sum()) for _, f in want)

        def hits() -> int:
            return g.client_stats()["shm_hits"]

        # Mapped here: each batch is read in place, in order.
        before = hits()
        assert all(_same(a, b) for a, b in zip(local.lookup_batches(batches, depth=4), want))
        assert hits() - before == found
        # shared_memory=False: over TCP though another handle of this client maps the version.
        before = hits()
        assert all(_same(a, b) for a, b in zip(remote.lookup_batches(batches, depth=4), want))
        got = list(remote.get_many_batches(batches, default=-1))
        assert all(np.array_equal(v, np.where(f, w, -1)) for v, (w, f) in zip(got, want))
        assert hits() == before

        async def both() -> tuple[list[Any], list[Any]]:
            a = await asyncio.gather(*(local.lookup_async(b) for b in batches))
            b = await asyncio.gather(*(remote.lookup_async(b) for b in batches))
            return list(a), list(b)

        before = hits()
        a, b = asyncio.run(both())
        assert all(_same(x, w) for x, w in zip(a, want)) and all(_same(x, w) for x, w in zip(b, want))
        assert hits() - before == found


def _request(token: bytes, table: str, version: int) -> bytes:
    name = table.encode()
    body = MAGIC + struct.pack("<H", len(token)) + token + struct.pack("<H", len(name)) + name
    body += struct.pack("<QI", 0, version)
    return struct.pack("<I", len(body)) + body


# Sends one request from any process (another user's too: only the standard library), prints the reply's kind
# and text: "refused <why>" or "granted".
_ASK = """
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("refused by the file system:", e); sys.exit(0)
s.sendall(bytes.fromhex(sys.argv[2]))
def take(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: raise SystemExit("closed")
        b += c
    return b
body = take(struct.unpack("<I", take(4))[0])
if body[8] == 1:
    n = struct.unpack("<H", body[9:11])[0]
    print("refused", body[11:11 + n].decode())
else:
    print("granted")
"""


def _ask(path: Path, req: bytes, prefix: list[str] | None = None, python: str = sys.executable) -> str:
    cmd = (prefix or []) + [python, "-c", _ASK, str(path), req.hex()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _socket(shm_dir: Path, g: ramgrid.LocalGrid, i: int = 0) -> Path:
    host, port = g.addresses[i].rsplit(":", 1)
    return shm_dir / f"shm-{host}-{port}.sock"


def test_no_token_and_another_user_are_refused(shm_dir: Path) -> None:
    with _grid(shm_dir, servers=1, token="s3cret") as g:
        t = _fill(g, "guarded", "f64", partitions=4)
        v = t.current_version()
        path = _socket(shm_dir, g)
        assert _ask(path, _request(b"", "guarded", v)).startswith("refused bad or missing token")
        assert _ask(path, _request(b"wrong", "guarded", v)).startswith("refused bad or missing token")
        assert _ask(path, _request(b"s3cret", "guarded", v)) == "granted"
        if os.geteuid() != 0:
            pytest.skip("running another user's process needs root (setpriv); the token cases ran")
        # Open the path to everyone, so that only the server's own check (SO_PEERCRED) stands in the way.
        shm_dir.chmod(0o711)
        path.chmod(0o666)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        out = _ask(path, _request(b"s3cret", "guarded", v), prefix=nobody, python="/usr/bin/python3")
        assert out.startswith("refused user 65534 may not map"), out
        # With the token, the owner's client maps it.
        assert t.pin(shared_memory=True).describe()["shared_memory"]["mapped"] == [0, 1, 2, 3]  # type: ignore[index]


def test_a_version_dropped_while_mapped_stays_readable(shm_dir: Path) -> None:
    with _grid(shm_dir, servers=1) as g:
        t = _fill(g, "dropped", "i64")
        first = t.current_version()
        p = t.pin(shared_memory=True)
        want = t.pin(shared_memory=False).lookup(ALL_KEYS)
        with t.new_version() as w:
            w.put_many([1], np.array([1]))
        t.drop_version(first)
        # The server lets its segments go (its descriptors close); the reader's mapping holds the pages.
        assert _same(p.lookup(ALL_KEYS), want)
        with pytest.raises(ramgrid.exceptions.VersionNotFound):
            t.pin(first, shared_memory=False).lookup([1])


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settled_fd_count(pid: int, at_most: int | None = None, timeout: float = 10.0) -> int:
    """The server's descriptor count once it has closed a dead reader's connections.

    The server notices a killed peer's sockets asynchronously, so a count taken at once may still hold them.
    Waits until the count has held for three reads (and, given `at_most`, is no higher), up to `timeout`.
    """
    deadline = time.monotonic() + timeout
    seen = [_fd_count(pid)]
    while time.monotonic() < deadline:
        if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] and (at_most is None or seen[-1] <= at_most):
            break
        time.sleep(0.1)
        seen.append(_fd_count(pid))
    return seen[-1]


_READER = """
import sys, ramgrid
g = ramgrid.connect(sys.argv[1])
p = g.table(sys.argv[2]).pin(int(sys.argv[3]), shared_memory=True)
assert p.get(1) == -93
print("mapped", flush=True)
sys.stdin.read()
"""


def test_a_reader_killed_while_mapped_leaks_nothing(shm_dir: Path) -> None:
    with _grid(shm_dir, servers=1) as g:
        t = _fill(g, "killed", "i64")
        v = t.current_version()
        pid = g.pids[0]
        counts = []
        for _ in range(4):
            with subprocess.Popen(
                [sys.executable, "-c", _READER, g.spec, "killed", str(v)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            ) as r:
                assert r.stdout is not None and r.stdout.readline().strip() == "mapped"
                r.send_signal(signal.SIGKILL)
                r.wait(timeout=30)
            counts.append(_settled_fd_count(pid, at_most=counts[0] if counts else None))
        # The server keeps one descriptor per segment, made on the first request: no more after each reader
        # (a leak of one per reader would show as 31, 32, 33...).
        assert all(c <= counts[0] for c in counts), counts
        assert t.pin(shared_memory=True).get(2) == -86


def test_a_server_restarted_while_mapped_leaves_the_reader_its_version(shm_dir: Path) -> None:
    with _grid(shm_dir, servers=1) as g:
        t = _fill(g, "restarted", "f64")
        p = t.pin(shared_memory=True)
        want = t.pin(shared_memory=False).lookup(ALL_KEYS)
        g.restart(0)
        # The new server has no such table (memory durability); the mapping still answers the pinned version.
        assert _same(p.lookup(ALL_KEYS), want)


def test_a_segment_whose_checksum_does_not_match_is_refused(shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAMGRID_SHM_CORRUPT_FOR_TESTS", "1")  # the servers started below write damaged segments
    with _grid(shm_dir, servers=1) as g:
        monkeypatch.delenv("RAMGRID_SHM_CORRUPT_FOR_TESTS")
        t = _fill(g, "corrupt", "bytes")
        with pytest.raises(RamgridError, match="checksum|corrupt"):
            t.pin(shared_memory=True)
        p = t.pin()
        d = p.describe()["shared_memory"]
        assert d is not None and d["mapped"] == [] and "corrupt" in d["skipped"][0][1]
        # Read over TCP instead: the right values.
        assert _same(p.lookup(ALL_KEYS), t.pin(shared_memory=False).lookup(ALL_KEYS))


def test_a_client_that_finds_no_local_server_reads_over_tcp(shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _grid(shm_dir, servers=2) as g:
        t = _fill(g, "remote", "i64")
        # Forced remote: the client looks for sockets where no server put one (as on another host).
        elsewhere = Path(tempfile.mkdtemp(prefix="ramgrid-shm-none-", dir="/tmp"))
        monkeypatch.setenv("RAMGRID_SHM_DIR", str(elsewhere))
        try:
            with pytest.raises(RamgridError, match="no shared-memory socket"):
                t.pin(shared_memory=True)
            p = t.pin()
            assert p.describe()["shared_memory"]["mapped"] == []  # type: ignore[index]
            before = g.client_stats()["shm_hits"]
            assert _same(p.lookup(ALL_KEYS), t.pin(shared_memory=False).lookup(ALL_KEYS))
            assert g.client_stats()["shm_hits"] == before
        finally:
            elsewhere.rmdir()


def _equal(a: Any, b: Any) -> bool:
    """Same value and same Python type (a float32 vector: an equal 1-D float32 array)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value_type", ["bytes", "i64", "f64", ("f32vec", 4)])
def test_one_key_gets_and_batches_through_the_reader_handle_equal_tcp(shm_dir: Path, value_type: Any) -> None:
    with _grid(shm_dir, servers=1) as g:
        t = _fill(g, "one", value_type)
        local = t.pin(shared_memory=True)
        remote = t.pin(shared_memory=False)
        assert local._shm_get is not None and remote._shm_get is None
        before = g.client_stats()
        keys: list[Any] = [-1, 0, 1, 2, 3, 5, N - 1, N, 2**40, "1", b"\x01\0\0\0\0\0\0\0", "k" * 300, True]
        keys += [np.int64(3), np.int64(4), np.int32(-1), np.uint64(5)]  # numpy integer scalars are int keys
        for k in keys:
            assert _equal(local.get(k, None), remote.get(k, None)), k
            assert (k in local) == (k in remote), k
            if remote.get(k, None) is None:
                with pytest.raises(KeyError) as a:
                    local[k]
                with pytest.raises(KeyError) as b:
                    remote[k]
                assert str(a.value) == str(b.value) and a.value.args == b.value.args
            else:
                assert _equal(local[k], remote[k]), k
        hits = g.client_stats()["shm_hits"] - before["shm_hits"]
        assert hits > 0
        # Bad keys: the same errors as over TCP.
        for bad in (1.5, None, np.float64(3.0), 2**64, np.uint64(2**64 - 1)):
            with pytest.raises((TypeError, OverflowError)) as a:
                local.get(bad)
            with pytest.raises((TypeError, OverflowError)) as b:
                remote.get(bad)
            assert type(a.value) is type(b.value) and str(a.value) == str(b.value), bad
        # Batches: an int64 array (read in place), lists, a default, and the KeysNotFound of a missing key.
        for batch in (ALL_KEYS, ALL_KEYS[::-7].copy(), [1, 2, 4], ["1", b"2"], []):
            assert _same(local.lookup(batch), remote.lookup(batch))
        got, want = local.get_many(ALL_KEYS, default=-1), remote.get_many(ALL_KEYS, default=-1)
        assert got == want if isinstance(want, list) else np.array_equal(got, want)
        with pytest.raises(KeyError) as a:
            local.get_many(ALL_KEYS)
        with pytest.raises(KeyError) as b:
            remote.get_many(ALL_KEYS)
        assert str(a.value) == str(b.value)
        # More keys than the GIL is kept for.
        big = np.arange(-100, 20_000, dtype=np.int64)
        assert _same(local.lookup(big), remote.lookup(big))


def test_the_reader_handle_stops_answering_when_detached_and_in_a_forked_child(shm_dir: Path) -> None:
    from ramgrid.grid import _ELSEWHERE

    with _grid(shm_dir, servers=1) as g:
        t = _fill(g, "handle", "i64")
        p = t.pin(shared_memory=True)
        assert p._shm_get(1, None) == -93
        # A forked child does not read through the parent's handle; its reads go through its own client.
        pid = os.fork()
        if pid == 0:
            ok = p._shm_get(1, None) is _ELSEWHERE and p.get(1) == -93 and p.get(3, None) is None
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert p._shm_get(1, None) == -93
        # Detached under the handle: it stops answering from its mapping; reads go over TCP, the same values.
        c = g._client()
        assert c.shm_detach("handle", p.version, p.incarnation)
        assert p._shm_get(1, None) is _ELSEWHERE
        before = g.client_stats()["shm_hits"]
        assert p.get(1) == -93 and p[2] == -86 and 3 not in p
        assert np.array_equal(p.get_many([1, 2]), [-93, -86])
        assert g.client_stats()["shm_hits"] == before
        # The dropped version: a clear error, not the old mapping's bytes.
        with t.new_version() as w:
            w.put_many([1], np.array([1]))
        t.drop_version(p.version)
        with pytest.raises(ramgrid.exceptions.VersionNotFound):
            p.get(1)
