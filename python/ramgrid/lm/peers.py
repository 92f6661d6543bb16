"""The reference experiment's architecture as a peer: real memcached servers on loopback, read with pymemcache.

`MemcachedCluster` starts `memcached -l 127.0.0.1 -p PORT -U 0 -m MB -t THREADS` processes and stops them on exit.
Inside Dask tasks, `memcached_client()` gives each worker process one pymemcache `HashClient` over those servers (the
client hashes keys to servers, as spymemcached did in the paper). Values are log probabilities as text (Python's
`repr`, which reads back as the identical float).

memcached keys are at most 250 bytes with no whitespace or control characters, and a whitespace token may still
hold control characters or be up to 400 bytes of UTF-8. Such tokens (and printable ones that start with "%") are
stored under "%" plus a 160-bit BLAKE2b digest of the token, so every token has a distinct valid key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ramgrid.exceptions import RamgridError

__all__ = [
    "HASHERS",
    "MEMCACHED_BATCH",
    "Crc32ModuloHash",
    "MemcachedCluster",
    "MemcachedError",
    "load_memcached_part",
    "mc_key",
    "memcached_available",
    "memcached_client",
    "memcached_version",
    "reset_worker_clients",
]

# Keys per multi-get sent to memcached: a text-protocol `get` line of this many keys stays well under a MiB.
MEMCACHED_BATCH = 10_000
_SET_BATCH = 5_000
_clients: dict[tuple[tuple[tuple[str, int], ...], str], Any] = {}


class MemcachedError(RamgridError):
    """memcached is missing, would not start, or lost data it was given."""


def mc_key(token: str) -> bytes:
    """The memcached key of a token (see the module docstring)."""
    # isprintable() is False for every whitespace character except the ASCII space, which is tested apart.
    if token.isprintable() and " " not in token and not token.startswith("%"):
        b = token.encode("utf-8")
        if len(b) <= 250:
            return b
    return b"%" + hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest().encode()


def memcached_available(binary: str = "memcached") -> bool:
    return shutil.which(binary) is not None


def memcached_version(binary: str = "memcached") -> str:
    try:
        out = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unavailable"
    return out.stdout.strip() or out.stderr.strip() or "unknown"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class MemcachedCluster:
    """`n` memcached servers on loopback, stopped by `close()` or on leaving a `with` block."""

    def __init__(self, n: int, *, memory_mb: int = 1024, threads: int = 1, binary: str = "memcached") -> None:
        if not memcached_available(binary):
            raise MemcachedError(f"{binary!r} is not installed (apt-get install memcached)")
        self.memory_mb = memory_mb
        self.threads = threads
        self.procs: list[subprocess.Popen[bytes]] = []
        self.servers: list[tuple[str, int]] = []
        try:
            for _ in range(n):
                self._start_one(binary)
        except BaseException:
            self.close()
            raise

    def _start_one(self, binary: str) -> None:
        last = ""
        for _attempt in range(5):  # another process may take the free port between our probe and memcached's bind
            port = _free_port()
            args = [
                binary,
                "-l",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "0",
                "-m",
                str(self.memory_mb),
                "-t",
                str(self.threads),
            ]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                args += ["-u", "root"]  # memcached refuses to run as root unless told which user to be
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if _accepts(port):
                    self.procs.append(proc)
                    self.servers.append(("127.0.0.1", port))
                    return
                time.sleep(0.02)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            last = (proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else "") or "no output"
        raise MemcachedError(f"memcached did not start: {last}")

    @property
    def command(self) -> str:
        return f"memcached -l 127.0.0.1 -p PORT -U 0 -m {self.memory_mb} -t {self.threads}"

    def items_per_server(self) -> list[int]:
        """`curr_items` of each server, in `servers` order."""
        from pymemcache.client.base import Client

        out = []
        for host, port in self.servers:
            c = Client((host, port), connect_timeout=2, timeout=10)
            try:
                out.append(int(c.stats()[b"curr_items"]))
            finally:
                c.close()
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stderr:
                p.stderr.close()
        self.procs = []

    def __enter__(self) -> MemcachedCluster:  # noqa: PYI034 - Self needs typing_extensions on Python < 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Crc32ModuloHash:
    """Key -> server as crc32(key) mod n, the shape of spymemcached's default (native hash, modulo).

    pymemcache's default, rendezvous hashing with a pure-Python murmur3, costs several microseconds per key per
    server in the client, which would make the peer measure its hash function more than memcached. A hasher
    plugs into HashClient through add_node / remove_node / get_node.
    """

    def __init__(self) -> None:
        self.nodes: list[str] = []

    def add_node(self, node: str) -> None:
        if node not in self.nodes:
            self.nodes.append(node)

    def remove_node(self, node: str) -> None:
        self.nodes.remove(node)

    def get_node(self, key: bytes | str) -> str | None:
        if not self.nodes:
            return None
        b = key if isinstance(key, bytes) else key.encode("utf-8")
        return self.nodes[zlib.crc32(b) % len(self.nodes)]


HASHERS = ("crc32", "rendezvous")


def memcached_client(servers: Sequence[tuple[str, int]], hasher: str = "crc32") -> Any:
    """This process's HashClient over `servers` (created on first use, kept for later tasks). `hasher`: "crc32"
    (Crc32ModuloHash) or "rendezvous" (pymemcache's default)."""
    key = (tuple((str(h), int(p)) for h, p in servers), hasher)
    c = _clients.get(key)
    if c is None:
        from pymemcache.client.hash import HashClient

        kw: dict[str, Any] = {}
        if hasher == "crc32":
            kw["hasher"] = Crc32ModuloHash
        elif hasher != "rendezvous":
            raise ValueError(f"hasher must be one of {', '.join(HASHERS)}, got {hasher!r}")
        c = HashClient(list(key[0]), connect_timeout=2.0, timeout=10.0, no_delay=True, use_pooling=False, **kw)
        _clients[key] = c
    return c


def reset_worker_clients(grid_configs: Iterable[Any] = ()) -> int:
    """Closes this process's memcached clients and the ramgrid clients of `grid_configs` (near caches included), so
    the next run starts cold: connections are made, and caches filled, inside the measured run. Returns how many."""
    n = 0
    for c in list(_clients.values()):
        with contextlib.suppress(Exception):
            c.close()
        n += 1
    _clients.clear()
    from ramgrid._clients import release_client

    for cfg in grid_configs:
        with contextlib.suppress(Exception):
            release_client(cfg)
        n += 1
    return n


def load_memcached_part(
    part: tuple[list[str], np.ndarray], servers: Sequence[tuple[str, int]], hasher: str = "crc32"
) -> int:
    """Load task: stores one bucket of the model in memcached (values as text); returns the number of keys."""
    keys, values = part
    mc = memcached_client(servers, hasher)
    for lo in range(0, len(keys), _SET_BATCH):
        batch = {
            mc_key(k): repr(v).encode()
            for k, v in zip(keys[lo : lo + _SET_BATCH], values[lo : lo + _SET_BATCH].tolist())
        }
        failed = mc.set_many(batch, noreply=False)
        if failed:
            raise MemcachedError(f"memcached refused {len(failed)} of {len(batch)} keys (first: {failed[0]!r})")
    return len(keys)
