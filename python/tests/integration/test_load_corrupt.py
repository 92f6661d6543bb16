"""Loads of damaged compressed input: gzip text (every text format) and Parquet with gzip pages, corrupted in the
middle or truncated, fail with a LoadError naming the file and where it broke, load nothing, and the CLI says so in
one line."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)

import ramgrid
from ramgrid.exceptions import TableNotFound
from ramgrid.load import LoadError, load_table

pytestmark = pytest.mark.timeout(90)

ROWS = 40_000
PKG_ROOT = str(Path(ramgrid.__file__).resolve().parents[1])


def _text(sep: str) -> bytes:
    return "".join(f"key{i}{sep}{i % 1000}.5\n" for i in range(ROWS)).encode()


def _damaged_gzip(body: bytes, damage: str) -> tuple[bytes, int]:
    """`body` gzipped, then damaged; returns the bytes and the offset where reading must stop. "corrupt": two
    members with the second's first deflate byte made invalid (zlib stops exactly there); "truncated": cut in
    half."""
    if damage == "truncated":
        data = gzip.compress(body, mtime=0)
        return data[: len(data) // 2], len(data) // 2
    half = body.rfind(b"\n", 0, len(body) // 2) + 1
    first = gzip.compress(body[:half], mtime=0)
    data = bytearray(first + gzip.compress(body[half:], mtime=0))
    at = len(first) + 10
    data[at] = 0xFF
    return bytes(data), at


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
@pytest.mark.parametrize(("name", "sep"), [("t.txt.gz", "\t"), ("t.tsv.gz", "\t"), ("t.csv.gz", ",")])
def test_damaged_gzip_text_fails_naming_file_and_offset(
    grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path, name: str, sep: str, damage: str
) -> None:
    p = tmp_path / name
    data, at = _damaged_gzip(_text(sep), damage)
    p.write_bytes(data)
    with pytest.raises(LoadError) as e:
        load_table(grid3, table_name, p, value_type="f64", progress=False)
    assert e.value.path == str(p) and str(e.value).startswith(f"{p}: ")
    assert f"compressed byte {at}" in str(e.value)
    with pytest.raises(TableNotFound):  # nothing of the failed load is left
        grid3.table(table_name).describe()


def _gzip_parquet(tmp_path: Path) -> tuple[Path, bytes, object]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "g.parquet"
    t = pa.table({"k": [f"key{i}" for i in range(ROWS)], "v": [i / 7 for i in range(ROWS)]})
    pq.write_table(t, p, compression="gzip", row_group_size=ROWS // 2)
    return p, p.read_bytes(), pq.ParquetFile(p).metadata


def test_parquet_with_a_corrupt_gzip_page_names_the_column_chunk(
    grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path
) -> None:
    p, raw, meta = _gzip_parquet(tmp_path)
    chunk = meta.row_group(1).column(1)  # type: ignore[attr-defined]  # column "v" of the second row group
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    size = chunk.total_compressed_size
    bad = bytearray(raw)
    for i in range(start + size // 2, start + size // 2 + 64):
        bad[i] ^= 0x5A
    p.write_bytes(bytes(bad))
    with pytest.raises(LoadError) as e:
        load_table(grid3, table_name, p, progress=False)
    assert e.value.path == str(p)
    m = re.search(r"row group 1, column 'v' \(compressed bytes (\d+)-(\d+)\)", str(e.value))
    assert m, str(e.value)
    assert int(m.group(1)) <= start + size // 2 < int(m.group(2))
    with pytest.raises(TableNotFound):
        grid3.table(table_name).describe()


def test_truncated_parquet_names_the_file(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    p, raw, _ = _gzip_parquet(tmp_path)
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(LoadError) as e:
        load_table(grid3, table_name, p, progress=False)
    assert e.value.path == str(p) and "Parquet" in str(e.value)


def test_gzipped_parquet_is_refused_with_a_reason(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path) -> None:
    _, raw, _ = _gzip_parquet(tmp_path)
    gz = tmp_path / "g.parquet.gz"
    gz.write_bytes(gzip.compress(raw))
    with pytest.raises(LoadError, match="gzip-compressed"):
        load_table(grid3, table_name, gz, progress=False)


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_cli_prints_one_line_and_fails(grid3: ramgrid.LocalGrid, table_name: str, tmp_path: Path, damage: str) -> None:
    p = tmp_path / "t.tsv.gz"
    data, at = _damaged_gzip(_text("\t"), damage)
    p.write_bytes(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAMGRID_")}
    env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, "-m", "ramgrid.cli", "load", table_name, str(p), "--spec", grid3.spec, "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("ramgrid: load failed, nothing loaded: ") and f"{p}: " in lines[0]
    assert f"compressed byte {at}" in lines[0]
