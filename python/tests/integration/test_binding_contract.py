"""The native module's contract: the exceptions it raises are ramgrid.exceptions' classes (one definition), every
Rust client error kind maps to one of them, partition owners match where keys live, and the LM job needs neither
the test codec (`ramgrid._wire`) nor xxhash."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid import _native, exceptions

pytestmark = pytest.mark.timeout(60)


def test_every_client_error_kind_maps_to_a_documented_exception() -> None:
    classes = _native.error_classes()
    kinds = [k for k, _ in classes]
    assert len(kinds) == len(set(kinds)) and "Batch" in kinds and "TableNotFound" in kinds
    for kind, name in classes:
        if name == "ValueError":
            assert kind == "InvalidArgument"
            continue
        assert name in exceptions.__all__, (kind, name)
        cls = getattr(exceptions, name)
        assert issubclass(cls, exceptions.RamgridError), (kind, name)
        assert cls.__doc__, f"{name} has no docstring"
    # The native module defines no exception classes of its own.
    assert not [
        n
        for n in dir(_native)
        if isinstance(getattr(_native, n), type) and issubclass(getattr(_native, n), BaseException)
    ]


def test_raised_exceptions_are_the_python_classes_with_their_attributes(
    grid3: ramgrid.LocalGrid, table_name: str
) -> None:
    with pytest.raises(exceptions.TableNotFound) as e:
        grid3.table(table_name).describe()
    assert type(e.value) is exceptions.TableNotFound and isinstance(e.value, exceptions.RamgridError)
    t = grid3.create_table(table_name, partitions=4, value_type="bytes")
    with pytest.raises(exceptions.TableExists):
        grid3.create_table(table_name, partitions=4, value_type="bytes")
    # Keys too long for the wire fail one by one, in whichever chunk they fall: indices are in the whole batch.
    keys = [f"k{i}" for i in range(10)]
    keys[3] = keys[8] = "x" * 70_000  # over the wire format's 65535 bytes
    with pytest.raises(exceptions.BatchError) as b:
        t.put_many(keys, [b"v"] * 10)
    assert [i for i, _ in b.value.failures] == [3, 8]
    assert t.get_many([k for i, k in enumerate(keys) if i not in (3, 8)]) == [b"v"] * 8


def test_partition_owners_name_the_primary_that_holds_each_key(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, replication=2, value_type="i64")
    client = grid3._client()
    owners = client.partition_owners(table_name)
    assert len(owners) == 8
    servers = set(client.servers())
    for reps in owners:
        assert len(reps) == 2 and len(set(reps)) == 2 and set(reps) <= servers
    # Every server is primary for some partition (the map balances primaries).
    assert {reps[0] for reps in owners} == servers
    # The same map as the protocol spec's algorithm, restated by the test codec.
    from ramgrid import _wire

    order = client.servers()
    assert owners == [[order[i] for i in reps] for reps in _wire.partition_map(order, 8, 2)]
    t.put_many(np.arange(10, dtype=np.int64), np.arange(10, dtype=np.int64))
    with pytest.raises(exceptions.TableNotFound):
        client.partition_owners(table_name + "_missing")


def test_the_lm_job_imports_without_the_test_codec_or_xxhash() -> None:
    code = (
        "import sys; sys.modules['ramgrid._wire'] = None; sys.modules['xxhash'] = None\n"
        "import ramgrid.lm.experiment, ramgrid.lm.__main__, ramgrid.lm.score, ramgrid.lm.report\n"
        "import inspect\n"
        "assert '_wire' not in inspect.getsource(ramgrid.lm.experiment)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr


def test_lm_items_per_server_match_the_reference_partition_map(
    grid3: ramgrid.LocalGrid, table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ramgrid import _wire
    from ramgrid.lm import experiment

    grid3.create_table(table_name, partitions=16, replication=2, value_type="f64")
    monkeypatch.setattr(experiment, "TABLE", table_name)
    keys = [f"token{i}" for i in range(2000)]
    got = experiment._grid_items_per_server(grid3, keys)
    # What the job computed before, from the test codec's restatement of the spec's algorithm.
    servers = list(grid3.servers)
    pmap = _wire.partition_map(servers, 16, 2)
    want = [0] * len(servers)
    for k in keys:
        want[pmap[_native.partition_of(k, 16)][0]] += 1
    assert got == want and sum(got) == len(keys)
