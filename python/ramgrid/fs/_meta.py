"""File-system metadata (listings and file status) cached in a grid table shared by every process.

Entries are JSON: `{"g": generation, "t": fetched_at (Unix seconds), "v": value}` under the keys `i:<path>` (one
path's status, or null when it does not exist) and `l:<path>` (a directory's listing with every child's status).
An entry serves while it is younger than `ttl` and its generation equals the table's `gen` key, which is read in
the same batch; a recursive delete or a directory rename bumps `gen`, dropping every entry at once. A per-process
near cache keeps entries for at most `near_ttl` seconds more (never past `ttl`). Tables never evict; metadata is
small, and each entry is overwritten when revalidated.

If the grid cannot be reached, every lookup is a miss and every store is skipped: the caller asks the file system.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

GEN_KEY = "gen"


class MetaCache:
    def __init__(self, table: Any, ttl: float, near_ttl: float, near_entries: int = 4096) -> None:
        self.table = table
        self.ttl = ttl
        self.near_ttl = min(near_ttl, ttl)
        self.near_entries = near_entries
        # key -> (entry dict, monotonic time it was read from the grid)
        self._near: dict[str, tuple[dict[str, Any], float]] = {}
        self._lock = threading.Lock()
        self.grid_errors = 0

    def _fresh(self, e: dict[str, Any], now: float) -> bool:
        return now - float(e["t"]) <= self.ttl

    def get_many(self, keys: list[str]) -> tuple[dict[str, Any], int | None]:
        """Fresh values by key (misses left out), and the generation to store refetched values under (None: the
        grid was not asked or failed, store nothing). Near cache first, then one grid batch with the generation."""
        now, mono = time.time(), time.monotonic()
        out: dict[str, Any] = {}
        rest = []
        with self._lock:
            for k in keys:
                hit = self._near.get(k)
                if hit is not None and mono - hit[1] <= self.near_ttl and self._fresh(hit[0], now):
                    out[k] = hit[0]["v"]
                else:
                    rest.append(k)
        if not rest:
            return out, None
        try:
            raw = self.table.get_many([GEN_KEY, *rest], default=None)
        except Exception as e:  # noqa: BLE001 (any grid failure: fall back to the file system)
            self.grid_errors += 1
            log.debug("metadata cache unavailable (%s); asking the file system", e)
            return out, None
        gen = json.loads(raw[0]) if raw[0] is not None else 0
        with self._lock:
            for k, v in zip(rest, raw[1:]):
                if v is None:
                    continue
                entry = json.loads(v)
                if entry["g"] == gen and self._fresh(entry, now):
                    out[k] = entry["v"]
                    self._remember(k, entry, mono)
        return out, gen

    def _remember(self, k: str, e: dict[str, Any], mono: float) -> None:
        if len(self._near) >= self.near_entries:
            self._near.clear()  # crude but bounded; entries live at most near_ttl anyway
        self._near[k] = (e, mono)

    def put_many(self, items: dict[str, Any], fetched_at: float, gen: int | None) -> None:
        """Stores values fetched from the file system at `fetched_at` (taken before the request was sent) under
        generation `gen` (read before the request too, so an invalidation racing with it wins)."""
        if not items or gen is None:
            return
        try:
            enc = {k: {"g": gen, "t": fetched_at, "v": v} for k, v in items.items()}
            self.table.put_many(list(enc), [json.dumps(e).encode() for e in enc.values()])
        except Exception as err:  # noqa: BLE001
            self.grid_errors += 1
            log.debug("metadata cache store skipped (%s)", err)
            return
        mono = time.monotonic()
        with self._lock:
            for k, entry in enc.items():
                self._remember(k, entry, mono)

    def current_gen(self) -> int | None:
        try:
            g = self.table.get(GEN_KEY, default=None)
        except Exception:  # noqa: BLE001
            self.grid_errors += 1
            return None
        return json.loads(g) if g is not None else 0

    def invalidate(self, keys: list[str]) -> None:
        with self._lock:
            for k in keys:
                self._near.pop(k, None)
        try:
            self.table.delete_many(keys)
        except Exception as e:  # noqa: BLE001
            self.grid_errors += 1
            log.warning(
                "metadata cache invalidation failed (%s); other processes may see old entries for %.1f s", e, self.ttl
            )

    def invalidate_all(self) -> None:
        """Bumps the generation: every entry of every process is dropped (near caches within near_ttl)."""
        with self._lock:
            self._near.clear()
        try:
            g = self.table.get(GEN_KEY, default=None)
            gen = json.loads(g) if g is not None else 0
            # Not atomic across writers, but any two bumps both move the generation past every older entry.
            self.table.put(GEN_KEY, json.dumps(max(gen + 1, int(time.time() * 1000))).encode())
        except Exception as e:  # noqa: BLE001
            self.grid_errors += 1
            log.warning(
                "metadata cache invalidation failed (%s); other processes may see old entries for %.1f s", e, self.ttl
            )

    def clear_near(self) -> None:
        with self._lock:
            self._near.clear()
