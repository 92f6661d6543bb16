#!/usr/bin/env python3
"""Runs the conformance transcripts in this directory against a memcached-protocol server.

    python tests/conformance/run.py HOST:PORT [--include-ramgrid-only] [FILE ...] [-k SUBSTRING]

The transcript format is described in README.md next to this file; the Rust runner
(crates/ramgrid-server/tests/conformance.rs) implements the same format and must stay in step.
The server is flushed (`flush_all`) before each file, so point this at a scratch server.
Exits 0 when every selected case passed, 1 otherwise, 2 on a malformed transcript.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
# A read that sees no byte for this long fails the case (so a hang fails instead of blocking).
TIMEOUT_S = 2.0
# The most one reply may take in all (big values arrive in many reads).
EXCHANGE_DEADLINE_S = 10.0
# After this many cases in a row fail by timing out, the rest of the file is skipped.
MAX_HUNG_IN_A_ROW = 3
# A pause between the writes of a split request (`~` line), so they reach the server as separate reads.
SPLIT_PAUSE_S = 0.05
KNOWN_TAGS = {"ramgrid-only", "close"}
# Sent after every case that does not end in [close]; see run_case.
SENTINEL = b"version\r\nmn\r\n"
PLACEHOLDER_KINDS = {"num", "int", "cas", "any", "opt_error"}
# What <opt_error> accepts before the server closes: nothing, or one error line.
OPT_ERROR_RE = re.compile(rb"((CLIENT_|SERVER_)?ERROR[^\r\n]*\r\n)?")


class TranscriptError(Exception):
    """A transcript file that does not follow the format."""


# --- parsing -------------------------------------------------------------------------------------


@dataclass
class Lit:
    data: bytes


@dataclass
class Hole:
    """A placeholder in an expected reply; `name` captures the matched bytes for later requests."""

    kind: str
    name: str | None


@dataclass
class Var:
    """A reference to a captured value inside a request."""

    name: str


@dataclass
class Exchange:
    writes: list[list[Lit | Var]] = field(default_factory=lambda: [[]])
    expect: list[Lit | Hole] = field(default_factory=list)


@dataclass
class Case:
    file: str
    line: int
    name: str
    tags: set[str]
    exchanges: list[Exchange] = field(default_factory=list)


TOKEN_RE = re.compile(r"<([a-z_][a-z0-9_]*)(?::([a-z_][a-z0-9_]*))?>")


def unescape(text: str, where: str) -> bytes:
    """Decodes the escapes of a transcript line: \\r \\n \\t \\0 \\\\ \\xNN and {{TEXT*N}} repeats."""
    out = bytearray()
    i = 0
    raw = text.encode("utf-8")
    while i < len(raw):
        c = raw[i : i + 1]
        if c == b"\\":
            nxt = raw[i + 1 : i + 2]
            simple = {b"r": b"\r", b"n": b"\n", b"t": b"\t", b"0": b"\0", b"\\": b"\\", b"{": b"{"}
            if nxt in simple:
                out += simple[nxt]
                i += 2
            elif nxt == b"x":
                hexd = raw[i + 2 : i + 4]
                if len(hexd) != 2 or not re.fullmatch(rb"[0-9a-fA-F]{2}", hexd):
                    raise TranscriptError(f"{where}: bad \\x escape")
                out.append(int(hexd, 16))
                i += 4
            else:
                raise TranscriptError(f"{where}: unknown escape \\{nxt.decode(errors='replace')}")
        elif raw.startswith(b"{{", i):
            end = raw.find(b"}}", i)
            if end < 0:
                raise TranscriptError(f"{where}: unterminated {{{{")
            body = raw[i + 2 : end]
            star = body.rfind(b"*")
            if star < 0 or not body[star + 1 :].isdigit():
                raise TranscriptError(f"{where}: repeat must be {{{{TEXT*COUNT}}}}")
            out += unescape(body[:star].decode("utf-8"), where) * int(body[star + 1 :])
            i = end + 2
        else:
            out += c
            i += 1
    return bytes(out)


def split_tokens(text: str, where: str, *, expected: bool) -> list:
    """Splits a line into literal bytes and <placeholders> (expected side) or <variables> (requests)."""
    parts: list = []
    pos = 0
    for m in TOKEN_RE.finditer(text):
        if m.start() > pos:
            parts.append(Lit(unescape(text[pos : m.start()], where)))
        kind, name = m.group(1), m.group(2)
        if expected and kind in PLACEHOLDER_KINDS:
            parts.append(Hole(kind, name))
        elif expected and name is None:
            # A value captured earlier in the case: the reply must repeat it exactly.
            parts.append(Var(kind))
        elif expected:
            raise TranscriptError(f"{where}: unknown placeholder <{kind}:{name}>")
        else:
            if name is not None:
                raise TranscriptError(f"{where}: captures belong on '<' lines")
            parts.append(Var(kind))
        pos = m.end()
    if pos < len(text):
        parts.append(Lit(unescape(text[pos:], where)))
    return parts


def parse_file(path: Path) -> list[Case]:
    cases: list[Case] = []
    case: Case | None = None
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{path.name}:{lineno}"
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("==="):
            header = line[3:].strip()
            name, tags = header, set()
            while m := re.search(r"\s*\[([^\]]+)\]$", name):
                tags.add(m.group(1))
                name = name[: m.start()]
            unknown = tags - KNOWN_TAGS
            if unknown or not name:
                raise TranscriptError(f"{where}: bad case header (unknown tags {sorted(unknown)})")
            if any(c.name == name for c in cases):
                raise TranscriptError(f"{where}: duplicate case name {name!r}")
            case = Case(path.name, lineno, name, tags)
            cases.append(case)
            continue
        if case is None:
            raise TranscriptError(f"{where}: content before the first === case header")
        if line.startswith("> ") or line == ">":
            if not case.exchanges or case.exchanges[-1].expect:
                case.exchanges.append(Exchange())
            case.exchanges[-1].writes[-1].extend(split_tokens(line[2:], where, expected=False))
        elif line == "~":
            if not case.exchanges or case.exchanges[-1].expect:
                raise TranscriptError(f"{where}: '~' must sit between two '>' lines")
            case.exchanges[-1].writes.append([])
        elif line.startswith("< ") or line == "<":
            if not case.exchanges:
                raise TranscriptError(f"{where}: '<' before any '>'")
            case.exchanges[-1].expect.extend(split_tokens(line[2:], where, expected=True))
        else:
            raise TranscriptError(f"{where}: unrecognised line {line!r}")
    for c in cases:
        seen: set[str] = set()
        for ex in c.exchanges:
            for part in [p for w in ex.writes for p in w] + ex.expect:
                if isinstance(part, Var) and part.name not in seen:
                    raise TranscriptError(f"{c.file}:{c.line}: <{part.name}> used before it is captured")
                if isinstance(part, Hole) and part.name:
                    seen.add(part.name)
        if not c.exchanges:
            raise TranscriptError(f"{c.file}:{c.line}: case {c.name!r} sends nothing")
        for i, ex in enumerate(c.exchanges):
            last = i == len(c.exchanges) - 1
            for j, part in enumerate(ex.expect):
                at_end = last and j == len(ex.expect) - 1 and "close" in c.tags
                if isinstance(part, Hole) and part.kind == "opt_error" and not at_end:
                    raise TranscriptError(f"{c.file}:{c.line}: <opt_error> must end a [close] case")
            if ex.expect and isinstance(ex.expect[-1], Hole) and ex.expect[-1].kind != "opt_error":
                raise TranscriptError(f"{c.file}:{c.line}: a reply may not end in a placeholder")
    return cases


# --- matching ------------------------------------------------------------------------------------


SENTINEL_REPLY: list = [Lit(b"VERSION "), Hole("any", None), Lit(b"\r\nMN\r\n")]


def hole_accepts(kind: str, byte: int, first: bool) -> bool:
    if kind == "any":
        return byte not in b" \r\n"
    if kind == "int" and first and byte == ord("-"):
        return True
    return ord("0") <= byte <= ord("9")


def match(expect: list, buf: bytes, known: dict[str, bytes]) -> tuple[str, int, dict[str, bytes]]:
    """Matches `buf` against an expected reply.

    Returns ("match", consumed, captures), ("more", len, captures) when `buf` is a proper prefix of
    something that could match, or ("mismatch", offset_of_first_bad_byte, captures).
    A placeholder matches greedily (it is always followed by a literal that cannot extend it).
    """
    pos = 0
    caps: dict[str, bytes] = {}
    for part in expect:
        if isinstance(part, (Lit, Var)):
            data = part.data if isinstance(part, Lit) else caps.get(part.name, known.get(part.name))
            assert data is not None, "parse_file checks that captures come before their uses"
            avail = buf[pos : pos + len(data)]
            for i, b in enumerate(avail):
                if b != data[i]:
                    return "mismatch", pos + i, caps
            if len(avail) < len(data):
                return "more", len(buf), caps
            pos += len(data)
        else:
            start = pos
            while pos < len(buf) and hole_accepts(part.kind, buf[pos], pos == start):
                pos += 1
            if pos == len(buf):
                return "more", len(buf), caps
            if pos == start or (part.kind == "int" and buf[start:pos] == b"-"):
                return "mismatch", pos, caps
            if part.name:
                caps[part.name] = buf[start:pos]
    return "match", pos, caps


def render_expect(expect: list, known: dict[str, bytes]) -> bytes:
    out = b""
    for p in expect:
        if isinstance(p, Lit):
            out += p.data
        elif isinstance(p, Var):
            out += known.get(p.name, f"<{p.name}>".encode())
        else:
            out += f"<{p.kind}>".encode()
    return out


# --- running -------------------------------------------------------------------------------------


class CaseFailure(Exception):
    pass


def show(data: bytes, limit: int = 400) -> str:
    """Bytes as a transcript-style string, shortened in the middle when long."""
    s = "".join({13: "\\r", 10: "\\n", 92: "\\\\"}.get(b, chr(b) if 32 <= b < 127 else f"\\x{b:02x}") for b in data)
    if len(s) > limit:
        s = s[: limit // 2] + f" ...({len(s) - limit} chars)... " + s[-limit // 2 :]
    return s


def diff_report(expect: list, known: dict[str, bytes], got: bytes, status: str, at: int) -> str:
    want = render_expect(expect, known)
    lo = max(0, at - 40)
    lines = [
        f"  {status} at byte {at}",
        f"  expected: {show(want)}",
        f"  received: {show(got)}",
        f"  near byte {at}: expected {show(want[lo : at + 40], 200)}",
        f"               received {show(got[lo : at + 40], 200)}",
    ]
    return "\n".join(lines)


class Conn:
    def __init__(self, addr: tuple[str, int]):
        self.sock = socket.create_connection(addr, timeout=TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            # The server may close while we still write (e.g. garbage it refuses); what it sent
            # before closing is still checked by the reads that follow.
            pass

    def fill(self) -> bool:
        """Reads once more; False on EOF or reset. Raises socket.timeout after TIMEOUT_S of silence."""
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            return False
        self.buf += chunk
        return bool(chunk)

    def expect(self, expect: list, known: dict[str, bytes]) -> dict[str, bytes]:
        deadline = time.monotonic() + EXCHANGE_DEADLINE_S
        while True:
            status, at, caps = match(expect, self.buf, known)
            if status == "match":
                self.buf = self.buf[at:]
                return caps
            if status == "mismatch":
                raise CaseFailure(diff_report(expect, known, self.buf, "mismatch", at))
            if time.monotonic() > deadline:
                raise CaseFailure(diff_report(expect, known, self.buf, "timed out waiting", at))
            try:
                if not self.fill():
                    raise CaseFailure(diff_report(expect, known, self.buf, "connection closed", at))
            except socket.timeout:
                raise CaseFailure(diff_report(expect, known, self.buf, "timed out waiting", at)) from None

    def expect_close(self, allow_error_line: bool) -> None:
        try:
            while self.fill():
                pass
        except socket.timeout:
            raise CaseFailure(
                f"  expected the server to close the connection; it stayed open (unread: {show(self.buf)})"
            ) from None
        if allow_error_line and OPT_ERROR_RE.fullmatch(self.buf):
            return
        if self.buf:
            raise CaseFailure(f"  unexpected bytes before close: {show(self.buf)}")

    def close(self) -> None:
        self.sock.close()


def build(parts: list, vars_: dict[str, bytes], case: Case) -> bytes:
    out = bytearray()
    for p in parts:
        if isinstance(p, Lit):
            out += p.data
        elif p.name in vars_:
            out += vars_[p.name]
        else:
            raise TranscriptError(f"{case.file}:{case.line}: <{p.name}> used before it was captured")
    return bytes(out)


def run_case(addr: tuple[str, int], case: Case) -> None:
    conn = Conn(addr)
    try:
        vars_: dict[str, bytes] = {}
        opt_error = False
        for ex in case.exchanges:
            for i, w in enumerate(ex.writes):
                if i:
                    time.sleep(SPLIT_PAUSE_S)
                conn.send(build(w, vars_, case))
            expect = ex.expect
            if expect and isinstance(expect[-1], Hole) and expect[-1].kind == "opt_error":
                expect, opt_error = expect[:-1], True
            if expect:
                vars_.update(conn.expect(expect, vars_))
        if "close" in case.tags:
            conn.expect_close(opt_error)
        else:
            # The sentinel proves nothing stray was sent (e.g. a reply to a noreply command) and
            # that the connection is still usable. Two different replies, so that a stray copy of
            # either one cannot pass for the sentinel.
            if conn.buf:
                raise CaseFailure(f"  unexpected bytes after the last reply: {show(conn.buf)}")
            conn.send(SENTINEL)
            try:
                conn.expect(SENTINEL_REPLY, {})
            except CaseFailure as e:
                raise CaseFailure(f"  after the last reply the connection must still answer version+mn:\n{e}") from None
    finally:
        conn.close()


def flush(addr: tuple[str, int]) -> None:
    conn = Conn(addr)
    try:
        conn.send(b"flush_all\r\n")
        conn.expect([Lit(b"OK\r\n")], {})
    finally:
        conn.close()


def check_stats(addr: tuple[str, int]) -> None:
    """`stats` is not byte-stable, so only its shape is checked: STAT lines, then END."""
    conn = Conn(addr)
    try:
        conn.send(b"stats\r\n")
        while not conn.buf.endswith(b"END\r\n"):
            if not conn.fill():
                raise CaseFailure("  connection closed during stats")
        lines = conn.buf.split(b"\r\n")[:-2]
        if not lines or not all(re.fullmatch(rb"STAT [^ ]+ [^\r\n]*", ln) for ln in lines):
            raise CaseFailure(f"  stats reply is not a list of STAT lines: {show(conn.buf)}")
        names = {ln.split(b" ")[1] for ln in lines}
        for required in (b"pid", b"uptime", b"curr_connections", b"get_hits", b"get_misses", b"cmd_get"):
            if required not in names:
                raise CaseFailure(f"  stats lacks STAT {required.decode()}")
    finally:
        conn.close()


def transcript_files() -> list[Path]:
    return sorted(HERE.glob("*.txt"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("addr", help="HOST:PORT of the server under test (it gets flushed)")
    ap.add_argument("files", nargs="*", help="transcript files (default: all *.txt here)")
    ap.add_argument("--include-ramgrid-only", action="store_true", help="also run [ramgrid-only] cases")
    ap.add_argument("-k", dest="filter", default="", help="only cases whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = ap.parse_intermixed_args(argv)
    host, _, port = args.addr.rpartition(":")
    addr = (host or "127.0.0.1", int(port))
    files = [Path(f) for f in args.files] or transcript_files()

    passed = failed = skipped = 0
    try:
        parsed = [(f, parse_file(f)) for f in files]
    except TranscriptError as e:
        print(f"transcript error: {e}", file=sys.stderr)
        return 2
    for path, cases in parsed:
        flush(addr)
        hung_in_a_row = 0
        for case in cases:
            if args.filter not in case.name or ("ramgrid-only" in case.tags and not args.include_ramgrid_only):
                skipped += 1
                continue
            if hung_in_a_row >= MAX_HUNG_IN_A_ROW:
                # A server that answers nothing would cost TIMEOUT_S per case.
                skipped += 1
                continue
            try:
                run_case(addr, case)
            except (CaseFailure, OSError) as e:
                failed += 1
                hung_in_a_row = hung_in_a_row + 1 if "timed out" in str(e) else 0
                print(f"FAIL {path.name}:{case.line} {case.name}\n{e}")
                if hung_in_a_row == MAX_HUNG_IN_A_ROW:
                    print(f"STOPPED {path.name}: {MAX_HUNG_IN_A_ROW} cases in a row timed out")
                continue
            hung_in_a_row = 0
            passed += 1
            if args.verbose:
                print(f"ok   {path.name}:{case.line} {case.name}")
    if not args.files and not args.filter:
        try:
            check_stats(addr)
            passed += 1
        except (CaseFailure, OSError) as e:
            failed += 1
            print(f"FAIL stats shape\n{e}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
