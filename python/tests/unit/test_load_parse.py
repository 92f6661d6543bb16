"""The loader's pure parts: byte ranges own each line exactly once, the fast parser agrees with the reference one,
value types are inferred from the first rows, formats are told by name, LoadError crosses processes."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ramgrid import load
from ramgrid.load import LoadError, _parse_fast, _parse_slow, _text_options
from ramgrid.splits import format_of, iter_range, iter_stream

pytestmark = pytest.mark.timeout(60)


def _opts(value_type: str = "bytes", key_type: str = "str", **kw: object) -> load._Options:
    args: dict[str, object] = {
        "fmt": "tsv",
        "delimiter": None,
        "key_column": None,
        "value_column": None,
        "value_type": value_type,
        "key_type": key_type,
        "header": False,
        "skip_bad_lines": False,
        "batch_rows": 10_000,
        "read_block": 1 << 16,
        "inferred_from": "",
    }
    args.update(kw)
    return _text_options(**args)  # type: ignore[arg-type]


def _ranges(path: Path, chunk: int, block: int) -> list[bytes]:
    size = path.stat().st_size
    out = []
    for s in range(0, max(size, 1), chunk):
        out.append(b"".join(d for d, _ in iter_range(str(path), s, min(s + chunk, size), block)))
    return out


lines_st = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=lines_st, chunk=st.integers(1, 40), block=st.integers(1, 17), trailing=st.booleans())
def test_byte_ranges_cover_every_line_exactly_once(
    tmp_path: Path, lines: list[bytes], chunk: int, block: int, trailing: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    p = tmp_path / "f.txt"
    p.write_bytes(data)
    parts = _ranges(p, chunk, block)
    assert b"".join(parts) == data
    nonempty = [part for part in parts if part]
    for part in nonempty[:-1]:  # only the range holding the file's last line may end without a line end
        assert part.endswith(b"\n")


def test_range_pieces_report_their_offsets(tmp_path: Path) -> None:
    p = tmp_path / "f.txt"
    p.write_bytes(b"aa\nbbbb\ncc\ndd\n")
    pieces = list(iter_range(str(p), 4, 14, 3))
    assert b"".join(d for d, _ in pieces) == b"cc\ndd\n"
    assert pieces[0][1] == 8  # where "cc" starts: the range began inside "bbbb", which belongs to the first range


def test_gzip_stream_yields_whole_lines(tmp_path: Path) -> None:
    p = tmp_path / "f.tsv.gz"
    body = b"".join(b"k%d\t%d\n" % (i, i) for i in range(5000)) + b"last\t1"
    p.write_bytes(gzip.compress(body))
    pieces = [d for d, _ in iter_stream(str(p), 1000)]
    assert b"".join(pieces) == body
    assert all(d.endswith(b"\n") for d in pieces[:-1])


field_st = st.binary(max_size=8).filter(lambda b: b"\n" not in b and b"\r" not in b)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(field_st, field_st, st.booleans()), max_size=20),
    value_type=st.sampled_from(["bytes", "i64", "f64"]),
    numeric=st.booleans(),
)
def test_fast_parser_agrees_with_the_reference(
    rows: list[tuple[bytes, bytes, bool]], value_type: str, numeric: bool
) -> None:
    lines = []
    for i, (k, v, tab_in_value) in enumerate(rows):
        if numeric:
            v = str(i * 7 - 3).encode() if value_type != "f64" else f"{i / 3!r}".encode()
        lines.append(k + b"\t" + v + (b"\tx" if tab_in_value else b""))
    data = b"\n".join(lines) + b"\n"
    opts = _opts(value_type)
    slow = _parse_slow(data, opts)
    fast = _parse_fast(data, opts)
    if fast is None:
        return  # the load then takes the slow path for this piece
    assert not slow.bad
    keys = fast.keys.to_pylist()
    values = fast.values.to_pylist() if value_type == "bytes" else fast.values.tolist()
    assert keys == list(slow.keys)
    slow_values = list(slow.values) if value_type == "bytes" else slow.values.tolist()
    assert values == slow_values


def test_slow_parser_rules() -> None:
    data = b"a\t1\r\n\n  \nb\t2\tmore\nnodelim\n\tempty\nc\tx\n"
    r = _parse_slow(data, _opts("bytes"))
    assert r.keys == [b"a", b"b", b"c"]
    assert r.values == [b"1", b"2\tmore", b"x"]  # "\r\n" ends a line; the value is the rest of the line
    assert [i for i, _ in r.bad] == [2, 4, 5]  # "  " and "nodelim" have no delimiter; "\tempty" has no key
    assert "no delimiter" in r.bad[0][1] and "empty key" in r.bad[2][1]
    r = _parse_slow(data, _opts("i64"))
    assert r.values.tolist() == [1]  # "2\tmore" and "x" are not integers
    assert any("not an integer" in why for _, why in r.bad)


def test_columns_pick_fields() -> None:
    data = b"x,1,alpha,9\ny,2,beta,8\nz,3\n"
    o = _opts("i64", delimiter=",", key_column=2, value_column=1)
    r = _parse_slow(data, o)
    assert r.keys == [b"alpha", b"beta"] and r.values.tolist() == [1, 2]
    assert r.bad == [(2, "expected at least 3 fields, got 2")]
    assert _parse_fast(data, o) is None  # a ragged line: the slow path decides


def test_int_keys_and_ranges() -> None:
    r = _parse_slow(b"12\t1\n-3\t2\nab\t3\n99999999999999999999\t4\n", _opts("i64", key_type="int"))
    assert r.keys.tolist() == [12, -3]
    assert [why for _, why in r.bad] == [
        "key 'ab' is not an integer (key_type='int')",
        "key '99999999999999999999' is outside the int64 range",
    ]
    r = _parse_slow(b"a\t9223372036854775808\n", _opts("i64"))
    assert r.bad and "outside the int64 range" in r.bad[0][1]


def test_long_keys_are_bad_lines() -> None:
    data = b"k" * 70000 + b"\t1\nok\t2\n"
    assert _parse_fast(data, _opts("i64")) is None
    r = _parse_slow(data, _opts("i64"))
    assert r.keys == [b"ok"] and "70000 bytes long" in r.bad[0][1]


def test_inference(tmp_path: Path) -> None:
    (tmp_path / "i.tsv").write_bytes(b"a\t1\nb\t-2\n")
    (tmp_path / "f.tsv").write_bytes(b"a\t1\nb\t2.5\n")
    (tmp_path / "s.tsv").write_bytes(b"a\t1\nb\thello\n")
    (tmp_path / "h.csv").write_bytes(b"key,value\na,1\n")
    (tmp_path / "e.tsv").write_bytes(b"")
    assert load.infer_value_type(tmp_path / "i.tsv") == "i64"
    assert load.infer_value_type(tmp_path / "f.tsv") == "f64"
    assert load.infer_value_type(tmp_path / "s.tsv") == "bytes"
    assert load.infer_value_type(tmp_path / "h.csv") == "bytes"
    assert load.infer_value_type(tmp_path / "h.csv", header=True) == "i64"
    assert load.infer_value_type(tmp_path / "e.tsv") == "bytes"
    (tmp_path / "g.tsv.gz").write_bytes(gzip.compress(b"a\t0.5\n"))
    assert load.infer_value_type(tmp_path / "g.tsv.gz") == "f64"


def test_parquet_inference(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"k": ["a"], "i": [1], "f": [0.5], "s": ["x"]}), tmp_path / "t.parquet")
    p = tmp_path / "t.parquet"
    assert load.infer_value_type(p) == "i64"
    assert load.infer_value_type(p, value_column="f") == "f64"
    assert load.infer_value_type(p, value_column=3) == "bytes"
    with pytest.raises(LoadError, match="no column 'nope'"):
        load.infer_value_type(p, value_column="nope")


def test_formats_and_planning(tmp_path: Path) -> None:
    for name, fmt in [("a.tsv", "tsv"), ("a.txt.gz", "text"), ("b.CSV", "csv"), ("part-00000", "text")]:
        assert format_of(Path(name), None) == fmt
    assert format_of(Path("x.parquet"), None) == "parquet"
    with pytest.raises(ValueError, match="cannot tell the format"):
        format_of(Path("x.json"), None)
    d = tmp_path / "dir"
    d.mkdir()
    (d / "b.tsv").write_bytes(b"a\t1\n" * 100)
    (d / "a.tsv").write_bytes(b"")
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".hidden").write_bytes(b"junk")
    (d / "c.tsv.gz").write_bytes(gzip.compress(b"a\t1\n" * 100))
    tasks = load.plan_tasks(d, chunk_bytes=64)
    assert [Path(t.path).name for t in tasks if t.kind == "range"].count("b.tsv") == 7  # 400 bytes / 64
    assert [t.kind for t in tasks if t.path.endswith(".gz")] == ["stream"]
    assert sum(t.size for t in tasks if t.kind == "range") == 400
    with pytest.raises(LoadError, match="no such file"):
        load.plan_tasks(tmp_path / "missing.tsv")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LoadError, match="no data files"):
        load.plan_tasks(empty)


def test_load_error_pickles_with_its_fields() -> None:
    e = LoadError.at("/data/x.tsv", 12, "value 'q' is not a number")
    assert str(e) == "/data/x.tsv: line 12: value 'q' is not a number"
    assert isinstance(e, ValueError)
    e2 = pickle.loads(pickle.dumps(e))
    assert (type(e2), e2.path, e2.line, e2.reason, str(e2)) == (LoadError, e.path, 12, e.reason, str(e))


def test_report_rate_and_text() -> None:
    r = load.LoadReport("t", 3, 1000, 2048, 2, 0.5, "f64", "str", 1, 1)
    assert r.rows_per_s == 2000
    assert "1,000 rows" in str(r) and "version 3" in str(r) and "skipped 2 bad lines" in str(r)
    assert r.to_dict()["rows_per_s"] == 2000


def test_fast_parser_takes_plain_pieces() -> None:
    data = b"a\t1\n\nb\t-2\n\xff\xfe\t3\n"
    fast = _parse_fast(data, _opts("i64"))
    assert fast is not None
    assert fast.keys.to_pylist() == [b"a", b"b", b"\xff\xfe"] and fast.values.tolist() == [1, -2, 3]
    assert _parse_fast(b"a\t1\r\n", _opts("i64")) is None  # "\r" anywhere: the slow path decides
    assert _parse_fast(b"a\t1\tz\n", _opts("bytes")) is None  # three fields: the value is "1\tz" (slow path)
