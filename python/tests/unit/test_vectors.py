"""The shared native-protocol vectors (tests/vectors/*.json) checked against the pure-Python reference codec.

crates/ramgrid-proto/tests/vectors.rs checks the same files against the Rust codec, so the two implementations,
written separately from docs/protocol-native.md, agree byte for byte. Cluster vectors (partition_of, epochs,
partition maps) need the `xxhash` package and are skipped, saying so, without it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[3]
VECTORS = ROOT / "tests" / "vectors"


def _load_wire() -> Any:
    # Loaded by path so that this test needs neither the built native module nor an installed package.
    spec = importlib.util.spec_from_file_location("ramgrid_wire_reference", ROOT / "python" / "ramgrid" / "_wire.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wire = _load_wire()
NATIVE = json.loads((VECTORS / "native.json").read_text())
CLUSTER = json.loads((VECTORS / "cluster.json").read_text())

try:
    import xxhash  # noqa: F401

    HAVE_XXHASH = True
except ImportError:
    HAVE_XXHASH = False
needs_xxhash = pytest.mark.skipif(not HAVE_XXHASH, reason="the xxhash package is not installed (pip install xxhash)")


def same(a: Any, b: Any) -> bool:
    """JSON equality where numbers compare by value, and floats exactly (f32 values are widened, not rounded)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b and not (isinstance(a, float) and math.isnan(a))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("v", NATIVE["frames"], ids=[v["name"] for v in NATIVE["frames"]])
def test_frame_vector(v: dict) -> None:
    encoded = wire.encode_message(v["opcode"], v["request_id"], v["fields"], v["response"])
    assert encoded.hex() == v["hex"], "encode(fields) != hex"
    opcode, response, rid, fields = wire.decode_message(bytes.fromhex(v["hex"]))
    assert (opcode, response, rid) == (v["opcode"], v["response"], v["request_id"])
    assert same(fields, v["fields"]), f"decode(hex) != fields: {fields}"


def test_every_opcode_has_request_and_response_vectors() -> None:
    seen = {(v["opcode"], v["response"]) for v in NATIVE["frames"]}
    missing = {(op, r) for op in wire.OPCODES for r in (False, True)} - seen
    assert not missing


@pytest.mark.parametrize("v", NATIVE["bad_frames"], ids=[v["name"] for v in NATIVE["bad_frames"]])
def test_bad_frame_vector(v: dict) -> None:
    buf = bytes.fromhex(v["hex"])
    with pytest.raises(wire.WireError) as err:
        opcode, response, _rid, body, _used = wire.parse_frame(buf, v["max_body"])
        assert v["stage"] != "frame", "parsed a frame that should have been refused"
        if v["stage"] == "request":
            if response:
                raise wire.WireError("malformed", "response flag on a request")
            wire.decode_request_body(opcode, body)
        else:
            wire.decode_response_body(opcode, body)
    assert err.value.code == v["error"]
    if "needed" in v:
        assert err.value.needed == v["needed"]


@needs_xxhash
def test_partition_of_vectors() -> None:
    for v in CLUSTER["partition_of"]:
        assert wire.partition_of(bytes.fromhex(v["key_hex"]), v["partitions"]) == v["partition"], v


@needs_xxhash
def test_epoch_vectors() -> None:
    for v in CLUSTER["epochs"]:
        servers = wire.parse_spec_servers(v["spec"])
        assert wire.canonical_servers(servers) == v["canonical"]
        assert wire.epoch_of(servers) == v["epoch"], v


@needs_xxhash
def test_rendezvous_score_vectors() -> None:
    for v in CLUSTER["rendezvous_scores"]:
        assert wire.rendezvous_score(v["server"], v["partition"]) == v["score"], v


@needs_xxhash
def test_partition_map_vectors() -> None:
    for v in CLUSTER["partition_maps"]:
        assert wire.partition_map(v["servers"], v["partitions"], v["replication"]) == v["replicas"], v["servers"]


def test_round_trip_of_a_large_numeric_get_reply() -> None:
    statuses = ["OK" if i % 3 else "NOT_FOUND" for i in range(1000)]
    values = [float(i) / 4 if s == "OK" else None for i, s in enumerate(statuses)]
    fields = {
        "status": "OK",
        "version": 7,
        "value_type": {"kind": "f64", "dim": 0},
        "statuses": statuses,
        "values": values,
    }
    frame = wire.encode_message("GET", 99, fields, response=True)
    # 16 header + 1 status + 4 version + 5 value type + 4 count + 1000 statuses + 8000 packed values
    assert len(frame) == 16 + 1 + 4 + 5 + 4 + 1000 + 8000
    assert wire.decode_message(frame) == ("GET", True, 99, fields)
