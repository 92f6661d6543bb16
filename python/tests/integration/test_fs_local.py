"""ramgrid.fs pieces that need no HDFS: the block store on real servers (meta protocol), the near cache, file
identity, URL handling, and the cache over fsspec's local file system (mtime as the change marker)."""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import ramgrid
from ramgrid.fs import CachedFileSystem, identity
from ramgrid.fs._blocks import BlockStore, NearCache

_names = itertools.count()


@pytest.fixture(scope="module")
def grid2() -> Iterator[ramgrid.LocalGrid]:
    with ramgrid.local(servers=2, memory="32MiB", extra_args=["--memory", "16MiB"]) as g:
        yield g


def test_block_store_round_trip_and_eviction(grid2: Any) -> None:
    store = BlockStore(grid2.servers)
    items = {f"k{os.getpid()}-{i}".encode(): os.urandom(1000 + i) for i in range(200)}
    store.set_many(items)
    assert store.get_many(list(items)) == items
    assert {store.server_for(k) for k in items} == set(grid2.servers)  # spread over both servers
    store.delete_many(list(items)[:10])
    assert set(store.get_many(list(items))) == set(list(items)[10:])
    # Far more than --memory (16 MiB per server): the servers evict, nothing fails, what is found is exact.
    big = {f"big{os.getpid()}-{i}".encode(): bytes([i % 251]) * 500_000 for i in range(100)}
    store.set_many(big)
    found = store.get_many(list(big))
    assert 0 < len(found) < len(big)
    assert all(v == big[k] for k, v in found.items())
    # Leave the module's grid with room: a full cache may evict the blocks the later tests count on finding.
    store.delete_many(list(big))
    store.close()


def test_block_store_unreachable_server_is_a_miss() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connection refused
        store = BlockStore([dead], timeout=0.5)
        store.set_many({b"a": b"1"})
        assert store.get_many([b"a"]) == {}
    with pytest.raises(ValueError, match="at least one server"):
        BlockStore([])


def test_near_cache_is_bounded() -> None:
    near = NearCache(1000)
    for i in range(20):
        near.put(str(i).encode(), b"x" * 100)
    assert near.get(b"0") is None and near.get(b"19") == b"x" * 100
    near.put(b"huge", b"x" * 2000)  # larger than the whole cache: not kept
    assert near.get(b"huge") is None


def test_identity() -> None:
    hdfs = {"size": 3, "fileId": 16387, "modificationTime": 1795698917204, "accessTime": 1}
    assert identity(hdfs) == identity(dict(hdfs, accessTime=2))  # reading a file does not change it
    assert identity(hdfs) != identity(dict(hdfs, fileId=16388))
    assert identity(hdfs) != identity(dict(hdfs, modificationTime=1795698917205))
    assert identity({"size": 3, "mtime": 1.5}) != identity({"size": 4, "mtime": 1.5})
    assert identity({"size": 3}) is None  # no change marker: no block caching


def test_strip_protocol() -> None:
    strip = CachedFileSystem._strip_protocol
    assert strip("ramgrid::webhdfs://h:9870/a/b.csv") == "/a/b.csv"
    assert strip("ramgrid://a/b") == "/a/b"
    assert strip("/a/b/") == "/a/b"
    assert strip("ramgrid") == ""


def test_cache_over_the_local_file_system(grid2: Any, tmp_path: Path) -> None:
    local = fsspec.filesystem("file")
    data = os.urandom(300_000)
    (tmp_path / "a.bin").write_bytes(data)
    fs = CachedFileSystem(
        local, grid2, table=f"fslocal_{next(_names)}", block_size=64 * 1024, ttl=600, skip_instance_cache=True
    )
    path = str(tmp_path / "a.bin")
    for _ in range(2):
        assert fs.cat_file(path) == data
        assert fs.cat_file(path, 70_000, 200_000) == data[70_000:200_000]
    assert fs.counters["block_fs"] == 5
    fs.pipe_file(path, b"new")
    assert fs.cat_file(path) == b"new"
    assert fs.ls(str(tmp_path), detail=False) == [path]
    fs.rm(path)
    assert not fs.exists(path)


def test_a_read_whose_tail_is_cached_joins_the_cached_blocks(grid2: Any, tmp_path: Path) -> None:
    """Regression: a range missing its first blocks but not its last was answered from the file-system request
    alone, which stopped before the cached tail (short, wrong bytes; found when a grid server was killed)."""
    local = fsspec.filesystem("file")
    bs = 64 * 1024
    data = os.urandom(5 * bs)
    (tmp_path / "t.bin").write_bytes(data)
    path = str(tmp_path / "t.bin")
    fs = CachedFileSystem(
        local, grid2, table=f"fslocal_{next(_names)}", block_size=bs, near_cache_bytes=0, skip_instance_cache=True
    )
    assert fs.cat_file(path, 3 * bs, 5 * bs) == data[3 * bs :]  # caches blocks 3 and 4 only
    fs.flush_pending()
    assert fs.cat_file(path, 1000, 5 * bs - 10) == data[1000 : 5 * bs - 10]  # blocks 0-2 missing, 3-4 cached
    assert fs.counters["block_grid"] == 2


def test_random_ranges_over_random_cache_states_are_exact(grid2: Any, tmp_path: Path) -> None:
    """Every mix of blocks in the near cache, in the grid and missing, read sequentially or at random: exact."""
    rng = random.Random(11)
    local = fsspec.filesystem("file")
    bs = 4096
    for i in range(40):
        data = rng.randbytes(rng.randrange(1, 7 * bs))
        path = str(tmp_path / f"r{i}.bin")
        Path(path).write_bytes(data)
        fs = CachedFileSystem(
            local,
            grid2,
            table=f"fslocal_{next(_names)}",
            block_size=bs,
            readahead=rng.randrange(0, 3),
            near_cache_bytes=rng.choice([0, 1 << 20]),
            skip_instance_cache=True,
        )
        for n in range(7):  # cache a random subset of the blocks
            if rng.random() < 0.4:
                assert fs.cat_file(path, n * bs, (n + 1) * bs) == data[n * bs : (n + 1) * bs]
        if rng.random() < 0.5:
            fs.flush_pending()
        for _ in range(5):
            a, b = sorted(rng.randrange(0, len(data) + 1) for _ in range(2))
            assert fs.cat_file(path, a, b) == data[a:b]
        with fs.open(path) as f:
            got = b""
            while chunk := f.read(rng.randrange(1, 3 * bs)):
                got += chunk
        assert got == data


def test_blocks_on_servers_that_require_a_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Servers of a real deployment require the token (docs/deploy.md): the block store authenticates with the
    grid's, and a wrong token disables the block cache loudly while reads stay exact."""
    data = os.urandom(200_000)
    (tmp_path / "t.bin").write_bytes(data)
    path = str(tmp_path / "t.bin")
    local = fsspec.filesystem("file")
    with ramgrid.local(servers=2, memory="32MiB", token="s3cret") as g:
        opts: dict[str, Any] = {"block_size": 64 * 1024, "ttl": 600, "skip_instance_cache": True}
        writer = CachedFileSystem(local, g, table="fstoken", **opts)
        assert writer.cat_file(path) == data
        writer.flush_pending()
        reader = CachedFileSystem(local, g, table="fstoken", near_cache_bytes=0, **opts)
        assert reader.cat_file(path) == data
        assert reader.counters["block_grid"] == 4 and reader.counters["block_fs"] == 0

        store = BlockStore(g.servers, token="wrong", timeout=2.0)
        with caplog.at_level("ERROR", logger="ramgrid.fs._blocks"):
            assert store.get_many([b"anything"]) == {}
        assert "refused the grid's token" in caplog.text
        store.close()


@pytest.mark.timeout(60)
def test_a_server_killed_under_an_open_connection_is_a_miss_for_every_request() -> None:
    """The store's connection outlives the server: get, set and delete each end (the server marked down), never
    wait on the closed socket (delete once looped on its empty reads)."""
    with ramgrid.local(servers=1, memory="32MiB") as g:
        store = BlockStore(g.servers, timeout=2.0)
        store.set_many({b"k": b"v"})
        assert store.get_many([b"k"]) == {b"k": b"v"}
        g.kill(0)
        for request in (
            lambda: store.delete_many([b"k"]),
            lambda: store.set_many({b"k": b"w"}),
            lambda: store.get_many([b"k"]),
        ):
            store._down_until.clear()  # ask the dead server again: each request must end on the closed socket
            request()
        assert store.get_many([b"k"]) == {}
        store.close()
