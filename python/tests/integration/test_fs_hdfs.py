"""ramgrid.fs against a real HDFS: Hadoop's MiniDFSCluster with WebHDFS on loopback (one per session).

Each test works in its own HDFS directory and its own metadata table. "Another client" is a plain fsspec WebHDFS
file system that bypasses the cache; "another process" is a second CachedFileSystem with its own near caches.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
import ramgrid
from ramgrid.fs import CachedFileSystem, FileChangedError, identity
from ramgrid.fs.minihdfs import MiniHDFS

pytestmark = pytest.mark.hdfs

_names = itertools.count()
_STATUS_FIELDS = ("name", "type", "size", "fileId", "modificationTime")


@pytest.fixture(scope="session")
def hdfs() -> Iterator[MiniHDFS]:
    with MiniHDFS(start_timeout=120) as h:
        yield h


@pytest.fixture(scope="session")
def fsgrid() -> Iterator[ramgrid.LocalGrid]:
    with ramgrid.local(servers=2, memory="64MiB", extra_args=["--memory", "64MiB"]) as g:
        yield g


@pytest.fixture
def target(hdfs: MiniHDFS) -> Any:
    return hdfs.filesystem()


@pytest.fixture
def base(target: Any) -> str:
    d = f"/t{os.getpid()}-{next(_names)}"
    target.makedirs(d, exist_ok=True)
    return d


def cached(target: Any, grid: Any, **kw: Any) -> CachedFileSystem:
    kw.setdefault("table", f"fsmeta_{os.getpid()}_{next(_names)}")
    kw.setdefault("block_size", 64 * 1024)
    return CachedFileSystem(target, grid, skip_instance_cache=True, **kw)


def status(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(e.get(f) for f in _STATUS_FIELDS) for e in entries)


def test_listing_and_status_equal_uncached(target: Any, fsgrid: Any, base: str) -> None:
    for i in range(5):
        target.pipe_file(f"{base}/f{i}.csv", b"a,b\n" * (i + 1))
    target.makedirs(f"{base}/sub")
    target.pipe_file(f"{base}/sub/g.txt", b"x")
    fs = cached(target, fsgrid)
    for _ in range(2):  # the first pass fills the cache, the second is served from it
        assert status(fs.ls(base)) == status(target.ls(base, detail=True))
        assert sorted(fs.ls(base, detail=False)) == sorted(target.ls(base, detail=False))
        for p in [f"{base}/f3.csv", f"{base}/sub", base]:
            assert status([fs.info(p)]) == status([target.info(p)])
        assert fs.exists(f"{base}/f0.csv") and not fs.exists(f"{base}/nope")
        assert fs.glob(f"{base}/*.csv") == target.glob(f"{base}/*.csv")
        assert fs.find(base) == target.find(base)
    with pytest.raises(FileNotFoundError):
        fs.info(f"{base}/nope")
    before = fs.counters["meta_fs"]
    fs.ls(base)
    fs.info(f"{base}/f1.csv")
    assert fs.counters["meta_fs"] == before  # served from the cache


def test_reads_equal_uncached(target: Any, fsgrid: Any, base: str) -> None:
    rng = random.Random(7)
    data = rng.randbytes(1_300_000)  # 20 blocks of 64 KiB, the last one short
    path = f"{base}/data.bin"
    target.pipe_file(path, data)
    fs = cached(target, fsgrid)
    for _ in range(2):
        assert fs.cat_file(path) == data
        for start, end in [(0, 1), (65535, 65537), (100, 900_000), (1_299_990, 1_300_000), (-10, None), (5, -5)]:
            assert fs.cat_file(path, start, end) == data[start:end]
        with fs.open(path, "rb") as f:  # sequential, in odd-sized chunks
            chunks = []
            while chunk := f.read(70_001):
                chunks.append(chunk)
        assert b"".join(chunks) == data
        with fs.open(path, "rb") as f:  # random
            for _ in range(50):
                off, n = rng.randrange(len(data)), rng.randrange(1, 200_000)
                f.seek(off)
                assert f.read(n) == data[off : off + n]
    assert fs.counters["block_fs"] == 20  # every block came from HDFS once
    other = cached(target, fsgrid, table=fs.table_name)  # another process: empty near caches
    assert other.cat_file(path) == data
    assert other.counters["block_fs"] == 0 and other.counters["block_grid"] == 20


def test_external_change_seen_within_ttl(target: Any, fsgrid: Any, base: str) -> None:
    ttl = 1.0
    path = f"{base}/f.txt"
    target.pipe_file(path, b"old contents")
    fs = cached(target, fsgrid, ttl=ttl, near_ttl=0.2)
    assert fs.cat_file(path) == b"old contents"
    assert fs.ls(base, detail=False) == [path]
    for new in [b"new contents", b"newer, longer contents"]:  # same size (new fileId), then another size
        target.pipe_file(path, new)
        target.pipe_file(f"{base}/added-{len(new)}.txt", b"1")
        changed_at = time.time()  # both changes are complete: the bound runs from here at the latest
        while True:
            got = fs.cat_file(path)
            if time.time() - changed_at > ttl:
                break
            assert got in (b"old contents", b"new contents", new)  # stale allowed only within the bound
        # Past the bound: the change is seen, on every path that could serve it.
        assert fs.cat_file(path) == new
        assert f"{base}/added-{len(new)}.txt" in fs.ls(base, detail=False)
        with fs.open(path) as f:
            assert f.read() == new


def test_blocks_read_during_a_change_are_never_stored(target: Any, fsgrid: Any, base: str) -> None:
    path = f"{base}/r.bin"
    target.pipe_file(path, b"1" * 200_000)
    fs = cached(target, fsgrid, ttl=600)
    old = fs.info(path)
    assert fs.cat_file(path) == b"1" * 200_000  # returned at once; stored only once its identity is confirmed
    target.pipe_file(path, b"2" * 200_000)  # same size, new file: changed before the confirmation
    fs.flush_pending()
    assert fs.counters["changed"] == 1
    old_keys = [fs._block_key(path, identity(old), n) for n in range(4)]
    assert fs.blocks.get_many(old_keys) == {}  # nothing stored under the old identity
    assert fs.cat_file(path) == b"2" * 200_000  # the metadata was dropped too
    fs.flush_pending()
    assert len(fs.blocks.get_many([fs._block_key(path, identity(fs.info(path)), n) for n in range(4)])) == 4


def test_writes_through_the_cache_invalidate_at_once(target: Any, fsgrid: Any, base: str) -> None:
    fs = cached(target, fsgrid, ttl=600)  # nothing expires during the test: only invalidation can refresh
    peer = cached(target, fsgrid, table=fs.table_name, ttl=600, near_ttl=0)
    path = f"{base}/w.txt"
    fs.pipe_file(path, b"one")
    assert fs.cat_file(path) == b"one" and peer.cat_file(path) == b"one"
    fs.pipe_file(path, b"two!")
    assert fs.cat_file(path) == b"two!" and peer.cat_file(path) == b"two!"
    with fs.open(path, "wb") as f:
        f.write(b"three")
    assert fs.cat_file(path) == b"three" and peer.cat_file(path) == b"three"
    fs.mv(path, f"{base}/moved.txt")
    assert not fs.exists(path) and not peer.exists(path)
    assert fs.ls(base, detail=False) == [f"{base}/moved.txt"] == peer.ls(base, detail=False)
    assert fs.cat_file(f"{base}/moved.txt") == b"three"
    fs.makedirs(f"{base}/d/e", exist_ok=True)
    fs.pipe_file(f"{base}/d/e/x", b"x")
    assert peer.find(base) == [f"{base}/d/e/x", f"{base}/moved.txt"]
    fs.rm(f"{base}/d", recursive=True)
    fs.rm(f"{base}/moved.txt")
    assert fs.ls(base) == [] and peer.ls(base) == []
    assert not peer.exists(f"{base}/d/e/x")


def test_snapshot_reads_one_state(target: Any, fsgrid: Any, base: str) -> None:
    for i in range(3):
        target.pipe_file(f"{base}/p{i}", bytes([65 + i]) * 100_000)
    fs = cached(target, fsgrid, ttl=0)
    snap = fs.snapshot([base])
    listing = snap.ls(base, detail=False)
    assert snap.cat_file(f"{base}/p0") == b"A" * 100_000  # now cached at its pinned identity
    for i in range(3):
        target.pipe_file(f"{base}/p{i}", bytes([97 + i]) * 100_000)  # same size, new contents
    target.pipe_file(f"{base}/late", b"late")
    assert snap.ls(base, detail=False) == listing
    assert not snap.exists(f"{base}/late")
    assert snap.cat_file(f"{base}/p0") == b"A" * 100_000  # the pinned state, not the new one
    with pytest.raises(FileChangedError):
        snap.cat_file(f"{base}/p1")  # never cached at the pinned identity: gone, so an error, not other bytes
    assert fs.cat_file(f"{base}/p1") == b"b" * 100_000  # outside the snapshot the new state is read
    with pytest.raises(PermissionError):
        snap.open(f"{base}/p0", "wb")


def test_grid_server_killed_reads_fall_back(target: Any, base: str) -> None:
    data = random.Random(3).randbytes(600_000)
    path = f"{base}/k.bin"
    target.pipe_file(path, data)
    with ramgrid.local(servers=2, memory="32MiB", extra_args=["--memory", "32MiB"], timeout=2.0) as g:
        fs = cached(target, g, near_cache_bytes=0)
        assert fs.cat_file(path) == data
        g.kill(0)
        for _ in range(2):
            assert fs.cat_file(path) == data
            assert fs.cat_file(path, 1000, 300_000) == data[1000:300_000]
            assert fs.ls(base, detail=False) == [path]
        g.kill(1)
        assert fs.cat_file(path) == data
        assert fs.info(path)["size"] == len(data)


def test_chained_url(hdfs: MiniHDFS, fsgrid: Any, target: Any, base: str) -> None:
    target.pipe_file(f"{base}/c.txt", b"chained")
    url = f"ramgrid::webhdfs://127.0.0.1:{hdfs.webhdfs_port}{base}/c.txt"
    opts = {"ramgrid": {"grid": fsgrid.spec, "table": "fsmeta_chained"}, "webhdfs": {"user": "ramgrid"}}
    with fsspec.open(url, "rb", **opts) as f:
        assert f.read() == b"chained"
    fs, path = fsspec.core.url_to_fs(url, **opts)
    assert isinstance(fs, CachedFileSystem) and path == f"{base}/c.txt"
    assert fs.ls(base, detail=False) == [path]


def test_bad_settings_are_refused(target: Any, fsgrid: Any) -> None:
    with pytest.raises(ValueError, match="block_size"):
        CachedFileSystem(target, fsgrid, block_size=100, skip_instance_cache=True)
    with pytest.raises(ValueError, match="target"):
        CachedFileSystem(None, fsgrid, skip_instance_cache=True)


def test_dask_reads_a_directory_through_the_cache(hdfs: MiniHDFS, fsgrid: Any, target: Any, base: str) -> None:
    dask = pytest.importorskip("dask")
    import dask.bag as db
    import dask.dataframe as dd

    for i in range(4):
        target.pipe_file(f"{base}/part-{i}.csv", "".join(f"{i},{j}\n" for j in range(50)).encode())
    url = f"ramgrid::webhdfs://127.0.0.1:{hdfs.webhdfs_port}{base}"
    opts = {"ramgrid": {"grid": fsgrid.spec, "table": "fsmeta_dask"}, "webhdfs": {"user": "ramgrid"}}
    with dask.config.set(scheduler="threads"):
        lines = db.read_text(f"{url}/*.csv", storage_options=opts).count().compute()
        df = dd.read_csv(f"{url}/*.csv", names=["i", "j"], header=None, storage_options=opts).compute()
    assert lines == 200
    assert len(df) == 200 and int(df["j"].sum()) == 4 * sum(range(50))


def _read_all(fs: CachedFileSystem, paths: list[str]) -> dict[str, Any]:
    """A Dask task: this worker's reads of `paths` and where their blocks came from."""
    before = dict(fs.counters)
    data = [fs.cat_file(p) for p in paths]
    fs.flush_pending()
    return {"data": data, **{k: fs.counters[k] - before[k] for k in before}}


@pytest.mark.slow
def test_a_block_read_by_one_dask_worker_is_served_to_another_from_the_grid(
    target: Any, fsgrid: Any, base: str
) -> None:
    distributed = pytest.importorskip("distributed")
    paths = [f"{base}/s{i}" for i in range(20)]
    for i, p in enumerate(paths):
        target.pipe_file(p, f"file {i}\n".encode() * 100)
    fs = cached(target, fsgrid)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster,
        distributed.Client(cluster) as client,
    ):
        a, b = sorted(client.scheduler_info()["workers"])
        first = client.submit(_read_all, fs, paths, workers=[a], pure=False).result()
        second = client.submit(_read_all, fs, paths, workers=[b], pure=False).result()
    expected = [f"file {i}\n".encode() * 100 for i in range(20)]
    assert first["data"] == expected == second["data"]
    assert first["block_fs"] == 20
    assert second["block_fs"] == 0 and second["block_grid"] == 20


@pytest.mark.slow
def test_example_runs() -> None:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "hdfs_cache_example", Path(__file__).resolve().parents[3] / "examples" / "hdfs_cache.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--files", "6", "--rows", "50", "--workers", "0"])
    assert set(out) == {"dask_pass1_s", "dask_pass2_s"}
