"""A small pure-Python reference codec for ramgrid's native protocol (docs/protocol-native.md).

Used by the tests only: it is written from the spec independently of the Rust codec, and both are
checked against the shared vectors in tests/vectors/. Messages are plain dicts in the vectors'
JSON form (bytes fields as hex strings under names ending in ``_hex``). Not for production use:
it is neither fast nor defensive beyond what the vectors exercise.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

MAGIC = 0xA7
PROTOCOL_VERSION = 1
HEADER_LEN = 16
FLAG_RESPONSE = 0x01
FLAG_REPLICA = 0x02  # a primary's forward of a PUT or DELETE (spec 7.5)
FLAG_ACK_ONE = 0x04  # a client's PUT or DELETE at ack=one (spec 7.5)

OPCODES = {
    "HELLO": 0x01,
    "PING": 0x02,
    "CREATE_TABLE": 0x10,
    "DROP_TABLE": 0x11,
    "LIST_TABLES": 0x12,
    "DESCRIBE_TABLE": 0x13,
    "CREATE_VERSION": 0x18,
    "SEAL_VERSION": 0x19,
    "SET_CURRENT": 0x1A,
    "DROP_VERSION": 0x1B,
    "SET_SPEC": 0x20,
    "GET_SPEC": 0x21,
    "EXPORT_PARTITION": 0x22,
    "CLUSTER_STATUS": 0x23,
    "RAFT": 0x24,
    "DIGEST": 0x25,
    "RECOVER": 0x26,
    "REPAIR": 0x27,
    "GET": 0x30,
    "PUT": 0x31,
    "DELETE": 0x32,
    "METRICS": 0x50,
}
OPCODE_NAMES = {v: k for k, v in OPCODES.items()}
STATUSES = [
    "OK",
    "WRONG_EPOCH",
    "NOT_OWNER",
    "NO_SUCH_TABLE",
    "NO_SUCH_VERSION",
    "VERSION_SEALED",
    "TABLE_EXISTS",
    "AUTH_REQUIRED",
    "AUTH_FAILED",
    "BAD_REQUEST",
    "OUT_OF_MEMORY",
    "TOO_LARGE",
    "INTERNAL",
    "VERSION_EXISTS",
    "VERSION_NOT_SEALED",
    "UNSUPPORTED_PROTOCOL",
    "REPAIRING",
    "NO_QUORUM",
    "INDETERMINATE",
]
DIGEST_STATES = ["held", "not_held", "copying"]
RECOVER_MODES = {"lead": 1, "join": 2}
KEY_STATUSES = ["OK", "NOT_FOUND", "KEY_TOO_LARGE", "VALUE_TOO_LARGE", "WRONG_TYPE", "OUT_OF_MEMORY"]
VALUE_KINDS = ["bytes", "i64", "f64", "f32vec"]
MAX_NAME_LEN = 255
MAX_VECTOR_DIM = 1 << 16
EMPTY_OK = {
    "PING",
    "CREATE_TABLE",
    "DROP_TABLE",
    "CREATE_VERSION",
    "SEAL_VERSION",
    "SET_CURRENT",
    "DROP_VERSION",
    "REPAIR",
}


class WireError(Exception):
    """A frame could not be parsed or decoded; ``code`` matches the Rust FrameError::code()."""

    def __init__(self, code: str, detail: str = "", needed: int | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.needed = needed


# -- primitives ---------------------------------------------------------------------------------


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.buf) - self.pos:
            raise WireError("truncated", what)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(struct.unpack("<H", self.take(2, what))[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.take(8, what))[0])

    def bytes16(self, what: str) -> bytes:
        return self.take(self.u16(what), what)

    def bytes32(self, what: str) -> bytes:
        return self.take(self.u32(what), what)

    def str16(self, what: str) -> str:
        try:
            return self.bytes16(what).decode("utf-8")
        except UnicodeDecodeError:
            raise WireError("malformed", what) from None

    def name(self) -> str:
        s = self.str16("table name")
        if not s or len(s.encode()) > MAX_NAME_LEN:
            raise WireError("malformed", "table name")
        return s

    def value_type(self) -> dict:
        kind, dim = self.u8("value type"), self.u32("value type dim")
        ok = (kind in (0, 1, 2) and dim == 0) or (kind == 3 and 1 <= dim <= MAX_VECTOR_DIM)
        if not ok:
            raise WireError("malformed", "value type")
        return {"kind": VALUE_KINDS[kind], "dim": dim}

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise WireError("trailing_bytes", str(len(self.buf) - self.pos))


def _u8(v: int) -> bytes:
    return struct.pack("<B", v)


def _u16(v: int) -> bytes:
    return struct.pack("<H", v)


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _b16(b: bytes) -> bytes:
    return _u16(len(b)) + b


def _b32(b: bytes) -> bytes:
    return _u32(len(b)) + b


def _s16(s: str) -> bytes:
    return _b16(s.encode("utf-8"))


def _vt(vt: dict) -> bytes:
    return _u8(VALUE_KINDS.index(vt["kind"])) + _u32(vt["dim"])


def _width(vt: dict) -> int | None:
    widths: dict[str, int | None] = {"bytes": None, "i64": 8, "f64": 8, "f32vec": 4 * int(vt["dim"])}
    return widths[vt["kind"]]


def _value_bytes(vt: dict, v: Any) -> bytes:
    kind = vt["kind"]
    if kind == "bytes":
        return bytes.fromhex(v)
    if kind == "i64":
        return struct.pack("<q", v)
    if kind == "f64":
        return struct.pack("<d", v)
    return struct.pack(f"<{len(v)}f", *v)


def _value_json(vt: dict, b: bytes) -> Any:
    kind = vt["kind"]
    if kind == "bytes":
        return b.hex()
    if kind == "i64":
        return struct.unpack("<q", b)[0]
    if kind == "f64":
        return struct.unpack("<d", b)[0]
    return list(struct.unpack(f"<{len(b) // 4}f", b))


# -- frames -------------------------------------------------------------------------------------


def encode_frame(opcode: str, request_id: int, body: bytes, response: bool = False) -> bytes:
    flags = FLAG_RESPONSE if response else 0
    return struct.pack("<BBBBIQ", MAGIC, PROTOCOL_VERSION, OPCODES[opcode], flags, len(body), request_id) + body


def parse_frame(buf: bytes, max_body: int) -> tuple[str, bool, int, bytes, int]:
    """Returns (opcode, is_response, request_id, body, bytes used) or raises WireError."""
    if buf and buf[0] != MAGIC:
        raise WireError("bad_magic", hex(buf[0]))
    if len(buf) < HEADER_LEN:
        raise WireError("incomplete", needed=HEADER_LEN)
    _, version, op, flags, length, rid = struct.unpack("<BBBBIQ", buf[:HEADER_LEN])
    if version != PROTOCOL_VERSION:
        raise WireError("unsupported_version", str(version))
    if op not in OPCODE_NAMES:
        raise WireError("unknown_opcode", hex(op))
    write = OPCODE_NAMES[op] in ("PUT", "DELETE") and not flags & FLAG_RESPONSE
    if flags & ~(FLAG_RESPONSE | FLAG_REPLICA | FLAG_ACK_ONE) or (not write and flags & (FLAG_REPLICA | FLAG_ACK_ONE)):
        raise WireError("bad_flags", hex(flags))
    if length > max_body:
        raise WireError("body_too_large", str(length))
    total = HEADER_LEN + length
    if len(buf) < total:
        raise WireError("incomplete", needed=total)
    return OPCODE_NAMES[op], bool(flags & FLAG_RESPONSE), rid, bytes(buf[HEADER_LEN:total]), total


# -- bodies -------------------------------------------------------------------------------------


DURABILITIES = ("memory", "snapshot", "log")


def _durability(r: _Reader) -> str:
    b = r.u8("durability")
    if b >= len(DURABILITIES):
        raise WireError("malformed", "durability")
    return DURABILITIES[b]


def _table_bytes(t: dict) -> bytes:
    out = _s16(t["name"]) + _u32(t["partitions"]) + _u32(t["replication"]) + _vt(t["value_type"])
    out += _u8(DURABILITIES.index(t["durability"])) + _u64(t["incarnation"])
    out += _u32(t["current_version"]) + _u32(t["high_water"]) + _u32(len(t["versions"]))
    for v in t["versions"]:
        out += _u32(v["number"]) + _u8(1 if v["sealed"] else 0) + _u64(v["items"]) + _u64(v["bytes"])
    return out


def _read_table(r: _Reader) -> dict:
    t = {
        "name": r.name(),
        "partitions": r.u32("partitions"),
        "replication": r.u32("replication"),
        "value_type": r.value_type(),
        "durability": _durability(r),
        "incarnation": r.u64("incarnation"),
        "current_version": r.u32("current version"),
        "high_water": r.u32("high water"),
    }
    versions = []
    for _ in range(r.u32("version count")):
        number = r.u32("version number")
        sealed = r.u8("sealed")
        if sealed > 1:
            raise WireError("malformed", "sealed")
        versions.append({"number": number, "sealed": bool(sealed), "items": r.u64("items"), "bytes": r.u64("bytes")})
    t["versions"] = versions
    return t


def _batch_head(f: dict) -> bytes:
    return _s16(f["table"]) + _u32(f["version"]) + _u64(f["epoch"]) + _u64(f["incarnation"])


def encode_request_body(opcode: str, f: dict) -> bytes:
    if opcode == "HELLO":
        return _u8(f["protocol_version"]) + _b16(bytes.fromhex(f["token_hex"])) + _s16(f["client_name"])
    if opcode in ("PING", "LIST_TABLES", "GET_SPEC", "CLUSTER_STATUS", "METRICS"):
        return b""
    if opcode == "EXPORT_PARTITION":
        out = _s16(f["table"]) + _u64(f["incarnation"]) + _u32(f["version"]) + _u32(f["partition"])
        return out + _u64(f["epoch"]) + _u64(f["export_id"]) + _u64(f["offset"]) + _u32(f["max_len"])
    if opcode == "CREATE_TABLE":
        head = _s16(f["name"]) + _u32(f["partitions"]) + _u32(f["replication"]) + _vt(f["value_type"])
        return head + _u8(DURABILITIES.index(f["durability"])) + _u64(f["incarnation"])
    if opcode in ("DROP_TABLE", "DESCRIBE_TABLE"):
        return _s16(f["name"])
    if opcode in ("CREATE_VERSION", "SEAL_VERSION", "SET_CURRENT", "DROP_VERSION"):
        out = _s16(f["table"]) + _u32(f["version"])
        return out + _u64(f["creator"]) if f.get("creator") else out
    if opcode == "SET_SPEC":
        return _b32(bytes.fromhex(f["spec_hex"]))
    if opcode == "RAFT":
        return _b32(f["message"].encode())
    if opcode == "RECOVER":
        return _u8(RECOVER_MODES[f["mode"]]) + _u64(f["generation"])
    if opcode in ("DIGEST", "REPAIR"):
        parts = f["partitions"]
        return _s16(f["table"]) + _u32(f["version"]) + _u32(len(parts)) + b"".join(_u32(p) for p in parts)
    if opcode in ("GET", "DELETE"):
        out = _batch_head(f) + _u32(len(f["groups"]))
        for g in f["groups"]:
            keys = [bytes.fromhex(k) for k in g["keys_hex"]]
            out += _u32(g["partition"]) + _u32(len(keys)) + b"".join(_b16(k) for k in keys)
        return out
    if opcode == "PUT":
        vt = f["value_type"]
        out = _batch_head(f) + _vt(vt) + _u32(len(f["groups"]))
        for g in f["groups"]:
            keys = [bytes.fromhex(k) for k in g["keys_hex"]]
            out += _u32(g["partition"]) + _u32(len(keys)) + b"".join(_b16(k) for k in keys)
            for v in g["values"]:
                b = _value_bytes(vt, v)
                out += b if _width(vt) is not None else _b32(b)
        return out
    raise ValueError(opcode)


def decode_request_body(opcode: str, body: bytes) -> dict:
    r = _Reader(body)
    f: dict
    if opcode == "HELLO":
        f = {
            "protocol_version": r.u8("protocol version"),
            "token_hex": r.bytes16("token").hex(),
            "client_name": r.str16("client name"),
        }
    elif opcode in ("PING", "LIST_TABLES", "GET_SPEC", "CLUSTER_STATUS", "METRICS"):
        f = {}
    elif opcode == "EXPORT_PARTITION":
        f = {
            "table": r.name(),
            "incarnation": r.u64("incarnation"),
            "version": r.u32("version"),
            "partition": r.u32("partition"),
            "epoch": r.u64("epoch"),
            "export_id": r.u64("export id"),
            "offset": r.u64("offset"),
            "max_len": r.u32("max len"),
        }
    elif opcode == "CREATE_TABLE":
        f = {
            "name": r.name(),
            "partitions": r.u32("partitions"),
            "replication": r.u32("replication"),
            "value_type": r.value_type(),
            "durability": _durability(r),
            "incarnation": r.u64("incarnation"),
        }
    elif opcode in ("DROP_TABLE", "DESCRIBE_TABLE"):
        f = {"name": r.name()}
    elif opcode in ("CREATE_VERSION", "SEAL_VERSION", "SET_CURRENT", "DROP_VERSION"):
        f = {"table": r.name(), "version": r.u32("version")}
        if r.pos < len(r.buf):
            f["creator"] = r.u64("creator")
            if f["creator"] == 0:  # non-zero when present (6.3): an explicit 0 would re-encode without it
                raise WireError("malformed", "creator 0")
    elif opcode == "SET_SPEC":
        f = {"spec_hex": r.bytes32("spec").hex()}
    elif opcode == "RAFT":
        try:
            f = {"message": r.bytes32("raft message").decode()}
        except UnicodeDecodeError:
            raise WireError("malformed", "raft message") from None
    elif opcode == "RECOVER":
        mode = r.u8("recover mode")
        names = {v: k for k, v in RECOVER_MODES.items()}
        if mode not in names:
            raise WireError("malformed", "recover mode")
        f = {"mode": names[mode], "generation": r.u64("generation")}
    elif opcode in ("DIGEST", "REPAIR"):
        f = {"table": r.name(), "version": r.u32("version")}
        f["partitions"] = [r.u32("partition") for _ in range(r.u32("partition count"))]
    elif opcode in ("GET", "DELETE", "PUT"):
        f = {
            "table": r.name(),
            "version": r.u32("version"),
            "epoch": r.u64("epoch"),
            "incarnation": r.u64("incarnation"),
        }
        vt = r.value_type() if opcode == "PUT" else None
        if vt is not None:
            f["value_type"] = vt
        groups = []
        for _ in range(r.u32("group count")):
            g: dict = {"partition": r.u32("partition")}
            n = r.u32("key count")
            g["keys_hex"] = [r.bytes16("key").hex() for _ in range(n)]
            if vt is not None:
                w = _width(vt)
                g["values"] = [
                    _value_json(vt, r.take(w, "values") if w is not None else r.bytes32("value")) for _ in range(n)
                ]
            groups.append(g)
        f["groups"] = groups
    else:
        raise ValueError(opcode)
    r.finish()
    return f


def encode_response_body(opcode: str, f: dict) -> bytes:
    status = f["status"]
    if status != "OK":
        out = _u8(STATUSES.index(status))
        if status == "WRONG_EPOCH":
            out += _u64(f["server_epoch"])
        if status in ("NOT_OWNER", "REPAIRING"):
            out += _u32(len(f["partitions"])) + b"".join(_u32(p) for p in f["partitions"])
        return out + _s16(f["message"])
    out = _u8(0)
    if opcode == "HELLO":
        return out + _u8(f["protocol_version"]) + _s16(f["server_id"]) + _u64(f["epoch"]) + _u32(f["max_body"])
    if opcode in EMPTY_OK:
        return out
    if opcode == "LIST_TABLES":
        return out + _u32(len(f["tables"])) + b"".join(_table_bytes(t) for t in f["tables"])
    if opcode == "DESCRIBE_TABLE":
        return out + _table_bytes(f["table"])
    if opcode == "SET_SPEC":
        return out + _u64(f["epoch"])
    if opcode == "GET_SPEC":
        return out + _u64(f["epoch"]) + _b32(bytes.fromhex(f["spec_hex"]))
    if opcode == "EXPORT_PARTITION":
        head = _u64(f["export_id"]) + _u64(f["total"]) + _u8(int(f["sealed"]))
        return out + head + _b32(bytes.fromhex(f["chunk_hex"]))
    if opcode in ("CLUSTER_STATUS", "RECOVER", "METRICS"):
        return out + _b32(f["text"].encode())
    if opcode == "RAFT":
        return out + _b32(f["message"].encode())
    if opcode == "DIGEST":
        out += _u32(len(f["digests"]))
        for d in f["digests"]:
            out += _u32(d["partition"]) + _u8(DIGEST_STATES.index(d["state"])) + _u64(d["items"]) + _u64(d["digest"])
        return out
    if opcode == "GET":
        vt = f["value_type"]
        w = _width(vt)
        statuses = f["statuses"]
        out += _u32(f["version"]) + _vt(vt) + _u32(len(statuses)) + bytes(KEY_STATUSES.index(s) for s in statuses)
        for s, v in zip(statuses, f["values"]):
            if s == "OK":
                b = _value_bytes(vt, v)
                out += b if w is not None else _b32(b)
            elif w is not None:
                out += bytes(w)  # misses hold zeros in packed numeric arrays
        return out
    if opcode in ("PUT", "DELETE"):
        return out + _u32(len(f["statuses"])) + bytes(KEY_STATUSES.index(s) for s in f["statuses"])
    raise ValueError(opcode)


def decode_response_body(opcode: str, body: bytes) -> dict:
    r = _Reader(body)
    code = r.u8("status")
    if code >= len(STATUSES):
        raise WireError("malformed", "status")
    f: dict = {"status": STATUSES[code]}
    if code != 0:
        if f["status"] == "WRONG_EPOCH":
            f["server_epoch"] = r.u64("server epoch")
        if f["status"] in ("NOT_OWNER", "REPAIRING"):
            f["partitions"] = [r.u32("partition") for _ in range(r.u32("partition count"))]
        f["message"] = r.str16("message")
    elif opcode == "HELLO":
        f.update(
            protocol_version=r.u8("protocol version"),
            server_id=r.str16("server id"),
            epoch=r.u64("epoch"),
            max_body=r.u32("max body"),
        )
    elif opcode in EMPTY_OK:
        pass
    elif opcode == "LIST_TABLES":
        f["tables"] = [_read_table(r) for _ in range(r.u32("table count"))]
    elif opcode == "DESCRIBE_TABLE":
        f["table"] = _read_table(r)
    elif opcode == "SET_SPEC":
        f["epoch"] = r.u64("epoch")
    elif opcode == "GET_SPEC":
        f["epoch"] = r.u64("epoch")
        f["spec_hex"] = r.bytes32("spec").hex()
    elif opcode == "EXPORT_PARTITION":
        f["export_id"] = r.u64("export id")
        f["total"] = r.u64("total")
        sealed = r.u8("sealed")
        if sealed > 1:
            raise WireError("malformed", "sealed")
        f["sealed"] = bool(sealed)
        f["chunk_hex"] = r.bytes32("chunk").hex()
    elif opcode in ("CLUSTER_STATUS", "RECOVER", "METRICS"):
        what = "metrics" if opcode == "METRICS" else "status"
        try:
            f["text"] = r.bytes32(what).decode()
        except UnicodeDecodeError:
            raise WireError("malformed", what) from None
    elif opcode == "RAFT":
        try:
            f["message"] = r.bytes32("raft reply").decode()
        except UnicodeDecodeError:
            raise WireError("malformed", "raft reply") from None
    elif opcode == "DIGEST":
        f["digests"] = []
        for _ in range(r.u32("digest count")):
            p, state = r.u32("partition"), r.u8("state")
            if state >= len(DIGEST_STATES):
                raise WireError("malformed", "digest state")
            items = r.u64("items")
            f["digests"].append(
                {"digest": r.u64("digest"), "items": items, "partition": p, "state": DIGEST_STATES[state]}
            )
    elif opcode == "GET":
        f["version"] = r.u32("version")
        vt = f["value_type"] = r.value_type()
        raw = r.take(r.u32("key count"), "key statuses")
        if any(b >= len(KEY_STATUSES) for b in raw):
            raise WireError("malformed", "key status")
        f["statuses"] = [KEY_STATUSES[b] for b in raw]
        w = _width(vt)
        values: list = []
        for b in raw:
            if w is not None:
                v = r.take(w, "values")
                values.append(_value_json(vt, v) if b == 0 else None)
            else:
                values.append(r.bytes32("value").hex() if b == 0 else None)
        f["values"] = values
    elif opcode in ("PUT", "DELETE"):
        raw = r.take(r.u32("key count"), "key statuses")
        if any(b >= len(KEY_STATUSES) for b in raw):
            raise WireError("malformed", "key status")
        f["statuses"] = [KEY_STATUSES[b] for b in raw]
    else:
        raise ValueError(opcode)
    r.finish()
    return f


def encode_message(opcode: str, request_id: int, fields: dict, response: bool = False) -> bytes:
    """A whole frame from a message in the vectors' JSON form."""
    body = encode_response_body(opcode, fields) if response else encode_request_body(opcode, fields)
    return encode_frame(opcode, request_id, body, response)


def decode_message(buf: bytes, max_body: int = 1 << 24) -> tuple[str, bool, int, dict]:
    """(opcode, is_response, request_id, fields) of the single frame in ``buf``."""
    opcode, response, rid, body, used = parse_frame(buf, max_body)
    if used != len(buf):
        raise WireError("trailing_bytes", "after the frame")
    decode: Callable[[str, bytes], dict] = decode_response_body if response else decode_request_body
    return opcode, response, rid, decode(opcode, body)


# -- cluster ------------------------------------------------------------------------------------


def _xxh3_64(data: bytes) -> int:
    import xxhash  # optional: only the cluster functions need it

    return xxhash.xxh3_64_intdigest(data, seed=0)


def canonical_servers(servers: list[str]) -> str:
    return "".join(f"server {s}\n" for s in servers)


def parse_spec_servers(text: str) -> list[str]:
    """The server addresses of a spec's text form, in order (validation is the Rust parser's job)."""
    servers = []
    for line in text.splitlines():
        words = line.split()
        if words and not words[0].startswith("#") and words[0] == "server":
            servers.append(words[1])
    return servers


def epoch_of(servers: list[str]) -> int:
    return _xxh3_64(canonical_servers(servers).encode()) or 1


def partition_of(key: bytes, partitions: int) -> int:
    return (_xxh3_64(key) * max(partitions, 1)) >> 64


def rendezvous_score(server: str, partition: int) -> int:
    return _xxh3_64(server.encode() + b"\xff" + _u32(partition))


def partition_map(servers: list[str], partitions: int, replication: int) -> list[list[int]]:
    """Replica server indices for every partition, primary first (see the spec's algorithm)."""
    partitions = max(partitions, 1)
    n = len(servers)
    if n == 0:
        return [[] for _ in range(partitions)]
    r = min(max(replication, 1), n)
    prefs = []
    for p in range(partitions):
        scored = sorted(range(n), key=lambda i: (-rendezvous_score(servers[i], p), i))
        prefs.append(scored)
    cap = -(-partitions // n)
    replicas: list[list[int]] = [[] for _ in range(partitions)]
    for _rank in range(r):
        load = [0] * n
        for p in range(partitions):
            free = [s for s in prefs[p] if s not in replicas[p]]
            pick = next((s for s in free if load[s] < cap), free[0])
            load[pick] += 1
            replicas[p].append(pick)
    return replicas
