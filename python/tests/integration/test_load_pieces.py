"""Loads whose tasks read many pieces (each parsed on the read-ahead thread while the one before is written): line
and row numbers stay exact in every piece, a key's last line in a task wins, and tasks are sized to the workers."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.load import LoadError, load_table
from ramgrid.load import parquet as load_parquet
from ramgrid.load import run as load_run
from ramgrid.load.task import _ahead

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 512 bytes and Parquet batches of 100 rows: each task reads many."""
    monkeypatch.setattr(load_run, "_READ_BLOCK", 512)
    monkeypatch.setattr(load_parquet, "_BATCH_ROWS", 100)


@pytest.mark.usefixtures("small_pieces")
def test_bad_lines_in_later_pieces_are_numbered_from_the_file(
    grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path
) -> None:
    p = tmp_path / "bad.tsv"
    lines = [f"k{i}\t{i}" for i in range(3000)]
    for i in (1234, 2500, 2999):
        lines[i] = f"k{i}\tx{i}"
    p.write_text("\n".join(lines) + "\n")
    # One task over the whole file (a range starting mid-file in the second case): the lines are counted lazily.
    with pytest.raises(LoadError) as e:
        load_table(grid3, table_name, p, value_type="i64", chunk_bytes=1 << 20, progress=False)
    assert (e.value.line, e.value.reason) == (1235, "value 'x1234' is not an integer")
    for chunk in (1 << 20, 10_000):
        report = load_table(
            grid3, table_name, p, value_type="i64", chunk_bytes=chunk, skip_bad_lines=True, progress=False
        )
        assert (report.rows, report.bad_lines) == (2997, 3)
        assert sorted(line for _, line, _ in report.bad_samples) == [1235, 2501, 3000]
        assert grid3.table(table_name).get_many([f"k{i}" for i in (0, 1233, 1235, 2998)]).tolist() == [
            0,
            1233,
            1235,
            2998,
        ]


@pytest.mark.usefixtures("small_pieces")
def test_header_and_a_bad_line_after_it(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "h.csv"
    p.write_text("key,value\n" + "".join(f"k{i},{i}\n" for i in range(200)) + "late,oops\n")
    with pytest.raises(LoadError, match="line 202: value 'oops' is not a number"):
        load_table(grid3, table_name, p, value_type="f64", header=True, progress=False)


@pytest.mark.usefixtures("small_pieces")
def test_last_line_of_a_key_wins_within_a_task(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "dup.tsv"
    p.write_text("".join(f"k{i % 50}\t{i}\n" for i in range(2000)))
    report = load_table(grid3, table_name, p, value_type="i64", chunk_bytes=1 << 20, progress=False)
    assert (report.rows, report.tasks) == (2000, 1)
    assert grid3.table(table_name).get_many([f"k{j}" for j in range(50)]).tolist() == [1950 + j for j in range(50)]


@pytest.mark.usefixtures("small_pieces")
def test_parquet_batches_number_their_rows(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    keys: list[str | None] = [f"k{i}" for i in range(1000)]
    keys[777] = None
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": keys, "v": np.arange(1000, dtype=np.int64)}), p, row_group_size=400)
    with pytest.raises(LoadError) as e:
        load_table(grid3, table_name, p, progress=False)
    assert (e.value.line, e.value.reason) == (778, "null key")
    report = load_table(grid3, table_name, p, skip_bad_lines=True, progress=False)
    assert (report.rows, report.bad_lines, report.tasks) == (999, 1, 3)
    assert report.bad_samples == [(str(p), 778, "null key")]
    assert grid3.table(table_name).get_many(["k0", "k776", "k778", "k999"]).tolist() == [0, 776, 778, 999]


def test_tasks_are_sized_to_the_workers(tmp_path: Path) -> None:
    p = tmp_path / "big.tsv"
    with open(p, "wb") as f:
        f.truncate(100 << 20)  # sparse: only its size is read
    files = [(p, "tsv")]
    assert load_run._task_bytes(files, 2) == (100 << 20) // 8 + 1  # four tasks a worker
    assert load_run._task_bytes(files, 64) == 4 << 20  # no task below 4 MiB
    assert load_run._task_bytes(files, 1) == (100 << 20) // 4 + 1
    assert load_run._task_bytes([(p, "parquet")], 2) == 4 << 20  # Parquet is cut by row groups


def test_read_ahead_keeps_order_and_closes_its_source() -> None:
    threads: set[str] = set()
    closed = threading.Event()

    def source():  # type: ignore[no-untyped-def]
        try:
            for i in range(100):
                threads.add(threading.current_thread().name)
                yield i
        finally:
            closed.set()

    assert list(_ahead(source())) == list(range(100))
    assert threading.current_thread().name not in threads  # produced on the helper thread
    assert closed.is_set()
    closed.clear()
    it = _ahead(source())
    assert [next(it), next(it)] == [0, 1]
    it.close()  # the consumer leaves early: the source is closed, not left running
    assert closed.is_set()

    def failing():  # type: ignore[no-untyped-def]
        yield 1
        raise OSError("disk gone")

    it = _ahead(failing())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):  # the source's error reaches the consumer, after what came first
        next(it)


def test_bytes_values_from_arrow_go_packed(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    t = grid3.create_table(table_name, partitions=8, value_type="bytes")
    vals = pa.array(["", "x", "é" * 300, "tab\there"] * 50, pa.large_string()).slice(2, 100)
    keys = [f"k{i}" for i in range(100)]
    t.put_many(keys, vals)  # handed to the binding as (offsets, data): no Python object per value
    assert t.get_many(keys) == [v.encode() for v in vals.to_pylist()]
    with pytest.raises(ValueError, match="2 keys but 3 values"):
        t.put_many(["a", "b"], pa.array([b"1", b"2", b"3"]))
    with pytest.raises(TypeError, match="NoneType"):
        t.put_many(["a", "b"], pa.array(["1", None]))
    assert t.get_many(["a", "b"], default=None) == [None, None]  # a refused call stores nothing
    # A load of text values: each piece's value column goes packed too, exactly as read.
    p = tmp_path / "v.tsv"
    p.write_text("".join(f"k{i}\tv {i}\n" for i in range(3000)))
    report = load_table(grid3, table_name + "_l", p, value_type="bytes", progress=False)
    assert report.rows == 3000
    assert grid3.table(table_name + "_l").get_many(["k0", "k2999"]) == [b"v 0", b"v 2999"]
