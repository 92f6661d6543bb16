"""Damaged gzip input: every path that reads gzip (the streamed load of text/TSV/CSV, the head read of value type
inference) raises a LoadError naming the file and the compressed byte offset where reading broke, never a raw
zlib.error, EOFError or BadGzipFile."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from ramgrid import load
from ramgrid.load import LoadError
from ramgrid.splits import iter_stream

pytestmark = pytest.mark.timeout(60)

BODY = b"".join(b"key%d\t%d.%d\n" % (i, i * 7919 % 1000, i % 97) for i in range(40_000))


def two_members() -> tuple[bytes, int]:
    """A gzip file of two members (as pigz or `cat a.gz b.gz` make) and the offset of the second member's first
    deflate byte, in the middle of the file."""
    half = BODY.rfind(b"\n", 0, len(BODY) // 2) + 1
    first = gzip.compress(BODY[:half], mtime=0)
    second = gzip.compress(BODY[half:], mtime=0)
    return first + second, len(first) + 10  # 10: a gzip header without optional fields


def offset_in(e: LoadError) -> int:
    m = re.search(r"compressed byte (\d+)", str(e))
    assert m, str(e)
    return int(m.group(1))


def read_stream(p: Path) -> bytes:
    return b"".join(d for d, _ in iter_stream(str(p), 4096))


def test_two_members_and_trailing_zeros_read_whole(tmp_path: Path) -> None:
    data, _ = two_members()
    p = tmp_path / "ok.tsv.gz"
    p.write_bytes(data + b"\0" * 100)  # padding after the last member, as some tape and block tools leave
    assert read_stream(p) == BODY


def test_a_decoder_error_in_the_middle_names_the_file_and_the_exact_byte(tmp_path: Path) -> None:
    data, at = two_members()
    bad = bytearray(data)
    bad[at] = 0xFF  # a deflate block of the reserved type 3: zlib stops right at this byte
    p = tmp_path / "mid.tsv.gz"
    p.write_bytes(bytes(bad))
    with pytest.raises(LoadError) as e:
        read_stream(p)
    assert e.value.path == str(p) and str(e.value).startswith(f"{p}: ")
    assert offset_in(e.value) == at
    assert "invalid block type" in str(e.value)


def test_a_checksum_mismatch_is_reported_where_it_is_found(tmp_path: Path) -> None:
    data = gzip.compress(BODY, mtime=0)
    bad = bytearray(data)
    mid = len(data) // 2
    for i in range(mid, mid + 16):
        bad[i] ^= 0x5A  # still decodes, to the wrong bytes: only the CRC-32 at the end tells
    p = tmp_path / "crc.tsv.gz"
    p.write_bytes(bytes(bad))
    with pytest.raises(LoadError) as e:
        read_stream(p)
    assert e.value.path == str(p)
    assert len(data) - 8 <= offset_in(e.value) < len(data)  # in the member's trailer
    assert "checksum" in str(e.value)


def test_a_truncated_file_names_where_it_ends(tmp_path: Path) -> None:
    data = gzip.compress(BODY, mtime=0)
    p = tmp_path / "cut.tsv.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(LoadError) as e:
        read_stream(p)
    assert e.value.path == str(p)
    assert offset_in(e.value) == len(data) // 2
    assert "truncated" in str(e.value)


def test_inference_reads_gzip_the_same_way(tmp_path: Path) -> None:
    data = gzip.compress(BODY, mtime=0)
    bad = bytearray(data)
    bad[10] = 0xFF  # the first deflate byte: the head read itself breaks
    p = tmp_path / "early.tsv.gz"
    p.write_bytes(bytes(bad))
    with pytest.raises(LoadError) as e:
        load.infer_value_type(p)
    assert e.value.path == str(p) and offset_in(e.value) == 10
    short = gzip.compress(BODY[:2000], mtime=0)
    cut = tmp_path / "cut.tsv.gz"
    cut.write_bytes(short[: len(short) // 2])  # ends before the rows inference wants
    with pytest.raises(LoadError) as e:
        load.infer_value_type(cut)
    assert e.value.path == str(cut) and offset_in(e.value) == len(short) // 2 and "truncated" in str(e.value)
