"""Loads against real servers: every format round-trips exactly, bad input names file + line + reason, and a
failed load never becomes visible (the previous version stays current)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import TableNotFound
from ramgrid.load import LoadError, load_main, load_table, table_load

pytestmark = pytest.mark.timeout(60)


def _write_tsv(path: Path, keys: list[str], values: list[object], sep: str = "\t") -> None:
    path.write_text(
        "".join(f"{k}{sep}{v!r}\n" if isinstance(v, float) else f"{k}{sep}{v}\n" for k, v in zip(keys, values))
    )


def test_tsv_round_trips_over_many_ranges(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    keys = [f"w{i}" for i in range(20_000)]
    values = rng.standard_normal(len(keys)).tolist()
    p = tmp_path / "probs.tsv"
    _write_tsv(p, keys, values)
    report = load_table(grid3, table_name, p, chunk_bytes=16 << 10, batch_rows=1000, progress=False)
    assert report.tasks > 10 and report.rows == len(keys) and report.bad_lines == 0
    assert report.bytes == p.stat().st_size and report.value_type == "f64"
    t = grid3.table(table_name)
    assert t.get_many(keys).tolist() == values  # bit-exact: repr round-trips floats
    assert t.current_version() == report.version
    assert [v["version"] for v in t.versions()] == [report.version]  # the empty version 1 was dropped


def test_text_bytes_values_are_kept_exactly(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "raw.txt"
    p.write_bytes(b"a\tplain\r\n\nb\tx\ty\tz\nc\t\xff\xfe not utf-8\n\xe2\x82\xac\t  spaced  \nd\t")
    report = load_table(grid3, table_name, p, progress=False)
    assert report.value_type == "bytes" and report.rows == 5
    t = grid3.table(table_name)
    got = t.get_many([b"a", b"b", b"c", "\u20ac", b"d"])
    assert got == [b"plain", b"x\ty\tz", b"\xff\xfe not utf-8", b"  spaced  ", b""]


def test_csv_with_header_and_columns(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "users.csv"
    p.write_text("name,age,id\nann,31,7\nbob,42,8\n")
    report = load_table(grid3, table_name, p, header=True, key_column=2, value_column=1, key_type="int", progress=False)
    assert (report.rows, report.value_type, report.key_type) == (2, "i64", "int")
    assert grid3.table(table_name).get_many(np.array([7, 8])).tolist() == [31, 42]


def test_gzip_and_directory(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path / "parts"
    d.mkdir()
    (d / "part-0.tsv").write_text("".join(f"k{i}\t{i}\n" for i in range(1000)))
    (d / "part-1.tsv.gz").write_bytes(gzip.compress("".join(f"k{i}\t{i}\n" for i in range(1000, 3000)).encode()))
    pq.write_table(
        pa.table({"key": [f"k{i}" for i in range(3000, 4000)], "value": list(range(3000, 4000))}),
        d / "part-2.parquet",
        row_group_size=300,
    )
    (d / "_SUCCESS").write_text("")
    report = load_table(grid3, table_name, d, chunk_bytes=4096, progress=False)
    assert (report.rows, report.files, report.value_type) == (4000, 3, "i64")
    assert report.tasks >= 1 + 1 + 4  # ranges of part-0, one gzip stream, four row groups
    t = grid3.table(table_name)
    assert t.get_many([f"k{i}" for i in range(4000)]).tolist() == list(range(4000))


def test_parquet_round_trips(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ids = np.arange(5000, dtype=np.int64) * 3
    vals = np.random.default_rng(2).random(5000)
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ids, "extra": ids, "score": vals}), p, row_group_size=1000)
    report = load_table(grid3, table_name, p, value_column="score", progress=False)
    assert (report.rows, report.tasks, report.key_type, report.value_type) == (5000, 5, "int", "f64")
    assert np.array_equal(grid3.table(table_name).get_many(ids), vals)
    # Strings and nulls: a null is a bad row, named by its row number.
    p2 = tmp_path / "s.parquet"
    pq.write_table(pa.table({"k": ["a", "b", None, "d"], "v": ["x", None, "z", "w"]}), p2)
    with pytest.raises(LoadError) as e:
        load_table(grid3, table_name + "_s", p2, progress=False)
    assert (e.value.path, e.value.line, e.value.reason) == (str(p2), 2, "null value")
    report = load_table(grid3, table_name + "_s", p2, skip_bad_lines=True, progress=False)
    assert (report.rows, report.bad_lines) == (2, 2)
    assert grid3.table(table_name + "_s").get_many(["a", "d"]) == [b"x", b"w"]


def test_parquet_vectors(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    vecs = np.arange(12, dtype=np.float32).reshape(4, 3)
    col = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), 3)
    pq.write_table(pa.table({"k": np.arange(4), "v": col}), tmp_path / "v.parquet")
    report = load_table(grid3, table_name, tmp_path / "v.parquet", progress=False)
    assert report.value_type == "f32vec:3"
    assert np.array_equal(grid3.table(table_name).get_many(np.arange(4)), vecs)


def test_bad_line_names_file_line_and_reason(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "bad.tsv"
    lines = [f"k{i}\t{i}" for i in range(5000)]
    lines[3999] = "k3999\tnot-a-number"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(LoadError) as e:
        # Small ranges: the bad line lies in a range that starts mid-file, so its number is counted from the file.
        load_table(grid3, table_name, p, value_type="i64", chunk_bytes=2048, progress=False)
    assert (e.value.path, e.value.line) == (str(p), 4000)
    assert e.value.reason == "value 'not-a-number' is not an integer"
    assert str(e.value) == f"{p}: line 4000: value 'not-a-number' is not an integer"
    assert isinstance(e.value, ValueError)
    with pytest.raises(TableNotFound):  # the table this failed load created is gone again
        grid3.table(table_name).describe()


def test_inferred_type_hint(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "mixed.tsv"
    p.write_text("".join(f"k{i}\t{i}\n" for i in range(2000)) + "late\t2.5\n")
    with pytest.raises(LoadError, match=r"line 2001: value '2.5' is not an integer \(value type i64 was inferred"):
        load_table(grid3, table_name, p, progress=False)
    assert load_table(grid3, table_name, p, value_type="f64", progress=False).rows == 2001


def test_skip_bad_lines_counts(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "some_bad.tsv.gz"
    body = "a\t1\nb\tx\nno delimiter here\nc\t3\n\t4\n" + "k" * 70000 + "\t5\n"
    p.write_bytes(gzip.compress(body.encode()))
    report = load_table(grid3, table_name, p, value_type="f64", skip_bad_lines=True, progress=False)
    assert (report.rows, report.bad_lines) == (2, 4)
    assert [(line, reason.split(" ")[0]) for _, line, reason in report.bad_samples] == [
        (2, "value"),
        (3, "no"),
        (5, "empty"),
        (6, "key"),
    ]
    assert grid3.table(table_name).get_many(["a", "c"]).tolist() == [1.0, 3.0]


def test_value_refused_by_the_grid_is_a_bad_line(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "big.tsv"
    p.write_bytes(b"a\tsmall\nhuge\t" + b"x" * (2 << 20) + b"\nb\tsmall\n")
    with pytest.raises(LoadError, match="line 2: key refused by the grid: VALUE_TOO_LARGE"):
        load_table(grid3, table_name, p, progress=False)
    report = load_table(grid3, table_name, p, skip_bad_lines=True, progress=False)
    assert (report.rows, report.bad_lines) == (2, 1)


def test_failed_load_leaves_the_previous_version(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    good = tmp_path / "v1.tsv"
    _write_tsv(good, [f"k{i}" for i in range(3000)], [float(i) for i in range(3000)])
    v1 = load_table(grid3, table_name, good, progress=False).version
    t = grid3.table(table_name)
    pinned = t.pin()
    corrupt = tmp_path / "v2.tsv"
    lines = [f"k{i}\t{-i}.0" for i in range(3000)]
    lines[2500] = "k2500\t??"
    corrupt.write_text("\n".join(lines) + "\n")
    # Many small tasks, so most of the corrupt file was written into the new version before the bad line stopped it.
    with pytest.raises(LoadError, match="line 2501"):
        load_table(grid3, table_name, corrupt, chunk_bytes=1024, batch_rows=100, progress=False, workers=2)
    assert t.current_version() == v1
    assert t.get_many([f"k{i}" for i in range(3000)]).tolist() == [float(i) for i in range(3000)]
    assert pinned.get("k10") == 10.0
    assert [v["version"] for v in t.versions()] == [v1]  # the failed version was dropped
    with pytest.raises(LoadError, match="no such file"):
        load_table(grid3, table_name, tmp_path / "missing.tsv", progress=False)
    assert t.current_version() == v1


def test_existing_table_rules(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p = tmp_path / "x.tsv"
    p.write_text("a\t1\n")
    with pytest.raises(TableNotFound):
        load_table(grid3, table_name, p, create=False, progress=False)
    t = grid3.create_table(table_name, partitions=8, value_type="f64")
    t.put_many(["old"], np.array([1.0]))
    with pytest.raises(ValueError, match="holds f64 values, not i64"):
        load_table(grid3, table_name, p, value_type="i64", progress=False)
    report = table_load(t, p, create=False, progress=False)  # what Table.load does
    assert report.value_type == "f64" and report.version == 2
    assert t.get("a") == 1.0 and "old" not in t  # a load replaces the table's content with the file's
    assert t.pin(1).get("old") == 1.0  # the previous version is kept for readers pinned to it
    if hasattr(ramgrid.Table, "load"):
        assert t.load(p, progress=False).version == 3


def test_replicas_must_all_be_written(tmp_path: Path) -> None:
    """A load switches only when every replica of every partition has its rows: with a replica down it fails."""
    p = tmp_path / "r.tsv"
    _write_tsv(p, [f"k{i}" for i in range(2000)], list(range(2000)))
    with ramgrid.local(servers=3, memory="64MiB", timeout=2.0) as g:
        v1 = load_table(g, "rep", p, replication=2, partitions=16, progress=False).version
        t = g.table("rep")
        assert t.get_many([f"k{i}" for i in range(2000)]).tolist() == list(range(2000))
        g.kill(1)
        p.write_text("k0\t-1\n")
        with pytest.raises(ramgrid.RamgridError):
            load_table(g, "rep", p, progress=False)
        # Reads fail over to the live replicas and still see version 1 (current_version() needs every server).
        assert t.get_many([f"k{i}" for i in range(2000)]).tolist() == list(range(2000))
        assert t.pin(v1).get("k0") == 0


def test_progress_goes_to_stderr(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "p.tsv"
    p.write_text("a\t1\nb\t2\n")
    load_table(grid3, table_name, p, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "2 rows" in err
    load_table(grid3, table_name, p, progress=False)
    assert capsys.readouterr().err == ""


def test_cli_load(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "c.tsv"
    p.write_text("a\t1.5\nb\t2.5\n")
    assert load_main([table_name, str(p), "--spec", grid3.spec, "--no-progress"]) == 0
    assert "loaded 2 rows" in capsys.readouterr().out
    assert grid3.table(table_name).get_many(["a", "b"]).tolist() == [1.5, 2.5]
    p.write_text("a;1\nb;x\n")
    rc = load_main([table_name, str(p), "--spec", grid3.spec, "--no-progress", "--delimiter", ";"])
    assert rc == 1 and f"{p}: line 2: value 'x' is not a number" in capsys.readouterr().err
    rc = load_main(
        [table_name, str(p), "--spec", grid3.spec, "--no-progress", "--delimiter", ";", "--skip-bad-lines", "--json"]
    )
    assert rc == 0 and '"bad_lines": 1' in capsys.readouterr().out


def _dask_cluster():  # type: ignore[no-untyped-def]
    distributed = pytest.importorskip("distributed")
    return distributed, distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        scheduler_kwargs={"dashboard": False},
    )


@pytest.mark.timeout(120)
def test_load_on_dask_workers(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    distributed, cluster = _dask_cluster()
    keys = [f"u{i}" for i in range(30_000)]
    p = tmp_path / "d.tsv"
    _write_tsv(p, keys, list(range(30_000)))
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(f"u{i}\t{i}\n" for i in range(5000)) + "u5000\toops\n")
    with cluster, distributed.Client(cluster) as client:
        report = load_table(grid3, table_name, p, dask_client=client, chunk_bytes=32 << 10, progress=False)
        assert report.rows == 30_000 and report.tasks > 4
        # The tasks ran in the worker processes, not here.
        assert set(client.run(os.getpid).values()).isdisjoint({os.getpid()})
        t = grid3.table(table_name)
        assert t.get_many(keys).tolist() == list(range(30_000))
        with pytest.raises(LoadError) as e:
            load_table(grid3, table_name, bad, dask_client=client, chunk_bytes=8 << 10, progress=False)
        assert (e.value.path, e.value.line) == (str(bad), 5001)
        assert t.current_version() == report.version
        assert t.get("u7") == 7
        # Without chunk_bytes the tasks are sized to the workers' threads.
        again = load_table(grid3, table_name, p, dask_client=client, progress=False)
        assert (again.rows, again.tasks) == (30_000, 1)  # a small file: one task of at least 4 MiB
        assert t.current_version() == again.version
