"""An unmodified memcached client (pymemcache) and raw sockets against ramgrid-server over real TCP.

Every command goes through pymemcache where it has an API; meta commands and bad input go through
raw sockets. Set RAMGRID_TEST_TARGET=memcached (or both) to run the same tests against a real
memcached and prove the expectations; assertions on behaviour where ramgrid differs on purpose
are marked in the test.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheServerError

if TYPE_CHECKING:
    from conftest import RawConn, ServerProcess

pytestmark = pytest.mark.timeout(60)

KeyFn = Callable[[str], str]
Connect = Callable[..., "RawConn"]


def make_client(server: ServerProcess, **kw: object) -> Client:
    opts: dict[str, object] = {"connect_timeout": 2, "timeout": 2, "default_noreply": False}
    opts.update(kw)
    return Client((server.host, server.port), **opts)


@pytest.fixture
def client(mc_server: ServerProcess) -> Iterator[Client]:
    c = make_client(mc_server)
    yield c
    c.close()


# --- storage and retrieval through pymemcache ----------------------------------------------------


def test_set_then_get(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("a")
    assert client.set(k, b"hello") is True
    assert client.get(k) == b"hello"


def test_get_of_missing_key_returns_default(client: Client, unique_key: KeyFn) -> None:
    assert client.get(unique_key("missing")) is None
    assert client.get(unique_key("missing"), default=b"dflt") == b"dflt"


@pytest.mark.parametrize("size", [0, 1, 1000, 100_000, 1_000_000])
def test_values_of_many_sizes_round_trip(client: Client, unique_key: KeyFn, size: int) -> None:
    k = unique_key(str(size))
    value = bytes(random.Random(size).getrandbits(8) for _ in range(min(size, 4096))) * (size // 4096 + 1)
    value = value[:size]
    assert client.set(k, value) is True
    assert client.get(k) == value


def test_binary_value_with_protocol_bytes(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("bin")
    value = b"\r\nEND\r\n\x00\xff" + bytes(range(256)) + b"VALUE x 0 1\r\n"
    client.set(k, value)
    assert client.get(k) == value


def test_flags_are_stored(client: Client, unique_key: KeyFn, mc_server: ServerProcess, raw_connect: Connect) -> None:
    k = unique_key("flags")
    assert client.set(k, b"v", flags=4_294_967_295) is True
    assert raw_connect(mc_server).call(f"get {k}\r\n".encode(), b"END\r\n") == (
        f"VALUE {k} 4294967295 1\r\nv\r\nEND\r\n".encode()
    )


def test_key_of_250_bytes(client: Client) -> None:
    k = "k" * 250
    assert client.set(k, b"long") is True
    assert client.get(k) == b"long"


def test_get_many_returns_only_present_keys(client: Client, unique_key: KeyFn) -> None:
    a, b, missing = unique_key("a"), unique_key("b"), unique_key("missing")
    client.set(a, b"1")
    client.set(b, b"2")
    assert client.get_many([a, missing, b]) == {a: b"1", b: b"2"}
    assert client.get_many([]) == {}


def test_set_many_and_delete_many(client: Client, unique_key: KeyFn) -> None:
    values = {unique_key(str(i)): str(i).encode() for i in range(50)}
    assert client.set_many(values) == []
    assert client.get_many(list(values)) == values
    assert client.delete_many(list(values)) is True
    assert client.get_many(list(values)) == {}


def test_gets_and_cas(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("cas")
    client.set(k, b"v1")
    value, token = client.gets(k)
    assert value == b"v1" and int(token) > 0
    assert client.cas(k, b"v2", token) is True
    assert client.get(k) == b"v2"
    # The unique changed with the write: the old token no longer works.
    assert client.cas(k, b"v3", token) is False
    assert client.get(k) == b"v2"


def test_gets_many(client: Client, unique_key: KeyFn) -> None:
    a, b = unique_key("a"), unique_key("b")
    client.set(a, b"1")
    client.set(b, b"2")
    got = client.gets_many([a, b, unique_key("missing")])
    assert set(got) == {a, b}
    assert got[a][0] == b"1" and got[b][0] == b"2"
    assert got[a][1] != got[b][1]


def test_cas_on_missing_key_is_not_found(client: Client, unique_key: KeyFn) -> None:
    assert client.cas(unique_key("missing"), b"v", b"12345") is None


def test_add_and_replace(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("ar")
    assert client.replace(k, b"r") is False
    assert client.add(k, b"a") is True
    assert client.add(k, b"b") is False
    assert client.get(k) == b"a"
    assert client.replace(k, b"r") is True
    assert client.get(k) == b"r"


def test_append_and_prepend(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("ap")
    assert client.append(k, b"x") is False
    assert client.prepend(k, b"x") is False
    client.set(k, b"mid", flags=7)
    assert client.append(k, b"-end") is True
    assert client.prepend(k, b"start-") is True
    assert client.get(k) == b"start-mid-end"


def test_delete(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("d")
    assert client.delete(k) is False
    client.set(k, b"v")
    assert client.delete(k) is True
    assert client.get(k) is None


def test_incr_and_decr(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("n")
    assert client.incr(k, 1) is None
    assert client.decr(k, 1) is None
    client.set(k, b"10")
    assert client.incr(k, 5) == 15
    assert client.decr(k, 3) == 12
    assert client.decr(k, 100) == 0  # decr stops at zero
    client.set(k, b"18446744073709551615")
    assert client.incr(k, 1) == 0  # incr wraps at 2^64


def test_incr_of_non_numeric_value_is_a_client_error(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("text")
    client.set(k, b"abc")
    with pytest.raises(MemcacheClientError):
        client.incr(k, 1)
    assert client.get(k) == b"abc"


def test_touch_and_expiry(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("t")
    assert client.touch(k, 100) is False
    client.set(k, b"v")
    assert client.touch(k, 100) is True
    assert client.get(k) == b"v"
    # A negative exptime expires the item now (no sleeping needed).
    assert client.touch(k, -1) is True
    assert client.get(k) is None


def test_set_with_past_expiry_is_a_miss(client: Client, unique_key: KeyFn) -> None:
    k = unique_key("past")
    assert client.set(k, b"v", expire=-1) is True
    assert client.get(k) is None


def test_gat_and_gats(client: Client, unique_key: KeyFn) -> None:
    # pymemcache has no gat/gats helpers; raw_command sends them on the same connection.
    k = unique_key("gat")
    client.set(k, b"v", flags=3)
    # raw_command returns the reply without its end token.
    reply = client.raw_command(f"gat 100 {k}", b"END\r\n")
    assert reply == f"VALUE {k} 3 1\r\nv\r\n".encode()
    reply = client.raw_command(f"gats 100 {k} {unique_key('missing')}", b"END\r\n")
    assert reply.startswith(f"VALUE {k} 3 1 ".encode()) and reply.endswith(b"\r\nv\r\n")
    assert client.raw_command(f"gat -1 {k}", b"END\r\n").startswith(b"VALUE")
    assert client.get(k) is None


def test_flush_all(client: Client, unique_key: KeyFn) -> None:
    # Other tests on the shared server never rely on keys written by an earlier test.
    k = unique_key("f")
    client.set(k, b"v")
    assert client.flush_all() is True
    assert client.get(k) is None
    assert client.set(k, b"after") is True
    assert client.get(k) == b"after"


def test_stats_has_standard_fields(client: Client, unique_key: KeyFn) -> None:
    client.get(unique_key("miss"))
    stats = client.stats()
    for field in (b"pid", b"uptime", b"curr_connections", b"cmd_get", b"get_hits", b"get_misses"):
        assert field in stats, field
    assert stats[b"get_misses"] >= 1
    assert stats[b"curr_connections"] >= 1


def test_version(client: Client) -> None:
    version = client.version()
    assert version and b" " not in version


def test_verbosity(client: Client) -> None:
    assert client.raw_command("verbosity 1") == b"OK"


def test_noreply_variants(mc_server: ServerProcess, unique_key: KeyFn) -> None:
    quiet = make_client(mc_server, default_noreply=True)
    loud = make_client(mc_server)
    try:
        k, n, gone = unique_key("k"), unique_key("n"), unique_key("gone")
        assert quiet.set(k, b"1") is True
        assert quiet.add(k, b"ignored") is True  # noreply cannot report NOT_STORED
        assert quiet.replace(k, b"2") is True
        assert quiet.append(k, b"3") is True
        assert quiet.prepend(k, b"0") is True
        assert quiet.set(n, b"5") is True
        assert quiet.incr(n, 10, noreply=True) is None
        assert quiet.decr(n, 1, noreply=True) is None
        assert quiet.set(gone, b"x") is True
        assert quiet.delete(gone) is True
        assert quiet.touch(k, 1000) is True
        # The same connection stays in step: a command with a reply gets its own reply.
        assert quiet.get(k) == b"023"
        assert loud.get_many([k, n, gone]) == {k: b"023", n: b"14"}
    finally:
        quiet.close()
        loud.close()


def test_quit_then_reconnect(mc_server: ServerProcess, unique_key: KeyFn) -> None:
    c = make_client(mc_server)
    try:
        k = unique_key("q")
        c.set(k, b"v")
        c.quit()
        assert c.get(k) == b"v"  # pymemcache reconnects after quit
    finally:
        c.close()


def test_many_clients_in_parallel(mc_server: ServerProcess, unique_key: KeyFn) -> None:
    prefix = unique_key("par")
    errors: list[BaseException] = []

    def work(i: int) -> None:
        c = make_client(mc_server)
        try:
            for j in range(100):
                k = f"{prefix}_{i}_{j}"
                c.set(k, f"{i}:{j}".encode())
                assert c.get(k) == f"{i}:{j}".encode()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


# --- meta commands through raw sockets -----------------------------------------------------------


def test_meta_set_get_delete(mc_server: ServerProcess, raw_connect: Connect, unique_key: KeyFn) -> None:
    c = raw_connect(mc_server)
    k = unique_key("m").encode()
    assert c.call(b"ms " + k + b" 5 F9 T0 c\r\nhello\r\n").startswith(b"HD c")
    assert c.call(b"mg " + k + b" v f s t k Oab\r\n", b"hello\r\n") == b"VA 5 f9 s5 t-1 k" + k + b" Oab\r\nhello\r\n"
    assert c.call(b"md " + k + b"\r\n") == b"HD\r\n"
    assert c.call(b"mg " + k + b" v\r\n") == b"EN\r\n"
    assert c.call(b"mn\r\n") == b"MN\r\n"


def test_meta_arithmetic(mc_server: ServerProcess, raw_connect: Connect, unique_key: KeyFn) -> None:
    c = raw_connect(mc_server)
    k = unique_key("ma").encode()
    assert c.call(b"ma " + k + b"\r\n") == b"NF\r\n"
    assert c.call(b"ma " + k + b" N0 J10 v\r\n", b"10\r\n") == b"VA 2\r\n10\r\n"
    assert c.call(b"ma " + k + b" D5 v\r\n", b"\r\n15\r\n") == b"VA 2\r\n15\r\n"
    assert c.call(b"ma " + k + b" MD D100 v\r\n", b"\r\n0\r\n") == b"VA 1\r\n0\r\n"


def test_meta_cas_and_modes(mc_server: ServerProcess, raw_connect: Connect, unique_key: KeyFn) -> None:
    c = raw_connect(mc_server)
    k = unique_key("mc").encode()
    reply = c.call(b"ms " + k + b" 1 c\r\na\r\n")
    cas = reply.split()[1][1:]
    assert c.call(b"ms " + k + b" 1 C1\r\nb\r\n") == b"EX\r\n"
    assert c.call(b"ms " + k + b" 1 C" + cas + b"\r\nb\r\n") == b"HD\r\n"
    assert c.call(b"ms " + k + b" 1 ME\r\nc\r\n") == b"NS\r\n"
    assert c.call(b"ms " + k + b" 1 MA\r\nc\r\n") == b"HD\r\n"
    assert c.call(b"mg " + k + b" v\r\n", b"bc\r\n") == b"VA 2\r\nbc\r\n"


def test_quiet_meta_pipeline(mc_server: ServerProcess, raw_connect: Connect, unique_key: KeyFn) -> None:
    c = raw_connect(mc_server)
    keys = [unique_key(str(i)).encode() for i in range(200)]
    c.send(b"".join(b"ms " + k + b" 1 q\r\n1\r\n" for k in keys[::2]) + b"mn\r\n")
    assert c.read_until(b"MN\r\n") == b"MN\r\n"
    c.send(b"".join(b"mg " + k + b" q v k\r\n" for k in keys) + b"mn\r\n")
    reply = c.read_until(b"MN\r\n")
    assert reply.count(b"VA 1 k") == 100 and reply.endswith(b"MN\r\n")


# --- bad input -----------------------------------------------------------------------------------


def test_key_over_250_bytes_is_a_client_error(mc_server: ServerProcess, raw_connect: Connect) -> None:
    c = raw_connect(mc_server)
    long_key = b"k" * 251
    assert c.call(b"get " + long_key + b"\r\n") == b"CLIENT_ERROR bad command line format\r\n"
    assert c.call(b"mg " + long_key + b" v\r\n") == b"CLIENT_ERROR bad command line format\r\n"
    # The connection is still usable.
    assert c.call(b"mn\r\n") == b"MN\r\n"


def test_value_over_max_item_size_is_refused(
    server_factory: Callable[..., ServerProcess], raw_connect: Connect, target: str
) -> None:
    server = server_factory(memory="16MiB", max_item_size="512KiB")
    c = raw_connect(server)
    assert c.call(b"set old 0 0 3\r\nold\r\n") == b"STORED\r\n"
    assert c.call(b"set ok 0 0 100000\r\n" + b"x" * 100_000 + b"\r\n") == b"STORED\r\n"
    big = b"y" * 600_000
    assert c.call(b"set big 0 0 600000\r\n" + big + b"\r\n") == b"SERVER_ERROR object too large for cache\r\n"
    assert c.call(b"set old 0 0 600000\r\n" + big + b"\r\n") == b"SERVER_ERROR object too large for cache\r\n"
    assert c.call(b"get big\r\n") == b"END\r\n"
    if target == "ramgrid":
        # ramgrid keeps the old value; memcached drops it on a failed set.
        assert c.call(b"get old\r\n", b"END\r\n") == b"VALUE old 0 3\r\nold\r\nEND\r\n"
    pm = make_client(server)
    try:
        with pytest.raises(MemcacheServerError, match="object too large"):
            pm.set("big2", big)
        assert pm.get("ok") == b"x" * 100_000
    finally:
        pm.close()


def test_memory_full_without_eviction(
    server_factory: Callable[..., ServerProcess], raw_connect: Connect, target: str
) -> None:
    server = server_factory(memory="2MiB", no_evict=True)
    c = raw_connect(server)
    assert c.call(b"set first 0 0 5\r\nhello\r\n") == b"STORED\r\n"
    value = b"v" * 100_000
    refused = None
    for i in range(100):  # 10 MB offered to a 2 MiB server: it must run out well before
        reply = c.call(b"set fill%d 0 0 100000\r\n" % i + value + b"\r\n")
        if reply != b"STORED\r\n":
            refused = (i, reply)
            break
    assert refused is not None, "2 MiB server accepted 10 MB without refusing"
    assert refused[1].startswith(b"SERVER_ERROR out of memory"), refused
    assert refused[0] > 0, "nothing fitted at all"
    # What was stored before is unchanged, and the server keeps answering.
    assert c.call(b"get first\r\n", b"END\r\n") == b"VALUE first 0 5\r\nhello\r\nEND\r\n"
    assert c.call(b"get fill0\r\n", b"END\r\n") == b"VALUE fill0 0 100000\r\n" + value + b"\r\nEND\r\n"
    reply = c.call(b"set first 0 0 100000\r\n" + value + b"\r\n")
    assert reply.startswith(b"SERVER_ERROR out of memory")
    if target == "ramgrid":
        # A refused overwrite keeps the old value (memcached removes it).
        assert c.call(b"get first\r\n", b"END\r\n") == b"VALUE first 0 5\r\nhello\r\nEND\r\n"
    # Deleting makes room again.
    assert c.call(b"delete fill0\r\n") == b"DELETED\r\n"
    assert c.call(b"set again 0 0 100000\r\n" + value + b"\r\n") == b"STORED\r\n"


def _served(conn: RawConn) -> bool | None:
    """True if the connection answers `version`; False if refused (error line or close)."""
    try:
        reply = conn.call(b"version\r\n")
    except (ConnectionError, OSError):
        return False
    if reply.startswith(b"VERSION "):
        return True
    if b"ERROR" in reply:
        return False
    raise AssertionError(f"unexpected reply {reply!r}")


def test_connections_over_max_conns_are_refused_cleanly(
    server_factory: Callable[..., ServerProcess], raw_connect: Connect, target: str
) -> None:
    server = server_factory(max_conns=10)
    conns = []
    results = []
    # One at a time, each confirmed, so the server's count is settled before the next connect.
    for _ in range(12):
        conns.append(raw_connect(server))
        results.append(_served(conns[-1]))
    served = results.count(True)
    if target == "ramgrid":
        assert results == [True] * 10 + [False] * 2
    else:
        # memcached counts its own descriptors against the limit, so fewer than 10 may be served.
        assert results[0] is True and results[-1] is False
        assert results == [True] * served + [False] * (12 - served)
    # Refusing did not disturb the server or the connections it kept.
    assert server.alive()
    assert conns[0].call(b"version\r\n").startswith(b"VERSION ")
    assert conns[served - 1].call(b"mn\r\n") == b"MN\r\n"


def test_server_serves_again_after_connections_close(
    server_factory: Callable[..., ServerProcess], raw_connect: Connect
) -> None:
    server = server_factory(max_conns=10)
    conns = [raw_connect(server) for _ in range(12)]
    for conn in conns:
        _served(conn)
    for conn in conns:
        conn.close()
    # Closing is noticed asynchronously; poll for a bounded time.
    deadline = time.monotonic() + 5
    while True:
        if _served(raw_connect(server)):
            break
        assert time.monotonic() < deadline, "server did not accept a connection after all others closed"
        time.sleep(0.05)


UNREAD_REQUESTS = {
    # 1000 gets of a 500 kB value: 500 MB of replies if the server buffered them all. The requests
    # themselves (9 kB) fit in the socket buffers at once; the server must stop reading them (or
    # at least stop producing replies) while the client reads nothing.
    "1000 pipelined gets": b"get big\r\n" * 1000,
    # ONE request whose reply is 500 MB: the server must write it in parts as the client reads,
    # not compose it whole.
    "one 1000-key get": b"get " + b"big " * 999 + b"big\r\n",
}


@pytest.mark.parametrize("request_name", list(UNREAD_REQUESTS))
def test_client_that_stops_reading_does_not_grow_the_server(
    server_factory: Callable[..., ServerProcess], raw_connect: Connect, request_name: str
) -> None:
    server = server_factory(memory="64MiB")
    setup = raw_connect(server)
    value = b"z" * 500_000
    assert setup.call(b"set big 0 0 500000\r\n" + value + b"\r\n") == b"STORED\r\n"
    rss_before = server.rss_bytes()

    slow = raw_connect(server)
    slow.send(UNREAD_REQUESTS[request_name])
    peak = 0
    for _ in range(10):  # give the server half a second to do whatever it does
        peak = max(peak, server.rss_bytes())
        time.sleep(0.05)

    # Others are still served while the slow client sits there.
    other = raw_connect(server)
    assert other.call(b"get big\r\n", b"END\r\n") == b"VALUE big 0 500000\r\n" + value + b"\r\nEND\r\n"
    assert other.call(b"version\r\n").startswith(b"VERSION ")

    growth = max(peak, server.rss_bytes()) - rss_before
    assert growth < 128 << 20, f"RSS grew {growth >> 20} MiB after {request_name} left unread (500 MB of replies)"
    slow.close()
    assert server.alive()


def test_a_multi_get_reply_written_in_parts_is_whole_and_in_order(
    mc_server: ServerProcess, raw_connect: Connect, unique_key: KeyFn
) -> None:
    conn = raw_connect(mc_server)
    keys = [unique_key() for _ in range(4)]
    values = {k: bytes([65 + i]) * (300_000 + i) for i, k in enumerate(keys)}
    for k, v in values.items():
        assert conn.call(b"set %s %d 0 %d\r\n" % (k.encode(), len(v) % 7, len(v)) + v + b"\r\n") == b"STORED\r\n"
    missing = unique_key()
    asked = [keys[i % 4] for i in range(30)] + [missing] + keys
    expected = b"".join(
        b"VALUE %s %d %d\r\n" % (k.encode(), len(values[k]) % 7, len(values[k])) + values[k] + b"\r\n"
        for k in asked
        if k in values
    )
    # About 10 MB of reply, then a pipelined request whose reply must come after all of it.
    conn.send(b"get " + " ".join(asked).encode() + b"\r\nversion\r\n")
    assert conn.read_exact(len(expected)) == expected
    assert conn.readline() == b"END\r\n"
    assert conn.readline().startswith(b"VERSION ")


def test_garbage_does_not_take_the_server_down(
    mc_server: ServerProcess, raw_connect: Connect, unique_key: KeyFn
) -> None:
    k = unique_key("canary").encode()
    c = raw_connect(mc_server)
    assert c.call(b"set " + k + b" 0 0 6\r\ncanary\r\n") == b"STORED\r\n"
    rng = random.Random(20240501)
    for _ in range(100):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 3000)))
        if rng.random() < 0.5:
            junk = junk.replace(b"\n", b"\r\n")
        g = raw_connect(mc_server, timeout=0.5)
        try:
            g.send(junk)
            g.sock.shutdown(socket.SHUT_WR)
            while g.sock.recv(1 << 16):
                pass
        except OSError:
            pass  # closing on garbage (or resetting) is an allowed answer
        g.close()
    assert mc_server.alive()
    assert c.call(b"get " + k + b"\r\n", b"END\r\n") == b"VALUE " + k + b" 0 6\r\ncanary\r\nEND\r\n"


def test_sigterm_right_after_start_exits_cleanly(server_factory: Callable[..., ServerProcess]) -> None:
    # The moment a supervisor (or a test) may stop a server is once it announced itself: the signal must find
    # the server's handler there, never the default action (exit status -15, nothing shut down).
    for _ in range(5):
        server = server_factory()
        code = server.stop(timeout=5)
        assert code == 0, f"exit code {code} (None: had to be killed after 5 s)"


def test_sigterm_exits_cleanly(server_factory: Callable[..., ServerProcess], raw_connect: Connect) -> None:
    server = server_factory()
    idle = raw_connect(server)
    busy = raw_connect(server)
    assert busy.call(b"set k 0 0 1\r\nv\r\n") == b"STORED\r\n"
    assert idle.call(b"mn\r\n") == b"MN\r\n"
    code = server.stop(timeout=5)
    assert code == 0, f"exit code {code} (None: had to be killed after 5 s)\n{server.kind} stderr:\n"
    # Open connections were closed by the exit.
    assert idle.closed_by_peer()
