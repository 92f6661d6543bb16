"""Many batches in flight: pipelined batch reads for a thread, and asyncio reads for services.

`Table.get_many_batches(batches, depth=8)` reads an iterable of key batches with up to `depth` of them in flight
on each server's connection and yields each batch's result in order, so a thread issuing small batches is not
bound by one round trip per batch. `await table.get_many_async(keys)` reads one batch without blocking the event
loop: one native I/O thread per client and event loop (not one per call) keeps the batches of every task in flight,
and the loop takes the finished results when the thread's wake-up socket becomes readable. A task cancelled while its batch is in flight never takes the
reply, and no other call can: replies are matched to their own batch by request id (docs/client.md,
rule 17, "Pipelined reads").
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ramgrid._keys import convert_keys
from ramgrid._sentinels import RAISE

if TYPE_CHECKING:
    from ramgrid.grid import Grid

# "No default given": a missing key raises, as in `get_many`.
_UNSET: Any = object()

# Batches one client's I/O thread keeps in flight for asyncio callers.
ASYNC_DEPTH = 32


class _LoopReads:
    """One client's asyncio reads on one event loop: the native reader (its I/O thread) and the futures waiting on
    it, by token. The loop watches the reader's wake-up socket and settles the futures on its own thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        from ramgrid._clients import native

        self.client = client
        self.reader = native().AioReader(client, ASYNC_DEPTH)
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.tokens = itertools.count()
        # Holds no reference to the loop (the registry is keyed weakly by it).
        loop.add_reader(self.reader.fileno(), self._drain)

    def _drain(self) -> None:
        for token, ok, value in self.reader.drain():
            fut = self.futures.pop(token, None)
            # A cancelled caller's future is done already: its reply ends here, read by no one.
            if fut is None or fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def submit(self, table: str, k: Any, version: int, incarnation: int, shm: bool) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        token = next(self.tokens)
        self.reader.submit(table, k, version, incarnation, token, shm)
        self.futures[token] = fut
        return fut


# event loop -> {id(native client): its _LoopReads}; an entry goes with its loop.
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _LoopReads]] = weakref.WeakKeyDictionary()


def _loop_reads(client: Any) -> _LoopReads:
    loop = asyncio.get_running_loop()
    readers = _per_loop.setdefault(loop, {})
    lr = readers.get(id(client))
    if lr is None or lr.client is not client:
        lr = readers[id(client)] = _LoopReads(loop, client)
    return lr


class _PipelinedReads:
    """Pipelined and asyncio reads, mixed into the read handles (Table, PinnedTable, VersionWriter)."""

    _grid: Grid
    name: str
    _read_version: int
    _read_incarnation: int
    _read_shm: bool

    def _finish_get(self, k: Any, values: Any, found: np.ndarray, default: Any) -> Any:
        raise NotImplementedError  # grid._Reader

    def lookup_batches(self, batches: Iterable[Any], depth: int = 8) -> Iterator[tuple[Any, np.ndarray]]:
        """Like `lookup` for each batch of `batches` (an iterable of key batches), in order, with up to `depth`
        batches in flight. Errors are raised in their batch's turn, after the results of the batches before it."""
        client = self._grid._client()
        converted = (convert_keys(b) for b in batches)
        yield from native_pipelined(
            client, self.name, converted, depth, self._read_version, self._read_incarnation, self._read_shm
        )

    def get_many_batches(self, batches: Iterable[Any], depth: int = 8, default: Any = _UNSET) -> Iterator[Any]:
        """Like `get_many` for each batch of `batches`, in order, with up to `depth` batches in flight on each
        server's connection. A missing key raises KeysNotFound in its batch's turn unless `default` is given
        (e.g. `default=np.nan`)."""
        sent: collections.deque[Any] = collections.deque()

        def take() -> Iterator[Any]:
            for b in batches:
                k = convert_keys(b)
                sent.append(k)
                yield k

        client = self._grid._client()
        dflt = RAISE if default is _UNSET else default
        for values, found in native_pipelined(
            client, self.name, take(), depth, self._read_version, self._read_incarnation, self._read_shm
        ):
            yield self._finish_get(sent.popleft(), values, found, dflt)

    async def lookup_async(self, keys: Any) -> tuple[Any, np.ndarray]:
        """`lookup` for asyncio: `(values, found)`, without blocking the event loop."""
        k = convert_keys(keys)
        result: tuple[Any, np.ndarray] = await self._submit_async(k)
        return result

    async def get_many_async(self, keys: Any, default: Any = _UNSET) -> Any:
        """`get_many` for asyncio (same results and errors), without blocking the event loop. Many tasks may
        await reads at once: their batches share the client's connections, up to 32 in flight."""
        k = convert_keys(keys)
        values, found = await self._submit_async(k)
        return self._finish_get(k, values, found, RAISE if default is _UNSET else default)

    def _submit_async(self, k: Any) -> asyncio.Future[Any]:
        client = self._grid._client()
        return _loop_reads(client).submit(self.name, k, self._read_version, self._read_incarnation, self._read_shm)


def native_pipelined(
    client: Any, table: str, batches: Iterable[Any], depth: int, version: int, incarnation: int, shm: bool = True
) -> Iterator[tuple[Any, np.ndarray]]:
    """The native pipelined iterator over converted key batches (see `ramgrid._native.get_many_pipelined`)."""
    from ramgrid._clients import native

    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"depth must be an int >= 1, got {depth!r}")
    it: Iterator[tuple[Any, np.ndarray]] = native().get_many_pipelined(
        client, table, iter(batches), depth, version, incarnation, shm
    )
    return it
