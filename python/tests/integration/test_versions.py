"""Versions: pinned readers keep their version, current readers never see a mix, failed loads stay invisible."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid

pytestmark = pytest.mark.timeout(90)

N = 6000


def _load(t: ramgrid.Table, version_value: float, during: Callable[[], None] = lambda: None) -> None:
    """Writes version `version_value` of every key, in several batches so a switch mid-load would show; calls
    `during` between batches, while the new version is open and not yet current."""
    keys = np.arange(N, dtype=np.int64)
    with t.new_version() as w:
        for chunk in np.array_split(keys, 6):
            w.put_many(chunk, np.full(len(chunk), version_value))
            during()


def _run_reader(
    read: Callable[[], np.ndarray], stop: threading.Event, seen: list[float], errors: list[BaseException]
) -> threading.Thread:
    def loop() -> None:
        try:
            for _ in range(100_000):  # bounded
                got = read()
                lo, hi = float(got.min()), float(got.max())
                if lo != hi:
                    raise AssertionError(f"one batch mixed versions: values {lo} and {hi}")
                seen.append(lo)
                if stop.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 - anything the reader hits is re-raised by the main thread
            errors.append(e)

    th = threading.Thread(target=loop)
    th.start()
    return th


def test_pinned_reader_keeps_v1_while_v2_loads_and_current_never_mixes(
    grid3: ramgrid.LocalGrid, table_name: str
) -> None:
    t = grid3.create_table(table_name, partitions=24, value_type="f64")
    keys = np.arange(N, dtype=np.int64)
    _load(t, 1.0)
    v1 = t.current_version()
    pinned = t.pin()
    assert pinned.version == v1
    stop = threading.Event()
    pinned_seen: list[float] = []
    current_seen: list[float] = []
    errors: list[BaseException] = []
    readers = [
        _run_reader(lambda: pinned.get_many(keys), stop, pinned_seen, errors),
        _run_reader(lambda: t.get_many(keys), stop, current_seen, errors),
    ]

    def let_readers_run(rounds: int = 2) -> None:
        """Waits (bounded by the test timeout) until both readers finished `rounds` more batches: progress, not time."""
        target = (len(pinned_seen) + rounds, len(current_seen) + rounds)
        # Each reader on its own (a tuple comparison would stop once the faster one passed its target).
        while (
            (len(pinned_seen) < target[0] or len(current_seen) < target[1])
            and not errors
            and all(th.is_alive() for th in readers)
        ):
            readers[0].join(0.005)

    let_readers_run()
    _load(t, 2.0, let_readers_run)
    let_readers_run()
    _load(t, 3.0, let_readers_run)
    let_readers_run()
    stop.set()
    for th in readers:
        th.join(30)
    assert not errors, errors[0]
    assert pinned_seen and set(pinned_seen) == {1.0}
    assert current_seen == sorted(current_seen), "a current reader went back to an older version"
    assert {1.0, 2.0, 3.0} <= set(current_seen) and current_seen[-1] == 3.0
    assert t.current_version() == v1 + 2
    assert {v1, v1 + 1, v1 + 2} <= {v["version"] for v in t.versions()}


def test_failed_load_leaves_previous_version_current(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, value_type="f64")
    _load(t, 1.0)
    before = t.current_version()
    keys = np.arange(N, dtype=np.int64)
    with pytest.raises(RuntimeError, match="bad line"), t.new_version() as w:
        w.put_many(keys[:100], np.full(100, 9.0))
        raise RuntimeError("bad line 17")
    assert t.current_version() == before
    assert set(t.get_many(keys).tolist()) == {1.0}
    assert w.version not in [v["version"] for v in t.versions()]


def test_old_versions_stay_until_dropped(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, value_type="i64")
    t.put_many([1], np.array([10]))
    first = t.current_version()
    with t.new_version() as w:
        w.put_many([1], np.array([20]))
    assert t.get(1) == 20 and t.pin(first).get(1) == 10
    t.drop_version(first)
    assert first not in [v["version"] for v in t.versions()]
    with pytest.raises(ramgrid.exceptions.VersionNotFound):
        t.pin(first).get_many([1])


def test_sealed_versions_use_the_near_cache(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, value_type="f64")
    _load(t, 5.0)
    g = ramgrid.connect(grid3.spec, near_cache_bytes=1 << 20)
    p = g.table(table_name).pin()
    keys = np.arange(100, dtype=np.int64)
    assert p.get_many(keys).tolist() == [5.0] * 100
    assert p.get_many(keys).tolist() == [5.0] * 100  # second read may come from the near cache: same answer
