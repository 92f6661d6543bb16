"""A job's progress on stderr, in tasks: a tqdm bar when tqdm is installed, else a line every few seconds."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Progress"]


class Progress:
    def __init__(self, desc: str, total: int, enabled: bool, done: int = 0) -> None:
        self.enabled = enabled
        self.desc = desc
        self.total = total
        self.done = done
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit="task", desc=desc, file=sys.stderr, leave=True)
            except ImportError:
                self.bar = None

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.perf_counter()
        if now - self.last >= 5.0:
            self.last = now
            self._line()

    def _line(self) -> None:
        el = time.perf_counter() - self.t0
        sys.stderr.write(f"{self.desc}: {self.done}/{self.total} tasks, {el:.1f} s\n")
        sys.stderr.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            self._line()
