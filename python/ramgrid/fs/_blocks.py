"""File blocks in the grid's evicting cache keyspace, reached with memcached's meta protocol.

Each block lives on one server, chosen by rendezvous hashing of its key over the grid's servers, so every
process that reads the same block asks the same server. The cache keyspace is bounded (`--memory`) and evicts
by CLOCK (docs/cache-keyspace.md); a block that was evicted is a miss, and the reader
fetches it from the file system again. A server that cannot be reached is skipped for `down_for` seconds: its
blocks are misses, never errors. A block's key holds the file's identity, so a block is never served for a
file that changed (the file gets new keys; old blocks are only evicted).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ramgrid.tls import TLS

log = logging.getLogger(__name__)

_CHUNK = 64  # keys per pipelined request: bounds the replies a server composes for one write


class AuthRefused(Exception):
    """The server refused the grid's token: a setting to fix, not a server that is down."""


def _tls_context(tls: TLS) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=tls.ca)
    if tls.cert is not None:
        ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


class _Conn:
    """One socket to one server, used under a lock (Dask runs tasks in threads). Speaks TLS and authenticates
    with the grid's token as the grid's own clients do (docs/tls.md; memcached's text-protocol authentication:
    a `set` whose data is `<user> <token>`, answered STORED)."""

    def __init__(self, addr: str, timeout: float, token: str | None, tls: TLS | None) -> None:
        host, port = addr.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = _tls_context(tls).wrap_socket(sock, server_hostname=tls.server_name or host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.rfile = self.sock.makefile("rb", buffering=1 << 16)
        if token is not None:
            data = f"ramgrid {token}".encode()
            self.sock.sendall(b"set auth 0 0 %d\r\n%s\r\n" % (len(data), data))
            try:
                line = self.rfile.readline()
            except BaseException:
                self.close()
                raise
            if not line:  # e.g. TLS 1.3: a refused client certificate shows on the first read
                self.close()
                raise ConnectionError(f"{addr} closed the connection during authentication")
            if line.rstrip() != b"STORED":
                self.close()
                raise AuthRefused(f"{addr} refused the grid's token: {line[:80]!r}")

    def close(self) -> None:
        try:
            self.rfile.close()
            self.sock.close()
        except OSError:
            pass


class BlockStore:
    """get_many / set_many of byte blocks over a list of `host:port` servers (memcached meta protocol)."""

    def __init__(
        self,
        servers: Sequence[str],
        timeout: float = 2.0,
        down_for: float = 5.0,
        ttl: int = 0,
        token: str | None = None,
        tls: TLS | None = None,
    ) -> None:
        if not servers:
            raise ValueError("BlockStore needs at least one server")
        self.servers = list(servers)
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.down_for = down_for
        self.ttl = ttl
        self._conns: dict[str, _Conn] = {}
        self._locks: dict[str, threading.Lock] = {s: threading.Lock() for s in self.servers}
        self._down_until: dict[str, float] = {}
        self._pid = os.getpid()
        self._warned_size = False

    def __getstate__(self) -> dict[str, object]:
        return {
            "servers": self.servers,
            "timeout": self.timeout,
            "down_for": self.down_for,
            "ttl": self.ttl,
            "token": self.token,
            "tls": self.tls,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def server_for(self, key: bytes) -> str:
        """Rendezvous (highest random weight) hashing: adding or removing a server moves only its own keys."""
        return max(self.servers, key=lambda s: hashlib.blake2b(s.encode() + b"\0" + key, digest_size=8).digest())

    def _group(self, keys: Iterable[bytes]) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        for k in keys:
            out.setdefault(self.server_for(k), []).append(k)
        return out

    def _conn(self, server: str) -> _Conn | None:
        if os.getpid() != self._pid:  # a forked child never shares its parent's sockets
            self._conns.clear()
            self._locks = {s: threading.Lock() for s in self.servers}
            self._pid = os.getpid()
        if self._down_until.get(server, 0.0) > time.monotonic():
            return None
        c = self._conns.get(server)
        if c is None:
            try:
                c = _Conn(server, self.timeout, self.token, self.tls)
            except AuthRefused as e:
                # Every block would be a miss, so say it loudly (once per `down_for`), not as a server down.
                log.error("block cache disabled on %s: %s", server, e)
                self._down_until[server] = time.monotonic() + self.down_for
                return None
            except OSError as e:
                self._mark_down(server, e)
                return None
            self._conns[server] = c
        return c

    def _mark_down(self, server: str, err: BaseException) -> None:
        log.warning(
            "block cache server %s unreachable (%s); its blocks are misses for %.0f s", server, err, self.down_for
        )
        self._down_until[server] = time.monotonic() + self.down_for
        c = self._conns.pop(server, None)
        if c is not None:
            c.close()

    def _per_server(self, keys: Iterable[bytes], run: Callable[[str, _Conn, list[bytes]], None]) -> None:
        """Runs `run(server, conn, keys)` for each server's share of `keys`, under that server's lock. A server that
        cannot be reached is skipped; one that fails mid-request is marked down (its keys are misses)."""
        for server, ks in self._group(keys).items():
            with self._locks[server]:
                c = self._conn(server)
                if c is None:
                    continue
                try:
                    run(server, c, ks)
                except (OSError, ValueError) as e:
                    self._mark_down(server, e)

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """The blocks found, by key; a miss or an unreachable server leaves the key out."""
        found: dict[bytes, bytes] = {}

        def run(server: str, c: _Conn, ks: list[bytes]) -> None:
            for i in range(0, len(ks), _CHUNK):
                self._get_chunk(c, ks[i : i + _CHUNK], found)

        self._per_server(keys, run)
        return found

    @staticmethod
    def _get_chunk(c: _Conn, ks: list[bytes], found: dict[bytes, bytes]) -> None:
        c.sock.sendall(b"".join(b"mg " + k + b" v\r\n" for k in ks))
        for k in ks:
            line = c.rfile.readline()
            if line.startswith(b"VA "):
                n = int(line.split()[1])
                data = c.rfile.read(n + 2)
                if len(data) != n + 2:
                    raise ValueError("connection closed mid-value")
                found[k] = data[:n]
            elif not line.startswith(b"EN"):
                raise ValueError(f"unexpected reply to mg: {line[:80]!r}")

    def _quiet_replies(self, c: _Conn, server: str) -> None:
        """Reads the replies of quiet-mode requests up to `mn`'s MN: only failures (NS, SERVER_ERROR) come before
        it. A closed connection raises (never a loop on an empty read)."""
        while True:
            line = c.rfile.readline()
            if not line:
                raise ValueError("connection closed")
            if line.startswith(b"MN"):
                return
            if b"too large" in line and not self._warned_size:
                self._warned_size = True
                log.warning("%s refuses blocks as too large (%r): use a block size below its "
                            "--max-item-size", server, line[:80])  # fmt: skip
            log.debug("block cache request refused on %s: %r", server, line[:80])

    def set_many(self, items: dict[bytes, bytes]) -> None:
        """Stores blocks (quietly: a full or unreachable server stores nothing and is not an error)."""
        t = f" T{self.ttl}".encode() if self.ttl else b""

        def run(server: str, c: _Conn, ks: list[bytes]) -> None:
            for i in range(0, len(ks), _CHUNK):
                parts = []
                for k in ks[i : i + _CHUNK]:
                    v = items[k]
                    parts += [b"ms ", k, b" ", str(len(v)).encode(), t, b" q\r\n", v, b"\r\n"]
                parts.append(b"mn\r\n")
                c.sock.sendall(b"".join(parts))
                self._quiet_replies(c, server)

        self._per_server(items, run)

    def delete_many(self, keys: Sequence[bytes]) -> None:
        def run(server: str, c: _Conn, ks: list[bytes]) -> None:
            c.sock.sendall(b"".join(b"md " + k + b" q\r\n" for k in ks) + b"mn\r\n")
            self._quiet_replies(c, server)

        self._per_server(keys, run)

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():  # a forked child's copies belong to the parent
            self.close()


class NearCache:
    """A small per-process LRU of byte values bounded by their total size."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._d: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
            return v

    def put(self, key: bytes, value: bytes) -> None:
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._d[key] = value
            self._bytes += len(value)
            while self._bytes > self.max_bytes:
                _, v = self._d.popitem(last=False)
                self._bytes -= len(v)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes = 0
