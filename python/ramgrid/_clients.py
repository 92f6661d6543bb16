"""One native client per grid configuration per process: the registry behind every handle.

Handles (`Grid`, `Table`, ...) hold configuration only. The native client behind them is looked up here, keyed by
that configuration, so handles pickle without sockets, reconnect lazily in a new process (spawn, forkserver, Dask
workers), and share one connection pool per process. After a fork the child finds the pid changed and builds its
own client; the parent's is never touched there.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ramgrid.tls import TLS

if TYPE_CHECKING:
    from ramgrid._native import Client

__all__ = ["GridConfig", "client_for", "native", "release_client"]

_ACKS = ("all", "majority", "one")


def native() -> Any:
    """Returns the `ramgrid._native` module, or raises ImportError saying how to build it."""
    try:
        from ramgrid import _native
    except ImportError as e:
        raise ImportError(
            "ramgrid's native module (ramgrid._native) is not built or not importable: build it with "
            "`maturin develop --release` in the repository (or `pip install .`)"
        ) from e
    return _native


@dataclass(frozen=True)
class GridConfig:
    """Everything needed to (re)build a client in any process. Hashable: it keys the per-process client registry."""

    servers: tuple[str, ...]
    token: str | None = field(default=None, repr=False)
    timeout: float = 5.0
    connect_timeout: float = 1.0
    ack: str = "all"
    near_cache_bytes: int = 0
    pool_size: int = 4
    call_timeout: float = 30.0
    tls: TLS | None = None
    consistency: str = "linearizable"

    def __post_init__(self) -> None:
        if self.tls is not None and not isinstance(self.tls, TLS):
            raise TypeError(f"tls must be a ramgrid.TLS or None, not {type(self.tls).__name__}")
        if self.ack not in _ACKS:
            raise ValueError(f"ack must be one of {', '.join(_ACKS)}, got {self.ack!r}")
        if self.consistency not in ("linearizable", "replica"):
            raise ValueError(f'consistency must be "linearizable" or "replica", got {self.consistency!r}')
        if not self.timeout > 0 or not self.connect_timeout > 0 or not self.call_timeout > 0:
            raise ValueError("timeouts must be positive (seconds)")
        if self.near_cache_bytes < 0 or self.pool_size < 1:
            raise ValueError("near_cache_bytes must be >= 0 and pool_size >= 1")

    def make_client(self) -> Client:
        return cast(
            "Client",
            native().Client(
                list(self.servers),
                token=self.token,
                timeout_ms=max(1, int(self.timeout * 1000)),
                connect_timeout_ms=max(1, int(self.connect_timeout * 1000)),
                ack=self.ack,
                consistency=self.consistency,
                near_cache_bytes=int(self.near_cache_bytes),
                pool_size=int(self.pool_size),
                call_timeout_ms=max(1, int(self.call_timeout * 1000)),
                **_tls_kwargs(self.tls),
            ),
        )


def _tls_kwargs(tls: TLS | None) -> dict[str, str | None]:
    if tls is None:
        return {}
    return {"tls_ca": tls.ca, "tls_cert": tls.cert, "tls_key": tls.key, "tls_server_name": tls.server_name}


class _Registry:
    """One native client per configuration per process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.clients: dict[GridConfig, Any] = {}


_registry = _Registry()
# Clients inherited through fork. They are deliberately kept alive forever: their sockets and background threads
# belong to the parent, and tearing one down in the child (joining threads that do not exist there, or sending a
# goodbye on the parent's connections) could hang or disturb the parent.
_inherited: list[Any] = []


def _forget_inherited_clients() -> None:
    global _registry
    old = _registry
    if old.clients:
        _inherited.extend(old.clients.values())
        # Interpreter shutdown clears module globals; an extra reference keeps these from ever being dropped.
        for c in old.clients.values():
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(c))
    _registry = _Registry()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_clients)


def client_for(config: GridConfig) -> Client:
    """The native client for `config` in this process, created on first use."""
    reg = _registry
    if reg.pid != os.getpid():  # forked by something that bypassed os.register_at_fork hooks
        _forget_inherited_clients()
        reg = _registry
    c = reg.clients.get(config)
    if c is None:
        with reg.lock:
            c = reg.clients.get(config)
            if c is None:
                c = config.make_client()
                reg.clients[config] = c
    return c


def _existing_client(config: GridConfig) -> Client | None:
    """This process's client for `config` if one was made, else None (creates nothing)."""
    reg = _registry
    if reg.pid != os.getpid():
        return None
    return reg.clients.get(config)


def release_client(config: GridConfig) -> None:
    """Closes this process's client for `config`; handles using it reconnect on their next call."""
    reg = _registry
    if reg.pid != os.getpid():
        return
    with reg.lock:
        c = reg.clients.pop(config, None)
    if c is not None:
        c.close()
