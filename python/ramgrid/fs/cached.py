"""`CachedFileSystem`: an fsspec file system that serves another's metadata and file blocks from the grid.

    fs = CachedFileSystem(fsspec.filesystem("webhdfs", host=..., port=...), grid)
    fs = fsspec.filesystem("ramgrid", target_protocol="webhdfs", target_options={...}, grid="h1:7000,h2:7000")
    dd.read_csv("ramgrid::webhdfs://namenode:9870/data/*.csv", storage_options={"ramgrid": {"grid": spec}})

Metadata (`ls`, `info`, and through them `exists`, `glob`, `find`, `walk`) lives in a grid table (`_meta`);
file contents in fixed-size blocks in the grid's evicting cache keyspace (`_blocks`), keyed by path, file
identity and block number. The guarantees are stated in docs/fs-cache.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from fsspec import AbstractFileSystem, filesystem
from fsspec.spec import AbstractBufferedFile

try:  # fsspec >= 2025.x: the marker that makes `ramgrid::webhdfs://host/path` hand the inner path to this layer
    from fsspec.implementations.chained import ChainedFileSystem as _Base
except ImportError:  # pragma: no cover (older fsspec: pass target_protocol/target_options and paths explicitly)
    _Base = AbstractFileSystem

from ramgrid.fs._blocks import BlockStore, NearCache
from ramgrid.fs._meta import MetaCache

log = logging.getLogger(__name__)

DEFAULT_TABLE = "ramgrid_fs_meta"
# Fields that change when a file's contents change, by file system (HDFS: fileId changes on overwrite,
# modificationTime on append; S3/GCS: ETag; local: mtime).
_IDENTITY_FIELDS = ("fileId", "modificationTime", "mtime", "LastModified", "ETag", "etag", "md5Hash", "generation")


class FileChangedError(OSError):
    """A file pinned by a snapshot changed on the file system; its pinned contents are no longer available."""


def identity(info: dict[str, Any]) -> str | None:
    """What tells two versions of a file apart: its size and whichever change markers its file system reports;
    None if it reports none (its blocks are then never cached, since a change could not be noticed)."""
    marks = [f"{f}={info[f]}" for f in _IDENTITY_FIELDS if info.get(f) is not None]
    if not marks:
        return None
    return f"size={info.get('size')};" + ";".join(marks)


def _resolve_grid(grid: Any) -> Any:
    import ramgrid

    if grid is None:
        grid = os.environ.get("RAMGRID_FS_GRID")
        if not grid:
            raise ValueError(
                "CachedFileSystem needs a grid: pass grid= (a ramgrid.Grid or 'host:port,...') or set RAMGRID_FS_GRID"
            )
    if isinstance(grid, str | list | tuple):
        return ramgrid.connect(grid)
    return grid


def _parent(path: str) -> str:
    p = posixpath.dirname(path.rstrip("/")) if path not in ("", "/") else path
    return p or "/"


class CachedFileSystem(_Base):
    """Wraps `target_fs` (or `target_protocol` + `target_options`, as fsspec's URL chaining passes them).

    `ttl`: seconds a metadata entry serves before it is revalidated (the staleness bound for changes made by
    others); `near_ttl`: how long this process trusts its near copy of a grid entry (the bound for seeing another
    process's invalidation); `block_size`: bytes per cached block (at most the server's --max-item-size less
    100 bytes); `readahead`: blocks fetched beyond a sequential read; `near_cache_bytes`: this process's block
    near cache; `table`: the metadata table (created on first use).
    """

    protocol = "ramgrid"
    root_marker = "/"

    def __init__(
        self,
        target_fs: AbstractFileSystem | None = None,
        grid: Any = None,
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fo: str | None = None,
        table: str = DEFAULT_TABLE,
        ttl: float = 2.0,
        near_ttl: float = 0.5,
        block_size: int = 512 * 1024,
        readahead: int = 4,
        near_cache_bytes: int = 64 * 1024 * 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if target_fs is None:
            if target_protocol is None:
                raise ValueError("CachedFileSystem needs target_fs or target_protocol")
            target_fs = filesystem(target_protocol, **(target_options or {}))
        if ttl < 0 or near_ttl < 0 or block_size < 4096 or readahead < 0:
            raise ValueError("ttl and near_ttl must be >= 0, block_size >= 4096, readahead >= 0")
        self.target = target_fs
        self.grid = _resolve_grid(grid)
        self.ttl, self.near_ttl, self.block_size, self.readahead = ttl, near_ttl, block_size, readahead
        self.table_name = table
        self._meta: MetaCache | None = None
        self.blocks = BlockStore(self.grid.servers, token=self.grid.config.token, tls=self.grid.config.tls)
        self.near = NearCache(near_cache_bytes)
        self.verify_batch, self.verify_delay = 32, 1.0
        self._pending: dict[tuple[str, str], dict[bytes, bytes]] = {}
        self._pending_lock = threading.Lock()
        # Held for a whole flush, so that a flush returns only once every block deferred before it is stored,
        # including those a timer's flush took out of `_pending` a moment earlier.
        self._flush_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.counters = {"block_near": 0, "block_grid": 0, "block_fs": 0, "meta_fs": 0, "changed": 0}

    # --- plumbing

    @property
    def meta(self) -> MetaCache:
        if self._meta is None:
            try:
                table = self.grid.create_table(self.table_name, value_type="bytes", exist_ok=True)
            except Exception as e:  # noqa: BLE001 (grid down at start: the handle still works once it is back)
                log.warning("could not create metadata table %s (%s)", self.table_name, e)
                table = self.grid.table(self.table_name)
            self._meta = MetaCache(table, self.ttl, self.near_ttl)
        return self._meta

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if "::" in path:
            path = path.split("::", 1)[1]
        path = path.removeprefix("ramgrid://")
        if path in ("", "ramgrid"):  # the bare protocol of a chained URL: fsspec passes the inner path on
            return ""
        if "://" in path:
            path = urlsplit(path).path
        path = path.rstrip("/")
        return path if path.startswith("/") else "/" + path

    def _block_key(self, path: str, ident: str, n: int) -> bytes:
        h = hashlib.blake2b(f"{path}\0{ident}\0{self.block_size}\0{n}".encode(), digest_size=20).hexdigest()
        return b"rgfs:" + h.encode()

    # --- metadata

    def _store_listing(self, path: str, entries: list[dict[str, Any]], fetched_at: float, gen: int | None) -> None:
        items: dict[str, Any] = {"l:" + path: entries}
        for e in entries:
            items["i:" + self._strip_protocol(e["name"])] = e
        self.meta.put_many(items, fetched_at, gen)

    def _fetch_listing(self, path: str, gen: int | None) -> list[dict[str, Any]]:
        fetched_at = time.time()
        self.counters["meta_fs"] += 1
        entries = [dict(e, name=self._strip_protocol(e["name"])) for e in self.target.ls(path, detail=True)]
        self._store_listing(path, entries, fetched_at, gen)
        return entries

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        found, gen = self.meta.get_many(["l:" + path])
        entries = found.get("l:" + path)
        if entries is None:
            entries = self._fetch_listing(path, gen)
        entries = [dict(e) for e in entries]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        found, gen = self.meta.get_many(["i:" + path])
        if "i:" + path in found:
            v = found["i:" + path]
        else:
            v = self._revalidate(path, gen)
        if v is None:
            raise FileNotFoundError(path)
        return dict(v)

    def _revalidate(self, path: str, gen: int | None) -> dict[str, Any] | None:
        """One LISTSTATUS of the parent refreshes the path and all its siblings; the root asks for itself."""
        parent = _parent(path)
        if parent != path:
            fetched_at = time.time()  # before the request: a negative entry is no younger than the listing
            try:
                entries = self._fetch_listing(parent, gen)
            except FileNotFoundError:
                entries = []
            for e in entries:
                if e["name"] == path:
                    return e
            self.meta.put_many({"i:" + path: None}, fetched_at, gen)
            return None
        fetched_at = time.time()
        self.counters["meta_fs"] += 1
        try:
            v = dict(self.target.info(path), name=path)
        except FileNotFoundError:
            v = None
        self.meta.put_many({"i:" + path: v}, fetched_at, gen)
        return v

    def invalidate(self, path: str, tree: bool = False) -> None:
        """Drops the cached metadata of `path` and of every directory above it (a write may have created them,
        and changes their listings and modification times); `tree`: of every path (a directory moved or removed)."""
        path = self._strip_protocol(path)
        if tree:
            self.meta.invalidate_all()
            return
        keys = []
        p = path
        while True:
            keys += ["i:" + p, "l:" + p]
            if p == _parent(p):
                break
            p = _parent(p)
        self.meta.invalidate(keys)

    # --- blocks

    def read_range(
        self, path: str, info: dict[str, Any], start: int, end: int, readahead: int = 0, pinned: bool = False
    ) -> bytes:
        """Bytes [start, end) of the file whose status is `info`; blocks from the near cache, then the grid, then
        the file system (in one request covering the missing blocks and the read-ahead)."""
        size = int(info["size"])
        end = min(end, size)
        if start >= end:
            return b""
        ident = identity(info)
        if ident is None:
            return self._fetch(path, start, end)
        if self._has_pending(path, ident):
            self.flush_pending()  # its read-ahead blocks wait there: confirm and store them first
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        last_ra = min(last + readahead, (size - 1) // bs)
        keys = {n: self._block_key(path, ident, n) for n in range(first, last_ra + 1)}
        blocks: dict[int, bytes] = {}
        for n, k in keys.items():
            v = self.near.get(k)
            if v is not None:
                blocks[n] = v
                if n <= last:
                    self.counters["block_near"] += 1
        need = [n for n in keys if n not in blocks]
        if need:
            got = self.blocks.get_many([keys[n] for n in need])
            for n in need:
                v = got.get(keys[n])
                if v is not None:
                    blocks[n] = v
                    self.near.put(keys[n], v)
                    if n <= last:
                        self.counters["block_grid"] += 1
        missing = [n for n in range(first, last + 1) if n not in blocks]
        if missing:
            lo = missing[0]
            hi = max(n for n in keys if n not in blocks)
            data = self._fetch(path, lo * bs, min((hi + 1) * bs, size))
            fetched = {keys[n]: data[(n - lo) * bs : (n - lo + 1) * bs] for n in range(lo, hi + 1) if n not in blocks}
            self.counters["block_fs"] += sum(1 for n in range(lo, last + 1) if n not in blocks)
            if lo == first and hi >= last and not pinned:
                # The whole answer comes from this one request, exactly as an uncached read: return it now and
                # confirm the identity later, in a batch with other files' (one LISTSTATUS per directory).
                self._defer(path, ident, fetched)
                return data[start - lo * bs : end - lo * bs]
            # The answer joins cached blocks (or must be the pinned version): confirm the identity first.
            if self._fs_identity(path) != ident or len(data) != min((hi + 1) * bs, size) - lo * bs:
                self.counters["changed"] += 1
                self.invalidate(path)
                if pinned:
                    raise FileChangedError(f"{path} changed since the snapshot was taken")
                # Cached blocks are of the old version: read the range whole from the file system, uncached.
                return self._fetch(path, start, end)
            self._store(fetched)
            for n in range(lo, hi + 1):
                blocks[n] = data[(n - lo) * bs : (n - lo + 1) * bs]
        out = b"".join(blocks[n] for n in range(first, last + 1))
        return out[start - first * bs : end - first * bs]

    def _store(self, blocks: dict[bytes, bytes]) -> None:
        for k, v in blocks.items():
            self.near.put(k, v)
        self.blocks.set_many(blocks)

    def _defer(self, path: str, ident: str, blocks: dict[bytes, bytes]) -> None:
        """Holds blocks read from the file system until their file's identity is confirmed (`flush_pending`)."""
        with self._pending_lock:
            self._pending.setdefault((path, ident), {}).update(blocks)
            n = len(self._pending)
            if self._timer is None and n < self.verify_batch:
                self._timer = threading.Timer(self.verify_delay, self._flush_in_background)
                self._timer.daemon = True
                self._timer.start()
        if n >= self.verify_batch:
            self.flush_pending()

    def _flush_in_background(self) -> None:
        try:
            self.flush_pending()
        except Exception:  # a timer thread has no caller to raise to; the blocks are simply not stored
            log.exception("confirming read blocks failed")

    def _has_pending(self, path: str, ident: str) -> bool:
        with self._pending_lock:
            return (path, ident) in self._pending

    def flush_pending(self) -> None:
        """Confirms the identity of every file with blocks read but not yet stored, in batches: one LISTSTATUS
        per directory with several such files (it refreshes their metadata too), one status request otherwise;
        stores the blocks of unchanged files and drops the rest."""
        with self._flush_lock:
            self._flush_pending()

    def _flush_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, {}
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if not pending:
            return
        by_dir: dict[str, list[tuple[str, str]]] = {}
        for path, ident in pending:
            by_dir.setdefault(_parent(path), []).append((path, ident))
        confirmed: dict[bytes, bytes] = {}
        for d, items in by_dir.items():
            now: dict[str, str | None] = {}
            try:
                if len(items) >= 4:
                    gen = self.meta.current_gen()
                    now = {e["name"]: identity(e) for e in self._fetch_listing(d, gen)}
                else:
                    now = {p: self._fs_identity(p) for p, _ in items}
            except OSError as e:
                log.debug("could not confirm %d files in %s (%s); their blocks are not stored", len(items), d, e)
                continue
            for path, ident in items:
                if now.get(path) == ident:
                    confirmed.update(pending[(path, ident)])
                else:
                    self.counters["changed"] += 1
                    self.invalidate(path)
        if confirmed:
            self._store(confirmed)

    def _fetch(self, path: str, start: int, end: int) -> bytes:
        data: bytes = self.target.cat_file(path, start=start, end=end)
        return data

    def _fs_identity(self, path: str) -> str | None:
        try:
            return identity(self.target.info(path))
        except FileNotFoundError:
            return None

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        if "r" in mode and "+" not in mode:
            return CachedFile(self, path, self.info(path))
        f = self.target.open(path, mode, **kwargs)
        self.invalidate(path)
        close = f.close

        def close_and_invalidate() -> None:
            try:
                close()
            finally:
                self.invalidate(path)

        f.close = close_and_invalidate
        return f

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        info = self.info(path)
        if info.get("type") == "directory":
            raise IsADirectoryError(path)
        size = int(info["size"])
        start = 0 if start is None else (start + size if start < 0 else start)
        end = size if end is None else (end + size if end < 0 else end)
        return self.read_range(path, info, max(start, 0), max(end, 0))

    # --- writes: done on the target, then the cache is invalidated (at once for this process and the grid)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        try:
            self.target.rm(path, recursive=recursive, maxdepth=maxdepth)
        finally:
            self._invalidate_paths(path, tree=recursive)

    def rm_file(self, path: str) -> None:
        try:
            self.target.rm_file(path)
        finally:
            self.invalidate(path)

    def rmdir(self, path: str) -> None:
        try:
            self.target.rmdir(path)
        finally:
            self.invalidate(path)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        try:
            self.target.mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
        finally:
            # A renamed directory moves every path under it: drop everything.
            self._invalidate_paths(path1, tree=True)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        try:
            self.target.cp_file(path1, path2, **kwargs)
        finally:
            self.invalidate(path2)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        try:
            self.target.pipe_file(path, value, **kwargs)
        finally:
            self.invalidate(path)

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        try:
            self.target.put_file(lpath, rpath, **kwargs)
        finally:
            self.invalidate(rpath)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        try:
            self.target.touch(path, truncate=truncate, **kwargs)
        finally:
            self.invalidate(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        try:
            self.target.mkdir(path, create_parents=create_parents, **kwargs)
        finally:
            self.invalidate(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        try:
            self.target.makedirs(path, exist_ok=exist_ok)
        finally:
            self.invalidate(path)

    def _invalidate_paths(self, path: Any, tree: bool) -> None:
        paths = path if isinstance(path, list) else [path]
        if tree:
            self.invalidate("/", tree=True)
        else:
            for p in paths:
                self.invalidate(p)

    # --- snapshots

    def snapshot(self, paths: list[str] | str) -> SnapshotFileSystem:
        """Pins the metadata of `paths` (files, or directories with their direct children) as it is now.

        One grid batch looks up every path's listing; listings missing or older than `ttl` are fetched with one
        LISTSTATUS per path. The returned read-only file system answers `ls`/`info` from the pinned state and reads
        each file at its pinned identity: the bytes of that version, or FileChangedError, never other bytes.
        """
        paths = [self._strip_protocol(p) for p in ([paths] if isinstance(paths, str) else paths)]
        found, gen = self.meta.get_many(["l:" + p for p in paths])
        listings: dict[str, list[dict[str, Any]]] = {}
        for p in paths:
            entries = found.get("l:" + p)
            listings[p] = [dict(e) for e in (entries if entries is not None else self._fetch_listing(p, gen))]
        return SnapshotFileSystem(self, listings)

    def __reduce__(self) -> Any:
        return (_rebuild, (self.target, self.grid, self._kwargs()))

    def _kwargs(self) -> dict[str, Any]:
        return {
            "table": self.table_name,
            "ttl": self.ttl,
            "near_ttl": self.near_ttl,
            "block_size": self.block_size,
            "readahead": self.readahead,
            "near_cache_bytes": self.near.max_bytes,
        }


def _rebuild(target: AbstractFileSystem, grid: Any, kwargs: dict[str, Any]) -> CachedFileSystem:
    return CachedFileSystem(target, grid, **kwargs)


class CachedFile(AbstractBufferedFile):
    """A read-only file whose ranges come from `CachedFileSystem.read_range`; sequential reads read ahead."""

    def __init__(self, fs: CachedFileSystem, path: str, info: dict[str, Any], pinned: bool = False) -> None:
        if info.get("type") == "directory":
            raise IsADirectoryError(path)
        super().__init__(fs, path, mode="rb", block_size=fs.block_size, cache_type="none", size=int(info["size"]))
        self.pinned_info = info
        self.pinned = pinned
        self._next = 0
        self.cfs = fs

    def _fetch_range(self, start: int, end: int) -> bytes:
        ra = self.cfs.readahead if start == self._next else 0
        self._next = end
        return self.cfs.read_range(self.path, self.pinned_info, start, end, ra, self.pinned)


class SnapshotFileSystem(AbstractFileSystem):
    """The read-only, pinned view returned by `CachedFileSystem.snapshot` (see there)."""

    protocol = "ramgrid-snapshot"
    cachable = False

    def __init__(self, fs: CachedFileSystem, listings: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__()
        self.cfs = fs
        self.listings = listings
        self.infos: dict[str, dict[str, Any]] = {}
        for p, entries in listings.items():
            for e in entries:
                self.infos[e["name"]] = e
            if not (len(entries) == 1 and entries[0]["name"] == p):
                self.infos.setdefault(p, {"name": p, "type": "directory", "size": 0})

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return CachedFileSystem._strip_protocol(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        if path in self.listings:
            entries = [dict(e) for e in self.listings[path]]
        elif path in self.infos:
            entries = [dict(self.infos[path])]
        else:
            raise FileNotFoundError(f"{path} is not in the snapshot")
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path not in self.infos:
            raise FileNotFoundError(f"{path} is not in the snapshot")
        return dict(self.infos[path])

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError("a snapshot is read-only")
        path = self._strip_protocol(path)
        return CachedFile(self.cfs, path, self.info(path), pinned=True)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        with self._open(path) as f:
            if start is not None:
                f.seek(start if start >= 0 else f.size + start)
            n = -1 if end is None else (end if end >= 0 else f.size + end) - f.tell()
            return f.read(n)  # type: ignore[no-any-return]

    def __reduce__(self) -> Any:
        return (SnapshotFileSystem, (self.cfs, self.listings))
