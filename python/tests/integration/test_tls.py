"""TLS on the port (docs/tls.md), against real server processes: the native client, the memcached text and meta
protocols (pymemcache, raw `ssl` sockets), a plain client on a TLS port and a TLS client on a plain port (each fails
at once and the server keeps serving), client certificates required and refused, the token still required over
TLS, a three-server TLS cluster (its peers' repair and metadata traffic over TLS too), and the CLI's TLS flags.

The CA and certificates are made per module by scripts/tls-test-certs.sh (the openssl CLI).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ramgrid
from ramgrid.exceptions import AuthError, ConnectionFailed, ProtocolError, RamgridError

REPO_ROOT = Path(__file__).resolve().parents[3]
TOKEN = "tls-test-token"
pytestmark = pytest.mark.timeout(120)
# Long request limits: a refusal must come from the server's answer, never from a timeout.
SLOW: dict[str, Any] = {"timeout": 30.0, "call_timeout": 60.0}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "tls-test-certs.sh"), str(d)], check=True, timeout=60)
    return d


def _tls_flags(certs: Path, client_ca: bool = False) -> tuple[str, ...]:
    flags = ("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"))
    if client_ca:
        flags += ("--tls-client-ca", str(certs / "ca.pem"))
    return flags


@pytest.fixture(scope="module")
def tls_server(start_server: Callable[..., Any], certs: Path) -> Any:
    return start_server("ramgrid", extra=_tls_flags(certs))


@pytest.fixture(scope="module")
def mtls_server(start_server: Callable[..., Any], certs: Path) -> Any:
    """Client certificates required, and a token (the token is still checked over TLS)."""
    return start_server("ramgrid", extra=(*_tls_flags(certs, client_ca=True), "--token", TOKEN))


def _context(certs: Path, client: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if client is not None:
        ctx.load_cert_chain(str(certs / f"{client}.pem"), str(certs / f"{client}.key"))
    return ctx


@contextlib.contextmanager
def _tls_socket(port: int, ctx: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    """A TLS connection to the server on `port` (handshake done), closed at the end."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        yield s


def _round_trip(grid: ramgrid.Grid, name: str, replication: int = 1) -> None:
    t = grid.create_table(name, partitions=8, replication=replication, value_type="f64")
    keys = np.arange(100, dtype=np.int64)
    t.put_many(keys, keys * 0.5)
    assert np.array_equal(t.get_many(keys), keys * 0.5)


def test_native_client_over_tls(tls_server: Any, certs: Path, table_name: str) -> None:
    with ramgrid.connect([tls_server.addr], tls=ramgrid.TLS(ca=certs / "ca.pem")) as g:
        _round_trip(g, table_name)
        assert g.stats()[0]["curr_connections"] >= 1  # `stats` over the memcached text protocol, on TLS


def test_pipelined_and_async_reads_over_tls(tls_server: Any, certs: Path, table_name: str) -> None:
    # Pipelined frames go through the TLS record layer too (conn.rs send_more): never as plain bytes.
    import asyncio

    with ramgrid.connect([tls_server.addr], tls=ramgrid.TLS(ca=certs / "ca.pem")) as g:
        t = g.create_table(table_name, partitions=8, value_type="f64")
        keys = np.arange(20_000, dtype=np.int64)
        t.put_many(keys, keys * 0.5)
        batches = np.array_split(keys, 200)
        got = list(t.get_many_batches(batches, depth=16))
        assert all(np.array_equal(v, b * 0.5) for v, b in zip(got, batches))

        async def many() -> list[Any]:
            return await asyncio.gather(*(t.get_many_async(b) for b in batches))

        assert all(np.array_equal(v, b * 0.5) for v, b in zip(asyncio.run(many()), batches))


def test_memcached_protocols_over_tls(tls_server: Any, certs: Path) -> None:
    from pymemcache.client.base import Client as Memcache

    mc = Memcache(("127.0.0.1", tls_server.port), tls_context=_context(certs), timeout=5, connect_timeout=5)
    assert mc.set("tls-key", b"over tls")
    assert mc.get("tls-key") == b"over tls"
    mc.close()
    # The meta protocol, on a raw TLS socket.
    with _tls_socket(tls_server.port, _context(certs)) as s:
        s.sendall(b"mg tls-key v\r\n")
        got = b""
        while got.count(b"\r\n") < 2:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        assert got == b"VA 8\r\nover tls\r\n"


def test_plain_client_on_a_tls_port_fails_and_others_are_served(tls_server: Any, certs: Path, table_name: str) -> None:
    for request in (b"get foo\r\n", b"\xa7" + bytes(23)):  # memcached text, and a native frame's start
        with socket.create_connection(("127.0.0.1", tls_server.port), timeout=5) as s:
            s.sendall(request)
            got = b""
            while chunk := s.recv(4096):  # ends when the server closes (a timeout here would raise)
                got += chunk
            assert not got.startswith((b"VALUE", b"END", b"ERROR", b"\xa7")), got
            assert got[:1] in (b"", b"\x15"), got  # nothing, or a TLS alert record
    with pytest.raises(ProtocolError, match="TLS alert"), ramgrid.connect([tls_server.addr], **SLOW) as g:
        g.tables()
    with ramgrid.connect([tls_server.addr], tls=ramgrid.TLS(ca=certs / "ca.pem")) as g:
        _round_trip(g, table_name)


def test_tls_client_on_a_plain_port_fails_at_once(ramgrid_server: str, certs: Path) -> None:
    port = ramgrid_server.rsplit(":", 1)[1]
    with pytest.raises((ssl.SSLError, ConnectionError)), _tls_socket(int(port), _context(certs)):
        pass
    tls = ramgrid.TLS(ca=certs / "ca.pem")
    with (
        pytest.raises(ConnectionFailed, match="TLS handshake"),
        ramgrid.connect([ramgrid_server], tls=tls, **SLOW) as g,
    ):
        g.tables()


def test_client_certificates_required_and_checked(mtls_server: Any, certs: Path, table_name: str) -> None:
    ca = certs / "ca.pem"
    for tls in (
        ramgrid.TLS(ca=ca),  # none
        ramgrid.TLS(ca=ca, cert=certs / "other-client.pem", key=certs / "other-client.key"),  # another CA's
    ):
        with pytest.raises(ConnectionFailed), ramgrid.connect([mtls_server.addr], token=TOKEN, tls=tls, **SLOW) as g:
            g.tables()
    # The same refusal for a memcached-protocol client with another CA's certificate.
    with (
        pytest.raises((ssl.SSLError, ConnectionError)),
        _tls_socket(mtls_server.port, _context(certs, "other-client")) as s,
    ):
        s.sendall(b"version\r\n")  # TLS 1.3: the refusal of the certificate arrives after the handshake
        assert s.recv(100) == b""
    good = ramgrid.TLS(ca=ca, cert=certs / "client.pem", key=certs / "client.key")
    with ramgrid.connect([mtls_server.addr], token=TOKEN, tls=good) as g:
        _round_trip(g, table_name)


def test_file_system_block_cache_over_tls(mtls_server: Any, certs: Path) -> None:
    """ramgrid.fs's block store speaks the meta protocol itself: over TLS, with a client certificate and the token,
    as the grid's handle does."""
    from ramgrid.fs._blocks import BlockStore

    good = ramgrid.TLS(ca=certs / "ca.pem", cert=certs / "client.pem", key=certs / "client.key")
    store = BlockStore([mtls_server.addr], token=TOKEN, tls=good)
    items = {f"tls-block-{i}".encode(): os.urandom(70_000 + i) for i in range(20)}
    store.set_many(items)
    assert store.get_many(list(items)) == items
    store.close()
    # Without the client certificate the server refuses: misses, never an error or wrong bytes.
    plain = BlockStore([mtls_server.addr], token=TOKEN, tls=ramgrid.TLS(ca=certs / "ca.pem"))
    assert plain.get_many(list(items)) == {}
    plain.close()


def test_the_token_is_still_required_over_tls(mtls_server: Any, certs: Path) -> None:
    good = ramgrid.TLS(ca=certs / "ca.pem", cert=certs / "client.pem", key=certs / "client.key")
    for token in (None, "wrong"):
        with pytest.raises(AuthError), ramgrid.connect([mtls_server.addr], token=token, tls=good, **SLOW) as g:
            g.tables()
    with _tls_socket(mtls_server.port, _context(certs, "client")) as s:
        s.sendall(b"get foo\r\n")
        assert s.recv(100) == b"CLIENT_ERROR unauthenticated\r\n"


def test_three_server_tls_cluster(certs: Path) -> None:
    """Peers verify each other against --tls-ca and show their own certificate (--tls-client-ca is set), so the
    metadata group forms and replicas are written only if server-to-server TLS works."""
    flags = [*_tls_flags(certs, client_ca=True), "--tls-ca", str(certs / "ca.pem")]
    tls = ramgrid.TLS(ca=certs / "ca.pem", cert=certs / "client.pem", key=certs / "client.key")
    with ramgrid.local(servers=3, memory="64MiB", token=TOKEN, extra_args=flags, tls=tls) as g:
        _round_trip(g, "replicated", replication=2)
        status = g.status()
        assert len(status) == 3 and all(s.get("ok", True) for s in status), status
        g.restart(1)  # it learns the spec and copies its partitions from its peers, over TLS
        t = g.table("replicated")
        keys = np.arange(100, dtype=np.int64)
        assert np.array_equal(t.get_many(keys), keys * 0.5)
        assert len(g.status()) == 3


def test_tls_settings_are_checked(certs: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        ramgrid.TLS(ca="ca.pem", cert="client.pem")
    with pytest.raises(TypeError, match="ramgrid.TLS"):
        ramgrid.connect(["127.0.0.1:1"], tls="ca.pem")  # type: ignore[arg-type]
    for ca, why in ((certs / "missing.pem", "missing.pem"), (certs / "server.key", "no PEM certificate")):
        with pytest.raises(ValueError, match=why):
            ramgrid.connect(["127.0.0.1:1"], tls=ramgrid.TLS(ca=ca)).tables()
    with pytest.raises(ValueError, match="client.pem"):  # a key that is not the certificate's
        ramgrid.connect(
            ["127.0.0.1:1"], tls=ramgrid.TLS(ca=certs / "ca.pem", cert=certs / "client.pem", key=certs / "server.key")
        ).tables()


def test_cli_over_tls(tls_server: Any, certs: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["PYTHONPATH"] = str(REPO_ROOT / "python")

    def rg(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ramgrid.cli", "--spec", tls_server.addr, *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    ok = rg("--tls-ca", str(certs / "ca.pem"), "table", "list")
    assert ok.returncode == 0, ok.stderr
    env["RAMGRID_TLS_CA"] = str(certs / "ca.pem")
    assert rg("table", "list").returncode == 0
    del env["RAMGRID_TLS_CA"]
    bad = rg("--tls-cert", str(certs / "client.pem"), "table", "list")
    assert bad.returncode == 2 and "--tls-ca" in bad.stderr, bad.stderr


def test_peers_that_cannot_verify_each_other_form_no_cluster(certs: Path) -> None:
    """The check that the test above can fail: peers trusting another CA refuse each other's certificates, so the
    metadata group never forms (the servers themselves start and serve clients)."""
    flags = [*_tls_flags(certs), "--tls-ca", str(certs / "other-ca.pem")]
    with pytest.raises(RamgridError, match="did not form"):
        ramgrid.local(
            servers=3, memory="64MiB", extra_args=flags, tls=ramgrid.TLS(ca=certs / "ca.pem"), start_timeout=5
        )
