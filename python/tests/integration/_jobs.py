"""A reading job and a writing job for membership and chaos tests: they run in threads against a live grid while
servers come and go, and keep exact books so the test can prove that no acknowledged write was lost and no read
was wrong.

`Jobs` is used by test_membership.py and test_chaos.py. The table is an i64 table; key k always holds `value_of(k)`, written once and never changed, so a read is checked
exactly against arithmetic rather than against a copy that could share a bug.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ramgrid
from ramgrid.exceptions import BatchError, KeysNotFound, RamgridError


def value_of(keys: np.ndarray) -> np.ndarray:
    """The one value key k ever holds."""
    return keys * 7919 + 13


def load(table: Any, n: int) -> np.ndarray:
    """Keys 0..n-1 stored and acknowledged before the job starts (raises if any is not)."""
    keys = np.arange(n, dtype=np.int64)
    table.put_many(keys, value_of(keys))
    return keys


@dataclass
class Books:
    """What the writer got acknowledged, and what the reader checked. Shared by the threads under `lock`."""

    acked: list[np.ndarray] = field(default_factory=list)
    acked_count: int = 0
    batches_acked: int = 0
    batches_failed: int = 0
    keys_retried: int = 0
    # Keys whose write never got acknowledged after every retry: their state is unknown, so they are left out of
    # the checks (never counted as acknowledged).
    unacked: list[int] = field(default_factory=list)
    # The first reasons writes failed (up to 20), for the report.
    write_errors: list[str] = field(default_factory=list)
    reads: int = 0
    keys_checked: int = 0
    read_errors: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acked_keys(self) -> np.ndarray:
        with self.lock:
            if len(self.acked) > 1:  # kept as one array, so a long run does not concatenate thousands each read
                self.acked = [np.concatenate(self.acked)]
            return self.acked[0] if self.acked else np.zeros(0, dtype=np.int64)


class Jobs:
    """A writer thread (put_many of fresh keys, ack="all", failed keys retried) and a reader thread (get_many of a
    sample of acknowledged keys, each value checked) on their own clients, until `stop()`."""

    def __init__(
        self, spec: str, table: str, first_key: int, *, batch: int = 500, sample: int = 2000, pause: float = 0.0
    ) -> None:
        # Distinct configurations, so each job has its own native client and learns of moves from the servers,
        # as a job in another process would.
        self.writer_grid = ramgrid.connect(spec, ack="all", call_timeout=20.0)
        self.reader_grid = ramgrid.connect(spec, ack="one", call_timeout=20.0)
        self.table = table
        self.books = Books()
        self.next_key = first_key
        self.batch = batch
        self.sample = sample
        # Seconds the writer waits between batches: bounds the memory a long run fills.
        self.pause = pause
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guard, args=(self._write,), name="writer", daemon=True),
            threading.Thread(target=self._guard, args=(self._read,), name="reader", daemon=True),
        ]
        self.crashed: list[str] = []

    def add_acked(self, keys: np.ndarray) -> None:
        with self.books.lock:
            self.books.acked.append(np.asarray(keys, dtype=np.int64))
            self.books.acked_count += len(keys)

    def start(self) -> Jobs:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> Books:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
            assert not t.is_alive(), f"{t.name} did not stop"
        return self.books

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a bug in the job itself: the test must see it
            self.crashed.append(f"{type(e).__name__}: {e}")

    def _write(self) -> None:
        t = self.writer_grid.table(self.table)
        retry: np.ndarray = np.zeros(0, dtype=np.int64)
        tries: dict[int, int] = {}
        while not self._stop.is_set():
            fresh = np.arange(self.next_key, self.next_key + self.batch, dtype=np.int64)
            self.next_key += self.batch
            keys = np.concatenate([retry, fresh])
            failed_idx: list[int]
            try:
                t.put_many(keys, value_of(keys))
                failed_idx = []
            except BatchError as e:
                failed_idx = sorted({int(i) for i, _ in e.failures})
                self._note(f"{len(failed_idx)} of {len(keys)} refused, e.g. {e.failures[0][1]}")
            except RamgridError as e:
                failed_idx = list(range(len(keys)))
                self._note(f"{type(e).__name__}: {e}")
            ok = np.ones(len(keys), dtype=bool)
            ok[failed_idx] = False
            self.add_acked(keys[ok])
            with self.books.lock:
                if failed_idx:
                    self.books.batches_failed += 1
                else:
                    self.books.batches_acked += 1
            # A key whose write failed may sit on some replicas: it is written again (same value) until
            # acknowledged, at most 20 times; after that it is excluded from the checks.
            again = []
            for k in keys[~ok].tolist():
                tries[k] = tries.get(k, 0) + 1
                if tries[k] < 20:
                    again.append(k)
                else:
                    with self.books.lock:
                        self.books.unacked.append(k)
            with self.books.lock:
                self.books.keys_retried += len(again)
            retry = np.array(again, dtype=np.int64)
            if failed_idx:
                time.sleep(0.05)
            elif self.pause:
                time.sleep(self.pause)
        with self.books.lock:
            self.books.unacked.extend(retry.tolist())

    def _note(self, why: str) -> None:
        with self.books.lock:
            if len(self.books.write_errors) < 20:
                self.books.write_errors.append(f"{time.monotonic():.2f} {why}")

    def _read(self) -> None:
        t = self.reader_grid.table(self.table)
        rng = np.random.default_rng(1)
        while not self._stop.is_set():
            acked = self.books.acked_keys()
            if len(acked) == 0:
                time.sleep(0.01)
                continue
            keys = rng.choice(acked, size=min(self.sample, len(acked)), replace=False)
            try:
                got = t.get_many(keys)
            except KeysNotFound as e:
                with self.books.lock:
                    self.books.wrong.append(f"{e.count} acknowledged keys missing: {e}")
                continue
            except RamgridError as e:
                with self.books.lock:
                    self.books.read_errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.05)
                continue
            bad = np.flatnonzero(got != value_of(keys))
            with self.books.lock:
                self.books.reads += 1
                self.books.keys_checked += len(keys)
                if len(bad):
                    k = int(keys[bad[0]])
                    self.books.wrong.append(f"{len(bad)} wrong values, e.g. key {k}: {int(got[bad[0]])}")


def check_all(spec: str, table: str, keys: np.ndarray) -> None:
    """Every key in `keys` reads back exactly, through a fresh client (in chunks)."""
    t = ramgrid.connect(spec, ack="one", pool_size=3).table(table)
    for start in range(0, len(keys), 50_000):
        chunk = keys[start : start + 50_000]
        got = t.get_many(chunk, default=-1)
        bad = np.flatnonzero(got != value_of(chunk))
        assert len(bad) == 0, (
            f"{len(bad)} of {len(chunk)} acknowledged keys read wrong, e.g. key {int(chunk[bad[0]])}: "
            f"{int(got[bad[0]])} (-1 = missing), expected {int(value_of(chunk[bad[0]]))}"
        )
