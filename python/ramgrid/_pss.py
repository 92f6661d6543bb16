"""A process's memory as Linux accounts it, read from /proc: PSS (proportional set size), so that pages shared by
several processes count once per host when the processes' figures are summed.

PSS charges each resident page to the processes that map it in equal shares: a page mapped by four processes adds a
quarter of a page to each. Summed over every process that maps it, a page counts exactly once. Shared-memory segments
(docs/shared-memory.md) are charged this way to the processes that map them; the ramgrid server writes a segment
through its descriptor and never maps it, so its pages are in the readers' PSS only, and while no process maps a
segment its pages are in nobody's PSS (`segment_pss` finds the part of a segment that the processes summed do map).

Used by the language-model experiment's memory step (`ramgrid.lm.memory`) and `benchmarks/shm_readers.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MEMFD_PREFIX", "Pss", "mapping_pss", "read_pss", "segment_pss"]

# How a ramgrid segment's mappings are named in /proc/PID/smaps: memfd "ramgrid:<table>:v<version>:p<partition>".
MEMFD_PREFIX = "/memfd:ramgrid:"


@dataclass(frozen=True)
class Pss:
    """One process's memory in bytes, from /proc/PID/smaps_rollup.

    `pss` is the total; `pss_anon`, `pss_file` and `pss_shmem` split it (shmem includes memfd and /dev/shm pages);
    `private` is the pages only this process maps (Private_Clean + Private_Dirty); `rss` counts shared pages whole.
    """

    pid: int
    pss: int
    pss_anon: int
    pss_file: int
    pss_shmem: int
    private: int
    rss: int

    @property
    def unshared(self) -> int:
        """PSS less the process's share of shared-memory pages (memfd, /dev/shm): what it costs beyond them."""
        return self.pss - self.pss_shmem


def _fields(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith(":") and parts[2] == "kB":
            out[parts[0][:-1]] = int(parts[1]) * 1024
    return out


def read_pss(pid: int) -> Pss:
    """The PSS of a live process. Raises OSError (FileNotFoundError, PermissionError) when /proc does not show it:
    the process is gone, belongs to another user, or this is not Linux."""
    f = _fields(Path(f"/proc/{int(pid)}/smaps_rollup").read_text())
    if "Pss" not in f:
        raise OSError(f"/proc/{pid}/smaps_rollup has no Pss line (a kernel thread or a process that just exited)")
    return Pss(
        pid=int(pid),
        pss=f["Pss"],
        pss_anon=f.get("Pss_Anon", 0),
        pss_file=f.get("Pss_File", 0),
        pss_shmem=f.get("Pss_Shmem", 0),
        private=f.get("Private_Clean", 0) + f.get("Private_Dirty", 0),
        rss=f.get("Rss", 0),
    )


def mapping_pss(pid: int) -> dict[str, int]:
    """PSS in bytes by mapping name, from /proc/PID/smaps: a file's path, "/memfd:NAME (deleted)", "[heap]",
    "[stack]", or "[anon]" for anonymous mappings without a name (malloc arenas, thread stacks, the Rust allocator's
    large blocks). Mappings of the same name are summed."""
    out: dict[str, int] = {}
    name = "[anon]"
    for line in Path(f"/proc/{int(pid)}/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5].strip() if len(head) == 6 and head[5].strip() else "[anon]"
        elif head and head[0] == "Pss:":
            out[name] = out.get(name, 0) + int(head[1]) * 1024
    return out


def segment_pss(pids: Iterable[int], prefix: str = MEMFD_PREFIX) -> int:
    """Bytes of ramgrid shared-memory segments charged to these processes together (the sum of their PSS shares of
    every mapping whose name starts with `prefix`). When these are all the processes that map the segments, it is
    the segments' resident size, counted once."""
    return sum(v for pid in pids for k, v in mapping_pss(pid).items() if k.startswith(prefix))
