"""Handles without servers: pickling carries configuration only, the per-process client registry, fork detection,
and the Table / version-writer logic over an in-memory stand-in for the native client."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import pytest
import ramgrid
from ramgrid import _clients as clients_mod
from ramgrid.exceptions import KeysNotFound, RamgridError
from ramgrid.grid import Grid, GridConfig, PinnedTable, Table

pytestmark = pytest.mark.timeout(20)

# Python 3.12+ warns when forking a process that has threads (Dask's leftovers, pytest plugins); these tests fork on
# purpose, with a client that holds no threads.
FORK_OK = pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning")


class FakeClient:
    """Implements the slice of `_native.Client` the handles use, over dicts (int keys only, f64 values)."""

    def __init__(self, servers: list[str], **options: Any) -> None:
        self.servers_ = servers
        self.options = options
        self.closed = False
        self.tables: dict[str, dict[str, Any]] = {}

    def servers(self) -> list[str]:
        return list(self.servers_)

    def create_table(
        self,
        name: str,
        partitions: int = 64,
        replication: int = 1,
        value_type: str = "bytes",
        dim: int = 0,
        durability: str = "memory",
    ) -> None:
        self.tables[name] = {"current": 1, "versions": {1: {}}, "sealed": set(), "value_type": value_type, "dim": dim}

    def value_type(self, table: str) -> tuple[str, int]:
        return self.tables[table]["value_type"], self.tables[table]["dim"]

    def create_version(self, table: str) -> int:
        t = self.tables[table]
        v = max(t["versions"]) + 1
        t["versions"][v] = {}
        return v

    def seal_version(self, table: str, version: int) -> None:
        self.tables[table]["sealed"].add(version)

    def set_current(self, table: str, version: int) -> None:
        self.tables[table]["current"] = version

    def drop_version(self, table: str, version: int) -> None:
        del self.tables[table]["versions"][version]

    def current_version(self, table: str) -> int:
        return int(self.tables[table]["current"])

    def _data(self, table: str, version: int) -> dict[Any, Any]:
        t = self.tables[table]
        return t["versions"][version or t["current"]]

    def incarnation(self, table: str) -> int:
        return 1

    def shm_attach(self, table: str, version: int, incarnation: int = 0) -> dict[str, Any]:
        # No server on this host: nothing mapped, as a client on another host would see.
        return {"mapped": [], "bytes": 0, "servers": [], "skipped": [("fake:1", "no socket")]}

    def shm_detach(self, table: str, version: int, incarnation: int = 0) -> bool:
        return False

    def get_many(
        self, table: str, keys: Any, version: int = 0, incarnation: int = 0, shared_memory: bool = True
    ) -> tuple[Any, np.ndarray]:
        d = self._data(table, version)
        ks = list(np.asarray(keys).tolist()) if isinstance(keys, np.ndarray) else list(keys)
        found = np.array([k in d for k in ks], dtype=bool)
        if self.tables[table]["value_type"] == "bytes":
            return [d.get(k) for k in ks], found
        return np.array([d.get(k, 0.0) for k in ks], dtype=np.float64), found

    def put_many(self, table: str, keys: Any, values: Any, version: int = 0) -> None:
        assert version == 0 or version not in self.tables[table]["sealed"]
        d = self._data(table, version)
        ks = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        vs = values.tolist() if isinstance(values, np.ndarray) else list(values)
        d.update(zip(ks, vs))

    def delete_many(self, table: str, keys: Any, version: int = 0) -> int:
        d = self._data(table, version)
        return sum(d.pop(k, None) is not None for k in list(keys))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    made: list[FakeClient] = []

    def make(self: GridConfig) -> FakeClient:
        c = FakeClient(list(self.servers), token=self.token)
        made.append(c)
        return c

    monkeypatch.setattr(GridConfig, "make_client", make)
    monkeypatch.setattr(clients_mod, "_registry", clients_mod._Registry())
    return made


def test_connect_is_lazy_and_pickles_configuration() -> None:
    g = ramgrid.connect(
        "127.0.0.1:1,127.0.0.1:2", token="s3cret", timeout=2.0, ack="majority", near_cache_bytes=1 << 20
    )
    assert g.servers == ["127.0.0.1:1", "127.0.0.1:2"]
    g2 = pickle.loads(pickle.dumps(g))
    assert type(g2) is Grid and g2.config == g.config and g2.config.token == "s3cret"
    assert "s3cret" not in repr(g) and "s3cret" not in repr(g.config)
    t2 = pickle.loads(pickle.dumps(g.table("lm")))
    assert isinstance(t2, Table) and t2.name == "lm" and t2.grid.config == g.config
    p2 = pickle.loads(pickle.dumps(PinnedTable(g, "lm", 7)))
    assert isinstance(p2, PinnedTable) and p2.version == 7 and p2.name == "lm"


def test_pickle_holds_no_client(fake: list[FakeClient]) -> None:
    g = ramgrid.connect(["127.0.0.1:1"])
    g._client()  # a client now exists in this process
    data = pickle.dumps(g.table("t"))
    assert b"FakeClient" not in data and len(data) < 600


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="ack"):
        ramgrid.connect("a:1", ack="some")
    with pytest.raises(ValueError, match="positive"):
        ramgrid.connect("a:1", timeout=0)
    with pytest.raises(ValueError):
        Table(ramgrid.connect("a:1"), "")


def test_one_client_per_configuration_per_process(fake: list[FakeClient]) -> None:
    a = ramgrid.connect("127.0.0.1:1")
    b = pickle.loads(pickle.dumps(a))
    assert a._client() is b._client() and len(fake) == 1
    ramgrid.connect("127.0.0.1:1", token="other")._client()
    assert len(fake) == 2
    a.close()
    assert fake[0].closed
    assert b._client() is not fake[0] and len(fake) == 3  # reconnects lazily


@FORK_OK
def test_fork_gets_a_fresh_client_and_leaves_the_parents_alone(fake: list[FakeClient]) -> None:
    g = ramgrid.connect("127.0.0.1:1")
    parent_client = g._client()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report whether it built its own client, without running pytest's teardown
        try:
            ok = g._client() is not parent_client and not parent_client.closed and len(clients_mod._inherited) >= 1
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert g._client() is parent_client and not parent_client.closed


def test_registry_notices_pid_change_without_fork_hooks(
    fake: list[FakeClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    g = ramgrid.connect("127.0.0.1:1")
    first = g._client()
    monkeypatch.setattr(clients_mod._registry, "pid", -1)
    assert g._client() is not first and not first.closed


def _table(fake: Any, value_type: str = "f64") -> Table:
    g = ramgrid.connect("127.0.0.1:1")
    return g.create_table("t", value_type=value_type)


def test_get_many_missing_raises_or_fills(fake: list[FakeClient]) -> None:
    t = _table(fake)
    t.put_many(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    assert t.get_many(np.array([3, 1])).tolist() == [3.0, 1.0]
    with pytest.raises(KeysNotFound) as e:
        t.get_many(np.array([1, 9, 2, 8]))
    assert e.value.indices == [1, 3] and e.value.count == 2 and "9" in str(e.value)
    assert isinstance(e.value, KeyError) and isinstance(e.value, RamgridError)
    filled = t.get_many(np.array([1, 9]), default=np.nan)
    assert filled[0] == 1.0 and np.isnan(filled[1])
    _vals, found = t.lookup([1, 9])
    assert found.tolist() == [True, False]


def test_single_key_conveniences(fake: list[FakeClient]) -> None:
    t = _table(fake)
    t[5] = 2.5
    t.put(6, 3)
    assert t[5] == 2.5 and isinstance(t[5], float) and t.get(6) == 3.0
    assert 5 in t and 7 not in t
    assert t.get(7, default=None) is None
    with pytest.raises(KeyError):
        t[7]
    del t[5]
    assert 5 not in t
    with pytest.raises(KeyError):
        del t[5]


def test_bytes_table_defaults(fake: list[FakeClient]) -> None:
    t = _table(fake, "bytes")
    t.put_many(["a", "b"], [b"x", "y"])
    assert t.get_many(["b", "a"]) == ["y", b"x"]
    assert t.get_many(["a", "zz"], default=b"") == [b"x", b""]


def test_length_mismatch_and_empty_batches(fake: list[FakeClient]) -> None:
    t = _table(fake)
    with pytest.raises(ValueError, match="2 keys but 3 values"):
        t.put_many([1, 2], [1.0, 2.0, 3.0])
    t.put_many([], [])
    assert t.delete_many(np.array([], dtype=np.int64)) == 0


def test_new_version_commit_switches(fake: list[FakeClient]) -> None:
    t = _table(fake)
    t.put_many([1], [1.0])
    pinned = t.pin()
    with t.new_version() as w:
        assert w.version == 2
        w.put_many([1], [2.0])
        assert t.get(1) == 1.0 and w.get(1) == 2.0  # invisible until commit
    assert t.current_version() == 2 and t.get(1) == 2.0
    assert pinned.version == 1 and pinned.get(1) == 1.0
    with pytest.raises(RamgridError):
        w.put_many([1], [3.0])


def test_new_version_exception_drops_it(fake: list[FakeClient]) -> None:
    t = _table(fake)
    t.put_many([1], [1.0])
    with pytest.raises(ZeroDivisionError), t.new_version() as w:
        w.put_many([1], [2.0])
        raise ZeroDivisionError("load failed")
    assert t.current_version() == 1 and t.get(1) == 1.0
    assert 2 not in fake[0].tables["t"]["versions"]


def test_version_writer_does_not_pickle(fake: list[FakeClient]) -> None:
    t = _table(fake)
    with t.new_version() as w, pytest.raises(TypeError, match=r"writer\.part\(\)"):
        pickle.dumps(w)


def test_value_type_forms(fake: list[FakeClient]) -> None:
    from ramgrid._types import parse_value_type, spell_value_type

    assert parse_value_type(("f32vec", 8), 0) == ("f32vec", 8)
    assert parse_value_type("f32vec:4", 0) == ("f32vec", 4)
    assert parse_value_type("f32vec", 5) == ("f32vec", 5)
    assert parse_value_type("f64", 3) == ("f64", 0)
    with pytest.raises(ValueError, match="dimension"):
        parse_value_type("f32vec", 0)
    with pytest.raises(ValueError, match="integer"):
        parse_value_type("f32vec:x")
    with pytest.raises(ValueError):
        parse_value_type("float", 0)
    with pytest.raises(ValueError):
        parse_value_type(("i64", 3))
    # The one-string spelling (CLI --type, load options) parses back to the same pair.
    for vt in [("bytes", 0), ("i64", 0), ("f64", 0), ("f32vec", 16)]:
        assert parse_value_type(spell_value_type(*vt)) == vt
    with pytest.raises(ValueError, match="replication"):
        ramgrid.connect("a:1").create_table("x", replication=2)


def test_pinned_table_reads_only(fake: list[FakeClient]) -> None:
    p: PinnedTable | None = _table(fake).pin(1)
    assert p is not None and not hasattr(p, "put_many")
    with pytest.raises(ValueError):
        _table(fake).pin(0)


def test_package_imports_without_the_native_module() -> None:
    """Without the binding, `ramgrid` still imports (config, CLI help), and its exceptions are the same classes."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['ramgrid._native'] = None\n"
        "import ramgrid, ramgrid.exceptions as e, ramgrid.cli\n"
        "assert issubclass(e.BatchError, e.RamgridError)\n"
        "assert issubclass(e.KeysNotFound, KeyError) and issubclass(e.ServerStartError, e.RamgridError)\n"
        "g = ramgrid.connect('127.0.0.1:1')\n"
        "try:\n    g.tables()\nexcept ImportError as x:\n    assert 'maturin develop' in str(x)\n"
        "else:\n    raise SystemExit('no ImportError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr


def test_importing_the_local_cluster_module_keeps_ramgrid_local_a_function() -> None:
    # Regression: the module used to be `ramgrid.local`, and importing it (`from ramgrid.local import ...`) made the
    # package attribute the module, so a later `ramgrid.local(...)` failed in that process.
    import subprocess
    import sys

    code = "import ramgrid._local, ramgrid; assert callable(ramgrid.local), type(ramgrid.local)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
