"""Which servers of a cluster run on this host.

A task that wants its data close (a Dask worker beside a server, a reader that maps shared memory) needs to know
which members of the spec are on the machine it runs on. The rule: a server is local when its host part is an
address this machine owns, tested by binding a socket to it (port 0, nothing is sent or left open). So it holds
on any host without configuration: one server per host gives each worker exactly its own server; several servers
on one host (a local cluster, all on loopback) are all local. A host name is resolved first; a name that does not
resolve, or resolves to another machine, is not local.

`RAMGRID_LOCAL_SERVERS` (comma-separated host:port) overrides the rule, for hosts whose server listens on an
address the host does not own (behind NAT, or in a container with published ports).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from functools import lru_cache

from ramgrid.config import parse_address

ENV_LOCAL_SERVERS = "RAMGRID_LOCAL_SERVERS"

__all__ = ["ENV_LOCAL_SERVERS", "is_local_host", "local_servers"]


def _host_part(addr: str) -> str:
    host = parse_address(addr).rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


@lru_cache(maxsize=256)
def is_local_host(host: str) -> bool:
    """Whether `host` (an IP address or a name) is an address of this machine."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0])
        if ip.is_unspecified:
            continue
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
        except OSError:
            continue
        return True
    return False


def local_servers(servers: Iterable[str]) -> list[str]:
    """The members of `servers` that run on this host, in the given order (see the module's rule)."""
    servers = list(servers)
    override = os.environ.get(ENV_LOCAL_SERVERS, "").strip()
    if override:
        wanted = {parse_address(a) for a in override.split(",") if a.strip()}
        return [s for s in servers if s in wanted]
    return [s for s in servers if is_local_host(_host_part(s))]
