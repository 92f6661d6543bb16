//! Runs the protocol transcripts in `tests/conformance/` against a `ramgrid-server` process on port
//! 0 (one server and one `#[test]` per file), and, when `MEMCACHED_ADDR=host:port` is set, against a
//! real memcached to prove the expected bytes. The format is described in
//! `tests/conformance/README.md`; `tests/conformance/run.py` implements the same format.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A read that sees no byte for this long fails the case, so a hang fails instead of blocking.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The most one reply may take in all (big values arrive in many reads).
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(10);
/// Pause between the writes of a split request (`~`), so they reach the server as separate reads.
const SPLIT_PAUSE: Duration = Duration::from_millis(50);
/// Sent after every case not tagged `[close]`: two different replies, so a stray copy of either
/// one cannot pass for the sentinel.
const SENTINEL: &[u8] = b"version\r\nmn\r\n";
/// After this many cases in a row fail by timing out, the rest of the file is not run.
const MAX_HUNG_IN_A_ROW: usize = 3;

/// Every transcript file; `every_transcript_file_has_a_test` keeps this in step with the directory.
const FILES: &[&str] = &[
    "errors.txt",
    "keys.txt",
    "meta_ma.txt",
    "meta_md.txt",
    "meta_mg.txt",
    "meta_mn_me.txt",
    "meta_ms.txt",
    "pipelining.txt",
    "ramgrid_only.txt",
    "text_arith.txt",
    "text_cas.txt",
    "text_delete_touch.txt",
    "text_get.txt",
    "text_misc.txt",
    "text_storage.txt",
];

fn transcript_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance")
}

// --- transcript model and parser -------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoleKind {
    /// One or more digits (`<num>`, `<cas>`).
    Digits,
    /// Digits with an optional leading minus (`<int>`).
    Int,
    /// One token: bytes other than space, CR, LF (`<any>`).
    Token,
    /// Nothing or one error line before a close (`<opt_error>`); only at the end of a `[close]` case.
    OptError,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(Vec<u8>),
    Hole {
        kind: HoleKind,
        name: Option<String>,
    },
    /// A value captured earlier in the case.
    Var(String),
}

#[derive(Debug, Default)]
struct Exchange {
    writes: Vec<Vec<Part>>,
    expect: Vec<Part>,
}

#[derive(Debug)]
struct Case {
    file: String,
    line: usize,
    name: String,
    ramgrid_only: bool,
    close: bool,
    exchanges: Vec<Exchange>,
}

fn hole_kind(name: &str) -> Option<HoleKind> {
    match name {
        "num" | "cas" => Some(HoleKind::Digits),
        "int" => Some(HoleKind::Int),
        "any" => Some(HoleKind::Token),
        "opt_error" => Some(HoleKind::OptError),
        _ => None,
    }
}

/// Decodes `\r \n \t \0 \\ \{ \xNN` and `{{TEXT*N}}` repeats.
fn unescape(raw: &[u8], at: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' {
            let next = raw.get(i + 1).copied();
            let simple = match next {
                Some(b'r') => Some(b'\r'),
                Some(b'n') => Some(b'\n'),
                Some(b't') => Some(b'\t'),
                Some(b'0') => Some(0),
                Some(b'\\') => Some(b'\\'),
                Some(b'{') => Some(b'{'),
                _ => None,
            };
            if let Some(b) = simple {
                out.push(b);
                i += 2;
            } else if next == Some(b'x') {
                let hex = raw
                    .get(i + 2..i + 4)
                    .ok_or_else(|| format!("{at}: bad \\x escape"))?;
                let hex = std::str::from_utf8(hex).map_err(|_| format!("{at}: bad \\x escape"))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("{at}: bad \\x escape"))?);
                i += 4;
            } else {
                return Err(format!("{at}: unknown escape after backslash"));
            }
        } else if raw[i..].starts_with(b"{{") {
            let end = find(&raw[i..], b"}}").ok_or_else(|| format!("{at}: unterminated {{{{"))? + i;
            let body = &raw[i + 2..end];
            let star = body
                .iter()
                .rposition(|&b| b == b'*')
                .ok_or_else(|| format!("{at}: repeat needs *COUNT"))?;
            let count: usize = std::str::from_utf8(&body[star + 1..])
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("{at}: repeat must be {{{{TEXT*COUNT}}}}"))?;
            out.extend(unescape(&body[..star], at)?.repeat(count));
            i = end + 2;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn is_ident(s: &[u8]) -> bool {
    !s.is_empty()
        && (s[0].is_ascii_lowercase() || s[0] == b'_')
        && s.iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Splits a line into literals and `<...>` tokens: placeholders on the expected side, captured
/// variables on either side. A `<` that does not open a well-formed token is a literal byte.
fn split_tokens(text: &str, at: &str, expected: bool) -> Result<Vec<Part>, String> {
    let raw = text.as_bytes();
    let mut parts = Vec::new();
    let (mut lit_start, mut i) = (0, 0);
    while i < raw.len() {
        let token = (raw[i] == b'<')
            .then(|| raw[i + 1..].iter().position(|&b| b == b'>'))
            .flatten()
            .map(|len| &raw[i + 1..i + 1 + len])
            .filter(|inner| {
                let mut it = inner.splitn(2, |&b| b == b':');
                let (kind, name) = (it.next().unwrap_or_default(), it.next());
                is_ident(kind) && name.is_none_or(is_ident)
            });
        let Some(inner) = token else {
            i += 1;
            continue;
        };
        if lit_start < i {
            parts.push(Part::Lit(unescape(&raw[lit_start..i], at)?));
        }
        let inner = std::str::from_utf8(inner).expect("identifiers are ASCII");
        let (kind, name) = match inner.split_once(':') {
            Some((k, n)) => (k, Some(n.to_string())),
            None => (inner, None),
        };
        parts.push(match (expected, hole_kind(kind), name) {
            (true, Some(kind), name) => Part::Hole { kind, name },
            (_, None, None) => Part::Var(kind.to_string()),
            (true, None, Some(_)) => return Err(format!("{at}: unknown placeholder <{inner}>")),
            (false, _, _) => {
                return Err(format!("{at}: placeholders belong on '<' lines: <{inner}>"))
            }
        });
        i += inner.len() + 2;
        lit_start = i;
    }
    if lit_start < raw.len() {
        parts.push(Part::Lit(unescape(&raw[lit_start..], at)?));
    }
    Ok(parts)
}

fn parse_header(header: &str) -> (String, Vec<String>) {
    let mut name = header.trim().to_string();
    let mut tags = Vec::new();
    while name.ends_with(']') {
        let Some(open) = name.rfind('[') else { break };
        tags.push(name[open + 1..name.len() - 1].to_string());
        name.truncate(open);
        name.truncate(name.trim_end().len());
    }
    (name, tags)
}

fn parse_file(path: &Path) -> Result<Vec<Case>, String> {
    let file = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut cases: Vec<Case> = Vec::new();
    for (idx, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", idx + 1);
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(header) = line.strip_prefix("===") {
            let (name, tags) = parse_header(header);
            if name.is_empty() || tags.iter().any(|t| t != "ramgrid-only" && t != "close") {
                return Err(format!("{at}: bad case header"));
            }
            if cases.iter().any(|c| c.name == name) {
                return Err(format!("{at}: duplicate case name {name:?}"));
            }
            cases.push(Case {
                file: file.clone(),
                line: idx + 1,
                name,
                ramgrid_only: tags.iter().any(|t| t == "ramgrid-only"),
                close: tags.iter().any(|t| t == "close"),
                exchanges: Vec::new(),
            });
            continue;
        }
        let case = cases
            .last_mut()
            .ok_or_else(|| format!("{at}: content before the first === header"))?;
        let starts_new = case.exchanges.last().is_none_or(|ex| !ex.expect.is_empty());
        if let Some(body) = line.strip_prefix("> ").or((line == ">").then_some("")) {
            if starts_new {
                case.exchanges.push(Exchange {
                    writes: vec![Vec::new()],
                    expect: Vec::new(),
                });
            }
            let ex = case.exchanges.last_mut().expect("pushed above");
            ex.writes
                .last_mut()
                .expect("never empty")
                .extend(split_tokens(body, &at, false)?);
        } else if line == "~" {
            if starts_new {
                return Err(format!("{at}: '~' must sit between two '>' lines"));
            }
            case.exchanges
                .last_mut()
                .expect("checked above")
                .writes
                .push(Vec::new());
        } else if let Some(body) = line.strip_prefix("< ").or((line == "<").then_some("")) {
            let ex = case
                .exchanges
                .last_mut()
                .ok_or_else(|| format!("{at}: '<' before any '>'"))?;
            ex.expect.extend(split_tokens(body, &at, true)?);
        } else {
            return Err(format!("{at}: unrecognised line {line:?}"));
        }
    }
    for case in &cases {
        check_case(case)?;
    }
    Ok(cases)
}

/// Static checks, so that a transcript mistake is reported as such and not as a server bug.
fn check_case(case: &Case) -> Result<(), String> {
    let at = format!("{}:{}", case.file, case.line);
    if case.exchanges.is_empty() {
        return Err(format!("{at}: case {:?} sends nothing", case.name));
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, ex) in case.exchanges.iter().enumerate() {
        for part in ex.writes.iter().flatten().chain(&ex.expect) {
            match part {
                Part::Var(name) if !seen.contains(&name.as_str()) => {
                    return Err(format!("{at}: <{name}> used before it is captured"));
                }
                Part::Hole {
                    name: Some(name), ..
                } => seen.push(name),
                _ => {}
            }
        }
        let last = i + 1 == case.exchanges.len();
        for (j, part) in ex.expect.iter().enumerate() {
            if let Part::Hole {
                kind: HoleKind::OptError,
                ..
            } = part
            {
                if !(last && j + 1 == ex.expect.len() && case.close) {
                    return Err(format!("{at}: <opt_error> must end a [close] case"));
                }
            }
        }
        if let Some(Part::Hole { kind, .. }) = ex.expect.last() {
            if *kind != HoleKind::OptError {
                return Err(format!("{at}: a reply may not end in a placeholder"));
            }
        }
    }
    Ok(())
}

// --- matching --------------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
enum Match {
    /// The reply is complete: bytes used and values captured.
    Done(usize, HashMap<String, Vec<u8>>),
    /// What arrived so far could still match: read more.
    More,
    /// Byte offset of the first byte that cannot match.
    Mismatch(usize),
}

fn hole_accepts(kind: HoleKind, byte: u8, first: bool) -> bool {
    match kind {
        HoleKind::Token => !matches!(byte, b' ' | b'\r' | b'\n'),
        HoleKind::Int if first && byte == b'-' => true,
        _ => byte.is_ascii_digit(),
    }
}

/// Matches `buf` against an expected reply. A placeholder is greedy; it is always followed by a
/// literal that cannot extend it (checked by `check_case`).
fn match_reply(expect: &[Part], buf: &[u8], known: &HashMap<String, Vec<u8>>) -> Match {
    let mut pos = 0;
    let mut caps: HashMap<String, Vec<u8>> = HashMap::new();
    for part in expect {
        let literal = match part {
            Part::Lit(data) => Some(data.as_slice()),
            Part::Var(name) => Some(
                caps.get(name)
                    .or_else(|| known.get(name))
                    .map(Vec::as_slice)
                    .expect("check_case: captures come before their uses"),
            ),
            Part::Hole { .. } => None,
        };
        if let Some(data) = literal {
            let avail = &buf[pos..(pos + data.len()).min(buf.len())];
            if let Some(i) = avail.iter().zip(data).position(|(a, b)| a != b) {
                return Match::Mismatch(pos + i);
            }
            if avail.len() < data.len() {
                return Match::More;
            }
            pos += data.len();
            continue;
        }
        let Part::Hole { kind, name } = part else {
            unreachable!("literals handled above")
        };
        let start = pos;
        while pos < buf.len() && hole_accepts(*kind, buf[pos], pos == start) {
            pos += 1;
        }
        if pos == buf.len() {
            return Match::More;
        }
        if pos == start || (*kind == HoleKind::Int && &buf[start..pos] == b"-") {
            return Match::Mismatch(pos);
        }
        if let Some(name) = name {
            caps.insert(name.clone(), buf[start..pos].to_vec());
        }
    }
    Match::Done(pos, caps)
}

fn render(expect: &[Part], known: &HashMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for part in expect {
        match part {
            Part::Lit(data) => out.extend_from_slice(data),
            Part::Var(name) => out.extend(
                known
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| format!("<{name}>").into_bytes()),
            ),
            Part::Hole { kind, .. } => out.extend_from_slice(match kind {
                HoleKind::Digits => b"<num>",
                HoleKind::Int => b"<int>",
                HoleKind::Token => b"<any>",
                HoleKind::OptError => b"<opt_error>",
            }),
        }
    }
    out
}

/// Bytes in transcript notation, shortened in the middle when long.
fn show(data: &[u8]) -> String {
    let mut s = String::new();
    for &b in data {
        match b {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            b'\\' => s.push_str("\\\\"),
            32..=126 => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    const LIMIT: usize = 400;
    if s.len() > LIMIT {
        let (head, tail) = (&s[..LIMIT / 2], &s[s.len() - LIMIT / 2..]);
        s = format!("{head} ...({} chars)... {tail}", s.len() - LIMIT);
    }
    s
}

fn diff_report(
    expect: &[Part],
    known: &HashMap<String, Vec<u8>>,
    got: &[u8],
    status: &str,
    at: usize,
) -> String {
    let want = render(expect, known);
    let lo = at.saturating_sub(40);
    format!(
        "  {status} at byte {at}\n  expected: {}\n  received: {}\n  near byte {at}: expected {}\n               received {}",
        show(&want),
        show(got),
        show(&want[lo.min(want.len())..(at + 40).min(want.len())]),
        show(&got[lo.min(got.len())..(at + 40).min(got.len())]),
    )
}

fn is_error_line(buf: &[u8]) -> bool {
    let rest = buf
        .strip_prefix(b"CLIENT_")
        .or_else(|| buf.strip_prefix(b"SERVER_"))
        .unwrap_or(buf);
    rest.starts_with(b"ERROR")
        && rest.ends_with(b"\r\n")
        && !rest[..rest.len() - 2]
            .iter()
            .any(|&b| b == b'\r' || b == b'\n')
}

// --- running ---------------------------------------------------------------------------------

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn, String> {
        let stream = TcpStream::connect_timeout(&addr, READ_TIMEOUT)
            .map_err(|e| format!("  connect {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(READ_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    fn send(&mut self, data: &[u8]) -> Result<(), String> {
        match self.stream.write_all(data) {
            Ok(()) => Ok(()),
            // The server may close while we still write (e.g. garbage it refuses); what it sent
            // before closing is still checked by the reads that follow.
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                Ok(())
            }
            Err(e) => Err(format!("  write failed: {e}")),
        }
    }

    /// Reads once more: Ok(false) on EOF or reset, Err on READ_TIMEOUT of silence.
    fn fill(&mut self) -> Result<bool, ErrorKind> {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.kind()),
        }
    }

    fn expect(
        &mut self,
        expect: &[Part],
        known: &HashMap<String, Vec<u8>>,
    ) -> Result<HashMap<String, Vec<u8>>, String> {
        let deadline = Instant::now() + EXCHANGE_DEADLINE;
        loop {
            match match_reply(expect, &self.buf, known) {
                Match::Done(used, caps) => {
                    self.buf.drain(..used);
                    return Ok(caps);
                }
                Match::Mismatch(at) => {
                    return Err(diff_report(expect, known, &self.buf, "mismatch", at))
                }
                Match::More => {}
            }
            let at = self.buf.len();
            if Instant::now() > deadline {
                return Err(diff_report(
                    expect,
                    known,
                    &self.buf,
                    "timed out waiting",
                    at,
                ));
            }
            match self.fill() {
                Ok(true) => {}
                Ok(false) => {
                    return Err(diff_report(
                        expect,
                        known,
                        &self.buf,
                        "connection closed",
                        at,
                    ))
                }
                Err(_) => {
                    return Err(diff_report(
                        expect,
                        known,
                        &self.buf,
                        "timed out waiting",
                        at,
                    ))
                }
            }
        }
    }

    fn expect_close(&mut self, allow_error_line: bool) -> Result<(), String> {
        loop {
            match self.fill() {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => {
                    return Err(format!(
                    "  expected the server to close the connection; it stayed open (unread: {})",
                    show(&self.buf)
                ))
                }
            }
        }
        if self.buf.is_empty() || (allow_error_line && is_error_line(&self.buf)) {
            Ok(())
        } else {
            Err(format!(
                "  unexpected bytes before close: {}",
                show(&self.buf)
            ))
        }
    }
}

fn build(parts: &[Part], vars: &HashMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        match part {
            Part::Lit(data) => out.extend_from_slice(data),
            Part::Var(name) => out.extend_from_slice(&vars[name]),
            Part::Hole { .. } => unreachable!("split_tokens puts no placeholders in requests"),
        }
    }
    out
}

fn run_case(addr: SocketAddr, case: &Case) -> Result<(), String> {
    let mut conn = Conn::open(addr)?;
    let mut vars: HashMap<String, Vec<u8>> = HashMap::new();
    let mut opt_error = false;
    for ex in &case.exchanges {
        for (i, write) in ex.writes.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(SPLIT_PAUSE);
            }
            conn.send(&build(write, &vars))?;
        }
        let mut expect = ex.expect.as_slice();
        if let Some((
            Part::Hole {
                kind: HoleKind::OptError,
                ..
            },
            rest,
        )) = expect.split_last()
        {
            expect = rest;
            opt_error = true;
        }
        if !expect.is_empty() {
            let caps = conn.expect(expect, &vars)?;
            vars.extend(caps);
        }
    }
    if case.close {
        return conn.expect_close(opt_error);
    }
    if !conn.buf.is_empty() {
        return Err(format!(
            "  unexpected bytes after the last reply: {}",
            show(&conn.buf)
        ));
    }
    conn.send(SENTINEL)?;
    let sentinel = [
        Part::Lit(b"VERSION ".to_vec()),
        Part::Hole {
            kind: HoleKind::Token,
            name: None,
        },
        Part::Lit(b"\r\nMN\r\n".to_vec()),
    ];
    conn.expect(&sentinel, &HashMap::new())
        .map(|_| ())
        .map_err(|report| {
            format!("  after the last reply the connection must still answer version+mn:\n{report}")
        })
}

fn flush_all(addr: SocketAddr) -> Result<(), String> {
    let mut conn = Conn::open(addr)?;
    conn.send(b"flush_all\r\n")?;
    conn.expect(&[Part::Lit(b"OK\r\n".to_vec())], &HashMap::new())
        .map(|_| ())
}

/// `stats` is not byte-stable, so only its shape is checked: STAT lines with known names, then END.
fn check_stats(addr: SocketAddr) -> Result<(), String> {
    let mut conn = Conn::open(addr)?;
    conn.send(b"stats\r\n")?;
    let deadline = Instant::now() + EXCHANGE_DEADLINE;
    while !conn.buf.ends_with(b"END\r\n") {
        if Instant::now() > deadline || conn.fill() != Ok(true) {
            return Err(format!("  stats did not end with END: {}", show(&conn.buf)));
        }
    }
    let text = String::from_utf8_lossy(&conn.buf[..conn.buf.len() - 5]).into_owned();
    let lines: Vec<&str> = text.split_terminator("\r\n").collect();
    if lines.is_empty()
        || !lines
            .iter()
            .all(|l| l.starts_with("STAT ") && l.split(' ').count() >= 3)
    {
        return Err(format!(
            "  stats reply is not a list of STAT lines: {}",
            show(&conn.buf)
        ));
    }
    for required in [
        "pid",
        "uptime",
        "curr_connections",
        "get_hits",
        "get_misses",
        "cmd_get",
    ] {
        if !lines.iter().any(|l| l.split(' ').nth(1) == Some(required)) {
            return Err(format!("  stats lacks STAT {required}"));
        }
    }
    Ok(())
}

/// Runs the selected cases of one file; returns one report per failed case.
fn run_file(addr: SocketAddr, file: &str, include_ramgrid_only: bool) -> (usize, Vec<String>) {
    let cases = parse_file(&transcript_dir().join(file))
        .unwrap_or_else(|e| panic!("transcript error: {e}"));
    let selected: Vec<&Case> = cases
        .iter()
        .filter(|c| include_ramgrid_only || !c.ramgrid_only)
        .collect();
    let mut failures = Vec::new();
    let mut hung_in_a_row = 0;
    for (i, case) in selected.iter().enumerate() {
        match run_case(addr, case) {
            Ok(()) => hung_in_a_row = 0,
            Err(report) => {
                hung_in_a_row = if report.contains("timed out") {
                    hung_in_a_row + 1
                } else {
                    0
                };
                failures.push(format!(
                    "FAIL {}:{} {}\n{report}",
                    case.file, case.line, case.name
                ));
            }
        }
        // A server that answers nothing would cost READ_TIMEOUT per case; stop after a few.
        if hung_in_a_row == MAX_HUNG_IN_A_ROW && i + 1 < selected.len() {
            failures.push(format!(
                "STOPPED after {MAX_HUNG_IN_A_ROW} cases in a row timed out; {} cases of {file} not run",
                selected.len() - i - 1
            ));
            break;
        }
    }
    (selected.len(), failures)
}

// --- the server under test -------------------------------------------------------------------

/// A `ramgrid-server` child process on a free port; killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ramgrid-server"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--threads",
                "2",
                "--memory",
                "64MiB",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ramgrid-server");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut err_pipe = child.stderr.take().expect("piped");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let mut log = sink.lock().unwrap_or_else(|p| p.into_inner());
                log.extend_from_slice(&chunk[..n]);
                // Keep the tail only: it is for failure messages.
                let excess = log.len().saturating_sub(64 << 10);
                log.drain(..excess);
            }
        });
        let (tx, rx) = mpsc::channel();
        let out_pipe = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            let mut reader = BufReader::new(out_pipe);
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let _ = tx.send(first);
            // Keep draining so the server never blocks on a full stdout pipe.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
        let addr = first
            .trim_end()
            .strip_prefix("ramgrid-server listening on ")
            .and_then(|a| a.to_socket_addrs().ok())
            .and_then(|mut a| a.next());
        let mut server = Server {
            child,
            addr: "127.0.0.1:0".parse().expect("literal"),
            stderr,
        };
        match addr {
            Some(addr) => server.addr = addr,
            None => {
                let _ = server.child.kill();
                let _ = server.child.wait();
                panic!(
                    "ramgrid-server did not announce its address (first stdout line {first:?}); stderr:\n{}",
                    server.stderr_tail()
                );
            }
        }
        server
    }

    fn stderr_tail(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn check_file_against_ramgrid(file: &str) {
    let server = Server::start();
    let (ran, failures) = run_file(server.addr, file, true);
    assert!(ran > 0, "{file} has no cases");
    if !failures.is_empty() {
        panic!(
            "{} of {ran} cases failed in {file}:\n{}\n--- server stderr (tail) ---\n{}",
            failures.len(),
            failures.join("\n"),
            server.stderr_tail()
        );
    }
}

macro_rules! transcript_tests {
    ($($test:ident => $file:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_file_against_ramgrid($file);
            }
        )*
        /// The files the macro has a test for; compared with `FILES` and the directory.
        const TESTED: &[&str] = &[$($file),*];
    };
}

transcript_tests! {
    errors => "errors.txt",
    keys => "keys.txt",
    meta_ma => "meta_ma.txt",
    meta_md => "meta_md.txt",
    meta_mg => "meta_mg.txt",
    meta_mn_me => "meta_mn_me.txt",
    meta_ms => "meta_ms.txt",
    pipelining => "pipelining.txt",
    ramgrid_only => "ramgrid_only.txt",
    text_arith => "text_arith.txt",
    text_cas => "text_cas.txt",
    text_delete_touch => "text_delete_touch.txt",
    text_get => "text_get.txt",
    text_misc => "text_misc.txt",
    text_storage => "text_storage.txt",
}

#[test]
fn stats_reply_is_stat_lines_then_end() {
    let server = Server::start();
    if let Err(report) = check_stats(server.addr) {
        panic!(
            "{report}\n--- server stderr (tail) ---\n{}",
            server.stderr_tail()
        );
    }
}

/// With `MEMCACHED_ADDR=host:port`, every case not tagged ramgrid-only must pass against that
/// server too: this is what proves the expected bytes. The server is flushed before each file.
#[test]
fn memcached_agrees() {
    let Ok(addr) = std::env::var("MEMCACHED_ADDR") else {
        eprintln!("MEMCACHED_ADDR not set: transcripts not checked against memcached");
        return;
    };
    let addr = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("MEMCACHED_ADDR={addr:?} is not host:port"));
    let mut failures = Vec::new();
    let mut ran = 0;
    for file in FILES {
        flush_all(addr).unwrap_or_else(|e| panic!("flush_all on {addr} failed:\n{e}"));
        let (n, f) = run_file(addr, file, false);
        ran += n;
        failures.extend(f);
    }
    if let Err(report) = check_stats(addr) {
        failures.push(format!("FAIL stats shape\n{report}"));
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed against {addr}:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{ran} cases passed against {addr}");
}

#[test]
fn every_transcript_file_has_a_test() {
    let mut on_disk: Vec<String> = std::fs::read_dir(transcript_dir())
        .expect("tests/conformance exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, FILES, "FILES must list every transcript");
    assert_eq!(
        TESTED, FILES,
        "transcript_tests! must have one test per transcript"
    );
}

#[test]
fn every_transcript_parses() {
    for file in FILES {
        let cases = parse_file(&transcript_dir().join(file)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cases.is_empty(), "{file} has no cases");
    }
}

// --- the runner's own checks: it must be able to fail ----------------------------------------

fn expect_of(line: &str) -> Vec<Part> {
    split_tokens(line, "test", true).expect("valid test pattern")
}

#[test]
fn matcher_accepts_exact_bytes_and_placeholders() {
    let none = HashMap::new();
    assert_eq!(
        match_reply(&expect_of("END\\r\\n"), b"END\r\n", &none),
        Match::Done(5, HashMap::new())
    );
    let caps = match match_reply(
        &expect_of("VALUE k 0 1 <cas:c>\\r\\n"),
        b"VALUE k 0 1 42\r\nrest",
        &none,
    ) {
        Match::Done(16, caps) => caps,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(caps["c"], b"42");
    assert!(matches!(
        match_reply(&expect_of("HD t<int>\\r\\n"), b"HD t-1\r\n", &none),
        Match::Done(8, _)
    ));
    let known = HashMap::from([("c".to_string(), b"42".to_vec())]);
    assert!(matches!(
        match_reply(&expect_of("HD c<c>\\r\\n"), b"HD c42\r\n", &known),
        Match::Done(..)
    ));
}

#[test]
fn matcher_reports_mismatches_and_waits_for_prefixes() {
    let none = HashMap::new();
    assert_eq!(
        match_reply(&expect_of("END\\r\\n"), b"ENX", &none),
        Match::Mismatch(2)
    );
    assert_eq!(
        match_reply(&expect_of("END\\r\\n"), b"EN", &none),
        Match::More
    );
    assert_eq!(
        match_reply(&expect_of("VERSION <num>\\r\\n"), b"VERSION 1.6\r\n", &none),
        Match::Mismatch(9)
    );
    assert_eq!(
        match_reply(&expect_of("HD c<num>\\r\\n"), b"HD c\r\n", &none),
        Match::Mismatch(4)
    );
    assert_eq!(
        match_reply(&expect_of("HD c<num>\\r\\n"), b"HD c12", &none),
        Match::More
    );
    let known = HashMap::from([("c".to_string(), b"42".to_vec())]);
    assert_eq!(
        match_reply(&expect_of("HD c<c>\\r\\n"), b"HD c43\r\n", &known),
        Match::Mismatch(5)
    );
}

#[test]
fn escapes_and_repeats_decode() {
    assert_eq!(
        unescape(br"a\r\n\x00\\\{{{xy*3}}", "t").unwrap(),
        b"a\r\n\x00\\{xyxyxy"
    );
    assert!(unescape(br"\q", "t").is_err());
    assert!(unescape(br"{{ab}}", "t").is_err());
    assert_eq!(
        split_tokens("a<b", "t", true).unwrap(),
        vec![Part::Lit(b"a<b".to_vec())]
    );
    assert!(split_tokens("<cas>", "t", false).is_err());
    assert_eq!(
        parse_header(" name [ramgrid-only] [close]"),
        ("name".into(), vec!["close".into(), "ramgrid-only".into()])
    );
    assert!(is_error_line(b"CLIENT_ERROR line too long\r\n"));
    assert!(!is_error_line(b"STORED\r\n"));
    assert!(!is_error_line(b"ERROR\r\nERROR\r\n"));
}
