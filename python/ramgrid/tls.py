"""TLS settings of a client (docs/tls.md): the CA that signed the servers' certificates, and a client certificate
for servers that require one (`--tls-client-ca`). Passed as `ramgrid.connect(..., tls=ramgrid.TLS(ca=...))`."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TLS"]


@dataclass(frozen=True)
class TLS:
    """Connect over TLS, verifying the servers against `ca` (a PEM file). `cert` and `key` (PEM files, given
    together) are the client certificate and its key; `server_name` is the name the servers' certificates must
    carry, by default each server's host as its address gives it (an IP address for an IP). The files are read
    when the client is made, in each process that uses the grid; paths, not contents, travel with a pickled
    handle."""

    ca: str
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("ca", "cert", "key"):
            value = getattr(self, name)
            if value is not None:
                # Absolute, so that a handle unpickled in a process with another working directory finds them.
                object.__setattr__(self, name, os.path.abspath(os.fspath(value)))
        if not self.ca:
            raise ValueError("TLS needs the CA certificate file (ca=...) that signed the servers' certificates")
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLS: a client certificate (cert=...) and its key (key=...) go together")
