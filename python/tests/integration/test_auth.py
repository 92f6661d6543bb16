"""Authentication with a token, on both protocols.

A server started with a token answers nothing on the memcached protocols until the client has passed
memcached's own text-protocol authentication (memcached 1.6's `-Y`: a first `set` whose data is
`<user> <password>`). Each transcript is sent to ramgrid and to a real memcached started with an auth
file, and the replies must be the same bytes. A connection that has not authenticated within
`--auth-timeout-secs` is closed, so idle unauthenticated connections cannot keep `--max-conns`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TOKEN = "s3cret-token"


def _exchange(port: int, data: bytes, wait: float = 0.3) -> bytes:
    """Sends `data` on a fresh connection and returns everything that comes back within `wait` s."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(1 << 16):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return out


@pytest.fixture(scope="module")
def ramgrid_auth(start_server: Callable[..., Any]) -> Any:
    return start_server("ramgrid", max_conns=4, extra=("--token", TOKEN, "--auth-timeout-secs", "1"))


@pytest.fixture(scope="module")
def memcached_auth(start_server: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> int:
    auth = tmp_path_factory.mktemp("mc") / "authfile"
    auth.write_text(f"someone:{TOKEN}\n")
    return start_server("memcached", threads=1, extra=("-Y", str(auth))).port


AUTH = f"set anything 0 0 {len('someone ' + TOKEN)}\r\nsomeone {TOKEN}\r\n".encode()

TRANSCRIPTS = {
    "get before auth": b"get foo\r\n",
    "set before auth": b"set foo 0 0 2\r\nhi\r\n",
    "flush_all before auth": b"flush_all\r\n",
    "stats before auth": b"stats\r\n",
    "meta before auth": b"mg foo v\r\n",
    "unknown command before auth": b"bogus\r\n",
    "pipelined after a refusal are dropped": b"version\r\nget foo\r\nversion\r\n",
    "wrong password": b"set anything 0 0 13\r\nsomeone wrong\r\n",
    "wrong password, more pipelined": b"set anything 0 0 13\r\nsomeone wrong\r\nget foo\r\n",
    "one word": f"set anything 0 0 {len(TOKEN)}\r\n{TOKEN}\r\n".encode(),
    "extra words": f"set anything 0 0 {len(TOKEN) + 11}\r\n someone {TOKEN} x\r\n".encode(),
    "add is not auth": AUTH.replace(b"set", b"add", 1),
    "auth then work": AUTH + b"set foo 0 0 2\r\nhi\r\nget foo\r\ndelete foo\r\n",
    "auth with noreply still answers": AUTH.replace(b"\r\n", b" noreply\r\n", 1) + b"get foo\r\n",
    "auth with two spaces": f"set x 0 0 {len(TOKEN) + 9}\r\nsomeone  {TOKEN}\r\n".encode(),
}


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
def test_memcached_auth_matches_memcached(name: str, ramgrid_auth: Any, memcached_auth: int) -> None:
    data = TRANSCRIPTS[name]
    want = _exchange(memcached_auth, data)
    got = _exchange(ramgrid_auth.port, data)
    assert got == want, f"{name}: ramgrid {got!r} != memcached {want!r}"
    assert want, "memcached answered nothing: the transcript proves nothing"


def test_refused_client_may_try_again(ramgrid_auth: Any) -> None:
    with socket.create_connection(("127.0.0.1", ramgrid_auth.port), timeout=2) as s:
        s.sendall(b"get foo\r\n")
        assert s.recv(100) == b"CLIENT_ERROR unauthenticated\r\n"
        s.sendall(AUTH + b"version\r\n")
        got = b""
        while got.count(b"\r\n") < 2 and (chunk := s.recv(100)):  # the two replies may come in two reads
            got += chunk
        assert got.startswith(b"STORED\r\nVERSION ")


def test_unauthenticated_connections_are_closed_at_the_deadline(start_server: Callable[..., Any]) -> None:
    # A server of its own, so no other test's connections (closed, but perhaps not yet counted out
    # by the server) hold a slot.
    ramgrid_auth = start_server("ramgrid", max_conns=4, extra=("--token", TOKEN, "--auth-timeout-secs", "1"))
    # Take every connection slot (--max-conns 4) without authenticating.
    idle = [socket.create_connection(("127.0.0.1", ramgrid_auth.port), timeout=3) for _ in range(4)]
    try:
        assert _exchange(ramgrid_auth.port, AUTH, wait=0.3).startswith(b"SERVER_ERROR too many open connections")
        started = time.monotonic()
        for s in idle:
            assert s.recv(100) == b"", "the server closes an unauthenticated connection at its deadline"
        assert time.monotonic() - started < 3.0
        time.sleep(0.1)
        assert _exchange(ramgrid_auth.port, AUTH + b"version\r\n").startswith(b"STORED\r\nVERSION ")
    finally:
        for s in idle:
            s.close()


def test_authenticated_connections_outlive_the_deadline(ramgrid_auth: Any) -> None:
    with socket.create_connection(("127.0.0.1", ramgrid_auth.port), timeout=2) as s:
        s.sendall(AUTH)
        assert s.recv(100) == b"STORED\r\n"
        time.sleep(1.5)
        s.sendall(b"version\r\n")
        assert s.recv(100).startswith(b"VERSION ")


def test_native_needs_hello_within_the_deadline(ramgrid_auth: Any) -> None:
    import ramgrid
    from ramgrid.exceptions import AuthError

    with socket.create_connection(("127.0.0.1", ramgrid_auth.port), timeout=3) as s:
        s.sendall(b"\xa7")  # the native magic, then nothing
        assert s.recv(100) == b""
    with pytest.raises(AuthError):
        ramgrid.connect([ramgrid_auth.addr], token="wrong").tables()
    assert isinstance(ramgrid.connect([ramgrid_auth.addr], token=TOKEN).tables(), list)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_empty_token_is_refused_at_start(how: str, ramgrid_server_bin: Path) -> None:
    args = [str(ramgrid_server_bin), "--listen", "0.0.0.0:0"]
    env = dict(os.environ)
    if how == "flag":
        args += ["--token", ""]
    else:
        env["RAMGRID_TOKEN"] = ""
    r = subprocess.run(args, check=False, env=env, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "token" in err, err
