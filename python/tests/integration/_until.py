"""`until()`: polls a condition until it holds, for tests that wait on processes and clusters. Shared by
test_dask_grid.py and test_dask_grid_hosts.py (whose driver runs as a script, with this folder on its path)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(what: str, cond: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Calls `cond` every 0.1 s until it returns something true, and returns that; after `timeout` seconds raises
    TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)
