"""A cache for file systems in the grid: any fsspec file system's metadata and blocks, shared by every process.

    import fsspec, ramgrid.fs
    fs = ramgrid.fs.CachedFileSystem(fsspec.filesystem("webhdfs", host="namenode", port=9870), grid)
    with fs.open("/data/part-0.csv") as f: ...
    dd.read_csv("ramgrid::webhdfs://namenode:9870/data/*.csv", storage_options={"ramgrid": {"grid": "h1:7000"}})

Importing this package registers the protocol `ramgrid` with fsspec (the package's entry point does the same
for processes that never import it). docs/fs-cache.md states the guarantees.
"""

from __future__ import annotations

import fsspec

from ramgrid.fs.cached import CachedFile, CachedFileSystem, FileChangedError, SnapshotFileSystem, identity

fsspec.register_implementation("ramgrid", CachedFileSystem, clobber=True)

__all__ = ["CachedFile", "CachedFileSystem", "FileChangedError", "SnapshotFileSystem", "identity"]
