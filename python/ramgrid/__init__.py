"""ramgrid: an in-memory key-value grid for data-parallel jobs.

    import numpy as np, ramgrid

    with ramgrid.local(servers=3) as grid:                   # or ramgrid.connect("host1:7000,host2:7000")
        t = grid.create_table("scores", value_type="f64")
        t.put_many(np.arange(1000), np.random.rand(1000))
        values = t.get_many(np.array([1, 2, 3]))             # numpy float64 array

Handles (`Grid`, `Table`, `PinnedTable`) pickle their configuration and reconnect in whichever process uses them,
so they can be passed to multiprocessing, Dask or any other engine's tasks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ramgrid import exceptions
    from ramgrid._local import LocalGrid, local
    from ramgrid.config import parse_spec
    from ramgrid.exceptions import RamgridError
    from ramgrid.grid import Grid, GridConfig, PinnedTable, Table, VersionPart, VersionWriter, connect
    from ramgrid.tls import TLS

__version__ = "0.1.0"

# Attributes are imported on first use, so that a server process (`python -m ramgrid._serve`) starts without
# importing numpy and the client machinery it never uses.
_LAZY = {
    "connect": "ramgrid.grid",
    "Grid": "ramgrid.grid",
    "GridConfig": "ramgrid.grid",
    "Table": "ramgrid.grid",
    "PinnedTable": "ramgrid.grid",
    "VersionPart": "ramgrid.grid",
    "VersionWriter": "ramgrid.grid",
    "local": "ramgrid._local",
    "LocalGrid": "ramgrid._local",
    "RamgridError": "ramgrid.exceptions",
    "parse_spec": "ramgrid.config",
    "TLS": "ramgrid.tls",
}

__all__ = [
    "TLS",
    "Grid",
    "GridConfig",
    "LocalGrid",
    "PinnedTable",
    "RamgridError",
    "Table",
    "VersionPart",
    "VersionWriter",
    "__version__",
    "connect",
    "exceptions",
    "local",
    "parse_spec",
]


def __getattr__(name: str) -> Any:
    if name == "exceptions":
        return importlib.import_module("ramgrid.exceptions")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ramgrid' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
