"""A load's progress on stderr: rows, bytes and rate."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


class _Progress:
    """Rows, bytes and rate on stderr: a tqdm bar when tqdm is installed, else a line redrawn a few times a second
    (on a terminal) or printed every few seconds (in a log). Thread-safe."""

    def __init__(self, desc: str, total_bytes: int, enabled: bool) -> None:
        self.enabled = enabled
        self.lock = threading.Lock()
        self.rows = 0
        self.bytes = 0
        self.total = total_bytes
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.desc = desc
        self.bar: Any = None
        self.tty = enabled and sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc, file=sys.stderr, leave=True)
            except ImportError:
                self.bar = None

    def update(self, rows: int, nbytes: int) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.rows += rows
            self.bytes += nbytes
            now = time.perf_counter()
            if self.bar is not None:
                if nbytes:
                    self.bar.update(nbytes)
                if now - self.last > 0.2:
                    self.last = now
                    self.bar.set_postfix_str(f"{self.rows:,} rows, {self.rows / max(now - self.t0, 1e-9):,.0f} rows/s")
                return
            if now - self.last >= (0.2 if self.tty else 5.0):
                self.last = now
                self._draw(final=False)

    def _draw(self, final: bool) -> None:
        el = max(time.perf_counter() - self.t0, 1e-9)
        pct = f" ({100 * self.bytes / self.total:.0f}%)" if self.total else ""
        line = (
            f"{self.desc}: {self.rows:,} rows, {_human_bytes(self.bytes)}/{_human_bytes(self.total)}{pct}, "
            f"{self.rows / el:,.0f} rows/s, {el:.1f} s"
        )
        end = "\n" if final or not self.tty else ""
        sys.stderr.write(("\r" if self.tty else "") + line + end)
        sys.stderr.flush()

    def close(self, ok: bool) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.bar is not None:
                self.bar.set_postfix_str(f"{self.rows:,} rows" + ("" if ok else ", failed"))
                self.bar.close()
            else:
                self._draw(final=True)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
