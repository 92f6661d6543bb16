"""Scans, filters and top_k on real server processes: every key exactly once (replication 1 and 2), filters equal to
numpy's selection, top_k equal to an argsort, scans of a table being written (each key at most once, no torn values),
a scan that outlives a killed server (replication 2), and bad input refused with a clear error."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.scan import int_keys

pytestmark = pytest.mark.timeout(60)


def _collect(chunks: ramgrid.scan.ScanChunks) -> tuple[np.ndarray, np.ndarray]:
    ks, vs = [], []
    for keys, values in chunks:
        assert len(keys) == len(values)
        ks.append(int_keys(keys))
        vs.append(values)
    if not ks:
        return np.array([], np.int64), np.array([])
    return np.concatenate(ks), np.concatenate(vs)


@pytest.mark.parametrize("replication", [1, 2])
def test_scan_filter_and_top_k_match_numpy(grid3: ramgrid.LocalGrid, table_name: str, replication: int) -> None:
    t = grid3.create_table(table_name, partitions=16, replication=replication, value_type="f64")
    rng = np.random.default_rng(replication)
    keys = np.arange(30_000, dtype=np.int64)
    vals = rng.normal(size=keys.size)
    t.put_many(keys, vals)
    gone = keys[::5]
    t.delete_many(gone)
    live = np.ones(keys.size, bool)
    live[::5] = False
    keys, vals = keys[live], vals[live]

    got_k, got_v = _collect(t.scan(chunk_items=1000))
    assert got_k.size == keys.size and np.unique(got_k).size == keys.size
    order = np.argsort(got_k)
    assert np.array_equal(got_k[order], keys) and np.array_equal(got_v[order], vals)

    sel = (vals >= -0.5) & (vals < 0.25)
    fk, fv = _collect(t.filter((-0.5, 0.25)))
    order = np.argsort(fk)
    assert np.array_equal(fk[order], keys[sel]) and np.array_equal(fv[order], vals[sel])
    fk2, _ = _collect(t.filter({"column": 0, "lo": 1.0}))
    assert np.array_equal(np.sort(fk2), keys[vals >= 1.0])

    for largest in (True, False):
        top_keys, top_vals = t.top_k(10, largest=largest)
        idx = np.argsort(-vals if largest else vals, kind="stable")[:10]
        assert np.array_equal(top_vals, vals[idx])
        assert [int.from_bytes(k, "little", signed=True) for k in top_keys] == keys[idx].tolist()
    pinned = t.pin()
    assert pinned.top_k(3, where=(0.0, None))[1].tolist() == np.sort(vals[vals >= 0.0])[::-1][:3].tolist()
    assert _collect(pinned.scan())[0].size == keys.size


def test_scans_of_bytes_and_vector_tables(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    b = grid3.create_table(table_name + "b", partitions=8, value_type="bytes")
    items = {f"k{i}": bytes([i % 256]) * (i % 13) for i in range(2000)}
    b.put_many(list(items), list(items.values()))
    seen = {}
    for keys, values in b.scan(chunk_items=300):
        for k, v in zip(keys.to_pylist(), values.to_pylist()):
            assert k.decode() not in seen
            seen[k.decode()] = v
    assert seen == items

    v = grid3.create_table(table_name + "v", partitions=8, value_type="f32vec", dim=3)
    keys = np.arange(5000, dtype=np.int64)
    rows = np.random.default_rng(0).random((keys.size, 3), dtype=np.float32)
    v.put_many(keys, rows)
    fk, fv = _collect(v.filter({"column": 2, "lo": 0.25, "hi": 0.5}))
    order = np.argsort(fk)
    sel = (rows[:, 2] >= 0.25) & (rows[:, 2] < 0.5)
    assert np.array_equal(fk[order], keys[sel]) and np.array_equal(fv[order], rows[sel])
    _top_keys, top_vals = v.top_k(4, column=1, largest=False)
    assert top_vals.tolist() == np.sort(rows[:, 1].astype(np.float64))[:4].tolist()


def test_bad_input_is_refused_clearly(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    b = grid3.create_table(table_name, partitions=4, value_type="bytes")
    b.put_many(["a"], [b"x"])
    with pytest.raises(ValueError, match="where"):
        b.filter("nope")
    with pytest.raises(ValueError, match="NaN"):
        b.filter((float("nan"), 1.0))
    with pytest.raises(ValueError, match="chunk_items"):
        b.scan(chunk_items=0)
    with pytest.raises(ValueError, match="numeric"):
        list(b.filter((0, 1)))
    with pytest.raises(ValueError, match="numeric"):
        b.top_k(3)
    with pytest.raises(ValueError, match="k must"):
        b.top_k(0)
    assert [k.to_pylist() for k, _ in b.scan()] == [[b"a"]]


def test_scan_of_a_table_being_written(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, replication=2, value_type="f32vec", dim=4)
    keys = np.arange(20_000, dtype=np.int64)
    t.put_many(keys, np.repeat(keys.astype(np.float32)[:, None], 4, axis=1))
    stop = threading.Event()
    errors: list[Exception] = []

    def write() -> None:
        rng = np.random.default_rng(1)
        n = 0
        try:
            while not stop.is_set():
                n += 1
                ks = rng.integers(0, 40_000, 300)
                t.put_many(ks, np.full((ks.size, 4), float(n), np.float32))
                t.delete_many(rng.integers(0, 40_000, 50))
        except Exception as e:  # noqa: BLE001 (surfaced below)
            errors.append(e)

    w = threading.Thread(target=write)
    w.start()
    try:
        for _ in range(3):
            ks, vs = _collect(t.scan())
            assert np.unique(ks).size == ks.size, "a key twice"
            assert (vs == vs[:, :1]).all(), "a torn row"
    finally:
        stop.set()
        w.join(timeout=20)
    assert not errors


def test_a_scan_completes_after_a_server_is_killed() -> None:
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        t = g.create_table("scan_kill", partitions=16, replication=2, value_type="i64")
        keys = np.arange(20_000, dtype=np.int64)
        t.put_many(keys, keys * 3)
        chunks = t.scan(chunk_items=500)
        first_k, _ = next(chunks)
        g.kill(1)
        ks = [int_keys(first_k)] + [int_keys(k) for k, _ in chunks]
        got = np.concatenate(ks)
        assert np.array_equal(np.sort(got), keys)
        ks2, vs2 = _collect(t.scan())
        assert np.array_equal(vs2, ks2 * 3) and ks2.size == keys.size
