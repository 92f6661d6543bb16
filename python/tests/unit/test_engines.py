"""The engine adapters: the thread engine's submit / as-completed / cancel, and the worker-server pairing rule."""

from __future__ import annotations

import threading

import pytest
from ramgrid.engines import ThreadEngine, engine_for, pair_servers

pytestmark = pytest.mark.timeout(30)


def test_thread_engine_runs_tasks_and_yields_them_as_they_finish() -> None:
    with ThreadEngine(workers=3) as eng:
        futures = [eng.submit(pow, i, 2, where="127.0.0.1:1", name="sq") for i in range(10)]
        got = sorted(f.result() for f in eng.as_completed(futures))
    assert got == [i * i for i in range(10)]


def test_thread_engine_cancel_sets_the_event_and_drops_queued_tasks() -> None:
    gate = threading.Event()
    with ThreadEngine(workers=1) as eng:
        first = eng.submit(gate.wait, 10)
        queued = [eng.submit(pow, 2, 2) for _ in range(5)]
        eng.cancel(queued)
        assert eng.cancel_event.is_set()
        assert all(f.cancelled() for f in queued)
        gate.set()
        assert first.result() is True


def test_a_failing_task_raises_from_result() -> None:
    with ThreadEngine(workers=2) as eng:
        f = eng.submit(int, "not a number")
        with pytest.raises(ValueError):
            next(iter(eng.as_completed([f]))).result()


def test_engine_for_without_dask_is_threads() -> None:
    eng = engine_for(None, workers=2)
    assert isinstance(eng, ThreadEngine) and eng.parallelism == 2
    eng.close()


def test_pairing_one_server_per_host_gives_each_worker_its_own() -> None:
    local = {"tcp://10.0.0.2:9": ["10.0.0.2:7000"], "tcp://10.0.0.1:9": ["10.0.0.1:7000"]}
    assert pair_servers(local, ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"]) == {
        "10.0.0.1:7000": "tcp://10.0.0.1:9",
        "10.0.0.2:7000": "tcp://10.0.0.2:9",
    }


def test_pairing_on_one_machine_spreads_servers_over_workers_in_turn() -> None:
    servers = [f"127.0.0.1:{7000 + i}" for i in range(4)]
    local = {"tcp://127.0.0.1:2": servers, "tcp://127.0.0.1:1": servers}
    pairs = pair_servers(local, servers)
    assert [pairs[s] for s in servers] == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"] * 2
