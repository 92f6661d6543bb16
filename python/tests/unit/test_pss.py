"""ramgrid._pss on real processes: a child's private pages show in its PSS, pages of a memfd that two children map
are split between them and add up to the segment once, and a process that is gone is an error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from ramgrid._pss import mapping_pss, read_pss, segment_pss

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc/PID/smaps_rollup"),
]
MiB = 2**20

# A child that allocates and touches `private` MiB of its own, maps the inherited memfd on descriptor `fd` (if any)
# and reads every page of it, says "ready", and waits for a line on stdin before it exits.
CHILD = textwrap.dedent(
    """
    import mmap, os, sys
    private, fd = int(sys.argv[1]), int(sys.argv[2])
    buf = bytearray(private << 20)
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    if fd >= 0:
        m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ)
        s = sum(m[i] for i in range(0, len(m), 4096))
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)  # reaps it and closes its pipes


def _start(started: list[subprocess.Popen[str]], private_mib: int, fd: int = -1) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(private_mib), str(fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(fd,) if fd >= 0 else (),
    )
    started.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_private_memory_of_a_child_shows_in_its_pss(children: list[subprocess.Popen[str]]) -> None:
    small = read_pss(_start(children, 1).pid)
    big = read_pss(_start(children, 64).pid)
    assert big.pss - small.pss >= 60 * MiB
    assert big.private - small.private >= 60 * MiB
    assert big.pss_anon - small.pss_anon >= 60 * MiB
    for r in (small, big):
        assert r.rss >= r.pss > 0
        # The three kinds split the total (smaps_rollup rounds each to a KiB).
        assert abs(r.pss_anon + r.pss_file + r.pss_shmem - r.pss) <= 8 * 1024
        assert r.unshared == r.pss - r.pss_shmem


def test_pages_two_children_map_are_split_and_add_up_once(children: list[subprocess.Popen[str]]) -> None:
    size = 32 * MiB
    fd = os.memfd_create("ramgrid:pss-test", 0)  # named like a ramgrid segment: /memfd:ramgrid:...
    try:
        os.write(fd, b"\x07" * size)
        a = _start(children, 1, fd)
        one = segment_pss([a.pid])
        assert size - 64 * 1024 <= one <= size + 64 * 1024  # the only mapper carries it all
        b = _start(children, 1, fd)
    finally:
        os.close(fd)  # the children's mappings keep the pages
    shares = [segment_pss([p.pid]) for p in (a, b)]
    assert all(size / 2 - 64 * 1024 <= s <= size / 2 + 64 * 1024 for s in shares), shares
    assert abs(segment_pss([a.pid, b.pid]) - size) <= 64 * 1024
    assert abs(read_pss(a.pid).pss_shmem - size / 2) <= 1 * MiB
    names = [k for k in mapping_pss(a.pid) if k.startswith("/memfd:ramgrid:pss-test")]
    assert len(names) == 1, names
    assert segment_pss([a.pid], prefix="/memfd:something-else") == 0


def test_a_process_that_is_gone_is_an_error(children: list[subprocess.Popen[str]]) -> None:
    p = _start(children, 1)
    p.kill()
    p.communicate(timeout=10)
    with pytest.raises(OSError):
        read_pss(p.pid)
    with pytest.raises(OSError):
        mapping_pss(p.pid)
