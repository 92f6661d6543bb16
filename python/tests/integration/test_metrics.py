"""The metrics endpoint (`--metrics`) and METRICS opcode of a real ramgrid-server: figures checked exactly after
known native and memcached traffic, a scrape taken during a load loop, and the same per-table figures in
`Grid.stats()`."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)
import ramgrid
from prometheus_client.parser import text_string_to_metric_families
from pymemcache.client.base import Client as McClient
from ramgrid.exceptions import TableExists

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def metered(start_server: Callable[..., Any]) -> tuple[Any, str]:
    """A server of its own with --metrics on a free loopback port: (server, metrics URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start_server("ramgrid", extra=("--metrics", f"127.0.0.1:{port}"))
    return server, f"http://127.0.0.1:{port}"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value}, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def table_value(m: dict, name: str, table: str, **labels: str) -> float:
    return m.get((name, tuple(sorted({"table": table, **labels}.items()))), 0.0)


def test_metrics_count_native_and_memcached_traffic(metered: tuple[Any, str]) -> None:
    server, url = metered
    grid = ramgrid.connect(server.addr)
    try:
        t = grid.create_table("metered", partitions=4, value_type="bytes")
        other = grid.create_table("other", partitions=2, value_type="i64")
        t.put_many([f"k{i}" for i in range(100)], [b"v" * i for i in range(100)])
        t.put_many(["k0", "k1"], [b"again", b"again"])  # overwrites: puts, not new items
        got = t.get_many([f"k{i}" for i in range(150)], default=None)  # 100 hits, 50 misses
        assert sum(v is not None for v in got) == 100
        assert t.delete_many(["k0", "k1", "nope"]) == 2
        other.put_many([1, 2, 3], [10, 20, 30])
        assert other.get(2) == 20

        mc = McClient((server.host, server.port), connect_timeout=2, timeout=2)
        for i in range(7):
            mc.set(f"mc{i}", b"x")
        assert mc.get("mc3") == b"x" and mc.get("absent") is None
        mc.close()

        m = scrape(url)
        assert table_value(m, "ramgrid_table_items", "metered", version="1") == 98
        assert table_value(m, "ramgrid_table_versions", "metered") == 1
        assert table_value(m, "ramgrid_table_current_version", "metered") == 1
        assert table_value(m, "ramgrid_table_puts_total", "metered") == 102
        assert table_value(m, "ramgrid_table_gets_total", "metered") == 150
        assert table_value(m, "ramgrid_table_hits_total", "metered") == 100
        assert table_value(m, "ramgrid_table_misses_total", "metered") == 50
        assert table_value(m, "ramgrid_table_deletes_total", "metered") == 3
        assert table_value(m, "ramgrid_table_delete_hits_total", "metered") == 2
        assert table_value(m, "ramgrid_table_bytes", "metered", version="1") > 0
        assert table_value(m, "ramgrid_table_items", "other", version="1") == 3
        assert table_value(m, "ramgrid_table_puts_total", "other") == 3
        assert table_value(m, "ramgrid_table_hits_total", "other") == 1
        # Server-wide native figures are the sums over tables; the histograms count every batch.
        assert m[("ramgrid_native_puts_total", ())] == 105
        assert m[("ramgrid_native_gets_total", ())] == 151
        batches = table_value(m, "ramgrid_table_batches_total", "metered", op="get")
        assert batches >= 1
        assert table_value(m, "ramgrid_table_batch_seconds_count", "metered", op="get") == batches
        # The memcached keyspace.
        assert m[("ramgrid_memcached_items", ())] == 7
        assert m[("ramgrid_memcached_sets_total", ())] == 7
        assert m[("ramgrid_memcached_hits_total", ())] == 1
        assert m[("ramgrid_memcached_misses_total", ())] == 1
        assert m[("ramgrid_connections", ())] >= 1

        # A refused batch is counted by reason, on its table.
        with pytest.raises(ramgrid.exceptions.RamgridError):
            grid.table("metered").pin(7).get("k5")
        m = scrape(url)
        assert table_value(m, "ramgrid_table_refused_total", "metered", reason="NO_SUCH_VERSION") == 1

        # The same figures in Grid.stats() (METRICS over the native protocol), as `ramgrid stats` prints them.
        (st,) = grid.stats()
        fig = st["tables"]["metered"]
        assert (fig["items"], fig["versions"], fig["puts"], fig["gets"], fig["hits"], fig["misses"]) == (
            98,
            1,
            102,
            150,
            100,
            50,
        )
        # (A client may also see WRONG_EPOCH once while it learns the server's epoch.)
        assert fig["refused"]["NO_SUCH_VERSION"] == 1
        assert st["tables"]["other"]["items"] == 3
        assert st["curr_items"] == 7  # the memcached counters are still there
    finally:
        grid.close()


def test_metrics_endpoint_answers_only_get_metrics(metered: tuple[Any, str]) -> None:
    _, url = metered
    # `/` and `/api/...` are the dashboard's (test_dashboard.py).
    for path, code in (("/nope", 404), ("/metrics/x", 404)):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + path, timeout=5)
        e.value.close()
        assert e.value.code == code
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url + "/metrics", data=b"x", method="POST"), timeout=5)
    e.value.close()
    assert e.value.code == 405


def test_a_scrape_during_a_load_loop_does_not_stop_it(metered: tuple[Any, str]) -> None:
    server, url = metered
    grid = ramgrid.connect(server.addr)
    t = grid.create_table("busy", partitions=4, value_type="i64")
    done = threading.Event()
    rounds = [0]
    errors: list[BaseException] = []

    def load() -> None:
        try:
            while not done.is_set():
                t.put_many(list(range(50)), list(range(50)))
                t.get_many(list(range(50)))
                rounds[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        seen = []
        for _ in range(20):
            m = scrape(url)
            seen.append((rounds[0], table_value(m, "ramgrid_table_puts_total", "busy")))
        # The loop kept running across the scrapes, and the counters only grew.
        while rounds[0] <= seen[0][0] and worker.is_alive():
            threading.Event().wait(0.01)
    finally:
        done.set()
        worker.join(timeout=30)
    assert not errors, errors
    assert rounds[0] > seen[0][0]
    puts = [p for _, p in seen]
    assert puts == sorted(puts)
    m = scrape(url)
    assert table_value(m, "ramgrid_table_puts_total", "busy") == 50 * rounds[0]
    assert table_value(m, "ramgrid_table_hits_total", "busy") == 50 * rounds[0]
    grid.close()


def test_metrics_show_the_control_plane() -> None:
    """The metadata group's figures: membership, leadership, quorum, and each proposal counted."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with ramgrid.local(servers=1, memory="64MiB", extra_args=["--metrics", f"127.0.0.1:{port}"]) as grid:
        m = scrape(url)
        assert m[("ramgrid_meta_member", ())] == 1 and m[("ramgrid_meta_leader", ())] == 1
        assert m[("ramgrid_meta_quorum", ())] == 1 and m[("ramgrid_meta_voters", ())] == 1
        assert m[("ramgrid_cluster_servers", ())] == 1
        before = m[("ramgrid_meta_proposals_committed_total", ())]
        t = grid.create_table("planned", partitions=2, value_type="i64")
        with t.new_version() as v:
            v.put_many([1], [1])
        with pytest.raises(TableExists):
            grid.create_table("planned", partitions=2, value_type="i64")
        m = scrape(url)
        assert m[("ramgrid_cluster_tables", ())] == 1
        # the table, the version's number, its switch; the second create is refused by the group
        assert m[("ramgrid_meta_proposals_committed_total", ())] >= before + 3
        assert m[("ramgrid_meta_proposals_refused_total", ())] >= 1
        # The leader's health figures: one voter answering (itself), no further failure tolerated.
        assert m[("ramgrid_meta_voters_answering", ())] == 1 and m[("ramgrid_meta_failures_tolerated", ())] == 0
        assert m[("ramgrid_failovers_total", ())] == 0
