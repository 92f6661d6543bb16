"""Many batches in flight: `get_many_batches` (pipelined) and `get_many_async` (asyncio) against real servers.

Results are checked exactly against a dict; calls are cancelled at random points and every later result must still
be exact (no reply read by the wrong call); a server is killed with batches in flight; bad input raises what the
sync API raises.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import KeysNotFound, TableNotFound

pytestmark = pytest.mark.timeout(120)

N = 4000


def _expected(model: dict[int, float], keys: np.ndarray) -> np.ndarray:
    return np.array([model.get(int(k), np.nan) for k in keys])


def _batches(rng: random.Random, count: int, size: int) -> list[np.ndarray]:
    # A quarter of the keys were never stored.
    return [np.array([rng.randrange(N * 4 // 3) for _ in range(size)], dtype=np.int64) for _ in range(count)]


@pytest.fixture
def table(grid3: ramgrid.LocalGrid, table_name: str) -> tuple[Any, dict[int, float]]:
    t = grid3.create_table(table_name, partitions=16, replication=2, value_type="f64")
    keys = np.arange(N, dtype=np.int64)
    t.put_many(keys, keys * 0.25)
    return t, {int(k): float(k) * 0.25 for k in keys}


def test_pipelined_batches_are_exact_and_in_order(table: tuple[Any, dict[int, float]]) -> None:
    t, model = table
    work = _batches(random.Random(1), 200, 10) + _batches(random.Random(2), 50, 100)
    got = list(t.get_many_batches(work, depth=8, default=np.nan))
    assert len(got) == len(work)
    for keys, values in zip(work, got, strict=True):
        np.testing.assert_array_equal(values, _expected(model, keys))
    # A lazy source is pulled as results are taken, and lists of keys work as in get_many.
    pairs = list(t.lookup_batches(([int(k) for k in b] for b in work[:30]), depth=3))
    for keys, (values, found) in zip(work[:30], pairs, strict=True):
        np.testing.assert_array_equal(found, [int(k) in model for k in keys])
        np.testing.assert_array_equal(values[found], _expected(model, keys)[found])


def test_pipelined_batches_raise_in_their_turn(table: tuple[Any, dict[int, float]]) -> None:
    t, _ = table
    good = np.arange(5, dtype=np.int64)
    it = t.get_many_batches([good, good, np.array([N + 5], dtype=np.int64), good])
    np.testing.assert_array_equal(next(it), good * 0.25)
    np.testing.assert_array_equal(next(it), good * 0.25)
    with pytest.raises(KeysNotFound):
        next(it)
    # Bad input in the source: raised after the batches before it, as get_many raises it.
    with pytest.raises(TypeError) as sync:
        t.get_many([1.5])
    it = t.get_many_batches([good, [1.5], good])
    np.testing.assert_array_equal(next(it), good * 0.25)
    with pytest.raises(TypeError) as piped:
        next(it)
    assert str(piped.value) == str(sync.value)
    with pytest.raises(ValueError, match="depth"):
        list(t.get_many_batches([good], depth=0))


def test_many_concurrent_tasks_are_exact(table: tuple[Any, dict[int, float]]) -> None:
    t, model = table
    work = _batches(random.Random(3), 400, 10) + _batches(random.Random(4), 100, 100)

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(t.get_many_async(b, default=np.nan) for b in work)))

    got = asyncio.run(main())
    for keys, values in zip(work, got, strict=True):
        np.testing.assert_array_equal(values, _expected(model, keys))


def test_cancelled_calls_leave_no_reply_for_later_calls(table: tuple[Any, dict[int, float]]) -> None:
    t, model = table
    rng = random.Random(5)
    work = _batches(rng, 600, 20)

    async def one(keys: np.ndarray) -> tuple[np.ndarray, Any]:
        return keys, await t.get_many_async(keys, default=np.nan)

    async def main() -> int:
        checked = 0
        for start in range(0, len(work), 60):
            tasks = [asyncio.create_task(one(b)) for b in work[start : start + 60]]
            # Cancel a random third, at random points: before they submit, while in flight, or never.
            for task in rng.sample(tasks, 20):
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)
                task.cancel()
            for task in tasks:
                try:
                    keys, values = await task
                except asyncio.CancelledError:
                    continue
                np.testing.assert_array_equal(values, _expected(model, keys))
                checked += 1
        # After all the cancellations, every call is still exact.
        for b in work[:50]:
            np.testing.assert_array_equal(await t.get_many_async(b, default=np.nan), _expected(model, b))
        return checked

    assert asyncio.run(main()) >= len(work) // 2


def test_async_bad_input_raises_what_the_sync_api_raises(table: tuple[Any, dict[int, float]]) -> None:
    t, _ = table

    async def main() -> None:
        for bad in ([1.5], "not keys", (np.array([0, 3], dtype=np.int64), 5)):
            with pytest.raises(Exception) as sync:
                t.get_many(bad)
            with pytest.raises(type(sync.value)) as aio:
                await t.get_many_async(bad)
            assert str(aio.value) == str(sync.value)
        with pytest.raises(KeysNotFound):
            await t.get_many_async([N + 1])
        missing = t._grid.table("no_such_table_here")
        with pytest.raises(TableNotFound):
            await missing.get_many_async([1])
        # The reader still serves after the errors.
        np.testing.assert_array_equal(await t.get_many_async([4, 8]), [1.0, 2.0])

    asyncio.run(main())


def test_a_server_killed_mid_stream_with_replication_2() -> None:
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        t = g.create_table("rep", partitions=12, replication=2, value_type="f64")
        keys = np.arange(N, dtype=np.int64)
        t.put_many(keys, keys * 0.25)
        model = {int(k): float(k) * 0.25 for k in keys}
        work = _batches(random.Random(6), 400, 50)
        killed = False

        def source() -> Iterator[np.ndarray]:
            nonlocal killed
            for i, b in enumerate(work):
                if i == 100:
                    g.kill(1)  # 8 batches are in flight on every lane
                    killed = True
                yield b

        got = list(t.get_many_batches(source(), depth=8, default=np.nan))
        assert killed
        for b, values in zip(work, got, strict=True):
            np.testing.assert_array_equal(values, _expected(model, b))

        async def main() -> list[Any]:
            return list(await asyncio.gather(*(t.get_many_async(b, default=np.nan) for b in work)))

        for b, values in zip(work, asyncio.run(main()), strict=True):
            np.testing.assert_array_equal(values, _expected(model, b))
