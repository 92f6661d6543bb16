"""Fixtures for tests against real servers: embedded clusters on loopback, stopped at the end."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import ramgrid

REPO_ROOT = Path(__file__).resolve().parents[3]
_names = itertools.count()


@pytest.fixture(scope="session")
def grid3() -> Iterator[ramgrid.LocalGrid]:
    """Three servers shared by the tests that only read and write (each uses its own table names)."""
    import ramgrid

    with ramgrid.local(servers=3, memory="128MiB") as g:
        yield g


@pytest.fixture
def table_name(request: pytest.FixtureRequest) -> str:
    """A table name no other test uses."""
    return f"{request.node.name[:40].replace('[', '_').replace(']', '')}_{os.getpid()}_{next(_names)}"


@pytest.fixture
def shm_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A shared-memory socket directory of the test's own, for its servers (--shm-dir) and its client
    (RAMGRID_SHM_DIR)."""
    d = Path(tempfile.mkdtemp(prefix="ramgrid-shm-", dir="/tmp"))
    d.chmod(0o700)
    monkeypatch.setenv("RAMGRID_SHM_DIR", str(d))
    yield d
    for p in d.iterdir():
        p.unlink(missing_ok=True)
    d.rmdir()
